"""Shared memory as the ranks see it: where each rank's window buffers lie (``WindowHeap``), and
``ShmMemory``, the shm backend's RankMemory (signal cells, waits, wake slots, accumulate locks).
"""

from __future__ import annotations

import time

import numpy as np

from ... import _atomics
from ...compiler.plan import DispatchPlan
from ...rank.status import StatusBoard
from .. import resources

ALIGN = 64
WAKE_BYTES = 64            # a rank's wake slot (armed, seq, seq sleepers), a cache line of its own
_SEQ_WRAP = 1 << 30        # a wake slot's seq is reset before it comes near INT32's end

_CPUS = len(resources.usable_cpus())  # the CPUs the ranks may run on (they inherit the driver's affinity)
_SPIN_S = 300e-6  # how long a waiting rank spins before it sleeps, when every rank has a core


_STEP_WORDS = 10  # int64 words per step of Ledger.run_steps
_ADD_KINDS = {"<f4": 1, "<f8": 2, "<i4": 3, "<i2": 4, "|i1": 5, "<i8": 6}  # numpy dtype -> run_steps' add kind


class CompiledSteps:
    """A recorded collective as ``Ledger.run_steps`` takes it: ``count`` steps, the views they address (kept so
    that their memory stays mapped), and how its waits wait (the memory's spin, yield and slice)."""

    __slots__ = ("rows", "keep", "addr", "count", "waits")

    def __init__(self, rows: np.ndarray, keep: list, waits: tuple[float, float, float]):
        self.rows, self.keep, self.waits = rows, keep, waits
        self.addr, self.count = rows.ctypes.data, len(rows)

    def run(self, ledger, start: int) -> int:
        """Run the steps from ``start``; return the index of a wait that did not hold within a slice (the
        caller waits for it the primitive's way), or ``count`` once all have run."""
        return ledger.run_steps(self.addr, self.count, start, *self.waits)


def _row_runs(dst: np.ndarray, src: np.ndarray) -> tuple[int, int, int, int] | None:
    """How ``dst[...] = src`` moves as rows of contiguous elements: ``(elements per row, rows, dst row stride,
    src row stride)`` in bytes for the strides; None when it is not that simple (shapes or dtypes differ, more
    than one strided dimension, overlapping memory: numpy would go through a temporary)."""
    if dst.shape != src.shape or dst.dtype != src.dtype or np.may_share_memory(dst, src):
        return None
    if dst.size == 0:
        return 0, 0, 0, 0
    item = dst.itemsize
    dims = [(n, a, b) for n, a, b in zip(dst.shape, dst.strides, src.strides) if n != 1]
    count = 1
    while dims and dims[-1][1] == count * item and dims[-1][2] == count * item:
        count *= dims.pop()[0]
    if not dims:
        return count, 1, 0, 0
    if len(dims) == 1:
        return count, dims[0][0], dims[0][1], dims[0][2]
    return None


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
        # Waiting ranks spin when cores are free; when ranks outnumber cores they yield the core for a while
        # (the notifier may be waiting for it), then sleep.  The spin outlasts a wake-up (30-170 µs on a
        # 2-core VM): with a shorter one, two ranks in step fell into sleeping just before each other's
        # notify, and stayed there, every wait paying a wake-up (a 4 KiB allreduce at 120 µs a call
        # instead of 6, for hundreds of calls; benchmarks/README.md, "The waits' rhythm").
        if world <= _CPUS:
            self.spin_s, self.yield_s = _SPIN_S, 0.0
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

    def _lock_addr(self, rank: int) -> int:
        return self.base + self.layout.locks + 4 * rank

    def locked(self, rank: int) -> _Lock:
        return _Lock(self._lock_addr(rank))

    def compile_steps(self, steps: list) -> CompiledSteps | None:
        """The recorded operations of a collective (``rank/replay.py``) as the native steps
        ``Ledger.run_steps`` runs, or None when one of them has no native form (a region numpy would copy
        through a temporary, a dtype without a native add)."""
        rows = np.zeros((len(steps), _STEP_WORDS), np.int64)
        keep = []  # the views whose memory the steps address
        for i, step in enumerate(steps):
            kind = step[0]
            if kind == "notify":
                _, buffer_id, rank, offset, value, is_set, slot = step
                rows[i] = (1, self._at[buffer_id][rank] + offset, self.sleepers_addr, value, is_set, self._wake[rank],
                           buffer_id, rank, offset, slot)
            elif kind == "wait":
                _, buffer_id, offset, ge, expected = step
                rows[i, :5] = (2, self._at[buffer_id][self.rank] + offset, self.sleepers_addr, int(ge), expected)
            else:  # "copy" (dst, src) or "add" (dst, src, owner: whose accumulate lock, None for none)
                dst, src = step[1], step[2]
                runs = _row_runs(dst, src)
                if runs is None:
                    return None
                count, n, dst_stride, src_stride = runs
                if kind == "copy":
                    rows[i, :7] = (3, dst.ctypes.data, src.ctypes.data, count * dst.itemsize, n, dst_stride, src_stride)
                else:
                    add = _ADD_KINDS.get(dst.dtype.str)
                    if add is None:
                        return None
                    lock = 0 if step[3] is None else self._lock_addr(step[3])
                    rows[i, :9] = (4, dst.ctypes.data, src.ctypes.data, count, n, dst_stride, src_stride, add, lock)
                keep += (dst, src)
        return CompiledSteps(rows, keep, (self.spin_s, self.yield_s, self._slice_s))


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

