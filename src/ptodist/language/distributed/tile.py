"""``pld.tile.*``: tile-level remote memory access."""

from __future__ import annotations

from ... import context
from ...errors import TileTypeError
from ...source import user_location
from ..tile_ops import Tile
from .types import AtomicType, atomic_type

_current = context.current  # the hot operations look it up once


def remote_load(target, peer, offsets, shape, valid_shape=None):
    """Read the region ``offsets``/``shape`` of rank ``peer``'s window ``target`` into a Tile.

    ``valid_shape`` as in ``pl.load``: the tile keeps ``shape``, only its valid part is read (and
    bounds-checked), the padding is zero.
    """
    return _current().remote_load(target, peer, offsets, shape, valid_shape)


def remote_store(src_tile, target, peer, offsets, *, atomic=AtomicType.None_):
    """Write (or with ``atomic=AtomicType.Add`` accumulate) a tile's valid part into rank ``peer``'s window.

    A tile of lower rank than ``target`` fills its trailing dimensions (``offsets``: one per window dimension).
    """
    if atomic is not AtomicType.None_:
        atomic = atomic_type(atomic, "pld.tile.remote_store")
    _current().remote_store(src_tile, target, peer, offsets, atomic)


def _staged(op: str, stage, stage2, dst_offsets, src_offsets, shape) -> tuple:
    """The region arguments of a staged transfer, its staging tiles checked.

    A region list in ``stage2``'s place is the first region argument given positionally after a single
    staging tile (how upstream prints the call); it moves back to the region arguments.
    """
    if isinstance(stage2, (list, tuple)):
        stage2, dst_offsets, src_offsets, shape = None, stage2, dst_offsets, src_offsets
    for name, t in (("stage", stage), ("stage2", stage2)):
        if t is not None and not isinstance(t, Tile):
            raise TileTypeError(f"{op} at {user_location(3)}: {name} must be a Tile (the on-chip staging buffer the "
                                f"transfer passes through), got {type(t).__name__}; make one with "
                                "pl.tile.create(shape, dtype), or call the pld.tensor form, which needs none")
    return dst_offsets, src_offsets, shape


def put(dst, peer, src, stage, stage2=None, dst_offsets=None, src_offsets=None, shape=None, *,
        atomic=AtomicType.None_):
    """``pld.tensor.put`` through the staging tile ``stage`` (and ``stage2``, ping-pong): the same transfer.

    Staging buffers change how the bytes travel, not what arrives: the result is the tensor form's.
    """
    region = _staged("pld.tile.put", stage, stage2, dst_offsets, src_offsets, shape)
    _current().put(dst, peer, src, *region, atomic_type(atomic, "pld.tile.put"), 0, 0, False, "pld.tile.put")


def get(dst, peer, src, stage, stage2=None, dst_offsets=None, src_offsets=None, shape=None):
    """``pld.tensor.get`` through the staging tile ``stage`` (and ``stage2``, ping-pong): the same transfer."""
    region = _staged("pld.tile.get", stage, stage2, dst_offsets, src_offsets, shape)
    _current().get(dst, peer, src, *region, AtomicType.None_, 0, 0, False, "pld.tile.get")
