"""Elementwise arithmetic, math and activations, each written once at tile level.

Results keep the operands' element type, as the device does: FP16/BF16 math is done in FP32 and rounded
back once per device instruction, integers wrap with C semantics and integer division truncates toward
zero. A result is valid where every operand is valid (``part_*``: where either is); a division by an
integer zero inside the valid region is an error, since the device result there is undefined.
"""

from __future__ import annotations

import warnings

import numpy as np

from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from ..dtypes import DataType
from ..scalar import Scalar
from ..tile_ops import Tile, carry_pad
from .registry import FLOATS, _fresh, _whole, op, tensor_impl

_ARITH = "Elementwise arithmetic"
_MATH = "Math"
_ACT = "Activations"
_LOW_PRECISION = (dt.FP16, dt.BF16)
# Overflow to inf, inf - inf and the like are the device's results, not warnings. The fast path below runs without
# np.errstate (entering one costs more than a small tile's add): numpy's warnings raised from here are ignored.
warnings.filterwarnings("ignore", message=r".* encountered in ", category=RuntimeWarning, module=__name__)


# -- operands ---------------------------------------------------------------------------------------------
def _is_scalar(x) -> bool:
    return isinstance(x, (int, float, np.number, Scalar)) and not isinstance(x, (bool, np.bool_))


def _kind(x) -> str:
    return f"a {x.dtype.name} Tile" if isinstance(x, Tile) else type(x).__name__


def _need_tile(name: str, x, what: str) -> Tile:
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.tile.{name}: {what} must be a Tile, got {_kind(x)}; load tensor data into a "
                            "tile with pl.load first (or call the pl.tensor form on tensors)")
    return x


def _need_scalar(name: str, x, what: str):
    if not _is_scalar(x):
        raise TileTypeError(f"pl.tile.{name}: {what} must be a scalar (int, float or pl.Scalar), got {_kind(x)}")
    return x


def _work_type(dtype: DataType) -> np.dtype:
    """The numpy type the math is done in: FP32 for the narrow floats (numpy lacks most of their math)."""
    return np.dtype(np.float32) if dtype in _LOW_PRECISION else dtype.np_dtype


def _scalar(name: str, value, dtype: DataType) -> np.ndarray:
    """``value`` as the device would hold it next to a ``dtype`` tile: rounded to ``dtype``, in the work type."""
    if isinstance(value, Scalar):
        value = value.value
    if isinstance(value, np.generic):
        value = value.item()
    if not dtype.is_float:
        if isinstance(value, float) and not value.is_integer():
            raise TileTypeError(f"pl.tile.{name}: scalar {value!r} has a fraction but the tile is {dtype.name}; "
                                f"use an integer, or cast the tile to a float type first with pl.cast")
        info = np.iinfo(dtype.np_dtype)
        if not info.min <= int(value) <= info.max:
            raise TileValueError(f"pl.tile.{name}: scalar {value!r} does not fit the tile's {dtype.name} "
                                 f"(range {info.min}..{info.max}); use a value in range, or cast the tile to a "
                                 "wider type first with pl.cast")
        return np.asarray(int(value), dtype=dtype.np_dtype)
    with np.errstate(over="ignore"):
        return np.asarray(value, dtype=dtype.np_dtype).astype(_work_type(dtype))


def _valid_in(t: Tile, shape: tuple) -> tuple:
    """``t``'s valid extent seen in a result of ``shape`` (a broadcast size-1 dimension covers it all)."""
    pad = len(shape) - t.data.ndim
    phys = (1,) * pad + tuple(t.data.shape)
    valid = (1,) * pad + tuple(t.valid_shape)
    return tuple((n if v >= 1 else 0) if p == 1 and n != 1 else v for p, v, n in zip(phys, valid, shape))


def _region(valid) -> tuple:
    return tuple(slice(0, v) for v in valid)


def _tile(data: np.ndarray, dtype: DataType, valid) -> Tile:
    """The result tile: ``data`` rounded to ``dtype``, valid over ``valid`` (``None``: all of it)."""
    with np.errstate(all="ignore"):
        data = np.asarray(data).astype(dtype.np_dtype)
    full = valid is None or tuple(valid) == tuple(data.shape)
    return Tile(data, dtype, None if full else tuple(valid))


