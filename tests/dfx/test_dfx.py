"""Diagnostic outputs (DFX): swimlane records, the merged Chrome trace, deps.json, scope stats, `ptodist trace`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import load_example, on_every_rank, ptodist_cli

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, dfx, ir, shared_array
from ptodist.dfx import summary, swimlane

IDS = [3, 5, 9]  # non-contiguous device ids: rank r runs on IDS[r]
N = 16
NR = pl.dynamic("NR")
ALL_ON = {"enable_chip_swimlane": True, "enable_dep_gen": True, "enable_scope_stats": True}
KINDS = {"task", "collective", "notify", "wait", "rma"}


def config(out: Path, ids=IDS, **flags) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(ids)), output_dir=str(out), **flags)


def run_dir(out: Path) -> Path:
    """The newest run's folder: <out>/dfx_outputs."""
    run = dfx.latest_run(out)
    assert run is not None, f"no run under {out}"
    return run


def records(out: Path, rank: int, dispatch: int = 0) -> dict:
    return json.loads((run_dir(out) / f"rank{rank}" / f"d{dispatch}" / swimlane.RECORDS).read_text())


def merged(out: Path) -> list[Path]:
    return sorted(run_dir(out).glob("merged_swimlane_*.json"))


# -- the shared run: examples/allreduce.py at P=3, every flag on -------------------------------------------------

@pytest.fixture(scope="module")
def allreduce_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("allreduce") / "out"
    x = np.random.default_rng(0).standard_normal((len(IDS), 1, 256)).astype(np.float32)
    y = load_example("allreduce").allreduce.compile(x, config=config(out, **ALL_ON))(x)
    np.testing.assert_allclose(y, np.broadcast_to(x.sum(axis=0, keepdims=True), y.shape), rtol=1e-5, atol=1e-5)
    return out


def check_where(where: str) -> None:
    assert re.fullmatch(r".+\.py:\d+", where), where


def test_swimlane_records_per_rank(allreduce_run):
    for r, dev in enumerate(IDS):
        data = records(allreduce_run, r)
        assert set(data) == {"rank", "device_id", "dispatch", "clock", "start", "end", "device_markers", "records"}
        assert (data["rank"], data["device_id"], data["dispatch"]) == (r, dev, 0)
        assert data["clock"] == "CLOCK_MONOTONIC, nanoseconds" and data["device_markers"] is True
        assert data["start"] <= data["end"]
        recs = data["records"]
        kinds = [rec["kind"] for rec in recs]
        # allreduce.py at P=3: one kernel task; 3 notifies (arrive), 3 waits, 3 remote_loads (sum)
        assert kinds.count("task") == 1 and kinds.count("notify") == 3 and kinds.count("wait") == 3
        assert kinds.count("rma") == 3 and set(kinds) <= KINDS
        task = recs[0]
        assert task["kind"] == "task" and task["name"] == "allreduce_kernel" and task["task_id"] == 0
        assert set(task) == {"id", "kind", "name", "task_id", "lane", "start", "end", "where"}
        for i, rec in enumerate(recs):
            assert rec["id"] == i and rec["lane"] == 0
            assert data["start"] <= rec["start"] <= rec["end"] <= data["end"]
            check_where(rec["where"])
            if rec["kind"] == "task":
                continue
            assert set(rec) == {"id", "kind", "name", "task_id", "lane", "start", "end", "where", "args"}
            assert rec["task_id"] == 0 and task["start"] <= rec["start"] and rec["end"] <= task["end"]
            a = rec["args"]
            if rec["kind"] == "notify":
                assert rec["name"] == "pld.system.notify"
                assert set(a) == {"buffer", "buffer_id", "owner", "cell", "offset", "op", "value", "old", "new"}
                assert a["buffer"] == "sig_buf" and a["cell"] == [r, 0] and a["offset"] == 4 * r
                assert (a["op"], a["value"], a["new"]) == ("AtomicAdd", 1, a["old"] + 1)
            elif rec["kind"] == "wait":
                assert rec["name"] == "pld.system.wait"
                assert set(a) == {"buffer", "buffer_id", "owner", "cell", "offset", "cmp", "expected", "seen",
                                  "iteration", "loops"}
                assert a["owner"] == r and a["offset"] == 4 * a["cell"][0]
                assert (a["cmp"], a["expected"]) == ("Ge", 1) and a["seen"] >= 1
                # allreduce.py waits in `for peer in pl.range(n)` on cell [peer, 0]: the loop index is the peer
                assert a["iteration"] == a["cell"][0] and a["loops"] == [a["cell"][0]]
            else:
                assert rec["name"] == "pld.tile.remote_load"
                assert a == {"buffer": "data_buf", "peer": a["peer"], "bytes": 256 * 4, "direction": "read"}
        assert sorted(rec["args"]["owner"] for rec in recs if rec["kind"] == "notify") == [0, 1, 2]
        assert sorted(rec["args"]["peer"] for rec in recs if rec["kind"] == "rma") == [0, 1, 2]


def trace_events(out: Path) -> list[dict]:
    (path,) = merged(out)
    assert re.fullmatch(r"merged_swimlane_\d{8}_\d{6}_\d{6}\.json", path.name)
    trace = json.loads(path.read_text())
    assert trace["otherData"]["dispatch"] == 0
    return trace["traceEvents"]


def inside(ev: dict, xs: list[dict]) -> list[dict]:
    """The X slices on ev's pid/tid whose interval strictly contains ev's ts."""
    return [x for x in xs if x["pid"] == ev["pid"] and x["tid"] == ev["tid"] and x["ts"] < ev["ts"] < x["ts"] + x["dur"]]


