"""Collectives that move data without reducing it: broadcast, allgather, all_to_all(_v).

Data moves with ``put`` / ``get`` straight between the windows (or the local tensor) and the
destination slots: no intermediate tile, one copy per byte, and large copies are split so
that every rank copies a share at once.
"""

from __future__ import annotations

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld

from ..errors import KernelValueError
from ..language.distributed.types import NotifyOp, WaitCmp
from ..language.tile_ops import Tile
from . import common
from .spec import counts_array, flat_regions

# Below this many bytes a broadcast's receivers read root's window whole: a split saves less copy
# time than its extra operations cost.
SPLIT_BROADCAST_BYTES = 256 * 1024
_WHOLE = "whole"  # a broadcast receiver's plan below the split size: get root's window whole


def _broadcast_plan(target, root: int, me: int, n: int) -> list[tuple[bool, int, list[int], list[int]]]:
    """The transfers of a split broadcast on rank ``me``: ``(is_put, peer, offsets, extents)``.

    The flat data is cut into n balanced chunks, chunk c for group rank c.  Root puts chunk r into
    receiver r; receiver r gets every other chunk (its own two flat ranges around chunk r, root's
    included) from root.  Each rank copies (n-1)/n of the data, all at once, and only root's window
    is read, so no barrier is needed between the two halves.
    """
    shape = list(target.shape)
    size = int(np.prod(shape)) if shape else 1
    bounds = [size * c // n for c in range(n + 1)]
    if me == root:
        return [(True, p, o, e) for p in range(n) if p != root for o, e in flat_regions(shape, bounds[p], bounds[p + 1])]
    return [(False, root, o, e) for lo, hi in ((0, bounds[me]), (bounds[me + 1], size))
            for o, e in flat_regions(shape, lo, hi)]


def broadcast(target, signal, root: int, me: int, n: int, cache: dict | None = None) -> None:
    """Every rank ends with root's window; the closing barrier keeps root's data until all have read it."""
    key = ("broadcast", root, me, n)
    plan = cache.get(key) if cache is not None else None
    if plan is None:
        nbytes = int(np.prod(target.shape, dtype=np.int64)) * np.dtype(target.dtype.np_dtype).itemsize
        if nbytes >= SPLIT_BROADCAST_BYTES and n > 1:
            plan = _broadcast_plan(target, root, me, n)
        else:
            plan = [] if me == root else _WHOLE
        if cache is not None:
            cache[key] = plan
    common.enter(signal, me, n)
    if plan is _WHOLE:
        pld.tensor.get(target, root, target)
    else:
        for is_put, peer, offsets, ext in plan:
            if is_put:
                pld.tensor.put(target, peer, target, offsets, offsets, ext)
            else:
                pld.tensor.get(target, peer, target, offsets, offsets, ext)
    common.leave(signal, me, n)


def _as_tile(local) -> Tile:
    if isinstance(local, Tile):
        return local
    return pl.load(local, [0] * len(local.shape), list(local.shape))


def _slot_source(local, target, slot: list[int]):
    """``local`` as a tensor of the slot's shape (a view: put reads it in place), or None for the tile path."""
    if isinstance(local, Tile) or getattr(local, "dtype", None) is not target.dtype or not hasattr(local, "array"):
        return None
    if list(local.shape) == slot:
        return local
    try:
        return local.reshaped(slot)
    except (AttributeError, ValueError):  # a view numpy cannot reshape without a copy
        return None


def allgather(local, target, signal, slot: list[int], me: int, n: int, cache: dict | None = None) -> None:
    """Write my data into slot ``me`` of every rank's target (push, straight from ``local``), between two
    barriers."""
    offsets = [me * slot[0]] + [0] * (len(slot) - 1)
    key = ("allgather", me)
    src = cache.get(key) if cache is not None else None
    if src is None:
        src = _slot_source(local, target, slot)
        if src is not None and cache is not None:
            cache[key] = src
    common.enter(signal, me, n)  # every rank has entered: earlier results in the targets are consumed
    if src is None:
        tile = pl.reshape(_as_tile(local), slot)
        for i in range(n):
            pld.tile.remote_store(tile, target, (me + i) % n, offsets)
    else:
        zeros = [0] * len(slot)
        for i in range(n):
            pld.tensor.put(target, (me + i) % n, src, offsets, zeros, slot)
    common.leave(signal, me, n)


def all_to_all(input, target, signal, me: int, n: int) -> None:
    """Row block p of my input goes to row block ``me`` of rank p's target."""
    rows = input.shape[0] // n
    rest = [0] * (len(input.shape) - 1)
    ext = [rows, *input.shape[1:]]
    dst = [me * rows, *rest]
    common.enter(signal, me, n)
    for i in range(n):
        p = (me + i) % n
        pld.tensor.put(target, p, input, dst, [p * rows, *rest], ext)
    common.leave(signal, me, n)


def all_to_all_v(input, target, signal, send_counts, recv_counts, me: int, n: int, where: str) -> None:
    """Like all_to_all, but only the first ``send_counts[p]`` rows of block p travel to rank p.

    The first barrier carries the counts: sender p adds ``1 + 2*count`` (not 1) to its cell on the
    receiver, which waits for it, reads the count back and consumes exactly that.  Only p's next
    token (+1) can arrive before the read, so ``(value - 1) // 2`` is the count either way, and the
    signal is left clear as after any barrier.  A window ``recv_counts`` ([NR, 1] INT32, upstream's
    layout) receives the counts: sender p sets cell ``[p, 0]`` on each receiver.  Any other
    ``recv_counts`` is what this rank expects; a peer that sends another count is an error, raised
    after the exchange completes (so the other ranks finish and the signal is left clear).
    """
    rows = input.shape[0] // n
    rest = [0] * (len(input.shape) - 1)
    w = f"pld.tensor.all_to_all_v at {where}"
    send = counts_array(send_counts, n, rows, "send_counts", w)
    send = send[me] if send.ndim == 2 else send
    publish = _is_window(recv_counts)
    expect = None
    if not publish:
        expect = counts_array(recv_counts, n, rows, "recv_counts", w)
        expect = expect[me] if expect.ndim == 2 else expect
    if publish:
        for p in range(n):
            pld.system.notify(recv_counts, p, _count_cell(recv_counts, me), int(send[p]), op=NotifyOp.Set)
    for p in range(n):
        if p != me:
            pld.system.notify(signal, p, common.cell(signal, me), 1 + 2 * int(send[p]), op=NotifyOp.AtomicAdd)
    got = [0] * n
    got[me] = int(send[me])
    for p in range(n):
        if p != me:
            c = common.cell(signal, p)
            pld.system.wait(signal, c, 1, cmp=WaitCmp.Ge)
            got[p] = (int(pl.read(signal, c)) - 1) // 2
            pld.system.notify(signal, me, c, -(1 + 2 * got[p]), op=NotifyOp.AtomicAdd)
    for p in range(n):
        if send[p]:
            pld.tensor.put(target, p, input, [me * rows, *rest], [p * rows, *rest], [int(send[p]), *input.shape[1:]])
    common.barrier(signal, me, n)  # its first half was the count exchange, consumed there
    if expect is not None:
        wrong = [p for p in range(n) if int(expect[p]) != got[p]]
        if wrong:
            pairs = "; ".join(f"rank {me} expects recv_counts[{p}] = {int(expect[p])} rows from rank {p}, but rank "
                              f"{p} sends send_counts[{me}] = {got[p]}" for p in wrong)
            raise KernelValueError(
                f"{w}: {pairs}. recv_counts on rank q must list, for each sender p, the rows p's send_counts give "
                "q: fix the counts, or pass recv_counts as an INT32 [NR, 1] window to receive the counts the "
                "peers send.")


def _is_window(x) -> bool:
    return hasattr(x, "buffer") and hasattr(x, "peer_array")


def _count_cell(counts, sender: int) -> list[int]:
    return [sender] if len(counts.shape) == 1 else [sender, 0]
