"""A rank's task graph: tasks run when their dependencies are complete, not merely when they are submitted.

A task (a ``pl.at`` region, a ``pl.submit``, a ``pl.spmd`` region) depends on
the task ids in its ``deps=`` and, outside a ``pl.manual_scope``, on every
earlier unfinished task it shares a tensor with (upstream's OverlapMap, by
buffer).  A task that registered ``pld.system.defer_wait`` conditions has run
but is *complete* only once they hold; until then its dependants wait and
independent tasks run.  That is what lets a waiter submitted before its
publisher in program order finish instead of hanging.

Tasks run on the rank's one thread, in submission order among those that are
ready — unless the backend's memory offers ``choose(n)`` (the sim backend's
seeded, replayable decisions): then it picks which ready task runs next, and
whether a ready ``pl.submit`` task of a manual scope runs at its submission or
later, as a device may run tasks with no path between them in any order; when
none is ready the rank blocks until *any* pending condition holds
(as a device's scheduler waits for whichever completes first: an older
condition may need a younger task's dependants to run first), then completes
every one that holds, oldest first.  The hang detector sees that wait like any
other.  With nothing pending a task runs the moment it is submitted, exactly as
a plain call would.

Scheduling is linear in the tasks and their edges (Kahn's algorithm): a waiting
task counts the unfinished tasks it waits for, each task lists its dependants,
and a task that completes makes ready the dependants whose count drops to zero;
ready tasks wait in a heap of ids.  The unfinished tasks that touch memory are
indexed by the byte ranges they cover (:class:`OverlapIndex`), so finding what a
new task overlaps never scans every unfinished task.  A deferred wait is polled
(``condition_holds``) when it is registered; when a task naming its task in
``deps=`` is submitted; and while the rank runs ready tasks, those named so,
oldest first up to the first that does not hold.  Every pending one is watched
in :class:`~ptodist.rank.deferred.PendingWaits`, which the rank context checks
in one vectorised pass per signal buffer while it blocks
(``block_until_any``): no poll walks the pending conditions one by one.
"""

from __future__ import annotations

import heapq
import weakref
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .deferred import Deferred, PendingWaits

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    byte_bounds = np.byte_bounds

_WAITING, _INCOMPLETE, _DONE = 0, 1, 2


@dataclass(eq=False)
class Task:
    tid: int
    name: str
    run: object  # () -> conditions still pending after the body ran (a list)
    deps: list
    buffers: frozenset  # the byte ranges (low, high) of the task's tensor arguments
    manual: bool
    conditions: list = field(default_factory=list)  # its deferred waits that did not hold when it ran (Deferred)
    left: int = 0  # how many of them still do not hold
    # The graph's bookkeeping: where the task is, how many unfinished tasks it waits for, who waits for it.
    state: int = field(default=_WAITING, repr=False)
    unmet: int = field(default=0, repr=False)
    dependants: list = field(default_factory=list, repr=False)
    named: bool = field(default=False, repr=False)  # a waiting task names it in deps=: poll it while the rank runs
    actor: int = field(default=0, repr=False)  # under the checker: the task run's actor in the event log
    holdable: bool = field(default=False, repr=False)  # may wait past its submission though ready (see choose)
    joined: bool = field(default=False, repr=False)  # under the checker: the orchestration has waited for it
    site: object = field(default=None, repr=False)  # where it was submitted (a Location or (code, line)): hang reports


def buffer_key(t) -> tuple[int, int]:
    """The bytes a rank tensor covers, ``(low, high)`` addresses (host tensors share one mapping: by address)."""
    return byte_bounds(t.array)


def overlap(a, b) -> bool:
    """Whether two sets of ``(low, high)`` byte ranges share a byte."""
    return any(lo < h and l2 < hi for lo, hi in a for l2, h in b)


