"""The host orders chip tasks by submission and by the host tensors they share, on every backend and path.

A host loop that calls ``s = chip_a(a[r], sums[r])`` then ``chip_b(s, f[r])`` (no ``device=``: round-robin, so
the two calls land on different chips) must give ``chip_b`` what ``chip_a`` wrote.  The planner records an edge
from a task to each later-submitted task on another rank that shares host-tensor bytes with it (one of them
writing); the ranks honour it with notify/wait on a signal window the plan reserves.  The sim schedules below run
the consumer's rank first wherever it may, so a missing edge fails deterministically.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import source_line

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir
from ptodist.check import explore
from ptodist.errors import HangError, RankError

SIZE = 16
NR = pl.dynamic("NR")
FILE = __file__


def cfg(nr: int, backend: str | None, **kw) -> RunConfig:
    return RunConfig(platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(nr))),
                     **({"backend": backend} if backend else {}), **kw)


def data(nr: int) -> np.ndarray:
    return (np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE) + 1) / 8


# Seed 0 is a random schedule; seed s with s % (P + 1) == k > 0 runs rank k - 1 only when no other rank can run.
SIM_SEEDS = [0, 1, 2, 3]


@pytest.fixture(params=["shm"] + [f"sim-{s}" for s in SIM_SEEDS])
def backend(request, monkeypatch):
    """Every backend in this process: shm, and sim under schedules that delay each rank in turn."""
    name = request.param
    if name.startswith("sim"):
        monkeypatch.setenv("PTODIST_SIM_SEED", name.split("-")[1])
        return "sim"
    return name


# ---------------------------------------------------------------------------
# The programs
# ---------------------------------------------------------------------------


@pl.jit.incore
def double_kernel(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    pl.store(pl.add(pl.load(x, [0, 0], [1, SIZE]), pl.load(x, [0, 0], [1, SIZE])), [0, 0], y)


@pl.jit.incore
def fill_kernel(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    pl.store(pl.full([1, SIZE], dtype=pl.FP32, value=7.0), [0, 0], y)


@pl.jit
def chip_a(a: pl.Tensor[[1, SIZE], pl.FP32], out: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]
           ) -> pl.Tensor[[1, SIZE], pl.FP32]:
    double_kernel(a, out)
    return out


@pl.jit
def chip_b(s: pl.Tensor[[1, SIZE], pl.FP32], f: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    double_kernel(s, f)


@pl.jit
def fill(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    fill_kernel(y)


@pl.jit.host
def chained(a: pl.Tensor[[NR, 1, SIZE], pl.FP32], f: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    sums = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        s = chip_a(a[r], sums[r])  # no device=: call 2r runs on chip 2r % P, call 2r + 1 on the next chip
        chip_b(s, f[r])


@pl.jit.host
def chained_regions(a: pl.Tensor[[NR, 1, SIZE], pl.FP32], f: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    sums = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        s = sums[r]
        x = a[r]
        y = f[r]
        with pl.at(level=pl.Level.CHIP):
            double_kernel(x, s)
        with pl.at(level=pl.Level.CHIP):
            double_kernel(s, y)


@pl.jit.host
def relay(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    tmp = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    n = pld.world_size()
    for r in pl.range(n):
        chip_b(x[r], tmp[r], device=r)
    for r in pl.range(n):
        chip_b(tmp[(r + 1) % n], y[r], device=r)  # the neighbour's intermediate


@pl.jit.host
def read_then_overwrite(x: pl.InOut[pl.Tensor[[NR, 1, SIZE], pl.FP32]], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    n = pld.world_size()
    for r in pl.range(n):
        chip_b(x[r], y[r], device=r)
    for r in pl.range(n):
        fill(x[(r + 1) % n], device=r)  # overwrites what the neighbour's first task reads


@pl.jit.host
def separate(a: pl.Tensor[[NR, 1, SIZE], pl.FP32], f: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    sums = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        chip_b(a[r], sums[r], device=r)
        chip_b(sums[r], f[r], device=r)
        chip_b(a[r], sums[r])  # reads only a, which nobody writes; writes sums[r] on chip r (round-robin)


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------


def plan_of(compiled) -> dict:
    return json.loads((compiled.output_dir / "dispatch_plan.json").read_text())


def test_the_plan_orders_each_chip_call_after_the_call_whose_result_it_reads():
    a, f = data(2), np.zeros((2, 1, SIZE), np.float32)
    plan = plan_of(chained.compile(a, f, config=cfg(2, "sim")))
    a_line = f"{FILE}:{source_line(chained, 's = chip_a(')}"
    b_line = f"{FILE}:{source_line(chained, 'chip_b(s, f[r])')}"
    tasks = [[(t["seq"], t["function"], t["dispatched_at"], t.get("after")) for t in rank["tasks"]]
             for rank in plan["ranks"]]
    assert tasks == [
        [(0, "chip_a", a_line, None), (2, "chip_a", a_line, None)],
        [(1, "chip_b", b_line, [{"rank": 0, "seq": 0, "shares": "sums[0]"}]),
         (3, "chip_b", b_line, [{"rank": 0, "seq": 2, "shares": "sums[1]"}])],
    ]
    # The edges are honoured on a signal window of one INT32 cell per rank, after the program's own windows.
    assert plan["windows"] == [{"id": 0, "name": "chip_task_order", "nbytes": 8, "offset": 0,
                                "defined_at": "the host's order of chip tasks", "ranks": [0, 1]}]


def test_a_write_after_a_read_on_another_rank_is_ordered_too():
    x, y = data(2), np.zeros((2, 1, SIZE), np.float32)
    plan = plan_of(read_then_overwrite.compile(x, y, config=cfg(2, "sim")))
    after = [[t.get("after") for t in rank["tasks"]] for rank in plan["ranks"]]
    assert after == [[None, [{"rank": 1, "seq": 1, "shares": "x[1]"}]],
                     [None, [{"rank": 0, "seq": 0, "shares": "x[0]"}]]]


def test_tasks_that_share_no_host_bytes_get_no_edge_and_no_signal_window():
    a, f = data(2), np.zeros((2, 1, SIZE), np.float32)
    compiled = separate.compile(a, f, config=cfg(2, "sim"))
    plan = plan_of(compiled)
    assert all("after" not in t for rank in plan["ranks"] for t in rank["tasks"])
    assert plan["windows"] == [] and plan["window_heap_bytes_per_rank"] == 0
    compiled(a, f)
    np.testing.assert_array_equal(f, 4 * a)


@pl.jit.host
def reads_twice(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
                z: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    tmp = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    chip_b(x[0], tmp[0], device=0)
    chip_b(tmp[0], y[1], device=1)
    chip_b(tmp[0], z[1], device=1)  # rank 1 waited for rank 0's task already: no second wait


def test_an_edge_implied_by_an_earlier_wait_is_left_out():
    x, y, z = data(2), np.zeros((2, 1, SIZE), np.float32), np.zeros((2, 1, SIZE), np.float32)
    compiled = reads_twice.compile(x, y, z, config=cfg(2, "sim"))
    plan = plan_of(compiled)
    edges = [(r, t["seq"], e["rank"], e["seq"]) for r, rank in enumerate(plan["ranks"]) for t in rank["tasks"]
             for e in t.get("after", [])]
    assert edges == [(1, 1, 0, 0)]
    compiled(x, y, z)
    np.testing.assert_array_equal(y[1], 4 * x[0])
    np.testing.assert_array_equal(z[1], 4 * x[0])


# ---------------------------------------------------------------------------
# One-shot calls: the right answer under every schedule
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("nr", [2, 4])
def test_a_chip_call_without_device_reads_the_result_of_the_one_before(backend, nr):
    a, f = data(nr), np.zeros((nr, 1, SIZE), np.float32)
    chained(a, f, config=cfg(nr, backend))
    np.testing.assert_array_equal(f, 4 * a)


def test_host_chip_regions_are_ordered_like_chip_calls(backend):
    a, f = data(2), np.zeros((2, 1, SIZE), np.float32)
    chained_regions(a, f, config=cfg(2, backend))
    np.testing.assert_array_equal(f, 4 * a)


@pytest.mark.parametrize("nr", [2, 3])
def test_device_calls_that_cross_ranks_through_a_host_intermediate(backend, nr):
    x, y = data(nr), np.zeros((nr, 1, SIZE), np.float32)
    relay(x, y, config=cfg(nr, backend))
    np.testing.assert_array_equal(y, 4 * np.roll(x, -1, axis=0))


def test_a_task_overwrites_host_bytes_only_after_another_rank_read_them(backend):
    x, y = data(2), np.zeros((2, 1, SIZE), np.float32)
    before = x.copy()
    read_then_overwrite(x, y, config=cfg(2, backend))
    np.testing.assert_array_equal(y, 2 * before)
    np.testing.assert_array_equal(x, np.full_like(x, 7.0))


@pl.jit.host
def overwrite_later(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.InOut[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    fill(y[0], device=1)
    chip_b(x[0], y[0], device=0)  # submitted later: its bytes are the result, whatever the ranks' order


@pytest.mark.parametrize("x", [data(2), np.zeros((2, 1, SIZE), np.float32)], ids=["values", "zeros"])
def test_the_later_submitted_of_two_writes_on_different_ranks_wins(backend, x):
    y = np.zeros((2, 1, SIZE), np.float32)
    overwrite_later(x, y, config=cfg(2, backend))
    np.testing.assert_array_equal(y, np.concatenate([2 * x[:1], np.zeros((1, 1, SIZE), np.float32)]))


# ---------------------------------------------------------------------------
# The DistributedWorker: dispatches, persistent windows, segments
# ---------------------------------------------------------------------------


def host_array(a: np.ndarray, backend: str) -> np.ndarray:
    """The array as the worker's backend takes it (shm: shared memory)."""
    if backend == "sim":
        return a.copy()
    out = ptodist.shared_array(a.shape, a.dtype)
    out[...] = a
    return out


