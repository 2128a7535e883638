"""Memory operations (``pl.load``, ``pl.store``, ``pl.read``, ``pl.write``, ...).

Thin: each normalises its arguments and hands the operation to the current
context (``RankContext`` in ``runtime/rank.py`` gives it its meaning).
"""

from __future__ import annotations

from .. import context
from ..errors import OperationTypeError
from . import dtypes as dt
from .dtypes import DataType
from .scalar import Scalar
from .tile_ops import Tile
from .tile_ops import full as _tile_full
from .tile_ops import slice_ as _tile_slice


def load(tensor, offsets, shapes=None, valid_shape=None, target_memory=None, clamp=False, cache=None, *,
         shape=None, valid_shapes=None, transpose=False):
    """Load the region of ``tensor`` at ``offsets`` of size ``shapes`` into a Tile.

    With ``valid_shape`` the tile keeps its full shape but only its leading ``valid_shape`` part is read
    (and bounds-checked against ``tensor``); the padding is zero. ``clamp=True`` narrows the valid part
    to the tensor's edge instead of raising.
    """
    shapes = shapes if shapes is not None else shape
    if shapes is None:
        raise OperationTypeError("pl.load needs the tile shape: pl.load(tensor, offsets, shapes)")
    return context.current().memory_op("pl.load", tensor, list(offsets), list(shapes),
                                       valid_shape if valid_shape is not None else valid_shapes, bool(clamp))


def store(tile, offsets, output_tensor, shapes=None, *, atomic=None):
    """Store ``tile``'s valid part into ``output_tensor`` at ``offsets``; return the tensor (rebind it).

    ``offsets`` has one entry per tensor dimension; a tile of lower rank fills the trailing dimensions.
    """
    return context.current().memory_op("pl.store", tile, list(offsets), output_tensor, atomic)


def read(tensor, offset) -> Scalar:
    """Return one element of ``tensor`` (``offset``: an index list or a flat index) as a Scalar."""
    return context.current().memory_op("pl.read", tensor, offset)


def write(tensor, offset, value) -> None:
    """Write one element of ``tensor``."""
    context.current().memory_op("pl.write", tensor, offset, value)


def create_tensor(shape, dtype: DataType = dt.FP32, manual_dep: bool = False):
    """Allocate a zeroed tensor private to the running rank."""
    return context.current().memory_op("pl.create_tensor", [int(d) for d in shape], dtype)


def full(shape, dtype=None, value=None):
    """Return a tile of ``shape`` filled with ``value`` (``pl.full(shape, dtype=..., value=...)``).

    The order ``pl.full(shape, value, dtype)`` is accepted too.
    """
    if not isinstance(dtype, DataType) and isinstance(value, DataType):
        dtype, value = value, dtype
    if value is None:
        value = 0
    return _tile_full(shape, value, dtype or dt.FP32)


def slice(x, shape, offset, valid_shape=None, **_options):
    """Return the region of ``shape`` at ``offset`` of a tile, or a view of a tensor."""
    if isinstance(x, Tile):
        return _tile_slice(x, shape, offset)
    return context.current().memory_op("pl.slice", x, list(shape), list(offset))
