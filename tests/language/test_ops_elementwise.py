"""Elementwise arithmetic, math and activations: each op against numpy/torch, its dispatch, its errors."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from conftest import run_in_rank

import ptodist.language as pl
from ptodist.errors import TileTypeError, TileValueError
from ptodist.language.scalar import Scalar
from ptodist.language.tile_ops import Tile

FLOATS = [pl.FP32, pl.FP16, pl.BF16]
INTS = [pl.INT8, pl.INT16, pl.INT32, pl.INT64, pl.UINT8]
NUMERIC = FLOATS + INTS


def tile(values, dtype=pl.FP32, valid=None) -> Tile:
    return Tile(np.asarray(values, dtype=np.float64 if dtype.is_float else np.int64).astype(dtype.np_dtype),
                dtype, valid)


def wrap(values, dtype) -> np.ndarray:
    """Python integers reduced to ``dtype`` with two's-complement wrap (C semantics)."""
    bits = dtype.np_dtype.itemsize * 8
    lo = np.iinfo(dtype.np_dtype).min
    return np.array([[(int(v) - lo) % (1 << bits) + lo for v in row] for row in values], dtype=dtype.np_dtype)


def rounded(values, dtype) -> np.ndarray:
    """Exact (float64) results rounded once to ``dtype``."""
    return np.asarray(values, dtype=np.float64).astype(dtype.np_dtype)


def c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def same(got: Tile, expected: np.ndarray, dtype) -> None:
    assert got.dtype is dtype and got.data.dtype == dtype.np_dtype
    np.testing.assert_array_equal(got.data.astype(np.float64), np.asarray(expected).astype(np.float64))


# -- binary arithmetic ----------------------------------------------------------------------------------------
_OPERANDS = {
    "float": ([[1.5, -2.25, 1e4, 3.0]], [[0.1, 3.0, 3.0, -7.0]]),
    "signed": ([[7, -7, 100, -128]], [[2, 2, 3, -1]]),
    "unsigned": ([[7, 200, 255, 9]], [[2, 100, 2, 4]]),
}
_PYTHON = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def _operands(dtype):
    key = "float" if dtype.is_float else ("signed" if dtype.is_signed else "unsigned")
    a, b = _OPERANDS[key]
    if dtype in (pl.INT16, pl.INT32, pl.INT64):
        a = [[7, -7, 100, -30000]]
    return a, b


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_arithmetic_keeps_the_dtype(name, dtype):
    a, b = _operands(dtype)
    x, y = tile(a, dtype), tile(b, dtype)
    got = getattr(pl.tile, name)(x, y)
    xs, ys = x.data.tolist()[0], y.data.tolist()[0]
    if dtype.is_float:
        exact = [(_PYTHON[name] if name != "div" else (lambda p, q: p / q))(p, q) for p, q in zip(xs, ys)]
        expected = rounded([exact], dtype)
    elif name == "div":
        expected = wrap([[c_div(p, q) for p, q in zip(xs, ys)]], dtype)
    else:
        expected = wrap([[_PYTHON[name](p, q) for p, q in zip(xs, ys)]], dtype)
    same(got, expected, dtype)
    same(getattr(pl, name)(x, y), expected, dtype)


@pytest.mark.parametrize("name, values, scalar, expected", [
    ("add", [[100, 127, -128]], 100, [[-56, -29, -28]]),
    ("sub", [[-100, 0, 127]], 100, [[56, -100, 27]]),
    ("mul", [[100, -3, 64]], 3, [[44, -9, -64]]),
    ("div", [[-7, 7, -128]], 2, [[-3, 3, -64]]),
    ("div", [[-7, 7, -128]], -1, [[7, -7, -128]]),
])
def test_int8_scalar_forms_wrap_and_truncate(name, values, scalar, expected):
    x = tile(values, pl.INT8)
    got = getattr(pl, name)(x, scalar)
    same(got, np.array(expected, np.int8), pl.INT8)
    same(getattr(pl.tile, name + "s")(x, scalar), np.array(expected, np.int8), pl.INT8)
    same(getattr(pl.tile, name)(x, Scalar(scalar, pl.INT32)), np.array(expected, np.int8), pl.INT8)


