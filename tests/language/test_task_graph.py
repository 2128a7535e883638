"""Tasks inside a rank form a dependency graph: ``pl.at`` / ``pl.spmd`` regions with ``as tid`` and ``deps=``,
``pl.submit`` / ``pl.spmd_submit``, ``pl.manual_scope``, and ``pld.system.defer_wait`` completing a task late."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import NR, source_line

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig
from ptodist.errors import HangError, ProgramError, RankError

SIZE = 8


def cfg(nr: int, backend: str, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend, **kw)


# ---------------------------------------------------------------------------
# Single device: explicit edges between regions
# ---------------------------------------------------------------------------


@pl.jit
def two_stage(x: pl.Tensor, scratch: pl.Out[pl.Tensor], out: pl.Out[pl.Tensor], ids: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP) as first:
        scratch[:] = pl.add(x, x)
    with pl.at(level=pl.Level.CORE_GROUP, deps=[first]) as second:
        out[:] = pl.add(scratch, scratch)
    pl.write(ids, [0, 0], first)
    pl.write(ids, [0, 1], second)
    return scratch, out


def test_regions_named_by_as_run_in_dependency_order(backend):
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    scratch, out, ids = np.zeros_like(x), np.zeros_like(x), np.full((1, 2), -1, np.int32)
    two_stage(x, scratch, out, ids, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(scratch, 2 * x)
    np.testing.assert_array_equal(out, 4 * x)
    assert ids.tolist() == [[0, 1]]  # task ids, in submission order


@pl.jit
def blocks(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.spmd(4) as stage:
        b = pl.get_block_idx()
        out[b * 2:b * 2 + 2, :] = pl.mul(pl.load(x, [b * 2, 0], [2, 8]), pl.cast(b + 1, pl.FP32))
    with pl.at(level=pl.Level.CORE_GROUP, deps=[stage]):
        total = pl.row_sum(pl.load(out, [0, 0], [8, 8]))
        pl.store(total, [0, 0], out[:, 0:1])
    return out


def test_an_spmd_region_runs_once_per_block_as_one_task(backend):
    x = np.ones((8, 8), np.float32)
    out = np.zeros_like(x)
    blocks(x, out, config=RunConfig(backend=backend))
    want = np.repeat(np.arange(1, 5, dtype=np.float32), 2)[:, None] * np.ones((8, 8), np.float32)
    want[:, 0] = want.sum(axis=1)
    np.testing.assert_array_equal(out, want)


@pl.jit
def carries(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        t = pl.load(x, [0, 0], [4, 8])
        doubled = pl.add(t, t)
    pl.store(doubled, [0, 0], out)
    return out


def test_names_a_region_assigns_are_bound_after_it():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = np.zeros_like(x)
    carries(x, out, config=RunConfig(backend="sim"))
    np.testing.assert_array_equal(out, 2 * x)


@pl.jit
def bad_deps(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP, deps=[7]):
        out[:] = pl.add(x, x)
    return out


def test_deps_must_name_earlier_tasks():
    x = np.zeros((4, 8), np.float32)
    line = source_line(bad_deps, "deps=[7]")
    with pytest.raises(RankError, match=rf"pl.at at .*test_task_graph.py:{line}: deps= must hold task ids of earlier "
                                        r"tasks \(from `with pl.at\(...\) as tid` or pl.submit\), got 7"):
        bad_deps(x, np.zeros_like(x), config=RunConfig(backend="sim"))


# ---------------------------------------------------------------------------
# pl.submit / pl.spmd_submit in a @pl.program
# ---------------------------------------------------------------------------


@pl.program
class Pipeline:
    @pl.function(type=pl.FunctionType.InCore)
    def stage1(self, x: pl.Tensor, scratch: pl.Out[pl.Tensor]):
        b = pl.get_block_idx()
        pl.store(pl.add(pl.load(x, [b, 0], [1, 8]), 1.0), [b, 0], scratch)
        return scratch

    @pl.function(type=pl.FunctionType.InCore)
    def stage2(self, scratch: pl.Tensor, out: pl.Out[pl.Tensor]):
        pl.store(pl.mul(pl.load(scratch, [0, 0], [4, 8]), 3.0), [0, 0], out)
        return out

    @pl.function(type=pl.FunctionType.Orchestration)
    def main(self, x: pl.Tensor, scratch: pl.Out[pl.Tensor], out: pl.Out[pl.Tensor]):
        with pl.manual_scope():
            scratch, tid = pl.spmd_submit(self.stage1, x, scratch, core_num=4)
            out, _ = pl.submit(self.stage2, scratch, out, deps=[tid])
        return out


def test_submit_and_spmd_submit_in_a_manual_scope(backend):
    from ptodist import ir

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    scratch, out = np.zeros_like(x), np.zeros_like(x)
    compiled = ir.compile(Pipeline, platform="a2a3sim")
    compiled(x, scratch, out, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(out, 3 * (x + 1))


# ---------------------------------------------------------------------------
# Deferred completion: a waiter submitted before its publisher
# ---------------------------------------------------------------------------


@pl.jit
def ring_exchange(data: pl.InOut[pld.DistributedTensor[[NR, SIZE], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]],
                  x: pl.Tensor[[1, SIZE], pl.FP32], got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                  doubled: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    with pl.manual_scope():
        # The waiter comes first in program order; its task completes only once the left neighbour notified.
        with pl.at(level=pl.Level.CORE_GROUP) as arrived:
            ctx = pld.get_comm_ctx(sig)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            left = (me + n - 1) % n
            pld.system.defer_wait(sig, [left, 0], 1, cmp=pld.WaitCmp.Ge)
        with pl.at(level=pl.Level.CORE_GROUP, deps=[arrived]) as consumed:
            ctx = pld.get_comm_ctx(sig)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            left = (me + n - 1) % n
            pl.store(pl.load(data, [left, 0], [1, SIZE]), [0, 0], got)
        with pl.at(level=pl.Level.CORE_GROUP, deps=[consumed]):  # waits for a task that itself still waits
            pl.store(pl.mul(pl.load(got, [0, 0], [1, SIZE]), 2.0), [0, 0], doubled)
        # The publisher: this rank's row into the right neighbour's window, then its signal.
        with pl.at(level=pl.Level.CORE_GROUP):
            ctx = pld.get_comm_ctx(sig)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            right = (me + 1) % n
            pld.tile.remote_store(pl.load(x, [0, 0], [1, SIZE]), data, right, [me, 0])
            pld.system.notify(sig, right, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    return got


@pl.jit.host
def ring_host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], got: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
              doubled: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([NR, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([NR, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        ring_exchange(pld.window(data_buf, [NR, SIZE], dtype=pl.FP32), pld.window(sig_buf, [NR, 1], dtype=pl.INT32),
                      x[r], got[r], doubled[r], device=r)


@pytest.mark.parametrize("nr", [2, 4])
def test_a_waiter_submitted_before_its_publisher_completes_when_notified(nr, backend):
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE)
    got, doubled = np.zeros_like(x), np.zeros_like(x)
    ring_host.compile(x, got, doubled, config=cfg(nr, backend))(x, got, doubled)
    np.testing.assert_array_equal(got, np.roll(x, 1, axis=0))
    np.testing.assert_array_equal(doubled, 2 * np.roll(x, 1, axis=0))


@pl.jit
def never_published(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]], out: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    with pl.manual_scope():
        with pl.at(level=pl.Level.CORE_GROUP) as arrived:
            pld.system.defer_wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)
        with pl.at(level=pl.Level.CORE_GROUP, deps=[arrived]):
            out[:] = pl.full([1, SIZE], 1.0, pl.FP32)
    return out


@pl.jit.host
def never_host(out: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    sig_buf = pld.alloc_window_buffer([NR, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        never_published(pld.window(sig_buf, [NR, 1], dtype=pl.INT32), out[r], device=r)


def test_a_deferred_wait_nobody_satisfies_is_a_hang_at_its_line(backend):
    out = np.zeros((2, 1, SIZE), np.float32)
    line = source_line(never_published, "defer_wait")
    with pytest.raises(HangError, match=rf"test_task_graph.py:{line}"):
        never_host.compile(out, config=cfg(2, backend, hang_timeout_s=2.0))(out)


# ---------------------------------------------------------------------------
# Several deferred waits pending at once: the rank waits for whichever holds first
# ---------------------------------------------------------------------------


@pl.jit
def younger_unlocks_older(data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                          sig: pl.InOut[pld.DistributedTensor[[2], pl.INT32]],
                          ready: pl.InOut[pld.DistributedTensor[[1], pl.INT32]],
                          x: pl.Tensor[[1, SIZE], pl.FP32], got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    """Rank 0: the older deferred wait (the peer's data) holds only after the younger one (the peer's hello)
    completed, since the younger task's dependant is what asks the peer for the data."""
    with pl.manual_scope():
        with pl.at(level=pl.Level.CORE_GROUP) as data_arrived:  # older
            pld.system.defer_wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)  # @data arrived
        with pl.at(level=pl.Level.CORE_GROUP) as hello:  # younger
            pld.system.defer_wait(sig, [1], 1, cmp=pld.WaitCmp.Ge)
        with pl.at(level=pl.Level.CORE_GROUP, deps=[hello]):
            pld.system.notify(sig, 1, [0], 1, op=pld.NotifyOp.AtomicAdd)  # send me the data
        with pl.at(level=pl.Level.CORE_GROUP, deps=[data_arrived]):
            pl.store(pl.mul(pl.load(data, [0, 0], [1, SIZE]), 2.0), [0, 0], got)
    # Both waits are pending now (the peer says hello only after this): the rank blocks with neither holding.
    pld.system.notify(ready, 1, [0], 1, op=pld.NotifyOp.AtomicAdd)
    return got


