"""Cross-core transfer: pipes between a core group's cube half and its vector lanes, block identity, buffers."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from conftest import run_in_rank

import ptodist.language as pl
from ptodist.errors import KernelValueError, ProgramError, TileTypeError, TileValueError
from ptodist.language.core_group import CoreGroup, defer_half, is_group, kernel_body, run_core_group
from ptodist.language.ops import pipes as P
from ptodist.language.tile_ops import Tile

HERE = re.escape(__file__)


def plain(msg: str) -> str:
    """An error message with this file's call sites written as SITE (their line numbers move with edits)."""
    return re.sub(HERE + r":\d+", "SITE", msg)


def raises(exc, fn, *args, **kwargs) -> str:
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    return plain(str(e.value))


def tile(shape, dtype=pl.FP32, valid=None, start=0):
    n = int(np.prod(shape))
    data = (np.arange(n) + start).reshape(shape)
    return Tile(data.astype(dtype.np_dtype), dtype, valid)


# -- namespaces ----------------------------------------------------------------------------------------------
SYSTEM_OPS = ["tpush_to_aiv", "tpush_to_aic", "tpop_from_aic", "tpop_from_aiv", "tfree_to_aic", "tfree_to_aiv",
              "aic_initialize_pipe", "aiv_initialize_pipe", "reserve_buffer", "import_peer_buffer"]


@pytest.mark.parametrize("name", SYSTEM_OPS)
def test_system_ops_are_reachable_three_ways(name):
    assert getattr(pl, name) is getattr(pl.system, name) is getattr(pl.tile, name)
    assert getattr(pl, name).__doc__.strip()


@pytest.mark.parametrize("name", ["aiv_shard", "aic_gather", "get_subblock_idx"])
def test_tile_reexports(name):
    assert getattr(pl, name) is getattr(pl.tile, name)


def test_auto_sentinel():
    assert P.AUTO == -1


# -- splitting between the lanes ----------------------------------------------------------------------------
DTYPES = [pl.FP32, pl.FP16, pl.BF16, pl.INT8, pl.INT16, pl.INT32, pl.INT64, pl.UINT8]
# (split, shape, valid_shape, lane_stride): the boundary along the split axis, per the split code
SPLITS = [
    (0, [4, 6], None, None),
    (1, [4, 6], None, None),
    (2, [4, 6], None, None),
    (3, [5, 6], None, None),
    (4, [4, 7], None, None),
    (1, [4, 6], [3, 5], None),  # a tail inside lane 1's half
    (1, [4, 6], [1, 6], None),  # lane 1 gets no valid rows
    (2, [4, 8], [4, 6], None),
    (3, [6, 4], [5, 4], 2),     # a balanced ragged boundary: lane 1 starts at row 2
]


def _expected_parts(t: Tile, split: int, lane_stride):
    if split == 0:
        return [(t.data, t.valid_shape)] * 2
    axis = 0 if split in (1, 3) else 1
    n = t.data.shape[axis]
    b = lane_stride if lane_stride is not None else (n + 1) // 2
    a, c = np.split(t.data, [b], axis=axis)
    v0, v1 = list(t.valid_shape), list(t.valid_shape)
    v0[axis] = min(t.valid_shape[axis], b)
    v1[axis] = max(0, t.valid_shape[axis] - b)
    return [(a, tuple(v0)), (c, tuple(v1))]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("split,shape,valid,lane_stride", SPLITS)
def test_cube_to_vector_split(dtype, split, shape, valid, lane_stride):
    src = tile(shape, dtype, valid)
    want = _expected_parts(src, split, lane_stride)

    def aic():
        pl.tpush_to_aiv(src, split=split, lane_stride=lane_stride)

    def aiv():
        lane = int(pl.get_subblock_idx())
        data, v = want[lane]
        t = pl.tpop_from_aic(shape=list(data.shape), dtype=dtype, split=split, lane_stride=lane_stride)
        got = (t.data.copy(), t.valid_shape, t.dtype)
        pl.tfree_to_aic(t)
        return got

    _, lanes = run_core_group(aic, aiv)
    for lane, (data, v, dt_) in enumerate(lanes):
        np.testing.assert_array_equal(data, want[lane][0])
        assert v == want[lane][1]
        assert dt_ is dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("split,shape,valid,lane_stride", [s for s in SPLITS if s[3] is None])