def test_integer_division_truncates_toward_zero_everywhere():
    a = tile([[-7, 7, -7, 7, -1, 0]], pl.INT32)
    b = tile([[2, -2, -2, 2, 3, -5]], pl.INT32)
    same(pl.div(a, b), [[-3, -3, 3, 3, 0, 0]], pl.INT32)
    same(pl.div(tile([[-2**63, 5]], pl.INT64), tile([[-1, 2]], pl.INT64)), [[-2**63, 2]], pl.INT64)


@pytest.mark.parametrize("dtype", [pl.FP16, pl.BF16], ids=lambda d: d.name)
def test_low_precision_math_rounds_to_the_tile_dtype(dtype, torch):
    tdt = {pl.FP16: torch.float16, pl.BF16: torch.bfloat16}[dtype]
    a = tile([[1.0, 3.0, 1000.5, 0.1]], dtype)
    b = tile([[3.0, 7.0, 0.3, 3.0]], dtype)
    ta, tb = torch.tensor(a.data.astype(np.float32)).to(tdt), torch.tensor(b.data.astype(np.float32)).to(tdt)
    for name, ref in [("add", ta + tb), ("sub", ta - tb), ("mul", ta * tb), ("div", ta / tb)]:
        same(getattr(pl, name)(a, b), ref.float().numpy(), dtype)
    same(pl.div(a, 3.0), (ta / torch.tensor(3.0, dtype=tdt)).float().numpy(), dtype)
    # 0.1 as a scalar is first rounded to the tile's dtype, as the device holds it.
    same(pl.mul(tile([[1.0]], dtype), 0.1), rounded([[0.1]], dtype), dtype)


def test_float_division_by_zero_is_ieee():
    got = pl.div(tile([[1.0, -1.0, 0.0]]), tile([[0.0, 0.0, 0.0]]))
    assert got.data[0, 0] == np.inf and got.data[0, 1] == -np.inf and np.isnan(got.data[0, 2])
    assert np.isnan(pl.add(tile([[np.nan]]), 1.0).data[0, 0])


@pytest.mark.parametrize("call, message", [
    (lambda: pl.div(tile([[4, 5]], pl.INT32), tile([[2, 0]], pl.INT32)),
     "pl.tile.div: integer division by zero (the divisor is 0 at index [0, 1]); the device result is undefined. "
     "Keep divisors non-zero in the valid region, or divide in floating point after pl.cast"),
    (lambda: pl.div(tile([[4, 5]], pl.INT8), 0),
     "pl.tile.divs: integer division by zero (the scalar divisor is 0); the device result is undefined. "
     "Keep divisors non-zero in the valid region, or divide in floating point after pl.cast"),
    (lambda: pl.tile.rem(tile([[4]], pl.INT32), tile([[0]], pl.INT32), tile([[0]], pl.INT32)),
     "pl.tile.rem: integer division by zero (the divisor is 0 at index [0, 0]); the device result is undefined. "
     "Keep divisors non-zero in the valid region, or divide in floating point after pl.cast"),
    (lambda: pl.fmod(tile([[4]], pl.INT16), 0),
     "pl.tile.fmods: integer division by zero (the scalar divisor is 0); the device result is undefined. "
     "Keep divisors non-zero in the valid region, or divide in floating point after pl.cast"),
])
def test_integer_division_by_zero_is_an_error(call, message):
    with pytest.raises(TileValueError) as e:
        call()
    assert str(e.value) == message


def test_a_zero_divisor_in_the_padding_is_not_an_error():
    a = tile([[6, 6], [6, 6]], pl.INT32)
    b = tile([[3, 0], [0, 0]], pl.INT32, valid=(1, 1))
    got = pl.div(a, b)
    assert got.valid_shape == (1, 1) and got.data[0, 0] == 2


