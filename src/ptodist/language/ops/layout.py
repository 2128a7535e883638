"""Shape and layout: ``reshape``, ``transpose``, ``slice``, ``concat``, ``assemble``, ``reinterpret_view``,
``set_validshape``, ``cast``, ``dim``.

A tile's valid region is the leading ``valid_shape`` box of its data; each op here says where that box goes.
"""

from __future__ import annotations

import numpy as np

from ... import context
from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from .. import memory_ops as _m
from .. import tile_ops as _t
from ..distributed.types import atomic_type
from ..dtypes import DataType
from ..scalar import Scalar
from ..tile_ops import Tile
from .registry import ANY, is_tensor, op, tensor_impl

_SHAPE = "Shape and layout"

op("reshape", family=_SHAPE, dtypes=ANY)(_t.reshape)
op("cast", family=_SHAPE, dtypes=ANY)(_t.cast)
op("assemble", family=_SHAPE, dtypes=ANY)(_t.assemble)
op("slice", family=_SHAPE, dtypes=ANY)(_m.slice)


@tensor_impl("slice")
def _slice_tensor(tensor, shape, offset, valid_shape=None, **options):
    """``pl.tensor.slice``: a view of the region of ``shape`` at ``offset`` (writes through it reach ``tensor``)."""
    return _m.slice(tensor, shape, offset, valid_shape, **options)


@tensor_impl("assemble")
def _assemble_tensor(target, source, offset, *, atomic=None):
    """``pl.assemble(target, source, offset)`` on a tensor writes ``source`` (a tile or a tensor) into ``target``
    at ``offset``, in place, and returns ``target`` (``target[i:i+h, j:j+w] = source`` spelled as a call).

    ``atomic=pl.AtomicType.Add`` adds ``source`` into ``target`` instead, atomically: the adds of several blocks,
    tasks or ranks into one region all count, whatever their order (split-K)."""
    mode = atomic_type(atomic, "pl.assemble")
    if is_tensor(source):
        source = _m.load(source, [0] * len(source.shape), list(source.shape))
    return context.current().memory_op("pl.assemble", source, list(offset), target, mode)


def _tile(name: str, x, what: str = "argument") -> Tile:
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.tile.{name}: the {what} must be a Tile, got {type(x).__name__}; "
                            "load a tensor region into a tile with pl.load first (or call pl.tensor."
                            f"{name} on tensors)")
    return x