def _round(a: np.ndarray, dtype: DataType) -> np.ndarray:
    """Round an intermediate to ``dtype``, as a device instruction writing it back would."""
    if dtype in _LOW_PRECISION:
        return a.astype(dtype.np_dtype).astype(np.float32)
    return a


def _elementwise(name: str, operands: tuple, fn, *, divisor: int | None = None) -> Tile:
    """Apply ``fn`` to the operands (tiles broadcast, scalars take the tiles' dtype); see the module docstring.

    ``divisor``: the position of an operand that divides, checked for integer zeros in the valid region.
    """
    if len(operands) == 2:
        # The common case, kept cheap: two fully valid tiles of one shape and one dtype the math is done in.
        a, b = operands
        if type(a) is Tile and type(b) is Tile and a.dtype is b.dtype and a.dtype not in _LOW_PRECISION \
                and a.data.shape == b.data.shape and a.valid_shape == a.data.shape \
                and b.valid_shape == b.data.shape and divisor is None:
            return Tile.of(fn(a.data, b.data), a.dtype)  # numpy's overflow warnings: filtered below
    tiles = [x for x in operands if isinstance(x, Tile)]
    if not tiles:
        raise TileTypeError(f"pl.tile.{name}: needs at least one Tile operand, got "
                            f"{', '.join(_kind(x) for x in operands)}; load tensor data into a tile with pl.load")
    dtype = tiles[0].dtype
    for t in tiles[1:]:
        if t.dtype is not dtype:
            raise TileTypeError(f"pl.tile.{name}: the operands are {dtype.name} and {t.dtype.name} tiles; they "
                                f"must have one element type: convert one with pl.cast(tile, target_type=pl."
                                f"{dtype.name})")
    for x in operands:
        if not isinstance(x, Tile) and not _is_scalar(x):
            raise TileTypeError(f"pl.{name}: tile operand must be a Tile or a scalar, got {_kind(x)}; load tensors "
                                "into tiles with pl.load first")
    work = _work_type(dtype)
    arrays = [x.data.astype(work) if isinstance(x, Tile) else _scalar(name, x, dtype) for x in operands]
    try:
        shape = np.broadcast_shapes(*(t.data.shape for t in tiles))
    except ValueError:
        shapes = " and ".join(str(list(t.data.shape)) for t in tiles)
        numpy_words = " ".join("(" + ",".join(map(str, t.data.shape)) + ")" for t in tiles)
        raise TileValueError(f"pl.{name}: shapes {shapes} do not broadcast (operands could not be broadcast "
                             f"together with shapes {numpy_words} )") from None
    valid = tuple(min(v) for v in zip(*(_valid_in(t, shape) for t in tiles)))
    if divisor is not None and not dtype.is_float:
        arrays[divisor] = _nonzero_divisor(name, np.broadcast_to(arrays[divisor], shape), valid,
                                           isinstance(operands[divisor], Tile))
    with np.errstate(all="ignore"):
        out = np.broadcast_to(fn(*arrays), shape)
    return carry_pad(_tile(out, dtype, valid), *tiles)


def _nonzero_divisor(name: str, d: np.ndarray, valid: tuple, is_tile: bool) -> np.ndarray:
    zeros = np.argwhere(d[_region(valid)] == 0)
    if len(zeros):
        where = f"the divisor is 0 at index {[int(i) for i in zeros[0]]}" if is_tile else "the scalar divisor is 0"
        raise TileValueError(f"pl.tile.{name}: integer division by zero ({where}); the device result is "
                             "undefined. Keep divisors non-zero in the valid region, or divide in floating point "
                             "after pl.cast")
    # Outside the valid region the divisor is padding: any non-zero stand-in keeps numpy quiet there.
    return np.where(d == 0, np.ones((), d.dtype), d)


def _unary(name: str, x, fn) -> Tile:
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.tile.{name} takes a Tile, got {_kind(x)}")
    with np.errstate(all="ignore"):
        out = fn(x.data.astype(_work_type(x.dtype)))
    out = _tile(out, x.dtype, x.valid_shape)
    return out if out.valid_shape == out.data.shape else carry_pad(out, x)