class OverlapIndex:
    """The unfinished tasks by the byte ranges they touch: which of them a range overlaps, without a scan of all.

    Ranges are kept by length class (``length.bit_length()``), each class sorted by start, so the ranges
    that may overlap ``[a, b)`` in a class are those starting in ``(a - 2**class, b)``: a bisection and
    a short walk.  Per range, only the tasks a newcomer must wait for are kept: the last non-manual task
    with that range (it waited for every unfinished task overlapping it, so its completion implies
    theirs) and the manual tasks after it.  A non-manual task also drops the ranges it contains: whoever
    overlaps one of them overlaps it too, and waits for it.
    """

    def __init__(self, keep_done: bool = False):
        self._classes: dict[int, list] = {}       # length class -> sorted [(low, high)]
        self._entries: dict[tuple, list] = {}     # (low, high) -> [last non-manual task or None, manual tasks]
        # The checker's index keeps complete tasks too: a task that overlaps one is ordered after it on a device,
        # however long ago it completed here.  It drops those the orchestration has waited for (``joined``):
        # everything submitted later is ordered after them already.
        self._keep_done = keep_done

    def __bool__(self) -> bool:
        return bool(self._entries)

    def add(self, task: Task) -> None:
        """Index an unfinished task (after :meth:`overlapping` of its ranges, which dropped what it contains)."""
        for key in task.buffers:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = [None, []]
                insort(self._classes.setdefault((key[1] - key[0]).bit_length(), []), key)
            if task.manual:
                entry[1].append(task)
            else:
                entry[0], entry[1] = task, []

    def overlapping(self, buffers, prune: bool = False) -> set[Task]:
        """The unfinished tasks to wait for before touching ``buffers``; ``prune``: drop the ranges they contain."""
        found: set[Task] = set()
        for a, b in buffers:
            for cls, keys in self._classes.items():
                i = bisect_left(keys, (a - (1 << cls) + 1,))
                while i < len(keys) and keys[i][0] < b:
                    key = keys[i]
                    if key[1] <= a:
                        i += 1
                        continue
                    entry = self._entries[key]
                    last, manual = entry
                    if last is not None and (last.joined if self._keep_done else last.state == _DONE):
                        last = entry[0] = None
                    if manual and any(t.joined if self._keep_done else t.state == _DONE for t in manual):
                        manual[:] = [t for t in manual if not (t.joined if self._keep_done else t.state == _DONE)]
                    if last is not None:
                        found.add(last)
                    found.update(manual)
                    if last is None and not manual or prune and a <= key[0] and key[1] <= b:
                        del keys[i]
                        del self._entries[key]
                    else:
                        i += 1
        return found


