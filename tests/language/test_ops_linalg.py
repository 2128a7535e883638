"""Linear algebra ops and on-chip memory spaces: values against torch/numpy, dtype rules, legality errors."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import run_in_rank

import ptodist.language as pl
from ptodist.errors import PtodistError, RankError, TileTypeError, TileValueError
from ptodist.language.scalar import Scalar
from ptodist.language.spaces import LEGAL_MOVES, Mem, MemorySpace
from ptodist.language.tile_ops import Tile

S = MemorySpace
CUBE = [pl.FP32, pl.FP16, pl.BF16, pl.INT8]
RNG = np.random.default_rng(7)


def raises(cls, message, fn, *args, **kwargs):
    with pytest.raises(cls, match=f"^{re.escape(message)}$") as info:
        fn(*args, **kwargs)
    assert type(info.value) is cls and isinstance(info.value, PtodistError)


def rand(shape, dtype, lo=-4, hi=4) -> Tile:
    """A tile of small integers (exact in every cube dtype, so products are exact in FP32)."""
    return Tile(RNG.integers(lo, hi, size=shape).astype(dtype.np_dtype), dtype)


def ref(a, b) -> np.ndarray:
    """``a @ b`` in float64 through torch (inputs converted exactly)."""
    return torch.matmul(torch.from_numpy(np.asarray(a, np.float64)), torch.from_numpy(np.asarray(b, np.float64))).numpy()


def placed(t: Tile, space) -> Tile:
    return Tile(t.data, t.dtype, None if t.valid_shape == t.data.shape else t.valid_shape, space=space)


# ---------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------

SHAPES = [(4, 16, 8), (3, 17, 5), (16, 33, 32), (1, 7, 1), (2, 40, 3)]


@pytest.mark.parametrize("dtype", CUBE, ids=lambda d: d.name)
@pytest.mark.parametrize("mkn", SHAPES, ids=str)
def test_matmul_matches_torch_and_accumulates_in_the_cube_dtype(dtype, mkn):
    m, k, n = mkn
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    c = pl.tile.matmul(a, b)
    assert c.dtype is (pl.FP32 if dtype.is_float else pl.INT32)
    assert c.shape == [m, n] and c.space is S.Acc and c.valid_shape == (m, n)
    np.testing.assert_array_equal(c.data, ref(a.data.astype(np.float64), b.data.astype(np.float64)))
    d = pl.matmul(a, b)  # the dispatcher reaches the same op
    assert d.dtype is c.dtype and d.space is S.Acc
    np.testing.assert_array_equal(d.data, c.data)


def test_fp16_and_bf16_products_accumulate_in_fp32_without_rounding_to_the_input_type():
    # 2049 is not representable in FP16 / BF16: an accumulator of the input type would lose the 1.
    for dtype in (pl.FP16, pl.BF16):
        a = Tile(np.array([[2048, 1]], dtype.np_dtype), dtype)
        b = Tile(np.array([[1], [1]], dtype.np_dtype), dtype)
        assert pl.matmul(a, b).data.tolist() == [[2049.0]]
    x = RNG.standard_normal((8, 48)).astype(ml_dtypes.bfloat16)
    y = RNG.standard_normal((48, 8)).astype(ml_dtypes.bfloat16)
    got = pl.matmul(Tile(x, pl.BF16), Tile(y, pl.BF16)).data
    want = torch.matmul(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int8_products_accumulate_in_int32_and_wrap_like_c():
    k = 140_000  # 127 * 127 * k > 2**31 - 1
    a = Tile(np.full((1, k), 127, np.int8), pl.INT8)
    b = Tile(np.full((k, 1), 127, np.int8), pl.INT8)
    c = pl.matmul(a, b)
    assert c.dtype is pl.INT32
    assert int(c.data[0, 0]) == int(np.int64(127 * 127 * k).astype(np.int32))
    assert int(c.data[0, 0]) < 0
    neg = pl.matmul(Tile(np.array([[-128, -128]], np.int8), pl.INT8), Tile(np.array([[-128], [127]], np.int8), pl.INT8))
    assert neg.data.tolist() == [[128 * 128 - 128 * 127]]


def test_matmul_reads_only_the_valid_region_and_keeps_the_physical_shape():
    a = Tile(RNG.integers(-3, 3, (4, 8)).astype(np.float32), pl.FP32, valid_shape=(3, 5))
    b = Tile(RNG.integers(-3, 3, (8, 6)).astype(np.float32), pl.FP32, valid_shape=(5, 4))
    a.data[3:, :] = 99  # garbage in the padding must not reach the result
    a.data[:, 5:] = 99
    b.data[5:, :] = 99
    c = pl.matmul(a, b)
    assert c.shape == [4, 6] and c.valid_shape == (3, 4)
    want = np.zeros((4, 6), np.float32)
    want[:3, :4] = a.data[:3, :5] @ b.data[:5, :4]
    np.testing.assert_array_equal(c.data, want)


def test_nan_and_inf_propagate_through_the_product():
    a = Tile(np.array([[np.nan, 1], [1, 1]], np.float16), pl.FP16)
    b = Tile(np.array([[1, 0], [np.inf, 1]], np.float16), pl.FP16)
    c = pl.matmul(a, b).data
    assert np.isnan(c[0, 0]) and np.isnan(c[0, 1]) and c[1, 0] == np.inf and c[1, 1] == 1


def test_tile_out_dtype_converts_the_accumulator():
    a, b = rand((2, 3), pl.FP16), rand((3, 2), pl.FP16)
    c = pl.matmul(a, b, out_dtype=pl.FP16)
    assert c.dtype is pl.FP16 and c.space is S.Acc
    np.testing.assert_array_equal(c.data, pl.matmul(a, b).data.astype(np.float16))
    raises(TileTypeError, "pl.matmul: out_dtype must be a pl dtype (pl.FP32, ...), got 'fp16'",
           pl.matmul, a, b, out_dtype="fp16")


def test_matmul_errors():
    a = rand((2, 3), pl.FP32)
    raises(TileTypeError, "pl.matmul takes two Tiles, got Tile and ndarray; load tensors into tiles with pl.load first",
           pl.tile.matmul, a, np.ones((3, 2)))
    raises(TileValueError, "pl.matmul: inner dimensions differ: [2, 3] @ [2, 2]", pl.matmul, a, rand((2, 2), pl.FP32))
    raises(TileTypeError, "pl.matmul: lhs is FP32 but rhs is FP16; the cube unit multiplies two operands of one dtype: "
           "convert one with pl.cast(tile, target_type=pl.FP32)", pl.matmul, a, rand((3, 2), pl.FP16))
    raises(TileTypeError, "pl.tile.matmul: argument 1 is a INT32 tile, but matmul takes FP32, FP16, BF16, INT8 tiles; "
           "convert it first with pl.cast(tile, target_type=pl.<dtype>)", pl.matmul, rand((2, 3), pl.INT32),
           rand((3, 2), pl.INT32))
    raises(TileValueError, "pl.matmul: lhs must be a 2-D tile, got shape [2, 2, 3]; use pl.batch_matmul for batched "
           "tiles", pl.matmul, rand((2, 2, 3), pl.FP32), rand((3, 2), pl.FP32))
    for flag in ("a_trans", "b_trans"):
        raises(TileTypeError, f"pl.matmul: '{flag}' is not supported for Tile operands: at tile level transpose the "
               "operand itself (pl.transpose(tile), or pl.load(..., target_memory=pl.MemorySpace.Mat, "
               "transpose=True)) and pass it", pl.matmul, a, rand((3, 2), pl.FP32), **{flag: True})
    raises(TileTypeError, "pl.matmul: 'c_matrix_nz' is not supported for Tile operands: the layout of a tile product "
           "is fixed by its Acc tile; the flag exists for tensors only", pl.matmul, a, rand((3, 2), pl.FP32),
           c_matrix_nz=True)
    c = pl.matmul(a, rand((3, 2), pl.FP32), a_trans=False, b_trans=False)  # the defaults spelled out are fine
    assert c.shape == [2, 2]


# ---------------------------------------------------------------------------
# matmul_acc, split-K, matmul_bias, batch_matmul
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", CUBE, ids=lambda d: d.name)
def test_matmul_acc_accumulates_into_an_existing_accumulator(dtype):
    a1, b1, a2, b2 = rand((3, 5), dtype), rand((5, 4), dtype), rand((3, 7), dtype), rand((7, 4), dtype)
    acc = pl.matmul(a1, b1)
    c = pl.tile.matmul_acc(acc, a2, b2)
    assert c.dtype is acc.dtype and c.space is S.Acc
    np.testing.assert_array_equal(c.data, ref(a1.data, b1.data) + ref(a2.data, b2.data))
    np.testing.assert_array_equal(pl.matmul_acc(acc, a2, b2).data, c.data)
    np.testing.assert_array_equal(acc.data, ref(a1.data, b1.data))  # functional: acc itself is unchanged


@pytest.mark.parametrize("cond", [True, Scalar(1, pl.INT32)], ids=["bool", "scalar"])
def test_matmul_acc_init_cond_overwrites(cond):
    a, b = rand((2, 3), pl.FP32), rand((3, 2), pl.FP32)
    acc = pl.matmul(rand((2, 4), pl.FP32), rand((4, 2), pl.FP32))
    np.testing.assert_array_equal(pl.matmul_acc(acc, a, b, init_cond=cond).data, ref(a.data, b.data))
    np.testing.assert_array_equal(pl.matmul_acc(acc, a, b, init_cond=False).data, acc.data + ref(a.data, b.data))


@pytest.mark.parametrize("dtype", CUBE, ids=lambda d: d.name)
def test_split_k_matmul_from_matmul_and_matmul_acc(dtype):
    m, k, n, step = 5, 40, 6, 16  # K is not a multiple of the step: the last slice is 8 wide
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    acc = None
    for k0 in range(0, k, step):
        ak = pl.slice(a, [m, min(step, k - k0)], [0, k0])
        bk = pl.slice(b, [min(step, k - k0), n], [k0, 0])
        acc = pl.matmul(ak, bk) if acc is None else pl.matmul_acc(acc, ak, bk)
    np.testing.assert_array_equal(acc.data, pl.matmul(a, b).data)
    np.testing.assert_array_equal(acc.data, ref(a.data, b.data))


def test_int32_accumulation_wraps():
    big = Tile(np.full((1, 1), 2**31 - 1, np.int32), pl.INT32, space=S.Acc)
    one = Tile(np.ones((1, 1), np.int8), pl.INT8)
    assert pl.matmul_acc(big, one, one).data.tolist() == [[-(2**31)]]


def test_matmul_acc_errors():
    a, b = rand((2, 3), pl.FP16), rand((3, 2), pl.FP16)
    raises(TileTypeError, "pl.matmul_acc: acc is FP16, but the product accumulates in FP32 and the acc must have the "
           "accumulator dtype; convert it with pl.cast(acc, target_type=pl.FP32)",
           pl.matmul_acc, rand((2, 2), pl.FP16), a, b)
    raises(TileTypeError, "pl.matmul_acc: lhs is INT32, but the cube unit multiplies FP32, FP16, BF16, INT8; convert "
           "it first with pl.cast(lhs, target_type=pl.<dtype>)", pl.matmul_acc, rand((2, 2), pl.INT32),
           rand((2, 3), pl.INT32), rand((3, 2), pl.INT32))
    raises(TileValueError, "pl.matmul_acc: acc has shape [2, 3], but the product is [2, 2]",
           pl.matmul_acc, rand((2, 3), pl.FP32), a, b)
    raises(TileTypeError, "pl.matmul_acc takes three Tiles, got Tile, Tile and float; load tensors into tiles with "
           "pl.load first", pl.tile.matmul_acc, rand((2, 2), pl.FP32), a, 1.0)
    raises(TileTypeError, "pl.matmul_acc: 'a_trans' is not supported for Tile operands: at tile level transpose the "
           "operand itself (pl.transpose(tile), or pl.load(..., target_memory=pl.MemorySpace.Mat, transpose=True)) "
           "and pass it", pl.matmul_acc, rand((2, 2), pl.FP32), a, b, a_trans=True)


@pytest.mark.parametrize("dtype", CUBE, ids=lambda d: d.name)
def test_matmul_bias_adds_a_row_to_every_row(dtype):
    acc = pl.FP32 if dtype.is_float else pl.INT32
    a, b, bias = rand((4, 9), dtype), rand((9, 5), dtype), rand((1, 5), acc)
    c = pl.tile.matmul_bias(a, b, bias)
    assert c.dtype is acc and c.space is S.Acc
    np.testing.assert_array_equal(c.data, ref(a.data, b.data) + bias.data)
    assert pl.matmul_bias is pl.tile.matmul_bias  # a tile-only re-export


def test_matmul_bias_errors():
    a, b = rand((2, 3), pl.BF16), rand((3, 4), pl.BF16)
    raises(TileValueError, "pl.matmul_bias: bias must have shape [1, N] = [1, 4], got [2, 4]",
           pl.matmul_bias, a, b, rand((2, 4), pl.FP32))
    raises(TileTypeError, "pl.matmul_bias: bias is BF16, but the product accumulates in FP32 and the bias must have "
           "the accumulator dtype; convert it with pl.cast(bias, target_type=pl.FP32)",
           pl.matmul_bias, a, b, rand((1, 4), pl.BF16))


def test_batch_matmul_broadcasts_batch_dimensions():
    a, b = rand((2, 1, 3, 4), pl.FP16), rand((5, 4, 2), pl.FP16)
    c = pl.tile.batch_matmul(a, b)
    assert c.shape == [2, 5, 3, 2] and c.dtype is pl.FP32 and c.space is S.Acc
    np.testing.assert_array_equal(c.data, ref(a.data, b.data))
    assert pl.batch_matmul is pl.tile.batch_matmul
    i = pl.batch_matmul(rand((3, 2, 5), pl.INT8), rand((3, 5, 2), pl.INT8))
    assert i.dtype is pl.INT32
    raises(TileValueError, "pl.batch_matmul: batch dimensions [2] and [3] do not broadcast",
           pl.batch_matmul, rand((2, 2, 5), pl.FP32), rand((3, 5, 2), pl.FP32))
    raises(TileValueError, "pl.batch_matmul: lhs must have at least 2 dimensions, got shape [5]",
           pl.batch_matmul, rand((5,), pl.FP32), rand((5, 2), pl.FP32))


# ---------------------------------------------------------------------------
# GEMV
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", CUBE, ids=lambda d: d.name)
def test_gemv_family(dtype):
    acc_dtype = pl.FP32 if dtype.is_float else pl.INT32
    x, w, x2, w2 = rand((1, 33), dtype), rand((33, 7), dtype), rand((1, 5), dtype), rand((5, 7), dtype)
    g = pl.tile.gemv(x, w)
    assert g.shape == [1, 7] and g.dtype is acc_dtype and g.space is S.Acc
    np.testing.assert_array_equal(g.data, ref(x.data, w.data))
    np.testing.assert_array_equal(pl.gemv(x, w, "final").data, g.data)
    np.testing.assert_array_equal(pl.gemv_acc(g, x2, w2).data, g.data + ref(x2.data, w2.data))
    np.testing.assert_array_equal(pl.gemv_acc(g, x2, w2, init_cond=True).data, ref(x2.data, w2.data))
    bias = rand((1, 7), acc_dtype)
    np.testing.assert_array_equal(pl.gemv_bias(x, w, bias, "partial").data, g.data + bias.data)


def test_gemv_errors():
    raises(TileValueError, "pl.gemv: lhs must be one row [1, K] (valid rows 1), got shape [2, 3] with valid shape "
           "[2, 3]; use pl.matmul for more rows", pl.gemv, rand((2, 3), pl.FP32), rand((3, 4), pl.FP32))
    raises(TileValueError, "pl.gemv: acc_phase='first' is not one of 'unspecified', 'partial', 'final'",
           pl.gemv, rand((1, 3), pl.FP32), rand((3, 4), pl.FP32), "first")
    w = Tile(np.ones((3, 4), np.float32), pl.FP32, valid_shape=(2, 4))
    raises(TileValueError, "pl.gemv: rhs has 2 valid rows, fewer than the lhs's valid K=3; the rhs must cover the "
           "lhs's K", pl.gemv, rand((1, 3), pl.FP32), w)
    raises(TileTypeError, "pl.gemv_acc: acc is INT8, but the product accumulates in INT32 and the acc must have the "
           "accumulator dtype; convert it with pl.cast(acc, target_type=pl.INT32)",
           pl.gemv_acc, rand((1, 4), pl.INT8), rand((1, 3), pl.INT8), rand((3, 4), pl.INT8))


# ---------------------------------------------------------------------------
# MX block scale
# ---------------------------------------------------------------------------


def _mx_operands(m=16, k=128, n=32, valid_k=None):
    kv = valid_k or k
    groups, vgroups = -(-k // 32), -(-kv // 32)
    a = RNG.standard_normal((m, k)).astype(ml_dtypes.float8_e4m3fn)
    b = RNG.standard_normal((k, n)).astype(ml_dtypes.float8_e4m3fn)
    sa = (2.0 ** RNG.integers(-3, 4, (m, groups))).astype(ml_dtypes.float8_e8m0fnu)
    sb = (2.0 ** RNG.integers(-3, 4, (groups, n))).astype(ml_dtypes.float8_e8m0fnu)
    tiles = (Tile(a, pl.FP8E4M3FN, None if kv == k else (m, kv)), Tile(sa, pl.FP8E8M0, None if kv == k else (m, vgroups)),
             Tile(b, pl.FP8E4M3FN, None if kv == k else (kv, n)), Tile(sb, pl.FP8E8M0, None if kv == k else (vgroups, n)))
    # Reference: dequantize (each K element times the scale of its 32-wide group) and multiply in float64.
    deq_a = a.astype(np.float64)[:, :kv] * np.repeat(sa.astype(np.float64), 32, axis=1)[:, :kv]
    deq_b = b.astype(np.float64)[:kv] * np.repeat(sb.astype(np.float64), 32, axis=0)[:kv]
    return tiles, ref(deq_a, deq_b)


@pytest.mark.parametrize("k,valid_k", [(64, None), (128, None), (64, 50)])
def test_matmul_mx_scales_each_32_wide_k_group(k, valid_k):
    (a, sa, b, sb), want = _mx_operands(k=k, valid_k=valid_k)
    c = pl.tile.matmul_mx(a, sa, b, sb)
    assert c.dtype is pl.FP32 and c.shape == [16, 32] and c.space is S.Acc
    np.testing.assert_allclose(c.data, want, rtol=1e-5, atol=1e-4)
    assert pl.matmul_mx is pl.tile.matmul_mx
    acc = Tile(np.full((16, 32), 1.5, np.float32), pl.FP32, space=S.Acc)
    np.testing.assert_allclose(pl.matmul_mx_acc(acc, a, sa, b, sb).data, want + 1.5, rtol=1e-5, atol=1e-4)
    bias = Tile(np.arange(32, dtype=np.float32)[None, :], pl.FP32)
    np.testing.assert_allclose(pl.matmul_mx_bias(a, sa, b, sb, bias).data, want + bias.data, rtol=1e-5, atol=1e-4)


def test_matmul_mx_errors():
    (a, sa, b, sb), _ = _mx_operands(k=64)
    raises(TileTypeError, "pl.matmul_mx: lhs is BF16, but MX data tiles are FP8E4M3FN (FP4 data is not supported "
           "natively: the cube has no FP4 x FP4 MX product, so cast an FP4 lhs to FP8E4M3FN with pl.cast first)",
           pl.matmul_mx, Tile(a.data.astype(ml_dtypes.bfloat16), pl.BF16), sa, b, sb)
    raises(TileTypeError, "pl.matmul_mx: rhs_scale is UINT8, but MX block scales are FP8E8M0 (one power-of-two "
           "exponent per 32 K elements)", pl.matmul_mx, a, sa, b, Tile(np.zeros((2, 32), np.uint8), pl.UINT8))
    raises(TileValueError, "pl.matmul_mx: lhs_scale must have shape [16, 2] (valid [16, 2]): one FP8E8M0 scale per "
           "32 K elements of lhs (shape [16, 64], valid [16, 64]), got shape [16, 4] (valid [16, 4])",
           pl.matmul_mx, a, Tile(np.ones((16, 4), ml_dtypes.float8_e8m0fnu), pl.FP8E8M0), b, sb)
    small = Tile(a.data[:8], pl.FP8E4M3FN)
    raises(TileValueError, "pl.matmul_mx: lhs rows M=8 must be a multiple of 16, as the MX cube instruction requires "
           "(tile the data to M % 16, K % 64, N % 32)", pl.matmul_mx, small, Tile(sa.data[:8], pl.FP8E8M0), b, sb)
    raises(TileTypeError, "pl.matmul_mx_acc: acc is FP16, but the product accumulates in FP32 and the acc must have "
           "the accumulator dtype; convert it with pl.cast(acc, target_type=pl.FP32)",
           pl.matmul_mx_acc, pl.full([16, 32], 0.0, pl.FP16), a, sa, b, sb)
    raises(TileValueError, "pl.matmul_mx_bias: bias must have shape [1, N] = [1, 32], got [1, 16]",
           pl.matmul_mx_bias, a, sa, b, sb, pl.full([1, 16], 0.0, pl.FP32))


# ---------------------------------------------------------------------------
# Memory spaces: moves and operand placement
# ---------------------------------------------------------------------------


def test_memory_space_enum_as_upstream():
    assert Mem is MemorySpace
    assert [s.name for s in MemorySpace] == ["DDR", "Vec", "Mat", "Left", "Right", "Acc", "Bias", "ScalarLocal",
                                             "LeftScale", "RightScale"]
    t = rand((2, 2), pl.FP32)
    assert t.space is None and t.memory_space is S.Vec  # never placed: reads as Vec
    assert pl.add(t, 1.0).memory_space is S.Vec  # vector results are Vec


ON_CHIP = [S.Vec, S.Mat, S.Left, S.Right, S.Acc, S.Bias, S.LeftScale, S.RightScale]


@pytest.mark.parametrize("src", ON_CHIP, ids=lambda s: s.name)
@pytest.mark.parametrize("dst", [*ON_CHIP, S.DDR], ids=lambda s: s.name)
def test_move_follows_the_hardware_move_table(src, dst):
    t = placed(rand((2, 3), pl.FP16), src)
    legal = dst in LEGAL_MOVES.get(src, ())
    assert legal == ((src, dst) in {(S.Mat, S.Left), (S.Mat, S.Right), (S.Mat, S.Bias), (S.Mat, S.LeftScale),
                                    (S.Mat, S.RightScale), (S.Vec, S.Vec), (S.Vec, S.Mat), (S.Acc, S.Mat),
                                    (S.Acc, S.Vec)})
    if legal:
        m = pl.move(t, target_memory=dst)
        assert m.space is dst and m.dtype is pl.FP16
        np.testing.assert_array_equal(m.data, t.data)
    else:
        with pytest.raises(TileTypeError, match=rf"^pl.move: {src.name} -> {dst.name} is not a legal move"):
            pl.move(t, target_memory=dst)


def test_move_error_messages():
    raises(TileTypeError, "pl.move: Vec -> Left is not a legal move (from Vec a tile moves only to Vec, Mat): Left is "
           "reached only from Mat; load the data with pl.load(..., target_memory=pl.MemorySpace.Mat) and move that",
           pl.move, rand((2, 2), pl.FP16), target_memory=S.Left)
    raises(TileTypeError, "pl.move: Mat -> Acc is not a legal move (from Mat a tile moves only to Left, Right, Bias, "
           "LeftScale, RightScale): nothing moves data into Acc, only a cube op (pl.matmul and family) writes it: "
           "start an accumulator with pl.matmul, then pl.matmul_acc into it",
           pl.move, placed(rand((2, 2), pl.FP16), S.Mat), target_memory=S.Acc)
    raises(TileTypeError, "pl.move: Left -> Mat is not a legal move (nothing moves out of Left): Mat is reached only "
           "from Vec or Acc", pl.move, placed(rand((2, 2), pl.FP16), S.Left), target_memory=S.Mat)
    raises(TileTypeError, "pl.move: Acc -> DDR is not a legal move (from Acc a tile moves only to Mat, Vec): DDR is "
           "off chip: write a tile to DDR with pl.store(tile, offsets, tensor)",
           pl.move, pl.matmul(rand((2, 2), pl.FP16), rand((2, 2), pl.FP16)), target_memory=S.DDR)
    raises(TileTypeError, "pl.move needs target_memory=pl.MemorySpace.<space>: the space the tile moves to",
           pl.move, rand((2, 2), pl.FP16))
    raises(TileTypeError, "pl.move: target_memory='L0A' is not a memory space; pass one of pl.MemorySpace.{DDR, Vec, "
           "Mat, Left, Right, Acc, Bias, ScalarLocal, LeftScale, RightScale}",
           pl.move, rand((2, 2), pl.FP16), target_memory="L0A")
    assert pl.move(rand((2, 2), pl.FP16), target_memory="Mat", blayout=None).space is S.Mat


def test_the_upstream_cube_chain_and_the_shortcuts_it_allows():
    a, b = rand((4, 8), pl.FP16), rand((8, 3), pl.FP16)
    want = ref(a.data, b.data)
    left = pl.move(placed(a, S.Mat), target_memory=S.Left)
    right = pl.move(placed(b, S.Mat), target_memory=S.Right)
    for lhs, rhs in [(left, right), (placed(a, S.Mat), placed(b, S.Mat)), (a, b), (left, b)]:
        np.testing.assert_array_equal(pl.matmul(lhs, rhs).data, want)
    # The chain Acc -> Mat -> Left feeds a product into the next one.
    c = pl.matmul(left, right)
    again = pl.matmul(pl.move(pl.move(c, target_memory=S.Mat), target_memory=S.Left), placed(rand((3, 2), pl.FP32), S.Mat))
    assert again.shape == [4, 2]
    bias = pl.move(placed(rand((1, 3), pl.FP32), S.Mat), target_memory=S.Bias)
    np.testing.assert_array_equal(pl.matmul_bias(left, right, bias).data, want + bias.data)


def test_operands_placed_where_no_move_reaches_the_cube_are_rejected():
    a, b = rand((2, 3), pl.FP16), rand((3, 2), pl.FP16)
    raises(TileTypeError, "pl.matmul: lhs is in Right, but the lhs operand is read from Left; nothing moves out of "
           "Right, so it can feed only the Right operand; load the lhs into Mat and pl.move it to Left",
           pl.matmul, placed(a, S.Right), b)
    raises(TileTypeError, "pl.matmul: rhs is in Left, but the rhs operand is read from Right; nothing moves out of "
           "Left, so it can feed only the Left operand; load the rhs into Mat and pl.move it to Right",
           pl.matmul, a, placed(b, S.Left))
    raises(TileTypeError, "pl.matmul_bias: bias is in Left, but the bias operand is read from Bias; nothing moves "
           "out of Left, so it can feed only the Left operand; load the bias into Mat and pl.move it to Bias",
           pl.matmul_bias, a, b, placed(rand((1, 2), pl.FP32), S.Left))
    acc = pl.matmul(a, b)
    for space in (S.Vec, S.Mat):
        raises(TileTypeError, f"pl.matmul_acc: acc is in {space.name}, but the acc operand is read from Acc; nothing "
               "moves data into Acc, only a cube op writes it: pass the result of a cube op (pl.matmul, pl.gemv, ...) "
               "as the accumulator, or drop a pre-zeroed accumulator and pass init_cond=True on the first step",
               pl.matmul_acc, pl.move(acc, target_memory=space), a, b)
    (xa, sa, xb, sb), _ = _mx_operands(k=64)
    raises(TileTypeError, "pl.matmul_mx: lhs_scale is in RightScale, but the lhs_scale operand is read from "
           "LeftScale; nothing moves out of RightScale, so it can feed only the RightScale operand; load the "
           "lhs_scale into Mat and pl.move it to LeftScale", pl.matmul_mx, xa, placed(sa, S.RightScale), xb, sb)
    raises(TileTypeError, "pl.matmul_mx_acc: acc is in Vec, but the acc operand is read from Acc; nothing moves data "
           "into Acc, only a cube op writes it: pass the result of a cube op (pl.matmul, pl.gemv, ...) as the "
           "accumulator", pl.matmul_mx_acc, placed(pl.full([16, 32], 0.0, pl.FP32), S.Vec), xa, sa, xb, sb)


def test_operands_the_compiler_can_move_are_accepted():
    a, b = rand((2, 3), pl.FP16), rand((3, 2), pl.FP16)
    want = ref(a.data, b.data)
    # Unplaced (a plain load, a vector result), or placed where a chain of moves reaches the cube: upstream's
    # compiler inserts the moves (across cores for Vec and Acc).
    for space in (None, S.Vec, S.Mat, S.Acc):
        np.testing.assert_array_equal(pl.matmul(placed(a, space), placed(b, space)).data, want)
    acc = pl.matmul(a, b)
    np.testing.assert_array_equal(pl.matmul_acc(pl.add(acc, 0.0), a, b).data, 2 * want)
    bias = placed(rand((1, 2), pl.FP32), S.Vec)
    np.testing.assert_array_equal(pl.matmul_bias(a, b, bias).data, want + bias.data)


def test_slice_and_reshape_keep_the_memory_space():
    t = placed(rand((4, 4), pl.FP16), S.Mat)
    assert pl.slice(t, [2, 2], [0, 0]).space is S.Mat
    assert pl.reshape(t, [2, 8]).space is S.Mat


# ---------------------------------------------------------------------------
# Inside a program: loads into spaces, the tensor level
# ---------------------------------------------------------------------------


def test_tile_level_cube_chain_in_a_program():
    a = RNG.integers(-4, 4, (8, 16)).astype(np.float16)
    b = RNG.integers(-4, 4, (16, 4)).astype(np.float16)

    def body(x, w, out, out_t):
        xa = pl.load(x, [0, 0], [8, 16], target_memory=S.Mat)
        wb = pl.load(w, [0, 0], [16, 4], target_memory=S.Mat)
        acc = pl.matmul(pl.move(xa, target_memory=S.Left), pl.move(wb, target_memory=S.Right))
        pl.store(acc, [0, 0], out)
        # Split-K on loaded slices, K = 16 in two steps of 8.
        acc = pl.matmul(pl.load(x, [0, 0], [8, 8]), pl.load(w, [0, 0], [8, 4]))
        acc = pl.matmul_acc(acc, pl.load(x, [0, 8], [8, 8]), pl.load(w, [8, 0], [8, 4]))
        pl.store(pl.sub(acc, pl.load(out, [0, 0], [8, 4])), [0, 0], out_t)
        # A transposing load lands in Mat as [shape[1], shape[0]].
        wt = pl.load(w, [0, 0], [16, 4], target_memory=S.Mat, transpose=True)
        assert wt.shape == [4, 16] and wt.space is S.Mat and np.array_equal(wt.data, b.T)
        part = pl.load(w, [0, 0], [16, 4], valid_shape=[10, 4], target_memory=S.Mat, transpose=True)
        assert part.valid_shape == (4, 10) and np.array_equal(part.data[:, :10], b[:10].T)
        assert not part.data[:, 10:].any()

    _, _, out, diff = run_in_rank(body, a, b, np.zeros((8, 4), np.float32), np.ones((8, 4), np.float32))
    np.testing.assert_array_equal(out, ref(a, b))
    np.testing.assert_array_equal(diff, np.zeros((8, 4)))


def test_tensor_level_matmul_with_transposes_and_out_dtype():
    a = RNG.integers(-4, 4, (6, 5)).astype(np.float32)  # stored [K, M]
    b = RNG.integers(-4, 4, (3, 6)).astype(np.float32)  # stored [N, K]
    acc0 = RNG.integers(-4, 4, (5, 3)).astype(np.float32)

    def body(x, w, c, out, out16, out_acc):
        t = pl.matmul(x, w, a_trans=True, b_trans=True)
        pl.store(pl.load(t, [0, 0], [5, 3]), [0, 0], out)
        t16 = pl.matmul(x, w, out_dtype=pl.FP16, a_trans=True, b_trans=True)
        pl.store(pl.cast(pl.load(t16, [0, 0], [5, 3]), target_type=pl.FP32), [0, 0], out16)
        ta = pl.tensor.matmul_acc(c, x, w, True, True)
        pl.store(pl.load(ta, [0, 0], [5, 3]), [0, 0], out_acc)

    z = np.zeros((5, 3), np.float32)
    _, _, _, out, out16, out_acc = run_in_rank(body, a, b, acc0, z, z.copy(), z.copy())
    np.testing.assert_array_equal(out, ref(a.T, b.T))
    np.testing.assert_array_equal(out16, ref(a.T, b.T).astype(np.float16))
    np.testing.assert_array_equal(out_acc, acc0 + ref(a.T, b.T))


def _rank_error(body, *arrays):
    with pytest.raises(RankError) as info:
        run_in_rank(body, *arrays)
    return info.value.original


def test_load_target_legality_in_a_program():
    x = np.zeros((4, 4), np.float32)

    def to_left(t):
        pl.load(t, [0, 0], [4, 4], target_memory=S.Left)

    e = _rank_error(to_left, x)
    assert type(e) is TileTypeError and str(e) == (
        "pl.load: target_memory=pl.MemorySpace.Left is not reachable from DDR: a load lands only in Vec (the default) "
        "or Mat. Load into Mat, then pl.move(tile, target_memory=pl.MemorySpace.Left)")

    def to_acc(t):
        pl.load(t, [0, 0], [4, 4], target_memory=S.Acc)

    assert str(_rank_error(to_acc, x)).endswith("; Acc is not reachable by any move either")

    def transpose_to_vec(t):
        pl.load(t, [0, 0], [4, 4], transpose=True)

    e = _rank_error(transpose_to_vec, x)
    assert type(e) is TileTypeError and str(e) == (
        "pl.load: transpose=True loads into Mat only (the transposing copy is DDR -> L1); add "
        "target_memory=pl.MemorySpace.Mat, or load as is and call pl.transpose")

    def mixed(t):
        pl.matmul(t, pl.load(t, [0, 0], [4, 4]))

    def int32(t):
        pl.matmul(t, t)

    e = _rank_error(int32, np.zeros((2, 2), np.int32))
    assert type(e) is TileTypeError and str(e) == (
        "pl.matmul: lhs is INT32, but the cube unit multiplies FP32, FP16, BF16, INT8; convert it first with "
        "pl.cast(lhs, target_type=pl.<dtype>)")

    e = _rank_error(mixed, x)
    assert type(e) is TileTypeError and str(e) == (
        "pl.matmul: cannot mix tensors and tiles (RankTensor and Tile); pass all tensors (pl.tensor.matmul) or all "
        "tiles (pl.tile.matmul)")


def test_tensor_level_matmul_batches_rank_above_two_and_takes_vectors():
    a = RNG.integers(-4, 4, (2, 3, 4)).astype(np.float16)
    b = RNG.integers(-4, 4, (4, 5)).astype(np.float16)
    v = RNG.integers(-4, 4, (4,)).astype(np.float16)

    def body(x, w, vec, out, out_v):
        t = pl.matmul(x, w)  # [2, 3, 4] @ [4, 5]: a batched product
        pl.store(pl.load(t, [0, 0, 0], [2, 3, 5]), [0, 0, 0], out)
        tv = pl.tensor.matmul(vec, w)  # [4] @ [4, 5] -> [5]
        pl.store(pl.load(tv, [0], [5]), [0], out_v)

    *_, out, out_v = run_in_rank(body, a, b, v, np.zeros((2, 3, 5), np.float32), np.zeros(5, np.float32))
    np.testing.assert_array_equal(out, ref(a, b))
    np.testing.assert_array_equal(out_v, ref(v, b))


@pytest.mark.parametrize("name", ["matmul_bias", "batch_matmul", "gemv", "gemv_acc", "gemv_bias",
                                  "matmul_mx_acc", "matmul_mx_bias"])
def test_tile_only_ops_are_re_exported_and_have_no_tensor_level(name):
    assert getattr(pl, name) is getattr(pl.tile, name)
    assert not hasattr(pl.tensor, name)


def test_matmul_and_matmul_acc_exist_at_both_levels():
    for name in ("matmul", "matmul_acc"):
        assert callable(getattr(pl.tile, name)) and callable(getattr(pl.tensor, name))
        assert getattr(pl, name) is not getattr(pl.tile, name)  # a dispatcher