def _need_scratch(name: str, tmp, call: str) -> None:
    if tmp is None:
        raise TileTypeError(f"pl.tile.{name}: tile operands need the scratch tile tmp, which the device "
                            f"instruction works in: call {call}")
    _need_tile(name, tmp, "the scratch operand tmp")


# -- integer division semantics ---------------------------------------------------------------------------
def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "f":
        return x / y
    q = np.floor_divide(x, y)
    # numpy floors; C truncates toward zero, one more when the signs differ and the division is inexact.
    return q + ((x - q * y != 0) & ((x < 0) != (y < 0))).astype(q.dtype)


def _floor_mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.remainder(x, y)


def _trunc_mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.fmod(x, y)


# -- binary arithmetic --------------------------------------------------------------------------------------
def add(lhs, rhs) -> Tile:
    """Elementwise ``lhs + rhs``; tiles broadcast, a scalar operand takes the tile's dtype."""
    return _elementwise("add", (lhs, rhs), np.add)


def sub(lhs, rhs) -> Tile:
    """Elementwise ``lhs - rhs``; tiles broadcast, a scalar operand takes the tile's dtype."""
    return _elementwise("sub", (lhs, rhs), np.subtract)


def mul(lhs, rhs) -> Tile:
    """Elementwise ``lhs * rhs``; tiles broadcast, a scalar operand takes the tile's dtype."""
    return _elementwise("mul", (lhs, rhs), np.multiply)


def div(lhs, rhs, high_precision: bool = False) -> Tile:
    """Elementwise ``lhs / rhs``; integers truncate toward zero and a zero integer divisor is an error."""
    if high_precision and not isinstance(rhs, Tile):
        raise TileTypeError("pl.div: high_precision needs a tile divisor; a scalar divisor has no "
                            "high-precision form: drop high_precision, or divide by a tile")
    return _elementwise("div", (lhs, rhs), _div, divisor=1)


def adds(lhs: Tile, rhs) -> Tile:
    """Elementwise ``lhs + rhs`` with a scalar ``rhs``."""
    _need_tile("adds", lhs, "lhs")
    return _elementwise("adds", (lhs, _need_scalar("adds", rhs, "rhs")), np.add)


def subs(lhs: Tile, rhs) -> Tile:
    """Elementwise ``lhs - rhs`` with a scalar ``rhs``."""
    _need_tile("subs", lhs, "lhs")
    return _elementwise("subs", (lhs, _need_scalar("subs", rhs, "rhs")), np.subtract)


def muls(lhs: Tile, rhs) -> Tile:
    """Elementwise ``lhs * rhs`` with a scalar ``rhs``."""
    _need_tile("muls", lhs, "lhs")
    return _elementwise("muls", (lhs, _need_scalar("muls", rhs, "rhs")), np.multiply)


def divs(lhs: Tile, rhs, high_precision: bool = False) -> Tile:
    """Elementwise ``lhs / rhs`` with a scalar ``rhs`` (integers truncate toward zero)."""
    if high_precision:
        raise TileTypeError("pl.div: high_precision needs a tile divisor; a scalar divisor has no "
                            "high-precision form: drop high_precision, or divide by a tile")
    _need_tile("divs", lhs, "lhs")
    return _elementwise("divs", (lhs, _need_scalar("divs", rhs, "rhs")), _div, divisor=1)


op("add", family=_ARITH, scalar="adds", scalar_fn=lambda a, b: a + b)(add)
op("sub", family=_ARITH, scalar="subs", scalar_fn=lambda a, b: a - b)(sub)
op("mul", family=_ARITH, scalar="muls", scalar_fn=lambda a, b: a * b)(mul)
op("div", family=_ARITH, scalar="divs", scalar_fn=lambda a, b: a / b)(div)
op("adds", family=_ARITH, scalar_fn=lambda a, b: a + b)(adds)
op("subs", family=_ARITH, scalar_fn=lambda a, b: a - b)(subs)
op("muls", family=_ARITH, scalar_fn=lambda a, b: a * b)(muls)
op("divs", family=_ARITH, scalar_fn=lambda a, b: a / b)(divs)


# -- remainders ---------------------------------------------------------------------------------------------
def _rem(name: str, lhs, rhs) -> Tile:
    return _elementwise(name, (_need_tile(name, lhs, "lhs"), rhs), _floor_mod, divisor=1)