def test_vector_to_cube_join_inverts_the_split(dtype, split, shape, valid, lane_stride):
    src = tile(shape, dtype, valid)
    parts = _expected_parts(src, split, None)

    def aic():
        t = pl.tpop_from_aiv(shape=shape, dtype=dtype, split=split)
        got = (t.data.copy(), t.valid_shape)
        pl.tfree_to_aiv(t)
        return got

    def aiv():
        data, v = parts[int(pl.get_subblock_idx())]
        pl.tpush_to_aic(Tile(data.copy(), dtype, v), split=split)

    (data, v), _ = run_core_group(aic, aiv)
    np.testing.assert_array_equal(data, src.data)
    assert v == src.valid_shape


def test_split_zero_back_to_the_cube_takes_lane_0():
    def aic():
        t = pl.tpop_from_aiv(split=0)
        pl.tfree_to_aiv(t)
        return t.data.copy()

    def aiv():
        pl.tpush_to_aic(tile([2, 2], pl.FP32, start=10 * int(pl.get_subblock_idx())), split=0)

    got, _ = run_core_group(aic, aiv)
    np.testing.assert_array_equal(got, tile([2, 2]).data)


def test_push_copies_the_tile():
    src = tile([2, 4])

    def aic():
        pl.tpush_to_aiv(src, split=0)
        src.data[...] = -1  # the slot holds the pushed data, not the cube's buffer

    def aiv():
        t = pl.tpop_from_aic(split=0)
        pl.tfree_to_aic(t)
        return t.data.copy()

    _, lanes = run_core_group(aic, aiv, lanes=1)
    np.testing.assert_array_equal(lanes[0], np.arange(8, dtype=np.float32).reshape(2, 4))


def test_bf16_and_nan_cross_unchanged():
    data = np.array([[1.00390625, np.nan], [-np.inf, 3.0]], dtype=ml_dtypes.bfloat16)

    def aic():
        pl.tpush_to_aiv(Tile(data, pl.BF16), split=0)

    def aiv():
        t = pl.tpop_from_aic(dtype=pl.BF16)
        pl.tfree_to_aic(t)
        return t.data.copy()

    _, lanes = run_core_group(aic, aiv)
    for got in lanes:
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.astype(np.float32), data.astype(np.float32))


# -- ring depth and the halves running together --------------------------------------------------------------
def _ahead(n: int, init: dict | None, lanes: int = 2):
    """Run a producer pushing ``n`` tiles; return (the most it ran ahead of the releases, the values popped)."""
    log = []

    def aic():
        if init is not None:
            pl.aic_initialize_pipe(**init)
        for i in range(n):
            pl.tpush_to_aiv(Tile(np.full((2, 2), i, np.int32)), split=0)
            log.append("push")

    def aiv():
        if init is not None:
            pl.aiv_initialize_pipe(**init)
        got = []
        for _ in range(n):
            t = pl.tpop_from_aic(shape=[2, 2], dtype=pl.INT32)
            got.append(int(t.data[0, 0]))
            pl.tfree_to_aic(t)
            if int(pl.get_subblock_idx()) == lanes - 1:
                log.append("free")
        return got

    _, got = run_core_group(aic, aiv, lanes=lanes)
    ahead = most = 0
    for e in log:
        ahead += 1 if e == "push" else -1
        most = max(most, ahead)
    return most, got


@pytest.mark.parametrize("init,depth", [
    (None, 8),
    (dict(dir_mask=1, slot_size=64), 8),
    (dict(dir_mask=3, slot_size=64), 4),
    (dict(dir_mask=1, slot_size=64, slot_num=2), 2),
    (dict(dir_mask=1, slot_size=64, slot_num=1), 1),
    (dict(dir_mask=1, slot_size=64, slot_num=3, local_slot_num=2), 3),
])
def test_producer_runs_at_most_depth_ahead_and_does_not_deadlock(init, depth):
    most, got = _ahead(20, init)
    assert most == depth
    assert got == [list(range(20))] * 2


