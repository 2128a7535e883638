"""Collectives that move data without reducing it: broadcast, allgather, all_to_all(_v)."""

from __future__ import annotations

import ptodist.language as pl
import ptodist.language.distributed as pld

from ..errors import KernelValueError
from ..language.distributed.types import NotifyOp, WaitCmp
from ..language.tile_ops import Tile
from . import common
from .spec import counts_array


def broadcast(target, signal, root: int, me: int, n: int) -> None:
    """Every rank copies root's window; the second barrier keeps root's data until all have read it."""
    common.barrier(signal, me, n)
    if me != root:
        pld.tensor.get(target, root, target)
    common.barrier(signal, me, n)


def _as_tile(local) -> Tile:
    if isinstance(local, Tile):
        return local
    return pl.load(local, [0] * len(local.shape), list(local.shape))


def allgather(local, target, signal, slot: list[int], me: int, n: int) -> None:
    """Write my data into slot ``me`` of every rank's target (push), between two barriers."""
    tile = pl.reshape(_as_tile(local), slot)
    offsets = [me * slot[0]] + [0] * (len(slot) - 1)
    common.barrier(signal, me, n)  # every rank has entered: earlier results in the targets are consumed
    for p in range(n):
        pld.tile.remote_store(tile, target, p, offsets)
    common.barrier(signal, me, n)


def all_to_all(input, target, signal, me: int, n: int) -> None:
    """Row block p of my input goes to row block ``me`` of rank p's target."""
    rows = input.shape[0] // n
    rest = [0] * (len(input.shape) - 1)
    ext = [rows, *input.shape[1:]]
    common.barrier(signal, me, n)
    for p in range(n):
        pld.tensor.put(target, p, input, [me * rows, *rest], [p * rows, *rest], ext)
    common.barrier(signal, me, n)


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
    common.barrier(signal, me, n)
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