def _fmod(name: str, lhs, rhs) -> Tile:
    return _elementwise(name, (_need_tile(name, lhs, "lhs"), rhs), _trunc_mod, divisor=1)


def rem(lhs: Tile, rhs, tmp: Tile | None = None) -> Tile:
    """Elementwise remainder ``lhs - floor(lhs / rhs) * rhs``: the sign of the divisor (Python ``%``)."""
    _need_scratch("rem", tmp, "pl.tile.rem(lhs, rhs, tmp)")
    return _rem("rem", lhs, rhs)


def rems(lhs: Tile, rhs, tmp: Tile | None = None) -> Tile:
    """Elementwise remainder of ``lhs`` by the scalar ``rhs``, with the sign of the divisor."""
    _need_scratch("rems", tmp, "pl.tile.rems(lhs, scalar, tmp)")
    return _rem("rems", lhs, _need_scalar("rems", rhs, "rhs"))


def fmod(lhs: Tile, rhs) -> Tile:
    """Elementwise truncated remainder (C ``fmod``, ``torch.fmod``): the sign of the dividend."""
    return _fmod("fmod", lhs, rhs)


def fmods(lhs: Tile, rhs) -> Tile:
    """Elementwise truncated remainder of ``lhs`` by the scalar ``rhs``, with the sign of the dividend."""
    return _fmod("fmods", lhs, _need_scalar("fmods", rhs, "rhs"))


op("rem", family=_ARITH, scalar="rems", tile_only=("tmp",))(rem)
op("rems", family=_ARITH, tile_only=("tmp",))(rems)
op("fmod", family=_ARITH, scalar="fmods")(fmod)
op("fmods", family=_ARITH)(fmods)


def _no_scratch(name: str, tmp) -> None:
    if tmp is not None:
        raise TileTypeError(f"pl.tensor.{name}: tensor operands take no scratch tile tmp (it is a tile-level "
                            f"operand); drop it, or call pl.tile.{name} on tiles")


@tensor_impl("rem")
def _rem_tensor(lhs, rhs, tmp=None):
    """Elementwise remainder of tensors (the sign of the divisor); the tensor form takes no scratch."""
    _no_scratch("rem", tmp)
    return _fresh(_rem("rem", *_whole((lhs, rhs))))


@tensor_impl("rems")
def _rems_tensor(lhs, rhs, tmp=None):
    """Elementwise remainder of a tensor by a scalar (the sign of the divisor)."""
    _no_scratch("rems", tmp)
    return _fresh(_rem("rems", _whole(lhs), _need_scalar("rems", rhs, "rhs")))


# -- three-operand forms ------------------------------------------------------------------------------------
def _chain(dtype_of: Tile, step):
    """Two device instructions in a row: the intermediate is rounded to the tile's dtype."""
    return lambda a, b, c: step(_round(step(a, b), dtype_of.dtype), c)


def addc(lhs: Tile, rhs: Tile, rhs2: Tile) -> Tile:
    """Elementwise ``lhs + rhs + rhs2`` over three tiles."""
    for i, x in enumerate((lhs, rhs, rhs2)):
        _need_tile("addc", x, ("lhs", "rhs", "rhs2")[i])
    return _elementwise("addc", (lhs, rhs, rhs2), _chain(lhs, np.add))


def subc(lhs: Tile, rhs: Tile, rhs2: Tile) -> Tile:
    """Elementwise ``lhs - rhs - rhs2`` over three tiles."""
    for i, x in enumerate((lhs, rhs, rhs2)):
        _need_tile("subc", x, ("lhs", "rhs", "rhs2")[i])
    return _elementwise("subc", (lhs, rhs, rhs2), _chain(lhs, np.subtract))


def addsc(lhs: Tile, rhs, rhs2: Tile) -> Tile:
    """Elementwise ``lhs + rhs + rhs2`` with a scalar ``rhs`` between two tiles."""
    _need_tile("addsc", lhs, "lhs")
    _need_tile("addsc", rhs2, "rhs2")
    return _elementwise("addsc", (lhs, _need_scalar("addsc", rhs, "rhs"), rhs2), _chain(lhs, np.add))


