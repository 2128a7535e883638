"""Tiles and tile math, on numpy.

A :class:`Tile` is an n-d block held "on chip": a private copy of the data a
kernel loaded or computed.  Arithmetic keeps the tile's element type, as the
device does (FP16/BF16 math stays in FP16/BF16).  These functions need no
context: they are pure.
"""

from __future__ import annotations

import numpy as np

from ..errors import TileIndexError, TileTypeError, TileValueError
from . import dtypes as dt
from .dtypes import DataType
from .scalar import Scalar


class Tile:
    """A block of data in a kernel; supports ``+ - * /`` and unary ``-``."""

    __slots__ = ("data", "dtype", "valid_shape")

    def __init__(self, data: np.ndarray, dtype: DataType | None = None, valid_shape=None):
        self.dtype = dtype or dt.from_numpy(data.dtype)
        if self.dtype is None:
            held = ", ".join(dict.fromkeys(str(d.np_dtype) for d in dt.ALL))
            raise TileTypeError(f"a tile cannot hold numpy dtype {data.dtype}: convert the data to one of {held}")
        self.data = data.astype(self.dtype.np_dtype, copy=False)
        self.valid_shape = tuple(valid_shape) if valid_shape is not None else self.data.shape

    def __class_getitem__(cls, item):
        # `pl.Tile[[shape], dtype]` is accepted as an annotation.
        return cls

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape)

    def numpy(self) -> np.ndarray:
        """Return the tile's data (a numpy array)."""
        return self.data

    def __repr__(self) -> str:
        return f"Tile(shape={self.shape}, dtype={self.dtype.name})"

    def __add__(self, o):
        return add(self, o)

    def __radd__(self, o):
        return add(o, self)

    def __sub__(self, o):
        return sub(self, o)

    def __rsub__(self, o):
        return sub(o, self)

    def __mul__(self, o):
        return mul(self, o)

    def __rmul__(self, o):
        return mul(o, self)

    def __truediv__(self, o):
        return div(self, o)

    def __rtruediv__(self, o):
        return div(o, self)

    def __neg__(self):
        return neg(self)

    def __abs__(self):
        return abs_(self)


def _operand(x, dtype: DataType, name: str):
    if isinstance(x, Tile):
        return x.data
    if isinstance(x, Scalar):
        x = x.value
    if isinstance(x, (int, float, bool, np.number)):
        return np.asarray(x, dtype=dtype.np_dtype)
    raise TileTypeError(f"pl.{name}: tile operand must be a Tile or a scalar, got {type(x).__name__}; "
                        "load tensors into tiles with pl.load first")


def _result_dtype(a, b, name: str) -> DataType:
    for x in (a, b):
        if isinstance(x, Tile):
            return x.dtype
    raise TileTypeError(f"tile_ops.{name}({type(a).__name__}, {type(b).__name__}): needs at least one Tile "
                        f"operand; for two scalars call pl.{name}, which does scalar arithmetic too")


def _binary(a, b, fn, name: str) -> Tile:
    dtype = _result_dtype(a, b, name)
    x, y = _operand(a, dtype, name), _operand(b, dtype, name)
    try:
        out = fn(x, y)
    except ValueError as e:
        raise TileValueError(
            f"pl.{name}: shapes {list(np.shape(x))} and {list(np.shape(y))} do not broadcast ({e})"
        ) from None
    return Tile(np.asarray(out), dtype)


def _int_div(x, y):
    # Integer tiles divide with C truncation, like integer Scalars.
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q)


def add(a, b) -> Tile:
    """Elementwise ``a + b`` (tiles broadcast; either side may be a scalar)."""
    return _binary(a, b, np.add, "add")


def sub(a, b) -> Tile:
    """Elementwise ``a - b``."""
    return _binary(a, b, np.subtract, "sub")


def mul(a, b) -> Tile:
    """Elementwise ``a * b``."""
    return _binary(a, b, np.multiply, "mul")


def div(a, b) -> Tile:
    """Elementwise ``a / b`` (integer tiles truncate toward zero)."""
    dtype = _result_dtype(a, b, "div")
    return _binary(a, b, np.divide if dtype.is_float else _int_div, "div")


def maximum(a, b) -> Tile:
    """Elementwise maximum."""
    return _binary(a, b, np.maximum, "maximum")


def minimum(a, b) -> Tile:
    """Elementwise minimum."""
    return _binary(a, b, np.minimum, "minimum")


def _unary(x: Tile, fn, name: str) -> Tile:
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.tile.{name} takes a Tile, got {type(x).__name__}")
    return Tile(np.asarray(fn(x.data)), x.dtype)


def neg(x: Tile) -> Tile:
    """Elementwise ``-x``."""
    return _unary(x, np.negative, "neg")


def abs_(x: Tile) -> Tile:
    """Elementwise absolute value."""
    return _unary(x, np.abs, "abs")


def exp(x: Tile) -> Tile:
    """Elementwise exponential."""
    return _unary(x, np.exp, "exp")


def log(x: Tile) -> Tile:
    """Elementwise natural logarithm."""
    return _unary(x, np.log, "log")


def sqrt(x: Tile) -> Tile:
    """Elementwise square root."""
    return _unary(x, np.sqrt, "sqrt")