def test_one_lane_group():
    most, got = _ahead(5, dict(dir_mask=1, slot_size=64, slot_num=2), lanes=1)
    assert most == 2 and got == [list(range(5))]


def test_ping_pong_both_directions():
    def aic():
        pl.aic_initialize_pipe(dir_mask=3, slot_size=256)
        total = []
        for i in range(6):
            pl.tpush_to_aiv(tile([4, 4], pl.FP32, start=i), split=1)
            back = pl.tpop_from_aiv(shape=[4, 4], dtype=pl.FP32, split=1)
            total.append(back.data.copy())
            pl.tfree_to_aiv(back)
        return total

    def aiv():
        pl.aiv_initialize_pipe(dir_mask=3, slot_size=256)
        for _ in range(6):
            t = pl.tpop_from_aic(shape=[2, 4], dtype=pl.FP32, split=1)
            out = pl.tile.mul(t, 2.0)
            pl.tfree_to_aic(t)
            pl.tpush_to_aic(out, split=1)

    total, _ = run_core_group(aic, aiv)
    for i, got in enumerate(total):
        np.testing.assert_array_equal(got, tile([4, 4], pl.FP32, start=i).data * 2)


def test_pipes_by_id_are_separate():
    def aic():
        pl.tpush_to_aiv(tile([2, 2], start=100), split=0, id=1)
        pl.tpush_to_aiv(tile([2, 2], start=0), split=0)

    def aiv():
        a = pl.tpop_from_aic()
        b = pl.tpop_from_aic(id=1)
        pl.tfree_to_aic(a)
        pl.tfree_to_aic(b, id=1)
        return float(a.data[0, 0]), float(b.data[0, 0])

    _, lanes = run_core_group(aic, aiv)
    assert lanes == [(0.0, 100.0)] * 2


def test_block_identity():
    assert int(pl.get_subblock_idx()) == 0  # outside a mixed kernel
    assert pl.get_subblock_idx().dtype is pl.INDEX
    aic, lanes = run_core_group(lambda: int(pl.get_subblock_idx()), lambda: int(pl.get_subblock_idx()))
    assert aic == 0 and lanes == [0, 1]


# -- the protocol's errors -------------------------------------------------------------------------------------
OUTSIDE = ("pl.{op} at SITE: called outside a mixed kernel; it runs only in {want} of a core group (a "
           "pl.FunctionType.Group function calling its AIC and AIV functions, or "
           "ptodist.language.core_group.run_core_group). Move the call into that function.")


@pytest.mark.parametrize("op,call,want", [
    ("tpush_to_aiv", lambda: pl.tpush_to_aiv(tile([2, 2]), split=0), "an AIC (cube) function"),
    ("tpop_from_aic", lambda: pl.tpop_from_aic(), "an AIV (vector) function"),
    ("aic_initialize_pipe", lambda: pl.aic_initialize_pipe(dir_mask=1, slot_size=8), "an AIC (cube) function"),
    ("reserve_buffer", lambda: pl.reserve_buffer(name="b", size=8), "an AIC or AIV function"),
])
def test_outside_a_mixed_kernel(op, call, want):
    assert raises(ProgramError, call) == OUTSIDE.format(op=op, want=want)


def test_wrong_side():
    def aiv():
        pl.tpush_to_aiv(tile([2, 2]), split=0)

    msg = raises(ProgramError, run_core_group, None, aiv, name="k")
    assert msg == ("pl.tpush_to_aiv at SITE: runs in an AIC (cube) function, but AIV lane 0 (vector) 'aiv' called it; "
                   "on this side use pl.tpush_to_aic.")


def _cube_only(body):
    return raises((TileValueError, TileTypeError), run_core_group, body, lambda: None)