def subsc(lhs: Tile, rhs, rhs2: Tile) -> Tile:
    """Elementwise ``lhs - rhs - rhs2`` with a scalar ``rhs`` between two tiles."""
    _need_tile("subsc", lhs, "lhs")
    _need_tile("subsc", rhs2, "rhs2")
    return _elementwise("subsc", (lhs, _need_scalar("subsc", rhs, "rhs"), rhs2), _chain(lhs, np.subtract))


for _fn in (addc, subc, addsc, subsc):
    op(_fn.__name__, family=_ARITH, reach="pl(t)", levels=("tile",))(_fn)


# -- partial (valid-region aware) combination ---------------------------------------------------------------
def _partial(name: str, src0, src1, fn) -> Tile:
    a, b = _need_tile(name, src0, "src0"), _need_tile(name, src1, "src1")
    if a.data.shape != b.data.shape:
        raise TileValueError(f"pl.tile.{name}: the tiles are {list(a.data.shape)} and {list(b.data.shape)}; "
                             "partial ops combine tiles of one shape (only their valid regions may differ)")
    if a.dtype is not b.dtype:
        raise TileTypeError(f"pl.tile.{name}: the operands are {a.dtype.name} and {b.dtype.name} tiles; they "
                            f"must have one element type: convert one with pl.cast(tile, target_type=pl."
                            f"{a.dtype.name})")
    va, vb = tuple(a.valid_shape), tuple(b.valid_shape)
    if all(x >= y for x, y in zip(va, vb)):
        big, small = a, vb
    elif all(y >= x for x, y in zip(va, vb)):
        big, small = b, va
    else:
        raise TileValueError(f"pl.tile.{name}: valid shapes {list(va)} and {list(vb)} do not nest; one "
                             "operand's valid region must contain the other's (the device handles no other case)")
    work = _work_type(a.dtype)
    out = big.data.astype(work)
    both = _region(small)
    with np.errstate(all="ignore"):
        out[both] = fn(a.data.astype(work)[both], b.data.astype(work)[both])
    return _tile(out, a.dtype, big.valid_shape)


def part_add(src0: Tile, src1: Tile) -> Tile:
    """Partial add: the sum where both tiles are valid, the valid one's value where only one is."""
    return _partial("part_add", src0, src1, np.add)


def part_mul(src0: Tile, src1: Tile) -> Tile:
    """Partial multiply: the product where both tiles are valid, the valid one's value where only one is."""
    return _partial("part_mul", src0, src1, np.multiply)


def part_max(src0: Tile, src1: Tile) -> Tile:
    """Partial maximum: the larger where both tiles are valid, the valid one's value where only one is."""
    return _partial("part_max", src0, src1, np.maximum)


def part_min(src0: Tile, src1: Tile) -> Tile:
    """Partial minimum: the smaller where both tiles are valid, the valid one's value where only one is."""
    return _partial("part_min", src0, src1, np.minimum)


for _fn in (part_add, part_mul, part_max, part_min):
    op(_fn.__name__, family=_ARITH)(_fn)


# -- unary arithmetic and math ------------------------------------------------------------------------------
def neg(tile: Tile) -> Tile:
    """Elementwise ``-tile`` (integers wrap: ``-(-128)`` is ``-128`` in INT8)."""
    return _unary("neg", tile, np.negative)


def abs_(tile: Tile) -> Tile:
    """Elementwise absolute value (integers wrap: ``abs(-128)`` is ``-128`` in INT8)."""
    return _unary("abs", tile, np.abs)


def recip(tile: Tile, high_precision: bool = False) -> Tile:
    """Elementwise reciprocal ``1 / tile``; ``high_precision`` (FP16/FP32 only) changes nothing on a CPU."""
    if high_precision and isinstance(tile, Tile) and tile.dtype not in (dt.FP32, dt.FP16):
        raise TileTypeError(f"pl.recip: high_precision=True is for FP16 and FP32 tiles, got {tile.dtype.name}; "
                            "drop it, or cast to FP32 first with pl.cast")
    return _unary("recip", tile, np.reciprocal)


def exp(tile: Tile) -> Tile:
    """Elementwise ``e ** tile``."""
    return _unary("exp", tile, np.exp)