@pytest.mark.parametrize("call, error, message", [
    (lambda: pl.add(tile([[1.0]], pl.FP16), tile([[1.0]])), TileTypeError,
     "pl.tile.add: the operands are FP16 and FP32 tiles; they must have one element type: convert one with "
     "pl.cast(tile, target_type=pl.FP16)"),
    (lambda: pl.add(tile([[1, 2, 3]]), tile([[1, 2]])), TileValueError,
     "pl.add: shapes [1, 3] and [1, 2] do not broadcast (operands could not be broadcast together with shapes "
     "(1,3) (1,2) )"),
    (lambda: pl.add(tile([[1]], pl.INT8), 300), TileValueError,
     "pl.tile.adds: scalar 300 does not fit the tile's INT8 (range -128..127); use a value in range, or cast the "
     "tile to a wider type first with pl.cast"),
    (lambda: pl.mul(tile([[1]], pl.INT32), 0.5), TileTypeError,
     "pl.tile.muls: scalar 0.5 has a fraction but the tile is INT32; use an integer, or cast the tile to a float "
     "type first with pl.cast"),
    (lambda: pl.tile.adds(tile([[1.0]]), tile([[1.0]])), TileTypeError,
     "pl.tile.adds: rhs must be a scalar (int, float or pl.Scalar), got a FP32 Tile"),
    (lambda: pl.tile.add(tile([[1.0]]), "x"), TileTypeError,
     "pl.add: tile operand must be a Tile or a scalar, got str; load tensors into tiles with pl.load first"),
    (lambda: pl.tile.exp(np.ones((2, 2), np.float32)), TileTypeError, "pl.tile.exp takes a Tile, got ndarray"),
    (lambda: pl.div(tile([[1.0]]), 2.0, high_precision=True), TileTypeError,
     "pl.div: high_precision needs a tile divisor; a scalar divisor has no high-precision form: drop "
     "high_precision, or divide by a tile"),
    (lambda: pl.exp(tile([[1]], pl.INT32)), TileTypeError,
     "pl.tile.exp: argument 1 is a INT32 tile, but exp takes FP32, FP16, BF16 tiles; convert it first with "
     "pl.cast(tile, target_type=pl.<dtype>)"),
])
def test_arithmetic_errors(call, error, message):
    with pytest.raises(error) as e:
        call()
    assert str(e.value) == message


def test_high_precision_division_of_tiles_is_accepted():
    same(pl.div(tile([[1.0]]), tile([[4.0]]), high_precision=True), [[0.25]], pl.FP32)


# -- valid regions ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a_shape, a_valid, b_shape, b_valid, valid", [
    ((2, 4), (2, 3), (2, 4), (1, 4), (1, 3)),
    ((2, 4), (2, 4), (1, 4), (1, 2), (2, 2)),
    ((2, 4), (1, 4), (2, 1), (2, 1), (1, 4)),
    ((2, 4), (2, 4), (2, 4), (2, 4), (2, 4)),
])
def test_results_are_valid_where_every_operand_is(a_shape, a_valid, b_shape, b_valid, valid):
    a = Tile(np.ones(a_shape, np.float32), pl.FP32, a_valid)
    b = Tile(np.ones(b_shape, np.float32), pl.FP32, b_valid)
    assert pl.add(a, b).valid_shape == valid
    assert pl.mul(a, 2.0).valid_shape == a_valid
    assert pl.exp(a).valid_shape == a_valid


# -- unary arithmetic and math ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_neg_and_abs_wrap_like_c(dtype):
    if dtype.is_float:
        values = [[1.5, -2.0, 0.0, -0.0]]
        same(pl.neg(tile(values, dtype)), rounded([[-v for v in values[0]]], dtype), dtype)
        same(pl.abs(tile(values, dtype)), rounded([[abs(v) for v in values[0]]], dtype), dtype)
        return
    info = np.iinfo(dtype.np_dtype)
    values = [[info.min, info.max, 0, 1]] if dtype.is_signed else [[0, 1, 200, 255]]
    same(pl.neg(tile(values, dtype)), wrap([[-v for v in values[0]]], dtype), dtype)
    same(pl.abs(tile(values, dtype)), wrap([[abs(v) for v in values[0]]], dtype), dtype)


