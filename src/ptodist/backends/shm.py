"""The ``shm`` backend: rank processes over shared memory.

A ``RankGroup`` forks one process per rank; each serves one command after another
(``_serve``, whose rank body is ``rank.body.run_rank``): the driver writes a command
into a frame of the group's control mapping and rings a doorbell word, the ranks run
it and count themselves into a ``finished`` word, and a ``CommandWatch`` turns
failures and stalls into exceptions (``_Monitor``, the one stall rule).

* A ``DistributedWorker``'s group is started once.  Host tensors, resident tensors and
  window heaps are shared files whose descriptors reach the ranks over a unix socket
  (``SCM_RIGHTS``), so memory made after the fork is seen in place.
* A one-shot call (``ShmBackend.run``) is a group used once: one anonymous mapping
  holds the host tensors (copied in, outputs copied out after success) and the window
  heaps (``world`` rows); the group is forked with the command already published, so
  the ranks inherit the mapping and start at once.

An anonymous ``MAP_SHARED`` mapping vanishes with the last process that maps it,
and the files are memfds, so no shared-memory segment can leak.  Ranks ask the
kernel to kill them if the driver dies, and the driver kills and reaps every
rank on any ending it cannot recover from: error, hang or Ctrl-C.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import weakref
from typing import NamedTuple

import numpy as np

from .. import _atomics
from ..check.hang import hang_error
from ..compiler.plan import DispatchPlan, split_segments
from ..dfx import finish_run
from ..errors import HangError, PtodistInternalError, RankError, RankFailure, UsageError
from ..language import dtypes as dt
from ..language.regions import reduce_region
from ..language.types import Direction
from ..rank import death
from ..rank.body import RankStopped, run_rank
from ..rank.context import RankContext
from ..rank.events import EventLog
from ..rank.status import (
    DONE,
    FAILED,
    RUNNING,
    WAITING,
    StatusBoard,
    cell_holds,
    install_line_sampler,
    waited_cells,
)
from . import resources
from .base import (
    STOP_WRITE_S,
    Command,
    HostView,
    SharedHeap,
    StallRule,
    last_activity,
    note_where,
    rank_died,
    sample_lines,
)

ALIGN = 64
POLL_S = 0.02
# After the first failure, wait this long for the other ranks' reports before stopping them.
GRACE_S = 0.2
# The token under which a one-shot group's ranks find the mapping they inherit (host tensors, window heaps).
ONE_SHOT_TOKEN = 0


_CPUS = os.cpu_count() or 1


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class WindowHeap:
    """Where a plan's window buffers lie: rank r's heap starts at ``base + r * stride`` of ``arena``."""

    def __init__(self, arena: np.ndarray, base: int, stride: int, offsets: list[int], sizes: list[int]):
        self.arena = arena
        self.base = base
        self.stride = stride
        self.offsets = offsets
        self.sizes = sizes

    @classmethod
    def for_plan(cls, arena: np.ndarray, base: int, stride: int, plan: DispatchPlan) -> WindowHeap:
        return cls(arena, base, stride, [w.offset for w in plan.windows], [w.nbytes for w in plan.windows])


class ShmMemory:
    """RankMemory over shared memory (used by the ranks, and by the driver to read cells).

    ``arena``/``layout`` hold the control words (sleepers, locks); ``heap`` says where the window
    buffers are; ``status`` is the group's status board.
    """

    def __init__(self, arena: np.ndarray, layout, rank: int, world: int, heap: WindowHeap, status: StatusBoard):
        self.arena = arena
        self.layout = layout
        self.rank = rank
        self.world = world
        self.base = arena.ctypes.data
        self.sleepers_addr = self.base + layout.sleepers
        # Each rank's wake slot (armed, seq, seq sleepers): a notify to a rank waiting for any of several
        # cells wakes it through its slot (wait_any).
        self._wake = [self.base + layout.wakes + WAKE_BYTES * r for r in range(world)]
        self._zero = self.base + layout.zero
        self._cells: dict = {}  # buffer id -> this rank's copy of the buffer as INT32 cells
        self.heap = heap
        self._heap_base = heap.arena.ctypes.data
        # Each buffer's address on each rank, [buffer_id][rank]: a cell's address is two lookups and an add
        # (a notify or wait computes one every time).
        self._at = [[self._heap_base + heap.base + r * heap.stride + off for r in range(world)] for off in heap.offsets]
        self.status = status
        # Waiting ranks spin briefly when cores are free; when ranks outnumber cores they yield the core
        # for a while (the notifier may be waiting for it), then sleep.
        if world <= _CPUS:
            self.spin_s, self.yield_s = 50e-6, 0.0
        else:
            self.spin_s, self.yield_s = 2e-6, 200e-6

    def _buffer_off(self, buffer_id: int, rank: int) -> int:
        return self.heap.base + rank * self.heap.stride + self.heap.offsets[buffer_id]

    def window_bytes(self, buffer_id: int, rank: int) -> np.ndarray:
        off = self._buffer_off(buffer_id, rank)
        return self.heap.arena[off:off + self.heap.sizes[buffer_id]]

    def _addr(self, buffer_id: int, rank: int, offset: int) -> int:
        return self._at[buffer_id][rank] + offset

    def notify(self, ledger, buffer_id, rank, offset, value, is_set, word, slot):
        return ledger.notify(self._at[buffer_id][rank] + offset, self.sleepers_addr, value, is_set, word, buffer_id,
                             rank, offset, slot, self._wake[rank])

    def cell_add(self, buffer_id, rank, offset, value):
        return _atomics.fetch_add(self._at[buffer_id][rank] + offset, self.sleepers_addr, value)

    def cell_set(self, buffer_id, rank, offset, value):
        return _atomics.exchange(self._at[buffer_id][rank] + offset, self.sleepers_addr, value)

    def cell_load(self, buffer_id, rank, offset):
        return _atomics.load(self._at[buffer_id][rank] + offset)

    def cell_wait(self, buffer_id, offset, ge, expected, timeout_s):
        return _atomics.wait(self._addr(buffer_id, self.rank, offset), self.sleepers_addr, int(ge), expected,
                             self.spin_s, self.yield_s, timeout_s)

    def cells(self, buffer_id):
        view = self._cells.get(buffer_id)
        if view is None:
            raw = self.window_bytes(buffer_id, self.rank)
            view = self._cells[buffer_id] = raw[:len(raw) // 4 * 4].view(np.int32)
        return view

    def wait_any(self, check, timeout_s):
        """Block until ``check()`` (a look at this rank's cells) is true, at most ``timeout_s``.

        The rank arms its wake slot, so that every notify to it moves the slot's ``seq`` word and wakes it
        there; it reads ``seq`` before each look, and sleeps only while ``seq`` has not moved since (a notify
        between the look and the sleep ends the sleep at once).  A cell written without a notify is seen at
        the next slice.
        """
        if check():
            return True
        if timeout_s <= 0:
            return False
        armed = self._wake[self.rank]
        seq, seq_sleepers = armed + 4, armed + 8
        _atomics.fetch_add(armed, self._zero, 1)
        try:
            end = time.monotonic() + timeout_s
            spin, yld = self.spin_s, self.yield_s
            while True:
                seen = _atomics.load(seq)
                if seen > _SEQ_WRAP:  # only this rank reads it: start again from 0 long before INT32 wraps
                    _atomics.exchange(seq, self._zero, 0)
                    seen = 0
                if check():
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                _atomics.wait(seq, seq_sleepers, 1, seen + 1, spin, yld, min(left, self._slice_s))
                self._between_slices()
                spin = yld = 0.0
        finally:
            _atomics.fetch_add(armed, self._zero, -1)

    _slice_s = 0.05  # how soon a watched cell written without a notify is seen

    def _between_slices(self) -> None:
        """Called between two slices of a wait (a group's rank checks for an abort here)."""

    def locked(self, rank: int) -> _Lock:
        return _Lock(self.base + self.layout.locks + 4 * rank)


class _Lock:
    """Holds a rank's accumulate lock while a ``with`` block runs (a class: cheaper than a generator context
    manager, and a host allreduce takes one per peer)."""

    __slots__ = ("addr",)

    def __init__(self, addr: int):
        self.addr = addr

    def __enter__(self) -> None:
        _atomics.lock(self.addr)

    def __exit__(self, *exc) -> None:
        _atomics.unlock(self.addr)


# -- the watch: failures and stalls ------------------------------------------------------

class _Monitor:
    """Decides, from the status board, when ranks that stopped making progress hang, and explains it."""

    def __init__(self, memory: ShmMemory, plan: DispatchPlan, pids: dict[int, int], hang_timeout: float):
        self.memory = memory
        self.plan = plan
        self.world = plan.world
        self.pids = pids  # rank -> pid of the ranks still running (read, not owned)
        self.hang_timeout = hang_timeout
        self.rows = memory.status.rows
        self.rule = StallRule(hang_timeout)

    def check(self, done: set[int]) -> None:
        """Raise HangError when the unfinished ranks are certainly blocked, or idle past the timeout."""
        found = self.rule.observe(self.rows["progress"], time.monotonic(), lambda: self._all_blocked(done))
        if found is not None:
            raise self.hang(*found, done)

    def _all_blocked(self, done: set[int]) -> bool:
        pending = [r for r in range(self.world) if r not in done]
        if not pending:
            return False
        others = self.memory.status.others
        for r in pending:
            row = self.rows[r]
            if row["state"] != WAITING:
                return False
            for buffer_id, offset, cmp, expected in waited_cells(row, others[r]):
                if cell_holds(cmp, self.memory.cell_load(buffer_id, r, offset), expected):
                    return False
        return True

    def hang(self, certain: bool, idle: float, done: set[int]) -> HangError:
        """Return the HangError describing every rank's state now (with the lines busy ranks run)."""
        busy = {}
        if not certain:
            running = [r for r in range(self.world) if r not in done and self.rows[r]["state"] == RUNNING]
            busy = sample_lines(self.memory.status, self.pids, running)
        return hang_error(self.plan, self.memory.status, self.memory.cell_load, done, certain, idle,
                          self.hang_timeout, busy)


def _kill_and_reap(pids: dict[int, int]) -> None:
    """SIGKILL every process in ``pids`` (rank -> pid), wait for each, and empty the dict."""
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids.values():
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    pids.clear()


# -- one-shot runs -------------------------------------------------------------------------

class ShmBackend:
    """Runs a plan with one forked process per rank."""

    name = "shm"

    def start(self, device_ids: list, objects: dict, startup_timeout_s: float) -> RankGroup:
        """Fork a DistributedWorker's rank processes; raise RankError (nothing left running) if one fails to start."""
        group = RankGroup(device_ids, objects, startup_timeout_s)
        try:
            group.start()
        except BaseException:
            group.close()
            raise
        return group

    def run(self, plan: DispatchPlan, host_arrays: list, config, dfx=None, *, owner=None, stamp=None,
            scalars: tuple = ()) -> None:
        """A one-shot call: a rank group forked with its command already published, or, for ``owner``, reused.

        The host tensors and the window heaps lie in one anonymous shared mapping made before the
        fork, so the ranks inherit it (no descriptor travels); the host tensors are copied in, and the
        outputs out once every rank succeeded.  Forking a torch-sized driver costs tens of
        milliseconds, so with ``owner`` (the CompiledProgram making the call) the group and its
        mapping are kept for that owner's next call (``_KEPT``): closed after an error or an
        interrupt, after ``KEPT_IDLE_S`` idle, when the owner is collected, and at exit.  ``stamp`` is the
        owner's program state now (``compiler.state``): kept ranks were forked with the state of their
        first call, so a call whose stamp differs forks afresh, and its ranks see the driver's state as
        it is (what the ranks' code changes is refused by every rank itself).
        """
        host_bytes = sum(a.nbytes for a in host_arrays if a is not None)
        resources.check_windows(plan.program, plan.windows, plan.world, host_bytes)
        offsets, off = [], 0
        for a in host_arrays:
            offsets.append(off if a is not None else None)
            off = _align(off + (a.nbytes if a is not None else 0))
        stride = _align(max(plan.window_heap_bytes, ALIGN))
        total = off + stride * plan.world
        kept = _KEPT.take(owner, plan.device_ids, total, stamp) if owner is not None else None
        if kept is not None and not kept.accepts(plan):
            kept.close()  # a plan of functions its ranks were forked without: fork again
            kept = None
        if kept is None:
            try:
                mm = mmap.mmap(-1, total)
            except OSError as e:
                raise resources.no_memory(plan.program, plan.windows, plan.world, total, e) from None
            kept = _KeptGroup.fork_for(plan, mm, stamp) if owner is not None else None
        else:
            kept.memory[off:total] = 0  # the window heaps start zeroed, as in a fresh mapping
        if kept is None:  # no owner, or a plan the ranks cannot be sent by value: a group used once
            memory = np.frombuffer(mm, dtype=np.uint8)
            try:
                group = RankGroup(plan.device_ids, {id(plan): plan}, 0.0, owner=plan.program,
                                  inherited={ONE_SHOT_TOKEN: memory}, once=True)
                self._run_on(group, None, plan, host_arrays, config, dfx, memory, offsets, off, stride, scalars)
            finally:
                del memory
                try:
                    mm.close()
                except BufferError:
                    pass  # a view is still referenced (e.g. by a traceback); the GC unmaps it later
            return
        try:
            self._run_on(kept.group, kept, plan, host_arrays, config, dfx, kept.memory, offsets, off, stride,
                         scalars)
        except BaseException:
            kept.close()
            raise
        _KEPT.give(owner, kept)

    @staticmethod
    def _run_on(group: RankGroup, kept: _KeptGroup | None, plan, host_arrays, config, dfx, memory, offsets,
                heap_at, stride, scalars: tuple = ()) -> None:
        """Run ``plan`` on ``group`` (forked now when it has no ranks yet); close it unless ``kept``."""
        hosts, views = [], []
        inputs = {spec.index for spec in plan.host_tensors if spec.direction is Direction.IN}
        for i, (a, off) in enumerate(zip(host_arrays, offsets)):
            if a is None:
                hosts.append(None)
                views.append(None)
                continue
            view = memory[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
            view[...] = a
            views.append(view)
            writable = i not in inputs
            hosts.append(HostView(a.shape, dt.from_numpy(a.dtype).name, writable, ONE_SHOT_TOKEN, off,
                                  view.strides))
        heap = SharedHeap(ONE_SHOT_TOKEN, stride, memory, heap_at)
        if kept is None:
            number, plan_id, blob, forget = 0, 0, group.encode_plan((plan, [])), False
        else:
            number, plan_id, blob, forget = kept.prepare(plan)
        command = Command(number, plan_id, plan, [], 0, hosts, heap, dfx, config.resolved_hang_timeout(),
                          blob=blob, forget_plans=forget, scalars=scalars)
        watch = None
        try:
            watch = group.submit(command) if group.pids else group.start(first=command)
            try:
                while not watch.poll(POLL_S):
                    pass
            except BaseException as e:  # Ctrl-C, SIGTERM (the CLI's): stop the ranks, letting them write DFX records
                note_where(e, watch.interrupt(STOP_WRITE_S if dfx is not None else 0.0))
                raise
        finally:
            if kept is None:
                group.close()
            if dfx is not None:
                finish_run(dfx, plan.world, plan.device_ids, error=watch.error if watch is not None else None)
        if watch.error is not None:
            raise watch.error
        for spec in plan.host_tensors:
            if spec.direction is not Direction.IN:
                host_arrays[spec.index][...] = views[spec.index]


# -- one-shot groups kept between calls ------------------------------------------------------

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
    from ..compiler.checks import reachable_functions
    from ..language.functions import Function

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


# -- long-lived ranks (a DistributedWorker's) ------------------------------------------------

FRAME_BYTES = 1 << 20      # one command, pickled; a larger one travels as a shared file
# A frame starts with the payload's length and the dispatch's number; the payload (the rest of the command)
# is then byte-identical when a caller dispatches the same arguments again, and a rank reuses what it decoded.
FRAME_HEAD = 16
RESULT_BYTES = 256 << 10   # one rank's failure report, pickled
ABORT_POLL_S = 0.02        # a rank blocked in a wait notices an abort this often
WAKE_BYTES = 64            # a rank's wake slot (armed, seq, seq sleepers), a cache line of its own
_SEQ_WRAP = 1 << 30        # a wake slot's seq is reset before it comes near INT32's end
STOP_S = 2.0               # ranks that do not stop this long after an abort are killed
FDS_PER_MESSAGE = 200      # below the kernel's SCM_MAX_FD
# Waiting for a command or for the ranks to finish: spin a moment when every process has a core of its
# own (the next command, or the last rank, is often close).  The driver then sleeps on a futex: a waiting
# driver must not take a core from a rank.  An idle rank first polls with sched_yield() for a while
# (which hands the core to any runnable process, the driver included), because a caller dispatching in
# a loop sends the next command within that time and waking a sleeping rank costs tens of µs; then
# it sleeps.
CTL_SPIN_S = 20e-6
IDLE_YIELD_S = 250e-6
OK, CMD_FAILED, ABORTED = 0, 1, 2

_LIVE_GROUPS: weakref.WeakSet = weakref.WeakSet()


def _close_group_fds(keep: int) -> None:
    """In a freshly forked rank: close the driver ends of every live group's sockets, and every rank's death
    record file but ``keep`` (its own)."""
    for group in list(_LIVE_GROUPS):
        for s in group.socks:
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        for fd in group.fault_fds:
            if fd != keep:
                try:
                    os.close(fd)
                except OSError:
                    pass


class GroupLayout:
    """Byte offsets of a rank group's control mapping (every region 64-byte aligned)."""

    def __init__(self, world: int):
        self.world = world
        self.sleepers = 0          # waiters on window signal cells (ShmMemory)
        # Waiters on the words below, counted per side: a notifier makes the wake-up system call only when
        # the side it notifies sleeps (a rank's report must not pay for an idle rank's sleep, nor a
        # doorbell ring for the driver's).
        self.rank_sleepers = 64    # idle ranks, on the doorbell
        self.driver_sleepers = 128  # the driver, on finished and started
        self.doorbell = 192        # commands published
        self.finished = 256        # rank completions, over all commands
        self.started = 320         # ranks that came up
        self.abort = 384           # commands with an index below this are aborted
        self.zero = 448            # always 0: a sleepers word for atomics that must wake no one
        self.locks = 512
        self.up = _align(self.locks + 4 * world)
        self.done = _align(self.up + 4 * world)      # per rank: index + 1 of its last finished command
        self.result = _align(self.done + 4 * world)  # per rank: OK, CMD_FAILED or ABORTED
        self.wakes = _align(self.result + 4 * world)  # per rank: its wake slot (ShmMemory.wait_any)
        self.status = _align(self.wakes + WAKE_BYTES * world)
        self.frame = _align(self.status + StatusBoard.nbytes(world))
        self.results = _align(self.frame + FRAME_HEAD + FRAME_BYTES)
        self.total = self.results + RESULT_BYTES * world


class _GroupMemory(ShmMemory):
    """ShmMemory for a group's ranks: a wait also ends when the driver aborts the command."""

    def __init__(self, *args, abort_addr: int, state: _RankState, **kwargs):
        super().__init__(*args, **kwargs)
        self.abort_addr = abort_addr
        self.state = state

    _slice_s = ABORT_POLL_S

    def _between_slices(self) -> None:
        if _atomics.load(self.abort_addr) > self.state.command:
            self.state.stopping = True  # the abort signal, arriving now, must not stop the stop
            raise RankStopped()

    def cell_wait(self, buffer_id, offset, ge, expected, timeout_s):
        addr = self._at[buffer_id][self.rank] + offset
        value = _atomics.load(addr)
        if value >= expected if ge else value == expected:  # already there: no clock to read, no wait to set up
            return True, value
        end = time.monotonic() + timeout_s
        spin, yld = self.spin_s, self.yield_s
        while True:
            left = end - time.monotonic()
            ok, value = _atomics.wait(addr, self.sleepers_addr, int(ge), expected, spin, yld,
                                      max(min(ABORT_POLL_S, left), 0.0))
            if ok:
                return ok, value
            if _atomics.load(self.abort_addr) > self.state.command:
                self.state.stopping = True  # the abort signal, arriving now, must not stop the stop
                raise RankStopped()
            if left <= ABORT_POLL_S:
                return ok, value
            spin = yld = 0.0


class PlanPickler(pickle.Pickler):
    """Pickles plans for ranks forked earlier: program functions travel as references into ``objects``.

    A rank is a fork of the driver made when the worker started, so every function of the
    worker's programs (closures of program factories included) exists in it at the same id.
    """

    def __init__(self, file, objects: dict, strict: bool = False):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.objects = objects
        self.strict = strict  # refuse a Function the ranks lack (instead of pickling it by value)

    def persistent_id(self, obj):
        from ..language.functions import Function

        if obj is not None and self.objects.get(id(obj)) is obj and not isinstance(obj, Function):
            return ("object", id(obj), 0)  # e.g. a one-shot call's whole plan, made before its ranks forked
        if isinstance(obj, Function):
            known = self.objects.get(id(obj.fn))
            bound = obj.bound_self
            if getattr(known, "fn", None) is obj.fn and (bound is None or self.objects.get(id(bound)) is bound):
                return ("function", id(obj.fn), id(bound) if bound is not None else 0)
            if self.strict and reduce_region(obj.fn) is None:  # a region's chip task travels by value
                raise _NotInRanks(obj.name)
        return None

    def reducer_override(self, obj):
        # a `with pl.at(level=CHIP)` block the host outlined while planning: made after the ranks forked
        return reduce_region(obj) or NotImplemented


class _NotInRanks(Exception):
    """A plan refers to a function the group's ranks were forked without."""


class _PlanUnpickler(pickle.Unpickler):
    def __init__(self, file, objects: dict, cache: dict):
        super().__init__(file)
        self.objects = objects
        self.cache = cache

    def persistent_load(self, pid):
        from ..language.functions import Function

        kind, fn_id, self_id = pid
        if kind == "object":
            return self.objects[fn_id]
        f = self.cache.get((fn_id, self_id))
        if f is None:
            base = self.objects[fn_id]
            bound = self.objects[self_id] if self_id else None
            f = self.cache[(fn_id, self_id)] = Function(base.fn, base.kind, bound, base.options, base.scope)
        return f


class CommandWatch:
    """The driver's watch over one command: how it ended (``error``), and whether the group broke.

    ``poll(timeout)`` returns True once every rank has finished the command (or the group had
    to be killed); then ``error`` is the RankError or HangError to raise (None when all went
    well) and ``broken`` says why the group can run nothing more (None while it can).
    """

    def __init__(self, group: RankGroup, index: int, plan: DispatchPlan, heap: WindowHeap | None,
                 hang_timeout: float):
        self.group = group
        self.index = index
        self.plan = plan
        self.target = group.world * (index + 1)
        self.heap = heap
        self.hang_timeout = hang_timeout
        self.monitor: _Monitor | None = None  # made at the first check: most commands end before one
        self.failures: dict[int, RankFailure] = {}
        self.first_failure: float | None = None
        self.aborted_at: float | None = None
        self.hang: HangError | None = None
        self.last_check = time.monotonic()
        self.error: BaseException | None = None
        self.broken: str | None = None
        self.over = False

    def poll(self, timeout: float) -> bool:
        """Watch for at most ``timeout`` seconds; return True when the command is over."""
        group = self.group
        finished = group.finished_addr
        end = time.monotonic() + timeout
        while not self.over:
            n = _atomics.load(finished)
            if n >= self.target:
                self._finish()
                break
            left = end - time.monotonic()
            ok, _ = _atomics.wait(finished, group.driver_sleepers, 1, self.target, group.ctl_spin_s, 0.0,
                                  max(min(POLL_S, left), 0.0))
            if ok:
                continue
            now = time.monotonic()
            if now - self.last_check >= POLL_S:  # a zero-timeout poll (RunHandle.done) checks no more often
                self.last_check = now
                self._check()
            if self.over or time.monotonic() >= end:
                break
        return self.over

    def interrupt(self, wait_s: float) -> list[dict] | None:
        """The driver was interrupted (Ctrl-C, SIGTERM): stop the ranks and give them ``wait_s`` to stop.

        A stopped rank with an event log writes what it recorded (its pending wait included) before it
        reports; the caller kills what is left.  Returns where each rank was (as a hang report says it).
        """
        if self.over:
            return None
        done = self._done()
        where = None
        try:
            where = self._watcher().hang(False, 0.0, done).ranks
        except Exception:  # noqa: BLE001 - a report that cannot be read must not keep the ranks running
            pass
        finally:  # (a second Ctrl-C while busy ranks are asked for their line: they stop all the same)
            self._abort(done)
        end = time.monotonic() + wait_s
        group = self.group
        while time.monotonic() < end and _atomics.load(group.addr(group.layout.finished)) < self.target:
            if group.reap():
                break
            _atomics.wait(group.addr(group.layout.finished), group.driver_sleepers, 1, self.target, 0.0, 0.0,
                          max(min(POLL_S, end - time.monotonic()), 0.0))
        return where

    def _done(self) -> set[int]:
        done = self.group.words("done")
        return {r for r in range(self.group.world) if done[r] == self.index + 1}

    def _check(self) -> None:
        group = self.group
        dead = group.reap()
        if dead:
            for f in dead:
                self.failures.setdefault(f.rank, f)
            self._break(f"rank {dead[0].rank} (device {dead[0].device_id}) died during a dispatch "
                        f"({group.death_notes[dead[0].rank]})")
            return
        now = time.monotonic()
        done = self._done()
        results = group.words("result")
        for r in done:
            if results[r] == CMD_FAILED and r not in self.failures:
                self.failures[r] = group.failure(r)
                self.first_failure = self.first_failure or now
        if self.aborted_at is not None:
            if now - self.aborted_at >= STOP_S:
                stuck = [r for r in range(group.world) if r not in done]
                self._break(f"rank(s) {stuck} did not stop within {STOP_S:g} s after the dispatch was aborted "
                            "and were killed")
            return
        if self.failures:
            if now - self.first_failure >= GRACE_S:
                self._abort(done)
            return
        try:
            self._watcher().check(done)
        except HangError as e:
            self.hang = e
            self._abort(done)

    def _watcher(self) -> _Monitor:
        """The command's hang watch (made at its first use: most commands end before one)."""
        if self.monitor is None:
            group = self.group
            heap = self.heap if self.heap is not None else WindowHeap(group.arena, 0, 0, [], [])
            memory = ShmMemory(group.arena, group.layout, -1, group.world, heap, group.status)
            self.monitor = _Monitor(memory, self.plan, group.pids, self.hang_timeout)
        return self.monitor

    def _abort(self, done: set[int]) -> None:
        group = self.group
        self.aborted_at = time.monotonic()
        # Ranks blocked in a wait see the abort word; ranks busy elsewhere get a signal.
        _atomics.exchange(group.addr(group.layout.abort), group.addr(group.layout.sleepers), self.index + 1)
        for r, pid in group.pids.items():
            if r not in done:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass

    def _finish(self) -> None:
        results = self.group.words("result")
        if any(results.tolist()):  # OK is 0: look rank by rank only when one did not succeed
            for r in range(self.group.world):
                if results[r] == CMD_FAILED and r not in self.failures:
                    self.failures[r] = self.group.failure(r)
        self.over = True
        if self.failures:
            self.error = RankError([self.failures[r] for r in sorted(self.failures)])
        elif self.hang is not None:
            self.error = self.hang

    def _break(self, why: str) -> None:
        self.group.kill()
        self.broken = why
        self.over = True
        if self.failures:
            self.error = RankError([self.failures[r] for r in sorted(self.failures)])
        elif self.hang is not None:
            self.error = self.hang
        else:
            self.error = UsageError(f"the worker's rank processes stopped: {why}. Close the worker and prepare a new "
                                    "one.")


class RankGroup:
    """Rank processes forked once, each serving one command after another (a DistributedWorker's ranks).

    ``objects`` maps ``id()`` to the program functions (and program instances, or a whole plan)
    plans refer to; it must hold them before ``start()`` so the forked ranks have them too.  A
    one-shot call is a group used once: it is started with its command already published, over
    memory the ranks inherit (``inherited``), and closed after it.
    """

    in_process = False  # the ranks are other processes: host tensors reach them as shared files
    finishes_dfx = False  # the worker merges the ranks' DFX files when a dispatch ends

    def __init__(self, device_ids: list[int], objects: dict, startup_timeout_s: float, *,
                 owner: str = "DistributedWorker", inherited: dict | None = None, once: bool = False):
        self.device_ids = list(device_ids)
        self.world = len(device_ids)
        self.objects = objects
        self.startup_timeout_s = startup_timeout_s
        self.inherited = inherited or {}  # token -> memory mapped before the fork, which the ranks inherit
        self.once = once                  # a one-shot call's group: its ranks end after their one command
        self.layout = GroupLayout(self.world)
        resources.ensure_descriptors(owner, 2 * self.world)
        self.oom_kills = resources.oom_kills()
        self.death_notes: dict[int, str] = {}  # rank -> how its process ended, once reaped
        # rank -> the file where its process writes its stack if it dies without reporting (rank.death)
        self.fault_fds = [death.new_file(f"rank{r}") for r in range(self.world)]
        self._mm = mmap.mmap(-1, self.layout.total)
        self.arena = np.frombuffer(self._mm, dtype=np.uint8)
        self.base = self.arena.ctypes.data
        self.rank_sleepers = self.base + self.layout.rank_sleepers
        self.driver_sleepers = self.base + self.layout.driver_sleepers
        self.status = StatusBoard(self.arena[self.layout.status:self.layout.status + StatusBoard.nbytes(self.world)],
                                  self.world)
        self.ctl_spin_s = CTL_SPIN_S if self.world + 1 <= _CPUS else 0.0
        self.pids: dict[int, int] = {}
        self.socks: list[socket.socket | None] = []
        self.sent = 0  # commands published
        self.dead = False
        self._words: dict[str, np.ndarray] = {}
        # The frame's words and payload, made once: publishing a command is on every dispatch's path.
        frame = self.layout.frame
        self.frame_length = ctypes.c_int64.from_address(self.base + frame)
        self.frame_number = ctypes.c_int64.from_address(self.base + frame + 8)
        self.doorbell_addr = self.base + self.layout.doorbell
        self.finished_addr = self.base + self.layout.finished
        self._framed: tuple | None = None  # the command whose payload the frame holds
        _LIVE_GROUPS.add(self)

    def addr(self, offset: int) -> int:
        return self.base + offset

    def words(self, name: str) -> np.ndarray:
        w = self._words.get(name)
        if w is None:
            off = getattr(self.layout, name)
            w = self._words[name] = self.arena[off:off + 4 * self.world].view(np.int32)
        return w

    # -- start and stop -------------------------------------------------------------------
    def start(self, first: Command | None = None) -> CommandWatch | None:
        """Fork the ranks.

        Without ``first``, wait until every rank is up (RankError if one dies or is late).  With it,
        publish ``first`` before the fork (a one-shot call): the ranks run it as soon as they are set
        up, and its watch is returned.
        """
        parent = os.getpid()
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(self.world)]
        self.socks = [a for a, _ in pairs]
        watch = self.submit(first) if first is not None else None
        sys.stdout.flush()
        sys.stderr.flush()

        def fork_all() -> None:
            for r in range(self.world):
                pid = os.fork()
                if pid == 0:
                    own = pairs[r][1]
                    for _, b in pairs:
                        if b is not own:
                            b.close()
                    _close_group_fds(self.fault_fds[r])
                    _serve(self, r, own, parent)
                self.pids[r] = pid

        try:
            _in_lasting_thread(fork_all)
        finally:
            for _, b in pairs:  # the ranks' ends: each rank keeps its own copy
                b.close()
        if watch is None:
            self._await_start()
        return watch

    def _await_start(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        started = self.addr(self.layout.started)
        while True:
            n = _atomics.load(started)
            if n >= self.world:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ok, _ = _atomics.wait(started, self.driver_sleepers, 1, n + 1, 0.0, 0.0, min(POLL_S, left))
            if ok:
                continue
            dead = self.reap()
            if dead:
                self.kill()
                raise RankError(dead)
        up = self.words("up")
        late = [r for r in range(self.world) if not up[r]]
        self.kill()
        raise RankError([RankFailure(
            r, self.device_ids[r], None, "StartupTimeout",
            f"the rank process did not come up within startup_timeout_s={self.startup_timeout_s:g} s of "
            "prepare(); nothing was dispatched. If starting is legitimately this slow, pass a larger "
            "startup_timeout_s to prepare()", "") for r in late])

    def reap(self) -> list[RankFailure]:
        """Return a failure for every rank process that has exited (and reap it)."""
        if self.pids:
            try:  # one system call (the worker asks before every dispatch): has any child of ours ended?
                if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    return []
            except ChildProcessError:
                pass  # no child at all: the ranks were reaped elsewhere; the loop below says so
        out = []
        for r, pid in list(self.pids.items()):
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got, status = pid, None
            if got == 0 or self.pids.pop(r, None) is None:
                continue
            if self.once and status == 0 and self.words("done")[r] == self.sent:
                continue  # a one-shot call's rank that reported and ended
            why = resources.death_note(status, self.oom_kills) if status is not None else "ended (reaped elsewhere)"
            self.death_notes[r] = why
            task = self.status.rows[r]["task"].decode() or None
            record = death.read(self.fault_fds[r]) if self.fault_fds else None
            out.append(rank_died(r, self.device_ids[r], task, why, record,
                                 last_activity(self.status, r, named=record is not None)))
        return out

    def kill(self) -> None:
        """Kill and reap every rank; close the sockets.  Safe to call again."""
        _kill_and_reap(self.pids)
        for s in self.socks:
            if s is not None:
                s.close()
        self.socks = [None] * len(self.socks)
        for fd in self.fault_fds:
            os.close(fd)
        self.fault_fds = []
        self.dead = True
        _LIVE_GROUPS.discard(self)

    def close(self) -> None:
        """Stop the ranks and release the control mapping."""
        self.kill()
        self._words = {}
        arena, self.arena = self.arena, None
        del arena
        try:
            self._mm.close()
        except BufferError:
            pass  # a status view is still referenced; the GC unmaps it

    # -- commands -------------------------------------------------------------------------
    def encode_plan(self, payload) -> bytes:
        """Pickle a plan (and what goes with it) for the ranks."""
        buf = io.BytesIO()
        PlanPickler(buf, self.objects).dump(payload)
        return buf.getvalue()

    def submit(self, command: Command) -> CommandWatch:
        """Publish ``command`` to the ranks; return its watch.  The previous command must have finished."""
        heap, heap_ref = None, None
        if command.heap is not None:
            h = command.heap
            heap_ref = (h.token, h.stride, h.base)
            heap = WindowHeap.for_plan(h.data, h.base, h.stride, command.plan)
        wire = (command.plan_id, command.blob, command.segment,
                [None if v is None else v.key for v in command.hosts], heap_ref,
                [(m.token, m.size) for m in command.maps], command.drops, command.dfx, command.forget_plans,
                pickle.dumps(command.scalars) if command.scalars else b"")
        # Everything but the doorbell first: a woken rank should find the driver asleep, not busy.
        watch = CommandWatch(self, self.sent, command.plan, heap, command.hang_timeout)
        self.send(command.number, wire, command.fds)
        return watch

    def send(self, number: int, command: tuple, fds: list[int]) -> int:
        """Publish ``command`` (a ``_Wire``'s fields) of dispatch ``number`` to every rank, with ``fds``.

        ``fds`` are the files named in the command's ``maps``.  Returns the command's index.  The
        previous command must have finished.
        """
        index = self.sent
        if fds or command != self._framed:  # the same command again: the frame holds its payload already
            self._frame(command, fds)
        self.frame_number.value = number
        self.sent += 1
        _atomics.fetch_add(self.doorbell_addr, self.rank_sleepers, 1)
        return index

    def _frame(self, command: tuple, fds: list[int]) -> None:
        """Write ``command``'s payload into the frame (or, when too large, into a file sent to every rank), and
        send ``fds``."""
        payload = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
        blob = None
        self._framed = None
        if len(payload) > FRAME_BYTES:
            blob = _SharedBytes(payload)
            length = -len(payload)
        else:
            length = len(payload)
            start = self.layout.frame + FRAME_HEAD
            self._mm[start:start + length] = payload
        if blob is not None or fds:
            try:
                for s in self.socks:
                    if blob is not None:
                        socket.send_fds(s, [b"b"], [blob.fd])
                    for i in range(0, len(fds), FDS_PER_MESSAGE):
                        socket.send_fds(s, [b"m"], fds[i:i + FDS_PER_MESSAGE])
            finally:
                if blob is not None:
                    blob.close()
        self.frame_length.value = length
        if blob is None and not fds:
            self._framed = command

    def failure(self, rank: int) -> RankFailure:
        off = self.layout.results + rank * RESULT_BYTES
        n = int(ctypes.c_int64.from_address(self.base + off).value)
        return pickle.loads(bytes(self.arena[off + 8:off + 8 + n]))


_forker_lock = threading.Lock()
_forker_requests: queue.SimpleQueue = queue.SimpleQueue()
_forker: threading.Thread | None = None


def _in_lasting_thread(fn) -> None:
    """Run ``fn`` (which forks long-lived ranks) in a thread that lasts as long as this process.

    A rank asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), and to the kernel
    the parent is the *thread* that forked it: ranks forked by a thread that ends (a worker
    prepared in a short-lived thread) would die with that thread.  The main thread lasts as long
    as the process; any other caller hands the fork to one daemon thread kept for the purpose.
    """
    global _forker
    if threading.current_thread() is threading.main_thread():
        fn()
        return
    with _forker_lock:
        if _forker is None or not _forker.is_alive():
            _forker = threading.Thread(target=_serve_forks, name="ptodist-forker", daemon=True)
            _forker.start()
    done = threading.Event()
    box: list = []
    _forker_requests.put((fn, box, done))
    done.wait()
    if box:
        raise box[0]


def _serve_forks() -> None:
    while True:
        fn, box, done = _forker_requests.get()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the thread that asked
            box.append(e)
        finally:
            del fn
            done.set()


class _SharedBytes:
    """Bytes in a shared file (a command too large for the frame)."""

    def __init__(self, data: bytes):
        self.fd = os.memfd_create("ptodist-command", os.MFD_CLOEXEC)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def close(self) -> None:
        os.close(self.fd)


# -- the rank side of a group ---------------------------------------------------------------

class _RankState:
    """What a serving rank keeps between commands."""

    def __init__(self, group: RankGroup, rank: int, sock: socket.socket):
        self.group = group
        self.rank = rank
        self.sock = sock
        self.layout = group.layout
        self.maps: dict[int, tuple[mmap.mmap | None, np.ndarray]] = {t: (None, m) for t, m in group.inherited.items()}
        self.plans: dict[int, tuple] = {}
        self.functions: dict = {}
        self.command = -1
        self.running = False
        self.stopping = False  # a RankStopped was raised in this command (by the abort signal or a wait)
        self.dispatch = None  # (dispatch id, ctx, log, dfx) of the dispatch whose segments are running
        self.memories: dict = {}  # (plan id, heap) -> _GroupMemory, reused by later dispatches
        self.views: dict = {}     # host tensor descriptor -> its array, while its memory is mapped
        self.unmapping: list = []  # dropped mappings a view still held when they were dropped
        self.result = group.words("result")
        self.done = group.words("done")
        self.finished = group.addr(group.layout.finished)
        self.no_sleepers = group.addr(group.layout.zero)
        # The last command whose payload needed nothing mapped, dropped or decoded anew, with what
        # running it made (its memory and host views): the same payload again reuses them.
        self.last_payload: bytes | None = None
        self.last_command: _Wire | None = None
        self.last_bound: tuple | None = None  # (memory, hosts) of last_command
        self.next_ctx: RankContext | None = None  # a fresh context for last_command, made while idle
        self.checked_args: dict = {}  # kernel argument signatures that passed their checks (RankContext)


def _serve(group: RankGroup, rank: int, sock: socket.socket, parent: int) -> None:
    """Body of a long-lived rank: serve commands until killed; never returns."""
    try:
        _enter_rank(rank, group.world, group.device_ids[rank])
        _atomics.die_with_parent()
        if os.getppid() != parent:
            death.quiet_exit(1)
        death.arm(group.fault_fds[rank])  # os._exit and native crashes leave the rank's stack for the driver
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
        state = _RankState(group, rank, sock)

        def on_abort(signum, frame):
            # At most once a command: a second RankStopped would cut short the unwinding of the first
            # (the records a stopped rank closes on its way out).
            if state.running and not state.stopping and _atomics.load(group.addr(group.layout.abort)) > state.command:
                state.stopping = True
                raise RankStopped()

        signal.signal(signal.SIGUSR1, on_abort)
        install_line_sampler(group.status, rank)
        resources.one_blas_thread()
        _rank_started(rank)
        group.words("up")[rank] = 1
        _atomics.fetch_add(group.addr(group.layout.started), group.driver_sleepers, 1)
        doorbell = group.addr(group.layout.doorbell)
        while True:
            c = state.command + 1
            while not _atomics.wait(doorbell, group.rank_sleepers, 1, c + 1, group.ctl_spin_s, IDLE_YIELD_S, 1.0)[0]:
                if os.getppid() != parent:
                    death.quiet_exit(1)
            state.command = c
            number, command = _read_command(state)
            code, failure = _run_command(state, number, command)
            _report(state, code, failure)
            if group.once:  # a one-shot call's rank: nothing more will come; free the core at once
                death.quiet_exit(0)
            _prepare_next(state)
    except BaseException:  # noqa: BLE001 - a rank that cannot serve dies; the driver reports it
        death.quiet_exit(70)


def _rank_started(rank: int) -> None:
    """Called in a rank once it is set up, before it reports that it is up."""


class _Wire(NamedTuple):
    """A command as it travels to the ranks, pickled into the group's frame (as a plain tuple: cheaper).

    The dispatch's number (which its segments share) travels in the frame's head, beside the payload.
    """

    plan_id: int
    blob: bytes | None         # the plan, pickled by reference, the first time the ranks see it
    segment: int
    hosts: list                # HostView.key (token, offset, shape, strides, dtype, writable) or None
    heap: tuple | None         # (token, stride, base) of the window arena
    maps: list                 # (token, size) of the files whose descriptors follow on the socket
    drops: list                # tokens of memory to unmap
    dfx: object
    forget_plans: bool
    scalars: bytes             # the dispatch's scalar arguments, pickled: the frame is sent again when their bits
    #                            differ (-0.0 == 0.0, but not as bytes)


def _read_command(state: _RankState) -> tuple[int, _Wire]:
    """The published command: its dispatch's number and the command, with its memory mapped and drops done."""
    group = state.group
    length = group.frame_length.value
    number = group.frame_number.value
    if length < 0:
        _, fds, _, _ = socket.recv_fds(state.sock, 16, 1)
        with mmap.mmap(fds[0], -length, prot=mmap.PROT_READ) as m:
            payload = m[:]
        os.close(fds[0])
    else:
        start = state.layout.frame + FRAME_HEAD
        payload = group._mm[start:start + length]
    if payload == state.last_payload:  # the same command as the last one: nothing new to map or to drop
        if state.unmapping:
            _unmap(state, [])
        return number, state.last_command
    command = _Wire(*pickle.loads(payload))
    last = state.last_command
    if last is not None and command[:-1] == last[:-1]:
        # The last command with other scalar arguments (a step counter): its memory and prepared context serve.
        if state.unmapping:
            _unmap(state, [])
        state.last_payload, state.last_command = payload, command
        return number, command
    state.last_payload = state.last_command = state.last_bound = state.next_ctx = None
    maps = command.maps
    fds: list[int] = []
    while len(fds) < len(maps):
        _, got, _, _ = socket.recv_fds(state.sock, 16, FDS_PER_MESSAGE)
        fds.extend(got)
    for (token, size), fd in zip(maps, fds):
        m = mmap.mmap(fd, size)
        os.close(fd)  # the mapping keeps the file alive
        state.maps[token] = (m, np.frombuffer(m, dtype=np.uint8))
    drops = command.drops
    if drops:  # memories over a dropped heap, and views of dropped memory, go too
        state.memories = {k: v for k, v in state.memories.items() if k[1] is None or k[1][0] not in drops}
        state.views = {k: v for k, v in state.views.items() if k[0] not in drops}
    gone = []
    for token in drops:
        entry = state.maps.pop(token, None)
        if entry is not None:
            gone.append(entry[0])
            del entry
    if gone or state.unmapping:
        _unmap(state, gone)
    if command.forget_plans:
        state.plans.clear()
        state.memories.clear()
    if not (maps or drops or command.forget_plans or command.blob is not None):
        state.last_payload, state.last_command = payload, command
    return number, command


def _unmap(state: _RankState, mappings: list) -> None:
    """Unmap dropped memory now, or, while a view still holds it, at a later command.

    Views are freed by reference counting as soon as the dispatch that used them is over (a rank
    context holds no reference cycle); a full garbage collection here would cost a torch-sized
    process hundreds of milliseconds per dispatch.
    """
    left = []
    for m in [*state.unmapping, *mappings]:
        try:
            m.close()
        except BufferError:
            left.append(m)
    state.unmapping = left


def _host_view(state: _RankState, desc) -> np.ndarray:
    token, offset, shape, strides, dtype_name, writable = desc
    dtype = dt.from_name(dtype_name).np_dtype
    if token < 0:  # an empty tensor: nothing was mapped
        a = np.zeros(shape, dtype=dtype)
    else:
        a = np.ndarray(shape, dtype=dtype, buffer=state.maps[token][1], offset=offset, strides=strides)
    if not writable:
        a.flags.writeable = False
    return a


def _run_command(state: _RankState, number: int, command: _Wire) -> tuple[int, RankFailure | None]:
    group, rank = state.group, state.rank
    plan_id = command.plan_id
    if command.blob is not None:
        plan, boundaries = _PlanUnpickler(io.BytesIO(command.blob), group.objects, state.functions).load()
        state.plans[plan_id] = (plan, split_segments(plan, boundaries))
    plan, segments = state.plans[plan_id]
    segment = command.segment
    status = group.status
    if segment == 0:
        state.dispatch = None
        status.clear_history(rank)
        ctx, state.next_ctx = state.next_ctx, None
        if command is state.last_command and state.last_bound is not None:
            memory, hosts = state.last_bound
        else:
            memory, hosts = _bind(state, plan, command)
            ctx = None
            if command is state.last_command:
                state.last_bound = (memory, hosts)
        dfx = command.dfx
        log = None
        if dfx is not None:
            log = EventLog(rank, plan.device_ids[rank], dfx.dispatch, dump_args=dfx.dump_args)
            ctx = None
        if ctx is None:
            ctx = RankContext(plan, rank, memory, hosts, events=log, checked_args=state.checked_args)
        ctx.scalars = pickle.loads(command.scalars) if command.scalars else ()
        state.dispatch = (number, ctx, log, dfx)
    dispatch_id, ctx, log, dfx = state.dispatch
    if dispatch_id != number:
        raise PtodistInternalError("a later segment arrived for a dispatch this rank did not start")
    ctx.plan = segments[segment]
    status.set_running(rank, "")
    last = segment == len(segments) - 1
    state.running, state.stopping = True, False
    try:
        outcome = run_rank(ctx, log, dfx, last=last, dedicated=True)  # a rank process runs nothing else
    finally:
        state.running = False
    code = ABORTED if outcome.stopped else CMD_FAILED if outcome.failure is not None else OK
    if last or code != OK:
        state.dispatch = None
    return code, outcome.failure


def _prepare_next(state: _RankState) -> None:
    """While idle: make the context that the same command, sent again, will run in.

    A caller dispatching in a loop sends the same command again; a context is cheap state with
    no side effect when made, so making it here takes its cost off the next dispatch's path.
    """
    command = state.last_command
    if command is None or state.last_bound is None or command.segment != 0 or command.dfx is not None:
        return
    try:
        memory, hosts = state.last_bound
        state.next_ctx = RankContext(state.plans[command.plan_id][0], state.rank, memory, hosts,
                                     checked_args=state.checked_args)
    except Exception:  # noqa: BLE001 - the command makes its context itself, as any other
        state.next_ctx = None


def _bind(state: _RankState, plan: DispatchPlan, command: _Wire) -> tuple[_GroupMemory, list]:
    """The memory (window heap) and the host tensor views of ``command``'s dispatch."""
    group, rank = state.group, state.rank
    key = (command.plan_id, command.heap)
    memory = state.memories.get(key)
    if memory is None:
        if command.heap is not None:
            token, stride, base = command.heap
            heap = WindowHeap.for_plan(state.maps[token][1], base, stride, plan)
        else:
            heap = WindowHeap(group.arena, 0, 0, [], [])
        memory = state.memories[key] = _GroupMemory(
            group.arena, state.layout, rank, group.world, heap, group.status,
            abort_addr=group.addr(group.layout.abort), state=state)
    hosts = []
    for d in command.hosts:
        if d is None:
            hosts.append(None)
            continue
        view = state.views.get(d)
        if view is None:
            view = state.views[d] = _host_view(state, d)
            if len(state.views) > 4096:  # descriptors of long-gone tensors: start afresh
                state.views = {d: view}
        hosts.append(view)
    return memory, hosts


def _report(state: _RankState, code: int, failure: RankFailure | None) -> None:
    group, rank = state.group, state.rank
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stdout must not stop the rank
        pass
    if failure is not None:
        payload = pickle.dumps(failure)
        if len(payload) > RESULT_BYTES - 8:
            failure.exception = None
            failure.traceback = failure.traceback[-(RESULT_BYTES // 4):]
            failure.message = failure.message[:RESULT_BYTES // 4]
            payload = pickle.dumps(failure)
        off = state.layout.results + rank * RESULT_BYTES
        group.arena[off + 8:off + 8 + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        ctypes.c_int64.from_address(group.base + off).value = len(payload)
    state.result[rank] = code
    state.done[rank] = state.command + 1
    group.status.finish(rank, DONE if code == OK else FAILED)
    # Only the last rank wakes the driver; a failure is seen at the driver's next periodic check.
    old = _atomics.fetch_add(state.finished, state.no_sleepers, 1)
    if old + 1 >= group.world * (state.command + 1):
        _atomics.fetch_add(state.finished, group.driver_sleepers, 0)


# -- a rank's environment and output (imported here, before the ranks fork) --------------------

from ..rank_output import enter_rank as _enter_rank  # noqa: E402 - RANK, WORLD_SIZE, ...; [rank r] lines