@pytest.mark.parametrize("body,msg", [
    (lambda: pl.tpush_to_aiv(tile([2, 2]), split=7),
     "pl.tpush_to_aiv: split=7 is not a split code; use one of 0=none, 1=up-down, 2=left-right, "
     "3=up-down (odd extent), 4=left-right (odd extent)"),
    (lambda: pl.tpush_to_aiv(tile([3, 2]), split=1),
     "pl.tpush_to_aiv: split=1 (up-down) halves axis 0 of a [3, 2] tile, but its extent 3 is odd; use split=3 "
     "for an odd extent"),
    (lambda: pl.tpush_to_aiv(tile([4]), split=1),
     "pl.tpush_to_aiv: split=1 (up-down) divides a 2-D tile, got shape [4]; reshape it to 2-D first or send it "
     "whole with split=0"),
    (lambda: pl.tpush_to_aiv(tile([4, 4]), split=2, lane_stride=4),
     "pl.tpush_to_aiv: lane_stride=4 must lie inside the split axis (0 < lane_stride < 4) of a [4, 4] tile"),
    (lambda: pl.tpush_to_aiv(np.zeros((2, 2)), split=0),
     "pl.tpush_to_aiv: takes a tile, got ndarray; pl.load the data into a tile first"),
    (lambda: pl.tpush_to_aiv(tile([2, 2]), split=0, id=-1),
     "pl.tpush_to_aiv: id=-1 is not a pipe id; pass a non-negative int (omit it for 0)"),
    (lambda: (pl.aic_initialize_pipe(dir_mask=1, slot_size=32), pl.tpush_to_aiv(tile([4, 4]), split=0)),
     "pl.tpush_to_aiv: the tile [4, 4] FP32 is 64 bytes, more than the 32-byte slots pipe 0 was set up with at "
     "SITE; raise slot_size or push a smaller tile"),
    (lambda: (pl.aic_initialize_pipe(dir_mask=2, slot_size=32), pl.tpush_to_aiv(tile([2, 2]), split=0)),
     "pl.tpush_to_aiv: pipe 0 was set up at SITE with dir_mask=2, which leaves out the cube->vector direction "
     "(bit 1); set it up with dir_mask=3"),
    (lambda: (pl.aic_initialize_pipe(dir_mask=1, slot_size=32), pl.tpop_from_aiv()),
     "pl.tpop_from_aiv: pipe 0 was set up at SITE with dir_mask=1, which leaves out the vector->cube direction "
     "(bit 2); set it up with dir_mask=3"),
    (lambda: pl.aic_initialize_pipe(dir_mask=4, slot_size=32),
     "pl.aic_initialize_pipe: dir_mask=4 names no direction; use 1 (cube->vector), 2 (vector->cube) or 3 (both)"),
    (lambda: pl.aic_initialize_pipe(dir_mask=1, slot_size=0),
     "pl.aic_initialize_pipe: slot_size=0 must be a positive number of bytes (the size of the tile that crosses)"),
    (lambda: pl.aic_initialize_pipe(dir_mask=1, slot_size=8, slot_num=0),
     "pl.aic_initialize_pipe: slot_num=0 must be a positive slot count (omit it for the default: 8, or 4 per "
     "direction when dir_mask=3)"),
    (lambda: pl.aic_initialize_pipe(dir_mask=3, slot_size=8, local_slot_num=5),
     "pl.aic_initialize_pipe: local_slot_num=5 must be between 1 and the ring's 4 slots"),
    (lambda: pl.aic_initialize_pipe("x", dir_mask=1, slot_size=8),
     "pl.aic_initialize_pipe: c2v_consumer_buf='x' is not a buffer address; pass an int, pl.AUTO or the Scalar "
     "pl.reserve_buffer / pl.import_peer_buffer returned"),
    (lambda: [pl.aic_initialize_pipe(dir_mask=1, slot_size=8) for _ in range(2)],
     "pl.aic_initialize_pipe at SITE: pipe 0 was set up already on AIC (cube) '<lambda>' at SITE; set up each pipe "
     "once per side (use id= for another pipe)"),
    (lambda: pl.tfree_to_aiv(tile([2, 2])),
     "pl.tfree_to_aiv at SITE: this [2, 2] FP32 tile holds no slot: it was not returned by pl.tpop_from_aiv, or it "
     "was released already. Pass the tile pl.tpop_from_aiv returned, once."),
    (lambda: pl.reserve_buffer(name="", size=8),
     "pl.reserve_buffer: name='' must be a non-empty string (the peer imports it by that name)"),
    (lambda: pl.reserve_buffer(name="b", size=-1),
     "pl.reserve_buffer: size=-1 must be a positive number of bytes"),
    (lambda: pl.reserve_buffer(name="b", size=8, base=-5),
     "pl.reserve_buffer: base=-5 must be a non-negative address or pl.AUTO"),
    (lambda: [pl.reserve_buffer(name="b", size=8) for _ in range(2)],
     "pl.reserve_buffer at SITE: AIC (cube) '<lambda>' reserved buffer 'b' already; reserve each name once per "
     "function"),
])
def test_bad_arguments(body, msg):
    assert _cube_only(body) == msg