_UNARY = {
    "exp": (np.exp, [[0.0, 1.0, -3.5, 11.0]]),
    "log": (np.log, [[1.0, 0.5, 1000.0, 3.0]]),
    "sqrt": (np.sqrt, [[0.0, 2.0, 1e4, 0.01]]),
    "rsqrt": (lambda a: 1 / np.sqrt(a), [[1.0, 2.0, 1e4, 0.01]]),
    "recip": (np.reciprocal, [[1.0, 3.0, -7.0, 0.01]]),
}
_RTOL = {"FP32": 1e-6, "FP16": 1e-3, "BF16": 8e-3}


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(_UNARY))
def test_float_math_against_float64(name, dtype):
    fn, values = _UNARY[name]
    x = tile(values, dtype)
    got = getattr(pl.tile, name)(x)
    assert got.dtype is dtype and got.data.dtype == dtype.np_dtype
    exact = fn(x.data.astype(np.float64))
    np.testing.assert_allclose(got.data.astype(np.float64), exact, rtol=_RTOL[dtype.name])
    np.testing.assert_array_equal(getattr(pl, name)(x).data, got.data)


def test_math_edge_values():
    got = {n: getattr(pl, n)(tile([[0.0, -1.0, np.inf, np.nan]])).data[0] for n in ["log", "sqrt", "recip"]}
    assert got["log"][0] == -np.inf and np.isnan(got["log"][1]) and got["log"][2] == np.inf
    assert np.isnan(got["sqrt"][1]) and got["sqrt"][2] == np.inf and np.isnan(got["sqrt"][3])
    assert got["recip"][0] == np.inf and got["recip"][1] == -1 and got["recip"][2] == 0
    assert pl.exp(tile([[100.0]], pl.FP16)).data[0, 0] == np.inf


def test_sin_and_cos_take_fp32_only():
    x = tile([[0.0, math.pi / 6, math.pi, -2.5]])
    np.testing.assert_allclose(pl.sin(x).data, np.sin(x.data.astype(np.float64)), atol=1e-6)
    np.testing.assert_allclose(pl.cos(x).data, np.cos(x.data.astype(np.float64)), atol=1e-6)
    assert pl.sin(x).dtype is pl.FP32
    for name in ["sin", "cos"]:
        with pytest.raises(TileTypeError) as e:
            getattr(pl, name)(tile([[0.5]], pl.FP16))
        assert str(e.value) == (f"pl.tile.{name}: argument 1 is a FP16 tile, but {name} takes FP32 tiles; convert "
                                "it first with pl.cast(tile, target_type=pl.<dtype>)")


def test_recip_high_precision():
    same(pl.recip(tile([[4.0]], pl.FP16), high_precision=True), [[0.25]], pl.FP16)
    same(pl.tile.recip(tile([[4.0]]), high_precision=True), [[0.25]], pl.FP32)
    with pytest.raises(TileTypeError) as e:
        pl.recip(tile([[4.0]], pl.BF16), high_precision=True)
    assert str(e.value) == ("pl.recip: high_precision=True is for FP16 and FP32 tiles, got BF16; drop it, or cast "
                            "to FP32 first with pl.cast")
    with pytest.raises(TileTypeError) as e:
        pl.recip(tile([[4]], pl.INT32))
    assert str(e.value).startswith("pl.tile.recip: argument 1 is a INT32 tile, but recip takes FP32, FP16, BF16")


def test_rsqrt_precision_is_selected_by_a_scratch_tile_at_tile_level():
    x = tile([[4.0, 16.0]])
    same(pl.tile.rsqrt(x, tile([[0.0, 0.0]])), [[0.5, 0.25]], pl.FP32)
    with pytest.raises(TileTypeError) as e:
        pl.rsqrt(x, high_precision=True)
    assert str(e.value) == ("pl.rsqrt: keyword 'high_precision' is tensor-level only and the operands are tiles; "
                            "drop it, or call pl.tensor.rsqrt on tensors")
    with pytest.raises(TileTypeError) as e:
        pl.sqrt(x, high_precision=True)
    assert "keyword 'high_precision' is tensor-level only" in str(e.value)
    same(pl.log(x, high_precision=True), np.log(np.float32([[4.0, 16.0]])), pl.FP32)


