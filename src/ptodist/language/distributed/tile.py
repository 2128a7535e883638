"""``pld.tile.*``: tile-level remote memory access."""

from __future__ import annotations

from ... import context
from .types import AtomicType

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
    _current().remote_store(src_tile, target, peer, offsets, atomic)