@pytest.mark.parametrize("windows", [{}, {"persistent": True}, {"persistent": True, "reset_persistent_windows": False}],
                         ids=["fresh", "persistent", "kept"])
def test_a_worker_orders_chip_calls_in_every_dispatch(backend, windows):
    a = data(2)
    with chained.compile(a, np.zeros_like(a), config=cfg(2, backend)).prepare(**windows) as rt:
        for k in range(3):  # the signal's tokens are taken back: a kept window starts every dispatch at zero
            x, f = host_array(a * (k + 1), backend), host_array(np.zeros_like(a), backend)
            rt(x, f)
            np.testing.assert_array_equal(f, 4 * (k + 1) * a)


def make_staged():
    @pl.program
    class Staged:
        @pl.function(type=pl.FunctionType.InCore)
        def kernel(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
            pl.store(pl.add(pl.load(x, [0, 0], [1, SIZE]), pl.load(x, [0, 0], [1, SIZE])), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def twice(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
            self.kernel(x, y)

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def inspect(self, t: pl.Tensor[[NR, 1, SIZE], pl.FP32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
                 z: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
            n = pld.world_size()
            for r in pl.range(n):
                self.twice(x[r], y[r], device=r)
            self.inspect(y)
            for r in pl.range(n):
                self.twice(y[r], z[r], device=(r + 1) % n)  # ordered by the callback between them
            for r in pl.range(n):
                self.twice(z[(r + 1) % n], y[r], device=r)  # ordered by an edge inside the segment

    return Staged


def test_a_worker_orders_the_tasks_of_each_segment(backend):
    a = data(2)
    compiled = ir.compile(make_staged(), config=cfg(2, backend))
    seen = []
    with compiled.prepare(callbacks={"inspect": lambda args: seen.append(np.array(args.tensor(0)))}) as rt:
        x, y, z = (host_array(v, backend) for v in (a, np.zeros_like(a), np.zeros_like(a)))
        rt(x, y, z)
    np.testing.assert_array_equal(seen[0], 2 * a)
    np.testing.assert_array_equal(z, 4 * a)
    np.testing.assert_array_equal(y, 8 * np.roll(a, -1, axis=0))


@pl.jit.incore
def accumulate_kernel(x: pl.Tensor[[1, SIZE], pl.FP32], acc: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                      y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    total = pl.add(pl.load(acc, [0, 0], [1, SIZE]), pl.load(x, [0, 0], [1, SIZE]))
    pl.store(total, [0, 0], acc)
    pl.store(total, [0, 0], y)


@pl.jit
def accumulate(x: pl.Tensor[[1, SIZE], pl.FP32], acc: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
               y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    accumulate_kernel(x, acc, y)


@pl.jit.host
def sometimes_chained(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
                      f: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]], chain: pl.Scalar[pl.INT32]):
    buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        accumulate(x[r], pld.window(buf, [1, SIZE], dtype=pl.FP32), y[r], device=r)
    if chain:  # the host decides by the scalar: a plan with the host's order signal, and one without
        sums = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
        for r in pl.range(pld.world_size()):
            chip_b(chip_a(x[r], sums[r]), f[r])


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "kept"])
def test_persistent_windows_keep_their_layout_and_bytes_when_a_plan_adds_the_order_signal(backend, reset):
    a = data(2)
    x, y, f = (host_array(v, backend) for v in (a, np.zeros_like(a), np.zeros_like(a)))
    compiled = sometimes_chained.compile(x, y, f, 0, config=cfg(2, backend))
    with compiled.prepare(persistent=True, reset_persistent_windows=reset) as rt:
        for k, chain in enumerate([0, 1, 0]):
            rt(x, y, f, chain)
            np.testing.assert_array_equal(y, a if reset else (k + 1) * a)
        np.testing.assert_array_equal(f, 4 * a)


@pl.jit.incore
def refuse_negative_kernel(x: pl.Tensor[[1, SIZE], pl.FP32]):
    if float(pl.read(x, [0, 0])) < 0:
        raise ValueError("a negative input")


@pl.jit
def refuse_negative(x: pl.Tensor[[1, SIZE], pl.FP32]):
    refuse_negative_kernel(x)


@pl.jit.host
def checked_chain(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], f: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        refuse_negative(x[r], device=r)
    sums = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        chip_b(chip_a(x[r], sums[r]), f[r])


def test_tokens_a_failed_dispatch_left_in_kept_windows_do_not_release_the_next_dispatchs_waits(monkeypatch):
    a = data(2)
    compiled = checked_chain.compile(a, np.zeros_like(a), config=cfg(2, "sim"))
    with compiled.prepare(persistent=True, reset_persistent_windows=False) as rt:
        bad = a.copy()
        bad[1, 0, 0] = -1.0
        monkeypatch.setenv("PTODIST_SIM_SEED", "2")  # rank 1 runs only when rank 0 cannot: rank 0 notifies first
        with pytest.raises(RankError, match="a negative input"):
            rt(bad, np.zeros_like(a))  # rank 1 fails before it takes rank 0's token
        monkeypatch.setenv("PTODIST_SIM_SEED", "1")  # now rank 0 runs last: rank 1's waits must hold
        f = np.zeros_like(a)
        rt(a, f)
        np.testing.assert_array_equal(f, 4 * a)


# ---------------------------------------------------------------------------
# ptodist check, hangs
# ---------------------------------------------------------------------------


def test_ptodist_check_finds_no_race_and_no_hang_in_chained_chip_calls():
    a = data(2)

    def target():
        f = np.zeros_like(a)
        chained(a, f, config=cfg(2, None))
        np.testing.assert_array_equal(f, 4 * a)

    outcomes = list(explore.explore(target, seed=0, schedules=6))
    assert [(o.findings, o.exit_code, o.traceback) for o in outcomes] == [([], 0, "")] * 6


@pl.jit.incore
def write_then_wait_kernel(x: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                           sig: pl.InOut[pld.DistributedTensor[[2], pl.INT32]]):
    pl.store(pl.full([1, SIZE], dtype=pl.FP32, value=1.0), [0, 0], x)
    pld.system.wait(sig, [1], 1, cmp=pld.WaitCmp.Ge)


@pl.jit.incore
def read_then_notify_kernel(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                            sig: pl.InOut[pld.DistributedTensor[[2], pl.INT32]]):
    pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], y)
    pld.system.notify(sig, 0, [1], 1, op=pld.NotifyOp.AtomicAdd)


@pl.jit
def write_then_wait(x: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[2], pl.INT32]]):
    write_then_wait_kernel(x, sig)