# -- remainders ---------------------------------------------------------------------------------------------
_SIGNS = [(7, 3), (-7, 3), (7, -3), (-7, -3), (6, 3), (-6, 3)]


@pytest.mark.parametrize("dtype", [pl.INT8, pl.INT16, pl.INT32, pl.INT64, pl.FP32, pl.FP16, pl.BF16],
                         ids=lambda d: d.name)
def test_rem_takes_the_divisors_sign_and_fmod_the_dividends(dtype, torch):
    scale = 0.5 if dtype.is_float else 1
    a = tile([[p * scale for p, _ in _SIGNS]], dtype)
    b = tile([[q for _, q in _SIGNS]], dtype)
    ta, tb = (torch.tensor(t.data.astype(np.float64)) for t in (a, b))
    tmp = tile([[0] * len(_SIGNS)], dtype)
    same(pl.tile.rem(a, b, tmp), torch.remainder(ta, tb).numpy(), dtype)
    same(pl.rem(a, b, tmp), torch.remainder(ta, tb).numpy(), dtype)
    same(pl.tile.fmod(a, b), torch.fmod(ta, tb).numpy(), dtype)
    same(pl.fmod(a, b), torch.fmod(ta, tb).numpy(), dtype)
    same(pl.rem(a, -3, tmp), torch.remainder(ta, -3).numpy(), dtype)
    same(pl.tile.rems(a, -3, tmp), torch.remainder(ta, -3).numpy(), dtype)
    same(pl.fmod(a, -3), torch.fmod(ta, -3).numpy(), dtype)
    same(pl.fmods(a, -3), torch.fmod(ta, -3).numpy(), dtype)


def test_float_remainders_by_zero_are_nan():
    a = tile([[1.5, -2.0]])
    assert np.isnan(pl.fmod(a, 0.0).data).all()
    assert np.isnan(pl.tile.rem(a, tile([[0.0, 0.0]]), tile([[0.0, 0.0]])).data).all()


@pytest.mark.parametrize("call, message", [
    (lambda: pl.tile.rem(tile([[1]], pl.INT32), tile([[1]], pl.INT32)),
     "pl.tile.rem: tile operands need the scratch tile tmp, which the device instruction works in: call "
     "pl.tile.rem(lhs, rhs, tmp)"),
    (lambda: pl.rem(tile([[1]], pl.INT32), 3),
     "pl.tile.rems: tile operands need the scratch tile tmp, which the device instruction works in: call "
     "pl.tile.rems(lhs, scalar, tmp)"),
    (lambda: pl.tile.rem(tile([[1]], pl.INT32), tile([[1]], pl.INT32), 0),
     "pl.tile.rem: the scratch operand tmp must be a Tile, got int; load tensor data into a tile with pl.load "
     "first (or call the pl.tensor form on tensors)"),
    (lambda: pl.tile.fmods(tile([[1.0]]), tile([[1.0]])),
     "pl.tile.fmods: rhs must be a scalar (int, float or pl.Scalar), got a FP32 Tile"),
])
def test_remainder_errors(call, message):
    with pytest.raises(TileTypeError) as e:
        call()
    assert str(e.value) == message


# -- three-operand forms ------------------------------------------------------------------------------------
def test_three_operand_forms():
    a, b, c = tile([[1.0, 2.0]]), tile([[10.0, 20.0]]), tile([[100.0, 200.0]])
    same(pl.addc(a, b, c), [[111.0, 222.0]], pl.FP32)
    same(pl.subc(a, b, c), [[-109.0, -218.0]], pl.FP32)
    same(pl.addsc(a, 5, c), [[106.0, 207.0]], pl.FP32)
    same(pl.subsc(a, 5, c), [[-104.0, -203.0]], pl.FP32)
    i8 = [tile(v, pl.INT8) for v in ([[100, -100]], [[100, -100]], [[100, -100]])]
    same(pl.addc(*i8), wrap([[300, -300]], pl.INT8), pl.INT8)
    same(pl.subsc(i8[0], 127, i8[2]), wrap([[-127, -127]], pl.INT8), pl.INT8)
    assert pl.addc is pl.tile.addc and not hasattr(pl.tensor, "addc")


