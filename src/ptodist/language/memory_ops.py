"""Memory operations (``pl.load``, ``pl.store``, ``pl.read``, ``pl.write``, ...).

Thin: each normalises its arguments and hands the operation to the current
context (``RankContext`` in ``runtime/rank.py`` gives it its meaning).
"""

from __future__ import annotations

import numpy as np

from .. import context
from ..errors import OperationTypeError, OperationValueError, TileTypeError, TileValueError
from ..source import user_location
from . import dtypes as dt
from .distributed.types import atomic_type
from .dtypes import DataType
from .scalar import Scalar
from .spaces import MemorySpace, as_space, check_load_target
from .tile_ops import Tile
from .tile_ops import slice_ as _tile_slice


def load(tensor, offsets, shapes=None, valid_shape=None, target_memory=None, clamp=False, cache=None, *,
         shape=None, valid_shapes=None, transpose=False):
    """Load the region of ``tensor`` at ``offsets`` of size ``shapes`` into a Tile.

    With ``valid_shape`` the tile keeps its full shape but only its leading ``valid_shape`` part is read
    (and bounds-checked against ``tensor``); the padding is zero. ``clamp=True`` narrows the valid part
    to the tensor's edge instead of raising. ``target_memory`` is ``pl.MemorySpace.Vec`` (the default) or
    ``pl.MemorySpace.Mat``; ``transpose=True`` (into Mat only) swaps the two axes of a 2-D region:
    ``offsets``/``shapes`` stay in the tensor's coordinates and the tile comes out ``[shapes[1], shapes[0]]``.
    """
    shapes = shapes if shapes is not None else shape
    if shapes is None:
        raise OperationTypeError("pl.load needs the tile shape: pl.load(tensor, offsets, shapes)")
    space = None if target_memory is None else as_space(target_memory, "pl.load")
    if space is not None:
        check_load_target(space)
    if transpose:
        if space is not MemorySpace.Mat:
            raise TileTypeError("pl.load: transpose=True loads into Mat only (the transposing copy is DDR -> L1); "
                                "add target_memory=pl.MemorySpace.Mat, or load as is and call pl.transpose")
        if len(list(shapes)) != 2:
            raise TileValueError(f"pl.load: transpose=True needs a 2-D region, got shape {list(shapes)}")
    ctx = context.current()
    tile = ctx.memory_op("pl.load", tensor, list(offsets), list(shapes),
                         valid_shape if valid_shape is not None else valid_shapes, bool(clamp))
    if not isinstance(tile, Tile):
        return tile
    if transpose:
        valid = tuple(reversed(tile.valid_shape))
        tile = Tile(np.ascontiguousarray(tile.data.T), tile.dtype, valid if valid != tile.data.shape[::-1] else None)
    if ctx.checking and tile.valid_shape != tile.data.shape:
        tile.pad_src = str(user_location(2))  # the padding a device leaves undefined: where it came from
    tile.space = space
    return tile


def store(tile, offsets, output_tensor, shapes=None, *, atomic=None):
    """Store ``tile``'s valid part into ``output_tensor`` at ``offsets``; return the tensor (rebind it).

    ``offsets`` has one entry per tensor dimension; a tile of lower rank fills the trailing dimensions.
    ``atomic=pl.AtomicType.Add`` adds the tile into the tensor atomically instead of overwriting it.
    """
    return context.current().memory_op("pl.store", tile, list(offsets), output_tensor, atomic_type(atomic, "pl.store"))


def read(tensor, offset) -> Scalar:
    """Return one element of ``tensor`` (``offset``: an index list or a flat index) as a Scalar."""
    return context.current().memory_op("pl.read", tensor, offset)


def write(tensor, offset, value) -> None:
    """Write one element of ``tensor``."""
    context.current().memory_op("pl.write", tensor, offset, value)


def create_tensor(shape, dtype: DataType = dt.FP32, layout=None, manual_dep: bool = False, init_value=None):
    """Allocate a zeroed tensor private to the running rank (``layout`` and ``manual_dep`` change nothing here).

    ``init_value`` is refused, as upstream refuses it: fill the tensor with ``pl.tensor.full`` or a kernel.
    """
    if init_value is not None:
        raise OperationValueError(f"pl.create_tensor at {user_location(2)}: init_value={init_value!r} is not "
                                  "supported (upstream removed it); make a filled tensor with "
                                  "pl.tensor.full(shape, dtype, value), or write it from a kernel")
    return context.current().memory_op("pl.create_tensor", [int(d) for d in shape], dtype)


def slice(x, shape, offset, valid_shape=None, clamp=False, **_options):
    """Return the region of ``shape`` at ``offset`` of a tile, or a view of a tensor.

    ``valid_shape`` marks the leading part that holds data; on a tensor only that valid region must lie inside
    it (a tail tile may run past the end) and only it is read or written through the view.  ``clamp=True`` cuts
    the valid region back to the tensor's edge.
    """
    if isinstance(x, Tile):
        tile = _tile_slice(x, shape, offset)
        if valid_shape is None:
            return tile
        valid = [int(v) for v in valid_shape]
        if len(valid) != len(tile.shape) or any(not 0 <= v <= d for v, d in zip(valid, tile.shape)):
            raise TileValueError(f"pl.slice: valid_shape {valid} must lie within the slice's shape {tile.shape}, "
                                 "one extent per dimension, each between 0 and that dimension's size")
        return Tile(tile.data, tile.dtype, None if valid == tile.shape else valid, tile.space)
    valid = None if valid_shape is None else list(valid_shape)
    return context.current().memory_op("pl.slice", x, list(shape), list(offset), valid, bool(clamp))
