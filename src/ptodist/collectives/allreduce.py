"""allreduce: every rank ends with the reduction of all ranks' target (mesh, direct, ring)."""

from __future__ import annotations

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld

from .. import context
from ..errors import ProgramError, ProgramTypeError, ProgramValueError
from ..language import dtypes as dt
from ..language.distributed.types import NotifyOp, ReduceOp, WaitCmp
from . import common
from .registry import collective
from .spec import ALLREDUCE_DTYPES, Call, describe, flat_regions, reduce_op, ring_segments, window

MODES = ("mesh", "ring")


def _build(call, args, kwargs, w, host) -> None:
    target, signal = args
    if signal is None and not host:
        raise ProgramError(f"{w}: inside a kernel the signal is required (a [NR, 1] INT32 window for mesh, "
                           "[2*(NR-1), NR] for ring); only the host orchestrator may omit it.")
    call.target, call.signal = window(target, "target", w), signal
    call.op, call.mode, call.core_num = reduce_op(w, kwargs["op"]), kwargs["mode"], kwargs["core_num"]
    if signal is not None:
        window(signal, "signal", w)
    _check_mode(call, w, host)


def _check_mode(call: Call, w: str, host: bool) -> None:
    """Check allreduce's mode and core_num first: the signal's expected shape depends on them."""
    if call.mode not in MODES:
        raise ProgramValueError(f"{w}: mode= must be 'mesh' or 'ring', got {call.mode!r}")
    if not isinstance(call.core_num, int) or isinstance(call.core_num, bool) or call.core_num < 1:
        raise ProgramValueError(f"{w}: core_num= must be an int >= 1, got {call.core_num!r}")
    if call.core_num > 1 and (not host or call.mode != "mesh"):
        raise ProgramValueError(f"{w}: core_num > 1 is available only for the host orchestrator's mesh "
                                "allreduce")


def _options(call, w: str, world: int, host: bool) -> None:
    t = call.target
    if t.dtype not in ALLREDUCE_DTYPES:
        raise ProgramTypeError(f"{w}: allreduce supports {', '.join(d.name for d in ALLREDUCE_DTYPES)}; "
                               f"{describe(t)} is {t.dtype.name}")
    if call.mode == "ring":
        if world < 2:
            raise ProgramValueError(f"{w}: mode='ring' needs at least 2 ranks, the world has {world}")
        if host and (call.op is not ReduceOp.Sum or t.dtype is not dt.FP32):
            raise ProgramValueError(f"{w}: the host orchestrator's ring allreduce supports op=Sum on FP32 only "
                                    f"(got {call.op.name} on {t.dtype.name}); use mode='mesh'")


def _host_signal(n: int, kwargs: dict) -> tuple[int, int]:
    """The signal the host orchestrator synthesises for a call without one: the ring's, or the mesh's one column
    per lane."""
    lanes = kwargs.get("core_num", 1) if isinstance(kwargs.get("core_num", 1), int) else 1
    return (2 * (n - 1), n) if kwargs.get("mode") == "ring" else (n, max(lanes, 1))


def run(call, me: int, n: int, host: bool) -> None:
    """The host orchestrator's builtin calls take the direct (reduce-scatter/allgather) allreduce, kernels the
    tutorial's mesh."""
    if call.mode == "ring":
        ring(call.target, call.signal, call.op, me, n)
    elif host:
        direct(call.target, call.signal, call.op, me, n, call.core_num, call.cache)
    else:
        mesh(call.target, call.signal, call.op, me, n)


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


@collective(domain=(0, 1), build=_build, options=_options, run=run, modes=MODES, host_signal=_host_signal,
            algorithm=lambda mode: "ring" if mode == "ring" else "direct", fixed_schedule=True)
def allreduce(target, signal=None, *, op=None, mode: str = "mesh", core_num: int = 1):
    """Every rank ends with the reduction (``op``, default Sum) of all ranks' ``target``.

    ``mode="mesh"``: signal ``[NR, 1]`` (or ``[NR]``); with ``core_num`` > 1 (host orchestrator only)
    ``[NR, stride]`` with ``stride >= core_num``, lane b using column b.  ``mode="ring"``: any target
    length (balanced segments, 32-byte aligned for 2-byte dtypes); signal ``[2*(NR-1), NR]``, and from
    the host orchestrator also ``[2*(NR-1)+1, NR]`` (a last row for the return barrier).
    """
    return context.current().collective("allreduce", (target, signal), {"op": op, "mode": mode,
                                                                        "core_num": core_num})
