"""A rank's task graph: tasks run when their dependencies are complete, not merely when they are submitted.

A task (a ``pl.at`` region, a ``pl.submit``, a ``pl.spmd`` region) depends on
the task ids in its ``deps=`` and, outside a ``pl.manual_scope``, on every
earlier unfinished task it shares a tensor with (upstream's OverlapMap, by
buffer).  A task that registered ``pld.system.defer_wait`` conditions has run
but is *complete* only once they hold; until then its dependants wait and
independent tasks run.  That is what lets a waiter submitted before its
publisher in program order finish instead of hanging.

Tasks run on the rank's one thread, in submission order among those that are
ready; when none is ready the rank blocks until one of the pending conditions
holds (the hang detector sees that wait like any other).  With nothing pending
a task runs the moment it is submitted, exactly as a plain call would.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    byte_bounds = np.byte_bounds


@dataclass
class Task:
    tid: int
    name: str
    run: object  # () -> conditions still pending after the body ran (a list)
    deps: list
    buffers: frozenset  # the byte ranges (low, high) of the task's tensor arguments
    manual: bool
    conditions: list = field(default_factory=list)


def buffer_key(t) -> tuple[int, int]:
    """The bytes a rank tensor covers, ``(low, high)`` addresses (host tensors share one mapping: by address)."""
    return byte_bounds(t.array)


def overlap(a, b) -> bool:
    """Whether two sets of ``(low, high)`` byte ranges share a byte."""
    return any(lo < h and l2 < hi for lo, hi in a for l2, h in b)


class TaskGraph:
    """The submitted-but-unfinished tasks of one rank."""

    def __init__(self, owner):
        # The rank context, by a weak proxy: a strong reference would make a cycle that only a full garbage
        # collection frees, keeping the dispatch's tensors (and their shared-memory mappings) alive until then.
        # Its condition_holds(c) polls a deferred wait (never blocks); block_until_first(cs) blocks on them.
        self._owner = weakref.proxy(owner)
        self.waiting: list[Task] = []      # submitted, not yet run
        self.incomplete: dict[int, Task] = {}  # ran, but deferred conditions still pending

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.incomplete

    def complete(self, tid: int) -> bool:
        if any(w.tid == tid for w in self.waiting):
            return False  # not even run yet
        task = self.incomplete.get(tid)
        if task is None:
            return True
        task.conditions = [c for c in task.conditions if not self._owner.condition_holds(c)]
        if task.conditions:
            return False
        del self.incomplete[tid]
        return True

    def _blocked_by(self, task: Task, earlier: list[Task]) -> bool:
        if not all(self.complete(d) for d in task.deps):
            return True
        if task.manual:
            return False
        others = [*earlier, *self.incomplete.values()]
        return any(overlap(o.buffers, task.buffers) for o in others if o.tid != task.tid)

    def submit(self, task: Task) -> bool:
        """Run ``task`` now if nothing it depends on is unfinished, else queue it; True when it ran."""
        if not self._blocked_by(task, self.waiting):
            self._run(task)
            self.progress()
            return True
        self.waiting.append(task)
        self.progress()
        return False

    def _run(self, task: Task) -> None:
        task.conditions = [c for c in task.run() if not self._owner.condition_holds(c)]
        if task.conditions:
            self.incomplete[task.tid] = task

    def progress(self) -> bool:
        """Run every waiting task that has become ready (in submission order); True when any ran."""
        ran_any, again = False, True
        while again:
            again = False
            for i, task in enumerate(self.waiting):
                if not self._blocked_by(task, self.waiting[:i]):
                    del self.waiting[i]
                    self._run(task)
                    ran_any = again = True
                    break
        return ran_any

    def wait_for(self, tids=None) -> None:
        """Block until the tasks ``tids`` (all, when None) are complete, running what becomes ready meanwhile."""
        def pending() -> bool:
            if tids is None:
                return not self.idle
            return any(t in self.incomplete or any(w.tid == t for w in self.waiting) for t in tids)

        while pending():
            if self.progress():
                continue
            for tid in list(self.incomplete):
                self.complete(tid)
            if self.progress() or not pending():
                continue
            if not self.incomplete:
                names = ", ".join(f"{t.name} (task {t.tid}, deps {t.deps})" for t in self.waiting)
                raise AssertionError(f"task graph stuck with nothing to wait for: {names}")
            self._owner.block_until_first([c for t in self.incomplete.values() for c in t.conditions])

    def wait_overlapping(self, buffers: frozenset) -> None:
        """Block until no unfinished task touches ``buffers`` (before a plain call or read that touches them)."""
        def tids():
            return [t.tid for t in (*self.waiting, *self.incomplete.values()) if overlap(t.buffers, buffers)]

        pending = tids()
        if pending:
            self.wait_for(pending)
