"""Allreduce (mesh, direct, ring) and reduce_scatter."""

from __future__ import annotations

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld

from ..language.distributed.types import NotifyOp, ReduceOp, WaitCmp
from . import common
from .spec import flat_regions, ring_segments


def mesh(target, signal, op: ReduceOp, me: int, n: int) -> None:
    """The tutorial's mesh: one barrier, every rank reads every peer; a second before anyone overwrites."""
    common.enter(signal, me, n)
    acc = common.reduce_from_all(target, common.whole(target), op, n)
    common.leave(signal, me, n)
    pl.store(acc, [0] * len(target.shape), target)


def direct(target, signal, op: ReduceOp, me: int, n: int, core_num: int = 1, cache: dict | None = None) -> None:
    """Reduce-scatter + allgather over directly addressable windows: rank r reduces 1/P of the data.

    Every byte of every window is read once (by the rank that owns its chunk) and the
    reduced chunk is written once into each rank: the fastest schedule where ranks can
    address each other's memory.  A Sum accumulates in place (``get`` with atomic add into
    my own chunk), so no temporaries are made.  Only the owner reduces a chunk, so every
    rank ends with the same bits.  ``core_num`` lanes each take a slice, with their own
    signal column.
    """
    key = ("direct", me, n, core_num)
    lanes = cache.get(key) if cache is not None else None
    if lanes is None:
        lanes = _direct_lanes(list(target.shape), me, n, core_num)
        if cache is not None:
            cache[key] = lanes
    for lane, offsets, ext in lanes:
        common.enter(signal, me, n, lane)
        if ext is not None:
            if op is ReduceOp.Sum:
                common.accumulate_peers(target, offsets, ext, me, n)
            else:
                pl.store(common.reduce_from_all(target, (offsets, ext), op, n), offsets, target)
            for i in range(1, n):  # my reduced chunk to every peer
                pld.tensor.put(target, (me + i) % n, target, offsets, offsets, ext)
        common.leave(signal, me, n, lane)


def _direct_lanes(shape: list[int], me: int, n: int, core_num: int) -> list[tuple[int, list[int], list[int] | None]]:
    """Per lane: ``(lane, offsets, extents)`` of the chunk rank ``me`` reduces (extents None: empty chunk)."""
    axis = common.longest_axis(shape)
    out = []
    for lane, lane_region in enumerate(common.split(shape, core_num, axis)):
        offsets, ext = common.split(lane_region[1], n, axis)[me]
        offsets = [a + b for a, b in zip(offsets, lane_region[0])]
        out.append((lane, offsets, ext if ext[axis] else None))
    return out


def ring(target, signal, op: ReduceOp, me: int, n: int) -> None:
    """Ring allreduce: reduce-scatter then allgather in 2(P-1) rounds, one signal row per round.

    The target is one flat row-major stream cut into P balanced segments (``spec.ring_segments``:
    any length, 32-byte aligned for 2-byte dtypes, empty segments allowed); a segment is moved as the
    few boxes that cover it (``spec.flat_regions``).  Round protocol (pull): tell the right neighbour
    my segment is ready (cell [row, me] on its signal), wait for the left's ready, read its segment,
    combine (reduce phase) or copy (gather phase) into mine, acknowledge to the left, and wait for the
    right's acknowledgement before the next round may change my segments.  Every rank signals in every
    round, even for an empty segment, so the rounds stay matched.  With P=2 the ready and the
    acknowledgement share a cell; tokens from one sender arrive in order, so the counts still tell them
    apart.  A signal with one more row (the host layout ``[2*(NR-1)+1, NR]``) ends with a barrier on
    that row before any rank returns.
    """
    shape = list(target.shape)
    size = int(np.prod(shape)) if shape else 1
    segments = [flat_regions(shape, lo, hi) for lo, hi in ring_segments(size, n, np.dtype(target.dtype.np_dtype).itemsize)]
    left, right = (me - 1 + n) % n, (me + 1) % n
    combine = common.REDUCE[op]
    rounds = 2 * (n - 1)
    for row in range(rounds):
        reducing = row < n - 1
        k = row if reducing else row - (n - 1)
        recv = (me - k - 1) % n if reducing else (me - k) % n
        pld.system.notify(signal, right, [row, me], 1, op=NotifyOp.AtomicAdd)
        pld.system.wait(signal, [row, left], 1, cmp=WaitCmp.Ge)
        pld.system.notify(signal, me, [row, left], -1, op=NotifyOp.AtomicAdd)
        for offsets, ext in segments[recv]:
            got = pld.tile.remote_load(target, left, offsets, ext)
            if reducing:
                got = combine(got, pl.load(target, offsets, ext))
            pl.store(got, offsets, target)
        pld.system.notify(signal, left, [row, me], 1, op=NotifyOp.AtomicAdd)
        pld.system.wait(signal, [row, right], 1, cmp=WaitCmp.Ge)
        pld.system.notify(signal, me, [row, right], -1, op=NotifyOp.AtomicAdd)
    if signal.shape[0] > rounds:  # the return barrier's row
        common.row_barrier(signal, rounds, me, n)


def reduce_scatter(target, signal, op: ReduceOp, me: int, n: int) -> None:
    """Rank r ends with the reduction of every rank's chunk r (row block r) in its own row block r."""
    rows = target.shape[0] // n
    offsets = [me * rows] + [0] * (len(target.shape) - 1)
    ext = [rows, *target.shape[1:]]
    common.enter(signal, me, n)
    # Only this rank touches row block `me` of its own window, so it can accumulate in place (Sum only).
    common.accumulate_peers(target, offsets, ext, me, n)
    common.leave(signal, me, n)