def test_three_operand_forms_round_between_the_two_steps():
    # 2048 + 1 is a tie in FP16 and rounds back to 2048, so the second + 1 does too: the device does two adds.
    h = [tile([[v]], pl.FP16) for v in (2048.0, 1.0, 1.0)]
    same(pl.addc(*h), [[2048.0]], pl.FP16)
    same(pl.addsc(h[0], 1.0, h[2]), [[2048.0]], pl.FP16)


def test_three_operand_forms_need_tiles():
    with pytest.raises(TileTypeError) as e:
        pl.addc(tile([[1.0]]), 2.0, tile([[1.0]]))
    assert str(e.value) == ("pl.tile.addc: rhs must be a Tile, got float; load tensor data into a tile with "
                            "pl.load first (or call the pl.tensor form on tensors)")


# -- partial ops --------------------------------------------------------------------------------------------
_PART = {"part_add": np.add, "part_mul": np.multiply, "part_max": np.maximum, "part_min": np.minimum}


@pytest.mark.parametrize("dtype", [pl.FP32, pl.FP16, pl.INT32, pl.INT8], ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(_PART))
def test_partial_ops_combine_where_both_are_valid_and_copy_elsewhere(name, dtype):
    big = tile([[1, -2, 3, 4], [5, 6, -7, 8]], dtype)
    small = tile([[10, 20, 99, 99], [99, 99, 99, 99]], dtype, valid=(1, 2))
    expected = big.data.astype(np.float64).copy()
    expected[:1, :2] = _PART[name](big.data[:1, :2].astype(np.float64), small.data[:1, :2].astype(np.float64))
    for got in (getattr(pl.tile, name)(big, small), getattr(pl, name)(small, big)):
        assert got.valid_shape == (2, 4)
        same(got, wrap(expected.tolist(), dtype) if not dtype.is_float else rounded(expected, dtype), dtype)


def test_partial_ops_of_two_partial_tiles_take_the_larger_valid_region():
    a = tile([[1.0, 2.0, 0.0]], valid=(1, 2))
    b = tile([[10.0, 0.0, 0.0]], valid=(1, 1))
    got = pl.part_add(a, b)
    assert got.valid_shape == (1, 2) and got.data[0, :2].tolist() == [11.0, 2.0]


@pytest.mark.parametrize("call, error, message", [
    (lambda: pl.part_add(tile([[1.0, 2.0], [3.0, 4.0]], valid=(2, 1)), tile([[1.0, 2.0], [3.0, 4.0]], valid=(1, 2))),
     TileValueError, "pl.tile.part_add: valid shapes [2, 1] and [1, 2] do not nest; one operand's valid region must "
     "contain the other's (the device handles no other case)"),
    (lambda: pl.part_max(tile([[1.0, 2.0]]), tile([[1.0]])), TileValueError,
     "pl.tile.part_max: the tiles are [1, 2] and [1, 1]; partial ops combine tiles of one shape (only their valid "
     "regions may differ)"),
    (lambda: pl.part_min(tile([[1.0]]), tile([[1]], pl.INT32)), TileTypeError,
     "pl.tile.part_min: the operands are FP32 and INT32 tiles; they must have one element type: convert one with "
     "pl.cast(tile, target_type=pl.FP32)"),
    (lambda: pl.part_mul(tile([[1.0]]), 2.0), TileTypeError,
     "pl.tile.part_mul: src1 must be a Tile, got float; load tensor data into a tile with pl.load first (or call "
     "the pl.tensor form on tensors)"),
])
def test_partial_op_errors(call, error, message):
    with pytest.raises(error) as e:
        call()
    assert str(e.value) == message