def test_pop_checks_what_it_receives():
    def aic():
        pl.tpush_to_aiv(tile([4, 4]), split=1)

    def pop(**kw):
        def aiv():
            pl.tpop_from_aic(**kw)
        return aiv

    assert raises(TileValueError, run_core_group, aic, pop(split=1, shape=[4, 4])) == (
        "pl.tpop_from_aic: shape=[4, 4] but the tile in the slot is [2, 4]; declare the shape the producer pushed "
        "(halved along the split axis for a split push)")
    assert raises(TileTypeError, run_core_group, aic, pop(split=1, dtype=pl.FP16)) == (
        "pl.tpop_from_aic: dtype=FP16 but the tile in the slot is FP32; declare the dtype the producer pushed")
    assert raises(TileValueError, run_core_group, aic, pop(split=0)) == (
        "pl.tpop_from_aic: split=0 (none), but the tile was pushed with split=1 (up-down) by pl.tpush_to_aiv at "
        "SITE; the split code must match on both sides")


def test_join_needs_one_dtype():
    def aic():
        pl.tpop_from_aiv(split=1)

    def aiv():
        dtype = pl.FP32 if int(pl.get_subblock_idx()) == 0 else pl.FP16
        pl.tpush_to_aic(tile([2, 2], dtype), split=1)

    assert raises(TileTypeError, run_core_group, aic, aiv) == (
        "pl.tpop_from_aiv: the lanes pushed tiles of different dtypes (lane 0: FP32, lane 1: FP16); push the same "
        "dtype from every lane")


def test_free_twice_and_foreign_tile():
    def aic():
        pl.tpush_to_aiv(tile([2, 2]), split=0)

    def aiv():
        t = pl.tpop_from_aic()
        pl.tfree_to_aic(t)
        pl.tfree_to_aic(t)

    assert raises(TileValueError, run_core_group, aic, aiv, lanes=1) == (
        "pl.tfree_to_aic at SITE: this [2, 2] FP32 tile holds no slot of AIV lane 0: it was not returned by "
        "pl.tpop_from_aic there, or it was released already. Pass the tile pl.tpop_from_aic returned, once.")

    def aiv_id():
        pl.tfree_to_aic(pl.tpop_from_aic(), id=3)

    assert raises(TileValueError, run_core_group, aic, aiv_id, lanes=1) == (
        "pl.tfree_to_aic: id=3 but the tile was popped from pipe 0 by pl.tpop_from_aic; omit id= (it is taken "
        "from the pop) or pass the pop's id")


def test_setups_must_agree():
    def aic():
        pl.aic_initialize_pipe(dir_mask=1, slot_size=64, slot_num=2)

    def aiv():
        pl.aiv_initialize_pipe(dir_mask=1, slot_size=64, slot_num=4)

    assert raises(TileValueError, run_core_group, aic, aiv, lanes=1) == (
        "pl.aiv_initialize_pipe at SITE: pipe 0 is set up with (dir_mask, slot_size, slot_num) = (1, 64, 4), but "
        "the other side set it up with (1, 64, 2) at SITE; both sides must agree")


def test_push_never_popped():
    def aic():
        pl.tpush_to_aiv(tile([2, 2]), split=0)
        pl.tpush_to_aiv(tile([2, 2]), split=0)

    def aiv():
        pl.tfree_to_aic(pl.tpop_from_aic())

    assert raises(KernelValueError, run_core_group, aic, aiv, name="k") == (
        "mixed kernel 'k': pl.tpush_to_aiv at SITE: 1 tile(s) pushed on pipe 0 (cube->vector) for AIV lane 0 were "
        "never popped; the kernel ended with them in the ring. Pop each one with pl.tpop_from_aic on the other "
        "side, or push fewer.")