def test_merged_trace_processes_threads_and_slices(allreduce_run):
    events = trace_events(allreduce_run)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r} (device {d})" for r, d in enumerate(IDS)}
    assert sum(1 for e in events if e["ph"] == "M" and e["name"] == "process_name") == len(IDS)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    xs = [e for e in events if e["ph"] == "X"]
    assert {(x["pid"], x["tid"]) for x in xs} == set(threads) == {(r, 0) for r in range(len(IDS))}
    assert set(threads.values()) == {"lane 0"}
    for x in xs:
        assert {"name", "cat", "pid", "tid", "ts", "dur", "args"} <= set(x)
        assert isinstance(x["ts"], (int, float)) and x["ts"] >= 0 and x["dur"] > 0
        assert x["cat"] in KINDS and "where" in x["args"] and "task_id" in x["args"]
    assert sorted(x["cat"] for x in xs if x["pid"] == 1) == ["notify"] * 3 + ["rma"] * 3 + ["task"] + ["wait"] * 3
    # every record of every rank is a slice, with its args
    for r in range(len(IDS)):
        assert len([x for x in xs if x["pid"] == r]) == len(records(allreduce_run, r)["records"])
    rma = next(x for x in xs if x["cat"] == "rma")
    assert rma["args"]["bytes"] == 1024 and "peer" in rma["args"]
    notify = next(x for x in xs if x["cat"] == "notify")
    assert {"cell", "value", "old", "new"} <= set(notify["args"])


def test_merged_trace_flows_pair_each_notify_with_the_wait_it_released(allreduce_run):
    events = trace_events(allreduce_run)
    xs = [e for e in events if e["ph"] == "X"]
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(finishes) == 3 * len(IDS)  # one per wait of the barrier
    assert len({s["id"] for s in starts}) == len(starts)
    released = {}
    for s in starts:
        (f,) = [f for f in finishes if f["id"] == s["id"]]
        assert f["bp"] == "e" and s["ts"] <= f["ts"]
        (n,) = [x for x in inside(s, xs) if x["cat"] == "notify"]
        (w,) = [x for x in inside(f, xs) if x["cat"] == "wait"]
        # the right pids: the notify targets the waiting rank's cell of the notifying rank
        assert n["args"]["owner"] == f["pid"] and w["args"]["cell"] == [s["pid"], 0]
        assert n["args"]["offset"] == w["args"]["offset"] and n["args"]["new"] == w["args"]["seen"]
        # one clock for all ranks: the notify started before the wait it released ended
        assert n["ts"] < w["ts"] + w["dur"]
        released.setdefault((f["pid"], w["ts"]), []).append(s["pid"])
    # the hand-rolled barrier: every wait has exactly one releasing notify, from the rank named by its cell
    waits = [(w["pid"], w["ts"]) for w in xs if w["cat"] == "wait"]
    assert sorted(released) == sorted(waits)
    assert all(len(v) == 1 for v in released.values())


def test_release_pairs_name_the_expected_rank(allreduce_run):
    ranks = [records(allreduce_run, r) for r in range(len(IDS))]
    pairs = swimlane.release_pairs(ranks)
    assert len(pairs) == 3 * len(IDS)
    for n, w, src, dst in pairs:
        assert w["args"]["cell"] == [src, 0] and n["args"]["owner"] == dst
        assert n["start"] <= w["end"]


# -- deps.json and scope stats ---------------------------------------------------------------------------------

@pl.jit.incore
def produce(x: pl.Tensor[[1, N], pl.FP32], t: pl.Out[pl.Tensor[[2, N], pl.FP32]]):
    v = pl.load(x, [0, 0], [1, N])
    t = pl.store(v, [0, 0], t)
    return pl.store(pl.mul(v, 2.0), [1, 0], t)


@pl.jit.incore
def consume(t: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    return pl.store(pl.load(t, [0, 0], [1, N]), [0, 0], y)


@pl.jit.incore
def scale(x: pl.Tensor[[1, N], pl.FP32], z: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    return pl.store(pl.mul(pl.load(x, [0, 0], [1, N]), 3.0), [0, 0], z)


@pl.jit
def chip(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
         z: pl.Out[pl.Tensor[[1, N], pl.FP32]], w: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    t = pl.create_tensor([2, N], dtype=pl.FP32)      # 2 * N * 4 bytes of orchestration heap
    produce(x, t)                                    # task 0 writes all of t
    consume(pl.slice(t, [1, N], [1, 0]), y)          # task 1 reads row 1: tensormap edge 0 -> 1
    with pl.manual_scope():
        _, tid = pl.submit(scale, x, z)              # task 2
        pl.submit(scale, x, w, deps=[tid])           # task 3: explicit edge 2 -> 3
    return y


@pl.jit.host
def pipeline(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]],
             z: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]], w: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        chip(x[r], y[r], z[r], w[r], device=r)


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline") / "out"
    x = np.arange(2 * N, dtype=np.float32).reshape(2, 1, N)
    y, z, w = pipeline.compile(x, config=config(out, ids=[4, 6], **ALL_ON))(x)
    assert (y == 2 * x).all() and (z == 3 * x).all() and (w == 3 * x).all()
    return out


