"""Building blocks of every collective, written with the primitives users have.

Barriers count tokens.  A collective brackets its data movement with ``enter``
(every rank has arrived: the targets may be overwritten) and ``leave`` (every
rank's data movement is done); ``barrier`` stands alone.  Two protocols, chosen
by the group size alone, so every collective of one group speaks the same one:

* ``n == 2``, *mesh*: rank r adds a token to cell ``[r, lane]`` of every peer's
  signal and waits for each peer's token in its own.  One hop.
* ``n >= 3``, *central*: every other rank adds a token to cell ``[0, lane]`` of
  group rank 0, which waits for all of them, then adds a release token to cell
  ``[0, lane]`` of each (rank 0 sends itself nothing, so its own cell is free to
  count arrivals).  Two hops but O(1) operations per rank instead of O(n): on
  more ranks than cores every operation of every rank competes for the CPU.

Tokens are consumed (``AtomicAdd`` of minus the count, on the rank's own cell)
only by the barrier that closes a collective: ``leave`` waits for the second
token and removes both, so a pair costs one consume per cell, not two.  A token
of the next collective can only arrive after the sender saw this rank's last
token, i.e. after the wait it answers; counts only grow until the consume, which
removes exactly what was waited for.  Any sequence of collectives on one signal
is therefore correct and a finished collective leaves every cell at zero:
collective signals are self-clearing.  (At ``n >= 3`` a rank other than 0 is
released only by rank 0, and rank 0 consumes the arrivals before it releases
anyone, so no arrival of the next barrier can meet an unconsumed one.)
"""

from __future__ import annotations

import ptodist.language as pl
import ptodist.language.distributed as pld

from ..language.distributed.types import AtomicType, NotifyOp, ReduceOp, WaitCmp

REDUCE = {ReduceOp.Sum: pl.add, ReduceOp.Max: pl.maximum, ReduceOp.Min: pl.minimum, ReduceOp.Prod: pl.mul}
_ADD = NotifyOp.AtomicAdd
_GE = WaitCmp.Ge


def cell(signal, sender: int, lane: int = 0) -> list[int]:
    """The cell where ``sender``'s tokens arrive: ``[sender]`` or ``[sender, lane]``."""
    return [sender] if len(signal.shape) == 1 else [sender, lane]


def arrive(signal, me: int, n: int, lane: int = 0) -> None:
    """This rank's half of a barrier: announce that it has arrived (nothing to send for the hub)."""
    if n == 2:
        pld.system.notify(signal, 1 - me, cell(signal, me, lane), 1, op=_ADD)
    elif n > 2 and me != 0:
        pld.system.notify(signal, 0, cell(signal, 0, lane), 1, op=_ADD)


def arrived(signal, me: int, n: int, lane: int = 0, have: int = 1, consume: bool = True) -> None:
    """The other half, after ``arrive``: return once every rank has arrived.  Each cell this rank waits
    on then holds ``have`` tokens per sender (this barrier's and, for ``have=2``, its opening barrier's);
    ``consume`` removes them."""
    if n < 2:
        return
    notify, wait = pld.system.notify, pld.system.wait
    if n == 2:
        mine = cell(signal, 1 - me, lane)
        wait(signal, mine, have, cmp=_GE)
        if consume:
            notify(signal, me, mine, -have, op=_ADD)
        return
    hub = cell(signal, 0, lane)
    if me == 0:
        wait(signal, hub, have * (n - 1), cmp=_GE)
        if consume:  # before any release: the next barrier's arrivals come after it
            notify(signal, 0, hub, -have * (n - 1), op=_ADD)
        for p in range(1, n):
            notify(signal, p, hub, 1, op=_ADD)
    else:
        wait(signal, hub, have, cmp=_GE)
        if consume:
            notify(signal, me, hub, -have, op=_ADD)


def barrier(signal, me: int, n: int, lane: int = 0) -> None:
    """Every rank arrives before any leaves; consumes exactly the tokens it waited for."""
    arrive(signal, me, n, lane)
    arrived(signal, me, n, lane)


def enter(signal, me: int, n: int, lane: int = 0) -> None:
    """The opening barrier of a collective; its tokens stay for ``leave`` to consume."""
    arrive(signal, me, n, lane)
    arrived(signal, me, n, lane, consume=False)


def leave(signal, me: int, n: int, lane: int = 0) -> None:
    """The closing barrier of a collective opened with ``enter``: consumes both barriers' tokens."""
    arrive(signal, me, n, lane)
    arrived(signal, me, n, lane, have=2)


def row_barrier(signal, row: int, me: int, n: int) -> None:
    """A barrier on one row of a ``[rows, NR]`` signal: sender p's tokens arrive in cell ``[row, p]``."""
    for p in range(n):
        if p != me:
            pld.system.notify(signal, p, [row, me], 1, op=_ADD)
    for p in range(n):
        if p != me:
            pld.system.wait(signal, [row, p], 1, cmp=_GE)
            pld.system.notify(signal, me, [row, p], -1, op=_ADD)


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