@pl.jit
def read_then_notify(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[2], pl.INT32]]):
    read_then_notify_kernel(x, y, sig)


@pl.jit.host
def waits_for_a_later_task(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    sig = pld.alloc_window_buffer([2], dtype=pl.INT32)
    tmp = pl.create_tensor([1, SIZE], dtype=pl.FP32)
    write_then_wait(tmp, pld.window(sig, [2], dtype=pl.INT32), device=0)
    read_then_notify(tmp, y, pld.window(sig, [2], dtype=pl.INT32), device=1)


def test_a_hang_in_the_hosts_order_names_the_tasks_not_a_program_line():
    y = np.zeros((1, SIZE), np.float32)
    with pytest.raises(HangError) as info:
        waits_for_a_later_task(y, config=cfg(2, "sim"))
    lines = str(info.value).splitlines()
    wait_line = f"{FILE}:{source_line(write_then_wait_kernel, 'pld.system.wait(')}"
    submit_line = f"{FILE}:{source_line(waits_for_a_later_task, 'read_then_notify(tmp')}"
    assert lines[1].startswith(f"  rank 0 (device 0): blocked at {wait_line} in kernel 'write_then_wait_kernel': ")
    assert lines[3].startswith(
        f"  rank 1 (device 1): blocked at {submit_line} by the host's order of chip tasks: 'read_then_notify' "
        "waits for 'write_then_wait' on rank 0 (they share tmp) (waiting ")
    assert lines[-1] == (
        "Likely cause: rank 1 waits, by the host's order of chip tasks, for rank 0 to complete an earlier-submitted "
        "chip task that shares host tensors with its next one, and that task is blocked at "
        f"{wait_line} waiting for a notify that only a chip task submitted after it would send. Submit the "
        "notifying chip task first, or give the two tasks no host tensor in common.")
    assert info.value.diagnosis["fix"].startswith("Submit the chip task that notifies before the chip task")



# ---------------------------------------------------------------------------
# mpi: each process holds its own copy of the host tensors, so an edge carries the bytes too
# ---------------------------------------------------------------------------


def mpi_cases(p: int) -> dict:
    """The programs above as cases for an MPI job of ``p`` processes: {name: run it, check every result}."""

    def one_shot(prog, *args):
        return lambda: prog(*args, config=cfg(p, None))

    def check(run, got, want):
        def case():
            run()
            np.testing.assert_array_equal(got, want)
        return case

    a, zeros = data(p), np.zeros((p, 1, SIZE), np.float32)
    cases = {}
    for name, prog, want in [("chained", chained, 4 * a), ("chained_regions", chained_regions, 4 * a),
                             ("relay", relay, 4 * np.roll(a, -1, axis=0))]:
        out = zeros.copy()
        cases[name] = check(one_shot(prog, a, out), out, want)
    x, y = a.copy(), zeros.copy()
    cases["read_then_overwrite"] = check(one_shot(read_then_overwrite, x, y), (x, y), (np.full_like(a, 7.0), 2 * a))
    if p == 2:  # programs written for two chips
        y, z = zeros.copy(), zeros.copy()
        cases["reads_twice"] = check(one_shot(reads_twice, a, y, z), (y[1], z[1]), (4 * a[0], 4 * a[0]))
        for k, x in enumerate((a, zeros)):  # the later write wins, also where it writes back the original bytes
            y = zeros.copy()
            want = zeros.copy()
            want[0] = 2 * x[0]
            cases[f"overwrite_later {k}"] = check(one_shot(overwrite_later, x, y), y, want)

    def worker(**windows):
        with chained.compile(a, zeros.copy(), config=cfg(p, None)).prepare(**windows) as rt:
            for k in range(3):
                f = zeros.copy()
                rt(a * (k + 1), f)
                np.testing.assert_array_equal(f, 4 * (k + 1) * a)

    cases["worker"] = worker
    cases["persistent worker"] = lambda: worker(persistent=True)
    cases["kept windows"] = lambda: worker(persistent=True, reset_persistent_windows=False)

    def segments():
        seen = []
        with ir.compile(make_staged(), config=cfg(p, None)).prepare(
                callbacks={"inspect": lambda args: seen.append(np.array(args.tensor(0)))}) as rt:
            y, z = zeros.copy(), zeros.copy()
            rt(a, y, z)
        np.testing.assert_array_equal(seen[0], 2 * a)
        np.testing.assert_array_equal(z, 4 * a)
        np.testing.assert_array_equal(y, 8 * np.roll(a, -1, axis=0))

    cases["segments"] = segments
    return cases


def mpi_main(out_dir: str) -> int:
    """Run every case in this MPI process; write ``OUT_DIR/rank<r>.json`` ({"backend": ..., "cases": {...}})."""
    import traceback
    from pathlib import Path

    from ptodist.backends.mpi import load_mpi

    comm = load_mpi().COMM_WORLD
    results = {"backend": RunConfig().resolved_backend(), "cases": {}}
    for name, case in mpi_cases(comm.Get_size()).items():
        try:
            case()
            results["cases"][name] = "ok"
        except BaseException as e:  # noqa: BLE001 - recorded for the test; the other cases still run
            results["cases"][name] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
    (Path(out_dir) / f"rank{comm.Get_rank()}.json").write_text(json.dumps(results, indent=1))
    return 0


@pytest.mark.parametrize("n", [2, 3])
def test_chip_tasks_are_ordered_and_pass_their_bytes_under_mpirun(n, tmp_path):
    from test_mpi import HAVE_MPI4PY, MPIRUN, _leftovers, _mpirun

    if MPIRUN is None or not HAVE_MPI4PY:
        pytest.skip("needs an MPI launcher and mpi4py (pip install -e '.[mpi]')")
    proc = _mpirun(n, [sys.executable, FILE, str(tmp_path)])
    assert proc.returncode == 0, f"mpirun exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    failed = []
    for r in range(n):
        results = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert results["backend"] == "mpi"
        assert list(results["cases"]) == list(mpi_cases(n))
        failed += [f"--- process {r}: {name}\n{text}" for name, text in results["cases"].items() if text != "ok"]
    assert not failed, "\n".join(failed)
    assert not _leftovers(str(tmp_path)), _leftovers(str(tmp_path))


if __name__ == "__main__":
    raise SystemExit(mpi_main(sys.argv[1]))
