"""Reductions: row reductions collapse the last axis (kept as size 1), column reductions the first.

A partially valid tile is reduced over its valid region only; the result is valid along the kept axes
as far as the input was, and zero beyond.  Upstream documents a reduction as reading the padding too
(undefined until ``pl.fillpad`` fills it), so under ``ptodist check`` a reduction over padding is an
``uninitialized_read`` finding; ``pl.fillpad`` first makes the whole tile valid, and padding that
``pl.tile.fillpad_inplace`` filled is read, as on a device.  FP16/BF16 tiles accumulate in FP32 and round once; integer tiles wrap (C semantics).  The
``tmp_tile`` scratch argument of the tile forms is optional here, and checked as upstream checks it
when given: on a CPU it selects nothing.  The arg-reductions return INT32 indices (first occurrence
wins; NaN counts as the extremum, as in numpy and torch).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ... import context
from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from ..tile_ops import Tile
from .registry import NUMERIC, _check_dtypes, _fresh, _whole, op, tensor_impl

_RED = "Reductions"

_ROW_TMP = "tmp_tile must have the input's rank and every dimension at least the input's"
_ARG_TMP = "tmp_tile must have exactly the input's shape"


def _need_tile(name: str, x, ndim: int) -> None:
    if not isinstance(x, Tile) or x.data.ndim < ndim:
        got = repr(x) if isinstance(x, Tile) else type(x).__name__
        what = "one dimension" if ndim == 1 else "two dimensions (it collapses the first, column axis)"
        raise TileTypeError(f"pl.tile.{name} takes a Tile of at least {what}, got {got}")


def _check_tmp(name: str, x: Tile, tmp, exact: bool | None) -> None:
    """Upstream's scratch-tile rules: the input's dtype; then exactly its shape (``exact``), at least its shape
    (``exact=False``) or any shape (``None``: ``col_sum``)."""
    if tmp is None:
        return
    if not isinstance(tmp, Tile):
        raise TileTypeError(f"pl.tile.{name}: tmp_tile must be a Tile, got {type(tmp).__name__}; pass a scratch "
                            "tile (pl.create_tile) or leave it out")
    if tmp.dtype is not x.dtype:
        raise TileTypeError(f"pl.tile.{name}: tmp_tile is {tmp.dtype.name} but the input is {x.dtype.name}; "
                            "the scratch tile must have the input's dtype")
    if exact is None:
        return
    if exact:
        bad = tmp.shape != x.shape
    else:
        bad = len(tmp.shape) != len(x.shape) or any(t < s for t, s in zip(tmp.shape, x.shape))
    if bad:
        raise TileValueError(f"pl.tile.{name}: tmp_tile has shape {tmp.shape}, the input {x.shape}: "
                             f"{_ARG_TMP if exact else _ROW_TMP}")


def _wide(x: Tile) -> np.ndarray:
    # numpy lacks stable low-precision accumulation: sum FP16/BF16 in FP32 and round once.
    return x.data.astype(np.float32) if x.dtype in (dt.FP16, dt.BF16) else x.data


def _reduce(name: str, x: Tile, fn: Callable, axis: int, out_dtype) -> Tile:
    """``fn`` over ``axis`` of ``x``'s valid region; the rest of the (size-1 axis) result is zero."""
    dtype = out_dtype or x.dtype
    shape = list(x.shape)
    shape[axis] = 1
    valid = list(x.valid_shape)
    if valid[axis] < x.data.shape[axis] and all(valid):
        # Upstream's reductions read the whole row or column, padding included (docs/en/user/tutorials/
        # 01-reduction-softmax.md, "partial rows change the answer": pad with the reduction's identity). Padding pl.tile.fillpad_inplace defined is read here too; undefined padding
        # is not (it has no value to read), and the checker reports the reduction.
        if getattr(x, "pad_filled", False):
            valid[axis] = x.data.shape[axis]
        else:
            context.current().padding_read(f"pl.{name}", x, axis)
    region = _wide(x)[tuple(slice(0, v) for v in valid)]
    valid[axis] = 1
    out = np.zeros(shape, dtype.np_dtype)
    if region.size:  # an empty valid region leaves the result untouched, as the device does
        out[tuple(slice(0, v) for v in valid)] = np.asarray(fn(region, axis=axis, keepdims=True)).astype(
            dtype.np_dtype)
    return Tile(out, dtype, valid)


