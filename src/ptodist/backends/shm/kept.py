"""One-shot calls' rank groups kept between calls: a program's next call reuses its ranks and the
mapping they inherited, instead of forking again (``_KEPT``; closed when idle, evicted, collected, at exit).
"""

from __future__ import annotations

import io
import mmap
import os
import sys
import threading
import time
import weakref

import numpy as np

from ...compiler.plan import DispatchPlan
from .group import RankGroup
from .wire import PlanPickler

# The token under which a one-shot group's ranks find the mapping they inherit (host tensors, window heaps).
ONE_SHOT_TOKEN = 0

KEPT_IDLE_S = 5.0   # an idle kept group is closed after this long (the next call forks again)
KEPT_MAX = 4        # kept groups at most (the least recently used goes first)
KEPT_PLANS = 256    # plans a kept group's ranks hold before they are told to forget them


def _call_context() -> tuple:
    """What ranks take from the driver when they are forked and a later call on them must still share.

    Where their output goes (``sys.stdout``/``sys.stderr`` and descriptors 1 and 2, which a test's
    capture replaces), the environment (``RANK``-like settings, ``PTODIST_*``), the working directory
    (relative DFX paths) and the process (a kept group belongs to the process that forked it).
    """
    fds = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            fds.append((st.st_dev, st.st_ino))
        except OSError:
            fds.append(None)
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    env = getattr(os.environ, "_data", None)  # the raw bytes: hashed without decoding every entry
    env = hash(frozenset((env if env is not None else os.environ).items()))
    return (os.getpid(), cwd, id(sys.stdout), id(sys.stderr), *fds, env)


def _plan_objects(plan: DispatchPlan) -> dict:
    """The functions a plan's ranks run, and what they refer to, by ``id`` (``PlanPickler``'s table)."""
    from ...compiler.checks import reachable_functions
    from ...language.functions import Function

    roots = [t.function for tasks in plan.tasks for t in tasks if isinstance(t.function, Function)]
    objects: dict = {}
    if roots:
        for f in reachable_functions(roots[0], roots[1:]):
            objects[id(f.fn)] = f
            if f.bound_self is not None:
                objects[id(f.bound_self)] = f.bound_self
    return objects


class _KeptGroup:
    """A one-shot caller's rank group kept between its calls, with the mapping its ranks inherited.

    Plans travel by value with their functions by reference (``PlanPickler``, strict): a later
    plan whose functions the ranks were forked without cannot use the group.
    """

    def __init__(self, group: RankGroup, mm: mmap.mmap, memory: np.ndarray, context: tuple, stamp):
        self.group = group
        self.mm = mm
        self.memory = memory
        self.size = len(memory)
        self.context = context
        self.stamp = stamp  # the program state its ranks were forked with
        self.plans: dict[int, tuple[DispatchPlan, int]] = {}  # id(plan) -> (plan, its id in the ranks)
        self.calls = 0
        self.next_plan = 0
        self.first: tuple | None = None  # (plan, blob): a new plan, pickled by accepts() for its call
        self.idle_since = 0.0
        self.finalizer: weakref.finalize | None = None  # closes the group when its owner is collected

    @classmethod
    def fork_for(cls, plan: DispatchPlan, mm: mmap.mmap, stamp) -> _KeptGroup | None:
        """A group (not yet forked) over ``mm`` that can keep serving ``plan``'s program; None if it cannot."""
        objects = _plan_objects(plan)
        memory = np.frombuffer(mm, dtype=np.uint8)
        group = RankGroup(plan.device_ids, objects, 0.0, owner=plan.program, inherited={ONE_SHOT_TOKEN: memory})
        kept = cls(group, mm, memory, _call_context(), stamp)
        if not kept.accepts(plan):  # a plan that cannot travel by value: the caller uses a group once
            group.close()  # nothing was forked; ``mm`` stays the caller's
            return None
        return kept

    def accepts(self, plan: DispatchPlan) -> bool:
        """Whether the ranks can run ``plan`` (pickled now, for its call, when they do not have it yet)."""
        known = self.plans.get(id(plan))
        if known is not None and known[0] is plan:
            return True
        try:
            self.first = (plan, self.encode(plan))
        except Exception:  # noqa: BLE001 - unpicklable arguments, or functions the ranks lack
            return False
        return True

    def encode(self, plan: DispatchPlan) -> bytes:
        """``plan`` pickled for the ranks (raises when it refers to a function they lack)."""
        buf = io.BytesIO()
        PlanPickler(buf, self.group.objects, strict=True).dump((plan, []))
        return buf.getvalue()

    def prepare(self, plan: DispatchPlan) -> tuple[int, int, bytes | None, bool]:
        """The number, plan id, plan blob (only the first time) and forget flag of the next call of ``plan``."""
        number = self.calls
        self.calls += 1
        known = self.plans.get(id(plan))
        if known is not None and known[0] is plan:
            return number, known[1], None, False
        forget = len(self.plans) >= KEPT_PLANS
        if forget:
            self.plans.clear()
        first, self.first = self.first, None
        blob = first[1] if first is not None and first[0] is plan else self.encode(plan)
        plan_id = self.next_plan
        self.next_plan += 1
        self.plans[id(plan)] = (plan, plan_id)
        return number, plan_id, blob, forget

    def usable(self, device_ids: list, total: int, context: tuple, stamp) -> bool:
        g = self.group
        return (not g.dead and g.device_ids == list(device_ids) and total <= self.size and context == self.context
                and stamp == self.stamp and not g.reap())

    def close(self) -> None:
        if self.finalizer is not None:
            self.finalizer.detach()
            self.finalizer = None
        self.group.close()
        self.memory = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still referenced (e.g. by a traceback); the GC unmaps it later


