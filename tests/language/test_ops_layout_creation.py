"""Shape/layout ops, creation ops, ``pl.array``, and subscripts on tensors and windows inside a rank.

Tile ops are pure, so most tests call ``pl.tile.<op>`` on Tiles built here and check ``pl.<op>`` reaches the
same thing; each family also runs its tensor level inside a real program (``run_in_rank``).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from conftest import on_every_rank, run_in_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.errors import (
    KernelIndexError,
    KernelValueError,
    PtodistError,
    TileIndexError,
    TileTypeError,
    TileValueError,
)
from ptodist.language.ops import REGISTRY
from ptodist.language.ops.creation import Array
from ptodist.language.scalar import Scalar
from ptodist.language.tile_ops import Tile

ALL_DTYPES = [pl.FP32, pl.FP16, pl.BF16, pl.INT8, pl.INT16, pl.INT32, pl.INT64, pl.UINT8, pl.BOOL]


def raises(cls: type, message: str, fn, *args, **kwargs) -> None:
    """``fn(*args, **kwargs)`` raises exactly ``cls`` with exactly ``message``."""
    with pytest.raises(cls, match=f"^{re.escape(message)}$") as info:
        fn(*args, **kwargs)
    assert type(info.value) is cls and isinstance(info.value, PtodistError)


def tile(values, dtype=pl.FP32, valid=None) -> Tile:
    return Tile(np.asarray(values).astype(dtype.np_dtype), dtype, valid)


def sample(shape, dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype is pl.BOOL:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.is_float:
        return rng.standard_normal(shape).astype(dtype.np_dtype)
    info = np.iinfo(dtype.np_dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype.np_dtype)


def same(a: Tile, b: Tile) -> None:
    assert a.dtype is b.dtype and a.shape == b.shape and tuple(a.valid_shape) == tuple(b.valid_shape)
    np.testing.assert_array_equal(a.data, b.data)


# -- registry ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, family, reach", [
    ("transpose", "Shape and layout", "pl"), ("concat", "Shape and layout", "pl"),
    ("reinterpret_view", "Shape and layout", "pl"), ("set_validshape", "Shape and layout", "pl"),
    ("dim", "Shape and layout", "pl"), ("reshape", "Shape and layout", "pl"), ("cast", "Shape and layout", "pl"),
    ("slice", "Shape and layout", "pl"), ("assemble", "Shape and layout", "pl"),
    ("create_tile", "Creation", "pl(t)"), ("create_l1", "Creation", "pl(t)"), ("full", "Creation", "pl(t)"),
    ("arange", "Creation", "pl(t)"), ("random", "Creation", "pl(t)"), ("tri", "Creation", "pl(t)"),
    ("array.create", "Arrays", "array"), ("array.get_element", "Arrays", "array"),
    ("array.update_element", "Arrays", "array"),
])
def test_registered_with_family_reach_and_a_one_line_doc(name, family, reach):
    d = REGISTRY[name]
    assert (d.family, d.reach) == (family, reach)
    assert d.doc and "\n" not in d.doc


def test_spellings_reach_the_tile_ops():
    assert pl.full is pl.tile.full and pl.arange is pl.tile.arange and pl.random is pl.tile.random
    assert pl.tri is pl.tile.tri and pl.create_tile is pl.tile.create_tile and pl.create_l1 is pl.tile.create_l1
    assert not hasattr(pl.tensor, "tri") and not hasattr(pl.tensor, "create_tile")
    assert pl.array.create is REGISTRY["array.create"].fn
    assert not hasattr(pl.tensor, "dim") or pl.tensor.dim is pl.dim
    assert not hasattr(pl.tile, "dim")


# -- transpose -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape, a1, a2", [((3, 5), 0, 1), ((2, 3, 4), 0, 2), ((2, 3, 4), -1, -2), ((4, 4), 1, 1)])
def test_transpose_matches_numpy(dtype, shape, a1, a2):
    x = tile(sample(shape, dtype), dtype)
    out = pl.tile.transpose(x, a1, a2)
    np.testing.assert_array_equal(out.data, np.swapaxes(x.data, a1, a2))
    assert out.dtype is dtype and out.data.flags.c_contiguous
    same(pl.transpose(x, a1, a2), out)


def test_transpose_swaps_the_valid_region():
    x = tile(np.arange(12).reshape(3, 4), valid=(2, 3))
    out = pl.transpose(x, 0, 1)
    assert out.shape == [4, 3] and out.valid_shape == (3, 2)


def test_transpose_errors():
    x = tile(np.zeros((2, 3)))
    raises(TileValueError, "pl.transpose: axis 2 is outside a 2-D operand (axes -2 .. 1); give an axis in that "
           "range (negative axes count from the last)", pl.transpose, x, 2, 0)
    raises(TileTypeError, "pl.transpose: an axis must be an integer, got 0.5", pl.tile.transpose, x, 0.5, 0)
    raises(TileTypeError, "pl.tile.transpose: the argument must be a Tile, got list; load a tensor region into a "
           "tile with pl.load first (or call pl.tensor.transpose on tensors)", pl.tile.transpose, [1], 0, 1)


# -- concat --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_concat_joins_columns(dtype):
    a, b = tile(sample((3, 2), dtype, 1), dtype), tile(sample((3, 5), dtype, 2), dtype)
    out = pl.tile.concat(a, b)
    np.testing.assert_array_equal(out.data, np.concatenate([a.data, b.data], axis=1))
    assert out.dtype is dtype and out.valid_shape == (3, 7)
    same(pl.concat(a, b), out)


def test_concat_valid_region():
    # A full first source: the second's valid columns extend the box; rows are those valid in both.
    a, b = tile(np.ones((4, 2)), valid=(3, 2)), tile(np.ones((4, 3)), valid=(4, 1))
    assert pl.concat(a, b).valid_shape == (3, 3)
    # A short first source: its padding sits between the two, so the box stops at its valid columns.
    a = tile(np.ones((4, 2)), valid=(4, 1))
    assert pl.concat(a, b).valid_shape == (4, 1)


def test_concat_errors():
    raises(TileTypeError, "pl.concat: the sources are FP32 and FP16 tiles; both must have one dtype: convert one "
           "with pl.cast(tile, target_type=pl.FP32)", pl.concat, tile(np.ones((2, 2))), tile(np.ones((2, 2)), pl.FP16))
    raises(TileValueError, "pl.concat: shapes [2, 2] and [3, 2] do not join along the last axis: they need the same "
           "rank and the same size in every dimension but the last", pl.concat, tile(np.ones((2, 2))),
           tile(np.ones((3, 2))))


# -- reinterpret_view ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("src, dst", [(pl.FP32, pl.INT32), (pl.FP32, pl.INT16), (pl.INT16, pl.FP32),
                                      (pl.BF16, pl.INT16), (pl.FP16, pl.UINT8), (pl.INT8, pl.UINT8),
                                      (pl.INT64, pl.FP32)])
def test_reinterpret_view_keeps_the_bytes(src, dst):
    x = tile(sample((2, 8), src), src)
    out = pl.tile.reinterpret_view(x, dst)
    expect = x.data.view(dst.np_dtype)
    assert out.dtype is dst and out.shape == list(expect.shape)
    np.testing.assert_array_equal(out.data.view(np.uint8), expect.view(np.uint8))
    same(pl.reinterpret_view(x, dst), out)


def test_reinterpret_view_with_shape_and_valid_tail():
    x = tile(np.arange(8, dtype=np.float32).reshape(2, 4))
    out = pl.reinterpret_view(x, pl.INT16, shape=[4, 4])
    assert out.shape == [4, 4] and out.data.tobytes() == x.data.tobytes()
    part = tile(np.ones((2, 4)), valid=(1, 3))
    assert pl.reinterpret_view(part, pl.INT16).valid_shape == (1, 6)


def test_reinterpret_view_errors():
    x = tile(np.ones((2, 3)))
    raises(TileValueError, "pl.reinterpret_view: the operand is already FP32; reinterpret_view changes the dtype (to "
           "reshape without changing it, call pl.reshape)", pl.reinterpret_view, x, pl.FP32)
    raises(TileValueError, "pl.reinterpret_view: the last dimension of [2, 3] INT8 (3 bytes) does not split into "
           "whole INT16 elements (2 bytes each); pass shape=[...] with the same byte size", pl.reinterpret_view,
           tile(np.ones((2, 3)), pl.INT8), pl.INT16)
    raises(TileValueError, "pl.reinterpret_view: shape [5] of INT32 is 20 bytes, but the FP32 operand [2, 3] is 24 "
           "bytes; give a shape of the same byte size", pl.reinterpret_view, x, pl.INT32, shape=[5])
    raises(TileTypeError, "pl.reinterpret_view: dtype must be a pl dtype (pl.INT32, pl.FP16, ...), got 'int32'",
           pl.reinterpret_view, x, "int32")
    raises(TileValueError, "pl.reinterpret_view: the INT8 tile [2, 4] is valid only in [2, 3], and no leading box of "
           "the INT16 view [2, 2] covers those same bytes; fill the padding first (pl.fillpad) or reinterpret a fully "
           "valid tile", pl.reinterpret_view, tile(np.ones((2, 4)), pl.INT8, (2, 3)), pl.INT16)


# -- set_validshape ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_set_validshape_moves_no_data(dtype):
    x = tile(sample((4, 6), dtype), dtype)
    out = pl.tile.set_validshape(x, 3, 2)
    assert out.valid_shape == (3, 2) and out.dtype is dtype
    np.testing.assert_array_equal(out.data, x.data)
    same(pl.set_validshape(x, [3, 2]), out)
    assert pl.set_validshape(out, 4, 6).valid_shape == (4, 6)  # widened back: the whole tile is valid again
    assert pl.set_validshape(x, Scalar(1, pl.INDEX), 0).valid_shape == (1, 0)


def test_set_validshape_errors():
    x = tile(np.ones((4, 6)))
    raises(TileValueError, "pl.set_validshape: valid shape [5, 2] does not fit the [4, 6] tile; give 2 extents, each "
           "between 0 and that dimension's size", pl.set_validshape, x, 5, 2)
    raises(TileValueError, "pl.set_validshape(tile, rows, cols) takes a 2-D tile, got [2, 2, 2]; for 3-D give one "
           "extent per dimension: set_validshape(tile, [...])", pl.set_validshape, tile(np.ones((2, 2, 2))), 1, 1)
    raises(TileTypeError, "pl.set_validshape: give the valid rows and columns, set_validshape(tile, rows, cols), or "
           "one extent per dimension, set_validshape(tile, [rows, cols])", pl.set_validshape, x, 3)


# -- reshape / cast / slice / assemble (existing ops, both levels) -------------------------------------------
def test_reshape_cast_slice_assemble_tiles():
    a = tile(np.arange(12).reshape(3, 4))
    same(pl.reshape(a, [4, 3]), pl.tile.reshape(a, [4, 3]))
    c = pl.cast(tile([1.5, 2.5, -0.5]), pl.INT32)
    assert c.data.tolist() == [2, 2, 0] and c.dtype is pl.INT32
    assert pl.slice(a, [2, 2], [1, 1]).data.tolist() == [[5, 6], [9, 10]]
    out = pl.assemble(pl.full([3, 4], pl.FP32, 0.0), pl.full([1, 2], pl.FP32, 9.0), [2, 1])
    assert out.data[2].tolist() == [0, 9, 9, 0]


def test_layout_ops_at_tensor_level_in_a_rank():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)

    def body(x, t_out, c_out, r_out, k_out, s_out, a_out, v_out):
        pl.store(pl.load(pl.transpose(x, 0, 1), [0, 0], [4, 3]), [0, 0], t_out)
        pl.store(pl.load(pl.concat(x, x), [0, 0], [3, 8]), [0, 0], c_out)
        pl.store(pl.load(pl.reshape(x, [2, 6]), [0, 0], [2, 6]), [0, 0], r_out)
        pl.store(pl.load(pl.cast(x, pl.INT32), [0, 0], [3, 4]), [0, 0], k_out)
        s = x[1:3, :]  # a view: reads go through pl.load
        pl.store(pl.load(s, [0, 0], [2, 4]), [0, 0], s_out)
        pl.store(pl.load(pl.slice(x, [2, 2], [0, 2]), [0, 0], [2, 2]), [0, 0], s_out[0:2, 0:2])
        pl.store(pl.load(pl.set_validshape(x, 2, 3), [0, 0], [3, 4]), [0, 0], v_out)
        # Tensor-level assemble writes into its target in place and returns it.
        pl.store(pl.load(pl.assemble(x, pl.full([1, 2], pl.FP32, -1.0), [0, 0]), [0, 0], [3, 4]), [0, 0], a_out)

    outs = run_in_rank(body, x, np.zeros((4, 3), np.float32), np.zeros((3, 8), np.float32),
                       np.zeros((2, 6), np.float32), np.zeros((3, 4), np.int32), np.zeros((2, 4), np.float32),
                       np.zeros((3, 4), np.float32), np.full((3, 4), 7, np.float32))
    x_after, t, c, r, k, s, a, v = outs
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(c, np.concatenate([x, x], axis=1))
    np.testing.assert_array_equal(r, x.reshape(2, 6))
    np.testing.assert_array_equal(k, x.astype(np.int32))
    np.testing.assert_array_equal(s[:, 2:], x[1:3, 2:])
    np.testing.assert_array_equal(s[:, :2], x[0:2, 2:4])
    expect = x.copy()
    expect[0, :2] = -1
    np.testing.assert_array_equal(a, expect)
    np.testing.assert_array_equal(x_after, expect)
    # A tensor has no valid region: the result is a fresh tensor whose padding is zero.
    expect = np.zeros((3, 4), np.float32)
    expect[:2, :3] = x[:2, :3]
    np.testing.assert_array_equal(v, expect)


def test_reinterpret_view_of_a_tensor_is_a_view():
    x = np.array([[1.0, -2.0]], np.float32)

    def body(x, bits):
        v = pl.reinterpret_view(x, pl.INT32)
        pl.store(pl.load(v, [0, 0], [1, 2]), [0, 0], bits)
        pl.store(pl.full([1, 1], pl.INT32, 0x3F800000), [0, 1], v)  # writes through: x[0, 1] becomes 1.0

    x_out, bits = run_in_rank(body, x, np.zeros((1, 2), np.int32))
    np.testing.assert_array_equal(bits, x.view(np.int32))
    assert x_out.tolist() == [[1.0, 1.0]]


def test_dim_reads_a_tensor_dimension():
    def body(x, out):
        d0, d1 = pl.dim(x, 0), pl.tensor.dim(x, -1)
        assert d0.dtype is pl.INT64 and (d0.value, d1.value) == (3, 5)
        pl.write(out, [0], d0)
        pl.write(out, [1], d1)

    _, out = run_in_rank(body, np.zeros((3, 5), np.float32), np.zeros(2, np.int64))
    assert out.tolist() == [3, 5]


def test_dim_errors():
    raises(TileTypeError, "pl.dim takes a tensor, got a Tile: a tile's shape is static, read it as tile.shape[axis]",
           pl.dim, tile(np.ones(2)), 0)

    def body(x):
        pl.dim(x, 2)

    with pytest.raises(RankError, match=re.escape("pl.dim: axis 2 is outside a 2-D operand (axes -2 .. 1)")):
        run_in_rank(body, np.zeros((3, 5), np.float32))


# -- full / create_tile / create_l1 --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_full_both_argument_orders(dtype):
    a = pl.tile.full([2, 3], dtype, 1)
    same(pl.full([2, 3], 1, dtype), a)
    same(pl.full([2, 3], dtype=dtype, value=1), a)
    np.testing.assert_array_equal(a.data, np.ones((2, 3), dtype.np_dtype))
    assert (pl.full([2], dtype=dtype).data == 0).all()


def test_full_integer_values_wrap_and_floats_round_in_the_dtype():
    assert pl.full([2], pl.INT8, 300).data.tolist() == [44, 44]
    assert pl.full([1], pl.UINT8, -1).data.tolist() == [255]
    assert pl.full([1], pl.BF16, 1.00390625).data.astype(np.float32).tolist() == [1.0]  # BF16 keeps 8 bits
    assert np.isnan(pl.full([1], pl.FP16, float("nan")).data[0])
    assert pl.full([1], pl.INT32, Scalar(-7, pl.INT32)).data.tolist() == [-7]
    raises(TileValueError, "pl.full: value 1.5 is not an integer, but the dtype is INT32; give an integer, or a float "
           "dtype", pl.full, [1], pl.INT32, 1.5)
    raises(TileTypeError, "pl.full: dtype must be a pl dtype (pl.FP32, pl.INT32, ...), got 'x'", pl.full, [1], "x",
           1.0)
    raises(TileTypeError, "pl.full: shape [2, 'a'] holds 'a'; sizes are integers", pl.full, [2, "a"], pl.FP32, 0.0)


@pytest.mark.parametrize("fn", [pl.create_tile, pl.create_l1])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_create_tile_and_l1_allocate_zeroed_tiles(fn, dtype):
    t = fn([2, 4], dtype)
    assert t.dtype is dtype and t.shape == [2, 4] and not t.data.any()


def test_create_tile_keywords():
    assert pl.create_tile([1, 2], dtype=pl.FP16, target_memory="Vec").dtype is pl.FP16
    assert pl.create_l1([4, 2], pl.BF16, transpose=True).shape == [4, 2]


def test_creation_at_tensor_level_in_a_rank():
    def body(f, a):
        pl.store(pl.load(pl.tensor.full([2, 3], pl.INT16, -3), [0, 0], [2, 3]), [0, 0], f)
        pl.store(pl.load(pl.tensor.arange(10, [1, 4]), [0, 0], [1, 4]), [0, 0], a)

    f, a = run_in_rank(body, np.zeros((2, 3), np.int16), np.zeros((1, 4), np.int32))
    assert (f == -3).all() and a.tolist() == [[10, 11, 12, 13]]


# -- arange --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [pl.INT16, pl.INT32])
@pytest.mark.parametrize("start, shape, descending", [(0, [1, 8], False), (-3, [1, 5], False),
                                                      (7, [1, 1, 4], True), (Scalar(2, pl.INT32), [1, 3], False)])
def test_arange_matches_numpy(dtype, start, shape, descending):
    out = pl.tile.arange(start, shape, dtype, descending)
    s = int(start)
    expect = (s - np.arange(shape[-1]) if descending else s + np.arange(shape[-1])).astype(dtype.np_dtype)
    assert out.dtype is dtype and out.shape == shape
    np.testing.assert_array_equal(out.data.reshape(-1), expect)
    same(pl.arange(start, shape, dtype, descending=descending), out)


def test_arange_wraps_like_c():
    assert pl.arange(32766, [1, 3], pl.INT16).data.tolist() == [[32766, 32767, -32768]]


def test_arange_errors():
    raises(TileValueError, "pl.arange: shape [2, 4] must be [1, ..., N] with N > 1: the sequence fills one row (the "
           "leading dimensions are 1 and the last is longer than 1), e.g. [1, 16]", pl.arange, 0, [2, 4])
    raises(TileTypeError, "pl.arange: dtype FP32 is not supported; use one of INT16, INT32", pl.arange, 0, [1, 4],
           pl.FP32)
    raises(TileTypeError, "pl.arange: start must be an integer, got 1.5", pl.arange, 1.5, [1, 4])


# -- random --------------------------------------------------------------------------------------------------
def test_random_is_philox4x32_10():
    # The Random123 known answer: key (a4093822, 299f31d0), counter (243f6a88, 85a308d3, 13198a2e, 03707344).
    out = pl.tile.random(0xA4093822, 0x299F31D0, 0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, [1, 4],
                         dtype=pl.INT32)
    assert out.data.view(np.uint32).tolist() == [[0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]]
    zero = pl.random(0, 0, 0, 0, 0, 0, [4], dtype=pl.INT32)
    assert zero.data.view(np.uint32).tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_random_streams_by_counter_and_is_reproducible():
    a = pl.random(1, 2, 3, 4, 5, 6, [3, 4], dtype=pl.INT32)
    same(a, pl.random(1, 2, 3, 4, 5, 6, [3, 4], dtype=pl.INT32))
    # Elements 4..7 are the next counter's block: the stream from counter0 + 1.
    b = pl.random(1, 2, 4, 4, 5, 6, [2, 4], dtype=pl.INT32)
    np.testing.assert_array_equal(a.data.reshape(-1)[4:12], b.data.reshape(-1))
    seven = pl.random(1, 2, 3, 4, 5, 6, [3, 4], dtype=pl.INT32, rounds=7)
    assert (seven.data != a.data).any()
    # A carry out of counter0 runs into counter1.
    c = pl.random(1, 2, 0xFFFFFFFF, 0, 0, 0, [8], dtype=pl.INT32)
    np.testing.assert_array_equal(c.data[4:], pl.random(1, 2, 0, 1, 0, 0, [4], dtype=pl.INT32).data)


def test_random_errors():
    raises(TileTypeError, "pl.random: upstream's default dtype UINT32 does not exist in ptodist; pass dtype=pl.INT32 "
           "(the same 32 random bits, read as signed)", pl.random, 0, 0, 0, 0, 0, 0, [4])
    raises(TileTypeError, "pl.random: dtype FP32 is not supported; use one of INT32", pl.random, 0, 0, 0, 0, 0, 0,
           [4], pl.FP32)
    raises(TileValueError, "pl.random: rounds=8; the cipher runs 7 or 10 rounds", pl.random, 0, 0, 0, 0, 0, 0, [4],
           pl.INT32, 8)


# -- tri -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [pl.INT8, pl.UINT8, pl.INT16, pl.INT32, pl.FP16, pl.BF16, pl.FP32])
@pytest.mark.parametrize("upper, diagonal", [(False, 0), (True, 0), (False, 2), (True, -1), (False, -16),
                                             (True, 33), (False, 32), (True, -16)])
def test_tri_matches_tril_and_triu(dtype, upper, diagonal):
    out = pl.tile.tri(diagonal, [16, 32], dtype=dtype, upper=upper)
    ones = np.ones((16, 32))
    expect = np.triu(ones, diagonal) if upper else np.tril(ones, diagonal)
    assert out.dtype is dtype
    np.testing.assert_array_equal(out.data.astype(np.float64), expect)
    same(pl.tri(diagonal, [16, 32], dtype=dtype, upper=upper), out)


@pytest.mark.parametrize("valid", [(9, 32), (16, 21), (9, 21), (1, 1)])
def test_tri_writes_only_the_valid_region(valid):
    out = pl.tri(Scalar(1, pl.INT32), [16, 32], valid_shape=list(valid))
    expect = np.zeros((16, 32))
    expect[: valid[0], : valid[1]] = np.tril(np.ones(valid), 1)
    np.testing.assert_array_equal(out.data, expect)
    assert out.valid_shape == valid


def test_tri_stores_in_a_program():
    def body(out):
        pl.store(pl.tri(0, [4, 4], dtype=pl.INT32, upper=True, valid_shape=[3, 4]), [0, 0], out)

    (out,) = run_in_rank(body, np.full((4, 4), 5, np.int32))
    expect = np.triu(np.ones((4, 4), np.int32))
    expect[3] = 5  # a store writes the valid part only
    np.testing.assert_array_equal(out, expect)


def test_tri_errors():
    raises(TileTypeError, "pl.tri: dtype INT64 is not supported; use one of INT8, UINT8, INT16, INT32, FP16, BF16, "
           "FP32", pl.tri, 0, [2, 2], dtype=pl.INT64)
    raises(TileValueError, "pl.tri: shape [2, 2, 2] must be 2-D [rows, cols]", pl.tri, 0, [2, 2, 2])
    raises(TileValueError, "pl.tri: valid_shape [3, 2] does not fit the [2, 2] tile; give [rows, cols] no larger "
           "than the shape", pl.tri, 0, [2, 2], valid_shape=[3, 2])
    raises(TileTypeError, "pl.tri: diagonal must be an integer, got 0.5", pl.tri, 0.5, [2, 2])


# -- pl.array ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [pl.INT8, pl.INT16, pl.INT32, pl.INT64, pl.UINT8, pl.INDEX, pl.FP32, pl.FP16,
                                   pl.BF16, pl.BOOL])
def test_array_create_get_update(dtype):
    arr = pl.array.create(4, dtype)
    assert isinstance(arr, Array) and len(arr) == 4 and arr.dtype is dtype and Array[4, dtype] is Array
    assert pl.array.get_element(arr, 2).value == 0
    new = pl.array.update_element(arr, 2, 1)
    assert pl.array.get_element(arr, 2).value == 0  # functional: the old array is unchanged
    got = pl.array.get_element(new, Scalar(2, pl.INDEX))
    assert isinstance(got, Scalar) and got.dtype is dtype and got.value == 1


def test_array_subscripts_read_and_update():
    arr = pl.array.create(3, pl.INT32)
    for i in range(3):
        arr[i] = 10 * i
    assert [arr[i].value for i in range(3)] == [0, 10, 20]
    arr[Scalar(1, pl.INDEX)] = Scalar(-5, pl.INT32)
    assert arr[1].value == -5


def test_array_integers_wrap_and_floats_round_in_the_dtype():
    arr = pl.array.create(2, pl.INT8)
    arr[0] = 200
    assert arr[0].value == -56
    f = pl.array.create(1, pl.BF16)
    f[0] = 1.00390625
    assert f[0].value == 1.0


def test_array_errors():
    arr = pl.array.create(3, pl.INT32)
    raises(TileIndexError, "pl.array.get_element: index 3 is outside the array of 3 INT32 elements (indices 0 .. 2)",
           arr.__getitem__, 3)
    raises(TileIndexError, "pl.array.update_element: index -1 is outside the array of 3 INT32 elements (indices "
           "0 .. 2)", pl.array.update_element, arr, -1, 0)
    raises(TileValueError, "pl.array.update_element: value 1.5 is not an integer, but the array is INT32; convert it "
           "first (pl.cast)", pl.array.update_element, arr, 0, 1.5)
    raises(TileValueError, "pl.array.create: extent must be a positive integer, got 0", pl.array.create, 0, pl.INT32)
    raises(TileTypeError, "pl.array.create: dtype FP8E4M3FN is not supported; use one of INT8, INT16, INT32, INT64, "
           "UINT8, BOOL, INDEX, FP16, BF16, FP32, TASK_ID", pl.array.create, 2, pl.FP8E4M3FN)
    raises(TileTypeError, "pl.array.get_element: the first argument must be an array from pl.array.create, got list",
           pl.array.get_element, [1], 0)
    raises(TileTypeError, "pl.array.get_element: the index must be an integer, got 'a'", pl.array.get_element, arr,
           "a")


# -- subscripts on tensors and windows -----------------------------------------------------------------------
def test_subscript_reads_and_slice_assignment_in_a_rank():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)

    def body(x, out, row):
        out[0:2, 0:8] = x[2:4, :]          # tensor -> tensor region
        out[2:4, 0:4] = pl.load(x, [0, 0], [2, 4])  # tile -> tensor region
        out[3, 4:8] = pl.full([1, 4], pl.FP32, -1.0)  # a [1, 4] tile into a 1-D row region
        row[0:8] = x[1]                    # an integer index drops the dimension

    _, out, row = run_in_rank(body, x, np.zeros((4, 8), np.float32), np.zeros(8, np.float32))
    np.testing.assert_array_equal(out[0:2], x[2:4])
    np.testing.assert_array_equal(out[2:4, 0:4], x[0:2, 0:4])
    assert out[3, 4:].tolist() == [-1.0] * 4 and (out[2, 4:] == 0).all()
    np.testing.assert_array_equal(row, x[1])


def test_slice_assignment_stores_only_the_valid_part():
    def body(out):
        out[0:2, 0:3] = pl.set_validshape(pl.full([2, 3], pl.INT32, 9), 1, 2)

    (out,) = run_in_rank(body, np.zeros((2, 3), np.int32))
    assert out.tolist() == [[9, 9, 0], [0, 0, 0]]


def _in_rank_error(body, *arrays) -> str:
    with pytest.raises(RankError) as info:
        run_in_rank(body, *arrays)
    return str(info.value)


@pytest.mark.parametrize("subscript, message", [
    (lambda x: x[0:5, :], "subscript [0:5] in dimension 0 is outside [0, 4]; a region must lie inside the tensor "
                          "(0 <= start <= stop <= 4)"),
    (lambda x: x[4], "index 4 in dimension 0 is outside [0, 4); give an index in that range"),
    (lambda x: x[0:4:2], "subscript 0:4:2 in dimension 0 has step 2; regions are contiguous (step 1); copy strided "
                         "data with pl.load"),
    (lambda x: x[0, 0, 0], "3 subscripts for 2 dimensions"),
])
def test_subscript_errors(subscript, message):
    line = subscript.__code__.co_firstlineno  # the user's line, where the subscript is written
    assert f"tensor 'a0' [4, 8] FP32 at {__file__}:{line}: {message}" in \
        _in_rank_error(lambda x: subscript(x), np.zeros((4, 8), np.float32))


def test_slice_assignment_errors():
    def shape_mismatch(x):
        x[0:2, 0:4] = pl.full([2, 3], pl.FP32, 0.0)

    assert ("tensor 'a0[0:2, 0:4]' [2, 4] FP32 = a [2, 3] FP32 value: the shapes differ; the value must have the "
            "region's shape [2, 4] (dimensions of size 1 aside)") in _in_rank_error(shape_mismatch,
                                                                                   np.zeros((4, 8), np.float32))

    def not_a_tile(x):
        x[0:2, 0:4] = 1.0

    assert ("tensor 'a0' [4, 8] FP32[0:2, 0:4] = ...: the value must be a tile or a tensor, got float; build a tile "
            "first (pl.full(shape, value, dtype))") in _in_rank_error(not_a_tile, np.zeros((4, 8), np.float32))

    def wrong_dtype(x):
        x[0:1, 0:2] = pl.full([1, 2], pl.INT32, 0)

    assert "the tile is INT32 but tensor 'a0[0:1, 0:2]' [1, 2] FP32 is FP32" in _in_rank_error(
        wrong_dtype, np.zeros((4, 8), np.float32))


def test_subscript_outside_a_program_is_refused():
    from ptodist.rank.tensors import RankTensor

    t = RankTensor("t", np.zeros((2, 2), np.float32), pl.FP32)
    assert t[0:1, :].shape == [1, 2] and t[1].shape == [2] and t[..., 1].shape == [2] and t[...].shape == [2, 2]
    assert t[-1].shape == [2] and t[-1:, :].shape == [1, 2]
    with pytest.raises(PtodistError, match=r"pl\.store\(\) called outside a program"):
        t[0:1, :] = pl.full([1, 2], pl.FP32, 0.0)


def test_slice_assignment_into_a_read_only_input_is_refused():
    def kernel(x: pl.Tensor[[2, 4], pl.FP32], y: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        x[0:1, :] = pl.full([1, 4], pl.FP32, 0.0)
        return y

    k = pl.jit.incore(kernel)

    def orch(x: pl.Tensor[[2, 4], pl.FP32], y: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        return k(x, y)

    o = pl.jit(orch)

    def host(x: pl.Tensor[[2, 4], pl.FP32], y: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        o(x, y, device=0)

    h = pl.jit.host(host)
    x, y = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(RankError, match=r"is read-only: .*annotate it pl\.Out\[\.\.\.\] or pl\.InOut\[\.\.\.\]"):
        h.compile(x, y, config=RunConfig(backend="sim"))(x, y)


N = 8


def test_window_subscripts_in_a_two_rank_program(backend):
    nr = 2

    @pl.jit.incore
    def k(x: pl.Tensor[[nr, N], pl.FP32], y: pl.Out[pl.Tensor[[nr, N], pl.FP32]],
          win: pl.InOut[pld.DistributedTensor[[nr, N], pl.FP32]]):
        ctx = pld.get_comm_ctx(win)
        me = pld.rank(ctx)
        win[0:nr, :] = x                           # tensor -> window region (local copy)
        y[0:1, 0:N] = win[1:2, 0:N]                # window region -> output region
        y[1:2, :] = pl.full([1, N], pl.FP32, 1.0) + pl.cast(me, target_type=pl.FP32)
        return y

    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend)
    prog = ir.compile(on_every_rank(k), config=config)
    x = np.random.default_rng(3).standard_normal((nr, nr, N)).astype(np.float32)
    y = prog(x)
    for r in range(nr):
        np.testing.assert_array_equal(y[r, 0], x[r, 1])
        assert (y[r, 1] == 1.0 + r).all()


def test_bf16_rounding_survives_layout_ops():
    v = np.array([[1.00390625, 3.0]], np.float32).astype(ml_dtypes.bfloat16)
    t = tile(v, pl.BF16)
    assert pl.transpose(t, 0, 1).data.astype(np.float32).tolist() == [[1.0], [3.0]]
    assert pl.concat(t, t).dtype is pl.BF16


def test_nan_and_kernel_error_classes():
    t = tile([[np.nan, 1.0]])
    assert np.isnan(pl.transpose(t, 0, 1).data[0, 0])
    assert issubclass(KernelIndexError, IndexError) and issubclass(KernelValueError, ValueError)