# -- activations --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_relu(dtype):
    values = [[-3, 0, 5, 100]] if dtype is not pl.UINT8 else [[0, 3, 200, 255]]
    x = tile(values, dtype)
    same(pl.relu(x), np.maximum(x.data, 0), dtype)
    assert pl.relu is pl.tile.relu and not hasattr(pl.tensor, "relu")


def test_relu_keeps_nan_and_the_valid_region():
    got = pl.relu(tile([[np.nan, -1.0]], valid=(1, 1)))
    assert np.isnan(got.data[0, 0]) and got.data[0, 1] == 0 and got.valid_shape == (1, 1)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_prelu_and_lrelu(dtype):
    x = tile([[-2.0, -0.5, 0.0, 3.0]], dtype)
    slope = tile([[0.5, 2.0, 7.0, 9.0]], dtype)
    xs = x.data.astype(np.float64)
    same(pl.prelu(x, slope, tile([[0, 0, 0, 0]], dtype)), rounded(np.where(xs > 0, xs, xs * slope.data.astype(
        np.float64)), dtype), dtype)
    s = float(np.asarray(0.1).astype(dtype.np_dtype))  # the slope as the device holds it
    same(pl.lrelu(x, 0.1), rounded(np.where(xs > 0, xs, xs * s), dtype), dtype)
    # A slope above 1 still only scales the negative part (not max(x, slope * x)).
    same(pl.lrelu(x, 2.0), rounded(np.where(xs > 0, xs, xs * 2.0), dtype), dtype)


@pytest.mark.parametrize("call, message", [
    (lambda: pl.prelu(tile([[1.0]]), tile([[0.5]])),
     "pl.tile.prelu: tile operands need the scratch tile tmp, which the device instruction works in: call "
     "pl.tile.prelu(tile, slope, tmp)"),
    (lambda: pl.prelu(tile([[1.0]]), 0.5, tile([[0.0]])),
     "pl.tile.prelu: slope must be a Tile, got float; load tensor data into a tile with pl.load first (or call the "
     "pl.tensor form on tensors)"),
    (lambda: pl.lrelu(tile([[1.0]]), tile([[1.0]])),
     "pl.tile.lrelu: slope must be a scalar (int, float or pl.Scalar), got a FP32 Tile"),
    (lambda: pl.lrelu(tile([[1]], pl.INT32), 0.5),
     "pl.tile.lrelu: argument 1 is a INT32 tile, but lrelu takes FP32, FP16, BF16 tiles; convert it first with "
     "pl.cast(tile, target_type=pl.<dtype>)"),
])
def test_activation_errors(call, message):
    with pytest.raises(TileTypeError) as e:
        call()
    assert str(e.value) == message


# -- the registry view --------------------------------------------------------------------------------------
_PL_T = ["addc", "subc", "addsc", "subsc", "relu", "prelu", "lrelu"]
_BOTH = ["add", "sub", "mul", "div", "neg", "abs", "recip", "rem", "rems", "fmod", "fmods", "part_add", "part_mul",
         "part_max", "part_min", "exp", "log", "sqrt", "rsqrt", "sin", "cos"]


def test_every_op_is_reached_as_upstream_spells_it():
    for name in _PL_T:
        assert getattr(pl, name) is getattr(pl.tile, name), name
    for name in _BOTH:
        assert callable(getattr(pl, name)) and callable(getattr(pl.tile, name)) and callable(getattr(pl.tensor, name))
        assert getattr(pl, name) is not getattr(pl.tile, name), name


def test_numbers_alone_are_scalar_arithmetic():
    assert pl.add(2, 3) == 5 and pl.sub(2, 3) == -1 and pl.mul(2, 3) == 6 and pl.div(3, 2) == 1.5


