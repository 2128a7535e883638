"""Happens-before analysis of one dispatch: data races, uninitialised reads, clobbered and stale signals.

Input: every rank's event log from the ``sim`` backend under ``ptodist check``
— window accesses, notifies (with the cell's value before and after) and waits
(with the value that satisfied them) — each stamped with one global sequence
number, the order things happened in this schedule.

Happens-before is program order within an *actor* plus, for every satisfied wait,
an edge from each notify the wait *needed*: replaying the cell's modifications
since its last ``Set``, the waiting rank's own notifies count in full and the
other ranks' notifies in the order they landed, up to the first that makes the
wait's condition true.  A notify that landed earlier but was not needed (a
stale token a reused row still holds) orders nothing, so a race that this
schedule happened to hide is still reported.  An actor is a rank's
orchestration or one run of a task (a block of a ``pl.spmd`` task, a half of a
mixed kernel): on a device a rank's tasks run concurrently unless the task
graph orders them, so the edges between a rank's actors are the graph's —
submission (fork), dependencies and waits for tasks (join).  Vector clocks,
sparse (actor -> count), carry the relation; window memory has an interval
shadow per rank copy of each buffer, and a rank's other memory (host tensors,
``pl.create_tensor`` tensors) one per root buffer, checked only between that
rank's actors.
"""

from __future__ import annotations

import bisect
import linecache
import re
from dataclasses import dataclass, field

import numpy as np

from .findings import FIXES, Finding

RACE_PITFALL = "8.3 steps 05, 06, 08 (data race)"
TASK_RACE_PITFALL = "8.1 silent data corruption (two tasks of one rank)"
UNINIT_PITFALL = "8.1 silent data corruption; 8.3 step 13"
STALE_PITFALL = "8.3 step 09 (stale signal)"
CLOBBER_PITFALL = "8.1 signal never reaches expected; 8.3 step 04"

# A wait record's comparison (pld.WaitCmp's, and those pl.system.comm_wait / comm_test add), as a test and a symbol.
_HOLDS = {"Ge": int.__ge__, "Eq": int.__eq__, "Ne": int.__ne__, "Gt": int.__gt__, "Lt": int.__lt__,
          "Le": int.__le__}
_SYMBOLS = {"Ge": ">=", "Eq": "==", "Ne": "!=", "Gt": ">", "Lt": "<", "Le": "<="}


def analyze(logs: list, plan, since: int = 0) -> list[Finding]:
    """Return the findings of one dispatch's logs (one EventLog per rank, recorded with a shared clock).

    ``since``: only records stamped from this clock value on (one segment of a worker's dispatch: the
    host's sub-worker callback before it ordered everything earlier).
    """
    events = []
    for log in logs:
        for rec in log.records:
            if rec["kind"] in ("notify", "wait") and rec.get("seq", -1) >= since:
                events.append((rec["seq"], log.rank, rec))
        for rec in log.accesses:
            if rec["seq"] >= since:
                events.append((rec["seq"], log.rank, rec))
    events.sort(key=lambda e: e[0])
    a = _Analysis(plan, logs)
    for _, rank, rec in events:
        kind = rec["kind"]
        if kind == "access":
            a.access(rank, rec)
        elif kind == "notify":
            a.notify(rank, rec)
        elif kind == "wait":
            a.wait(rank, rec)
        elif kind == "fork":
            a.fork(rank, rec)
        elif kind == "join":
            a.join(rank, rec)
        elif kind == "release":
            a.release(rank, rec)
        else:
            a.acquire(rank, rec)
    # What the ranks found themselves while they ran (a reduction reading undefined padding).
    own = [f for log in logs for seq, f in getattr(log, "findings", ()) if seq >= since]
    return _dedupe(a.findings() + own)


@dataclass
class _Mod:
    """One notify as the cell saw it."""

    index: int
    rank: int
    op: str
    value: int
    new: int
    vc: dict
    where: str
    actor: int = 0  # the notifying actor (global id)