def test_deps_json(pipeline_run):
    row = N * 4
    for r, dev in enumerate([4, 6]):
        deps = json.loads((run_dir(pipeline_run) / f"rank{r}" / "d0" / "deps.json").read_text())
        assert set(deps) == {"rank", "device_id", "dispatch", "tasks", "tensors", "edges"}
        assert (deps["rank"], deps["device_id"], deps["dispatch"]) == (r, dev, 0)
        assert [(t["id"], t["kernel"]) for t in deps["tasks"]] == [(0, "produce"), (1, "consume"), (2, "scale"),
                                                                     (3, "scale")]
        for t in deps["tasks"]:
            assert set(t) == {"id", "kernel", "kind", "where", "args"} and t["kind"] == "task"
            check_where(t["where"])
            for a in t["args"]:
                assert set(a) == {"name", "direction", "tensor", "tensor_id", "dtype", "shape", "offset", "nbytes"}
                assert a["direction"] in ("in", "out", "inout") and a["dtype"] == "FP32"
        produce_args = {a["name"]: a for a in deps["tasks"][0]["args"]}
        # rank r's x[r] is row r of host tensor 0: offsets are bytes from the start of the whole tensor
        assert produce_args["x"] == {"name": "x", "direction": "in", "tensor": f"x[{r}]", "tensor_id": "host:0",
                                     "dtype": "FP32", "shape": [1, N], "offset": r * row, "nbytes": row}
        local = produce_args["t"]
        assert (local["direction"], local["tensor_id"], local["shape"], local["offset"], local["nbytes"]) == \
            ("out", "local:0", [2, N], 0, 2 * row)
        consume_t = deps["tasks"][1]["args"][0]
        assert (consume_t["direction"], consume_t["tensor_id"], consume_t["shape"], consume_t["offset"],
                consume_t["nbytes"]) == ("in", "local:0", [1, N], row, row)
        assert deps["edges"] == [
            {"pred": 0, "succ": 1, "source": "tensormap", "tensor": "local:0", "region": [row, 2 * row]},
            {"pred": 2, "succ": 3, "source": "explicit"},
        ]
        tensors = {t["id"]: t for t in deps["tensors"]}
        assert set(tensors) == {"host:0", "host:1", "host:2", "host:3", "local:0"}
        for t in tensors.values():
            assert set(t) == {"id", "name", "dtype", "regions"} and t["dtype"] == "FP32"
        assert tensors["local:0"]["regions"] == [[0, 2 * row], [row, 2 * row]]
        assert tensors["host:1"]["regions"] == [[r * row, (r + 1) * row]]


@pl.jit
def chain_rank(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[3, N], pl.FP32]]):
    t = pl.create_tensor([1, N], dtype=pl.FP32)
    scale(x, t)                                      # 0 writes t
    consume(t, pl.slice(y, [1, N], [0, 0]))          # 1 reads t
    consume(t, pl.slice(y, [1, N], [1, 0]))          # 2 reads t
    scale(x, t)                                      # 3 writes t again: after 0 (WAW), 1 and 2 (WAR)
    consume(t, pl.slice(y, [1, N], [2, 0]))          # 4 reads t: after 3 only (0-2 are superseded by 3)
    return y


@pl.jit.host
def chained(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 3, N], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        chain_rank(x[r], y[r], device=r)


def test_tensormap_edges_follow_the_live_accesses_only(tmp_path):
    x = np.ones((1, 1, N), np.float32)
    y = chained.compile(x, config=config(tmp_path, ids=[2], enable_dep_gen=True))(x)
    assert (y == 3).all()
    deps = json.loads((run_dir(tmp_path) / "rank0" / "d0" / "deps.json").read_text())
    assert [(e["pred"], e["succ"], e["source"], e["tensor"]) for e in deps["edges"]] == [
        (0, 1, "tensormap", "local:0"), (0, 2, "tensormap", "local:0"), (0, 3, "tensormap", "local:0"),
        (1, 3, "tensormap", "local:0"), (2, 3, "tensormap", "local:0"), (3, 4, "tensormap", "local:0")]
    assert all(e["region"] == [0, N * 4] for e in deps["edges"])
    y_regions = next(t for t in deps["tensors"] if t["id"] == "host:1")["regions"]
    assert y_regions == [[0, N * 4], [N * 4, 2 * N * 4], [2 * N * 4, 3 * N * 4]]  # disjoint rows: no edges


def test_scope_stats(pipeline_run):
    for r, dev in enumerate([4, 6]):
        text = (run_dir(pipeline_run) / f"rank{r}" / "d0" / "scope_stats" / "scope_stats.jsonl").read_text()
        lines = [json.loads(line) for line in text.splitlines()]
        meta, scopes = lines[0], lines[1:]
        assert set(meta) == {"type", "rank", "device_id", "dispatch", "clock", "high_water", "scopes"}
        assert (meta["type"], meta["rank"], meta["device_id"], meta["dispatch"]) == ("metadata", r, dev, 0)
        hw = meta["high_water"]
        assert set(hw) == {"tasks_in_flight", "heap_bytes", "tensormap_entries"}
        assert hw["tasks_in_flight"] >= 1
        assert hw["heap_bytes"] == 2 * N * 4                 # the pl.create_tensor([2, N], FP32)
        assert hw["tensormap_entries"] == 6  # distinct regions: x, y, z, w, all of t, row 1 of t
        assert meta["scopes"] == sum(1 for s in scopes if s["event"] == "begin") == 5  # dispatch + 4 tasks
        stack, last_t = [], 0
        for s in scopes:
            assert set(s) == {"type", "event", "scope", "name", "id", "depth", "t", "local_bytes"}
            assert s["type"] == "scope" and s["scope"] in ("dispatch", "task") and s["t"] >= last_t
            last_t = s["t"]
            if s["event"] == "begin":
                stack.append(s)
                assert s["depth"] == len(stack) - 1
            else:
                assert s["event"] == "end"
                b = stack.pop()
                assert (b["scope"], b["name"], b["id"], b["depth"]) == (s["scope"], s["name"], s["id"], s["depth"])
        assert stack == []
        assert scopes[0]["scope"] == "dispatch" and scopes[0]["name"] == "pipeline"
        assert [s["name"] for s in scopes if s["scope"] == "task" and s["event"] == "begin"] == \
            ["produce", "consume", "scale", "scale"]
        assert scopes[-1]["local_bytes"] == 2 * N * 4


# -- switches ----------------------------------------------------------------------------------------------------

def test_no_dfx_outputs_when_every_flag_is_off(tmp_path):
    x = np.ones((2, 1, N), np.float32)
    compiled = pipeline.compile(x, config=config(tmp_path / "out", ids=[0, 1]))
    compiled(x)
    assert (tmp_path / "out" / "dispatch_plan.json").is_file()
    assert not (tmp_path / "out" / "dfx_outputs").exists()


