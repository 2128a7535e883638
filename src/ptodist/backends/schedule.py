"""The sim backend's schedules: which rank runs next, chosen by a seeded policy (``Scheduler``), and, under
``ptodist check``, the decisions taken and forced (``Decisions``) that make a run replay exactly.
"""

from __future__ import annotations

import random
import threading

from ..rank.body import RankStopped

_RUNNABLE, _BLOCKED, _ENDED = 0, 1, 2


def policy_for(seed: int, world: int) -> tuple[str, int | None]:
    """The scheduling policy a seed selects: ``("random", None)`` or ``("delay", rank)``.

    Seeds cycle through plain random scheduling and delaying each rank in turn, so a handful of
    consecutive seeds covers every rank being the slow one.
    """
    k = seed % (world + 1)
    return ("random", None) if k == 0 else ("delay", k - 1)


def describe_policy(policy: tuple[str, int | None]) -> str:
    return "random" if policy[0] == "random" else f"delay rank {policy[1]}"


class Decisions:
    """A ``ptodist check`` session's scheduling decisions: which to force, how to take the rest, what was taken.

    A decision is keyed by ``(scheduler, kind, who, n)``: the session's ``scheduler``-th Scheduler (one per
    dispatch segment), ``kind`` "rank" (who runs next, asked by rank ``who`` as it yields for the ``n``-th time;
    ``who`` -1 at the start) or "task" (rank ``who``'s ``n``-th :meth:`SimMemory.choose`).  Keys name program
    points, not positions in the run, so a replay that changes one decision keeps the others where they were.

    ``forced`` maps keys to the choice to make there (ignored where that choice is not possible then);
    the others follow the seed's policy, or, with ``plain``, the plain schedule: the running rank goes on
    while it can, else the lowest-numbered rank that can run, and a task choice takes 0 (program order).
    """

    def __init__(self, forced: dict | None = None, plain: bool = False):
        self.forced = dict(forced or {})
        self.plain = plain
        # every decision with more than one option, and every turn given up to wait, in the order taken
        self.taken: list[Decision] = []
        self.schedulers = 0               # Schedulers made so far in this session


class Decision:
    """One decision a scheduler took: its key, its options, the choice, the plain schedule's choice.

    ``preempt``: a switch away from a rank that could have gone on (or a task picked out of program order);
    ``seq``: the checker's clock when it was taken (0 outside ``ptodist check``); ``blocked``: for a rank
    that gave up its turn because it waits, the ``file:line`` of that wait.
    """

    __slots__ = ("key", "options", "chosen", "plain", "preempt", "seq", "blocked")

    def __init__(self, key, options, chosen, plain, preempt, seq, blocked=""):
        self.key, self.options, self.chosen, self.plain = key, options, chosen, plain
        self.preempt, self.seq, self.blocked = preempt, seq, blocked


class Clock:
    """The checker's global sequence numbers; ``now`` is the next one (where a scheduler decision falls)."""

    def __init__(self):
        self.now = 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        n = self.now
        self.now += 1
        return n


