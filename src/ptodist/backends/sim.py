"""The ``sim`` backend: every rank a thread of this process, exactly one running at a time.

Ranks hand a single baton to each other: at every memory, RMA and signal
operation the running rank asks the :class:`Scheduler` who runs next, chosen by
a seeded policy, so a run is a function of its seed and replays exactly.  A
wait that cannot be satisfied blocks its rank; when no rank can run and some
have not finished, that is a deadlock, known exactly and reported at once with
the same findings as the ``shm`` backend's hang diagnosis.

Under ``ptodist check`` (an active :mod:`ptodist.check.explore` session) every
rank records its window accesses, notifies and waits in one global order and
the happens-before checker (:mod:`ptodist.check.hb`) reads the logs when the
dispatch ends.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from contextlib import nullcontext

import numpy as np

from ..check.hang import hang_error
from ..compiler.plan import DispatchPlan, split_segments
from ..dfx import finish_run
from ..errors import CheckError, ConfigError, RankError, RankFailure
from ..language.types import Direction
from ..rank.body import RankStopped, run_rank
from ..rank.context import RankContext
from ..rank.events import EventLog
from ..rank.status import DONE, FAILED, RUNNING, WAITING, StatusBoard, current_line
from . import resources
from .base import STOP_WRITE_S, Command, HostView, RunsNow, StallRule, note_where, notify_cell
from .schedule import Clock, Decisions, Scheduler
from .schedule import describe_policy as describe_policy  # check.explore names a seed's policy from here

ALIGN = 64
# Operations that touch no shared memory: no reason to let another rank in before them.
_LOCAL_OPS = frozenset({"pl.slice", "pl.create_tensor"})
# How often the driver looks at a rank that runs without reaching an operation (a long loop).
WATCH_S = 0.2
# A rank whose pl.read keeps seeing what it saw, this many times in a row, is polling: it lets the
# others run until one of them makes progress (else a "delay" schedule would starve the rank it polls).
POLL_READS = 16
# How long an interrupted run waits for its rank threads to stop when no rank writes DFX records. A thread
# inside a C call (time.sleep, a blocking read) cannot be stopped before the call returns: the run stops
# waiting for it and leaves it behind (a daemon thread with RankStopped pending, so it ends when the call does).
STOP_WAIT_S = 0.2


class SimMemory:
    """RankMemory over per-rank numpy heaps shared by the rank threads."""

    def __init__(self, heaps: list[np.ndarray], plan: DispatchPlan, rank: int, status: StatusBoard,
                 sched: Scheduler):
        self.heaps = heaps
        self._words = [h.view(np.int32) for h in heaps]  # each rank's heap as INT32 cells
        self.offsets = [w.offset for w in plan.windows]
        self.sizes = [w.nbytes for w in plan.windows]
        self.rank = rank
        self.world = plan.world
        self.status = status
        self._sched = sched
        self._cells: dict = {}  # buffer id -> this rank's copy of the buffer as INT32 cells

    def window_bytes(self, buffer_id: int, rank: int) -> np.ndarray:
        off = self.offsets[buffer_id]
        return self.heaps[rank][off:off + self.sizes[buffer_id]]

    def cell_load(self, buffer_id, rank, offset):
        return int(self._words[rank][(self.offsets[buffer_id] + offset) >> 2])

    def _update(self, buffer_id, rank, offset, new) -> int:
        cells, i = self._words[rank], (self.offsets[buffer_id] + offset) >> 2
        old = int(cells[i])
        cells[i] = np.int32(((new(old) + 2**31) % 2**32) - 2**31)  # INT32 wraps, as the device's atomics do
        return old

    def notify(self, ledger, buffer_id, rank, offset, value, is_set, word, slot):
        return notify_cell(self, ledger, buffer_id, rank, offset, value, is_set, word, slot)

    def cell_add(self, buffer_id, rank, offset, value):
        return self._update(buffer_id, rank, offset, lambda old: old + value)

    def cell_set(self, buffer_id, rank, offset, value):
        return self._update(buffer_id, rank, offset, lambda old: value)

    def cell_wait(self, buffer_id, offset, ge, expected, timeout_s):
        cells, i = self._words[self.rank], (self.offsets[buffer_id] + offset) >> 2

        def ready() -> bool:
            v = int(cells[i])
            return v >= expected if ge else v == expected

        if ready():
            return True, int(cells[i])
        # The first miss returns, so the rank publishes what it waits on (for a hang report) and asks again.
        if self.status.rows[self.rank]["state"] != WAITING:
            return False, int(cells[i])
        self._sched.block(self.rank, ready, where=self._waiting_at())
        return True, int(cells[i])

    def cells(self, buffer_id):
        view = self._cells.get(buffer_id)
        if view is None:
            off = self.offsets[buffer_id]
            view = self._cells[buffer_id] = self._words[self.rank][off >> 2:(off + self.sizes[buffer_id]) >> 2]
        return view

    def wait_any(self, check, timeout_s):
        """Until ``check()`` holds: the scheduler runs the other ranks and evaluates it whenever it chooses,
        so a deadlock stays exact.  The first miss returns (the rank then publishes what it waits on)."""
        if check():
            return True
        if timeout_s <= 0 or self.status.rows[self.rank]["state"] != WAITING:
            return False
        self._sched.block(self.rank, check, where=self._waiting_at())
        return True

    def _waiting_at(self) -> str:
        """The ``file:line`` of the wait this rank published, for the scheduler's record (under check only)."""
        if self._sched.decisions is None:
            return ""
        return bytes(self.status.rows[self.rank]["where"]).decode(errors="replace")

    def choose(self, n: int) -> int:
        """Which of ``n`` options (this rank's ready tasks) goes first: an int in range(n), 0 for program order.

        The sim backend's own decision, like the choice of the rank that runs next: seeded, and recorded and
        replayed under ``ptodist check`` (which shrinks a failing schedule's choices toward 0).
        """
        return self._sched.choose(self.rank, n)

    def locked(self, rank: int):
        return nullcontext()  # one rank runs at a time and an accumulate never yields

    def compile_steps(self, steps: list) -> None:
        return None  # the scheduler must see every operation: it may switch ranks at each