def test_pop_never_released():
    def aic():
        pl.tpush_to_aiv(tile([2, 2]), split=0)

    def aiv():
        pl.tpop_from_aic()

    assert raises(KernelValueError, run_core_group, aic, aiv, name="k") == (
        "mixed kernel 'k': pl.tpop_from_aic at SITE: 1 tile(s) popped from pipe 0 (cube->vector) on AIV lane 0 were "
        "never released; the kernel ended holding their slots. Call pl.tfree_to_aic(tile) once each popped tile is "
        "consumed.")

    def aic_pop():
        pl.tpop_from_aiv()

    def aiv_push():
        pl.tpush_to_aic(tile([2, 2]), split=0)

    assert raises(KernelValueError, run_core_group, aic_pop, aiv_push, name="k") == (
        "mixed kernel 'k': pl.tpop_from_aiv at SITE: 1 tile(s) popped from pipe 0 (vector->cube) were never "
        "released; the kernel ended holding their slots. Call pl.tfree_to_aiv(tile) once each popped tile is "
        "consumed.")


def test_pop_without_push():
    def aic():
        pl.tpush_to_aiv(tile([2, 2]), split=0)

    def aiv():
        for _ in range(2):
            pl.tfree_to_aic(pl.tpop_from_aic())

    assert raises(KernelValueError, run_core_group, aic, aiv, name="k") == (
        "mixed kernel 'k': pl.tpop_from_aic at SITE on AIV lane 0 (vector) 'aiv' pops a tile that was never pushed: "
        "pipe 0 (cube->vector) is empty and AIC (cube) 'aic' ended after 1 push(es) on it. Push one more tile on the "
        "producer side, or remove this pop.")


def test_pop_without_push_on_the_cube():
    def aic():
        pl.tpop_from_aiv()

    def aiv():
        pass

    assert raises(KernelValueError, run_core_group, aic, aiv, name="k") == (
        "mixed kernel 'k': pl.tpop_from_aiv at SITE on AIC (cube) 'aic' pops a tile that was never pushed: pipe 0 "
        "(vector->cube) is empty and AIV lane 0 (vector) 'aiv' and AIV lane 1 (vector) 'aiv' ended after 0 push(es) "
        "on it. Push one more tile on the producer side, or remove this pop.")


def test_missing_tfree_deadlocks_the_producer():
    def aic():
        pl.aic_initialize_pipe(dir_mask=1, slot_size=64, slot_num=2)
        for _ in range(3):
            pl.tpush_to_aiv(tile([2, 2]), split=0)

    def aiv():
        pl.aiv_initialize_pipe(dir_mask=1, slot_size=64, slot_num=2)
        for _ in range(3):
            pl.tpop_from_aic()  # never released

    assert raises(KernelValueError, run_core_group, aic, aiv, name="k", lanes=1) == (
        "mixed kernel 'k' deadlocked: no half can go on. AIC (cube) 'aic' waits in pl.tpush_to_aiv at SITE (pipe 0 "
        "(cube->vector), lane 0: all 2 slots are taken (0 pushed and not popped, 2 popped and not released)); AIV "
        "lane 0 (vector) 'aiv' waits in pl.tpop_from_aic at SITE (pipe 0 (cube->vector), lane 0: the ring is empty)"
        ". Every push needs a pop on the other side, every popped tile a tfree before the producer needs its slot "
        "again; a producer may run at most slot_num tiles ahead of its consumer.")


def test_both_sides_popping_first_deadlock():
    def aic():
        pl.tpop_from_aiv()
        pl.tpush_to_aiv(tile([2, 2]), split=0)

    def aiv():
        pl.tpop_from_aic()
        pl.tpush_to_aic(tile([2, 2]), split=0)

    assert raises(KernelValueError, run_core_group, aic, aiv, name="k", lanes=1) == (
        "mixed kernel 'k' deadlocked: no half can go on. AIC (cube) 'aic' waits in pl.tpop_from_aiv at SITE (pipe 0 "
        "(vector->cube): nothing pushed yet by AIV lane(s) 0); AIV lane 0 (vector) 'aiv' waits in pl.tpop_from_aic "
        "at SITE (pipe 0 (cube->vector), lane 0: the ring is empty). Every push needs a pop on the other side, "
        "every popped tile a tfree before the producer needs its slot again; a producer may run at most slot_num "
        "tiles ahead of its consumer.")


