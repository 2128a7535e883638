"""Reductions and broadcast/expand: ``row_*`` / ``col_*`` reductions, ``*_expand*``, ``expands``, ``expand_clone``,
``fillpad`` / ``fillpad_expand`` against numpy and torch, their valid-shape rules and their exact errors."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from conftest import run_in_rank

import ptodist.language as pl
from ptodist.errors import RankError, TileTypeError, TileValueError
from ptodist.language.ops.expand import PadValue
from ptodist.language.tile_ops import Tile

FLOATS = [pl.FP32, pl.FP16, pl.BF16]
INTS = [pl.INT8, pl.INT16, pl.INT32, pl.INT64, pl.UINT8]
ALL = FLOATS + INTS


def _tile(values, dtype=pl.FP32, valid=None) -> Tile:
    return Tile(np.asarray(values, dtype=np.float64).astype(dtype.np_dtype), dtype, valid)


def _data(dtype, shape=(3, 5), seed=0, low=-4, high=5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype is pl.UINT8:
        low = max(low, 0)
    if dtype.is_float:
        return rng.uniform(low, high, shape).astype(dtype.np_dtype)
    return rng.integers(low, high, shape).astype(dtype.np_dtype)


def _raises(cls, message, fn, *args, **kwargs):
    with pytest.raises(cls, match=f"^{re.escape(message)}$"):
        fn(*args, **kwargs)


# -- reductions ------------------------------------------------------------------------------------------
def _wide(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype.kind == "f" or a.dtype == ml_dtypes.bfloat16 else a.astype(np.int64)


REDUCTIONS = {
    "row_sum": (np.sum, -1), "row_prod": (np.prod, -1), "row_max": (np.max, -1), "row_min": (np.min, -1),
    "col_sum": (np.sum, 0), "col_prod": (np.prod, 0), "col_max": (np.max, 0), "col_min": (np.min, 0),
}
ARG_REDUCTIONS = {"row_argmax": (np.argmax, -1), "row_argmin": (np.argmin, -1),
                  "col_argmax": (np.argmax, 0), "col_argmin": (np.argmin, 0)}


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions_match_numpy(name, dtype):
    fn, axis = REDUCTIONS[name]
    a = _data(dtype, low=-2, high=3) if "prod" in name else _data(dtype)
    got = getattr(pl.tile, name)(Tile(a, dtype))
    want = fn(_wide(a), axis=axis, keepdims=True).astype(dtype.np_dtype)
    assert got.dtype is dtype and got.data.dtype == dtype.np_dtype
    assert got.shape == ([3, 1] if axis == -1 else [1, 5])
    np.testing.assert_array_equal(got.data, want)
    np.testing.assert_array_equal(getattr(pl, name)(Tile(a, dtype)).data, want)  # pl.<op> dispatches alike


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(ARG_REDUCTIONS))
def test_arg_reductions_give_int32_first_occurrence(name, dtype):
    fn, axis = ARG_REDUCTIONS[name]
    a = _data(dtype, low=0, high=3)  # few distinct values: ties are everywhere
    got = getattr(pl.tile, name)(Tile(a, dtype), Tile(a.copy(), dtype))
    assert got.dtype is pl.INT32 and got.data.dtype == np.int32
    np.testing.assert_array_equal(got.data, fn(a.astype(np.float64), axis=axis, keepdims=True))
    np.testing.assert_array_equal(getattr(pl, name)(Tile(a, dtype)).data, got.data)


def test_arg_reductions_match_torch(torch):
    a = _data(pl.FP32, shape=(4, 6), seed=3)
    t = torch.from_numpy(a)
    np.testing.assert_array_equal(pl.row_argmax(Tile(a)).data[:, 0], t.argmax(dim=1).numpy())
    np.testing.assert_array_equal(pl.row_argmin(Tile(a)).data[:, 0], t.argmin(dim=1).numpy())
    np.testing.assert_array_equal(pl.col_argmax(Tile(a)).data[0], t.argmax(dim=0).numpy())
    np.testing.assert_array_equal(pl.col_argmin(Tile(a)).data[0], t.argmin(dim=0).numpy())


def test_integer_reductions_wrap_like_c():
    np.testing.assert_array_equal(pl.row_sum(_tile([[100, 100, 100]], pl.INT8)).data, [[44]])
    np.testing.assert_array_equal(pl.col_sum(_tile([[200], [100]], pl.UINT8)).data, [[44]])
    np.testing.assert_array_equal(pl.row_prod(_tile([[16, 16]], pl.INT8)).data, [[0]])
    np.testing.assert_array_equal(pl.col_prod(_tile([[-128], [-1]], pl.INT8)).data, [[-128]])
    big = np.iinfo(np.int32).max
    np.testing.assert_array_equal(pl.row_sum(_tile([[big, 1]], pl.INT32)).data, [[-big - 1]])
    i64 = Tile(np.array([[np.iinfo(np.int64).max, 1]], np.int64))
    np.testing.assert_array_equal(pl.row_sum(i64).data, [[np.iinfo(np.int64).min]])


def test_low_precision_sums_accumulate_in_fp32_and_round_once():
    # 2048 + 1 + 1 in FP16 step by step stays 2048 (the spacing there is 2); accumulated in FP32 it is 2050.
    assert pl.row_sum(_tile([[2048, 1, 1]], pl.FP16)).data.tolist() == [[2050.0]]
    b = pl.col_sum(_tile([[256], [1], [1]], pl.BF16))
    assert b.dtype is pl.BF16 and b.data.dtype == ml_dtypes.bfloat16 and float(b.data[0, 0]) == 258.0
    assert float(pl.row_sum(_tile([[1, 2 ** -9]], pl.BF16)).data[0, 0]) == 1.0  # rounded back to BF16


def test_nan_propagates_through_max_and_wins_argmax():
    a = _tile([[1, math.nan, 3], [4, 5, 6]])
    assert np.isnan(pl.row_max(a).data[0, 0]) and pl.row_max(a).data[1, 0] == 6
    assert np.isnan(pl.col_min(a).data[0, 1])
    assert pl.row_argmax(a).data.tolist() == [[1], [2]]
    assert pl.row_argmin(a).data.tolist() == [[1], [0]]


def test_reductions_read_only_the_valid_region_and_keep_its_extent():
    # The device's TROW*/TCOL* read the source's valid rows and columns only: a zero pad cannot win a max.
    t = Tile(np.array([[-3, -1, 0, 0], [-7, -2, 0, 0], [9, 9, 9, 9]], np.float32), pl.FP32, (2, 2))
    m = pl.row_max(t)
    assert m.shape == [3, 1] and m.valid_shape == (2, 1) and m.data.tolist() == [[-1], [-2], [0]]
    s = pl.col_sum(t)
    assert s.shape == [1, 4] and s.valid_shape == (1, 2) and s.data.tolist() == [[-10, -3, 0, 0]]
    assert pl.row_argmax(t).valid_shape == (2, 1) and pl.row_argmax(t).data.tolist() == [[1], [1], [0]]
    assert pl.col_argmin(t).valid_shape == (1, 2) and pl.col_argmin(t).data.tolist() == [[1, 1, 0, 0]]
    assert pl.row_prod(t).data[:2, 0].tolist() == [3, 14]
    # fillpad makes the whole tile valid: from then on the pad value takes part.
    f = pl.fillpad(t, PadValue.zero)
    assert pl.row_max(f).valid_shape == (3, 1) and pl.row_max(f).data.tolist() == [[0], [0], [0]]
    assert pl.row_max(pl.fillpad(t, PadValue.min)).data[:2, 0].tolist() == [-1, -2]
    empty = Tile(np.ones((2, 3), np.float32), pl.FP32, (2, 0))
    assert pl.row_sum(empty).data.tolist() == [[0], [0]] and pl.row_sum(empty).valid_shape == (2, 1)


def test_row_reductions_of_higher_rank_tiles_collapse_the_last_axis():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(pl.row_sum(Tile(a)).data, a.sum(axis=-1, keepdims=True))
    np.testing.assert_array_equal(pl.col_max(Tile(a)).data, a.max(axis=0, keepdims=True))
    assert pl.row_max(Tile(np.array([3, 9, 1], np.float32))).data.tolist() == [9]


def test_tmp_tile_is_accepted_and_checked_as_upstream_does():
    a = _tile([[1, 2], [3, 4]])
    assert pl.row_sum(a, _tile(np.zeros((4, 8)))).data.tolist() == [[3], [7]]
    assert pl.tile.row_max(a, tmp_tile=_tile(np.zeros((2, 2)))).data.tolist() == [[2], [4]]
    assert pl.col_sum(a, _tile(np.zeros((1, 1)))).data.tolist() == [[4, 6]]
    assert pl.col_argmax(a, _tile(np.zeros((1, 1)), pl.INT32)).data.tolist() == [[1, 1]]
    _raises(TileValueError, "pl.tile.row_sum: tmp_tile has shape [1, 2], the input [2, 2]: tmp_tile must have the "
            "input's rank and every dimension at least the input's", pl.row_sum, a, _tile([[0, 0]]))
    _raises(TileValueError, "pl.tile.row_argmax: tmp_tile has shape [2, 3], the input [2, 2]: tmp_tile must have "
            "exactly the input's shape", pl.row_argmax, a, _tile(np.zeros((2, 3))))
    _raises(TileTypeError, "pl.tile.row_prod: tmp_tile is FP16 but the input is FP32; the scratch tile must have "
            "the input's dtype", pl.tile.row_prod, a, _tile(np.zeros((2, 2)), pl.FP16))
    _raises(TileTypeError, "pl.tile.col_sum: tmp_tile is INT32 but the input is FP32; the scratch tile must have "
            "the input's dtype", pl.col_sum, a, _tile(np.zeros((2, 2)), pl.INT32))
    _raises(TileTypeError, "pl.tile.row_min: tmp_tile must be a Tile, got float; pass a scratch tile "
            "(pl.create_tile) or leave it out", pl.row_min, a, 0.0)


def test_reduction_errors():
    _raises(TileTypeError, "pl.tile.col_sum takes a Tile of at least two dimensions (it collapses the first, "
            "column axis), got Tile(shape=[3], dtype=FP32)", pl.col_sum, Tile(np.zeros(3, np.float32)))
    _raises(TileTypeError, "pl.tile.row_prod takes a Tile of at least one dimension, got list",
            pl.tile.row_prod, [1, 2])
    _raises(TileTypeError, "pl.tile.row_argmax: argument 1 is a BOOL tile, but row_argmax takes FP32, FP16, BF16, "
            "INT8, INT16, INT32, INT64, UINT8 tiles; convert it first with pl.cast(tile, target_type=pl.<dtype>)",
            pl.row_argmax, Tile(np.zeros((2, 2), np.bool_)))
    _raises(TileTypeError, "pl.col_max takes tensors or tiles, got list: pass tensors (pl.tensor level), tiles "
            "(pl.tile level; pl.load a region of a tensor into a tile)", pl.col_max, [[1.0]])


# -- broadcast and expand --------------------------------------------------------------------------------
ROW_EXPAND = {"row_expand_add": np.add, "row_expand_sub": np.subtract, "row_expand_mul": np.multiply,
              "row_expand_div": None, "row_expand_max": np.maximum, "row_expand_min": np.minimum}
COL_EXPAND = {k.replace("row", "col"): f for k, f in ROW_EXPAND.items()}


def _c_div(x, y):
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q)


def _reference(fn, a, v, dtype):
    if fn is None:  # division
        if dtype.is_float:
            return (a / v).astype(dtype.np_dtype)
        return _c_div(a.astype(np.int64), v.astype(np.int64)).astype(dtype.np_dtype)
    return fn(a, v).astype(dtype.np_dtype)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("name", [*ROW_EXPAND, *COL_EXPAND])
def test_fused_expands_match_numpy_broadcasting(name, dtype):
    fn = {**ROW_EXPAND, **COL_EXPAND}[name]
    a = _data(dtype, seed=1)
    vshape = (3, 1) if name.startswith("row") else (1, 5)
    v = _data(dtype, vshape, seed=2, low=1, high=4)
    got = getattr(pl.tile, name)(Tile(a, dtype), Tile(v, dtype))
    assert got.dtype is dtype and got.shape == [3, 5]
    np.testing.assert_array_equal(got.data, _reference(fn, a, v, dtype))
    np.testing.assert_array_equal(getattr(pl, name)(Tile(a, dtype), Tile(v, dtype)).data, got.data)


def test_integer_expand_arithmetic_wraps_and_truncates():
    a = _tile([[-7, 7, 100]], pl.INT8)
    assert pl.row_expand_div(a, _tile([[2]], pl.INT8)).data.tolist() == [[-3, 3, 50]]
    assert pl.row_expand_add(a, _tile([[100]], pl.INT8)).data.tolist() == [[93, 107, -56]]
    assert pl.col_expand_mul(_tile([[200], [3]], pl.UINT8), _tile([[2]], pl.UINT8)).data.tolist() == [[144], [6]]


def test_row_and_col_expand_broadcast_the_vector():
    for dtype in ALL:
        t = Tile(np.zeros((2, 3), dtype.np_dtype), dtype)
        r = pl.row_expand(t, _tile([[1], [2]], dtype))
        assert r.dtype is dtype and r.data.tolist() == [[1, 1, 1], [2, 2, 2]]
        c = pl.col_expand(t, _tile([[1, 2, 3]], dtype))
        assert c.data.tolist() == [[1, 2, 3], [1, 2, 3]]
        assert pl.tile.col_expand(t, _tile([[1, 2, 3]], dtype)).data.tolist() == c.data.tolist()


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_expdif_is_exp_of_the_difference(dtype):
    a = _data(dtype, seed=4)
    rv, cv = _data(dtype, (3, 1), seed=5), _data(dtype, (1, 5), seed=6)
    r = pl.row_expand_expdif(Tile(a, dtype), Tile(rv, dtype))
    c = pl.col_expand_expdif(Tile(a, dtype), Tile(cv, dtype))
    f32 = a.astype(np.float32)
    np.testing.assert_array_equal(r.data, np.exp(f32 - rv.astype(np.float32)).astype(dtype.np_dtype))
    np.testing.assert_array_equal(c.data, np.exp(f32 - cv.astype(np.float32)).astype(dtype.np_dtype))
    assert r.dtype is dtype and c.dtype is dtype


def test_expand_results_are_valid_where_both_operands_are():
    t = Tile(np.ones((4, 6), np.float32), pl.FP32, (3, 5))
    r = pl.row_expand_sub(t, Tile(np.ones((4, 1), np.float32), pl.FP32, (2, 1)))
    assert r.valid_shape == (2, 5)
    c = pl.col_expand_add(t, Tile(np.ones((1, 6), np.float32), pl.FP32, (1, 4)))
    assert c.valid_shape == (3, 4)
    assert pl.row_expand(t, Tile(np.ones((4, 1), np.float32))).valid_shape == (3, 5)


def test_row_expand_add_takes_an_optional_scratch_tile():
    t, v = _tile([[1, 2]]), _tile([[10]])
    assert pl.row_expand_add(t, v, _tile([[0, 0]])).data.tolist() == [[11, 12]]
    assert pl.tile.row_expand_add(t, v, tmp=_tile([[0, 0]])).data.tolist() == [[11, 12]]


def test_expand_errors():
    t = _tile(np.zeros((2, 3)))
    _raises(TileValueError, "pl.tile.row_expand_mul: row_vec has shape [1, 3], but a [2, 3] tile needs [2, 1] (one "
            "value per row); produce it with pl.row_sum / _max / _min", pl.row_expand_mul, t, _tile([[1, 2, 3]]))
    _raises(TileValueError, "pl.tile.col_expand_sub: col_vec has shape [2, 1], but a [2, 3] tile needs [1, 3] (one "
            "value per column); produce it with pl.col_sum / _max / _min", pl.col_expand_sub, t, _tile([[1], [2]]))
    _raises(TileTypeError, "pl.tile.row_expand_add: the tile is FP32 but the row_vec is FP16; convert one with "
            "pl.cast(..., target_type=pl.FP32)", pl.row_expand_add, t, _tile([[1], [2]], pl.FP16))
    _raises(TileValueError, "pl.tile.row_expand: needs a tile of at least 2 dimensions and a row_vec of the same "
            "rank, got shapes [3] and [1]", pl.tile.row_expand, _tile([1, 2, 3]), _tile([1]))
    _raises(TileTypeError, "pl.tile.col_expand_max: argument 2 must be a Tile, got float; load tensors into tiles "
            "with pl.load first", pl.tile.col_expand_max, t, 1.0)
    _raises(TileTypeError, "pl.tile.row_expand_expdif: argument 1 is a INT32 tile, but row_expand_expdif takes FP32, "
            "FP16, BF16 tiles; convert it first with pl.cast(tile, target_type=pl.<dtype>)",
            pl.row_expand_expdif, _tile([[1]], pl.INT32), _tile([[1]], pl.INT32))
    _raises(TileTypeError, "pl.tile.row_expand_add: tmp must be a Tile, got int; pass a scratch tile or leave it out",
            pl.row_expand_add, t, _tile([[1], [2]]), 3)


def test_expands_fills_the_targets_shape_and_dtype():
    t = Tile(np.arange(6, dtype=np.float32).reshape(2, 3), pl.FP32, (1, 3))
    e = pl.expands(t, 2.5)
    assert e.data.tolist() == [[2.5] * 3] * 2 and e.valid_shape == (1, 3)
    assert pl.tile.expands(t, pl.Scalar(4, pl.INT32)).data.tolist() == [[4.0] * 3] * 2
    assert pl.expands(_tile([[0, 0]], pl.INT8), 300).data.tolist() == [[44, 44]]  # wraps as a C conversion
    assert pl.expands(_tile([[0]], pl.INT32), -2.7).data.tolist() == [[-2]]  # truncates toward zero
    assert pl.expands(_tile([[0]], pl.UINT8), -1).data.tolist() == [[255]]
    b = pl.expands(_tile([[0]], pl.BF16), 1 / 3)
    assert b.dtype is pl.BF16 and b.data[0, 0] == ml_dtypes.bfloat16(1 / 3)
    _raises(TileTypeError, "pl.tile.expands: the value to broadcast must be a number, got str",
            pl.expands, t, "1")
    _raises(TileValueError, "pl.tile.expands: cannot put nan into a INT32 tile; pass a finite number",
            pl.expands, _tile([[0]], pl.INT32), math.nan)
    _raises(TileTypeError, "pl.tile.expands: target must be a Tile, got float; note the order "
            "pl.expands(target, scalar)", pl.tile.expands, 1.0, t)


# -- padding ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_fillpad_writes_each_pad_value_and_makes_the_tile_valid(dtype):
    a = _data(dtype, (3, 4), seed=7)
    t = Tile(a, dtype, (2, 3))
    info = np.iinfo(dtype.np_dtype) if not dtype.is_float else None
    expect = {PadValue.zero: 0, PadValue.max: math.inf if info is None else info.max,
              PadValue.min: -math.inf if info is None else info.min}
    for mode, fill in expect.items():
        f = pl.fillpad(t, mode)
        assert f.dtype is dtype and f.shape == [3, 4] and f.valid_shape == (3, 4)
        want = np.full((3, 4), fill, dtype.np_dtype)
        want[:2, :3] = a[:2, :3]
        np.testing.assert_array_equal(f.data, want)
        np.testing.assert_array_equal(pl.tile.fillpad(t, pad_value=mode).data, want)
    np.testing.assert_array_equal(pl.fillpad(t).data, pl.fillpad(t, PadValue.zero).data)  # zero by default


def test_fillpad_accepts_the_literal_sugars():
    t = Tile(np.ones((2, 2), np.float32), pl.FP32, (1, 1))
    assert pl.fillpad(t, 0).data.tolist() == [[1, 0], [0, 0]]
    assert pl.fillpad(t, math.inf).data.tolist() == [[1, math.inf], [math.inf, math.inf]]
    assert pl.fillpad(t, -math.inf).data[1, 1] == -math.inf
    assert pl.fillpad(t, 0.0).data[0, 1] == 0
    _raises(TileValueError, "pl.tile.fillpad: pad_value=1.5 is not a pad mode; use pl.PadValue.zero, "
            "pl.PadValue.max or pl.PadValue.min (or 0, math.inf, -math.inf): the hardware pads with those three "
            "only", pl.fillpad, t, 1.5)
    _raises(TileValueError, "pl.tile.fillpad: pad_value=<PadValue.null: 0> is not a pad mode; use pl.PadValue.zero, "
            "pl.PadValue.max or pl.PadValue.min (or 0, math.inf, -math.inf): the hardware pads with those three "
            "only", pl.fillpad, t, PadValue.null)


def test_fillpad_expand_copies_the_valid_region_into_a_larger_tile():
    t = Tile(np.array([[1, 2, 9], [3, 4, 9]], np.int16), pl.INT16, (2, 2))
    e = pl.fillpad_expand(t, [3, 4], PadValue.min)
    lo = np.iinfo(np.int16).min
    assert e.shape == [3, 4] and e.valid_shape == (3, 4) and e.dtype is pl.INT16
    assert e.data.tolist() == [[1, 2, lo, lo], [3, 4, lo, lo], [lo, lo, lo, lo]]
    assert pl.tile.fillpad_expand(_tile([[5.0]]), [1, 2]).data.tolist() == [[5, 0]]
    _raises(TileValueError, "pl.tile.fillpad_expand: shape [1, 4] must have the tile's rank (2) and be at least its "
            "shape [2, 3] in every dimension (it only grows a tile; to shrink one use pl.slice)",
            pl.fillpad_expand, t, [1, 4])
    _raises(TileValueError, "pl.tile.fillpad_expand: pad_value=2 is not a pad mode; use pl.PadValue.zero, "
            "pl.PadValue.max or pl.PadValue.min (or 0, math.inf, -math.inf): the hardware pads with those three "
            "only", pl.fillpad_expand, t, [2, 3], 2)


# -- a ragged softmax ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_softmax_over_a_ragged_tile_matches_torch(torch, dtype):
    rng = np.random.default_rng(11)
    x = rng.normal(0, 3, (8, 16)).astype(dtype.np_dtype) - 20  # every real element negative: a zero pad would win
    t = Tile(x.copy(), dtype, (5, 11))
    t.data[5:, :] = 0
    t.data[:, 11:] = 0
    filled = pl.fillpad(t, PadValue.min)
    m = pl.row_max(filled, pl.tile.expands(filled, 0))
    e = pl.row_expand_expdif(filled, m)
    s = pl.row_sum(e)
    y = pl.row_expand_div(e, s)
    want = torch.softmax(torch.from_numpy(x[:5, :11].astype(np.float32)), dim=-1).numpy()
    tol = {pl.FP32: 1e-6, pl.FP16: 2e-3, pl.BF16: 2e-2}[dtype]
    np.testing.assert_allclose(y.data[:5, :11].astype(np.float32), want, atol=tol, rtol=tol)
    assert np.all(y.data[:5, 11:] == 0)  # the padded columns carry no probability
    # Without fillpad the reductions read only the valid region: the same softmax on the valid part.
    m2 = pl.row_max(t)
    e2 = pl.row_expand_expdif(t, m2)
    y2 = pl.row_expand_div(e2, pl.row_sum(e2))
    assert y2.valid_shape == (5, 11)
    np.testing.assert_allclose(y2.data[:5, :11].astype(np.float32), want, atol=tol, rtol=tol)


# -- tensor level inside a real program ------------------------------------------------------------------
def test_reductions_at_tensor_level_in_a_program():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5

    def body(x, rs, cm, am):
        pl.store(pl.load(pl.row_sum(x), [0, 0], [3, 1]), [0, 0], rs)
        pl.store(pl.load(pl.tensor.col_max(x), [0, 0], [1, 4]), [0, 0], cm)
        pl.store(pl.load(pl.row_argmin(x), [0, 0], [3, 1]), [0, 0], am)

    _, rs, cm, am = run_in_rank(body, x, np.zeros((3, 1), np.float32), np.zeros((1, 4), np.float32),
                                np.zeros((3, 1), np.int32))
    np.testing.assert_array_equal(rs, x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(cm, x.max(axis=0, keepdims=True))
    np.testing.assert_array_equal(am, np.zeros((3, 1)))


def test_tensor_column_reductions_collapse_axis_minus_two():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

    def body(x, out):
        pl.store(pl.load(pl.col_sum(x), [0, 0, 0], [2, 1, 4]), [0, 0, 0], out)

    _, out = run_in_rank(body, x, np.zeros((2, 1, 4), np.float32))
    np.testing.assert_array_equal(out, x.sum(axis=-2, keepdims=True))


def test_tmp_tile_is_refused_at_tensor_level():
    x = np.ones((2, 2), np.float32)

    def body(x):
        pl.row_max(x, tmp_tile=pl.load(x, [0, 0], [2, 2]))

    with pytest.raises(RankError, match=re.escape(
            "TileTypeError: pl.tensor.row_max: tmp_tile is tile-level only (at tensor level the scratch is implicit); drop it, "
            "or call pl.tile.row_max on tiles")):
        run_in_rank(body, x)


def test_expand_family_at_tensor_level_in_a_program():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = np.array([[1], [2]], np.float32)
    c = np.arange(3, dtype=np.float32).reshape(1, 1, 3)
    big = np.zeros((1, 4, 3), np.float32)

    def body(x, v, c, big, sub, full, clone, pad):
        pl.store(pl.load(pl.row_expand_sub(x, v), [0, 0], [2, 3]), [0, 0], sub)
        pl.store(pl.load(pl.expands(x, 7.0), [0, 0], [2, 3]), [0, 0], full)
        pl.store(pl.load(pl.expand_clone(c, big), [0, 0, 0], [1, 4, 3]), [0, 0, 0], clone)
        pl.store(pl.load(pl.fillpad(x, PadValue.max), [0, 0], [2, 3]), [0, 0], pad)

    out = run_in_rank(body, x, v, c, big, np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32),
                      np.zeros((1, 4, 3), np.float32), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(out[4], x - v)
    np.testing.assert_array_equal(out[5], np.full((2, 3), 7.0))
    np.testing.assert_array_equal(out[6], np.broadcast_to(c, (1, 4, 3)))
    np.testing.assert_array_equal(out[7], x)  # a whole tensor has no invalid region


def test_expand_clone_is_tensor_only_and_checks_its_shapes():
    assert not hasattr(pl.tile, "expand_clone") and pl.expand_clone is pl.tensor.expand_clone
    _raises(TileTypeError, "pl.expand_clone: argument 1 must be a tensor, got Tile; expand_clone exists at tensor "
            "level only (on tiles use pl.row_expand / pl.col_expand)", pl.expand_clone, _tile([[1]]), _tile([[1]]))

    def body(a, b):
        pl.expand_clone(a, b)

    with pytest.raises(RankError, match=re.escape(
            "TileValueError: pl.tensor.expand_clone: cannot expand [2, 1, 3] to [2, 4, 4]: only one axis may differ, and it must "
            "be of size 1 in the input")):
        run_in_rank(body, np.zeros((2, 1, 3), np.float32), np.zeros((2, 4, 4), np.float32))
    with pytest.raises(RankError, match=re.escape(
            "TileValueError: pl.tensor.expand_clone: input and target must both be 3-D, got [1, 3] and [4, 3]")):
        run_in_rank(body, np.zeros((1, 3), np.float32), np.zeros((4, 3), np.float32))