class Scheduler:
    """Decides which rank runs; passes the baton between rank threads.

    ``random`` picks uniformly among the ranks that can run at every operation; ``delay`` runs
    its chosen rank only when no other rank can run (the slow-peer schedule that exposes a read
    issued before the peer's write).  With ``decisions`` (under ``ptodist check``) every decision
    that had options is recorded there, and those it forces are replayed.
    """

    def __init__(self, world: int, seed: int, decisions: Decisions | None = None, clock: Clock | None = None):
        self.world = world
        self.policy = policy_for(seed, world)
        self._rng = random.Random(seed)
        self._task_rng = random.Random(f"task:{seed}")  # its own stream: task choices leave the rank choices as they were
        self.decisions = decisions
        self._clock = clock
        self.number = -1  # its place among the session's schedulers: the first field of its decisions' keys
        if decisions is not None:
            self.number = decisions.schedulers
            decisions.schedulers += 1
        self._asked: dict = {}  # (kind, who) -> how many decisions it asked for so far
        self._turn = [threading.Semaphore(0) for _ in range(world)]
        self._state = [_RUNNABLE] * world
        self._ready: list = [None] * world   # per blocked rank: a callable saying whether it may go on
        self._soft = [False] * world         # per blocked rank: polling, so it may go on when no one else can
        self._blocked_at = ""                # the wait the rank giving up its turn now is blocked in
        self.running: int | None = None
        self.switches = 0
        self.aborted = False
        self.over = threading.Event()        # set when no rank can run any more
        self.deadlock = False

    # -- choosing -------------------------------------------------------------
    def _candidates(self) -> list[int]:
        out = []
        for r in range(self.world):
            st = self._state[r]
            if st == _RUNNABLE or (st == _BLOCKED and self._ready[r]()):
                out.append(r)
        return out

    def _pick(self, me: int | None, who: int) -> int | None:
        cands = self._candidates()
        if not cands:
            cands = [r for r in range(self.world) if self._state[r] == _BLOCKED and self._soft[r]]
        if self.decisions is None:
            return self._seeded(cands) if cands else None
        key = self._key("rank", who)  # every turn given up counts: keys stay on their program points
        if len(cands) <= 1:
            only = cands[0] if cands else None
            if self._blocked_at:  # no choice, but the story tells where the rank blocked
                self.decisions.taken.append(Decision(key, tuple(cands), only, only, False,
                                                     self._clock.now if self._clock is not None else 0,
                                                     self._blocked_at))
            return only
        plain = me if me in cands else cands[0]
        chosen = self.decisions.forced.get(key)
        if chosen not in cands:
            chosen = plain if self.decisions.plain else self._seeded(cands)
        self.decisions.taken.append(Decision(key, tuple(cands), chosen, plain, me in cands and chosen != me,
                                             self._clock.now if self._clock is not None else 0, self._blocked_at))
        return chosen

    def _seeded(self, cands: list[int]) -> int:
        """The seed's policy's choice among ``cands``."""
        if self.policy[0] == "delay" and len(cands) > 1 and self.policy[1] in cands:
            cands = [r for r in cands if r != self.policy[1]]
        return cands[0] if len(cands) == 1 else cands[self._rng.randrange(len(cands))]

    def _key(self, kind: str, who: int) -> tuple:
        n = self._asked.get((kind, who), 0)
        self._asked[(kind, who)] = n + 1
        return (self.number, kind, who, n)

    def choose(self, me: int, n: int) -> int:
        """Rank ``me``'s choice among ``n`` options (which of its ready tasks runs next): an int in range(n).

        Seeded (uniform) on its own, recorded and replayed under ``ptodist check``; 0 is program order,
        the plain schedule's choice.
        """
        if self.decisions is None:
            return self._task_rng.randrange(n) if n > 1 else 0
        key = self._key("task", me)
        if n <= 1:
            return 0
        chosen = self.decisions.forced.get(key)
        if not isinstance(chosen, int) or not 0 <= chosen < n:
            chosen = 0 if self.decisions.plain else self._task_rng.randrange(n)
        self.decisions.taken.append(Decision(key, tuple(range(n)), chosen, 0, chosen != 0,
                                             self._clock.now if self._clock is not None else 0))
        return chosen

    # -- passing the baton ----------------------------------------------------------
    def start(self) -> None:
        """Called by the driver once every rank thread waits for its turn."""
        self._give(None, -1)

    def _give(self, me: int | None, who: int) -> None:
        """Hand the baton to the rank the policy picks (maybe ``me`` again); park ``me`` until it returns.

        ``who``: the rank giving up its turn (-1 at the start), which names the decision.
        """
        if self.aborted and me is not None:
            raise RankStopped  # the run was stopped while this rank ran (a rank that polls never parks)
        nxt = self._pick(me, who)
        self._blocked_at = ""
        if nxt is None:
            self.running = None
            self.deadlock = any(st == _BLOCKED for st in self._state)
            self.over.set()
        else:
            self._state[nxt] = _RUNNABLE
            self._ready[nxt] = None
            self._soft[nxt] = False
            self.switches += 1
            if nxt == me:
                return
            self.running = nxt
            self._turn[nxt].release()
        if me is not None:
            self._turn[me].acquire()
            if self.aborted:
                raise RankStopped

    def enter(self, me: int) -> None:
        """A rank thread's first step: wait for its first turn."""
        self._turn[me].acquire()
        if self.aborted:
            raise RankStopped

    def switch(self, me: int) -> None:
        """At an operation: let the policy choose who runs next."""
        self._give(me, me)

    def block(self, me: int, ready, soft: bool = False, where: str = "") -> None:
        """``me`` cannot go on until ``ready()``: run others until it can (or no rank can).

        A ``soft`` block (a rank polling with pl.read) also goes on when no other rank can run:
        it is not a deadlock, only a rank that lets the others go first.  ``where``: the wait's
        ``file:line``, for the record.
        """
        self._state[me] = _BLOCKED
        self._ready[me] = ready
        self._soft[me] = soft
        self._blocked_at = where
        self._give(me, me)

    def end(self, me: int) -> None:
        """``me`` finished (or failed): pass the baton for good."""
        self._state[me] = _ENDED
        self._give(None, me)

    def abort(self) -> None:
        """Release every parked rank thread with RankStopped (the driver calls this to stop the run)."""
        self.aborted = True
        for t in self._turn:
            t.release()