@pl.jit
def hello_then_data(data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                    sig: pl.InOut[pld.DistributedTensor[[2], pl.INT32]],
                    ready: pl.InOut[pld.DistributedTensor[[1], pl.INT32]],
                    x: pl.Tensor[[1, SIZE], pl.FP32], got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    """Rank 1: hello once rank 0 is ready; its data once rank 0 asks for it."""
    pld.system.wait(ready, [0], 1, cmp=pld.WaitCmp.Ge)
    pld.system.notify(sig, 0, [1], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)
    with pl.at(level=pl.Level.CORE_GROUP):
        pld.tile.remote_store(pl.load(x, [0, 0], [1, SIZE]), data, 0, [0, 0])
        pld.system.notify(sig, 0, [0], 1, op=pld.NotifyOp.AtomicAdd)
    return got


@pl.jit.host
def younger_first_host(x: pl.Tensor[[2, 1, SIZE], pl.FP32], got: pl.Out[pl.Tensor[[2, 1, SIZE], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([2], dtype=pl.INT32)
    ready_buf = pld.alloc_window_buffer([1], dtype=pl.INT32)
    windows = (pld.window(data_buf, [1, SIZE], dtype=pl.FP32), pld.window(sig_buf, [2], dtype=pl.INT32),
               pld.window(ready_buf, [1], dtype=pl.INT32))
    younger_unlocks_older(*windows, x[0], got[0], device=0)
    hello_then_data(*windows, x[1], got[1], device=1)


def _younger_first(config: RunConfig) -> np.ndarray:
    x = np.arange(2 * SIZE, dtype=np.float32).reshape(2, 1, SIZE) + 1
    got = np.zeros_like(x)
    younger_first_host.compile(x, got, config=config)(x, got)
    return got


def test_an_older_deferred_wait_that_only_a_younger_ones_completion_satisfies_completes(backend, monkeypatch):
    # Blocking on the oldest pending wait would hang here; a device waits for whichever completes first.
    x1 = np.arange(SIZE, dtype=np.float32) + 1 + SIZE
    for seed in (range(6) if backend == "sim" else [None]):
        if seed is not None:
            monkeypatch.setenv("PTODIST_SIM_SEED", str(seed))
        got = _younger_first(cfg(2, backend, hang_timeout_s=30.0))
        np.testing.assert_array_equal(got[0, 0], 2 * x1)


def test_an_older_deferred_wait_satisfied_after_a_younger_one_is_clean_under_ptodist_check():
    from ptodist.check import explore

    for seed in range(6):
        with explore.checking(seed) as session:
            got = _younger_first(cfg(2, "sim"))
        assert session.findings == [], [f.render() for f in session.findings]
        np.testing.assert_array_equal(got[0, 0], 2 * (np.arange(SIZE, dtype=np.float32) + 1 + SIZE))


@pl.jit
def several_never_published(sig: pl.InOut[pld.DistributedTensor[[24], pl.INT32]],
                            out: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    with pl.manual_scope():
        with pl.at(level=pl.Level.CORE_GROUP) as first:
            pld.system.defer_wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)  # @first never
        with pl.at(level=pl.Level.CORE_GROUP):
            pld.system.defer_wait(sig, [1], 3, cmp=pld.WaitCmp.Eq)  # @second never
        for i in range(2, 24):
            with pl.at(level=pl.Level.CORE_GROUP):
                pld.system.defer_wait(sig, [i], 1, cmp=pld.WaitCmp.Ge)  # @many never
        with pl.at(level=pl.Level.CORE_GROUP, deps=[first]):
            out[:] = pl.full([1, SIZE], 1.0, pl.FP32)
    return out


@pl.jit.host
def several_never_host(out: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    sig_buf = pld.alloc_window_buffer([24], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        several_never_published(pld.window(sig_buf, [24], dtype=pl.INT32), out[r], device=r)


def test_a_hang_in_several_pending_deferred_waits_reports_every_one(backend):
    import ptodist.rank.status as status
    from ptodist.check import findings

    out = np.zeros((2, 1, SIZE), np.float32)
    where = f"test_task_graph.py:{source_line(several_never_published, '@first never')}"
    second = f"test_task_graph.py:{source_line(several_never_published, '@second never')}"
    many = f"test_task_graph.py:{source_line(several_never_published, '@many never')}"
    with pytest.raises(HangError) as info:
        several_never_host.compile(out, config=cfg(2, backend, hang_timeout_s=30.0))(out)
    msg = str(info.value)
    assert info.value.certain, msg
    for r in range(2):
        head = f"rank {r} (device {r}): blocked at "
        line = next(t for t in msg.splitlines() if t.startswith(f"  {head}"))
        assert where in line and "pld.system.defer_wait on 'sig' (buffer 'sig_buf') cell [0] holds 0, needs >= 1" \
            in line, msg
        assert msg.count("whichever of its 24 pending deferred waits holds first") == 2, msg
    assert msg.count(f"{second}: pld.system.defer_wait on 'sig' (buffer 'sig_buf') cell [1] holds 0, "
                     "needs == 3") == 2, msg
    for i in range(2, 1 + status.OTHER_WAITS):
        assert msg.count(f"{many}: pld.system.defer_wait on 'sig' (buffer 'sig_buf') cell [{i}] holds 0, "
                         "needs >= 1") == 2, (i, msg)
    assert msg.count(f"and {24 - 1 - status.OTHER_WAITS} more (only the {1 + status.OTHER_WAITS} oldest are "
                     "listed)") == 2, msg
    state = info.value.ranks[0]
    assert [o["offset"] for o in state["others"]] == [4 * i for i in range(1, 1 + status.OTHER_WAITS)]
    # The findings name every line the ranks wait at.
    (finding,) = findings.from_exception(info.value)
    assert [loc.rsplit("/", 1)[-1] for loc in finding.locations] == [where, second, many]


# ---------------------------------------------------------------------------
# Chip regions in the host orchestrator: each block is outlined into a chip task
# ---------------------------------------------------------------------------

M = 16


@pl.program
class L3Inline:
    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host_orch(self, a: pl.Tensor[[M, M], pl.FP32], b: pl.Tensor[[M, M], pl.FP32],
                  sum_buf: pl.Out[pl.Tensor[[M, M], pl.FP32]], sub_buf: pl.Out[pl.Tensor[[M, M], pl.FP32]]):
        with pl.at(level=pl.Level.CHIP, role=pl.Role.Orchestrator):
            with pl.at(level=pl.Level.CORE_GROUP):
                out = pl.add(a, b)
                out_sum = pl.assemble(sum_buf, out, [0, 0])
        with pl.at(level=pl.Level.CHIP, role=pl.Role.Orchestrator):
            with pl.at(level=pl.Level.CORE_GROUP):
                out = pl.sub(a, b)
                pl.assemble(sub_buf, out, [0, 0])
        return out_sum


def test_chip_regions_in_the_host_become_chip_tasks_round_robin(backend):
    from ptodist import ir

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((M, M), np.float32), rng.standard_normal((M, M), np.float32)
    s, d = np.zeros_like(a), np.zeros_like(a)
    compiled = ir.compile(L3Inline, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=[0, 1]))
    compiled(a, b, s, d, config=cfg(2, backend))
    np.testing.assert_allclose(s, a + b)
    np.testing.assert_allclose(d, a - b)
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert [[t["function"] for t in r["tasks"]] for r in plan["ranks"]] == [["host_orch_chip_0"], ["host_orch_chip_1"]]


@pl.jit.host
def core_region_in_host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32]):
    with pl.at(level=pl.Level.CORE_GROUP):
        pl.add(x, x)


def test_a_core_region_in_the_host_says_where_it_belongs():
    x = np.zeros((2, 1, SIZE), np.float32)
    line = source_line(core_region_in_host, "pl.at(level=pl.Level.CORE_GROUP)")
    with pytest.raises(ProgramError, match=rf"pl.at\(level=CORE_GROUP\) at .*test_task_graph.py:{line}: in the host "
                                           r"orchestrator a region is chip work, `with pl.at\(level=pl.Level.CHIP\):`"):
        core_region_in_host.compile(x, config=cfg(2, "sim"))


# ---------------------------------------------------------------------------
# Selective dump: pl.dump_tag and dumps= mark tensors; RunConfig(enable_dump_args=...) writes them
# ---------------------------------------------------------------------------


@pl.jit
def dumped(q: pl.Tensor, k: pl.Tensor, out: pl.Out[pl.Tensor]):
    pl.dump_tag(q)  # every later task taking q dumps it
    with pl.at(level=pl.Level.CORE_GROUP, dumps=[k]) as first:  # this task also dumps k
        out[:] = pl.add(q, k)
    with pl.at(level=pl.Level.CORE_GROUP, deps=[first]):
        out[:] = pl.mul(out, 2.0)
    return out


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_dump_tag_and_dumps_write_the_marked_tensors(mode, backend, tmp_path):
    from ptodist import dfx

    q, k = np.full((2, 4), 1.0, np.float32), np.full((2, 4), 2.0, np.float32)
    out = np.zeros_like(q)
    dumped(q, k, out, config=RunConfig(backend=backend, enable_dump_args=mode, output_dir=str(tmp_path)))
    np.testing.assert_array_equal(out, 6.0)
    run = dfx.latest_run(tmp_path)
    files = sorted(p.name for p in run.glob("rank0/d*/dump/*.npy")) if run is not None else []
    if mode == 0:
        assert files == []
        return
    want = ["task0_dumped@79_k.npy", "task0_dumped@79_q.npy"] if mode == 1 else \
        ["task0_dumped@79_k.npy", "task0_dumped@79_out.npy", "task0_dumped@79_q.npy", "task1_dumped@81_out.npy"]
    line = source_line(dumped, "dumps=[k]")
    assert files == [f.replace("@79", f"@{line}").replace("@81", f"@{line + 2}") for f in want]
    got = {p.name: np.load(p) for p in run.glob("rank0/d*/dump/*.npy")}
    np.testing.assert_array_equal(got[f"task0_dumped@{line}_k.npy"], k)


def test_enable_dump_args_takes_0_1_or_2():
    from ptodist.errors import ConfigError

    with pytest.raises(ConfigError, match=r"RunConfig\(enable_dump_args=3\): must be 0 \(off\), 1 \(the tensors marked "
                                          r"with pl.dump_tag / dumps=\) or 2 \(every task's tensors\)"):
        RunConfig(enable_dump_args=3)


@pl.jit
def rebinds(x: pl.Tensor, out: pl.Out[pl.Tensor], n: pl.Scalar[pl.INT32]):
    k = 1
    with pl.at(level=pl.Level.CORE_GROUP):
        out = pl.assemble(out, pl.add(pl.load(x, [0, 0], [4, 8]), 1.0), [0, 0])  # reads the enclosing `out` first
        k += n  # reads the enclosing `k` first
    with pl.at(level=pl.Level.CORE_GROUP):
        out[0:1, 0:1] = pl.full([1, 1], pl.FP32, float(k))
    return out


def test_a_region_may_rebind_names_it_reads():
    x = np.zeros((4, 8), np.float32)
    out = np.zeros_like(x)
    rebinds(x, out, 4, config=RunConfig(backend="sim"))
    want = np.ones_like(x)
    want[0, 0] = 5.0
    np.testing.assert_array_equal(out, want)