def _switching(name: str):
    """A method that lets the scheduler switch to another rank, then runs RankContext's ``name``."""
    run = getattr(RankContext, name)

    def switched(self, *args):
        self._sched.switch(self.rank)
        return run(self, *args)

    switched.__name__ = switched.__qualname__ = name
    return switched


class _SimRank(RankContext):
    """A rank context that lets the scheduler switch before every shared-memory operation."""

    def __init__(self, *args, sched: Scheduler, **kwargs):
        super().__init__(*args, **kwargs)
        self._sched = sched
        self._poll_mark, self._polls = -1, 0

    def memory_op(self, name, *args):
        if name == "pl.read":
            self._before_read()
        elif name not in _LOCAL_OPS:
            self._sched.switch(self.rank)
        return super().memory_op(name, *args)

    # The signal and RMA operations have methods of their own (RankContext's hot path): each switches first too.
    notify, wait, remote_load, remote_store, put, get = (
        _switching(name) for name in ("notify", "wait", "remote_load", "remote_store", "put", "get"))

    def _before_read(self) -> None:
        """Switch before a read; a rank polling a value that does not change waits for the others' progress."""
        mark = self.status.progress_counter(self.rank).value
        if mark != self._poll_mark:
            self._poll_mark, self._polls = mark, 0
        self._polls += 1
        if self._polls < POLL_READS:
            self._sched.switch(self.rank)
            return
        self._polls = 0
        rows, me = self.status.rows, self.rank
        others = int(rows["progress"].sum()) - int(rows[me]["progress"])
        self._sched.block(me, lambda: int(rows["progress"].sum()) - int(rows[me]["progress"]) != others, soft=True)