def _row(name: str, x: Tile, fn: Callable, out_dtype=None) -> Tile:
    return _reduce(name, x, fn, x.data.ndim - 1, out_dtype)


def _col(name: str, x: Tile, fn: Callable, out_dtype=None, axis: int = 0) -> Tile:
    return _reduce(name, x, fn, axis % x.data.ndim, out_dtype)


def _argmax(a, axis, keepdims):
    return np.argmax(a, axis=axis, keepdims=keepdims)


def _argmin(a, axis, keepdims):
    return np.argmin(a, axis=axis, keepdims=keepdims)


_COL_OPS = {"col_sum": np.sum, "col_prod": np.prod, "col_max": np.max, "col_min": np.min}


def _tensor_row(name: str) -> None:
    @tensor_impl(name)
    def tensor_level(x, tmp_tile=None):
        if tmp_tile is not None:
            raise TileTypeError(f"pl.tensor.{name}: tmp_tile is tile-level only (at tensor level the scratch is "
                                f"implicit); drop it, or call pl.tile.{name} on tiles")
        return _fresh(REGISTRY_FN[name](_whole(x)))


def _tensor_col(name: str, fn: Callable, out_dtype=None) -> None:
    # Upstream's tensor-level column reductions collapse axis -2 (the same as axis 0 on 2-D tensors).
    @tensor_impl(name)
    def tensor_level(x, tmp_tile=None):
        if tmp_tile is not None:
            raise TileTypeError(f"pl.tensor.{name}: tmp_tile is tile-level only (at tensor level the scratch is "
                                f"implicit); drop it, or call pl.tile.{name} on tiles")
        t = _whole(x)
        _check_dtypes(name, NUMERIC, (t,))
        _need_tile(name, t, 2)
        return _fresh(_col(name, t, fn, out_dtype, axis=-2))


REGISTRY_FN: dict[str, Callable] = {}