def test_an_error_in_one_half_stops_the_group():
    reached = []

    def aic():
        raise ValueError("boom")

    def aiv():
        pl.tpop_from_aic()
        reached.append(1)

    with pytest.raises(ValueError, match="^boom$"):
        run_core_group(aic, aiv)
    assert reached == []


# -- cross-core buffers -----------------------------------------------------------------------------------------
def test_reserve_and_import_peer_buffer():
    def aic():
        a = pl.reserve_buffer(name="v2c", size=100)
        b = pl.reserve_buffer(name="extra", size=8)
        c = pl.reserve_buffer(name="fixed", size=8, base=4096)
        d = pl.reserve_buffer(name="after", size=8, base=P.AUTO)
        peer = pl.import_peer_buffer(name="c2v", peer_func="aiv")  # waits until the vector side reserved it
        pl.aic_initialize_pipe(peer, a, dir_mask=3, slot_size=64)
        return [int(x) for x in (a, b, c, d, peer)], a.dtype

    def aiv():
        c2v = pl.reserve_buffer(name="c2v", size=256, base=512)
        mine = pl.import_peer_buffer(name="v2c", peer_func="aic")
        pl.aiv_initialize_pipe(c2v, mine, dir_mask=3, slot_size=64)
        return int(mine)

    (bases, dtype), lanes = run_core_group(aic, aiv)
    assert bases == [0, 128, 4096, 4128, 512] and dtype is pl.INT32
    assert lanes == [0, 0]


def test_import_errors():
    def unknown():
        pl.import_peer_buffer(name="b", peer_func="nobody")

    assert raises(TileValueError, run_core_group, unknown, lambda: None) == (
        "pl.import_peer_buffer at SITE: peer_func='nobody' is not a peer of AIC (cube) 'unknown' in this core group "
        "(its peers: '<lambda>'); name the function that calls pl.reserve_buffer")

    def aic():
        pl.import_peer_buffer(name="b", peer_func="aiv")

    def aiv():
        pass

    assert raises(TileValueError, run_core_group, aic, aiv) == (
        "pl.import_peer_buffer at SITE: 'aiv' finished without reserving a buffer named 'b'; reserve it there with "
        "pl.reserve_buffer(name='b', size=...)")


# -- split regions: aiv_shard / aic_gather -------------------------------------------------------------------
@pytest.mark.parametrize("split,shape", [(1, [4, 6]), (2, [4, 6]), (0, [3, 5])])
def test_shard_and_gather(split, shape):
    src = tile(shape, pl.INT32)

    def aiv():
        part = pl.aiv_shard(src)
        return part.data.copy(), pl.aic_gather(Tile(part.data * 10, part.dtype)).data.copy()

    _, lanes = run_core_group(None, aiv, split=split)
    want = _expected_parts(src, split, None)
    for lane, (part, joined) in enumerate(lanes):
        np.testing.assert_array_equal(part, want[lane][0])
        np.testing.assert_array_equal(joined, src.data * 10)


def test_shard_outside_a_split_region():
    msg = ("pl.aiv_shard at SITE: must be used inside a split_aiv region (the AIV lanes of a core group run with a "
           "split mode), which supplies the split mode; outside one there is no axis to split along")
    assert raises(ProgramError, pl.aiv_shard, tile([2, 2])) == msg
    assert raises(ProgramError, run_core_group, None, lambda: pl.aiv_shard(tile([2, 2]))) == msg