@dataclass
class _Cell:
    mods: list = field(default_factory=list)
    consumed: set = field(default_factory=set)      # indexes of mods some wait needed
    needed: dict = field(default_factory=dict)      # rank -> (indexes its last satisfied wait needed, its line,
                                                    #          how many notifies the rank had sent by then)
    own_since: dict = field(default_factory=dict)   # rank -> it notified its own cell since its last wait


# A shadow segment: (writes, reads, written).  writes: ((actor, clock, access id, atomic), ...) not ordered
# with each other; reads: ((actor, clock, access id), ...), one per actor.
_EMPTY = ((), (), False)


class _Shadow:
    """The access history of one rank's copy of one window buffer, as byte intervals."""

    def __init__(self, size: int):
        self.starts = [0]
        self.states = [_EMPTY]
        self.size = size

    def _split(self, pos: int) -> int:
        """Make ``pos`` a segment start (if inside the buffer); return the index of the segment starting there."""
        i = bisect.bisect_right(self.starts, pos) - 1
        if self.starts[i] != pos:
            self.starts.insert(i + 1, pos)
            self.states.insert(i + 1, self.states[i])
            i += 1
        return i

    def segments(self, lo: int, hi: int):
        """Yield (index, start, end) of the segments covering [lo, hi), split at both ends."""
        i = self._split(lo)
        if hi < self.size:
            self._split(hi)
        while i < len(self.starts) and self.starts[i] < hi:
            end = self.starts[i + 1] if i + 1 < len(self.starts) else self.size
            yield i, self.starts[i], end
            i += 1