def log(tile: Tile, high_precision: bool = False) -> Tile:
    """Elementwise natural logarithm (``high_precision`` changes nothing on a CPU)."""
    return _unary("log", tile, np.log)


def sqrt(tile: Tile) -> Tile:
    """Elementwise square root."""
    return _unary("sqrt", tile, np.sqrt)


def rsqrt(tile: Tile, tmp: Tile | None = None) -> Tile:
    """Elementwise ``1 / sqrt(tile)``; the scratch ``tmp`` selects the device's precise path (same result here)."""
    if tmp is not None:
        _need_tile("rsqrt", tmp, "the scratch operand tmp")
    return _unary("rsqrt", tile, lambda a: 1 / np.sqrt(a))


def sin(tile: Tile) -> Tile:
    """Elementwise sine of an FP32 tile (radians)."""
    return _unary("sin", tile, np.sin)


def cos(tile: Tile) -> Tile:
    """Elementwise cosine of an FP32 tile (radians)."""
    return _unary("cos", tile, np.cos)


op("neg", family=_ARITH)(neg)
op("abs", family=_ARITH)(abs_)
op("recip", family=_ARITH, dtypes=FLOATS)(recip)
op("exp", family=_MATH, dtypes=FLOATS)(exp)
op("log", family=_MATH, dtypes=FLOATS)(log)
op("sqrt", family=_MATH, dtypes=FLOATS, tensor_only=("high_precision",))(sqrt)
op("rsqrt", family=_MATH, dtypes=FLOATS, tensor_only=("high_precision",), tile_only=("tmp",))(rsqrt)
op("sin", family=_MATH, dtypes=(dt.FP32,))(sin)
op("cos", family=_MATH, dtypes=(dt.FP32,))(cos)


def _tensor_unary(name: str, core, x, tmp):
    if tmp is not None:
        raise TileTypeError(f"pl.tensor.{name}: tensor operands take no scratch tile tmp; the compiler places it "
                            f"(ask for the precise path with high_precision=True), or call pl.tile.{name} on tiles")
    return _fresh(core(_whole(x)))


@tensor_impl("sqrt")
def _sqrt_tensor(x, high_precision: bool = False, tmp=None):
    """Elementwise square root of a tensor (``high_precision`` changes nothing on a CPU)."""
    return _tensor_unary("sqrt", sqrt, x, tmp)


@tensor_impl("rsqrt")
def _rsqrt_tensor(x, high_precision: bool = False, tmp=None):
    """Elementwise ``1 / sqrt(x)`` of a tensor (``high_precision`` changes nothing on a CPU)."""
    return _tensor_unary("rsqrt", rsqrt, x, tmp)


# -- activations --------------------------------------------------------------------------------------------
def relu(tile: Tile) -> Tile:
    """Elementwise ``max(tile, 0)`` (NaN stays NaN)."""
    return _unary("relu", tile, lambda a: np.maximum(a, np.zeros((), a.dtype)))


def prelu(tile: Tile, slope: Tile, tmp: Tile | None = None) -> Tile:
    """Elementwise parametric ReLU: ``tile`` where it is positive, else ``tile * slope`` (a slope tile)."""
    _need_tile("prelu", tile, "the input")
    _need_tile("prelu", slope, "slope")
    _need_scratch("prelu", tmp, "pl.tile.prelu(tile, slope, tmp)")
    return _elementwise("prelu", (tile, slope), lambda x, s: np.where(x > 0, x, x * s))


def lrelu(tile: Tile, slope) -> Tile:
    """Elementwise leaky ReLU: ``tile`` where it is positive, else ``tile * slope`` (a scalar slope)."""
    _need_tile("lrelu", tile, "the input")
    return _elementwise("lrelu", (tile, _need_scalar("lrelu", slope, "slope")),
                        lambda x, s: np.where(x > 0, x, x * s))


op("relu", family=_ACT, reach="pl(t)", levels=("tile",))(relu)
op("prelu", family=_ACT, reach="pl(t)", dtypes=FLOATS, levels=("tile",))(prelu)
op("lrelu", family=_ACT, reach="pl(t)", dtypes=FLOATS, levels=("tile",))(lrelu)
