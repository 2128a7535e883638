"""Comparison/selection and bitwise ops: tile level against numpy, the pl.* dispatch, the tensor level in a program."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_in_rank

import ptodist.language as pl
from ptodist.errors import TileTypeError, TileValueError
from ptodist.language import Tile

FLOATS = [pl.FP32, pl.FP16, pl.BF16]
INTS = [pl.INT8, pl.INT16, pl.INT32, pl.INT64, pl.UINT8]
NUMERIC = FLOATS + INTS
CMP = {"EQ": (0, np.equal), "NE": (1, np.not_equal), "LT": (2, np.less), "LE": (3, np.less_equal),
       "GT": (4, np.greater), "GE": (5, np.greater_equal)}


def T(values, dtype, valid=None) -> Tile:
    return Tile(np.asarray(values).astype(dtype.np_dtype), dtype, valid_shape=valid)


def rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype.is_float:
        return rng.standard_normal(shape).astype(np.float32).astype(dtype.np_dtype)
    info = np.iinfo(dtype.np_dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dtype.np_dtype)


def f32(x):
    return np.asarray(x).astype(np.float32)


def unpack(mask: Tile, cols: int) -> np.ndarray:
    return np.unpackbits(mask.data, axis=-1, bitorder="little")[..., :cols].astype(bool)


def raises(exc, message, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value) == message


# -- maximum / minimum ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
@pytest.mark.parametrize("name, ref", [("maximum", np.maximum), ("minimum", np.minimum)])
def test_maximum_minimum_match_numpy(dtype, name, ref):
    a, b, row = rand((4, 8), dtype, 1), rand((4, 8), dtype, 2), rand((1, 8), dtype, 3)
    got = getattr(pl.tile, name)(T(a, dtype), T(b, dtype))
    assert got.dtype is dtype and got.shape == [4, 8]
    np.testing.assert_array_equal(f32(got.data), f32(ref(f32(a), f32(b)).astype(dtype.np_dtype)))
    np.testing.assert_array_equal(getattr(pl, name)(T(a, dtype), T(b, dtype)).data, got.data)
    bcast = getattr(pl.tile, name)(T(a, dtype), T(row, dtype))
    np.testing.assert_array_equal(f32(bcast.data), f32(ref(f32(a), f32(row))))


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
@pytest.mark.parametrize("name, ref", [("maximums", np.maximum), ("minimums", np.minimum)])
def test_scalar_forms_and_their_dispatch(dtype, name, ref):
    a = rand((3, 5), dtype, 4)
    got = getattr(pl.tile, name)(T(a, dtype), 2)
    np.testing.assert_array_equal(f32(got.data), f32(ref(f32(a), 2)))
    assert got.dtype is dtype
    unified = pl.maximum if name == "maximums" else pl.minimum
    np.testing.assert_array_equal(unified(T(a, dtype), 2).data, got.data)  # a number on the right: scalar form
    np.testing.assert_array_equal(unified(T(a, dtype), pl.Scalar(2, pl.INT32)).data, got.data)
    assert getattr(pl, name) is getattr(pl.tile, name)  # tile-only re-export


def test_maximum_relu_dispatch_with_a_float_zero():
    x = T([[-1.5, 0.0, 2.5]], pl.FP32)
    np.testing.assert_array_equal(pl.maximum(x, 0.0).data, [[0.0, 0.0, 2.5]])
    assert not hasattr(pl.tensor, "maximums")  # upstream's tensor maximum takes the scalar itself


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_maximum_minimum_propagate_nan(dtype):
    a, b = T([[np.nan, 1.0, -np.inf]], dtype), T([[0.0, np.nan, 3.0]], dtype)
    assert np.isnan(f32(pl.maximum(a, b).data)[0, :2]).all() and f32(pl.maximum(a, b).data)[0, 2] == 3.0
    assert np.isnan(f32(pl.minimum(a, b).data)[0, :2]).all() and f32(pl.minimum(a, b).data)[0, 2] == -np.inf
    assert np.isnan(f32(pl.maximum(a, 0.0).data)[0, 0])


def test_scalars_take_the_tile_dtype():
    # A whole float is accepted on an integer tile; BF16 keeps 8 mantissa bits, so 1 + 2**-9 rounds to 1.0.
    np.testing.assert_array_equal(pl.minimum(T([[-3, 3]], pl.INT32), -2.0).data, [[-3, -2]])
    x = T([[1.0, 0.5]], pl.BF16)
    np.testing.assert_array_equal(f32(pl.maximum(x, 1.0 + 2 ** -9).data), [[1.0, 1.0]])
    np.testing.assert_array_equal(f32(pl.maximum(x, 1.0 + 2 ** -7).data), [[1.0078125, 1.0078125]])
    np.testing.assert_array_equal(f32(pl.maximum(T([[1.0]], pl.FP16), 1e6).data), [[np.inf]])  # FP16 overflows


def test_elementwise_results_keep_the_common_valid_region():
    a = T(np.ones((4, 8)), pl.FP32, valid=(3, 8))
    b = T(np.ones((4, 8)), pl.FP32, valid=(4, 5))
    row = T(np.ones((1, 8)), pl.FP32, valid=(1, 6))
    assert pl.maximum(a, b).valid_shape == (3, 5)
    assert pl.minimum(a, row).valid_shape == (3, 6)  # a broadcast dimension does not narrow
    assert pl.maximum(a, 0.0).valid_shape == (3, 8)
    assert pl.and_(T(np.ones((2, 4)), pl.INT32, valid=(1, 4)), T(np.ones((2, 4)), pl.INT32)).valid_shape == (1, 4)


# -- cmp / cmps -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", list(CMP))
def test_cmp_packs_a_predicate_mask(dtype, mode):
    code, ref = CMP[mode]
    a, b = rand((3, 20), dtype, 5), rand((3, 20), dtype, 6)
    b[:, ::3] = a[:, ::3]  # some equal elements
    mask = pl.tile.cmp(T(a, dtype), T(b, dtype), cmp_type=code)
    assert mask.dtype is pl.UINT8 and mask.shape == [3, 32] and mask.valid_shape == (3, 3)
    np.testing.assert_array_equal(unpack(mask, 20), ref(f32(a), f32(b)))
    assert not mask.data[:, 3:].any()
    np.testing.assert_array_equal(pl.cmp(T(a, dtype), T(b, dtype), code).data, mask.data)


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", list(CMP))
def test_cmps_against_a_scalar(dtype, mode):
    code, ref = CMP[mode]
    a = rand((2, 9), dtype, 7)
    a[0, 0] = 1
    mask = pl.tile.cmps(T(a, dtype), 1, cmp_type=code)
    assert mask.shape == [2, 32] and mask.valid_shape == (2, 2)
    np.testing.assert_array_equal(unpack(mask, 9), ref(f32(a), 1))
    np.testing.assert_array_equal(pl.cmp(T(a, dtype), 1, cmp_type=code).data, mask.data)  # scalar: cmps
    np.testing.assert_array_equal(pl.cmps(T(a, dtype), 1, code).data, mask.data)


def test_cmp_default_mode_is_eq_and_nan_compares_unequal():
    a, b = T([[np.nan, 1.0, 2.0]], pl.FP32), T([[np.nan, 1.0, 3.0]], pl.FP32)
    np.testing.assert_array_equal(unpack(pl.cmp(a, b), 3), [[False, True, False]])
    np.testing.assert_array_equal(unpack(pl.cmp(a, b, cmp_type=1), 3), [[True, False, True]])
    for code in (2, 3, 4, 5):
        assert not unpack(pl.cmp(a, a, cmp_type=code), 3)[0, 0]


def test_cmp_mask_layout_for_wide_and_partial_tiles():
    a = T(np.arange(300).reshape(1, 300), pl.INT32, valid=(1, 13))
    mask = pl.cmps(a, -1, cmp_type=4)  # every element > -1
    assert mask.shape == [1, 64] and mask.valid_shape == (1, 2)  # ceil(300 / 8) = 38 bytes, padded to 64
    np.testing.assert_array_equal(mask.data[0, :2], [0xFF, 0x1F])  # 13 valid bits, lowest bit first
    assert not mask.data[0, 2:].any()


def test_cmps_rounds_the_scalar_to_the_tile_dtype():
    # 1.0001 is 1.0 in FP16, as the device holds it next to an FP16 tile.
    np.testing.assert_array_equal(unpack(pl.cmps(T([[1.0, 2.0]], pl.FP16), 1.0001, 0), 2), [[True, False]])


# -- sel / sels -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_sel_picks_by_the_cmp_mask(dtype):
    a, b = rand((4, 40), dtype, 8), rand((4, 40), dtype, 9)
    tmp = T(np.zeros((1, 32)), pl.UINT8)
    mask = pl.cmp(T(a, dtype), T(b, dtype), cmp_type=4)
    got = pl.tile.sel(mask, T(a, dtype), T(b, dtype), tmp)
    np.testing.assert_array_equal(f32(got.data), f32(np.where(f32(a) > f32(b), a, b)))
    assert got.dtype is dtype and pl.sel is pl.tile.sel and not hasattr(pl.tensor, "sel")


def test_sel_keeps_the_valid_region_and_selects_rhs_in_the_padding():
    a = T(np.full((2, 8), 5.0), pl.FP32, valid=(2, 3))
    b = T(np.full((2, 8), -5.0), pl.FP32, valid=(2, 3))
    got = pl.sel(pl.cmps(a, 0.0, cmp_type=4), a, b, T(np.zeros((1, 32)), pl.UINT8))
    assert got.valid_shape == (2, 3)
    np.testing.assert_array_equal(got.data[:, :3], 5.0)
    np.testing.assert_array_equal(got.data[:, 3:], -5.0)


@pytest.mark.parametrize("mode, expect", [(1, "a"), (0, "b"), (2, "b"), (pl.Scalar(1, pl.INT32), "a")])
def test_sels_chooses_a_whole_tile(mode, expect):
    a, b = T([[1, 2], [3, 4]], pl.FP16), T([[5, 6], [7, 8]], pl.FP16)
    got = pl.sels(a, b, mode)
    np.testing.assert_array_equal(got.data, (a if expect == "a" else b).data)
    assert pl.sels is pl.tile.sels


# -- bitwise --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("name, ref", [("and_", np.bitwise_and), ("or_", np.bitwise_or), ("xor", np.bitwise_xor)])
def test_bitwise_tile_tile(dtype, name, ref):
    a, b = rand((3, 16), dtype, 10), rand((3, 16), dtype, 11)
    extra = (T(np.zeros((3, 16)), dtype),) if name == "xor" else ()
    got = getattr(pl.tile, name)(T(a, dtype), T(b, dtype), *extra)
    assert got.dtype is dtype
    np.testing.assert_array_equal(got.data, ref(a, b))
    np.testing.assert_array_equal(getattr(pl, name)(T(a, dtype), T(b, dtype), *extra).data, got.data)


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("name, ref", [("ands", np.bitwise_and), ("ors", np.bitwise_or), ("xors", np.bitwise_xor)])
@pytest.mark.parametrize("scalar", [0x0F, -1, 0x80])
def test_bitwise_tile_scalar(dtype, name, ref, scalar):
    a = rand((2, 8), dtype, 12)
    extra = (T(np.zeros((2, 8)), dtype),) if name == "xors" else ()
    got = getattr(pl.tile, name)(T(a, dtype), scalar, *extra)
    wrapped = np.array(scalar).astype(np.int64).astype(dtype.np_dtype)  # the bit pattern in the tile's width
    np.testing.assert_array_equal(got.data, ref(a, wrapped))
    unified = getattr(pl, name[:-1] + ("_" if name != "xors" else ""))
    np.testing.assert_array_equal(unified(T(a, dtype), scalar, *extra).data, got.data)


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
def test_not(dtype):
    a = rand((2, 8), dtype, 13)
    np.testing.assert_array_equal(pl.tile.not_(T(a, dtype)).data, np.invert(a))
    np.testing.assert_array_equal(pl.not_(T(a, dtype)).data, np.invert(a))


def test_bitwise_edge_values():
    np.testing.assert_array_equal(pl.not_(T([[0, 255]], pl.UINT8)).data, [[255, 0]])
    np.testing.assert_array_equal(pl.not_(T([[0, -1, 127]], pl.INT8)).data, [[-1, 0, -128]])
    np.testing.assert_array_equal(pl.ors(T([[1]], pl.INT8), 0x80).data, [[-127]])  # 0x80 is INT8's sign bit
    np.testing.assert_array_equal(pl.ands(T([[0x5A]], pl.UINT8), -1).data, [[0x5A]])  # -1: all ones


# -- shifts ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
def test_shifts_match_numpy(dtype):
    a = rand((2, 8), dtype, 14)
    amounts = np.arange(16).reshape(2, 8) % dtype.bits
    sh = T(amounts, pl.INT32)
    np.testing.assert_array_equal(pl.tile.shl(T(a, dtype), sh).data, np.left_shift(a, amounts.astype(a.dtype)))
    np.testing.assert_array_equal(pl.tile.shr(T(a, dtype), sh).data, np.right_shift(a, amounts.astype(a.dtype)))
    np.testing.assert_array_equal(pl.shl(T(a, dtype), sh).data, pl.tile.shl(T(a, dtype), sh).data)
    for k in (0, 3, dtype.bits - 1):
        np.testing.assert_array_equal(pl.tile.shls(T(a, dtype), k).data, np.left_shift(a, a.dtype.type(k)))
        np.testing.assert_array_equal(pl.tile.shrs(T(a, dtype), k).data, np.right_shift(a, a.dtype.type(k)))
        np.testing.assert_array_equal(pl.shl(T(a, dtype), k).data, pl.shls(T(a, dtype), k).data)
        np.testing.assert_array_equal(pl.shr(T(a, dtype), k).data, pl.shrs(T(a, dtype), k).data)


def test_shift_semantics():
    assert pl.shrs(T([[-8, -1, 7]], pl.INT8), 1).data.tolist() == [[-4, -1, 3]]  # arithmetic on signed
    assert pl.shrs(T([[0xF8, 0xFF]], pl.UINT8), 1).data.tolist() == [[0x7C, 0x7F]]  # logical on unsigned
    assert pl.shls(T([[64, 1]], pl.INT8), 1).data.tolist() == [[-128, 2]]  # wraps, bits shifted out are lost
    assert pl.shls(T([[1]], pl.INT64), 63).data.tolist() == [[-(2 ** 63)]]
    # An out-of-range amount in the padding is not the program's and does not raise.
    x = T(np.ones((1, 4)), pl.INT16, valid=(1, 2))
    got = pl.shl(x, T([[1, 2, 99, -1]], pl.INT16, valid=(1, 2)))
    assert got.valid_shape == (1, 2) and got.data[0, :2].tolist() == [2, 4]


# -- errors ---------------------------------------------------------------------------------------------

ERRORS = [
    (TileTypeError, "pl.tile.and_: argument 1 is a FP32 tile, but and_ takes INT8, INT16, INT32, INT64, UINT8 "
     "tiles; convert it first with pl.cast(tile, target_type=pl.<dtype>)",
     lambda: pl.tile.and_(T([[1.0]], pl.FP32), T([[1.0]], pl.FP32))),
    (TileTypeError, "pl.tile.shrs: argument 1 is a BF16 tile, but shrs takes INT8, INT16, INT32, INT64, UINT8 "
     "tiles; convert it first with pl.cast(tile, target_type=pl.<dtype>)",
     lambda: pl.shr(T([[1.0]], pl.BF16), 1)),
    (TileTypeError, "pl.tile.maximum: operands are FP32 and FP16 tiles; maximum needs one element type: convert "
     "one with pl.cast(tile, target_type=pl.<dtype>)",
     lambda: pl.maximum(T([[1.0]], pl.FP32), T([[1.0]], pl.FP16))),
    (TileTypeError, "pl.tile.maximum: rhs is the scalar 0.0, but maximum takes two tiles; for a scalar operand call "
     "pl.tile.maximums (or pl.maximum, which picks it)",
     lambda: pl.tile.maximum(T([[1.0]], pl.FP32), 0.0)),
    (TileTypeError, "pl.tile.and_: rhs is the scalar 1, but and_ takes two tiles; for a scalar operand call pl.tile.ands "
     "(or pl.and_, which picks it)",
     lambda: pl.tile.and_(T([[1]], pl.INT32), 1)),
    (TileValueError, "pl.tile.or_: shapes [2, 3] and [2, 4] do not broadcast; use equal shapes, or size 1 in a "
     "dimension to repeat it",
     lambda: pl.or_(T(np.ones((2, 3)), pl.INT32), T(np.ones((2, 4)), pl.INT32))),
    (TileValueError, "pl.tile.cmp: cmp_type=6 is not a comparison code; use 0 (EQ), 1 (NE), 2 (LT), 3 (LE), "
     "4 (GT), 5 (GE)",
     lambda: pl.cmp(T([[1.0]], pl.FP32), T([[1.0]], pl.FP32), cmp_type=6)),
    (TileTypeError, "pl.tile.cmps: cmp_type must be an integer code, got 'gt'; use 0 (EQ), 1 (NE), 2 (LT), "
     "3 (LE), 4 (GT), 5 (GE)",
     lambda: pl.cmp(T([[1.0]], pl.FP32), 0.0, cmp_type="gt")),
    (TileTypeError, "pl.tile.sel: mask is a FP32 tile, but sel reads the packed UINT8 predicate mask that pl.cmp "
     "/ pl.cmps produce on tiles; build the mask with them",
     lambda: pl.sel(T([[1.0]], pl.FP32), T([[1.0]], pl.FP32), T([[2.0]], pl.FP32), T([[0]], pl.UINT8))),
    (TileValueError, "pl.tile.sel: mask shape [1, 32] does not cover a [2, 8] result; a packed mask has the "
     "result's leading dimensions and at least 1 byte column(s) (8 elements per byte): pass the mask pl.cmp / "
     "pl.cmps made from same-shape tiles",
     lambda: pl.sel(T(np.zeros((1, 32)), pl.UINT8), T(np.ones((2, 8)), pl.FP32), T(np.ones((2, 8)), pl.FP32),
                    T([[0]], pl.UINT8))),
    (TileTypeError, "pl.tile.sel needs its scratch tile: pl.tile.sel(mask, lhs, rhs, tmp), e.g. tmp = "
     "pl.create_tile([1, 32], pl.UINT8)",
     lambda: pl.sel(T(np.zeros((1, 32)), pl.UINT8), T([[1.0]], pl.FP32), T([[2.0]], pl.FP32))),
    (TileTypeError, "pl.tile.xor needs its scratch tile: pl.tile.xor(lhs, rhs, tmp), e.g. a tile of the "
     "operand's shape and dtype from pl.create_tile",
     lambda: pl.xor(T([[1]], pl.INT32), T([[2]], pl.INT32))),
    (TileTypeError, "pl.tile.ands: the scalar operand is the float 1.5; ands takes an integer scalar",
     lambda: pl.and_(T([[1]], pl.INT32), 1.5)),
    (TileTypeError, "pl.tile.maximums: scalar 2.5 has a fraction but the tile is INT32; use an integer, or cast "
     "the tile to a float type first with pl.cast",
     lambda: pl.maximum(T([[1]], pl.INT32), 2.5)),
    (TileValueError, "pl.tile.cmps: scalar 300 does not fit the tile's INT8 (range -128..127); use a value in "
     "range, or cast the tile to a wider type first with pl.cast",
     lambda: pl.cmp(T([[1]], pl.INT8), 300, cmp_type=0)),
    (TileValueError, "pl.tile.ands: scalar 256 does not fit the tile's UINT8 (range -128..255); use a value in "
     "range, or cast the tile to a wider type first with pl.cast",
     lambda: pl.and_(T([[1]], pl.UINT8), 256)),
    (TileValueError, "pl.tile.shls: shift amount 8 is outside [0, 7] for a INT8 tile; the device result is "
     "undefined there, so clamp the amount first",
     lambda: pl.shl(T([[1]], pl.INT8), 8)),
    (TileValueError, "pl.tile.shrs: shift amount -1 is outside [0, 31] for a INT32 tile; the device result is "
     "undefined there, so clamp the amount first",
     lambda: pl.shrs(T([[1]], pl.INT32), -1)),
    (TileValueError, "pl.tile.shr: shift amount 16 is outside [0, 15] for a INT16 tile; the device result is "
     "undefined there, so clamp the amount first",
     lambda: pl.shr(T([[1, 1]], pl.INT16), T([[3, 16]], pl.INT16))),
    (TileTypeError, "pl.tile.not_: the operand must be a Tile, got ndarray; load tensors into tiles with pl.load "
     "first",
     lambda: pl.tile.not_(np.zeros((2, 2), np.int32))),
    (TileTypeError, "pl.tile.sels: select_mode must be a number or a pl.Scalar, got str",
     lambda: pl.sels(T([[1.0]], pl.FP32), T([[1.0]], pl.FP32), "lhs")),
]


@pytest.mark.parametrize("exc, message, call", ERRORS, ids=range(len(ERRORS)))
def test_error_messages(exc, message, call):
    raises(exc, message, call)


# -- tensor level inside a program ----------------------------------------------------------------------

def test_comparison_family_at_tensor_level():
    def body(x, y, cmp_out, max_out, min_out):
        pl.store(pl.load(pl.cmp(x, y, cmp_type=4), [0, 0], [2, 4]), [0, 0], cmp_out)
        pl.store(pl.load(pl.maximum(x, 0.0), [0, 0], [2, 4]), [0, 0], max_out)
        pl.store(pl.load(pl.tensor.minimum(x, y), [0, 0], [2, 4]), [0, 0], min_out)

    x = np.array([[1.0, -2.0, 3.0, np.nan], [0.0, 5.0, -1.0, 2.0]], np.float32)
    y = np.array([[0.0, 0.0, 3.0, 1.0], [1.0, 1.0, -2.0, 2.0]], np.float32)
    outs = run_in_rank(body, x, y, *(np.zeros((2, 4), np.float32) for _ in range(3)))
    np.testing.assert_array_equal(outs[2], (x > y).astype(np.float32))  # 0/1 in the lhs dtype at tensor level
    np.testing.assert_array_equal(outs[3], np.maximum(x, 0.0))
    np.testing.assert_array_equal(outs[4], np.minimum(x, y))


def test_bitwise_family_at_tensor_level():
    def body(a, b, and_out, xor_out, shr_out, not_out):
        pl.store(pl.load(pl.and_(a, 6), [0, 0], [1, 4]), [0, 0], and_out)
        pl.store(pl.load(pl.xor(a, b), [0, 0], [1, 4]), [0, 0], xor_out)
        pl.store(pl.load(pl.tensor.shr(a, b), [0, 0], [1, 4]), [0, 0], shr_out)
        pl.store(pl.load(pl.not_(a), [0, 0], [1, 4]), [0, 0], not_out)

    a = np.array([[-8, 7, 12, 255]], np.int32)
    b = np.array([[1, 2, 3, 4]], np.int32)
    outs = run_in_rank(body, a, b, *(np.zeros((1, 4), np.int32) for _ in range(4)))
    np.testing.assert_array_equal(outs[2], a & 6)
    np.testing.assert_array_equal(outs[3], a ^ b)
    np.testing.assert_array_equal(outs[4], a >> b)
    np.testing.assert_array_equal(outs[5], ~a)


def test_scalar_forms_at_tensor_level():
    def body(x, a, cmp_out, xors_out, xor_out):
        pl.store(pl.load(pl.cmp(x, 1.0, cmp_type=5), [0, 0], [1, 4]), [0, 0], cmp_out)
        pl.store(pl.load(pl.tensor.xors(a, 5), [0, 0], [1, 4]), [0, 0], xors_out)
        pl.store(pl.load(pl.xor(a, 5), [0, 0], [1, 4]), [0, 0], xor_out)

    x = np.array([[0.5, 1.0, 2.0, np.nan]], np.float16)
    a = np.array([[1, 2, 3, -4]], np.int8)
    outs = run_in_rank(body, x, a, np.zeros((1, 4), np.float16), np.zeros((1, 4), np.int8), np.zeros((1, 4), np.int8))
    np.testing.assert_array_equal(outs[2], [[0, 1, 1, 0]])
    np.testing.assert_array_equal(outs[3], a ^ 5)
    np.testing.assert_array_equal(outs[4], a ^ 5)


def test_tensor_and_tile_operands_do_not_mix():
    def body(a, b):
        pl.maximum(a, pl.load(b, [0, 0], [1, 4]))

    with pytest.raises(Exception) as info:
        run_in_rank(body, np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32))
    assert "pl.maximum: lhs is a tensor but rhs is a Tile; operands must be all tensors or all tiles: pl.load the " \
           "tensor into a tile, or pl.store the tile into a tensor" in str(info.value)


def test_tensor_level_rejects_the_tile_scratch():
    def body(a, b):
        pl.xor(a, b, tmp=a)

    with pytest.raises(Exception) as info:
        run_in_rank(body, np.zeros((1, 4), np.int32), np.zeros((1, 4), np.int32))
    assert "pl.tensor.xor: 'tmp' is tile-level only (the tensor level allocates its own scratch); drop it, or " \
           "call pl.tile.xor on tiles" in str(info.value)
