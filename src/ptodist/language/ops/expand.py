"""Broadcast and expand: ``row_expand*`` / ``col_expand*``, ``expands``, ``expand_clone``, ``fillpad*``.

A row vector is ``[..., M, 1]`` (one value per row of an ``[..., M, N]`` tile), a column vector
``[..., 1, N]``.  Both operands share one dtype; arithmetic keeps it (integer division truncates toward
zero).  The result is valid where both operands are.  ``fillpad`` writes a pad value into a tile's
invalid region and makes the whole tile valid; :class:`PadValue` names the three values the hardware
pads with (``zero``, ``max``: +inf or the integer maximum, ``min``: -inf or the integer minimum).
"""

from __future__ import annotations

import enum
import math

import numpy as np

from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from ..scalar import Scalar
from ..tile_ops import Tile, carry_pad
from .registry import FLOATS, NUMERIC, _fresh, _whole, dtype_names, is_tensor, op, tensor_impl

_EXP = "Broadcast and expand"


class PadValue(enum.Enum):
    """What fills a tile's invalid region: ``zero``, ``max`` (+inf / integer max), ``min`` (-inf / integer min)."""

    null = 0
    zero = 1
    max = 2
    min = 3


# -- row / column vectors ----------------------------------------------------------------------------------
def _pair(name: str, x, v, axis: int) -> None:
    """``v`` must be the row (``axis=-1``) or column (``axis=-2``) vector of tile ``x``."""
    what = "row_vec" if axis == -1 else "col_vec"
    for i, a in enumerate((x, v)):
        if not isinstance(a, Tile):
            raise TileTypeError(f"pl.tile.{name}: argument {i + 1} must be a Tile, got {type(a).__name__}; "
                                "load tensors into tiles with pl.load first")
    if x.data.ndim < 2 or v.data.ndim != x.data.ndim:
        raise TileValueError(f"pl.tile.{name}: needs a tile of at least 2 dimensions and a {what} of the same "
                             f"rank, got shapes {x.shape} and {v.shape}")
    want = list(x.shape)
    want[axis] = 1
    if v.shape != want:
        one = "one value per row" if axis == -1 else "one value per column"
        raise TileValueError(f"pl.tile.{name}: {what} has shape {v.shape}, but a {x.shape} tile needs {want} "
                             f"({one}); produce it with pl.{'row' if axis == -1 else 'col'}_sum / _max / _min")
    if v.dtype is not x.dtype:
        raise TileTypeError(f"pl.tile.{name}: the tile is {x.dtype.name} but the {what} is {v.dtype.name}; "
                            f"convert one with pl.cast(..., target_type=pl.{x.dtype.name})")


def _common_valid(x: Tile, v: Tile, axis: int) -> tuple:
    valid = [min(a, b) for a, b in zip(x.valid_shape, v.valid_shape)]
    valid[axis] = x.valid_shape[axis]
    return tuple(valid)


def _fused(name: str, x: Tile, v: Tile, axis: int, fn) -> Tile:
    _pair(name, x, v, axis)
    out = fn(x, v)
    return carry_pad(Tile(out.data, x.dtype, _common_valid(x, v, axis)), x, v)


def _elementwise(fn):
    """The binary numpy ``fn`` on two same-typed tiles (the vector broadcasts), keeping their dtype."""
    return lambda x, v: Tile(np.asarray(fn(x.data, v.data)).astype(x.dtype.np_dtype), x.dtype)


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        # C division: truncate toward zero; a zero divisor gives 0 rather than a Python exception.
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.abs(x.astype(np.int64)) // np.where(y == 0, 1, np.abs(y.astype(np.int64)))
        return np.where(y == 0, 0, np.where((x < 0) != (y < 0), -q, q))
    with np.errstate(divide="ignore", invalid="ignore"):  # IEEE results (inf, nan), as the device gives
        return np.divide(x, y)


_ADD, _SUB, _MUL = _elementwise(np.add), _elementwise(np.subtract), _elementwise(np.multiply)
_DIV, _MAX, _MIN = _elementwise(_divide), _elementwise(np.maximum), _elementwise(np.minimum)


def _expdif(x: Tile, v: Tile) -> Tile:
    # Fused on the device: the difference is not rounded to the tile's type before the exponential.
    with np.errstate(over="ignore", invalid="ignore"):  # IEEE results (inf, nan), as the device gives
        out = np.exp(x.data.astype(np.float32) - v.data.astype(np.float32)).astype(x.dtype.np_dtype)
    return Tile(out, x.dtype)


