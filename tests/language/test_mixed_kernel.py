"""Automatic mixed kernels: pl.split_aiv regions, pl.split / pl.cross_core_slot, pl.cluster, pl.system.syncall.

The constructs live in ``ptodist.language.mixed`` (spelled ``M.`` here, so that this file runs whether or not
``ptodist.language`` re-exports them yet); the tests that need the re-exports or the region wiring skip
without them.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import on_every_rank, run_in_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir
from ptodist.errors import KernelValueError, ProgramError, TileTypeError, TileValueError
from ptodist.language import mixed as M
from ptodist.language.core_group import CoreGroup, run_core_group
from ptodist.language.ops import pipes as P
from ptodist.language.regions import Region
from ptodist.language.tile_ops import Tile

HERE = re.escape(__file__)
EXPORTED = hasattr(pl, "split_aiv")
WIRED = "split" in pl.at(level=pl.Level.CORE_GROUP, optimizations=[M.split(M.SplitMode.UP_DOWN)]).options
needs_exports = pytest.mark.skipif(not EXPORTED, reason="ptodist.language does not re-export the constructs yet")
needs_wiring = pytest.mark.skipif(not WIRED, reason="pl.at does not record optimizations= yet")


def plain(msg: str) -> str:
    """An error message with this file's sites written as SITE (line numbers move with edits)."""
    return re.sub(HERE + r":\d+", "SITE", re.sub(r"\(line \d+\)", "(line N)", msg))


def raises(exc, fn, *args, **kwargs) -> str:
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    return plain(str(e.value))


