"""Data movement: ``load``, ``store``, ``move``, ``extract``, ``read``, ``write`` (the running context gives the
memory ones meaning), and ``set_cache_policy``.
"""

from __future__ import annotations

import enum

import numpy as np

from ...errors import TileIndexError, TileTypeError, TileValueError
from ...source import user_location
from .. import dtypes as dt
from .. import memory_ops as _m
from .. import tile_ops as _t
from ..scalar import Scalar, as_int
from ..spaces import as_space, reachable
from ..tile_ops import Tile
from .registry import ANY, is_tensor, op, tensor_impl

_MOVE = "Data movement"
_SHAPE = "Shape and layout"

op("load", family=_MOVE, reach="pl(t)", dtypes=ANY, levels=("tile",))(_m.load)
op("store", family=_MOVE, reach="pl(t)", dtypes=ANY, levels=("tile",))(_m.store)
op("move", family=_MOVE, reach="pl(t)", dtypes=ANY, levels=("tile",))(_t.move)


def _element(op_name: str, tile: Tile, indices) -> tuple:
    """The index tuple of one element of ``tile``: an index per dimension, or one flat (row-major) index."""
    if isinstance(indices, (list, tuple)):
        idx = tuple(as_int(i, f"{op_name} index") for i in indices)
        if len(idx) == len(tile.shape) and all(0 <= i < s for i, s in zip(idx, tile.shape)):
            return idx
        raise TileIndexError(f"{op_name} at {user_location(3)}: index {list(idx)} is outside the {tile.shape} tile "
                             f"(one index per dimension, each in [0, size))")
    flat = as_int(indices, f"{op_name} index")
    if not 0 <= flat < tile.data.size:
        raise TileIndexError(f"{op_name} at {user_location(3)}: flat index {flat} is outside the {tile.shape} tile "
                             f"({tile.data.size} elements)")
    return tuple(int(i) for i in np.unravel_index(flat, tile.data.shape))


@op("read", family=_SHAPE, reach="pl(t)", dtypes=ANY)
def read(x, indices) -> Scalar:
    """One element of a tile or a tensor as a Scalar (``indices``: one per dimension, or a flat index)."""
    if not isinstance(x, Tile):
        return _m.read(x, indices)
    return Scalar(x.data[_element("pl.tile.read", x, indices)].item(), x.dtype)


@op("write", family=_SHAPE, reach="pl(t)", dtypes=ANY)
def write(x, indices, value):
    """Write one element of a tile (in place: the tile is on-chip memory) or of a tensor."""
    if not isinstance(x, Tile):
        return _m.write(x, indices, value)
    idx = _element("pl.tile.write", x, indices)
    if x.dtype in dt.RAW_BITS:
        raise TileTypeError(f"pl.tile.write at {user_location(2)}: cannot write {value!r} into the {x.dtype.name} "
                            "tile: " + dt.raw_bits_why(x.dtype))
    v = value.value if isinstance(value, Scalar) else value
    if not x.dtype.is_float and not float(v).is_integer():
        raise TileValueError(f"pl.tile.write at {user_location(2)}: value {v} is not an integer, but the tile is "
                             f"{x.dtype.name}; convert it first (pl.cast)")
    x.data[idx] = v if x.dtype.is_float else Scalar(int(v), x.dtype).value
    return x


tensor_impl("read")(_m.read)
tensor_impl("write")(_m.write)


@op("extract", family=_MOVE, reach="tile", dtypes=ANY, levels=("tile",))
def extract(src: Tile, index_row, index_col, shape, *, target_memory) -> Tile:
    """The 2-D sub-tile of ``shape`` at ``(index_row, index_col)``, placed in ``target_memory`` (TEXTRACT)."""
    if not isinstance(src, Tile):
        raise TileTypeError(f"pl.tile.extract takes a Tile, got {type(src).__name__}; load tensors with pl.load")
    dst = as_space(target_memory, "pl.tile.extract")
    if src.space is not None and not reachable(src.space, dst):
        raise TileTypeError(f"pl.tile.extract: a tile in {src.space.name} cannot be extracted into {dst.name}; "
                            "extract Mat tiles into Left or Right, and Acc tiles into Mat")
    out = _t.slice_(src, shape, [index_row, index_col])
    out.space = dst
    return out


class CachePolicy(enum.Enum):
    """How a kernel's reads of a tensor use the cache (``pl.set_cache_policy``, ``pl.load(cache=)``)."""

    DEFAULT = 0
    BYPASS = 1


@op("set_cache_policy", family=_MOVE, reach="pl", dtypes=ANY, levels=("tensor",))
def set_cache_policy(tensor, policy: CachePolicy) -> None:
    """Declare how a scope reads ``tensor`` (memory is coherent here: values do not depend on it)."""
    if not is_tensor(tensor):
        raise TileTypeError(f"pl.set_cache_policy takes a tensor, got {type(tensor).__name__}")
    if not isinstance(policy, CachePolicy):
        raise TileTypeError(f"pl.set_cache_policy: policy={policy!r} is not a cache policy; pass "
                            "pl.CachePolicy.DEFAULT or pl.CachePolicy.BYPASS")