def _expand(x: Tile, v: Tile) -> Tile:
    return Tile(np.broadcast_to(v.data, x.data.shape).copy(), v.dtype)


@op("row_expand", family=_EXP, dtypes=NUMERIC)
def row_expand(target: Tile, row_vec: Tile) -> Tile:
    """Broadcast the ``[..., M, 1]`` row vector across the columns of ``target``'s shape."""
    return _fused("row_expand", target, row_vec, -1, _expand)


@op("col_expand", family=_EXP, dtypes=NUMERIC)
def col_expand(target: Tile, col_vec: Tile) -> Tile:
    """Broadcast the ``[..., 1, N]`` column vector down the rows of ``target``'s shape."""
    return _fused("col_expand", target, col_vec, -2, _expand)


@op("row_expand_add", family=_EXP, dtypes=NUMERIC, tile_only=("tmp",))
def row_expand_add(tile: Tile, row_vec: Tile, tmp: Tile | None = None) -> Tile:
    """``tile[i, :] + row_vec[i, 0]`` for every row ``i``."""
    if tmp is not None and not isinstance(tmp, Tile):
        raise TileTypeError(f"pl.tile.row_expand_add: tmp must be a Tile, got {type(tmp).__name__}; pass a "
                            "scratch tile or leave it out")
    return _fused("row_expand_add", tile, row_vec, -1, _ADD)


@op("row_expand_sub", family=_EXP, dtypes=NUMERIC)
def row_expand_sub(tile: Tile, row_vec: Tile) -> Tile:
    """``tile[i, :] - row_vec[i, 0]`` for every row ``i``."""
    return _fused("row_expand_sub", tile, row_vec, -1, _SUB)


@op("row_expand_mul", family=_EXP, dtypes=NUMERIC)
def row_expand_mul(tile: Tile, row_vec: Tile) -> Tile:
    """``tile[i, :] * row_vec[i, 0]`` for every row ``i``."""
    return _fused("row_expand_mul", tile, row_vec, -1, _MUL)


@op("row_expand_div", family=_EXP, dtypes=NUMERIC)
def row_expand_div(tile: Tile, row_vec: Tile) -> Tile:
    """``tile[i, :] / row_vec[i, 0]`` for every row ``i`` (integers truncate toward zero)."""
    return _fused("row_expand_div", tile, row_vec, -1, _DIV)


@op("row_expand_max", family=_EXP, dtypes=NUMERIC)
def row_expand_max(tile: Tile, row_vec: Tile) -> Tile:
    """``max(tile[i, :], row_vec[i, 0])`` for every row ``i``."""
    return _fused("row_expand_max", tile, row_vec, -1, _MAX)


@op("row_expand_min", family=_EXP, dtypes=NUMERIC)
def row_expand_min(tile: Tile, row_vec: Tile) -> Tile:
    """``min(tile[i, :], row_vec[i, 0])`` for every row ``i``."""
    return _fused("row_expand_min", tile, row_vec, -1, _MIN)


@op("row_expand_expdif", family=_EXP, dtypes=FLOATS)
def row_expand_expdif(tile: Tile, row_vec: Tile) -> Tile:
    """``exp(tile[i, :] - row_vec[i, 0])`` for every row ``i`` (the softmax numerator, fused)."""
    return _fused("row_expand_expdif", tile, row_vec, -1, _expdif)


@op("col_expand_add", family=_EXP, dtypes=NUMERIC)
def col_expand_add(tile: Tile, col_vec: Tile) -> Tile:
    """``tile[:, j] + col_vec[0, j]`` for every column ``j``."""
    return _fused("col_expand_add", tile, col_vec, -2, _ADD)


@op("col_expand_sub", family=_EXP, dtypes=NUMERIC)
def col_expand_sub(tile: Tile, col_vec: Tile) -> Tile:
    """``tile[:, j] - col_vec[0, j]`` for every column ``j``."""
    return _fused("col_expand_sub", tile, col_vec, -2, _SUB)


