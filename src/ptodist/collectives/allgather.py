"""allgather: every rank's local data lands in its slot of every rank's target, pushed with ``put``."""

from __future__ import annotations

import ptodist.language as pl
import ptodist.language.distributed as pld

from .. import context
from ..errors import AliasingError, ProgramValueError
from ..language.tile_ops import Tile
from . import common
from .registry import collective
from .spec import Call, describe, is_window, window


def _build(call, args, kwargs, w, host) -> None:
    call.signal, call.target, call.source = window(args[2], "signal", w), window(args[1], "target", w), args[0]


def _options(call, w: str, world: int, host: bool) -> None:
    t, src = call.target, call.source
    if is_window(src) and src.buffer is t.buffer:
        raise AliasingError(f"{w}: local data and target are the same window buffer '{t.buffer.name}'; "
                                "each rank's slot would overwrite another's input. Use separate windows.")
    slot_shape(call, world)  # raises when the target has no slot per rank


def slot_shape(call: Call, world: int) -> list[int]:
    """Return the shape of one rank's slot in allgather's target (``[NR, *local]`` or ``[NR*rows, ...]``)."""
    t, src = call.target, call.source
    local = list(src.shape)
    tshape = list(t.shape)
    if tshape == [world, *local]:
        return [1, *local]
    if len(tshape) == len(local) and tshape[0] == world * local[0] and tshape[1:] == local[1:]:
        return local
    raise ProgramValueError(f"pld.tensor.{call.name} at {call.where}: the target needs one slot per rank for the "
                            f"local data {local}: shape {[world, *local]} or {[world * local[0], *local[1:]] if local else []}, "
                            f"but {describe(t)} has {tshape}")


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


def run(call, me: int, n: int, host: bool) -> None:
    """Write my data into slot ``me`` of every rank's target (push, straight from ``local``), between two
    barriers."""
    local, target, signal, cache = call.source, call.target, call.signal, call.cache
    slot = slot_shape(call, n)
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


@collective(domain=(1, 2), build=_build, options=_options, run=run, host_window_source=True,
            fixed_schedule=True)
def allgather(local_data, target, signal):
    """``target[src]`` becomes rank ``src``'s ``local_data`` on every rank."""
    return context.current().collective("allgather", (local_data, target, signal), {})