@pl.jit.incore
def stage_and_reduce(x: pl.Tensor[[1, N], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    data = pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)
    return pld.tensor.allreduce(data, sig)            # in-kernel collective: notifies, waits and RMA inside


@pl.jit.incore
def unload(y: pl.Out[pl.Tensor[[1, N], pl.FP32]], data: pld.DistributedTensor[[1, N], pl.FP32]):
    return pl.store(pl.load(data, [0, 0], [1, N]), [0, 0], y)


@pl.jit
def stage_rank(x: pl.Tensor[[1, N], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
               sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return stage_and_reduce(x, data, sig)


@pl.jit
def unload_rank(y: pl.Out[pl.Tensor[[1, N], pl.FP32]], data: pld.DistributedTensor[[1, N], pl.FP32]):
    return unload(y, data)


@pl.jit.host
def twice(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        stage_rank(x[r], pld.window(data_buf, [1, N], dtype=pl.FP32),
                   pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
    data = pld.window(data_buf, [1, N], dtype=pl.FP32)
    data = pld.tensor.allreduce(data)                 # host collective: a builtin task on every rank
    for r in pl.range(pld.world_size()):
        unload_rank(y[r], data, device=r)


def run_twice(out: Path, **flags):
    x = np.arange(3 * N, dtype=np.float32).reshape(3, 1, N)
    y = twice.compile(x, config=config(out, **flags))(x)
    np.testing.assert_allclose(y, np.broadcast_to(3 * x.sum(axis=0, keepdims=True), y.shape))
    return y


def test_collectives_are_slices_around_their_operations(tmp_path):
    run_twice(tmp_path / "out", enable_chip_swimlane=True)
    for r in range(3):
        data = records(tmp_path / "out", r)
        recs = data["records"]
        tasks = [rec for rec in recs if "args" not in rec]
        assert [(t["kind"], t["name"]) for t in tasks] == [("task", "stage_and_reduce"),
                                                           ("collective", "pld.tensor.allreduce"),
                                                           ("task", "unload")]
        check_where(tasks[1]["where"])
        (inner,) = [rec for rec in recs if rec["kind"] == "collective" and "args" in rec]
        assert inner["name"] == "pld.tensor.allreduce" and inner["task_id"] == 0
        assert inner["args"] == {"target": "data_buf", "signal": "sig_buf", "bytes": N * 4}
        ops = [rec for rec in recs if rec["kind"] in ("notify", "wait", "rma")]
        in_kernel = [rec for rec in ops if rec["task_id"] == 0]
        assert in_kernel and all(inner["start"] <= rec["start"] and rec["end"] <= inner["end"] for rec in in_kernel)
        assert any(rec["task_id"] == tasks[1]["task_id"] for rec in ops)  # the host builtin's own operations


def test_device_strace_disabled_keeps_tasks_and_collectives(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPLER_DEVICE_STRACE_ENABLE", "0")
    run_twice(tmp_path / "out", enable_chip_swimlane=True)
    for r in range(3):
        data = records(tmp_path / "out", r)
        assert data["device_markers"] is False
        assert [rec["kind"] for rec in data["records"]] == ["task", "collective", "collective", "task"]
    events = json.loads(merged(tmp_path / "out")[0].read_text())["traceEvents"]
    assert {e["cat"] for e in events if e["ph"] == "X"} == {"task", "collective"}
    assert not [e for e in events if e["ph"] in ("s", "f")]


def test_build_time_switches_print_one_notice_and_change_nothing(tmp_path, monkeypatch, capfd):
    plain = run_twice(tmp_path / "plain")
    capfd.readouterr()
    monkeypatch.setattr(dfx, "_told", set())
    monkeypatch.setenv("SIMPLER_HOST_STRACE", "1")
    monkeypatch.setenv("SIMPLER_DFX", "1")
    first = run_twice(tmp_path / "a")
    second = run_twice(tmp_path / "b")
    err = capfd.readouterr().err
    for name in ("SIMPLER_HOST_STRACE", "SIMPLER_DFX"):
        notices = [line for line in err.splitlines() if line.startswith(f"ptodist: {name} is a build-time switch")]
        assert len(notices) == 1, err
        assert "changes nothing" in notices[0]
    np.testing.assert_array_equal(first, plain)
    np.testing.assert_array_equal(second, plain)
    assert not (tmp_path / "a" / "dfx_outputs").exists() and not (tmp_path / "b" / "dfx_outputs").exists()


def test_dispatch_index_counts_calls_of_one_compiled_program(tmp_path):
    out = tmp_path / "out"
    x = np.ones((3, 1, N), np.float32)
    compiled = twice.compile(x, config=config(out, enable_chip_swimlane=True, enable_scope_stats=True))
    compiled(x)
    compiled(x)
    for r in range(3):
        assert sorted(p.name for p in (run_dir(out) / f"rank{r}").iterdir()) == ["d0", "d1"]
        for k in (0, 1):
            assert records(out, r, k)["dispatch"] == k
            meta = json.loads((run_dir(out) / f"rank{r}" / f"d{k}" / "scope_stats" /
                               "scope_stats.jsonl").read_text().splitlines()[0])
            assert meta["dispatch"] == k
    assert sorted(json.loads(p.read_text())["otherData"]["dispatch"] for p in merged(out)) == [0, 1]
    assert len(dfx.runs(out)) == 1  # the calls of one compiled program are one run
    assert summary.merged_trace(run_dir(out), 1) == max(merged(out))


# -- ptodist trace -------------------------------------------------------------------------------------------------

def trace_cli(*args) -> subprocess.CompletedProcess:
    return ptodist_cli("trace", *args, timeout=60)


def test_trace_cli_summary(allreduce_run):
    p = trace_cli(allreduce_run)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for section in ("Per rank (ms):", "Longest waits (9 of 9):", "Critical path:"):
        assert section in out
    for r, d in enumerate(IDS):
        assert re.search(rf"^  rank {r} \(device {d}\)\s+\d+\.\d{{3}}\s+\d+\.\d{{3}}", out, re.M)
    assert re.search(r"allreduce\.py:30: sig_buf cell \[(\d), 0\] Ge 1, saw 1 \(iteration \1\)\n\s+released by rank "
                     r"\1 \(device \d\) notify at .*allreduce\.py:28", out)
    assert "ui.perfetto.dev" not in out
    # the same from the dfx_outputs folder, with --top and --open
    p = trace_cli(allreduce_run / "dfx_outputs", "--top", "2", "--open")
    assert p.returncode == 0, p.stderr
    assert "Longest waits (2 of 9):" in p.stdout
    assert str(merged(allreduce_run)[0].resolve()) in p.stdout
    assert "ui.perfetto.dev" in p.stdout and "chrome://tracing" in p.stdout


def test_trace_cli_errors(tmp_path, pipeline_run):
    p = trace_cli(tmp_path)
    assert p.returncode == 2 and "no DFX outputs" in p.stderr and "enable_chip_swimlane=True" in p.stderr
    p = trace_cli(tmp_path / "missing")
    assert p.returncode == 2 and "no such directory" in p.stderr
    p = trace_cli(pipeline_run, "--dispatch", "7")
    assert p.returncode == 2 and "no swimlane records of dispatch 7" in p.stderr
    deps_only = tmp_path / "deps_only"
    x = np.ones((2, 1, N), np.float32)
    pipeline.compile(x, config=config(deps_only, ids=[0, 1], enable_dep_gen=True))(x)
    p = trace_cli(deps_only)
    assert p.returncode == 2 and "deps.json" in p.stderr and "enable_chip_swimlane=True" in p.stderr
    cut = tmp_path / "cut" / "dfx_outputs" / "run_20260101_120000_000000_42" / "rank0" / "d0"
    cut.mkdir(parents=True)
    (cut / swimlane.RECORDS).write_text('{"rank": 0, "records": [')
    p = trace_cli(tmp_path / "cut")
    assert p.returncode == 2 and "cannot read the swimlane records of dispatch 0" in p.stderr


# -- runs that share an output_dir ---------------------------------------------------------------------------------

GATE: list[int] = []  # [read end of the gate pipe, write end of the ready pipe], set while a test holds gated ranks


@pl.jit.incore
def gated(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    os.write(GATE[1], b"r")                            # this rank is running ...
    os.read(GATE[0], 1)                                # ... and goes on when the test opens the gate
    me = pld.rank(pld.get_comm_ctx(sig))
    for p in pl.range(pld.nranks(pld.get_comm_ctx(sig))):
        pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for p in pl.range(pld.nranks(pld.get_comm_ctx(sig))):
        pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)
    return sig


gated_host = on_every_rank(gated)


def run_defers(out: Path, ids=(0, 1)) -> None:
    x = np.zeros((len(ids), 1), np.float32)
    defers.compile(x, config=config(out, ids=ids, enable_chip_swimlane=True))(x)


def assert_only_its_own_records(run: Path, ids, kernels: set[str]) -> None:
    """The run's folder holds the files of its ranks only, and its merged trace their records only."""
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [f"rank{r}" for r in range(len(ids))]
    per_rank = []
    for r, d in enumerate(ids):
        data = json.loads((run / f"rank{r}" / "d0" / swimlane.RECORDS).read_text())
        assert (data["rank"], data["device_id"]) == (r, d)
        assert {rec["name"] for rec in data["records"] if rec["kind"] == "task"} <= kernels
        per_rank.append(data)
    (path,) = run.glob("merged_swimlane_*.json")
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r} (device {d})" for r, d in enumerate(ids)}
    xs = [e for e in events if e["ph"] == "X"]
    assert {x["name"] for x in xs if x["cat"] == "task"} <= kernels
    for r, data in enumerate(per_rank):
        assert sorted(x["ts"] for x in xs if x["pid"] == r) == sorted(
            round((rec["start"] - min(d["start"] for d in per_rank)) / 1000.0, 3) for rec in data["records"])


@pl.program
class PerRankAddOne:
    @pl.function(type=pl.FunctionType.InCore)
    def add_one(self, x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        return pl.store(pl.add(pl.load(x, [0, 0], [4, N]), 1.0), [0, 0], y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def child(self, x: pl.Tensor[[4, N], pl.FP32], y: pl.Out[pl.Tensor[[4, N], pl.FP32]]):
        return self.add_one(x, y)

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host_orch(self, x: pl.Tensor[[NR, 4, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 4, N], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            self.child(x[r], y[r], device=r)


def test_outputs_are_in_upstreams_layout(tmp_path):
    """<output_dir>/dfx_outputs/rank{r}/d{k}/, as PyPTO's per-rank DFX test reads it."""
    compiled = ir.compile(PerRankAddOne, platform="a2a3sim", output_dir=str(tmp_path / "out"),
                                  distributed_config=DistributedConfig(device_ids=[0, 1]))
    x = np.random.default_rng(1).standard_normal((2, 4, N)).astype(np.float32)
    y = np.zeros_like(x)
    compiled(x, y, config=RunConfig(platform="a2a3sim", enable_dep_gen=True, enable_scope_stats=True,
                                    enable_chip_swimlane=True))
    np.testing.assert_allclose(y, x + 1.0)
    base = compiled.output_dir / "dfx_outputs"
    for r in range(2):
        for name in ("deps.json", "scope_stats/scope_stats.jsonl", swimlane.RECORDS):
            assert (base / f"rank{r}" / "d0" / name).stat().st_size > 0
    assert len(list(base.glob("merged_swimlane_*.json"))) == 1
    # PyPTO's current name of the swimlane flag (it co-enables dep_gen, as enable_chip_swimlane does)
    compiled(x, y, config=RunConfig(platform="a2a3sim", enable_l2_swimlane=True))
    for r in range(2):
        assert {p.name for p in (base / f"rank{r}" / "d1").iterdir()} == {"deps.json", swimlane.RECORDS}


def test_a_later_run_in_one_output_dir_replaces_the_earlier_runs_files(tmp_path):
    out = tmp_path / "out"
    run_twice(out, enable_chip_swimlane=True)          # run 1: three ranks on devices 3, 5, 9
    run_defers(out)                                    # run 2: two ranks on devices 0, 1, with the same output_dir
    (run,) = dfx.runs(out)
    assert run == out / "dfx_outputs"                  # upstream's layout: rank{r}/d{k} right in dfx_outputs
    assert_only_its_own_records(run, [0, 1], {"deferred"})  # run 1's rank2/d0 and merged trace are gone
    p = trace_cli(out)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"ptodist trace: {run}"
    assert ", 2 rank(s);" in lines[1] and "rank 1 (device 1)" in p.stdout and "(device 9)" not in p.stdout
    assert lines[2] == f"merged trace: {next(run.glob('merged_swimlane_*.json'))}"
    # a folder of the older layout (dfx_outputs/run_<stamp>_<pid>) is read beside it, never cleared
    old = run / "run_20260101_120000_000000_42"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns(dfx.IN_USE))
    assert dfx.runs(out) == [old, run]
    p = trace_cli(old)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1] == (f"run {old.name}: number 1 (oldest first) of 2 runs in {out}; give a run's "
                                        "folder to summarise another")
    # a newest run without swimlane records: the error names the run that has some
    x = np.ones((2, 1, N), np.float32)
    pipeline.compile(x, config=config(out, ids=[0, 1], enable_dep_gen=True))(x)
    assert old.is_dir() and not list(run.glob("merged_swimlane_*.json"))
    p = trace_cli(out)
    assert p.returncode == 2 and "has no swimlane records (it has deps.json)" in p.stderr
    assert f"1 other run(s) beside it (the newest: {old}); give a run's folder" in p.stderr


def test_two_live_programs_take_turns_in_one_output_dir(tmp_path, capfd):
    """Each takes the folder, cleared of the other's files, when the other has no call in progress."""
    out = tmp_path / "out"
    x = np.arange(3 * N, dtype=np.float32).reshape(3, 1, N)
    a = twice.compile(x, config=config(out, enable_chip_swimlane=True))
    xb = np.zeros((2, 1), np.float32)
    b = defers.compile(xb, config=config(out, ids=(0, 1), enable_chip_swimlane=True))
    a(x)
    b(xb)
    run = out / "dfx_outputs"
    assert_only_its_own_records(run, [0, 1], {"deferred"})
    a(x)                                               # a's second call, d1, in the folder cleared of b's files
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["rank0", "rank1", "rank2"]
    assert all(sorted(p.name for p in (run / f"rank{r}").iterdir()) == ["d1"] for r in range(3))
    assert dfx.runs(out) == [run] and "is in use by another run" not in capfd.readouterr().err


def test_runs_at_the_same_time_in_one_output_dir_keep_their_own_records(tmp_path, capfd):
    out = tmp_path / "out"
    gate_r, gate_w = os.pipe()
    ready_r, ready_w = os.pipe()
    GATE[:] = [gate_r, ready_w]
    try:
        x = shared_array((len(IDS), 1))
        compiled = gated_host.compile(x, config=config(out, enable_chip_swimlane=True, hang_timeout_s=600))
        with compiled.prepare() as rt:
            handle = rt.submit(compiled, x)            # run 1: its three ranks start, then stop at the gate
            ready = b""
            while len(ready) < len(IDS):
                chunk = os.read(ready_r, len(IDS) - len(ready))
                assert chunk
                ready += chunk
            run_defers(out)                            # run 2, start to end, while run 1's dispatch is in flight
            os.write(gate_w, b"g" * len(IDS))          # run 1's ranks go on, write their files, and it merges
            handle.result()
    finally:
        GATE.clear()
        for fd in (gate_r, gate_w, ready_r, ready_w):
            os.close(fd)
    first, second = dfx.runs(out)                      # in the order they started
    assert (first, second) == (out / "dfx_outputs", out / "dfx_outputs.2")  # run 2 wrote beside run 1's folder
    assert (f"ptodist: {first} is in use by another run (process {os.getpid()}, which is still running); to keep "
            f"the two runs' files apart this run writes its DFX outputs to {second} instead.") in capfd.readouterr().err
    assert_only_its_own_records(first, IDS, {"gated"})
    assert_only_its_own_records(second, [0, 1], {"deferred"})


def test_trace_reads_a_dfx_outputs_folder_without_run_folders(tmp_path, allreduce_run):
    legacy = tmp_path / "old" / "dfx_outputs"          # the layout of ptodist versions before run folders
    shutil.copytree(run_dir(allreduce_run), legacy)
    for path in (tmp_path / "old", legacy):
        p = trace_cli(path)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"ptodist trace: {legacy}\ndispatch 0 (d0 found; --dispatch K picks one), 3 rank(s)")


# -- the critical path and the waits follow what happened -----------------------------------------------------------

def rank_state(rank: int) -> int:
    """In a rank: ``rank``'s state on the status board (``ptodist.rank.status``: RUNNING, WAITING, DONE, ...)."""
    from ptodist import context

    return int(context.current().status.rows[rank]["state"])


def until(condition) -> None:
    """In a rank: go on once ``condition()`` holds (no progress meanwhile: a stall ends as a HangError)."""
    while not condition():
        os.sched_yield()


@pl.jit.incore
def late_sender(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    from ptodist.rank.status import DONE, FAILED, WAITING

    me = pld.rank(pld.get_comm_ctx(sig))
    if me == 0:
        # Rank 0 computes until rank 1 is blocked in its wait (a rank says so on the status board once its
        # wait has not been satisfied at once), then releases it ...
        until(lambda: rank_state(1) == WAITING)
        pld.system.notify(sig, 1, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
    else:
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)
        until(lambda: rank_state(0) in (DONE, FAILED))  # ... and rank 1 finishes last
    return sig


late = on_every_rank(late_sender)


def test_critical_path_crosses_from_the_wait_to_the_late_notify(tmp_path):
    out = tmp_path / "out"
    x = np.zeros((2, 1), np.float32)
    late.compile(x, config=config(out, ids=[2, 7], enable_chip_swimlane=True, hang_timeout_s=60))(x)
    ranks = [records(out, r) for r in range(2)]
    (task0, notify) = ranks[0]["records"]
    (wait,) = [rec for rec in ranks[1]["records"] if rec["kind"] == "wait"]
    # one clock for every rank: rank 1 blocked in its wait before rank 0 began the notify that released it
    assert (task0["kind"], notify["kind"]) == ("task", "notify")
    assert wait["start"] < notify["start"] < wait["end"]
    path = summary.critical_path(ranks)
    steps = [(s["rank"], s["step"], s["rec"]["kind"] if s["rec"] else None, how) for s, how in path]
    assert steps == [(0, "start", None, "first"), (0, "begin", "task", "then"), (0, "op", "notify", "then"),
                     (1, "op", "wait", "released"), (1, "end", "task", "then")]
    assert summary.rank_times(ranks[1])["waiting"] == wait["end"] - wait["start"]
    assert summary.rank_times(ranks[0])["busy"] >= notify["start"] - task0["start"]  # its time before the notify
    text = summary.report(out, top=1)
    assert re.search(r"Longest waits \(1 of 1\):\n\s+\d+\.\d+ ms  rank 1 \(device 7\) at .*test_dfx\.py:\d+: "
                     r"sig_buf cell \[0, 0\] Ge 1, saw 1\n\s+released by rank 0 \(device 2\) notify", text)


@pl.jit.incore
def deferred(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(sig))
    if me == 0:
        pld.system.notify(sig, 1, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
    else:
        pld.system.defer_wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)  # DEFER LINE
    return sig


defers = on_every_rank(deferred)


def test_a_deferred_wait_is_recorded_at_its_defer_wait_line(tmp_path):
    x = np.zeros((2, 1), np.float32)
    defers.compile(x, config=config(tmp_path, ids=[0, 1], enable_chip_swimlane=True))(x)
    (wait,) = [rec for rec in records(tmp_path, 1)["records"] if rec["kind"] == "wait"]
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# DEFER LINE" in text)
    assert wait["where"] == f"{__file__}:{line}" and wait["task_id"] == 0
    (pair,) = swimlane.release_pairs([records(tmp_path, r) for r in range(2)])
    assert pair[2:] == (0, 1)


# -- counter tracks, loop iterations -------------------------------------------------------------------------------

def test_merged_trace_has_a_counter_track_per_signal_cell(allreduce_run):
    events = trace_events(allreduce_run)
    counters = [e for e in events if e["ph"] == "C"]
    by_name: dict[str, list[dict]] = {}
    for c in counters:
        assert c["cat"] == "signal" and set(c["args"]) == {"value"}
        by_name.setdefault(c["name"], []).append(c)
    # allreduce.py's barrier: rank r notifies cell [r, 0] of every rank once, AtomicAdd 1
    assert set(by_name) == {f"sig_buf[{r},0] on rank {o}" for r in range(len(IDS)) for o in range(len(IDS))}
    flows = {(s["pid"], s["ts"]) for s in events if s["ph"] == "s"}
    for name, points in by_name.items():
        owner = int(name.rsplit(" ", 1)[1])
        assert {p["pid"] for p in points} == {owner}  # on the process of the rank that owns the cell
        assert [p["args"]["value"] for p in points] == [0, 1] and points[0]["ts"] <= points[1]["ts"]
        sender = int(name.split("[")[1].split(",")[0])
        assert (sender, points[1]["ts"]) in flows  # the value changes where the notify's arrow starts
    assert [s["name"] for s in swimlane.counter_series([records(allreduce_run, r) for r in range(len(IDS))])] == \
        sorted(by_name, key=lambda n: (int(n.split("on rank ")[1]), int(n.split("[")[1].split(",")[0])))


def test_loop_indices_follow_the_pl_range_loops():
    from ptodist.language.control import loop_indices

    seen = []
    for _i in pl.range(2):
        for j in pl.range(3, 9, 3):
            seen.append(loop_indices())
            if j == 6:
                break                                  # an inner loop left by a break drops its entry
        seen.append(loop_indices())
    assert seen == [[0, 3], [0, 6], [0], [1, 3], [1, 6], [1]] and loop_indices() == []
    with pytest.raises(KeyError):
        for _i in pl.range(2):
            for j in pl.range(2):
                raise KeyError(j)
    assert loop_indices() == []                        # ... and so does an exception
    for _i, (acc,) in pl.range(4, 6, init_values=(0,)):
        seen = loop_indices()
        pl.yield_(acc)
    assert seen == [5] and loop_indices() == []


# -- runs cut short: a hang or Ctrl-C leaves every rank's records up to the stop -------------------------------------

@pl.jit.incore
def ring_hang(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(sig)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    for rnd in pl.range(3):                            # three rounds of a ring: notify the next rank, wait for the last
        pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
        pld.system.wait(sig, [(me + n - 1) % n, 0], rnd + 1 if rnd < 2 else 100, cmp=pld.WaitCmp.Ge)  # HANG LINE
    return sig


ring_hang_host = on_every_rank(ring_hang)


def line_of(marker: str) -> str:
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in text)
    return f"{__file__}:{line}"


@pytest.mark.parametrize("how", ["shm", "sim", "worker"])
def test_a_hang_leaves_every_rank_records_up_to_the_hang(tmp_path, how):
    from ptodist.errors import HangError

    out = tmp_path / "out"
    x = shared_array((len(IDS), 1))
    cfg = config(out, enable_chip_swimlane=True, hang_timeout_s=30, backend="sim" if how == "sim" else None)
    compiled = ring_hang_host.compile(x, config=cfg)
    with pytest.raises(HangError):                     # a certain hang: found after 0.5 s of stillness
        if how == "worker":
            with compiled.prepare() as rt:
                rt(x)
        else:
            compiled(x)
    ranks = [records(out, r) for r in range(len(IDS))]
    for r, data in enumerate(ranks):
        assert data["stopped"] is True
        kinds = [rec["kind"] for rec in data["records"]]
        assert kinds == ["task"] + ["notify", "wait"] * 3
        task, last = data["records"][0], data["records"][-1]
        assert last["args"]["pending"] is True and last["where"] == line_of("# HANG LINE")
        # the round it hung in, and the cell's value when it was stopped: the 3 notifies of the previous rank
        assert (last["args"]["iteration"], last["args"]["loops"]) == (2, [2])
        assert (last["args"]["expected"], last["args"]["seen"]) == (100, 3)
        assert last["args"]["cell"] == [(r + len(IDS) - 1) % len(IDS), 0] and last["task_id"] == 0
        assert task["start"] <= last["start"] <= last["end"] <= task["end"] <= data["end"]
        for rnd, wait in enumerate(rec for rec in data["records"][:-1] if rec["kind"] == "wait"):
            assert "pending" not in wait["args"] and wait["args"]["iteration"] == rnd
    # the merged trace shows every rank up to the hang; the pending waits have no arrow
    events = trace_events(out)
    labels = {e["pid"]: e["args"]["labels"] for e in events if e["ph"] == "M" and e["name"] == "process_labels"}
    assert labels == {r: "stopped" for r in range(len(IDS))}
    xs = [e for e in events if e["ph"] == "X"]
    assert sorted(x["pid"] for x in xs) == sorted(list(range(len(IDS))) * 7)
    assert sum(1 for x in xs if x["args"].get("pending")) == len(IDS)
    assert sum(1 for e in events if e["ph"] == "s") == 2 * len(IDS)  # the waits of rounds 0 and 1
    counters = {}
    for c in (e for e in events if e["ph"] == "C"):
        counters.setdefault(c["name"], []).append(c["args"]["value"])
    assert counters == {f"sig_buf[{r},0] on rank {(r + 1) % len(IDS)}": [0, 1, 2, 3] for r in range(len(IDS))}
    # the run's error, beside the merged trace (a DistributedWorker's driver does not pass it on yet)
    ending = summary.findings_for(run_dir(out), 0)
    if how != "worker":
        assert (ending["dispatch"], ending["status"], ending["error"]) == (0, "error", "HangError")
        (finding,) = ending["findings"]
        assert finding["kind"] == "hang" and finding["ranks"] == [0, 1, 2]
        assert line_of("# HANG LINE") in finding["locations"]
    text = summary.report(out)
    assert "stopped before the dispatch ended: rank 0 (device 3), rank 1 (device 5), rank 2 (device 9)" in text
    assert text.count("still waiting when the run was stopped (the cell held 3)") == len(IDS)
    assert re.search(r"sig_buf cell \[\d, 0\] Ge 100, saw 3 \(iteration 2\)", text)


def press_ctrl_c_when_every_rank_waits_at(where: str) -> None:
    """In a rank: a thread sends SIGINT to the driver once every rank is blocked in the wait at ``where``."""
    from ptodist import context
    from ptodist.rank.status import WAITING

    rows = context.current().status.rows

    def watch():
        while not all(row["state"] == WAITING and row["where"].decode() == where for row in rows):
            os.sched_yield()
        os.kill(os.getppid(), signal.SIGINT)

    threading.Thread(target=watch, daemon=True).start()


@pl.jit.incore
def interrupting(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(sig)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    for p in pl.range(n):                              # a barrier ...
        pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for p in pl.range(n):
        pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)
    if me == 0:                                        # ... then Ctrl-C on the driver while every rank waits for ever
        press_ctrl_c_when_every_rank_waits_at(line_of("# FOR " + "EVER"))
    for p in pl.range(n):
        pld.system.wait(sig, [p, 0], 2, cmp=pld.WaitCmp.Ge)  # FOR EVER
    return sig


interrupting_host = on_every_rank(interrupting)


@pytest.mark.parametrize("how", ["one-shot", "worker"])
def test_an_interrupted_run_leaves_every_rank_records(tmp_path, how):
    out = tmp_path / "out"
    x = ptodist.shared_array((2, 1), np.float32)
    compiled = interrupting_host.compile(x, config=config(out, ids=[0, 1], enable_chip_swimlane=True,
                                                          hang_timeout_s=600))
    with pytest.raises(KeyboardInterrupt):
        if how == "one-shot":
            compiled(x)
        else:
            with compiled.prepare() as rt:
                rt(x)
    for r in range(2):
        data = records(out, r)
        last = data["records"][-1]
        assert data["stopped"] is True and last["kind"] == "wait" and last["args"]["pending"] is True
        assert (last["args"]["cell"], last["args"]["expected"], last["args"]["iteration"]) == ([0, 0], 2, 0)
    assert len(merged(out)) == 1
    ending = summary.findings_for(run_dir(out), 0)
    assert ending == {"dispatch": 0, "status": "interrupted", "error": "KeyboardInterrupt", "message": "",
                      "findings": []}
    assert "the dispatch ended with KeyboardInterrupt (interrupted; no findings)" in summary.report(out)