# -- a program: the halves load and store through the rank -----------------------------------------------------
def test_mixed_kernel_inside_a_rank():
    a = np.arange(64, dtype=np.float32).reshape(8, 8)

    def body(x, y):
        def cube(x, y):
            pl.aic_initialize_pipe(dir_mask=1, slot_size=8 * 4 * 4, slot_num=2)
            for r in range(0, 8, 4):
                t = pl.load(x, [r, 0], [4, 8])
                pl.tpush_to_aiv(t, split=2)  # each lane gets 4 columns

        def vector(x, y):
            pl.aiv_initialize_pipe(dir_mask=1, slot_size=8 * 4 * 4, slot_num=2)
            lane = int(pl.get_subblock_idx())
            for r in range(0, 8, 4):
                t = pl.tpop_from_aic(shape=[4, 4], dtype=pl.FP32, split=2)
                pl.store(pl.tile.add(t, 1.0), [r, 4 * lane], y)
                pl.tfree_to_aic(t)

        run_core_group(cube, vector, x, y)

    _, out = run_in_rank(body, a, np.zeros_like(a))
    np.testing.assert_array_equal(out, a + 1)


# -- a group function's halves ---------------------------------------------------------------------------------
class _Fn:
    """A stand-in for a program function of a given FunctionType (what the rank's context sees)."""

    def __init__(self, fn, type_):
        self.fn, self.name, self.options = fn, fn.__name__, {"type": type_}

    def invoke(self, *args):
        return self.fn(*args)

    def bind_arguments(self, args, kwargs):
        return list(args)


def test_group_function_runs_its_halves_together():
    from ptodist.language import core_group as R

    def aic_fn(n):
        for i in range(n):
            pl.tpush_to_aiv(Tile(np.full((2, 2), i, np.int32)), split=1)

    def aiv_fn(n):
        got = []
        for _ in range(n):
            t = pl.tpop_from_aic(split=1)
            got.append(int(t.data[0, 0]))
            pl.tfree_to_aic(t)
        return got

    aic, aiv = _Fn(aic_fn, pl.FunctionType.AIC), _Fn(aiv_fn, pl.FunctionType.AIV)

    def group_fn(n):
        assert R.collecting(aic) and R.collecting(aiv)
        defer_half(aic, (n,), {})
        return defer_half(aiv, (n,), {})  # a collected call: its result is known once the group ran

    group = _Fn(group_fn, "Group")
    assert is_group(group) and not is_group(aic)
    assert kernel_body(group, [12])() == list(range(12))
    assert not R.collecting(aic)


def test_core_group_needs_a_lane():
    assert raises(ProgramError, CoreGroup, "k", None, (lambda: None, ()), lanes=0) == (
        "core group 'k': lanes=0; a core group has at least one AIV lane")


M, N = 8, 8


@pytest.mark.skipif(not hasattr(pl.FunctionType, "Group"),
                    reason="pl.FunctionType.Group and its rank integration are not wired in yet")
def test_group_function_in_a_program():
    from ptodist import ir

    @pl.program
    class Mixed:
        @pl.function(type=pl.FunctionType.AIC)
        def mm_aic(self, x: pl.Tensor[[M, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
            pl.aic_initialize_pipe(dir_mask=1, slot_size=M * N * 4, slot_num=2)
            for i in pl.range(4):
                pl.tile.tpush_to_aiv(pl.tile.add(pl.load(x, [0, 0], [M, N]), float(i)), split=1)

        @pl.function(type=pl.FunctionType.AIV)
        def mm_aiv(self, x: pl.Tensor[[M, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
            pl.aiv_initialize_pipe(dir_mask=1, slot_size=M * N * 4, slot_num=2)
            acc = None
            for _ in pl.range(4):  # more pushes than the ring holds: the cube waits for the lanes
                t = pl.tile.tpop_from_aic(shape=[M // 2, N], dtype=pl.FP32, split=1)
                acc = t if acc is None else pl.tile.add(acc, t)
                pl.system.tfree_to_aic(t)
            return pl.store(acc, [int(pl.get_subblock_idx()) * (M // 2), 0], out)

        @pl.function(type=pl.FunctionType.Group)
        def mm(self, x: pl.Tensor[[M, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
            self.mm_aic(x, out)
            return self.mm_aiv(x, out)

        @pl.function(type=pl.FunctionType.Orchestration)
        def main(self, x: pl.Tensor[[M, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
            return self.mm(x, out)

    x = np.arange(M * N, dtype=np.float32).reshape(M, N)
    out = np.zeros_like(x)
    ir.compile(Mixed, platform="a2a3sim")(x, out)
    np.testing.assert_array_equal(out, 4 * x + 6)