def rand(*shape, seed=0, dtype=np.float32) -> Tile:
    return Tile(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


# -- the names ------------------------------------------------------------------------------------------------
def test_split_modes_are_the_split_codes():
    assert [(m.name, int(m)) for m in M.SplitMode] == [("NONE", 0), ("UP_DOWN", 1), ("LEFT_RIGHT", 2)]
    assert [k.name for k in M.KernelType] == ["AIC", "AIV", "MIX"]
    assert [k.name for k in M.SyncAllMode] == ["HARD", "SOFT"]


@needs_exports
@pytest.mark.parametrize("name", ["split_aiv", "SplitMode", "KernelType", "SyncAllMode", "split", "cross_core_slot",
                                  "cluster"])
def test_exported_from_pl(name):
    assert getattr(pl, name) is getattr(M, name)


@needs_exports
@pytest.mark.parametrize("name", ["syncall", "cacheinvalid", "fence", "KernelType", "SyncAllMode"])
def test_exported_from_pl_system(name):
    assert getattr(pl.system, name) is getattr(M, name)


@pytest.mark.parametrize("fn", [M.split_aiv, M.split, M.cross_core_slot, M.syncall, M.cacheinvalid, M.fence,
                                M.cluster])
def test_every_construct_has_a_one_line_doc(fn):
    assert fn.__doc__.strip().splitlines()[0]


# -- optimizations= -------------------------------------------------------------------------------------------
def test_optimization_entries():
    assert M.split(M.SplitMode.UP_DOWN) == M.Split(M.SplitMode.UP_DOWN)
    assert M.cross_core_slot(slot_num=2) == M.CrossCoreSlot(2)
    opts = M.region_options([M.split(M.SplitMode.LEFT_RIGHT), M.cross_core_slot(slot_num=4)])
    assert opts["split"] is M.SplitMode.LEFT_RIGHT and opts["slot_num"] == 4
    assert M.region_options(None) == {}
    with pytest.warns(DeprecationWarning, match="pl.cross_core_slot"):
        old = M.split(M.SplitMode.NONE, slot_num=3)
    assert M.region_options([old])["slot_num"] == 3


@pytest.mark.parametrize("call, exc, msg", [
    (lambda: M.split(1), TileTypeError,
     "pl.split: mode=1 is not a split mode; pass pl.SplitMode.NONE, pl.SplitMode.UP_DOWN or pl.SplitMode.LEFT_RIGHT"),
    (lambda: M.cross_core_slot(slot_num=0), TileValueError,
     "pl.cross_core_slot: slot_num=0 must be a positive int (the number of tiles the cross-core ring holds)"),
    (lambda: M.cross_core_slot(slot_num=True), TileValueError,
     "pl.cross_core_slot: slot_num=True must be a positive int (the number of tiles the cross-core ring holds)"),
    (lambda: M.region_options(M.cross_core_slot(slot_num=2)), TileTypeError,
     "pl.at: optimizations=CrossCoreSlot(slot_num=2) must be a list of pl.split(...) / pl.cross_core_slot(...) "
     "entries"),
    (lambda: M.region_options(["split"]), TileTypeError,
     "pl.at: optimizations entry 'split' is not an optimization; use pl.split(mode) or "
     "pl.cross_core_slot(slot_num=n)"),
    (lambda: M.region_options([M.cross_core_slot(slot_num=2), M.cross_core_slot(slot_num=4)]), TileValueError,
     "pl.at: optimizations= has two pl.cross_core_slot entries; give each once"),
])
def test_optimization_errors(call, exc, msg):
    assert raises(exc, call) == msg


@needs_wiring
def test_pl_at_records_the_optimizations():
    r = pl.at(level=pl.Level.CORE_GROUP, optimizations=[M.split(M.SplitMode.UP_DOWN), M.cross_core_slot(slot_num=2)])
    assert r.options["split"] is M.SplitMode.UP_DOWN and r.options["slot_num"] == 2
    s = pl.spmd(4, optimizations=[M.split(M.SplitMode.LEFT_RIGHT)])
    assert s.options["split"] is M.SplitMode.LEFT_RIGHT


def test_a_region_s_options_reach_the_core_groups_started_in_it():
    seen = []

    def aic():
        state = P.current_half().group.state
        seen.append((state.split, state.depth(0)))

    region = Region("at", options={"split": M.SplitMode.LEFT_RIGHT, "slot_num": 3})
    M.scoped(region, lambda: run_core_group(aic, None))()
    run_core_group(aic, None)
    assert seen == [(2, 3), (None, 8)]
    assert M.current_options() == {}


def test_a_scoped_body_passes_for_the_body():
    def body(x, y):
        return M.current_options(), x + y

    region = Region("at", options={"slot_num": 4})
    wrapped = M.scoped(region, body)
    assert wrapped.__code__ is body.__code__ and wrapped.__name__ == "body"
    assert wrapped(1, 2) == ({"slot_num": 4}, 3)
    assert M.scoped(Region("at"), body) is body  # nothing to scope


def test_a_region_without_options_runs_with_the_enclosing_one_s():
    outer, inner = Region("at", options={"split": M.SplitMode.UP_DOWN}), Region("at")
    M.enter_region(outer)
    M.enter_region(inner)
    try:
        assert M.current_options() == {"split": M.SplitMode.UP_DOWN}
    finally:
        M.exit_region()
        M.exit_region()
    assert M.current_options() == {}


def test_cross_core_slot_is_the_depth_of_a_pipe_set_up_without_slot_num():
    def aic():
        pl.aic_initialize_pipe(dir_mask=1, slot_size=64)
        for i in range(3):  # a 2-slot ring: the third push waits for the lanes
            pl.tile.tpush_to_aiv(Tile(np.full((2, 4), i, np.float32)), split=0)

    def aiv():
        pl.aiv_initialize_pipe(dir_mask=1, slot_size=64)
        depth = P.current_half().group.state.depth(0)
        got = []
        for _ in range(3):
            t = pl.tile.tpop_from_aic(split=0)
            got.append(float(t.data[0, 0]))
            pl.system.tfree_to_aic(t)
        return depth, got

    region = Region("at", options={"slot_num": 2})
    _, lanes = M.scoped(region, lambda: run_core_group(aic, aiv))()
    assert lanes == [(2, [0.0, 1.0, 2.0])] * 2


# -- pl.split_aiv: the lanes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(M.SplitMode))
def test_split_aiv_runs_the_body_once_per_lane(mode):
    seen = []
    for aiv_id in M.split_aiv(2, mode=mode):
        seen.append((int(aiv_id), aiv_id.dtype, int(pl.get_subblock_idx())))
    assert seen == [(0, pl.INDEX, 0), (1, pl.INDEX, 1)]
    assert P.current_half() is None and int(pl.get_subblock_idx()) == 0


# (mode, what aiv_shard gives lane 0 and lane 1 of an [8, 6] tile)
SHARDS = [
    (M.SplitMode.NONE, (slice(0, 8), slice(0, 6)), (slice(0, 8), slice(0, 6))),
    (M.SplitMode.UP_DOWN, (slice(0, 4), slice(0, 6)), (slice(4, 8), slice(0, 6))),
    (M.SplitMode.LEFT_RIGHT, (slice(0, 8), slice(0, 3)), (slice(0, 8), slice(3, 6))),
]


@pytest.mark.parametrize("mode, lane0, lane1", SHARDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_aiv_shard_and_aic_gather_per_mode(mode, lane0, lane1, dtype):
    mm = rand(8, 6, dtype=dtype) if dtype != np.int32 else Tile(np.arange(48, dtype=np.int32).reshape(8, 6))
    parts = []
    for _aiv_id in M.split_aiv(2, mode=mode):
        part = pl.aiv_shard(mm)
        parts.append(part.data.copy())
        back = pl.aic_gather(part)
    np.testing.assert_array_equal(parts[0], mm.data[lane0])
    np.testing.assert_array_equal(parts[1], mm.data[lane1])
    np.testing.assert_array_equal(back.data, mm.data)
    assert back.dtype == mm.dtype and back.valid_shape == (8, 6)


def test_a_gather_in_a_none_region_takes_lane_0_s_tile():
    for aiv_id in M.split_aiv(2, mode=M.SplitMode.NONE):
        v = pl.aic_gather(Tile(np.full((2, 2), int(aiv_id), np.int32)))
    np.testing.assert_array_equal(v.data, np.zeros((2, 2)))


def test_gather_joins_the_valid_region():
    mm = Tile(np.ones((8, 4), np.float32), valid_shape=(6, 3))
    for _ in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        half = pl.aiv_shard(mm)
        g = pl.aic_gather(half)
    assert g.valid_shape == (6, 3)


def test_a_cube_vector_cube_chain_of_tiles():
    def attention(q, k, w):
        s = pl.matmul(q, k)  # cube
        for _aiv_id in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
            p = pl.exp(pl.aiv_shard(s))  # vector, one half of the rows per lane
            p = pl.aic_gather(p)
        return pl.matmul(p, w)  # cube again

    q, k, w = rand(16, 8, seed=1), rand(8, 16, seed=2), rand(16, 4, seed=3)
    out = attention(q, k, w)
    want = torch.exp(torch.from_numpy(q.data) @ torch.from_numpy(k.data)) @ torch.from_numpy(w.data)
    torch.testing.assert_close(torch.from_numpy(out.data), want, rtol=1e-5, atol=1e-5)


R, K, C = 16, 8, 32


@pytest.mark.parametrize("mode", list(M.SplitMode))
def test_a_mixed_kernel_per_mode_in_a_rank(mode):
    def body(a, b, bias, out):
        mm = pl.matmul(pl.load(a, [0, 0], [R, K]), pl.load(b, [0, 0], [K, C]))  # cube (AIC)
        for aiv_id in M.split_aiv(2, mode=mode):
            part = pl.aiv_shard(mm)  # this lane's share of the cube's result
            rows, cols = part.shape
            if mode is M.SplitMode.NONE:  # both lanes see it whole: dispatch the rows by aiv_id
                rows = R // 2
                part = pl.slice(part, [rows, C], [aiv_id * rows, 0])
            r0 = aiv_id * rows if mode is not M.SplitMode.LEFT_RIGHT else 0
            c0 = aiv_id * cols if mode is M.SplitMode.LEFT_RIGHT else 0
            v = pl.add(pl.exp(part), pl.load(bias, [r0, c0], [rows, cols]))
            pl.store(v, [r0, c0], out)

    g = np.random.default_rng(4)
    a, b = (g.standard_normal((R, K)) / 4).astype(np.float32), (g.standard_normal((K, C)) / 4).astype(np.float32)
    bias = g.standard_normal((R, C)).astype(np.float32)
    *_, out = run_in_rank(body, a, b, bias, np.zeros((R, C), np.float32))
    want = torch.exp(torch.from_numpy(a) @ torch.from_numpy(b)) + torch.from_numpy(bias)
    torch.testing.assert_close(torch.from_numpy(out), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [M.SplitMode.UP_DOWN, M.SplitMode.LEFT_RIGHT, M.SplitMode.NONE])
def test_tensors_cross_too(mode):
    # The @pl.jit form: the operands of aiv_shard / aic_gather are tensors.
    def body(q, k, out):
        mm = pl.matmul(q, k)
        for _aiv_id in M.split_aiv(2, mode=mode):
            v = pl.exp(pl.aiv_shard(mm))
            g = pl.aic_gather(v)
        pl.store(pl.load(g, [0, 0], [R, C]), [0, 0], out)

    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((R, K)) / 4).astype(np.float32), (rng.standard_normal((K, C)) / 4).astype(np.float32)
    *_, out = run_in_rank(body, q, k, np.zeros((R, C), np.float32))
    torch.testing.assert_close(torch.from_numpy(out), torch.exp(torch.from_numpy(q) @ torch.from_numpy(k)),
                               rtol=1e-5, atol=1e-5)


@needs_exports
@needs_wiring
def test_the_tutorial_s_automatic_split():
    @pl.jit
    def mixed(a: pl.Tensor[[128, 256], pl.FP16], b: pl.Tensor[[256, 128], pl.FP16],
              bias: pl.Tensor[[128, 128], pl.FP32], out: pl.Out[pl.Tensor[[128, 128], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP,
                   optimizations=[pl.split(pl.SplitMode.UP_DOWN), pl.cross_core_slot(slot_num=2)], name_hint="mixed"):
            acc = pl.matmul(a, b, out_dtype=pl.FP32)
            out = pl.assemble(out, pl.add(acc, bias), [0, 0])
        return out

    torch.manual_seed(0)
    a, b = torch.randn(128, 256, dtype=torch.float16), torch.randn(256, 128, dtype=torch.float16)
    bias, out = torch.randn(128, 128), torch.zeros(128, 128)
    mixed(a, b, bias, out, config=RunConfig())
    torch.testing.assert_close(out, a.float() @ b.float() + bias, rtol=1e-2, atol=1e-2)


@needs_exports
def test_explicit_regions_in_a_pl_at_block():
    @pl.jit
    def attn(q: pl.Tensor[[R, K], pl.FP32], k: pl.Tensor[[K, C], pl.FP32], w: pl.Tensor[[C, 8], pl.FP32],
             out: pl.Out[pl.Tensor[[R, 8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP):
            mm = pl.matmul(q, k)
            for _aiv_id in pl.split_aiv(2, mode=pl.SplitMode.LEFT_RIGHT):
                kv = pl.aic_gather(pl.exp(pl.aiv_shard(mm)))
            pl.store(pl.load(pl.matmul(kv, w), [0, 0], [R, 8]), [0, 0], out)
        return out

    torch.manual_seed(1)
    q, k, w, out = torch.randn(R, K) / 4, torch.randn(K, C) / 4, torch.randn(C, 8), torch.zeros(R, 8)
    attn(q, k, w, out, config=RunConfig())
    torch.testing.assert_close(out, torch.exp(q @ k) @ w, rtol=1e-4, atol=1e-4)


@needs_exports
def test_the_scopes_page_phases_with_a_barrier_between():
    # Two vector phases in NONE regions, a barrier and the cube work between them (upstream's scopes page).
    @pl.jit
    def phases(x: pl.Tensor[[R, C], pl.FP32], q: pl.Tensor[[R, K], pl.FP32], k: pl.Tensor[[K, C], pl.FP32],
               bias: pl.Tensor[[R, C], pl.FP32], out: pl.Out[pl.Tensor[[R, C], pl.FP32]],
               out2: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP):
            for aiv_id in pl.split_aiv(2, mode=pl.SplitMode.NONE):  # phase 1: per-lane rows via aiv_id
                r0 = aiv_id * (R // 2)
                pl.store(pl.mul(pl.load(x, [r0, 0], [R // 2, C]), 2.0), [r0, 0], out)
            pl.system.syncall(core_type=pl.KernelType.MIX)  # between the phases: holds at once here
            mm = pl.matmul(q, k)  # cube
            for _ in pl.split_aiv(2, mode=pl.SplitMode.NONE):  # phase 2: full width on both lanes
                out2[:] = pl.add(pl.aiv_shard(mm), bias)
        return out

    torch.manual_seed(2)
    x, q, k, bias = torch.randn(R, C), torch.randn(R, K), torch.randn(K, C), torch.randn(R, C)
    out, out2 = torch.zeros(R, C), torch.zeros(R, C)
    phases(x, q, k, bias, out, out2, config=RunConfig())
    torch.testing.assert_close(out, 2 * x)
    torch.testing.assert_close(out2, q @ k + bias, rtol=1e-5, atol=1e-5)


# -- a notify in a NONE region fires once per lane ------------------------------------------------------------
NR = 2


def _signal_program(guarded: bool):
    @pl.jit.incore
    def k(y: pl.Out[pl.Tensor[[NR, 1], pl.INT32]],
          sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
        ctx = pld.get_comm_ctx(sig)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        peer = (me + 1) % n
        for aiv_id in M.split_aiv(2, mode=M.SplitMode.NONE):
            if not guarded or aiv_id == 0:
                pld.system.notify(sig, peer, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
        for aiv_id in M.split_aiv(2, mode=M.SplitMode.NONE):  # "done", once: after the counter's notifies
            if aiv_id == 0:
                pld.system.notify(sig, peer, [1, 0], 1, op=pld.NotifyOp.AtomicAdd)
        pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)
        for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
            pl.store(pl.load(sig, [0, 0], [NR, 1]), [0, 0], y)
        return y

    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(NR))))
    return ir.compile(on_every_rank(k), config=config)


@pytest.mark.parametrize("guarded, count", [(False, 2), (True, 1)])
def test_a_notify_in_a_none_region_runs_on_both_lanes(guarded, count):
    # Upstream's documented pitfall: the body of a NONE region runs on both AIV lanes, so an unsharded
    # AtomicAdd notify reaches the peer twice; guarding it with `if aiv_id == 0` sends it once.
    y = _signal_program(guarded)(np.zeros((NR, NR, 1), np.int32))
    assert y[:, 0, 0].tolist() == [count] * NR  # the counter each rank's peer bumped
    assert y[:, 1, 0].tolist() == [1] * NR  # the guarded "done" signal


# -- upstream's rules for a function that opens a region ------------------------------------------------------
def cube_op_inside(a, b):
    for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
        pl.matmul(a, b)


def unnamed_cube_to_vector(a, b):
    mm = pl.matmul(a, b)
    for _ in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        pl.exp(mm)


def unnamed_vector_to_cube(a, b):
    mm = pl.matmul(a, b)
    for _ in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        v = pl.exp(pl.aiv_shard(mm))
    return pl.matmul(v, b)


def vector_op_outside(a, b):
    mm = pl.matmul(a, b)
    e = pl.exp(mm)
    for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
        pl.exp(pl.aiv_shard(mm))
    return e


def crossings_disagree(a, b):
    mm = pl.matmul(a, b)
    for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
        pl.exp(pl.aiv_shard(mm))
    for _ in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        pl.exp(pl.aiv_shard(mm))


def split_axes_differ(a, b):  # UP_DOWN beside LEFT_RIGHT: both split, so one pipe serves them
    mm = pl.matmul(a, b)
    for _ in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        x = pl.aic_gather(pl.exp(pl.aiv_shard(mm)))
    for _ in M.split_aiv(2, mode=M.SplitMode.LEFT_RIGHT):
        y = pl.aic_gather(pl.exp(pl.aiv_shard(mm)))
    return pl.matmul(x, b), pl.matmul(y, b)


def shard_by_keyword(a, b):
    mm = pl.matmul(a, b)
    for _ in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        x = pl.aic_gather(pl.exp(pl.aiv_shard(x=mm)))
    return pl.matmul(x, b)


def none_region_without_crossing(a, b):  # a region that does not cross may use any mode
    mm = pl.matmul(a, b)
    for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
        pass
    for _ in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        x = pl.aic_gather(pl.exp(pl.aiv_shard(mm)))
    return x


RULES = [
    (cube_op_inside,
     "cube op 'pl.matmul' at SITE is inside the pl.split_aiv region at SITE: a region's body runs on the AIV "
     "(vector) lanes. Move the cube op out of the region and read its result inside with pl.aiv_shard(...)"),
    (unnamed_cube_to_vector,
     "'mm' is produced on the cube (AIC) lane by pl.matmul at SITE and read on the vector (AIV) lane inside the "
     "pl.split_aiv region at SITE (line N) without naming the crossing; read it as pl.aiv_shard(mm) at the top of "
     "the region"),
    (unnamed_vector_to_cube,
     "'v' is defined inside the pl.split_aiv region at SITE, but pl.matmul at SITE reads it on the cube (AIC) lane "
     "outside the region without naming the crossing; gather it inside the region: v = pl.aic_gather(v)"),
    (vector_op_outside,
     "vector op 'pl.exp' at SITE sits outside every pl.split_aiv region, but this function opens one at SITE: "
     "once a function opens a region, its vector work runs only inside one. Wrap that phase in "
     "`for _ in pl.split_aiv(2, mode=pl.SplitMode.NONE):`"),
    (crossings_disagree,
     "'pl.aiv_shard(mm)' at SITE crosses the AIC/AIV boundary under SplitMode.UP_DOWN (split), but "
     "'pl.aiv_shard(mm)' at SITE, earlier in this function, crosses it under SplitMode.NONE (no split): every "
     "crossing of one function rides one cross-core pipe, which is either split or unsplit. Make every crossing "
     "agree, drop the crossing from one region, or put the phases in separate pl.at(level=pl.Level.CORE_GROUP) "
     "scopes"),
]


@pytest.mark.parametrize("fn, msg", RULES, ids=[f.__name__ for f, _ in RULES])
def test_region_rules(fn, msg):
    assert raises(ProgramError, fn, rand(8, 4), rand(4, 4)) == msg


@pytest.mark.parametrize("fn", [split_axes_differ, none_region_without_crossing, shard_by_keyword])
def test_what_the_rules_allow(fn):
    a, b = rand(8, 4), rand(4, 4)
    fn(a, b)


def test_the_rule_check_names_the_line_of_the_offending_op():
    with pytest.raises(ProgramError) as e:
        cube_op_inside(rand(8, 4), rand(4, 4))
    line = cube_op_inside.__code__.co_firstlineno + 2
    assert f"{__file__}:{line}" in str(e.value)


def test_a_function_without_regions_is_unaffected():
    def plain_vector(a, b):
        return pl.exp(pl.matmul(a, b))

    plain_vector(rand(8, 4), rand(4, 4))


# -- runtime errors ---------------------------------------------------------------------------------------------
def nested_regions():
    for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
        for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
            pass


def lane_dependent_gather():
    for aiv_id in M.split_aiv(2, mode=M.SplitMode.NONE):
        if aiv_id == 0:
            pl.aic_gather(Tile(np.zeros((2, 2), np.float32)))


def lane_1_gathers_more():
    for aiv_id in M.split_aiv(2, mode=M.SplitMode.NONE):
        if aiv_id == 1:
            pl.aic_gather(Tile(np.zeros((2, 2), np.float32)))


def lanes_gather_different_shapes():
    for aiv_id in M.split_aiv(2, mode=M.SplitMode.UP_DOWN):
        pl.aic_gather(Tile(np.zeros((2 + int(aiv_id), 2), np.float32)))


def barrier_in_a_region():
    for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
        M.syncall(core_type=M.KernelType.MIX)


def pipe_op_in_a_region():
    for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
        pl.tile.tpop_from_aic(split=0)


def gather_outside_a_region():
    pl.aic_gather(Tile(np.zeros((2, 2), np.float32)))


RUNTIME = [
    (nested_regions, ProgramError,
     "pl.split_aiv at SITE: opened inside another pl.split_aiv region (AIV lane 0 (vector) 'split_aiv@SITE'), "
     "which already runs on one lane; open regions only in the function (or pl.at(level=pl.Level.CORE_GROUP) "
     "block) that also holds the cube work"),
    (lane_dependent_gather, ProgramError,
     "pl.split_aiv region 'split_aiv@SITE' at SITE: the lanes made different numbers of pl.aic_gather calls "
     "(lane 0: 1, lane 1: 0); every lane must reach every gather (the cube waits for all of them), so keep "
     "aic_gather out of lane-dependent branches"),
    (lane_1_gathers_more, ProgramError,
     "pl.aic_gather at SITE: AIV lane 1 reaches gather #1 of the pl.split_aiv region 'split_aiv@SITE', but lane 0 "
     "made only 0; every lane must reach every gather (the cube waits for all of them)"),
    (lanes_gather_different_shapes, TileValueError,
     "pl.aic_gather at SITE: AIV lane 1 gathers a [3, 2] tile, but lane 0 gathered a [2, 2] one at SITE; both "
     "lanes must gather tiles of one shape"),
    (barrier_in_a_region, ProgramError,
     "pl.system.syncall at SITE: a barrier inside a pl.split_aiv region (AIV lane 0 (vector) 'split_aiv@SITE') "
     "cannot be met: the region's lanes run one after the other here. Put the barrier between the phases, outside "
     "the region, as upstream requires for barriers."),
    (pipe_op_in_a_region, ProgramError,
     "pl.tpop_from_aic at SITE: explicit cross-core pipes and buffers do not mix with a pl.split_aiv region "
     "(AIV lane 0 (vector) 'split_aiv@SITE'); a region crosses the AIC/AIV boundary with pl.aiv_shard / "
     "pl.aic_gather. Use those, or write the kernel as AIC and AIV functions of a pl.FunctionType.Group "
     "function."),
    (gather_outside_a_region, ProgramError,
     "pl.aic_gather at SITE: must be used inside a split_aiv region (the AIV lanes of a core group run with a split "
     "mode), which supplies the split mode; outside one there is no axis to split along"),
]


def _sites(msg: str) -> str:
    return re.sub(r"split_aiv@test_mixed_kernel\.py:\d+", "split_aiv@SITE", msg)


@pytest.mark.parametrize("fn, exc, msg", RUNTIME, ids=[f.__name__ for f, _, _ in RUNTIME])
def test_runtime_errors(fn, exc, msg):
    assert _sites(raises(exc, fn)) == msg
    assert P.current_half() is None  # the lane is left even when the body fails


@pytest.mark.parametrize("call, exc, msg", [
    (lambda: M.split_aiv(4, mode=M.SplitMode.NONE), TileValueError,
     "pl.split_aiv: n=4, but a core group has 2 AIV lanes; write pl.split_aiv(2, ...)"),
    (lambda: M.split_aiv(True, mode=M.SplitMode.NONE), TileTypeError,
     "pl.split_aiv: n=True must be the int 2 (the AIV lanes of a core group)"),
    (lambda: M.split_aiv(2, mode=1), TileTypeError,
     "pl.split_aiv: mode=1 is not a split mode; pass pl.SplitMode.NONE, pl.SplitMode.UP_DOWN or "
     "pl.SplitMode.LEFT_RIGHT"),
])
def test_split_aiv_argument_errors(call, exc, msg):
    assert raises(exc, call) == msg


def test_split_aiv_inside_a_core_group_function():
    def aiv():
        for _ in M.split_aiv(2, mode=M.SplitMode.NONE):
            pass

    msg = raises(ProgramError, run_core_group, None, aiv)
    assert msg == ("pl.split_aiv at SITE: opened inside a function of a core group (AIV lane 0 (vector) 'aiv'), "
                   "which already runs on one lane; open regions only in the function (or pl.at(level="
                   "pl.Level.CORE_GROUP) block) that also holds the cube work")


# -- pl.system.syncall --------------------------------------------------------------------------------------------
def test_syncall_is_a_barrier_across_the_core_group():
    log = []

    def aic():
        log.append("c0")
        M.syncall(core_type=M.KernelType.MIX)
        log.append("c1")

    def aiv():
        lane = int(pl.get_subblock_idx())
        log.append(f"v{lane}.0")
        M.syncall(core_type="mix")  # the tutorial's spelling
        log.append(f"v{lane}.1")

    run_core_group(aic, aiv)
    before, after = log[:3], log[3:]
    assert sorted(before) == ["c0", "v0.0", "v1.0"] and sorted(after) == ["c1", "v0.1", "v1.1"]


def test_an_aiv_barrier_leaves_the_cube_out():
    log = []

    def aic():
        log.append("c")

    def aiv():
        lane = int(pl.get_subblock_idx())
        log.append(f"v{lane}.0")
        M.syncall(core_type=M.KernelType.AIV)
        log.append(f"v{lane}.1")

    run_core_group(aic, aiv)
    assert log.index("v0.1") > log.index("v1.0")


def test_a_barrier_a_lane_never_reaches_deadlocks():
    def aiv():
        if int(pl.get_subblock_idx()) == 0:
            M.syncall(core_type=M.KernelType.AIV)

    msg = raises(KernelValueError, CoreGroup("k", None, (aiv, ())).run)
    assert msg == ("mixed kernel 'k' deadlocked: no half can go on. AIV lane 0 (vector) 'aiv' waits in "
                   "pl.system.syncall at SITE (barrier #1: waiting for AIV lane 1 (vector) 'aiv' (ended)); "
                   "AIV lane 1 (vector) 'aiv' has ended. Every push needs a pop on the other side, every popped "
                   "tile a tfree before the producer needs its slot again; a producer may run at most slot_num "
                   "tiles ahead of its consumer.")


def test_syncall_outside_a_core_group_holds_at_once():
    M.syncall()
    M.syncall(mode=M.SyncAllMode.SOFT, core_type=M.KernelType.MIX, gm_workspace=_tensor(), used_cores=8)


def _tensor():
    class T:  # a tensor as the ops see one: shaped, typed
        shape, dtype, array = [16], pl.INT32, np.zeros(16, np.int32)

    return T()


@pytest.mark.parametrize("kwargs, exc, msg", [
    ({"core_type": "both"}, TileTypeError,
     "pl.system.syncall: core_type='both' is not a core type; pass pl.KernelType.MIX, pl.KernelType.AIC or "
     "pl.KernelType.AIV"),
    ({"mode": "hard"}, TileTypeError,
     "pl.system.syncall: mode='hard' is not a sync mode; pass pl.SyncAllMode.HARD or pl.SyncAllMode.SOFT"),
    ({"used_cores": 8}, TileValueError,
     "pl.system.syncall: mode=SyncAllMode.HARD takes no gm_workspace / used_cores; pass mode=pl.SyncAllMode.SOFT "
     "for the GM-polling barrier"),
    ({"mode": M.SyncAllMode.SOFT, "used_cores": 8}, TileTypeError,
     "pl.system.syncall: mode=SyncAllMode.SOFT needs gm_workspace=<a zero-initialised INT32 GM tensor>, got "
     "NoneType"),
    ({"mode": M.SyncAllMode.SOFT, "gm_workspace": "ws"}, TileTypeError,
     "pl.system.syncall: mode=SyncAllMode.SOFT needs gm_workspace=<a zero-initialised INT32 GM tensor>, got str"),
    ({"mode": M.SyncAllMode.SOFT, "gm_workspace": _tensor()}, TileValueError,
     "pl.system.syncall: mode=SyncAllMode.SOFT needs used_cores=<the number of participating cores> (0: all of "
     "the launch)"),
    ({"mode": M.SyncAllMode.SOFT, "gm_workspace": _tensor(), "used_cores": -1}, TileValueError,
     "pl.system.syncall: used_cores=-1 must be an int in [0, 2**31)"),
])
def test_syncall_errors(kwargs, exc, msg):
    assert raises(exc, M.syncall, **kwargs) == msg


def test_cacheinvalid_and_fence():
    M.cacheinvalid()
    M.cacheinvalid(_tensor(), [16], [0])
    M.fence()
    assert raises(TileValueError, M.cacheinvalid, None, [16], [0]) == (
        "pl.system.cacheinvalid: the whole-GM form takes no shapes/offsets; pass (tensor, shapes, offsets) for the "
        "region form")
    assert raises(TileTypeError, M.cacheinvalid, rand(2, 2), [2, 2], [0, 0]) == (
        "pl.system.cacheinvalid: takes a tensor, got Tile")
    assert raises(TileValueError, M.cacheinvalid, _tensor(), [16, 1], [0]) == (
        "pl.system.cacheinvalid: the region form needs shapes and offsets of one entry per dimension of the [16] "
        "tensor")


# -- pl.cluster ---------------------------------------------------------------------------------------------------
MM, NN = 8, 8


def test_cluster_runs_its_aic_and_aiv_calls_as_one_core_group():
    @pl.program
    class Clustered:
        @pl.function(type=pl.FunctionType.AIC)
        def producer(self, x: pl.Tensor[[MM, NN], pl.FP32], out: pl.Out[pl.Tensor[[MM, NN], pl.FP32]]):
            pl.aic_initialize_pipe(dir_mask=1, slot_size=MM * NN * 4, slot_num=2)
            for i in pl.range(3):
                pl.tile.tpush_to_aiv(pl.tile.add(pl.load(x, [0, 0], [MM, NN]), float(i)), split=1)

        @pl.function(type=pl.FunctionType.AIV)
        def consumer(self, x: pl.Tensor[[MM, NN], pl.FP32], out: pl.Out[pl.Tensor[[MM, NN], pl.FP32]]):
            pl.aiv_initialize_pipe(dir_mask=1, slot_size=MM * NN * 4, slot_num=2)
            acc = None
            for _ in pl.range(3):
                t = pl.tile.tpop_from_aic(shape=[MM // 2, NN], dtype=pl.FP32, split=1)
                acc = t if acc is None else pl.tile.add(acc, t)
                pl.system.tfree_to_aic(t)
            pl.store(acc, [int(pl.get_subblock_idx()) * (MM // 2), 0], out)

        @pl.function(type=pl.FunctionType.Orchestration)
        def main(self, x: pl.Tensor[[MM, NN], pl.FP32], out: pl.Out[pl.Tensor[[MM, NN], pl.FP32]]):
            with M.cluster():
                self.producer(x, out)
                self.consumer(x, out)
            return out

    x = np.arange(MM * NN, dtype=np.float32).reshape(MM, NN)
    out = np.zeros_like(x)
    ir.compile(Clustered, platform="a2a3sim")(x, out)
    np.testing.assert_array_equal(out, 3 * x + 3)


def test_cluster_without_aic_or_aiv_calls_changes_nothing():
    def body(x, y):
        with M.cluster():
            pl.store(pl.add(pl.load(x, [0, 0], [2, 2]), 1.0), [0, 0], y)

    _, y = run_in_rank(body, np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(y, np.full((2, 2), 2.0))


@pytest.mark.parametrize("on", ["group", "aiv"])
def test_a_declared_split_attr_is_the_core_group_s_split_mode(on):
    group_attrs = {"split": M.SplitMode.UP_DOWN} if on == "group" else {}
    aiv_attrs = {"split": M.SplitMode.UP_DOWN} if on == "aiv" else {}

    @pl.program
    class Declared:
        @pl.function(type=pl.FunctionType.AIV, attrs=aiv_attrs)
        def lanes(self, x: pl.Tensor[[MM, NN], pl.FP32], out: pl.Out[pl.Tensor[[MM, NN], pl.FP32]]):
            half = pl.aiv_shard(pl.load(x, [0, 0], [MM, NN]))
            pl.store(pl.mul(half, 2.0), [int(pl.get_subblock_idx()) * (MM // 2), 0], out)

        @pl.function(type=pl.FunctionType.Group, attrs=group_attrs)
        def grouped(self, x: pl.Tensor[[MM, NN], pl.FP32], out: pl.Out[pl.Tensor[[MM, NN], pl.FP32]]):
            return self.lanes(x, out)

        @pl.function(type=pl.FunctionType.Orchestration)
        def main(self, x: pl.Tensor[[MM, NN], pl.FP32], out: pl.Out[pl.Tensor[[MM, NN], pl.FP32]]):
            return self.grouped(x, out)

    x = np.arange(MM * NN, dtype=np.float32).reshape(MM, NN)
    out = np.zeros_like(x)
    ir.compile(Declared, platform="a2a3sim")(x, out)
    np.testing.assert_array_equal(out, 2 * x)


def test_a_region_iterated_twice_runs_its_lanes_again():
    region = M.split_aiv(2, mode=M.SplitMode.NONE)
    assert [int(i) for i in region] == [0, 1]
    assert [int(i) for i in region] == [0, 1]