@op("col_expand_mul", family=_EXP, dtypes=NUMERIC)
def col_expand_mul(tile: Tile, col_vec: Tile) -> Tile:
    """``tile[:, j] * col_vec[0, j]`` for every column ``j``."""
    return _fused("col_expand_mul", tile, col_vec, -2, _MUL)


@op("col_expand_div", family=_EXP, dtypes=NUMERIC)
def col_expand_div(tile: Tile, col_vec: Tile) -> Tile:
    """``tile[:, j] / col_vec[0, j]`` for every column ``j`` (integers truncate toward zero)."""
    return _fused("col_expand_div", tile, col_vec, -2, _DIV)


@op("col_expand_max", family=_EXP, dtypes=NUMERIC)
def col_expand_max(tile: Tile, col_vec: Tile) -> Tile:
    """``max(tile[:, j], col_vec[0, j])`` for every column ``j``."""
    return _fused("col_expand_max", tile, col_vec, -2, _MAX)


@op("col_expand_min", family=_EXP, dtypes=NUMERIC)
def col_expand_min(tile: Tile, col_vec: Tile) -> Tile:
    """``min(tile[:, j], col_vec[0, j])`` for every column ``j``."""
    return _fused("col_expand_min", tile, col_vec, -2, _MIN)


@op("col_expand_expdif", family=_EXP, dtypes=FLOATS)
def col_expand_expdif(tile: Tile, col_vec: Tile) -> Tile:
    """``exp(tile[:, j] - col_vec[0, j])`` for every column ``j`` (fused)."""
    return _fused("col_expand_expdif", tile, col_vec, -2, _expdif)


# -- scalars ---------------------------------------------------------------------------------------------
def _scalar_array(name: str, value, dtype: dt.DataType, shape) -> np.ndarray:
    if isinstance(value, Scalar):
        value = value.value
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TileTypeError(f"pl.{name}: the value to broadcast must be a number, got {type(value).__name__}")
    if dtype.is_float:
        v = np.asarray(value, np.float64).astype(dtype.np_dtype)
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise TileValueError(f"pl.{name}: cannot put {value} into a {dtype.name} tile; pass a finite number")
        v = np.asarray(math.trunc(value), np.int64).astype(dtype.np_dtype)  # C conversion: truncate, then wrap
    else:
        v = np.asarray(int(value) & 0xFFFFFFFFFFFFFFFF, np.uint64).astype(dtype.np_dtype)  # wraps, as C does
    return np.full(list(shape), v, dtype=dtype.np_dtype)


@op("expands", family=_EXP, dtypes=NUMERIC)
def expands(target: Tile, scalar) -> Tile:
    """A tile of ``target``'s shape and dtype filled with ``scalar`` (``target`` itself is not read)."""
    if not isinstance(target, Tile):
        raise TileTypeError(f"pl.tile.expands: target must be a Tile, got {type(target).__name__}; note the order "
                            "pl.expands(target, scalar)")
    return Tile(_scalar_array("tile.expands", scalar, target.dtype, target.shape), target.dtype, target.valid_shape)


@tensor_impl("expands")
def _expands_tensor(target, scalar):
    # The target only lends its shape and dtype: it is not read (no load, nothing traced).
    if not is_tensor(target):
        return expands(target, scalar)
    if target.dtype not in NUMERIC:
        raise TileTypeError(f"pl.tensor.expands: the target is a {target.dtype.name} tensor, but expands fills "
                            f"{dtype_names(NUMERIC)} tensors")
    return _fresh(Tile(_scalar_array("tensor.expands", scalar, target.dtype, target.shape), target.dtype))


@op("expand_clone", family=_EXP, dtypes=None, levels=("tensor",))
def expand_clone(src, target):
    """A fresh tensor of ``target``'s shape holding ``src`` copied along its one size-1 axis (3-D tensors)."""
    for i, a in enumerate((src, target)):
        if not is_tensor(a):
            raise TileTypeError(f"pl.expand_clone: argument {i + 1} must be a tensor, got {type(a).__name__}; "
                                "expand_clone exists at tensor level only (on tiles use pl.row_expand / "
                                "pl.col_expand)")
    s, t = list(src.shape), list(target.shape)
    if len(s) != 3 or len(t) != 3:
        raise TileValueError(f"pl.tensor.expand_clone: input and target must both be 3-D, got {s} and {t}")
    grown = [i for i in range(3) if s[i] != t[i]]
    if any(s[i] != 1 for i in grown) or len(grown) > 1:
        raise TileValueError(f"pl.tensor.expand_clone: cannot expand {s} to {t}: only one axis may differ, and it "
                             "must be of size 1 in the input")
    if src.dtype is not target.dtype:
        raise TileTypeError(f"pl.tensor.expand_clone: input is {src.dtype.name} but target is "
                            f"{target.dtype.name}; convert one with pl.cast first")
    x = _whole(src)
    return _fresh(Tile(np.broadcast_to(x.data, t).copy(), x.dtype))