def _int(name: str, value, what: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TileTypeError(f"pl.{name}: {what} must be an integer, got {value!r}")
    return value.__index__()


def _axis(name: str, axis, ndim: int) -> int:
    a = _int(name, axis, "an axis")
    if not -ndim <= a < ndim:
        raise TileValueError(f"pl.{name}: axis {a} is outside a {ndim}-D operand (axes {-ndim} .. {ndim - 1}); "
                             "give an axis in that range (negative axes count from the last)")
    return a % ndim


@op("transpose", family=_SHAPE, dtypes=ANY)
def transpose(x: Tile, axis1: int, axis2: int) -> Tile:
    """Swap two axes of a tile (negative axes count from the last); the valid region is swapped with them."""
    x = _tile("transpose", x)
    a, b = _axis("transpose", axis1, x.data.ndim), _axis("transpose", axis2, x.data.ndim)
    valid = list(x.valid_shape)
    valid[a], valid[b] = valid[b], valid[a]
    data = np.ascontiguousarray(np.swapaxes(x.data, a, b))
    return Tile(data, x.dtype, valid if tuple(valid) != data.shape else None)


@op("transpose_view", family=_SHAPE, reach="tile", dtypes=ANY, levels=("tile",))
def transpose_view(tile: Tile) -> Tile:
    """The tile with its last two axes swapped, as an NZ tile seen as ZN (its placement is kept)."""
    x = _tile("transpose_view", tile)
    if x.data.ndim < 2:
        raise TileValueError(f"pl.tile.transpose_view: the tile must have at least 2 dimensions, got {x.shape}")
    out = transpose(x, -2, -1)
    out.space = x.space
    return out


@op("concat", family=_SHAPE, dtypes=ANY)
def concat(src0: Tile, src1: Tile) -> Tile:
    """Join two tiles along the last (column) axis; every other dimension must match."""
    src0, src1 = _tile("concat", src0, "first source"), _tile("concat", src1, "second source")
    if src0.dtype is not src1.dtype:
        raise TileTypeError(f"pl.concat: the sources are {src0.dtype.name} and {src1.dtype.name} tiles; both must "
                            f"have one dtype: convert one with pl.cast(tile, target_type=pl.{src0.dtype.name})")
    if src0.data.ndim != src1.data.ndim or src0.data.ndim < 1 or src0.shape[:-1] != src1.shape[:-1]:
        raise TileValueError(f"pl.concat: shapes {src0.shape} and {src1.shape} do not join along the last axis: "
                             "they need the same rank and the same size in every dimension but the last")
    data = np.concatenate([src0.data, src1.data], axis=-1)
    v0, v1 = src0.valid_shape, src1.valid_shape
    lead = [min(a, b) for a, b in zip(v0[:-1], v1[:-1])]
    # src1's columns start after src0's full width, so they only extend the valid box when src0 is full.
    cols = src0.shape[-1] + v1[-1] if v0[-1] == src0.shape[-1] else v0[-1]
    valid = (*lead, cols)
    return Tile(data, src0.dtype, valid if valid != data.shape else None)


def _reinterpret_shape(name: str, shape, dtype: DataType, target: DataType, new_shape) -> list[int]:
    src_b, dst_b = dtype.get_byte(), target.get_byte()
    nbytes = int(np.prod(shape, dtype=np.int64)) * src_b
    if new_shape is not None:
        out = [_int(name, d, "a shape entry") for d in new_shape]
        if int(np.prod(out, dtype=np.int64)) * dst_b != nbytes:
            raise TileValueError(f"pl.{name}: shape {out} of {target.name} is "
                                 f"{int(np.prod(out, dtype=np.int64)) * dst_b} bytes, but the {dtype.name} operand "
                                 f"{list(shape)} is {nbytes} bytes; give a shape of the same byte size")
        return out
    if not shape or (shape[-1] * src_b) % dst_b:
        raise TileValueError(f"pl.{name}: the last dimension of {list(shape)} {dtype.name} "
                             f"({shape[-1] * src_b if shape else 0} bytes) does not split into whole {target.name} "
                             f"elements ({dst_b} bytes each); pass shape=[...] with the same byte size")
    return [*shape[:-1], shape[-1] * src_b // dst_b]


def _check_reinterpret(name: str, dtype: DataType, target) -> None:
    if not isinstance(target, DataType):
        raise TileTypeError(f"pl.{name}: dtype must be a pl dtype (pl.INT32, pl.FP16, ...), got {target!r}")
    if target is dtype:
        raise TileValueError(f"pl.{name}: the operand is already {dtype.name}; reinterpret_view changes the dtype "
                             f"(to reshape without changing it, call pl.reshape)")


@op("reinterpret_view", family=_SHAPE, dtypes=ANY)
def reinterpret_view(data: Tile, dtype: DataType, *, shape=None) -> Tile:
    """View the same bytes as another dtype; without ``shape`` the last dimension scales by the byte ratio."""
    x = _tile("reinterpret_view", data)
    _check_reinterpret("reinterpret_view", x.dtype, dtype)
    out = _reinterpret_shape("reinterpret_view", x.shape, x.dtype, dtype, shape)
    valid = None
    if tuple(x.valid_shape) != tuple(x.shape):
        src_b, dst_b = x.dtype.get_byte(), dtype.get_byte()
        lead_same = shape is None or list(out[:-1]) == x.shape[:-1]
        if not lead_same or (x.valid_shape[-1] * src_b) % dst_b:
            raise TileValueError(
                f"pl.reinterpret_view: the {x.dtype.name} tile {x.shape} is valid only in {list(x.valid_shape)}, "
                f"and no leading box of the {dtype.name} view {out} covers those same bytes; fill the padding "
                "first (pl.fillpad) or reinterpret a fully valid tile")
        valid = (*x.valid_shape[:-1], x.valid_shape[-1] * src_b // dst_b)
    raw = np.ascontiguousarray(x.data).view(dtype.np_dtype).reshape(out)
    return Tile(raw.copy(), dtype, valid)


@tensor_impl("reinterpret_view")
def _reinterpret_view_tensor(data, dtype: DataType, *, shape=None):
    """The tensor level: a view of the same memory (writes through it land in ``data``)."""
    if not is_tensor(data):
        raise TileTypeError(f"pl.tensor.reinterpret_view: the argument must be a tensor, got "
                            f"{type(data).__name__}; on tiles call pl.tile.reinterpret_view")
    _check_reinterpret("tensor.reinterpret_view", data.dtype, dtype)
    out = _reinterpret_shape("tensor.reinterpret_view", list(data.shape), data.dtype, dtype, shape)
    if not data.array.flags.c_contiguous:
        raise TileValueError(f"pl.tensor.reinterpret_view: {data.describe()} is a strided view (a slice of a wider "
                             "tensor), so its bytes are not one block; reinterpret the whole tensor, or copy the "
                             "region into a fresh tensor first")
    return data.reinterpreted(dtype, out)


@op("view", family=_SHAPE, reach="tensor", dtypes=ANY, levels=("tensor",))
def view(tensor, shape=None, valid_shape=None, *, layout=None):
    """The same memory with another shape (writes through it land in ``tensor``); ``layout`` changes nothing."""
    if not is_tensor(tensor):
        raise TileTypeError(f"pl.tensor.view takes a tensor, got {type(tensor).__name__}; on tiles use pl.reshape")
    if shape is None:
        if layout is None:
            raise TileValueError("pl.tensor.view needs shape= or layout=: the shape of the view, or its layout")
        shape = list(tensor.shape)
    new = [_int("tensor.view", d, "a view dimension") for d in shape]
    if not new or int(np.prod(new)) != int(np.prod(tensor.shape)):
        raise TileValueError(f"pl.tensor.view: {tensor.describe()} has {int(np.prod(tensor.shape))} elements, so "
                             f"it cannot be viewed as {new}; the view keeps every element (rank 1 or more)")
    if not tensor.array.flags.c_contiguous:
        raise TileValueError(f"pl.tensor.view: {tensor.describe()} is a strided view (a slice of a wider tensor), "
                             "so its elements are not one block; view the whole tensor, or copy the region into a "
                             "fresh tensor first")
    return tensor.reinterpreted(tensor.dtype, new)


@op("set_validshape", family=_SHAPE, dtypes=ANY)
def set_validshape(x: Tile, valid_rows, valid_cols=None) -> Tile:
    """Declare the valid region of a tile: ``(tile, rows, cols)`` for 2-D, or ``(tile, [extents...])``."""
    x = _tile("set_validshape", x)
    if valid_cols is None and isinstance(valid_rows, (list, tuple)):
        valid = [_int("set_validshape", v, "a valid extent") for v in valid_rows]
    elif valid_cols is None:
        raise TileTypeError("pl.set_validshape: give the valid rows and columns, set_validshape(tile, rows, cols), "
                            "or one extent per dimension, set_validshape(tile, [rows, cols])")
    else:
        if x.data.ndim != 2:
            raise TileValueError(f"pl.set_validshape(tile, rows, cols) takes a 2-D tile, got {x.shape}; for "
                                 f"{x.data.ndim}-D give one extent per dimension: set_validshape(tile, [...])")
        valid = [_int("set_validshape", valid_rows, "valid_rows"), _int("set_validshape", valid_cols, "valid_cols")]
    if len(valid) != x.data.ndim or any(not 0 <= v <= s for v, s in zip(valid, x.shape)):
        raise TileValueError(f"pl.set_validshape: valid shape {valid} does not fit the {x.shape} tile; give "
                             f"{x.data.ndim} extents, each between 0 and that dimension's size")
    return Tile(x.data, x.dtype, valid if tuple(valid) != tuple(x.shape) else None)


@op("dim", family=_SHAPE, dtypes=ANY, levels=("tensor",))
def dim(tensor, axis: int) -> Scalar:
    """A tensor's size along ``axis`` (negative axes count from the last), as an INT64 Scalar."""
    if isinstance(tensor, Tile):
        raise TileTypeError("pl.dim takes a tensor, got a Tile: a tile's shape is static, read it as tile.shape[axis]")
    if not is_tensor(tensor):
        raise TileTypeError(f"pl.dim takes a tensor, got {type(tensor).__name__}")
    shape = list(tensor.shape)
    return Scalar(shape[_axis("dim", axis, len(shape))], dt.INT64)
