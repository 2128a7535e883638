"""Collectives that move data without reducing it: broadcast, allgather, all_to_all(_v)."""

from __future__ import annotations

import ptodist.language as pl
import ptodist.language.distributed as pld

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
    """Like all_to_all, but only the first ``send_counts[p]`` rows of block p travel to rank p."""
    rows = input.shape[0] // n
    rest = [0] * (len(input.shape) - 1)
    w = f"pld.tensor.all_to_all_v at {where}"
    send = counts_array(send_counts, n, rows, "send_counts", w)
    counts_array(recv_counts, n, rows, "recv_counts", w)
    send = send[me] if send.ndim == 2 else send
    common.barrier(signal, me, n)
    for p in range(n):
        if send[p]:
            pld.tensor.put(target, p, input, [me * rows, *rest], [p * rows, *rest], [int(send[p]), *input.shape[1:]])
    common.barrier(signal, me, n)