# -- padding ---------------------------------------------------------------------------------------------
def _pad_mode(name: str, pad_value) -> PadValue:
    if isinstance(pad_value, PadValue) and pad_value is not PadValue.null:
        return pad_value
    if not isinstance(pad_value, (bool, PadValue)) and isinstance(pad_value, (int, float)):
        if pad_value == 0:
            return PadValue.zero
        if pad_value == math.inf:
            return PadValue.max
        if pad_value == -math.inf:
            return PadValue.min
    raise TileValueError(f"pl.tile.{name}: pad_value={pad_value!r} is not a pad mode; use pl.PadValue.zero, "
                         "pl.PadValue.max or pl.PadValue.min (or 0, math.inf, -math.inf): the hardware pads with "
                         "those three only")


def _pad_scalar(mode: PadValue, dtype: dt.DataType):
    if mode is PadValue.zero:
        return 0
    if dtype.is_float:
        return math.inf if mode is PadValue.max else -math.inf
    info = np.iinfo(dtype.np_dtype)
    return info.max if mode is PadValue.max else info.min


def _need(name: str, x) -> None:
    if not isinstance(x, Tile) or x.data.ndim < 1:
        got = repr(x) if isinstance(x, Tile) else type(x).__name__
        raise TileTypeError(f"pl.tile.{name} takes a Tile of at least one dimension, got {got}")


@op("fillpad", family=_EXP, dtypes=NUMERIC)
def fillpad(tile: Tile, pad_value: PadValue | int | float = PadValue.zero) -> Tile:
    """``tile`` with its invalid region set to ``pad_value``; the result is valid everywhere."""
    _need("fillpad", tile)
    fill = _pad_scalar(_pad_mode("fillpad", pad_value), tile.dtype)
    out = np.full(tile.data.shape, fill, dtype=tile.dtype.np_dtype)
    valid = tuple(slice(0, v) for v in tile.valid_shape)
    out[valid] = tile.data[valid]
    return Tile(out, tile.dtype)


@op("fillpad_expand", family=_EXP, dtypes=NUMERIC)
def fillpad_expand(tile: Tile, shape, pad_value: PadValue | int | float = PadValue.zero) -> Tile:
    """A larger tile of ``shape``: ``tile``'s valid region at the top left, ``pad_value`` everywhere else."""
    _need("fillpad_expand", tile)
    mode = _pad_mode("fillpad_expand", pad_value)
    try:
        new = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise TileTypeError(f"pl.tile.fillpad_expand: shape must be a list of integers, got {shape!r}") from None
    if len(new) != tile.data.ndim or any(n < s for n, s in zip(new, tile.shape)):
        raise TileValueError(f"pl.tile.fillpad_expand: shape {new} must have the tile's rank ({tile.data.ndim}) and "
                             f"be at least its shape {tile.shape} in every dimension (it only grows a tile; to "
                             "shrink one use pl.slice)")
    out = np.full(new, _pad_scalar(mode, tile.dtype), dtype=tile.dtype.np_dtype)
    valid = tuple(slice(0, v) for v in tile.valid_shape)
    out[valid] = tile.data[valid]
    return Tile(out, tile.dtype)


@op("fillpad_inplace", family=_EXP, reach="tile", dtypes=NUMERIC, levels=("tile",))
def fillpad_inplace(tile: Tile, pad_value: PadValue | int | float = PadValue.zero) -> Tile:
    """``fillpad`` into the tile's own memory: the result shares its data with ``tile``."""
    filled = fillpad(tile, pad_value)
    if not tile.data.flags.writeable:  # a read-only view (a broadcast): nothing to share
        return filled
    tile.data[...] = filled.data
    tile.pad_filled = True  # its padding now holds the pad value: a reduction over it reads that
    return Tile(tile.data, tile.dtype, space=tile.space)