# -- tensor level, inside a program -------------------------------------------------------------------------
def test_arithmetic_at_tensor_level_in_a_program():
    def body(x, y, q, r, f, p, out):
        pl.store(pl.load(pl.div(x, y), [0, 0], [2, 3]), [0, 0], q)
        pl.store(pl.load(pl.rem(x, y), [0, 0], [2, 3]), [0, 0], r)
        pl.store(pl.load(pl.fmod(x, -4), [0, 0], [2, 3]), [0, 0], f)
        pl.store(pl.load(pl.part_max(x, y), [0, 0], [2, 3]), [0, 0], p)
        s = pl.tensor.sub(pl.tensor.add(x, 100), pl.neg(y))
        pl.store(pl.load(s, [0, 0], [2, 3]), [0, 0], out)

    x = np.array([[-7, 7, 100], [-128, 5, 9]], np.int8)
    y = np.array([[2, -2, 3], [-1, 5, 4]], np.int8)
    z = np.zeros((2, 3), np.int8)
    _, _, q, r, f, p, out = run_in_rank(body, x, y, z, z, z, z, z)
    np.testing.assert_array_equal(q, [[-3, -3, 33], [-128, 1, 2]])
    np.testing.assert_array_equal(r, np.remainder(x, y))
    np.testing.assert_array_equal(f, np.fmod(x, np.int8(-4)))
    np.testing.assert_array_equal(p, np.maximum(x, y))
    np.testing.assert_array_equal(out, (x.astype(np.int64) + 100 + y).astype(np.int8))


def test_math_at_tensor_level_in_a_program():
    def body(x, e, s, c, rs, rc):
        for op, dst in ((pl.exp, e), (pl.sin, s), (pl.cos, c), (pl.recip, rc)):
            pl.store(pl.load(op(x), [0, 0], [1, 4]), [0, 0], dst)
        pl.store(pl.load(pl.rsqrt(x, high_precision=True), [0, 0], [1, 4]), [0, 0], rs)

    x = np.array([[0.25, 1.0, 2.0, 4.0]], np.float32)
    z = np.zeros((1, 4), np.float32)
    _, e, s, c, rs, rc = run_in_rank(body, x, z, z, z, z, z)
    np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(s, np.sin(x), rtol=1e-6)
    np.testing.assert_allclose(c, np.cos(x), rtol=1e-6)
    np.testing.assert_allclose(rs, 1 / np.sqrt(x), rtol=1e-6)
    np.testing.assert_allclose(rc, 1 / x, rtol=1e-6)


def test_bf16_tensor_arithmetic_rounds_to_bf16():
    def body(x, out):
        pl.store(pl.load(pl.mul(x, 3.0), [0, 0], [1, 2]), [0, 0], out)

    x = np.array([[1.0078125, 3.0]], ml_dtypes.bfloat16)
    _, out = run_in_rank(body, x, np.zeros((1, 2), ml_dtypes.bfloat16))
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float64), (x.astype(np.float64) * 3).astype(ml_dtypes.bfloat16)
                                  .astype(np.float64))


def test_activations_and_partial_tiles_in_a_program():
    def body(x, out):
        t = pl.load(x, [0, 0], [2, 4], valid_shape=[1, 3])
        a = pl.lrelu(pl.relu(t), 0.5)
        pl.store(pl.addc(a, a, t), [0, 0], out)

    x = np.array([[-1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], np.float32)
    _, out = run_in_rank(body, x, np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(out, [[-1.0, 6.0, 9.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_tensor_forms_take_no_scratch_tile():
    def body(x, y, out):
        pl.store(pl.load(pl.tensor.sqrt(x, high_precision=True), [0, 0], [1, 2]), [0, 0], out)
        pl.tensor.rem(x, y, y)

    x = np.array([[4.0, 9.0]], np.float32)
    with pytest.raises(Exception) as e:
        run_in_rank(body, x, x.copy(), np.zeros((1, 2), np.float32))
    assert ("pl.tensor.rem: tensor operands take no scratch tile tmp (it is a tile-level operand); drop it, or call "
            "pl.tile.rem on tiles") in str(e.value)
    assert type(e.value.original) is TileTypeError


def test_uint8_wraps_below_zero():
    same(pl.sub(tile([[1, 0]], pl.UINT8), 2), [[255, 254]], pl.UINT8)
    same(pl.tile.subc(*(tile([[1]], pl.UINT8) for _ in range(3))), [[255]], pl.UINT8)