class SimBackend:
    """Runs plans with every rank a thread of this process, one at a time, under a seeded schedule.

    ``session``: the ``ptodist check`` session (``check.explore``) whose seed the schedules take and
    that receives each dispatch's records and findings; None runs under ``PTODIST_SIM_SEED``.
    """

    name = "sim"
    scheduler = Scheduler  # decides which rank runs next: a variant of this backend names its own subclass

    def __init__(self, session=None):
        self.session = session

    def start(self, device_ids: list, objects: dict | None = None, startup_timeout_s: float = 0.0) -> SimGroup:
        return SimGroup(self, list(device_ids))

    def run(self, plan: DispatchPlan, host_arrays: list, config, dfx=None, *, scalars: tuple = ()) -> None:
        """A one-shot call: a group used once, on private copies of the host tensors.

        Outputs reach the caller only when the dispatch succeeds; inputs are read-only to the ranks.
        """
        group = self.start(plan.device_ids)
        views = [a.copy() if a is not None else None for a in host_arrays]
        writable = [True] * len(views)
        for spec in plan.host_tensors:
            if spec.direction is Direction.IN:
                writable[spec.index] = False
        hosts = [HostView(v.shape, "", w, array=v) if v is not None else None for v, w in zip(views, writable)]
        heap = group.new_arena(_heap_bytes(plan)) if plan.windows else None
        command = Command(0, 0, plan, [], 0, hosts, heap, dfx, config.resolved_hang_timeout(), scalars=scalars)
        findings = None
        try:
            group.execute(command)
        except CheckError as e:  # the dispatch ran to its end; the checker found something in it
            findings = e
        finally:
            if dfx is not None:
                finish_run(dfx, plan.world, plan.device_ids)
        for spec in plan.host_tensors:
            if spec.direction is not Direction.IN:
                host_arrays[spec.index][...] = views[spec.index]
        if findings is not None:
            raise findings


def _heap_bytes(plan: DispatchPlan) -> int:
    return -(-max(plan.window_heap_bytes, ALIGN) // ALIGN) * ALIGN


class _Arena:
    """A sim group's window heap: one zeroed row of ``stride`` bytes per rank."""

    def __init__(self, world: int, stride: int):
        self.stride = stride
        self.rows = np.zeros((world, stride), dtype=np.uint8)


class _Dispatch:
    """What a dispatch's ranks keep from one segment to the next: status board, clock, logs, contexts."""

    def __init__(self, number: int, world: int, checking: bool):
        self.number = number
        self.board_raw = np.zeros(StatusBoard.nbytes(world), dtype=np.uint8)
        self.clock = Clock() if checking else None
        self.logs: list[EventLog | None] = [None] * world
        self.contexts: list[_SimRank | None] = [None] * world


class SimGroup:
    """Ranks as threads of this process, run command by command (a DistributedWorker on ``sim``)."""

    in_process = True
    finishes_dfx = False

    def __init__(self, backend: SimBackend, device_ids: list):
        self.backend = backend
        self.device_ids = device_ids
        self.world = len(device_ids)
        self.death_notes: dict = {}
        self.dispatch: _Dispatch | None = None

    def new_arena(self, stride: int) -> _Arena:
        return _Arena(self.world, stride)

    def submit(self, command: Command) -> RunsNow:
        return RunsNow(lambda: self.execute(command))

    def reap(self) -> list:
        return []  # threads do not die while idle

    def kill(self) -> None:
        self.dispatch = None

    def close(self) -> None:
        self.dispatch = None

    def execute(self, command: Command) -> None:
        """Run one command to its end; raise RankError, HangError, or CheckError (findings under check)."""
        session = self.backend.session
        if command.segment == 0 or self.dispatch is None or self.dispatch.number != command.number:
            self.dispatch = _Dispatch(command.number, self.world, session is not None)
        seed = session.seed if session is not None else _env_seed()
        run = _SimRun(command, self.dispatch, seed, getattr(session, "decisions", None), self.backend.scheduler)
        try:
            with resources.blas_on_one_thread():  # the ranks are this process's threads: no BLAS threads spinning
                run.run()
        finally:
            if command.last or run.failures or run.sched.deadlock:
                self.dispatch = None
            if session is not None:
                session.record(command.plan, run)
        if session is not None and run.findings:
            raise CheckError(_check_message(run.findings), findings=run.findings)


def _env_seed() -> int:
    text = os.environ.get("PTODIST_SIM_SEED", "0")
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"PTODIST_SIM_SEED={text!r}: the sim backend's schedule seed must be an integer") from None


