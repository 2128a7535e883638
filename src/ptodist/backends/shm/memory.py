"""Shared memory as the ranks see it: where each rank's window buffers lie (``WindowHeap``), and
``ShmMemory``, the shm backend's RankMemory (signal cells, waits, wake slots, accumulate locks).
"""

from __future__ import annotations

import os
import time

import numpy as np

from ... import _atomics
from ...compiler.plan import DispatchPlan
from ...rank.status import StatusBoard

ALIGN = 64
WAKE_BYTES = 64            # a rank's wake slot (armed, seq, seq sleepers), a cache line of its own
_SEQ_WRAP = 1 << 30        # a wake slot's seq is reset before it comes near INT32's end

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