def _intervals(offset: int, shape: tuple, strides: tuple, itemsize: int) -> list[tuple[int, int]]:
    """The byte intervals an array view touches (``offset``: its first element), merged where adjacent."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    # The innermost run of contiguous bytes, then every combination of the outer indexes.
    run, inner = itemsize, len(dims)
    while inner > 0 and dims[inner - 1][1] == run:
        inner -= 1
        run *= dims[inner][0]
    outer = dims[:inner]
    if not outer:
        return [(offset, offset + run)]
    starts = np.zeros(1, dtype=np.int64) + offset
    for n, s in outer:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    starts.sort()
    out: list[tuple[int, int]] = []
    for st in starts.tolist():
        if out and out[-1][1] >= st:
            out[-1] = (out[-1][0], max(out[-1][1], st + run))
        else:
            out.append((st, st + run))
    return out


class _Analysis:
    def __init__(self, plan, logs=()):
        self.plan = plan
        world = plan.world
        # Actors by global id: rank r's orchestration is r; a task's actor gets the next id when it is forked.
        self.gids: dict = {(r, 0): r for r in range(world)}
        self.owner: list = list(range(world))         # global id -> its rank
        self.info: dict = {(log.rank, i): a for log in logs for i, a in enumerate(getattr(log, "actors", ()))}
        self.local: list = [0] * world                # global id -> its id in its rank's log
        self.vc = [{r: 1} for r in range(world)]     # global id -> vector clock (global id -> count)
        self.tokens: dict = {}                        # (rank, token) -> the clock a release kept
        self.epochs: list = []                        # access id -> (actor, its clock at the access)
        self.cells: dict = {}
        self.shadows: dict = {}
        self.accesses: list = []          # access id -> (rank, record)
        self.races: dict = {}             # key -> [first, second, lo, hi, owner, buffer]
        self.uninit: dict = {}            # read access id -> [owner, buffer, lo, hi]
        self.writes: dict = {}            # buffer id -> {(owner, lo, hi, rank, where, name, itemsize)}
        self.stale: dict = {}
        self.clobbers: dict = {}
        self.sent = [0] * world           # notifies each rank has sent so far
        self.signal_buffers: set = set()  # buffers notified or waited on: counters, zero until notified

    # -- signals --------------------------------------------------------------------
    def _cell(self, owner: int, buffer_id: int, offset: int) -> _Cell:
        key = (owner, buffer_id, offset)
        c = self.cells.get(key)
        if c is None:
            c = self.cells[key] = _Cell()
        return c

    # -- actors ------------------------------------------------------------------------
    def _gid(self, rank: int, rec: dict) -> int:
        """The global id of the actor that made ``rec`` on ``rank``."""
        return self.gids[(rank, rec.get("actor", 0))]

    def fork(self, rank: int, rec: dict) -> None:
        """A new actor starts where its parent is; the parent's later steps are not ordered before it."""
        parent = self.gids[(rank, rec["parent"])]
        gid = self.gids[(rank, rec["actor"])] = len(self.vc)
        self.owner.append(rank)
        self.local.append(rec["actor"])
        vc = dict(self.vc[parent])
        vc[gid] = 1
        self.vc.append(vc)
        self.vc[parent][parent] += 1

    def join(self, rank: int, rec: dict) -> None:
        """The actor goes on after the actors it waited for: its clock takes theirs."""
        me = self._gid(rank, rec)
        for a in rec["from"]:
            other = self.gids.get((rank, a))
            if other is not None:
                self._take(me, self.vc[other])

    def release(self, rank: int, rec: dict) -> None:
        """Keep the actor's clock as it is now under the record's token; its later steps come after it."""
        me = self._gid(rank, rec)
        self.tokens[(rank, rec["token"])] = dict(self.vc[me])
        self.vc[me][me] += 1

    def acquire(self, rank: int, rec: dict) -> None:
        """The actor goes on after the released points: its clock takes theirs."""
        me = self._gid(rank, rec)
        for t in rec["tokens"]:
            self._take(me, self.tokens.get((rank, t), {}))

    def _take(self, me: int, other: dict) -> None:
        """Join vector clock ``other`` into actor ``me``'s (entrywise maximum).  The smaller clock is merged into a
        copy of the larger (a C copy): in a chain of tasks each clock holds every earlier task's entry."""
        vc = self.vc[me]
        if len(other) > len(vc) + 8:
            vc, other = dict(other), vc
            self.vc[me] = vc
        for u, c in other.items() - vc.items():
            if c > vc.get(u, 0):
                vc[u] = c

    def _ordered(self, mod_actor: int, mod_vc: dict, actor: int) -> bool:
        """Whether a notify made by ``mod_actor`` with vector clock ``mod_vc`` happens before ``actor``'s present."""
        return mod_actor == actor or mod_vc[mod_actor] <= self.vc[actor].get(mod_actor, 0)

    def notify(self, rank: int, rec: dict) -> None:
        a = rec["args"]
        owner, buffer_id, offset = a["owner"], a["buffer_id"], a["offset"]
        cell = self._cell(owner, buffer_id, offset)
        me = self._gid(rank, rec)
        mod = _Mod(len(cell.mods), rank, a["op"], a["value"], a["new"], dict(self.vc[me]), rec["where"], me)
        if mod.op == "Set":
            last = next((m for m in reversed(cell.mods) if m.op == "Set"), None)
            if last is not None and last.rank != rank and last.index not in cell.consumed \
                    and not self._ordered(last.actor, last.vc, me):
                key = (owner, buffer_id, offset, frozenset(((last.rank, last.where), (rank, mod.where))))
                self.clobbers.setdefault(key, (last, mod, a["buffer"], a["cell"]))
        if owner == rank and (mod.op == "Set" or mod.value > 0):
            cell.own_since[rank] = True
        cell.mods.append(mod)
        self.vc[me][me] += 1
        self.sent[rank] += 1
        self.signal_buffers.add(buffer_id)
        # The cell now holds something a notify wrote (an access that reads it is not uninitialised).
        shadow = self._shadow(owner, buffer_id)
        for i, _, _ in list(shadow.segments(offset, offset + 4)):
            w, r, _ = shadow.states[i]
            shadow.states[i] = (w, r, True)

    def wait(self, rank: int, rec: dict) -> None:
        a = rec["args"]
        cell = self._cell(rank, a["buffer_id"], a["offset"])
        expected, test = a["expected"], _HOLDS[a["cmp"]]

        def holds(v: int) -> bool:
            return test(v, expected)

        mods = cell.mods
        last_set = max((m.index for m in mods if m.op == "Set"), default=-1)
        needed = [last_set] if last_set >= 0 and mods[last_set].rank != rank else []
        value = mods[last_set].new if last_set >= 0 else 0
        after = mods[last_set + 1:]
        value += sum(m.value for m in after if m.rank == rank)
        if not holds(value):
            for m in after:
                if m.rank != rank:
                    value += m.value
                    needed.append(m.index)
                    if holds(value):
                        break
        me = self._gid(rank, rec)
        for i in needed:
            self._take(me, mods[i].vc)
        for m in after:  # the rank's own notifies count in full: another task's of this rank orders it too
            if m.rank == rank and m.actor != me:
                self._take(me, m.vc)
        fresh = set(needed)
        prev = cell.needed.get(rank)
        own = cell.own_since.get(rank, False)
        self.signal_buffers.add(a["buffer_id"])
        # Stale: nothing new satisfied it although the rank began a new round (it notified since its last
        # wait here) — a second wait in the same round (left and right the same peer at P=2) is only redundant.
        if not own and (fresh <= prev[0] and self.sent[rank] > prev[2] if prev is not None else not fresh):
            key = (rank, a["buffer_id"], a["offset"], rec["where"])
            self.stale.setdefault(key, (rank, rec, prev, [mods[i] for i in needed]))
        cell.consumed.update(fresh)
        cell.needed[rank] = (fresh, rec["where"], self.sent[rank])
        cell.own_since[rank] = False

    # -- window memory ------------------------------------------------------------------
    def _shadow(self, owner: int, buffer_id, memory=None) -> _Shadow:
        key = (owner, buffer_id) if memory is None else (owner, memory[1], memory[2])
        s = self.shadows.get(key)
        if s is None:
            size = self.plan.windows[buffer_id].nbytes if memory is None else memory[2] - memory[1]
            s = self.shadows[key] = _Shadow(size)
        return s

    def access(self, rank: int, rec: dict) -> None:
        aid = len(self.accesses)
        self.accesses.append((rank, rec))
        self.epochs.append((self._gid(rank, rec), self.vc[self._gid(rank, rec)][self._gid(rank, rec)]))
        owner, buffer_id, memory = rec["owner"], rec["buffer_id"], rec.get("memory")
        write, atomic = rec["write"], rec["atomic"]
        me = self._gid(rank, rec)
        vc = self.vc[me]
        epoch = vc[me]
        owners = self.owner
        shadow = self._shadow(owner, buffer_id, memory)
        unwritten: list[tuple[int, int]] = []
        for lo, hi in _intervals(rec["offset"], rec["shape"], rec["strides"], rec["itemsize"]):
            if write and memory is None:
                self.writes.setdefault(buffer_id, set()).add((owner, lo, hi, rank, rec["where"], rec["name"],
                                                              rec["itemsize"]))
            for i, s_lo, s_hi in list(shadow.segments(lo, hi)):
                writes, reads, written = shadow.states[i]
                for (u, c, other, other_atomic) in writes:
                    if u != me and c > vc.get(u, 0) and not (atomic and other_atomic):
                        self._race(other, aid, s_lo, s_hi, owner, buffer_id)
                if write:
                    for (u, c, other) in reads:
                        if u != me and c > vc.get(u, 0):
                            self._race(other, aid, s_lo, s_hi, owner, buffer_id)
                    # Keep only writes and reads this one is not ordered after: later accesses check those.
                    writes = tuple(w for w in writes if w[1] > vc.get(w[0], 0)) + ((me, epoch, aid, atomic),)
                    reads = tuple(r for r in reads if r[1] > vc.get(r[0], 0))
                    shadow.states[i] = (writes, reads, True)
                else:
                    # Only a read of another rank's copy: windows start zeroed, and a rank that reads its
                    # own untouched window (accumulating into it, reading back a tail it left) relies on that.
                    if not written and owner != rank and memory is None:
                        unwritten.append((s_lo, s_hi))
                    # A read by an actor of this rank ordered before this one is covered by it (a later write
                    # that races with that read races with this one too).
                    shadow.states[i] = (writes, tuple(r for r in reads if r[0] != me and not (
                        owners[r[0]] == rank and r[1] <= vc.get(r[0], 0))) + ((me, epoch, aid),), written)
        if unwritten:
            self.uninit[aid] = [owner, buffer_id, min(lo for lo, _ in unwritten), max(hi for _, hi in unwritten)]

    def _race(self, first: int, second: int, lo: int, hi: int, owner: int, buffer_id: int) -> None:
        self.uninit.pop(first, None)  # a read that raced with the write explains its missing bytes
        (ra, a), (rb, b) = self.accesses[first], self.accesses[second]
        key = (owner, buffer_id, (ra, a["where"], a["write"]), (rb, b["where"], b["write"]))
        entry = self.races.get(key)
        if entry is None:
            self.races[key] = [first, second, lo, hi, owner, buffer_id]
        else:
            entry[2], entry[3] = min(entry[2], lo), max(entry[3], hi)

    # -- reports -------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        out = [self._race_finding(*e) for e in self.races.values()]
        out += [self._uninit_finding(aid, *e) for aid, e in self.uninit.items() if not self._counters(aid, e[1])]
        out += [self._stale_finding(*e) for e in self.stale.values()]
        out += [self._clobber_finding(*e) for e in self.clobbers.values()]
        return _dedupe(out)

    def _counters(self, aid: int, buffer_id: int) -> bool:
        """Whether a read of unwritten bytes reads signal counters, whose zeros are their initial count.

        A buffer notified or waited on is a signal window; so is one read as INT32 that nothing wrote in
        the dispatch (an unused signal window read back).
        """
        if buffer_id in self.signal_buffers:
            return True
        return self.accesses[aid][1]["dtype"] == "INT32" and buffer_id not in self.writes

    def _region(self, owner: int, buffer_id: int, lo: int, hi: int, itemsize: int | None = None) -> str:
        name = self.plan.windows[buffer_id].name
        text = f"bytes [{lo}, {hi}) of window buffer '{name}' on rank {owner}"
        if itemsize and itemsize > 1 and lo % itemsize == 0 and hi % itemsize == 0:
            text += f" (elements [{lo // itemsize}, {hi // itemsize}) of its flat view)"
        return text

    def _race_finding(self, first, second, lo, hi, owner, buffer_id) -> Finding:
        (ra, a), (rb, b) = self.accesses[first], self.accesses[second]
        if ra == rb:
            return self._task_race(ra, a, b, lo, hi, owner, buffer_id)

        def who(r, x):
            what = "atomic add" if x["atomic"] else ("write" if x["write"] else "read")
            return f"rank {r}: {x['name']} ({what} of '{x['tensor']}') at {x['where']}"

        message = (f"data race on {self._region(owner, buffer_id, lo, hi, a['itemsize'])}:\n"
                   f"  {who(ra, a)}\n  {who(rb, b)}\n"
                   "No notify/wait orders these two accesses, so the result depends on timing (in this schedule "
                   f"rank {ra}'s came first; on another, rank {rb}'s will).")
        locations, fix = _unique([a["where"], b["where"]]), FIXES["race"]
        for p, q, rq, x in ((first, second, rb, b), (second, first, ra, a)):
            waiter = self._waiter_of(p, q, rq)
            if waiter is not None:  # the order exists on q's rank, in a task q's task does not depend on
                task, wait = waiter
                name = _task_id_name(wait["where"])
                message += (f"\nOn rank {rq} the task at {wait['where']} waits for the signal that orders it after "
                            f"{self.accesses[p][1]['where']}, but the task at {task['where']} ({x['where']}) does "
                            "not depend on it.")
                locations = _unique([task["where"], x["where"], self.accesses[p][1]["where"]])
                fix = (f"Add deps=[{name}] to the task at {task['where']}: only a task that depends on the task "
                       f"waiting for the signal (at {wait['where']}) is ordered after what the signal announces.")
                break
        return Finding("race", message, sorted({ra, rb}), locations, RACE_PITFALL, fix)

    def _waiter_of(self, p: int, q: int, rank: int):
        """For a race between access ``p`` and access ``q`` of a task on ``rank``: ``(the task of q, a task of that
        rank ordered after p)`` when there is such a task and q's task is not ordered after it, else None."""
        gq = self.epochs[q][0]
        iq = self.info.get((rank, self.local[gq]), {})
        if iq.get("kind", "orchestration") == "orchestration":
            return None
        gp, ep = self.epochs[p]
        vq = self.vc[gq]
        for (r, local), g in self.gids.items():
            info = self.info.get((r, local), {})
            if r != rank or g == gq or info.get("kind") != "task" or info.get("task_id") == iq.get("task_id"):
                continue
            if self.vc[g].get(gp, 0) >= ep and not vq.get(g, 0):
                return iq, info
        return None

    def _task_race(self, rank: int, a: dict, b: dict, lo: int, hi: int, owner: int, buffer_id) -> Finding:
        """A race between two actors of one rank (tasks the graph leaves unordered): the line where the missing
        dependency belongs first, then the two accesses."""
        ia, ib = (self.info.get((rank, x.get("actor", 0)), {}) for x in (a, b))
        memory = a.get("memory")
        if memory is None:
            region = self._region(owner, buffer_id, lo, hi, a["itemsize"])
        else:
            what = "host tensor" if memory[0] == "host" else "pl.create_tensor tensor"
            region = f"bytes [{lo}, {hi}) of {what} '{a['tensor']}' on rank {owner}"
            if a["itemsize"] > 1 and lo % a["itemsize"] == 0 and hi % a["itemsize"] == 0:
                region += f" (elements [{lo // a['itemsize']}, {hi // a['itemsize']}) of its flat view)"

        def who(x, i):
            what = "atomic add" if x["atomic"] else ("write" if x["write"] else "read")
            return f"{_actor_text(i)}: {x['name']} ({what} of '{x['tensor']}') at {x['where']}"

        def order(i):  # tasks in submission order; the orchestration before them
            if i.get("kind", "orchestration") == "orchestration":
                return (-1, 0)
            tid = i.get("task_id")
            return (tid if tid is not None else -1, i.get("block") or 0)

        (ea, ei), (la, li) = sorted([(a, ia), (b, ib)], key=lambda p: order(p[1]))
        root = li.get("where") or la["where"]
        earlier = ei.get("where") or ea["where"]
        same_task = ia.get("kind") == ib.get("kind") == "block" and ia.get("task_id") == ib.get("task_id")
        halves = ia.get("kind") == ib.get("kind") == "half"
        if same_task:
            why = (f"Blocks {ei.get('block')} and {li.get('block')} of the task at {root} run concurrently on a "
                   "device, and both touch these bytes.")
            fix = (f"The blocks of the task at {root} run concurrently: make each block write its own part, indexed "
                   "by pl.get_block_idx() (pl.tile.get_block_idx() in a kernel), or write the shared part from "
                   "one task that runs after the blocks (deps=[its task id]).")
        elif halves:
            why = (f"The {ei.get('name')} and {li.get('name')} halves of the mixed kernel at {root} run concurrently "
                   "on a device; only their pipes (a tpush and the tpop of that tile) order them.")
            fix = (f"Order the two halves' accesses with a pipe: push a tile after the write and pop it before the "
                   f"read, or move the access to one half (the mixed kernel at {root}).")
        elif ei.get("kind", "orchestration") == "orchestration" or li.get("kind", "orchestration") == "orchestration":
            why = (f"The task at {root} and the orchestration's access are not ordered: the task runs concurrently "
                   "with the code after its submission.")
            fix = (f"Let the orchestration wait for the task at {root} before it touches the tensor (a task that "
                   "takes the tensor as an argument, outside a pl.manual_scope), or pass the tensor to the task.")
        else:
            name = _task_id_name(earlier)
            deps = li.get("dep_lines") or []
            why = "No path of the task graph leads from one task to the other, so on a device they run concurrently."
            if deps:
                why += (f" The task at {root} has deps= naming the task(s) at {', '.join(deps)}, not the one at "
                        f"{earlier}.")
            elif li.get("manual"):
                why += f" The task at {root} is in a pl.manual_scope without deps=: there only deps= orders tasks."
            fix = f"Add deps=[{name}] to the task at {root}"
            fix += ", or leave the pl.manual_scope." if li.get("manual") else \
                " (the two tasks share no tensor argument, so the task graph cannot order them by itself)."
        between = "two blocks of one task" if same_task else "two halves of a mixed kernel" if halves else \
            "two tasks" if "orchestration" not in (ei.get("kind", "orchestration"), li.get("kind", "orchestration")) \
            else "a task and the orchestration"
        message = (f"data race between {between} of rank {rank} on {region}:\n  {who(la, li)}\n  {who(ea, ei)}\n"
                   f"{why} (In this schedule the access at {a['where']} came first; on a device, either may.)")
        if same_task:  # the fix goes where a block writes: each block its own part
            w = b if b["write"] or not a["write"] else a
            locations = [w["where"], (a if w is b else b)["where"], root]
        else:
            locations = [root, b["where"], a["where"]]
        return Finding("race", message, [rank], _unique(locations), TASK_RACE_PITFALL, fix)

    def _uninit_finding(self, aid, owner, buffer_id, lo, hi) -> Finding:
        rank, rec = self.accesses[aid]
        near = self._nearest_writes(owner, buffer_id, lo, hi)
        message = (f"rank {rank} reads {self._region(owner, buffer_id, lo, hi, rec['itemsize'])} with {rec['name']} "
                   f"('{rec['tensor']}') at {rec['where']}, but no rank wrote those bytes in this dispatch before "
                   "the read: it gets the window's initial zeros.")
        if near:
            message += "\nNearest writes to the buffer:\n" + "\n".join(
                f"  rank {r} wrote {self._region(o, buffer_id, w_lo, w_hi, size)} with {name} at {where}"
                for o, w_lo, w_hi, r, where, name, size in near)
        else:
            message += f"\nNo rank wrote window buffer '{self.plan.windows[buffer_id].name}' at all."
        return Finding("uninitialized_read", message, [rank], _unique([rec["where"]] + [n[4] for n in near]),
                       UNINIT_PITFALL, FIXES["uninitialized_read"])

    def _nearest_writes(self, owner, buffer_id, lo, hi) -> list:
        """Up to two writes on the same rank's copy nearest [lo, hi), then one at those bytes on another copy."""
        writes = self.writes.get(buffer_id, set())

        def distance(w):
            return max(w[1] - hi, lo - w[2], 0)

        same = sorted((w for w in writes if w[0] == owner), key=lambda w: (distance(w), w[1], w[3]))
        other = sorted((w for w in writes if w[0] != owner and w[1] < hi and lo < w[2]), key=lambda w: (w[0], w[3]))
        return same[:2] + other[:1]

    def _stale_finding(self, rank, rec, prev, used) -> Finding:
        a = rec["args"]
        sym = _SYMBOLS[a["cmp"]]
        cell = f"cell {a['cell']} of '{a['buffer']}' on rank {rank}"
        if prev is None:
            why = (f"it held {a['seen']} before any notify reached it: the wait needed no notify at all, so it "
                   "orders nothing.")
            locations = [rec["where"]]
        else:
            sources = ", ".join(f"{'+' if m.op == 'AtomicAdd' else '='}{m.value} from rank {m.rank} at {m.where}"
                                for m in used) or "none"
            why = (f"the notifies that satisfy it ({sources}) are ones its previous wait on this cell, at {prev[1]}, "
                   "already consumed: nothing new had arrived, so it passed early (counters only grow; a reused "
                   "row still holds the last phase's arrivals).")
            locations = _unique([rec["where"], prev[1]])
        message = (f"stale signal: rank {rank}'s pld.system.wait at {rec['where']} on {cell} (needs {sym} "
                   f"{a['expected']}, saw {a['seen']}) was satisfied, but {why}")
        return Finding("stale_signal", message, [rank], locations, STALE_PITFALL, FIXES["stale_signal"])

    def _clobber_finding(self, first: _Mod, second: _Mod, buffer: str, cell) -> Finding:
        message = (f"NotifyOp.Set from rank {first.rank} at {first.where} (={first.value}) and from rank {second.rank} "
                   f"at {second.where} (={second.value}) to cell {cell} of '{buffer}' are not ordered, and no wait "
                   f"consumed the first before the second overwrote it: the first arrival is lost.")
        return Finding("set_clobber", message, sorted({first.rank, second.rank}), _unique([first.where, second.where]),
                       CLOBBER_PITFALL, FIXES["set_clobber"])