@op("row_sum", family=_RED, dtypes=NUMERIC)
def row_sum(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """Sum along the last axis, keeping it as size 1."""
    _need_tile("row_sum", x, 1)
    _check_tmp("row_sum", x, tmp_tile, exact=False)
    return _row("row_sum", x, np.sum)


@op("row_prod", family=_RED, dtypes=NUMERIC)
def row_prod(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """Product along the last axis, keeping it as size 1."""
    _need_tile("row_prod", x, 1)
    _check_tmp("row_prod", x, tmp_tile, exact=False)
    return _row("row_prod", x, np.prod)


@op("row_max", family=_RED, dtypes=NUMERIC)
def row_max(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """Maximum along the last axis, keeping it as size 1."""
    _need_tile("row_max", x, 1)
    _check_tmp("row_max", x, tmp_tile, exact=False)
    return _row("row_max", x, np.max)


@op("row_min", family=_RED, dtypes=NUMERIC)
def row_min(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """Minimum along the last axis, keeping it as size 1."""
    _need_tile("row_min", x, 1)
    _check_tmp("row_min", x, tmp_tile, exact=False)
    return _row("row_min", x, np.min)


@op("col_sum", family=_RED, dtypes=NUMERIC)
def col_sum(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """Sum along the first axis, keeping it as size 1."""
    _need_tile("col_sum", x, 2)
    _check_tmp("col_sum", x, tmp_tile, exact=None)
    return _col("col_sum", x, np.sum)


@op("col_prod", family=_RED, dtypes=NUMERIC)
def col_prod(x: Tile) -> Tile:
    """Product along the first axis, keeping it as size 1."""
    _need_tile("col_prod", x, 2)
    return _col("col_prod", x, np.prod)


@op("col_max", family=_RED, dtypes=NUMERIC)
def col_max(x: Tile) -> Tile:
    """Maximum along the first axis, keeping it as size 1."""
    _need_tile("col_max", x, 2)
    return _col("col_max", x, np.max)


@op("col_min", family=_RED, dtypes=NUMERIC)
def col_min(x: Tile) -> Tile:
    """Minimum along the first axis, keeping it as size 1."""
    _need_tile("col_min", x, 2)
    return _col("col_min", x, np.min)


@op("row_argmax", family=_RED, dtypes=NUMERIC)
def row_argmax(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """INT32 column index of each row's maximum (first occurrence), shape ``[..., 1]``."""
    _need_tile("row_argmax", x, 1)
    _check_tmp("row_argmax", x, tmp_tile, exact=True)
    return _row("row_argmax", x, _argmax, dt.INT32)


@op("row_argmin", family=_RED, dtypes=NUMERIC)
def row_argmin(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """INT32 column index of each row's minimum (first occurrence), shape ``[..., 1]``."""
    _need_tile("row_argmin", x, 1)
    _check_tmp("row_argmin", x, tmp_tile, exact=True)
    return _row("row_argmin", x, _argmin, dt.INT32)


@op("col_argmax", family=_RED, dtypes=NUMERIC)
def col_argmax(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """INT32 row index of each column's maximum (first occurrence), shape ``[1, ...]``."""
    _need_tile("col_argmax", x, 2)
    if tmp_tile is not None and not isinstance(tmp_tile, Tile):
        _check_tmp("col_argmax", x, tmp_tile, exact=None)
    return _col("col_argmax", x, _argmax, dt.INT32)


@op("col_argmin", family=_RED, dtypes=NUMERIC)
def col_argmin(x: Tile, tmp_tile: Tile | None = None) -> Tile:
    """INT32 row index of each column's minimum (first occurrence), shape ``[1, ...]``."""
    _need_tile("col_argmin", x, 2)
    if tmp_tile is not None and not isinstance(tmp_tile, Tile):
        _check_tmp("col_argmin", x, tmp_tile, exact=None)
    return _col("col_argmin", x, _argmin, dt.INT32)


REGISTRY_FN.update(row_sum=row_sum, row_prod=row_prod, row_max=row_max, row_min=row_min,
                   row_argmax=row_argmax, row_argmin=row_argmin)
for _name in ("row_sum", "row_prod", "row_max", "row_min", "row_argmax", "row_argmin"):
    _tensor_row(_name)
for _name, _fn in _COL_OPS.items():
    _tensor_col(_name, _fn)
_tensor_col("col_argmax", _argmax, dt.INT32)
_tensor_col("col_argmin", _argmin, dt.INT32)


def _axis_reduce(name: str, x: Tile, axis, keepdim: bool, fn: Callable) -> Tile:
    """``fn`` over ``axis`` of ``x``'s valid region; without ``keepdim`` the axis is dropped from the result."""
    _need_tile(name, x, 1)
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TileTypeError(f"pl.tile.{name}: axis must be an integer, got {axis!r}")
    a = axis.__index__()
    if not -x.data.ndim <= a < x.data.ndim:
        raise TileValueError(f"pl.tile.{name}: axis {a} is outside a {x.data.ndim}-D tile (axes {-x.data.ndim} .. "
                             f"{x.data.ndim - 1})")
    a %= x.data.ndim
    out = _reduce(name, x, fn, a, None)
    if keepdim or x.data.ndim == 1:
        return out
    keep = [i for i in range(x.data.ndim) if i != a]
    valid = [out.valid_shape[i] for i in keep]
    data = out.data.reshape([out.data.shape[i] for i in keep])
    return Tile(data, out.dtype, valid if tuple(valid) != data.shape else None)


def _pair(name: str, a, b):
    """The scalar form of ``pl.tile.max`` / ``min``: the larger / smaller of two scalars."""
    from .registry import REGISTRY

    return REGISTRY["maximum" if name == "max" else "minimum"].scalar_fn(a, b)


@op("sum", family=_RED, reach="tile", dtypes=NUMERIC, levels=("tile",))
def sum_(tile: Tile, axis: int, keepdim: bool = False) -> Tile:
    """Sum along ``axis`` (negative axes count from the last); ``keepdim=True`` keeps it as size 1."""
    return _axis_reduce("sum", tile, axis, keepdim, np.sum)


@op("max", family=_RED, reach="tile", dtypes=NUMERIC, levels=("tile",))
def max_(tile, axis=0, keepdim: bool = False):
    """Max along ``axis`` of a tile; of two scalars, the larger (``max(a, b)``)."""
    if not isinstance(tile, Tile):
        return _pair("max", tile, axis)
    return _axis_reduce("max", tile, axis, keepdim, np.max)


@op("min", family=_RED, reach="tile", dtypes=NUMERIC, levels=("tile",))
def min_(tile, axis=0, keepdim: bool = False):
    """Min along ``axis`` of a tile; of two scalars, the smaller (``min(a, b)``)."""
    if not isinstance(tile, Tile):
        return _pair("min", tile, axis)
    return _axis_reduce("min", tile, axis, keepdim, np.min)