def _check_message(findings) -> str:
    return f"{len(findings)} finding(s):\n" + "\n".join(f.render() for f in findings)


class _SimRun:
    """One command on the sim backend: threads, memory, the driver's watch, and the results."""

    def __init__(self, command: Command, dispatch: _Dispatch, seed: int, decisions: Decisions | None = None,
                 scheduler: type[Scheduler] = Scheduler):
        plan = command.plan
        self.full_plan = plan
        self.plan = split_segments(plan, command.boundaries)[command.segment] if command.boundaries else plan
        self.world = plan.world
        self.views = [None if h is None else h.array if h.writable else _read_only(h.array) for h in command.hosts]
        self.scalars = command.scalars
        self.dfx = command.dfx
        self.last = command.last
        self.hang_timeout = command.hang_timeout
        self.checking = dispatch.clock is not None
        self.sched = scheduler(plan.world, seed, decisions, dispatch.clock)
        arena = command.heap
        self.heaps = list(arena.rows) if arena is not None else [np.zeros(ALIGN, np.uint8) for _ in range(self.world)]
        self.dispatch = dispatch
        self.board_raw = dispatch.board_raw
        self.clock = dispatch.clock
        self.logs = dispatch.logs
        self.since = next(self.clock) if self.clock is not None else 0  # this segment's first record
        self.failures: list[RankFailure] = []
        self.finished: set[int] = set()
        self.findings: list = []
        self.stalled = False  # stopped for no progress (a wall-clock stop, not a certain deadlock)

    def run(self) -> None:
        threads = [threading.Thread(target=self._rank_main, args=(r,), name=f"ptodist-sim-rank{r}", daemon=True)
                   for r in range(self.world)]
        try:
            for t in threads:
                t.start()
            self.sched.start()
            self._watch(threads)
        except Exception:  # a hang the watch found: every rank stops at its next bytecode; wait for all
            self.stalled = True
            self._stop(threads, None)
            raise
        except BaseException as e:  # Ctrl-C, SIGTERM (the CLI's): stop the ranks, wait only a moment for them
            note_where(e, self._where(threads))
            self._stop(threads, STOP_WRITE_S if self.dfx is not None else STOP_WAIT_S)
            raise
        if self.sched.deadlock:
            self.sched.abort()
        for t in threads:
            t.join()
        if self.checking:
            from ..check import hb

            self.findings = hb.analyze([log for log in self.logs if log is not None], self.full_plan, self.since)
        if self.failures:
            raise RankError(sorted(self.failures, key=lambda f: f.rank))
        if self.sched.deadlock:
            raise self._hang(True)

    def _stop(self, threads: list[threading.Thread], wait_s: float | None) -> None:
        """Stop every rank thread with RankStopped and wait for them: ``wait_s`` at most (None: until they end).

        The running rank gets it asynchronously (it may spin without reaching an operation); the parked
        ones when the scheduler releases them. An interrupt while waiting (a second Ctrl-C) stops the wait.
        """
        running = self.sched.running
        if not self.sched.over.is_set() and running is not None and threads[running].is_alive():
            _raise_in(threads[running], RankStopped)
        self.sched.abort()
        end = None if wait_s is None else time.monotonic() + wait_s
        try:
            for t in threads:
                if t.ident is not None:
                    t.join(None if end is None else max(end - time.monotonic(), 0.0))
        except KeyboardInterrupt:
            if wait_s is None:
                raise  # Ctrl-C while a hang's ranks stop: it ends the run instead of the HangError
            # a second Ctrl-C: stop waiting; the first one's KeyboardInterrupt is on its way out already

    def _watch(self, threads) -> None:
        """Wait for the end; stop the ranks when none makes progress for the hang timeout.

        A deadlock is the scheduler's to find (no rank can run); this catches a rank that runs
        without communicating: a long loop, or a spin on a value nobody changes.
        """
        rule = StallRule(self.hang_timeout)
        rows = StatusBoard(self.board_raw, self.world).rows
        while not self.sched.over.wait(WATCH_S):
            found = rule.observe(rows["progress"], time.monotonic(), lambda: False)
            if found is not None:
                raise self._hang(False, found[1], self._busy(threads))

    def _where(self, threads) -> list[dict] | None:
        """Where each rank is now, as a hang report says it (for a run cut short by the user)."""
        try:
            return self._hang(False, 0.0, self._busy(threads)).ranks
        except Exception:  # noqa: BLE001 - a report that cannot be read must not keep the ranks running
            return None

    def _busy(self, threads) -> dict[int, str]:
        """The line each running rank's thread is at."""
        rows = StatusBoard(self.board_raw, self.world).rows
        frames = sys._current_frames()
        return {r: current_line(frames[t.ident]) for r, t in enumerate(threads)
                if rows[r]["state"] == RUNNING and t.ident in frames}

    def _hang(self, certain: bool, idle: float | None = None, busy: dict | None = None):
        loader = SimMemory(self.heaps, self.plan, -1, StatusBoard(self.board_raw, self.world), self.sched)
        return hang_error(self.plan, loader.status, loader.cell_load, self.finished, certain, idle,
                          self.hang_timeout, busy)

    def _context(self, rank: int) -> _SimRank:
        """The rank's context: made at the dispatch's first segment, kept (task ids, log) for the later ones."""
        status = StatusBoard(self.board_raw, self.world)  # one per rank: its notify-site table is its own
        memory = SimMemory(self.heaps, self.plan, rank, status, self.sched)
        ctx = self.dispatch.contexts[rank]
        if ctx is None:
            log = None
            if self.checking or self.dfx is not None:
                log = EventLog(rank, self.plan.device_ids[rank], self.dfx.dispatch if self.dfx is not None else 0,
                               clock=self.clock, dump_args=self.dfx.dump_args if self.dfx is not None else 0)
            self.logs[rank] = log
            ctx = self.dispatch.contexts[rank] = _SimRank(self.plan, rank, memory, self.views, events=log,
                                                          sched=self.sched)
        else:
            ctx.next_segment(self.plan, memory, self.views)
            ctx._sched = self.sched
        ctx.scalars = self.scalars
        return ctx

    def _rank_main(self, rank: int) -> None:
        _enter_sim_rank(rank, self.world)
        ctx = self._context(rank)
        try:
            self.sched.enter(rank)
            outcome = run_rank(ctx, ctx.events, self.dfx, last=self.last)
            if outcome.stopped:
                return
            ctx.status.finish(rank, DONE if outcome.ok else FAILED)
            if outcome.ok:
                self.finished.add(rank)
            else:
                self.failures.append(outcome.failure)
            self.sched.end(rank)
        except RankStopped:
            # Stopped before its first turn, after its end, or a second time while it wrote what it recorded
            # (the asynchronous stop of a spinning rank may land after the scheduler's): nothing more to do.
            return


def _read_only(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False  # a store into an input is reported, not lost
    return v


def _raise_in(thread: threading.Thread, exc: type[BaseException]) -> None:
    """Raise ``exc`` in ``thread`` at its next bytecode (a rank stuck in a loop that never yields)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc))


def _enter_sim_rank(rank: int, world: int) -> None:
    """First thing in a rank thread: what it prints starts with ``[rank r]`` (threads share one environment)."""
    from ..rank_output import enter_sim_rank

    enter_sim_rank(rank, world)