def _actor_text(info: dict) -> str:
    """How a report names an actor: the orchestration, a task, a block of one, a core half."""
    kind = info.get("kind", "orchestration")
    if kind == "orchestration":
        return "the orchestration"
    text = f"task '{info.get('name')}' (task {info.get('task_id')}, submitted at {info.get('where')})"
    if kind == "block":
        return f"block {info.get('block')} of {text}"
    if kind == "half":
        return f"the {info.get('name')} half of the mixed kernel at {info.get('where')}"
    return text


_TASK_ID_NAMES = (re.compile(r"\bas\s+([A-Za-z_]\w*)\s*:"), re.compile(r"([A-Za-z_]\w*)\s*=\s*pl\.(?:spmd_)?submit\b"))


def _task_id_name(where: str) -> str:
    """The name the program gives the task id of the task made at ``where`` (``with pl.at(...) as t``,
    ``_, t = pl.submit(...)``), or a placeholder naming the line."""
    file, _, line = where.rpartition(":")
    text = linecache.getline(file, int(line)) if line.isdigit() else ""
    for pattern in _TASK_ID_NAMES:
        m = pattern.search(text)
        if m and m.group(1) != "_":
            return m.group(1)
    return f"<the task id of the task at {where}>"


def _unique(items: list[str]) -> list[str]:
    out: list[str] = []
    for x in items:
        if x and x not in out:
            out.append(x)
    return out


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """Findings with the same kind and lines on several ranks become one naming every rank."""
    groups: dict = {}  # (kind, locations) -> (the first finding, the ranks its message names)
    for f in findings:
        key = (f.kind, frozenset(f.locations))
        if key in groups:
            groups[key][0].ranks = sorted(set(groups[key][0].ranks) | set(f.ranks))
        else:
            groups[key] = (f, set(f.ranks))
    out = []
    for f, named in groups.values():
        more = [r for r in f.ranks if r not in named]
        if more:
            f.message += f"\nThe same happens on rank(s) {', '.join(map(str, more))}."
        out.append(f)
    return out