def rsqrt(x: Tile) -> Tile:
    """Elementwise reciprocal square root."""
    return _unary(x, lambda a: 1 / np.sqrt(a), "rsqrt")


_ROUNDING = {"round": np.rint, "rint": np.rint, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
             "none": np.trunc}


def cast(x: Tile, target_type: DataType | None = None, mode: str = "round", *, dtype: DataType | None = None) -> Tile:
    """Return ``x`` converted to ``target_type``; float to integer rounds by ``mode``.

    Modes: ``"round"``/``"rint"`` (to nearest, ties to even; the default), ``"floor"``,
    ``"ceil"``, ``"trunc"`` (``"none"``: C truncation).
    """
    target = target_type or dtype
    if not isinstance(target, DataType):
        raise TileTypeError(f"pl.cast needs target_type=<pl dtype>, got {target!r}")
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.tile.cast takes a Tile, got {type(x).__name__}")
    rounding = _ROUNDING.get(mode or "none")
    if rounding is None:
        raise TileValueError(f"pl.cast mode={mode!r}: use one of {', '.join(_ROUNDING)}")
    data = x.data
    if x.dtype.is_float and not target.is_float:
        data = rounding(data.astype(np.float64))
    return Tile(data.astype(target.np_dtype), target)


def _reduce(x: Tile, fn, name: str) -> Tile:
    if not isinstance(x, Tile) or x.data.ndim < 1:
        got = repr(x) if isinstance(x, Tile) else type(x).__name__
        raise TileTypeError(f"pl.tile.{name} takes a Tile of at least one dimension, got {got}")
    return Tile(fn(x.data, axis=-1, keepdims=True).astype(x.dtype.np_dtype), x.dtype)


def row_sum(x: Tile, tmp=None) -> Tile:
    """Sum along the last axis, keeping it as size 1."""
    return _reduce(x, np.sum, "row_sum")


def row_max(x: Tile, tmp=None) -> Tile:
    """Maximum along the last axis, keeping it as size 1."""
    return _reduce(x, np.max, "row_max")


def row_min(x: Tile, tmp=None) -> Tile:
    """Minimum along the last axis, keeping it as size 1."""
    return _reduce(x, np.min, "row_min")


def matmul(a: Tile, b: Tile, out_dtype: DataType | None = None) -> Tile:
    """Matrix product; low-precision inputs accumulate in FP32 (as the cube unit does)."""
    if not isinstance(a, Tile) or not isinstance(b, Tile):
        raise TileTypeError(f"pl.matmul takes two Tiles, got {type(a).__name__} and {type(b).__name__}; "
                            "load tensors into tiles with pl.load first")
    if a.data.shape[-1] != b.data.shape[-2 if b.data.ndim > 1 else 0]:
        raise TileValueError(f"pl.matmul: inner dimensions differ: {a.shape} @ {b.shape}")
    acc = dt.FP32 if a.dtype.is_float else dt.INT32
    out = np.matmul(a.data.astype(acc.np_dtype), b.data.astype(acc.np_dtype))
    return Tile(out, out_dtype or acc)


def full(shape, value, dtype: DataType = dt.FP32) -> Tile:
    """Return a tile of ``shape`` filled with ``value``."""
    if isinstance(value, Scalar):
        value = value.value
    return Tile(np.full([int(d) for d in shape], value, dtype=dtype.np_dtype), dtype)


def reshape(x: Tile, shape) -> Tile:
    """Return ``x`` with a new shape of the same element count."""
    shape = [int(d) for d in shape]
    if int(np.prod(shape)) != x.data.size:
        raise TileValueError(f"pl.reshape: cannot reshape {x.shape} ({x.data.size} elements) to {shape}")
    return Tile(x.data.reshape(shape), x.dtype)


def move(x: Tile, target_memory=None, **_) -> Tile:
    """Move a tile between on-chip memories; here a copy."""
    return Tile(x.data.copy(), x.dtype)


def slice_(x: Tile, shape, offsets) -> Tile:
    """Return the sub-tile of ``shape`` at ``offsets``."""
    idx = tuple(slice(int(o), int(o) + int(s)) for o, s in zip(offsets, shape))
    _check_region("pl.slice", x.shape, offsets, shape)
    return Tile(x.data[idx].copy(), x.dtype)


def assemble(dst: Tile, src: Tile, offsets) -> Tile:
    """Return ``dst`` with ``src`` written at ``offsets``."""
    _check_region("pl.assemble", dst.shape, offsets, src.shape)
    out = dst.data.copy()
    out[tuple(slice(int(o), int(o) + s) for o, s in zip(offsets, src.shape))] = src.data
    return Tile(out, dst.dtype)


def _check_region(op: str, bounds, offsets, shape) -> None:
    if len(offsets) != len(bounds) or len(shape) != len(bounds):
        raise TileValueError(f"{op}: offsets {list(offsets)} and shape {list(shape)} must have {len(bounds)} entries")
    for o, s, b in zip(offsets, shape, bounds):
        if int(o) < 0 or int(o) + int(s) > b:
            raise TileIndexError(f"{op}: region at offsets {list(map(int, offsets))} with shape "
                             f"{list(map(int, shape))} is outside {list(bounds)}")