class TaskGraph:
    """The submitted-but-unfinished tasks of one rank."""

    def __init__(self, owner):
        # The rank context, by a weak proxy: a strong reference would make a cycle that only a full garbage
        # collection frees, keeping the dispatch's tensors (and their shared-memory mappings) alive until then.
        # Its condition_holds(c) polls a deferred wait (never blocks); watched(c) says which cell c watches
        # (buffer id, cell index, expected, whether >=); block_until_any(pending) blocks until some of the
        # pending waits hold and returns those that do, oldest first, each recorded as a satisfied wait.
        self._owner = weakref.proxy(owner)
        self.waiting: dict[int, Task] = {}     # submitted, not yet run
        self.incomplete: dict[int, Task] = {}  # ran, but deferred conditions still pending (in the order they ran)
        self._ready: list[int] = []            # heap: ids of waiting tasks that wait for nothing any more
        self._named: deque[Task] = deque()     # incomplete tasks a waiting task names in deps=, oldest first
        self._pending = PendingWaits()         # every incomplete task's pending deferred waits
        self._overlaps = OverlapIndex()
        # The backend's seeded decisions, where it offers them (sim): choose(n) -> [0, n), 0 for program order.
        # Ready tasks with no path between them may run in any order on a device; the sim backend picks one.
        self._choose = getattr(getattr(owner, "memory", None), "choose", None)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.incomplete

    def _unfinished(self, tid: int) -> Task | None:
        return self.waiting.get(tid) or self.incomplete.get(tid)

    def submit(self, task: Task) -> bool:
        """Run ``task`` now if nothing it depends on is unfinished, else queue it; True when it ran."""
        if self._overlaps and self.idle:
            self._overlaps = OverlapIndex()  # every task it holds is complete
        if self.idle and self._named:
            self._named.clear()
        blockers: set[Task] = set()
        polling = True  # as the deps are read in order: poll an incomplete one until one is found pending
        for d in task.deps:
            t = self._unfinished(d)
            if t is None:
                continue
            if polling and t.state == _INCOMPLETE and self._poll(t):
                continue
            polling = False
            blockers.add(t)
        if not task.manual and task.buffers and (self.waiting or self.incomplete):
            blockers |= self._overlaps.overlapping(task.buffers, prune=True)
        if not blockers and self._choose is not None and (self._ready or task.holdable):
            # Ready, but others are ready too or it may be held: the backend decides what runs when.
            self.waiting[task.tid] = task
            heapq.heappush(self._ready, task.tid)
            if task.buffers:
                self._overlaps.add(task)
            if not (task.holdable and self._choose(2)):  # held: it runs when the rank next runs ready tasks
                self.progress()
            return task.state != _WAITING
        if not blockers:
            self._run(task, indexed=False)
            self.progress()
            return True
        task.unmet = len(blockers)
        for t in blockers:
            t.dependants.append(task)
        for d in task.deps:
            t = self._unfinished(d)
            if t is not None and not t.named:
                t.named = True
                if t.state == _INCOMPLETE:
                    self._named.append(t)
        self.waiting[task.tid] = task
        if task.buffers:
            self._overlaps.add(task)
        self.progress()
        return False

    def _run(self, task: Task, indexed: bool = True) -> None:
        """Run a task whose dependencies are complete; ``indexed``: it waited, so the overlap index has it."""
        self.waiting.pop(task.tid, None)
        owner = self._owner
        conditions = [c for c in task.run() if not owner.condition_holds(c)]
        if not conditions:
            self._finish(task)
            return
        task.conditions = [self._pending.add(c, task, *owner.watched(c)) for c in conditions]
        task.left = len(conditions)
        task.state = _INCOMPLETE
        self.incomplete[task.tid] = task
        if task.named:
            self._named.append(task)
        if not indexed and task.buffers:
            self._overlaps.add(task)  # it blocks the tasks that overlap it until its conditions hold

    def _poll(self, task: Task) -> bool:
        """Poll an incomplete task's deferred waits; True (and the task finished) when they all hold."""
        for d in task.conditions:
            if d.watched and self._owner.condition_holds(d.cond):
                self._held(d)
        return task.state == _DONE

    def _held(self, d: Deferred) -> None:
        """Deferred wait ``d`` held (the rank context recorded it): its task is complete once none is left."""
        self._pending.drop(d)
        task = d.task
        task.left -= 1
        if not task.left:
            del self.incomplete[task.tid]
            task.conditions = []
            self._finish(task)

    def _finish(self, task: Task) -> None:
        """``task`` is complete: its dependants wait for one task fewer."""
        task.state = _DONE
        for t in task.dependants:
            t.unmet -= 1
            if t.unmet == 0:
                heapq.heappush(self._ready, t.tid)
        task.dependants = []

    def _poll_named(self) -> None:
        """Poll the incomplete tasks that waiting tasks name in deps=, oldest first, up to one still pending."""
        named = self._named
        while named:
            if named[0].state == _INCOMPLETE and not self._poll(named[0]):
                return
            named.popleft()

    def progress(self) -> bool:
        """Run every waiting task that has become ready (in submission order); True when any ran."""
        ran_any = False
        while True:
            if self._named:
                self._poll_named()
            if not self._ready:
                return ran_any
            if self._choose is not None and len(self._ready) > 1:
                ready = sorted(self._ready)
                tid = ready.pop(self._choose(len(ready)))
                self._ready = ready  # a sorted list is a heap
            else:
                tid = heapq.heappop(self._ready)
            self._run(self.waiting[tid])
            ran_any = True

    def run_ready(self) -> bool:
        """Run the tasks that are ready (a held one among them) before the rank blocks in a wait: on a device they
        would run meanwhile, and what the rank waits for may be theirs.  True when any ran."""
        return bool(self._ready) and self.progress()

    @property
    def pending(self) -> PendingWaits:
        """Every incomplete task's pending deferred waits (empty, and false, when none is pending)."""
        return self._pending

    def held(self, found) -> None:
        """Deferred waits ``found`` held while the rank blocked in a wait of its own (the rank context recorded
        them): complete their tasks and run what that made ready."""
        for d in found:
            self._held(d)
        self.progress()

    def wait_for(self, tids=None) -> None:
        """Block until the tasks ``tids`` (all, when None) are complete, running what becomes ready meanwhile.

        When nothing is ready the rank blocks until any pending deferred wait holds (the one that holds
        first may be a younger task's, whose dependants bring about an older one's), completes every one
        that holds, oldest first, and runs what that made ready.
        """
        def pending() -> bool:
            if tids is None:
                return not self.idle
            return any(t in self.incomplete or t in self.waiting for t in tids)

        while pending():
            if self.progress():
                continue
            if not self.incomplete:
                names = ", ".join(f"{t.name} (task {t.tid}, deps {t.deps})" for t in self.waiting.values())
                raise AssertionError(f"task graph stuck with nothing to wait for: {names}")
            for d in self._owner.block_until_any(self._pending):
                self._held(d)

    def wait_overlapping(self, buffers: frozenset) -> None:
        """Block until no unfinished task touches ``buffers`` (before a plain call or read that touches them)."""
        pending = [t.tid for t in self._overlaps.overlapping(buffers)]
        if pending:
            self.wait_for(sorted(pending))
