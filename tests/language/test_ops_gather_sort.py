"""Gather, scatter and sort: every op against numpy/torch, its valid-region and index-bound rules, its errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import run_in_rank

import ptodist.language as pl
from ptodist.errors import RankError, TileIndexError, TileTypeError, TileValueError
from ptodist.language.spaces import MemorySpace
from ptodist.language.tile_ops import Tile

RNG = np.random.default_rng(7)
GATHER_DTYPES = [(pl.FP32, np.float32), (pl.FP16, np.float16), (pl.INT16, np.int16), (pl.INT32, np.int32)]


def _t(a, dtype=None, valid=None) -> Tile:
    return Tile(np.asarray(a), dtype, valid)


def _same(a: Tile, b: Tile) -> None:
    assert a.dtype is b.dtype and a.valid_shape == b.valid_shape
    np.testing.assert_array_equal(a.data, b.data)


def _raises(cls, msg: str):
    return pytest.raises(cls, match="^" + re.escape(msg) + "$")


# -- gather ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,np_dt", GATHER_DTYPES)
def test_gather_flat_offsets(dtype, np_dt):
    src = (RNG.integers(-100, 100, (4, 16))).astype(np_dt)
    idx = RNG.integers(0, 64, (2, 8)).astype(np.int32)
    out = pl.tile.gather(_t(src), _t(idx), _t(np.zeros((2, 8), np.int32)))
    np.testing.assert_array_equal(out.data, src.reshape(-1)[idx])
    assert out.dtype is dtype and out.valid_shape == (2, 8)
    _same(pl.gather(_t(src), _t(idx), _t(np.zeros((2, 8), np.int32))), out)
    _same(pl.gather(_t(src), index=_t(idx)), out)  # the flat form without a scratch tile


@pytest.mark.parametrize("shape,dim,ishape", [((8, 16), -1, (8, 8)), ((8, 16), 0, (4, 16)),
                                              ((2, 8, 16), 1, (2, 8, 16)), ((2, 8, 16), 2, (2, 4, 8))])
def test_gather_dim_matches_torch(shape, dim, ishape):
    x = RNG.standard_normal(shape).astype(np.float32)
    i = RNG.integers(0, shape[dim], ishape).astype(np.int32)
    out = pl.gather(_t(x), dim=dim, index=_t(i))
    np.testing.assert_array_equal(out.data, torch.gather(torch.from_numpy(x), dim, torch.from_numpy(i).long()))
    _same(pl.tile.gather(_t(x), dim, _t(i)), out)


def test_gather_reads_only_the_valid_index_region():
    src = np.arange(16, dtype=np.float32).reshape(2, 8)
    idx = np.full((2, 8), 999, np.int32)  # the pad holds garbage: it must not be read
    idx[:1, :4] = [7, 0, 15, 3]
    out = pl.tile.gather(_t(src), _t(idx, valid=(1, 4)))
    assert out.valid_shape == (1, 4)
    np.testing.assert_array_equal(out.data[0, :4], [7, 0, 15, 3])
    assert not out.data[1:].any() and not out.data[0, 4:].any()


def test_gather_nan_moves_like_any_value():
    src = np.array([[np.nan, 1.0, -np.inf, 2.0]], np.float32)
    out = pl.gather(_t(src), dim=-1, index=_t(np.array([[2, 0, 0, 1]], np.int32)))
    np.testing.assert_array_equal(out.data, [[-np.inf, np.nan, np.nan, 1.0]])


@pytest.mark.parametrize("call,err,msg", [
    (lambda: pl.tile.gather(_t(np.zeros((2, 4), np.float32)), _t(np.array([[0, 8]], np.int32))), TileIndexError,
     "pl.tile.gather: index 8 at position [0, 1] of the index tile (flat offsets into src [2, 4]) is outside "
     "[0, 8); flat indices count elements of the whole src tile, row-major"),
    (lambda: pl.gather(_t(np.zeros((2, 4), np.float32)), dim=-1, index=_t(np.array([[0], [-1]], np.int32))),
     TileIndexError, "pl.tile.gather: index -1 at position [1, 0] of the index tile (positions along axis 1 of "
     "src [2, 4]) is outside [0, 4); each index names a position along dim"),
    (lambda: pl.gather(_t(np.zeros((2, 4), np.float32), pl.BF16), index=_t(np.zeros((1, 8), np.int32))),
     TileTypeError, "pl.tile.gather: src is a BF16 tile, but gather takes FP16, FP32, INT16, INT32 for it; "
     "convert it first with pl.cast(tile, target_type=pl.<dtype>)"),
    (lambda: pl.gather(_t(np.zeros((2, 4), np.float32)), index=_t(np.zeros((1, 8), np.int64))),
     TileTypeError, "pl.tile.gather: index is a INT64 tile, but gather takes INT32 for it; convert it first with "
     "pl.cast(tile, target_type=pl.<dtype>)"),
    (lambda: pl.gather(_t(np.zeros((2, 4), np.float32)), dim=-1, index=_t(np.zeros((3, 4), np.int32))),
     TileValueError, "pl.tile.gather: index [3, 4] is larger than src [2, 4] on axis 0; only axis 1 (dim) may "
     "differ"),
    (lambda: pl.gather(_t(np.zeros((2, 4), np.float32)), dim=-1, index=_t(np.zeros((2, 4), np.int32)),
                       mask_pattern=1), TileTypeError,
     "pl.tile.gather: the index form (dim=, index=), the mask form (mask_pattern=) and the compare form "
     "(kvalue=, cmp_mode=, out_cols=) are exclusive; pass the arguments of one"),
    (lambda: pl.gather(_t(np.zeros((2, 6), np.float32)), mask_pattern=3), TileValueError,
     "pl.tile.gather: mask pattern P0001 takes every 4th column, but src [2, 6] has 6 columns; the last dim must "
     "divide by 4"),
    (lambda: pl.gather(_t(np.zeros((2, 4), np.float32)), mask_pattern=1, output_dtype=pl.INT16), TileTypeError,
     "pl.tile.gather: output_dtype INT16 is 16-bit but src is FP32 (32-bit); the mask form reinterprets bits, so "
     "the widths must match"),
    (lambda: pl.gather(np.zeros((2, 4)), index=np.zeros((1, 2))), TileTypeError,
     "pl.gather takes tensors or tiles, got ndarray: pass tensors (pl.tensor level), tiles (pl.tile level; "
     "pl.load a region of a tensor into a tile)"),
])
def test_gather_errors(call, err, msg):
    with _raises(err, msg):
        call()


@pytest.mark.parametrize("pattern,start,stride", [(1, 0, 2), (2, 1, 2), (3, 0, 4), (4, 1, 4), (5, 2, 4),
                                                  (6, 3, 4), (7, 0, 1)])
def test_gather_mask_patterns(pattern, start, stride):
    src = RNG.standard_normal((3, 16)).astype(np.float32)
    out = pl.gather(_t(src, valid=(3, 10)), mask_pattern=pattern)
    np.testing.assert_array_equal(out.data, src[:, start::stride])
    assert out.valid_shape == (3, len(range(start, 10, stride)))


def test_gather_mask_output_dtype_reinterprets_bits():
    src = np.array([[1.5, 3.0, -2.0, 4.0]], np.float32)
    out = pl.gather(_t(src), mask_pattern=2, output_dtype=pl.INT32)
    assert out.dtype is pl.INT32
    np.testing.assert_array_equal(out.data, src[:, 1::2].view(np.int32))


def test_gather_compare_form():
    src = np.array([[1, 7, 7, 2, 7], [0, 0, 0, 0, 0]], np.int32)
    idx, counts = pl.gather(_t(src), kvalue=7, cmp_mode="eq", out_cols=2, offset=10)
    np.testing.assert_array_equal(idx.data, [[11, 12], [0, 0]])
    np.testing.assert_array_equal(counts.data, [[3], [0]])
    assert idx.dtype is pl.INT32 and counts.dtype is pl.INT32
    _, ge = pl.tile.gather(_t(src), kvalue=2, cmp_mode=5, out_cols=8)
    np.testing.assert_array_equal(ge.data, [[4], [0]])


def test_gather_tensor_level_in_a_program():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    i = RNG.integers(0, 16, (8, 8)).astype(np.int32)

    def body(x, i, y, m):
        pl.store(pl.load(pl.gather(x, dim=-1, index=i), [0, 0], [8, 8]), [0, 0], y)
        pl.store(pl.load(pl.tensor.gather(x, mask_pattern=1), [0, 0], [8, 8]), [0, 0], m)

    *_, y, m = run_in_rank(body, x, i, np.zeros((8, 8), np.float32), np.zeros((8, 8), np.float32))
    np.testing.assert_array_equal(y, torch.gather(torch.from_numpy(x), -1, torch.from_numpy(i).long()))
    np.testing.assert_array_equal(m, x[:, 0::2])


# -- gatherb ---------------------------------------------------------------------------------------------
def test_gatherb_copies_32_byte_blocks():
    src = np.arange(256, dtype=np.float32).reshape(1, 256)
    offs = (np.arange(32)[::-1] * 32).reshape(4, 8).astype(np.int32)  # blocks in reverse order
    out = pl.gatherb(_t(src), _t(offs))
    assert out.shape == [4, 64] and out.dtype is pl.FP32 and out.valid_shape == (4, 64)
    want = np.concatenate([src[0, o // 4:o // 4 + 8] for o in offs.reshape(-1)]).reshape(4, 64)
    np.testing.assert_array_equal(out.data, want)
    assert pl.gatherb is pl.tile.gatherb


def test_gatherb_output_dtype_and_valid_region():
    src = np.arange(64, dtype=np.int32).reshape(2, 32)
    offs = np.full((2, 8), 10**6, np.int32)  # the pad is never read
    offs[0, :2] = [32, 0]
    out = pl.tile.gatherb(_t(src), _t(offs, valid=(1, 2)), output_dtype=pl.INT16)
    assert out.shape == [2, 128] and out.valid_shape == (1, 32)
    np.testing.assert_array_equal(out.data[0, :32].view(np.int32), np.r_[8:16, 0:8])


@pytest.mark.parametrize("offs,err,msg", [
    (np.full((1, 8), 1000, np.int32), TileIndexError,
     "pl.tile.gatherb: index 1000 at position [0, 0] of offsets is outside [0, 993); a 32-byte block at that "
     "byte offset would run past src (1024 bytes)"),
    (np.zeros((1, 4), np.int32), TileValueError,
     "pl.tile.gatherb: offsets [1, 4] must be 2-D with a positive multiple of 8 entries per row"),
    (np.zeros((1, 8), np.int16), TileTypeError,
     "pl.tile.gatherb: offsets is a INT16 tile, but gatherb takes a UINT32 tile (INT32 in ptodist, which has no "
     "UINT32 type); build it with pl.tile.arange(0, shape, dtype=pl.INT32)"),
])
def test_gatherb_errors(offs, err, msg):
    with _raises(err, msg):
        pl.gatherb(_t(np.zeros((1, 256), np.float32)), _t(offs))


# -- scatter ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,np_dt,idx_dt", [(pl.FP32, np.float32, np.int32), (pl.INT32, np.int32, np.int32),
                                                (pl.FP16, np.float16, np.int16), (pl.BF16, None, np.int16),
                                                (pl.INT8, np.int8, np.int16), (pl.INT16, np.int16, np.int16)])
def test_scatter_last_write_wins(dtype, np_dt, idx_dt):
    base = RNG.integers(-50, 50, (8, 16)).astype(dtype.np_dtype if np_dt is None else np_dt)
    val = RNG.integers(-50, 50, (8, 8)).astype(base.dtype)
    idx = np.tile(np.repeat(np.arange(4), 2), (8, 1)).astype(idx_dt)  # every column 0..3 written twice
    out = pl.scatter(_t(base, dtype), dim=-1, index=_t(idx), src=_t(val, dtype))
    want = base.copy()
    for i in range(8):
        for m in range(8):
            want[i, idx[i, m]] = val[i, m]
    np.testing.assert_array_equal(out.data, want)
    _same(pl.tile.scatter(_t(base, dtype), -1, _t(idx), _t(val, dtype)), out)


def test_scatter_mask_form_keeps_unmarked_columns():
    dst = np.full((2, 8), -1.0, np.float32)
    inp = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = pl.scatter(_t(inp), mask_pattern=2, dst=_t(dst))
    np.testing.assert_array_equal(out.data, [[-1, 0, -1, 1, -1, 2, -1, 3], [-1, 4, -1, 5, -1, 6, -1, 7]])


@pytest.mark.parametrize("idx,err,msg", [
    (np.full((2, 2), 4, np.int32), TileIndexError, "pl.tile.scatter: index 4 at position [0, 0] of index is "
     "outside [0, 4); each index names a column of input"),
    (np.zeros((2, 2), np.int16), TileTypeError, "pl.tile.scatter: index is a INT16 tile, but scatter takes INT32 "
     "for it; convert it first with pl.cast(tile, target_type=pl.<dtype>)"),
])
def test_scatter_errors(idx, err, msg):
    with _raises(err, msg):
        pl.scatter(_t(np.zeros((2, 4), np.float32)), dim=-1, index=_t(idx), src=_t(np.ones((2, 2), np.float32)))
    with _raises(TileTypeError, "pl.tile.scatter: the second argument is the axis (dim=-1), got a Tile; call "
                                "pl.tile.scatter(input, -1, index, src)"):
        pl.tile.scatter(_t(np.zeros((2, 4), np.float32)), _t(idx), _t(np.ones((2, 2), np.float32)))


def test_scatter_tensor_level_in_a_program():
    base = np.zeros((4, 8), np.float32)
    idx = np.array([[7, 0], [1, 1], [2, 3], [6, 6]], np.int32)
    val = np.arange(8, dtype=np.float32).reshape(4, 2) + 1

    def body(base, idx, val, out):
        pl.store(pl.load(pl.scatter(base, dim=-1, index=idx, src=val), [0, 0], [4, 8]), [0, 0], out)

    *_, out = run_in_rank(body, base, idx, val, np.zeros((4, 8), np.float32))
    want = base.copy()
    for i in range(4):
        for m in range(2):
            want[i, idx[i, m]] = val[i, m]
    np.testing.assert_array_equal(out, want)


# -- scatter_update --------------------------------------------------------------------------------------
def test_scatter_update_rows_last_write_wins_both_call_forms():
    inp = RNG.standard_normal((32, 32)).astype(np.float32)
    flat = np.array([5, 5, 7, 2, 2, 9, 11, 3, 5, 13, 14, 15, 16, 17, 18, 19], np.int32)
    src = RNG.standard_normal((16, 32)).astype(np.float32)
    want = inp.copy()
    for k, r in enumerate(flat):
        want[r] = src[k]
    a = pl.scatter_update(_t(inp), -2, _t(flat.reshape(2, 8)), _t(src))
    b = pl.scatter_update(_t(inp), _t(flat.reshape(2, 8)), _t(src), dim=-2)
    c = pl.tile.scatter_update(_t(inp), -2, index=_t(flat.reshape(2, 8)), src=_t(src))
    np.testing.assert_array_equal(a.data, want)
    _same(a, b)
    _same(a, c)


def test_scatter_update_paged_4d_cache():
    cache = np.zeros((4, 8, 1, 16), np.float16)  # [blocks, block_size, 1, d]
    src = RNG.standard_normal((2, 3, 1, 16)).astype(np.float16)
    slots = np.array([[0, 9, 31], [8, 17, 30]], np.int32)
    out = pl.scatter_update(_t(cache), -2, _t(slots), _t(src))
    want = cache.reshape(-1, 16).copy()
    want[slots.reshape(-1)] = src.reshape(-1, 16)
    np.testing.assert_array_equal(out.data, want.reshape(cache.shape))


@pytest.mark.parametrize("call,err,msg", [
    (lambda i, x, s: pl.scatter_update(i, -1, x, s), TileValueError,
     "pl.tile.scatter_update: only dim=-2 is supported (whole rows), got -1"),
    (lambda i, x, s: pl.scatter_update(i, x), TileTypeError,
     "pl.tile.scatter_update takes (input, dim, index, src), (input, index, src, dim=-2) or "
     "(input, dim, index=..., src=...)"),
    (lambda i, x, s: pl.scatter_update(i, -2, _t(np.array([[0, 4]], np.int32)), s), TileIndexError,
     "pl.tile.scatter_update: index 4 at position [0, 1] of index is outside [0, 4); each index names one of "
     "input's 4 rows"),
    (lambda i, x, s: pl.scatter_update(i, -2, _t(np.array([[0, 1, 2]], np.int32)), s), TileValueError,
     "pl.tile.scatter_update: index [1, 3] names 3 rows but src [2, 8] holds 2; they must match"),
])
def test_scatter_update_errors(call, err, msg):
    with _raises(err, msg):
        call(_t(np.zeros((4, 8), np.float32)), _t(np.array([[0, 1]], np.int32)), _t(np.ones((2, 8), np.float32)))


def test_scatter_update_tensor_level_in_a_program():
    inp = np.zeros((8, 4), np.int32)
    idx = np.array([[6, 1, 6]], np.int32)
    src = np.arange(12, dtype=np.int32).reshape(3, 4) + 1

    def body(inp, idx, src, out):
        res = pl.scatter_update(inp, idx, src, dim=-2)
        pl.store(pl.load(res, [0, 0], [8, 4]), [0, 0], out)

    *_, out = run_in_rank(body, inp, idx, src, np.zeros((8, 4), np.int32))
    want = inp.copy()
    want[1], want[6] = src[1], src[2]
    np.testing.assert_array_equal(out, want)


# -- sort32 / mrgsort ------------------------------------------------------------------------------------
def _unpack(pairs: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    if dtype is pl.FP32:
        return pairs[..., 0::2], pairs.view(np.uint32)[..., 1::2]
    quads = pairs.reshape(*pairs.shape[:-1], -1, 4)
    return quads[..., 0], np.ascontiguousarray(quads[..., 2:]).view(np.uint32)[..., 0]


@pytest.mark.parametrize("dtype", [pl.FP32, pl.FP16])
def test_sort32_sorts_each_block_descending(dtype):
    src = RNG.standard_normal((2, 64)).astype(dtype.np_dtype)
    src[0, 3] = src[0, 7]  # a tie: the earlier position comes first
    idx = np.tile(np.arange(64, dtype=np.int32), (2, 1))
    out = pl.sort32(_t(src), _t(idx))
    width = 2 if dtype is pl.FP32 else 4
    assert out.shape == [2, 64 * width] and out.dtype is dtype
    vals, ids = _unpack(out.data, dtype)
    for b in range(2):
        blk = torch.from_numpy(src[:, 32 * b:32 * (b + 1)].astype(np.float32))
        v, o = torch.sort(blk, dim=-1, descending=True, stable=True)
        np.testing.assert_array_equal(vals[:, 32 * b:32 * (b + 1)], v.numpy().astype(src.dtype))
        np.testing.assert_array_equal(ids[:, 32 * b:32 * (b + 1)], o.numpy() + 32 * b)
    if dtype is pl.FP16:
        assert not out.data[:, 1::4].any()  # the reserved slot of each FP16 pair
    _same(pl.tile.sort32(_t(src), _t(idx)), out)


@pytest.mark.parametrize("src,idx,err,msg", [
    (np.zeros((1, 48), np.float32), np.zeros((1, 48), np.int32), TileValueError,
     "pl.tile.sort32: src has 48 valid columns, not a whole number of 32-element blocks; pad the row first "
     "(pl.fillpad(tile, pad_value=pl.PadValue.min))"),
    (np.zeros((1, 32), np.int32), np.zeros((1, 32), np.int32), TileTypeError,
     "pl.tile.sort32: src is a INT32 tile, but sort32 takes FP16, FP32 for it; convert it first with "
     "pl.cast(tile, target_type=pl.<dtype>)"),
    (np.zeros((1, 32), np.float32), np.zeros((1, 64), np.int32), TileValueError,
     "pl.tile.sort32: idx [1, 64] must have src's shape [1, 32]"),
])
def test_sort32_errors(src, idx, err, msg):
    with _raises(err, msg):
        pl.sort32(_t(src), _t(idx))


@pytest.mark.parametrize("dtype", [pl.FP32, pl.FP16])
def test_sort32_mrgsort_chain_is_a_full_topk(dtype):
    scores = RNG.permutation(512).astype(dtype.np_dtype).reshape(1, 512) / 8  # distinct, exact in FP16
    idx = np.arange(512, dtype=np.int32).reshape(1, 512)
    pairs = pl.sort32(_t(scores), _t(idx))
    w = 2 if dtype is pl.FP32 else 4
    bl = 32 * w
    while 4 * bl <= pairs.shape[-1]:  # 32-pair runs -> 128 -> 512
        pairs = pl.mrgsort(pairs, block_len=bl)
        bl *= 4
    vals, ids = _unpack(pairs.data, dtype)
    v, o = torch.sort(torch.from_numpy(scores[0].astype(np.float32)), descending=True)
    np.testing.assert_array_equal(vals[0], v.numpy().astype(scores.dtype))
    np.testing.assert_array_equal(ids[0], o.numpy())


def _sorted_pairs(values: np.ndarray, first: int) -> Tile:
    n = values.size
    return pl.sort32(_t(values.reshape(1, n)), _t(np.arange(first, first + n, dtype=np.int32).reshape(1, n)))


@pytest.mark.parametrize("ways", [2, 3, 4])
def test_mrgsort_format2_merges_sorted_tiles(ways):
    parts = [RNG.standard_normal(32).astype(np.float32) for _ in range(ways)]
    srcs = [_sorted_pairs(p, 32 * k) for k, p in enumerate(parts)]
    tmp, executed = _t(np.zeros((1, 64 * ways), np.float32)), _t(np.zeros((1, 4), np.int16))
    if ways == 4:
        out = pl.mrgsort(*srcs, tmp, executed)
    else:
        out = pl.mrgsort(*srcs, tmp=tmp, executed=executed)
    vals, ids = _unpack(out.data, pl.FP32)
    v, o = torch.sort(torch.from_numpy(np.concatenate(parts)), descending=True, stable=True)
    np.testing.assert_array_equal(vals[0], v.numpy())
    np.testing.assert_array_equal(ids[0], o.numpy())
    np.testing.assert_array_equal(executed.data[0, :ways], [32] * ways)


def test_mrgsort_exhausted_stops_at_the_first_emptied_source():
    a = _sorted_pairs(np.arange(32, dtype=np.float32) + 100, 0)  # all larger: used up first
    b = _sorted_pairs(np.arange(32, dtype=np.float32), 32)
    executed = _t(np.zeros((1, 4), np.int16))
    out = pl.tile.mrgsort(a, b, tmp=_t(np.zeros((1, 128), np.float32)), executed=executed, exhausted=True)
    assert out.shape == [1, 128] and out.valid_shape == (1, 64)
    np.testing.assert_array_equal(out.data[0, 0:64:2], np.arange(131, 99, -1))
    np.testing.assert_array_equal(executed.data[0, :2], [32, 0])


@pytest.mark.parametrize("call,err,msg", [
    (lambda a, b: pl.mrgsort(a, b), TileTypeError,
     "pl.tile.mrgsort: format2 on tiles needs the scratch tile tmp= (and executed=); pl.tensor.mrgsort / "
     "pl.mrgsort on tensors allocate it for you"),
    (lambda a, b: pl.mrgsort(a, block_len=48), TileValueError,
     "pl.tile.mrgsort: block_len=48 must be a positive multiple of 64 with the 64 valid columns a multiple of "
     "4 * block_len (192); each step merges 4 runs of block_len elements"),
    (lambda a, b: pl.mrgsort(a, b, block_len=64), TileTypeError,
     "pl.tile.mrgsort: format1 (block_len=) and format2 (src1, ..., tmp, executed, exhausted) are exclusive; do "
     "not pass format2 arguments with block_len"),
    (lambda a, b: pl.mrgsort(a), TileTypeError,
     "pl.tile.mrgsort needs block_len=<int> (format1) or 2 to 4 sorted tiles src0, src1[, src2[, src3]] "
     "(format2)"),
])
def test_mrgsort_errors(call, err, msg):
    a = _sorted_pairs(np.zeros(32, np.float32), 0)
    with _raises(err, msg):
        call(a, a)


def test_mrgsort_tensor_level_rejects_tile_scratch():
    def body(a, b):
        pl.mrgsort(a, b, tmp=a)

    with pytest.raises(RankError, match=re.escape(
            "TileTypeError: pl.tensor.mrgsort: tmp= and executed= are tile-level only; on tensors the scratch is "
            "allocated for you, so drop them (or call pl.tile.mrgsort on tiles)")):
        run_in_rank(body, np.zeros((1, 64), np.float32), np.zeros((1, 64), np.float32))


def test_sort_tensor_level_in_a_program():
    left = RNG.standard_normal((1, 32)).astype(np.float32)
    right = RNG.standard_normal((1, 32)).astype(np.float32)
    il = np.arange(32, dtype=np.int32).reshape(1, 32)

    def body(left, right, il, ir, out):
        merged = pl.mrgsort(pl.sort32(left, il), pl.sort32(right, ir))
        pl.store(pl.load(merged, [0, 0], [1, 128]), [0, 0], out)

    *_, out = run_in_rank(body, left, right, il, il + 32, np.zeros((1, 128), np.float32))
    assert pl.paged_gather is pl.tensor.paged_gather
    vals, ids = _unpack(out, pl.FP32)
    v, o = torch.sort(torch.from_numpy(np.concatenate([left[0], right[0]])), descending=True, stable=True)
    np.testing.assert_array_equal(vals[0], v.numpy())
    np.testing.assert_array_equal(ids[0], o.numpy())


# -- ops that read or write global memory: gather_row, paged_gather, mgather, mscatter -------------------
def test_gather_row_copies_a_gm_window_into_a_tile():
    pool = RNG.standard_normal((64, 32)).astype(np.float16)

    def body(pool, out, out_t):
        acc = pl.gather_row(pl.full([16, 32], dtype=pl.FP16, value=0.0), pool, [0, 0], [8, 0], [16, 32])
        pl.store(acc, [0, 0], out)
        acc_t = pl.tile.gather_row(pl.full([32, 4], dtype=pl.FP16, value=0.0), pool, [0, 1], [3, 0], [2, 32],
                                   transpose=True)
        pl.store(acc_t, [0, 0], out_t)

    _, out, out_t = run_in_rank(body, pool, np.zeros((16, 32), np.float16), np.zeros((32, 4), np.float16))
    np.testing.assert_array_equal(out, pool[8:24])
    np.testing.assert_array_equal(out_t[:, 1:3], pool[3:5].T)
    assert not out_t[:, [0, 3]].any()


def test_gather_row_into_an_accumulator_tensor_writes_it_in_place():
    pool = np.arange(64, dtype=np.float32).reshape(8, 8)

    def body(pool, out):
        acc = pl.create_tensor([4, 8], dtype=pl.FP32)
        res = pl.gather_row(acc, pool, [1, 0], [5, 0], [2, 8], valid_shape=[2, 4])
        assert res is acc
        pl.store(pl.load(acc, [0, 0], [4, 8]), [0, 0], out)

    _, out = run_in_rank(body, pool, np.zeros((4, 8), np.float32))
    want = np.zeros((4, 8), np.float32)
    want[1:3, :4] = pool[5:7, :4]
    np.testing.assert_array_equal(out, want)


def test_gather_row_errors():
    def body(pool):
        pl.gather_row(pl.full([4, 8], dtype=pl.FP32, value=0.0), pool, [2, 0], [0, 0], [4, 8])

    with pytest.raises(RankError, match=re.escape(
            "TileIndexError: pl.tile.gather_row: the window [4, 8] at dst_offset [2, 0] runs outside dst [4, 8]; shrink the "
            "window or move the offset")):
        run_in_rank(body, np.zeros((8, 8), np.float32))
    def outside(pool):
        pl.gather_row(pl.full([4, 8], dtype=pl.FP32, value=0.0), pool, [0, 0], [6, 0], [4, 8])

    with pytest.raises(RankError, match=re.escape(
            "TileIndexError: pl.tile.gather_row: the window [4, 8] at src_offset [6, 0] runs outside src [8, 8]; "
            "shrink the window or move the offset")):
        run_in_rank(outside, np.zeros((8, 8), np.float32))
    with _raises(TileTypeError, "pl.tile.gather_row: src must be a tensor in global memory, got Tile; gather_row "
                                "copies from GM (use pl.assemble between tiles)"):
        pl.tile.gather_row(_t(np.zeros((4, 8), np.float32)), _t(np.zeros((4, 8), np.float32)), [0, 0], [0, 0],
                           [4, 8])


def test_paged_attention_gathers_kv_through_a_block_table():
    """A tiny paged-attention step: K and V of one sequence gathered from a paged pool, then attention."""
    blocks, bs, d, seq = 8, 4, 16, 10
    k_pool = RNG.standard_normal((blocks * bs, d)).astype(np.float16)
    v_pool = RNG.standard_normal((blocks * bs, d)).astype(np.float16)
    table = np.array([5, 2, 7], np.int32)  # logical block -> physical block
    pos = np.arange(seq, dtype=np.int32)

    def body(k_pool, v_pool, pos, table, k_out, v_out):
        k = pl.paged_gather(k_pool, pos, table, block_size=bs, size=d, max_indices=16, space=MemorySpace.Vec)
        v = pl.paged_gather(v_pool, pos, table, bs, d, 16)
        pl.store(pl.load(k, [0, 0], [16, d]), [0, 0], k_out)
        pl.store(pl.load(v, [0, 0], [16, d]), [0, 0], v_out)

    *_, k_out, v_out = run_in_rank(body, k_pool, v_pool, pos, table, np.zeros((16, d), np.float16),
                                   np.zeros((16, d), np.float16))
    kt = torch.from_numpy(k_pool).view(blocks, bs, d)
    vt = torch.from_numpy(v_pool).view(blocks, bs, d)
    tp = torch.from_numpy(table).long()
    lp = torch.from_numpy(pos).long()
    k_ref, v_ref = kt[tp[lp // bs], lp % bs], vt[tp[lp // bs], lp % bs]
    np.testing.assert_array_equal(k_out[:seq], k_ref.numpy())
    np.testing.assert_array_equal(v_out[:seq], v_ref.numpy())
    assert not k_out[seq:].any()  # rows past the indices stay zero
    q = torch.from_numpy(RNG.standard_normal((1, d)).astype(np.float32))
    attn = torch.softmax(q @ torch.from_numpy(k_out[:seq]).float().T / d ** 0.5, -1) @ torch.from_numpy(
        v_out[:seq]).float()
    ref = torch.softmax(q @ k_ref.float().T / d ** 0.5, -1) @ v_ref.float()
    torch.testing.assert_close(attn, ref)


def test_paged_gather_transposed_and_errors():
    pool = np.arange(64, dtype=np.float32).reshape(16, 4)

    def body(pool, idx, table, out):
        t = pl.tensor.paged_gather(pool, idx, table, 4, 4, 2, col_off=0, is_trans=True)
        pl.store(pl.load(t, [0, 0], [4, 2]), [0, 0], out)

    *_, out = run_in_rank(body, pool, np.array([[1, 6]], np.int32), np.array([3, 0], np.int32),
                          np.zeros((4, 2), np.float32))
    np.testing.assert_array_equal(out, pool[[13, 2]].T)

    def bad(pool, idx, table):
        pl.paged_gather(pool, idx, table, 4, 4, 2)

    with pytest.raises(RankError, match=re.escape(
            "TileIndexError: pl.paged_gather: index 8 at position [1] of indices is outside [0, 8); a logical row must "
            "fall in one of the block table's 2 blocks of 4 rows")):
        run_in_rank(bad, pool, np.array([1, 8], np.int32), np.array([3, 0], np.int32))


@pytest.mark.parametrize("oob,want_rows", [("clamp", [3, 0, 63]), ("wrap", [3, 0, 1]), (3, [3, None, None])])
def test_mgather_rows_and_oob_policies(oob, want_rows):
    mem = RNG.standard_normal((64, 32)).astype(np.float32)
    idx = np.array([[3, -64, 65, 0]], np.int32)

    def body(mem, idx, out):
        t = pl.mgather(mem, pl.load(idx, [0, 0], [1, 4], valid_shape=[1, 3]), gather_oob=oob)
        pl.store(t, [0, 0], out)

    seed = np.full((4, 32), -123.0, np.float32)
    *_, out = run_in_rank(body, mem, idx, seed)
    for k, r in enumerate(want_rows):
        np.testing.assert_array_equal(out[k], mem[r] if r is not None else 0)
    np.testing.assert_array_equal(out[3], seed[3])  # past the index's valid region: not written


def test_mgather_elem_mode_and_undefined_oob():
    mem = np.arange(24, dtype=np.int32).reshape(4, 6)

    def body(mem, idx, out):
        pl.store(pl.tile.mgather(mem, pl.load(idx, [0, 0], [2, 8]), coalesce="elem"), [0, 0], out)

    idx = RNG.integers(0, 24, (2, 8)).astype(np.int32)
    *_, out = run_in_rank(body, mem, idx, np.zeros((2, 8), np.int32))
    np.testing.assert_array_equal(out, mem.reshape(-1)[idx])

    def bad(mem, idx):
        pl.mgather(mem, pl.load(idx, [0, 0], [1, 8]))

    with pytest.raises(RankError, match=re.escape(
            "TileIndexError: pl.tile.mgather: index 4 at position [5] of idx is outside [0, 4); pass gather_oob='clamp', 'wrap' "
            "or 'zero' to define out-of-range indices, or fix the index")):
        run_in_rank(bad, mem, np.array([[0, 1, 2, 3, 0, 4, 0, 0]], np.int32))
    with _raises(TileValueError, "pl.tile.mgather: coalesce must be one of 'row', 'elem' or 0..1, got 'col'"):
        pl.mgather(None, None, coalesce="col")


def test_mscatter_writes_flat_offsets_of_a_gm_tensor():
    src = RNG.standard_normal((8, 32)).astype(np.float32)
    perm = RNG.permutation(256).astype(np.int32).reshape(8, 32)
    perm[7, 31] = perm[0, 0]  # a duplicate: the later element (row-major) wins

    def body(src, idx, out):
        res = pl.mscatter(pl.load(src, [0, 0], [8, 32]), pl.load(idx, [0, 0], [8, 32]), out)
        assert res is out

    *_, out = run_in_rank(body, src, perm, np.full(256, 7.0, np.float32))
    want = np.full(256, 7.0, np.float32)
    want[perm.reshape(-1)] = src.reshape(-1)
    want[perm[0, 0]] = src[7, 31]
    np.testing.assert_array_equal(out, want)
    assert pl.mscatter is pl.tile.mscatter and pl.mgather is pl.tile.mgather


def test_mscatter_out_of_range():
    def body(src, idx, out):
        pl.mscatter(pl.load(src, [0, 0], [1, 8]), pl.load(idx, [0, 0], [1, 8]), out)

    with pytest.raises(RankError, match=re.escape(
            "TileIndexError: pl.tile.mscatter: index 16 at position [0, 2] of idx is outside [0, 16); offsets are flat element "
            "positions in output_tensor [16]")):
        run_in_rank(body, np.zeros((1, 8), np.float32), np.array([[0, 1, 16, 0, 0, 0, 0, 0]], np.int32),
                    np.zeros(16, np.float32))


def test_scatter_reads_only_the_valid_index_region():
    base = np.zeros((2, 4), np.float32)
    idx = np.full((2, 2), 99, np.int32)  # out-of-range garbage in the pad is never read
    idx[0, 0] = 3
    out = pl.scatter(_t(base, valid=(2, 3)), dim=-1, index=_t(idx, valid=(1, 1)),
                     src=_t(np.full((2, 2), 5.0, np.float32)))
    np.testing.assert_array_equal(out.data, [[0, 0, 0, 5], [0, 0, 0, 0]])
    assert out.valid_shape == (2, 3)