class _Kept:
    """The kept one-shot groups of this process, one per owner; a daemon thread closes idle ones."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._forget)

    def _reset(self) -> None:
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.groups: dict[int, _KeptGroup] = {}  # id(owner) -> its idle group
        self.thread: threading.Thread | None = None

    def _forget(self) -> None:
        """In a forked child: the groups are the parent's (its ranks, its finalizers); drop them untouched."""
        for kept in self.groups.values():
            if kept.finalizer is not None:
                kept.finalizer.detach()
        self._reset()

    def take(self, owner, device_ids: list, total: int, stamp) -> _KeptGroup | None:
        """``owner``'s idle group when it can run a call needing ``total`` bytes of mapping with the program
        state ``stamp`` its ranks were forked with, else None."""
        with self.lock:
            kept = self.groups.pop(id(owner), None)
        if kept is None:
            return None
        if kept.usable(device_ids, total, _call_context(), stamp):
            return kept
        kept.close()
        return None

    def give(self, owner, kept: _KeptGroup) -> None:
        """Keep ``owner``'s group, idle, for its next call."""
        kept.idle_since = time.monotonic()
        if kept.finalizer is None:
            kept.finalizer = weakref.finalize(owner, self.discard, id(owner))
        evicted = []
        with self.lock:
            old = self.groups.pop(id(owner), None)
            if old is not None and old is not kept:
                evicted.append(old)
            self.groups[id(owner)] = kept
            while len(self.groups) > KEPT_MAX:
                oldest = min(self.groups, key=lambda k: self.groups[k].idle_since)
                evicted.append(self.groups.pop(oldest))
            if self.thread is None:
                self.thread = threading.Thread(target=self._close_idle, name="ptodist-kept-groups", daemon=True)
                self.thread.start()
            self.wakeup.notify()
        for k in evicted:
            k.close()

    def discard(self, key: int) -> None:
        """Close the group of the owner ``key`` (it was collected, or the process exits)."""
        with self.lock:
            kept = self.groups.pop(key, None)
        if kept is not None:
            kept.close()

    def close_all(self) -> None:
        with self.lock:
            groups, self.groups = list(self.groups.values()), {}
        for kept in groups:
            kept.close()

    def _close_idle(self) -> None:
        while True:
            with self.lock:
                while True:
                    now = time.monotonic()
                    due = min((k.idle_since + KEPT_IDLE_S for k in self.groups.values()), default=None)
                    if due is not None and due <= now:
                        break
                    self.wakeup.wait(None if due is None else due - now)
                expired = [key for key, k in self.groups.items() if k.idle_since + KEPT_IDLE_S <= now]
                idle = [self.groups.pop(key) for key in expired]
            for kept in idle:
                kept.close()


_KEPT = _Kept()


def close_kept_groups() -> None:
    """Close every rank group kept for one-shot calls (the next call of each program forks afresh)."""
    _KEPT.close_all()
