"""Building blocks of every collective, written with the primitives users have.

The barrier is a counting one: rank r adds a token to cell ``[r, lane]`` of every
peer's signal, then waits for a token from each peer and consumes it
(``AtomicAdd -1`` on its own cell).  Tokens from one sender are counted in
order, so any sequence of barriers on one signal is correct, and a finished
collective leaves every cell at zero: collective signals are self-clearing.
"""

from __future__ import annotations

import ptodist.language as pl
import ptodist.language.distributed as pld

from ..language.distributed.types import AtomicType, NotifyOp, ReduceOp, WaitCmp

REDUCE = {ReduceOp.Sum: pl.add, ReduceOp.Max: pl.maximum, ReduceOp.Min: pl.minimum, ReduceOp.Prod: pl.mul}


def cell(signal, sender: int, lane: int = 0) -> list[int]:
    """The cell where ``sender``'s tokens arrive: ``[sender]`` or ``[sender, lane]``."""
    return [sender] if len(signal.shape) == 1 else [sender, lane]


def barrier(signal, me: int, n: int, lane: int = 0) -> None:
    """Every rank arrives before any leaves; consumes exactly the tokens it waited for."""
    for p in range(n):
        if p != me:
            pld.system.notify(signal, p, cell(signal, me, lane), 1, op=NotifyOp.AtomicAdd)
    for p in range(n):
        if p != me:
            pld.system.wait(signal, cell(signal, p, lane), 1, cmp=WaitCmp.Ge)
            pld.system.notify(signal, me, cell(signal, p, lane), -1, op=NotifyOp.AtomicAdd)


def row_barrier(signal, row: int, me: int, n: int) -> None:
    """A barrier on one row of a ``[rows, NR]`` signal: sender p's tokens arrive in cell ``[row, p]``."""
    for p in range(n):
        if p != me:
            pld.system.notify(signal, p, [row, me], 1, op=NotifyOp.AtomicAdd)
    for p in range(n):
        if p != me:
            pld.system.wait(signal, [row, p], 1, cmp=WaitCmp.Ge)
            pld.system.notify(signal, me, [row, p], -1, op=NotifyOp.AtomicAdd)


def whole(t) -> tuple[list[int], list[int]]:
    """The region covering all of ``t``."""
    return [0] * len(t.shape), list(t.shape)


def split(shape, parts: int, axis: int) -> list[tuple[list[int], list[int]]]:
    """Cut ``shape`` into ``parts`` regions along ``axis`` (sizes differ by at most one; some may be empty)."""
    size = shape[axis]
    out = []
    for i in range(parts):
        lo, hi = size * i // parts, size * (i + 1) // parts
        offsets = [0] * len(shape)
        offsets[axis] = lo
        ext = list(shape)
        ext[axis] = hi - lo
        out.append((offsets, ext))
    return out


def longest_axis(shape) -> int:
    return max(range(len(shape)), key=lambda a: shape[a])


def accumulate_peers(target, offsets, ext, me: int, n: int) -> None:
    """Add every peer's region of ``target`` into mine, in place (``get`` with atomic add)."""
    for p in range(n):
        if p != me:
            pld.tensor.get(target, p, target, offsets, offsets, ext, atomic=AtomicType.Add)


def reduce_from_all(target, region, op: ReduceOp, n: int):
    """Return the reduction over ranks 0..n-1 (in that order on every rank) of ``region`` of ``target``."""
    offsets, ext = region
    combine = REDUCE[op]
    acc = pld.tile.remote_load(target, 0, offsets, ext)
    for p in range(1, n):
        acc = combine(acc, pld.tile.remote_load(target, p, offsets, ext))
    return acc
