"""The ``mpi`` backend: the tutorial ladder and the collective property tests under ``mpirun -n 2`` and ``-n 4``
on this machine, and errors and hangs that end the whole job with the findings ``shm`` gives.

The tests start real MPI jobs (loopback only).  This file is also the program those jobs run:
``python tests/backends/test_mpi.py BATCH OUT_DIR`` (BATCH: ``ladder``, ``collectives`` or ``tcp``) runs a batch of
cases in every process and writes each process's outcome per case to ``OUT_DIR/rank<r>.json``; the
tests read those files, so every process's results are checked, not only what reaches the terminal.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
from conftest import on_every_rank

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
THIS = Path(__file__).resolve()
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
JOB_TIMEOUT_S = 420

needs_mpi = pytest.mark.skipif(
    MPIRUN is None or not HAVE_MPI4PY,
    reason="needs an MPI launcher and mpi4py: apt-get install openmpi-bin libopenmpi-dev; pip install -e '.[mpi]'"
    if MPIRUN is None else "needs mpi4py: pip install -e '.[mpi]'")

# The tutorial ladder: (example, its arguments); each case runs at the job's P (2 and 4).
LADDER = [
    ("01_hello_rank", []), ("02_three_levels", []), ("03_window_buffer", []), ("04_barrier", []),
    ("05_remote_load_store", ["--mode", "load"]), ("05_remote_load_store", ["--mode", "store"]),
    ("06_put_get", ["--mode", "put"]), ("06_put_get", ["--mode", "get"]), ("07_dynamic_rank_count", []),
    ("08_allreduce_mesh", []), ("09_allreduce_two_phase", []), ("10_allreduce_ring", []),
    ("11_allreduce_builtin", ["--mode", "mesh", "--where", "kernel"]),
    ("11_allreduce_builtin", ["--mode", "ring", "--where", "kernel"]),
    ("11_allreduce_builtin", ["--mode", "mesh", "--where", "host"]),
    ("11_allreduce_builtin", ["--mode", "ring", "--where", "host"]),
    ("12_broadcast", []), ("12_broadcast", ["--use-builtin"]), ("12_broadcast", ["--use-builtin", "--root", "1"]),
    ("13_allgather", []), ("13_allgather", ["--use-builtin"]),
    ("14_reduce_scatter", []), ("14_reduce_scatter", ["--use-builtin"]),
    ("15_all_to_all", []), ("15_all_to_all", ["--use-builtin"]),
    ("16_putting_it_together", ["--mode", "mesh"]), ("16_putting_it_together", ["--mode", "ring"]),
    ("allreduce", []),
]
# Over TCP with Open MPI's pt2pt one-sided component, every remote operation needs the target's progress.
TCP_LADDER = [("04_barrier", []), ("06_put_get", ["--mode", "put"]), ("10_allreduce_ring", []),
              ("11_allreduce_builtin", ["--mode", "mesh", "--where", "host"]), ("15_all_to_all", ["--use-builtin"])]


# =============================================================================================
# The batches, run inside the MPI job

def _ladder_cases(p: int, ladder=LADDER) -> dict:
    """The examples as cases {name: run it with -d 0..P-1, check it printed OK}."""
    devices = ",".join(str(i) for i in range(p))
    cases = {}
    for stem, extra in ladder:
        cases[" ".join([stem, *extra])] = (lambda stem=stem, extra=extra: _run_example(stem, ["-d", devices, *extra]))
    if ladder is LADDER:
        # Ranks are indices whatever the device ids are.
        ids = ",".join(str(d) for d in (3, 1, 7, 5, 9, 11, 13, 15)[:p])
        cases[f"10_allreduce_ring -d {ids}"] = lambda: _run_example("10_allreduce_ring", ["-d", ids])
    return cases


def _run_example(stem: str, argv: list[str]) -> None:
    spec = importlib.util.spec_from_file_location(f"ptodist_example_{stem}", EXAMPLES / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = module.main(argv)
    assert rc == 0, f"main returned {rc}"
    assert "OK" in out.getvalue().replace(":", " ").split(), out.getvalue()


def _collective_cases(p: int) -> dict:
    """The collective property tests of test_collectives.py, with seeded draws (every process draws alike)."""
    import test_collectives as tc

    import ptodist.language as pl
    import ptodist.language.distributed as pld
    from ptodist import DistributedConfig, RunConfig, ir

    Sum, Max, Min, Prod = pld.ReduceOp.Sum, pld.ReduceOp.Max, pld.ReduceOp.Min, pld.ReduceOp.Prod

    def run(prog, x, ys, sig):
        compiled = ir.compile(prog, config=RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p)))))
        y = np.zeros((p, *ys), x.dtype)
        s = np.full((p, *sig), -7, np.int32)
        compiled(x, y, s)
        return y, s

    def shape(rng, rows=(1, 4), cols=(1, 12)) -> list[int]:
        return [int(rng.integers(rows[0], rows[1] + 1)), int(rng.integers(cols[0], cols[1] + 1))]

    def pick(rng, options):
        return options[int(rng.integers(len(options)))]

    def allreduce(where, mode, dtype, seed):
        rng = np.random.default_rng(seed)
        op = Sum if where == "host" and mode == "ring" else pick(rng, [Sum, Max, Min, Prod])
        core_num, variant = 1, "explicit"
        if mode == "ring":
            xs = shape(rng, (1, 3), (1, 5))
            xs[int(rng.integers(2))] = p * int(rng.integers(1, 4))
            sig = [2 * (p - 1), p]
        else:
            xs = shape(rng)
            if where == "kernel":
                sig = pick(rng, [[p, 1], [p]])
            else:
                variant = pick(rng, ["explicit", "1-D", "omitted", "lanes", "lanes omitted"])
                sig = {"1-D": [p], "lanes": [p, 2], "lanes omitted": [p, 2]}.get(variant, [p, 1])
                core_num = 2 if variant.startswith("lanes") else 1
        x = tc.random_values(rng, dtype, (p, *xs), op)

        def call(w):
            if variant.endswith("omitted"):
                return pld.tensor.allreduce(w.a, op=op, core_num=core_num)
            return pld.tensor.allreduce(w.a, w.g, op=op, mode=mode, core_num=core_num)

        y, s = run(tc.build(p, dtype, xs, sig, **{where: call}), x, xs, sig)
        for r in range(p):
            tc.assert_reduced(y[r], x, op, dtype)
            np.testing.assert_array_equal(y[r], y[0])
        tc.assert_signals_clear(s)

    def broadcast(where, dtype, seed):
        rng = np.random.default_rng(seed)
        root, sig, xs = int(rng.integers(p)), pick(rng, [[p, 1], [p]]), shape(rng)
        x = tc.random_values(rng, dtype, (p, *xs), Max)
        y, s = run(tc.build(p, dtype, xs, sig, **{where: lambda w: pld.tensor.broadcast(w.a, w.g, root=root)}),
                   x, xs, sig)
        np.testing.assert_array_equal(y, np.broadcast_to(x[root], y.shape))
        tc.assert_signals_clear(s)

    def allgather(where, dtype, seed):
        rng = np.random.default_rng(seed)
        stacked = bool(rng.integers(2))
        as_tile = where == "kernel" and bool(rng.integers(2))
        xs = shape(rng)
        ws = [p, *xs] if stacked else [p * xs[0], xs[1]]
        x = tc.random_values(rng, dtype, (p, *xs), Max)

        def call(w):
            return pld.tensor.allgather(tc.whole(w.a, xs) if as_tile else w.a, w.b, w.g)

        y, s = run(tc.build(p, dtype, xs, [p, 1], ws=ws, ys=ws, **{where: call}), x, ws, [p, 1])
        np.testing.assert_array_equal(y, np.broadcast_to(x if stacked else x.reshape(ws), y.shape))
        tc.assert_signals_clear(s)

    def reduce_scatter(where, dtype, seed):
        rng = np.random.default_rng(seed)
        rows, cols = shape(rng, (1, 3), (1, 8))
        xs = [p * rows, cols]
        x = tc.random_values(rng, dtype, (p, *xs), Sum)
        y, s = run(tc.build(p, dtype, xs, [p, 1], **{where: lambda w: pld.tensor.reduce_scatter(w.a, w.g, op=Sum)}),
                   x, xs, [p, 1])
        for r in range(p):
            block = slice(r * rows, (r + 1) * rows)
            tc.assert_reduced(y[r, block], x[:, block], Sum, dtype)
            y[r, block] = x[r, block]
        np.testing.assert_array_equal(y, x)
        tc.assert_signals_clear(s)

    def reduce(where, dtype, seed):
        rng = np.random.default_rng(seed)
        op, root, xs = pick(rng, [Sum, Max, Min, Prod]), int(rng.integers(p)), shape(rng)
        x = tc.random_values(rng, dtype, (p, *xs), op)
        y, s = run(tc.build(p, dtype, xs, [p, 1],
                            **{where: lambda w: pld.tensor.reduce(w.a, w.g, root=root, op=op)}), x, xs, [p, 1])
        tc.assert_reduced(y[root], x, op, dtype)
        y[root] = x[root]
        np.testing.assert_array_equal(y, x)  # the other ranks keep their own data
        tc.assert_signals_clear(s)

    def all_to_all(where, dtype, seed):
        rng = np.random.default_rng(seed)
        rows, cols = shape(rng, (1, 3), (1, 8))
        xs = [p * rows, cols]
        x = tc.random_values(rng, dtype, (p, *xs), Max)
        y, s = run(tc.build(p, dtype, xs, [p, 1], ws=xs, ys=xs,
                            **{where: lambda w: pld.tensor.all_to_all(w.a, w.b, w.g)}), x, xs, [p, 1])
        blocks = x.reshape(p, p, rows, cols)
        np.testing.assert_array_equal(y.reshape(p, p, rows, cols), blocks.transpose(1, 0, 2, 3))
        tc.assert_signals_clear(s)

    def all_to_all_v(where, dtype, seed):
        rng = np.random.default_rng(seed)
        rows, cols = shape(rng, (1, 3), (1, 8))
        xs = [p * rows, cols]
        counts = rng.integers(0, rows + 1, (p, p))
        x = tc.random_values(rng, dtype, (p, *xs), Max)
        send, recv = counts.tolist(), counts.T.tolist()
        y, s = run(tc.build(p, dtype, xs, [p, 1], ws=xs, ys=xs,
                            **{where: lambda w: pld.tensor.all_to_all_v(w.a, w.b, w.g, send, recv)}), x, xs, [p, 1])
        want = np.zeros_like(y).reshape(p, p, rows, cols)
        blocks = x.reshape(p, p, rows, cols)
        for src in range(p):
            for dst in range(p):
                want[dst, src, :counts[src, dst]] = blocks[src, dst, :counts[src, dst]]
        np.testing.assert_array_equal(y.reshape(p, p, rows, cols), want)
        tc.assert_signals_clear(s)

    def barrier(where, seed):
        rng = np.random.default_rng(seed)
        reps, sig, xs = int(rng.integers(1, 4)), pick(rng, [[p, 1], [p]]), shape(rng)
        x = tc.random_values(rng, pl.FP32, (p, *xs))

        def call(w):
            for _ in range(reps):
                pld.tensor.barrier(w.g)
            return w.a

        def read(win, me, n):
            return pld.tile.remote_load(win, (me + 1) % n, tc.zeros(xs), xs)

        y, s = run(tc.build(p, pl.FP32, xs, sig, read=read, **{where: call}), x, xs, sig)
        np.testing.assert_array_equal(y, np.roll(x, -1, axis=0))
        tc.assert_signals_clear(s)

    def chain(where):
        prog, xs, ws, gs, qs = tc.chain_program(p, where)
        x = np.random.default_rng(p).integers(-3, 4, (p, *xs)).astype(np.float32)
        y = np.zeros((p, *ws), np.float32)
        sg, sq = np.full((p, *gs), -7, np.int32), np.full((p, *qs), -7, np.int32)
        ir.compile(prog, distributed_config=DistributedConfig(device_ids=list(range(p))))(x, y, sg, sq)
        np.testing.assert_array_equal(y, np.broadcast_to(p ** 4 * x.sum(axis=0) + x[p - 1] + x, y.shape))
        tc.assert_signals_clear(sg)
        tc.assert_signals_clear(sq)

    cases = {}
    for where in ("kernel", "host"):
        for mode in ("mesh", "ring"):
            for dtype in (pl.FP32, pl.FP16, pl.BF16, pl.INT32):
                if where == "host" and mode == "ring" and dtype is not pl.FP32:
                    continue
                for seed in range(2):
                    cases[f"allreduce {where} {mode} {dtype.name} seed {seed}"] = \
                        (lambda *a: lambda: allreduce(*a))(where, mode, dtype, seed)
        for dtype in (pl.FP32, pl.INT32):
            for name, fn in (("broadcast", broadcast), ("allgather", allgather), ("reduce_scatter", reduce_scatter),
                             ("reduce", reduce), ("all_to_all", all_to_all), ("all_to_all_v", all_to_all_v)):
                for seed in range(2):
                    cases[f"{name} {where} {dtype.name} seed {seed}"] = (lambda *a: lambda: a[0](*a[1:]))(
                        fn, where, dtype, seed)
        for seed in range(2):
            cases[f"barrier {where} seed {seed}"] = (lambda *a: lambda: barrier(*a))(where, seed)
        cases[f"reused signals {where}"] = (lambda w: lambda: chain(w))(where)
    cases["strided and atomic RMA FP32"] = lambda: _strided_rma(p, pl.FP32)
    cases["strided and atomic RMA FP16"] = lambda: _strided_rma(p, pl.FP16)
    cases["strided and atomic RMA INT32"] = lambda: _strided_rma(p, pl.INT32)
    cases["inputs come from process 0"] = lambda: _inputs_from_process_zero(p)
    cases["scalar arguments must agree"] = lambda: _scalars_must_agree(p)
    cases["diagnostic outputs in every process"] = lambda: _dfx_outputs(p)
    cases["a hang leaves every rank's records"] = lambda: _hang_records(p)
    return cases


def _surface_cases(p: int) -> dict:
    """Atomic stores and staged puts (test_ops_surface.py's checks), every rank one MPI process."""
    import test_ops_surface as surface

    from ptodist import DistributedConfig, RunConfig

    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p))))
    return {"atomic stores into one window": lambda: surface.check_atomic_window(config, p),
            "atomic stores into one host tensor": lambda: surface.check_atomic_host_tensor(config, p),
            "pld.tile.put / get": lambda: surface.check_tile_put_get(config, p)}


def _rma_program(p: int, dtype, rows: int, cols: int):
    """Rank r puts its column block r into the next rank's window (a strided region), adds its block into
    every rank's accumulator with AtomicType.Add, then reads back the previous rank's column block with get."""
    import ptodist.language as pl
    import ptodist.language.distributed as pld

    full = [rows, p * cols]

    def barrier(sig, me, n):
        for q in pl.range(n):
            pld.system.notify(sig, q, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
        for q in pl.range(n):
            pld.system.wait(sig, [q, 0], 1, cmp=pld.WaitCmp.Ge)

    @pl.program
    class Rma:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[full, dtype], y: pl.Out[pl.Tensor[full, dtype]], acc: pl.Out[pl.Tensor[full, dtype]],
              win: pl.InOut[pld.DistributedTensor[full, dtype]], total: pl.InOut[pld.DistributedTensor[full, dtype]],
              sig: pl.InOut[pld.DistributedTensor[[p, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(win)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            block = [0, me * cols]
            pld.tensor.put(win, (me + 1) % n, x, block, block, [rows, cols])
            tile = pl.load(x, block, [rows, cols])
            for q in pl.range(n):
                pld.tile.remote_store(tile, total, q, [0, 0], atomic=pld.AtomicType.Add)
            barrier(sig, me, n)
            prev = (me - 1 + n) % n
            pld.tensor.get(y, prev, win, [0, 0], [0, 0], full)
            pl.store(pl.load(total, [0, 0], [rows, cols]), [0, 0], acc)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[full, dtype], y: pl.Out[pl.Tensor[full, dtype]], acc: pl.Out[pl.Tensor[full, dtype]],
                 win: pl.InOut[pld.DistributedTensor[full, dtype]], total: pl.InOut[pld.DistributedTensor[full, dtype]],
                 sig: pl.InOut[pld.DistributedTensor[[p, 1], pl.INT32]]):
            self.k(x, y, acc, win, total, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[p, *full], dtype], y: pl.Out[pl.Tensor[[p, *full], dtype]],
                 acc: pl.Out[pl.Tensor[[p, *full], dtype]]):
            wbuf = pld.alloc_window_buffer(full, dtype=dtype)
            tbuf = pld.alloc_window_buffer(full, dtype=dtype)
            sbuf = pld.alloc_window_buffer([p, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(x[r], y[r], acc[r], pld.window(wbuf, full, dtype=dtype), pld.window(tbuf, full, dtype=dtype),
                          pld.window(sbuf, [p, 1], dtype=pl.INT32), device=r)
            return y

    return Rma


def _strided_rma(p: int, dtype) -> None:
    from ptodist import DistributedConfig, ir

    rows, cols = 3, 5
    prog = _rma_program(p, dtype, rows, cols)
    x = np.random.default_rng(7).integers(-8, 9, (p, rows, p * cols)).astype(dtype.np_dtype)
    y = np.zeros_like(x)
    acc = np.zeros_like(x)
    ir.compile(prog, distributed_config=DistributedConfig(device_ids=list(range(p))))(x, y, acc)
    for r in range(p):
        # Rank r read the previous rank's window, into which the rank before that put its column block.
        src = (r - 2) % p
        want = np.zeros((rows, p * cols), x.dtype)
        want[:, src * cols:(src + 1) * cols] = x[src, :, src * cols:(src + 1) * cols]
        np.testing.assert_array_equal(y[r], want)
        sums = sum(x[q, :, q * cols:(q + 1) * cols].astype(np.int64) for q in range(p))
        np.testing.assert_array_equal(acc[r, :, :cols].astype(np.int64), sums)


def _inputs_from_process_zero(p: int) -> None:
    # Each process makes different inputs (as unseeded randomness would); the ranks use process 0's, and
    # every process's input tensor is made to agree with them.
    import ptodist.language as pl
    from ptodist import DistributedConfig, RunConfig
    from ptodist.backends.mpi import load_mpi

    me = load_mpi().COMM_WORLD.Get_rank()

    @pl.jit.incore
    def copy(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        return pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], y)

    host = on_every_rank(copy, name="host")
    x = np.full((p, 1, 4), 100.0 * me, np.float32) + np.arange(p, dtype=np.float32).reshape(p, 1, 1)
    y = host(x, config=RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p)))))
    want = np.broadcast_to(np.arange(p, dtype=np.float32).reshape(p, 1, 1), (p, 1, 4))
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(y, want)


def _scalars_must_agree(p: int) -> None:
    # A scalar argument reaches the ranks as the dispatch's value, not in the plan: processes that pass
    # different values (here each its MPI rank) are refused in every process, as different plans are.
    import ptodist.language as pl
    import ptodist.language.distributed as pld
    from ptodist import DistributedConfig, RunConfig
    from ptodist.backends.mpi import load_mpi
    from ptodist.errors import DispatchValueError

    me = load_mpi().COMM_WORLD.Get_rank()
    nr = pl.dynamic("NR")

    @pl.jit.incore
    def fill(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], s: pl.Scalar[pl.FP32]):
        pl.store(pl.full([1, 4], s, pl.FP32), [0, 0], y)

    @pl.jit
    def chip(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], s: pl.Scalar[pl.FP32]):
        fill(y, s)

    @pl.jit.host
    def host(y: pl.Out[pl.Tensor[[nr, 1, 4], pl.FP32]], s: pl.Scalar[pl.FP32]):
        for r in pl.range(pld.world_size()):
            chip(y[r], s, device=r)

    y = np.zeros((p, 1, 4), np.float32)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p))))
    host(y, 2.5, config=cfg)
    assert (y == 2.5).all()
    try:
        host(y, float(me), config=cfg)
    except DispatchValueError as e:
        assert "planned a different dispatch than process 0 (other windows, tasks or scalar arguments)" in str(e)
    else:
        raise AssertionError("processes with different scalar arguments ran")


def _hang_records(p: int) -> None:
    # Every rank waits for a notify nobody sends: each stopped rank still writes its records, the pending
    # wait last, and every process's output_dir has them all.
    import ptodist.language as pl
    import ptodist.language.distributed as pld
    from ptodist import DistributedConfig, HangError, RunConfig, dfx

    @pl.jit.incore
    def never(x: pl.Tensor[[1, 4], pl.FP32], sig: pl.InOut[pld.DistributedTensor[[p, 1], pl.INT32]]):
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)

    host = on_every_rank(never, name="host")
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p))), enable_chip_swimlane=True,
                    hang_timeout_s=30)
    compiled = host.compile(config=cfg)
    try:
        compiled(np.zeros((p, 1, 4), np.float32))
    except HangError as e:
        assert e.certain, str(e)
    else:
        raise AssertionError("the run did not hang")
    (root,) = dfx.runs(compiled.output_dir)
    for r in range(p):
        data = json.loads((root / f"rank{r}" / "d0" / "chip_swimlane_records.json").read_text())
        last = data["records"][-1]
        assert data["stopped"] is True and last["kind"] == "wait" and last["args"]["pending"] is True, data


def _dfx_outputs(p: int) -> None:
    # Every process's output_dir gets every rank's files and one merged trace with a track per rank.
    import torch

    from ptodist import DistributedConfig, RunConfig, dfx, ir

    spec = importlib.util.spec_from_file_location("ptodist_example_08", EXAMPLES / "08_allreduce_mesh.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.randn(p, 1, module.SIZE)
    y = torch.zeros(p, 1, module.SIZE)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p))), enable_chip_swimlane=True,
                    enable_dep_gen=True, enable_scope_stats=True)
    compiled = ir.compile(module.build(p), config=cfg)
    compiled(x, y)
    assert torch.allclose(y, x.sum(0, keepdim=True).expand_as(y), rtol=1e-5, atol=1e-5)
    # One run folder (dfx_outputs), the same in every process of the job.
    runs = dfx.runs(compiled.output_dir)
    assert len(runs) == 1, runs
    root = runs[0]
    for r in range(p):
        d = root / f"rank{r}" / "d0"
        for name in ("chip_swimlane_records.json", "deps.json", "scope_stats/scope_stats.jsonl"):
            assert (d / name).is_file(), f"{d / name} is missing"
    merged = list(root.glob("merged_swimlane_*.json"))
    assert len(merged) == 1, merged
    events = json.loads(merged[0].read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == set(range(p))


def _batch_main(argv: list[str]) -> int:
    """Run one batch in this MPI process; write ``OUT_DIR/rank<r>.json`` ({case: "ok" | the error})."""
    batch, out_dir = argv[0], Path(argv[1])
    from ptodist import RunConfig
    from ptodist.backends.mpi import load_mpi

    backend = RunConfig().resolved_backend()
    MPI = load_mpi()
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if batch == "ladder":
        cases = _ladder_cases(size)
    elif batch == "tcp":
        cases = _ladder_cases(size, TCP_LADDER)
    elif batch == "surface":
        cases = _surface_cases(size)
    else:
        cases = _collective_cases(size)
    results = {"backend": backend, "cases": {}}
    for name, fn in cases.items():
        try:
            fn()
            results["cases"][name] = "ok"
        except BaseException as e:  # noqa: BLE001 - recorded for the test; the other cases still run
            results["cases"][name] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    return 0


# =============================================================================================
# The tests

def _mpirun(n: int, argv: list[str], *, mca: tuple = (), env: dict | None = None, timeout: float = JOB_TIMEOUT_S):
    """Run ``argv`` as an ``n``-process MPI job on this machine; return the CompletedProcess."""
    cmd = [MPIRUN, "-n", str(n)]
    version = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        # More processes than cores, launch traffic on loopback only.
        cmd += ["--oversubscribe", "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo", *mca]
    full_env = dict(os.environ)
    full_env.pop("PTODIST_BACKEND", None)  # the launcher alone must select the mpi backend
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        full_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    full_env.update(env or {})
    proc = subprocess.Popen([*cmd, *argv], cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the launcher passes SIGTERM on and ends its processes; SIGKILL would orphan them
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the MPI job ran past {timeout} s and was stopped\n{out[-3000:]}\n{err[-6000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _leftovers(token: str) -> list[str]:
    """Processes whose command line holds ``token`` (a job's unique path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if token in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def _run_batch(batch: str, n: int, tmp_path: Path, mca: tuple = ()) -> None:
    out = tmp_path / f"{batch}-{n}"
    out.mkdir()
    proc = _mpirun(n, [sys.executable, str(THIS), batch, str(out)], mca=mca)
    assert proc.returncode == 0, f"mpirun exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    failed = []
    for r in range(n):
        path = out / f"rank{r}.json"
        assert path.is_file(), f"process {r} wrote no results\n{proc.stderr[-6000:]}"
        results = json.loads(path.read_text())
        assert results["backend"] == "mpi", "mpirun did not select the mpi backend"
        assert results["cases"], "the batch ran no case"
        failed += [f"--- process {r}: {name}\n{text}" for name, text in results["cases"].items() if text != "ok"]
    assert not failed, "\n".join(failed)
    assert not _leftovers(str(out)), _leftovers(str(out))


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_the_tutorial_ladder_runs_under_mpirun(n, tmp_path):
    _run_batch("ladder", n, tmp_path)


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_collective_properties_hold_under_mpirun(n, tmp_path):
    _run_batch("collectives", n, tmp_path)


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_atomic_stores_and_staged_puts_sum_exactly_under_mpirun(n, tmp_path):
    _run_batch("surface", n, tmp_path)


@needs_mpi
def test_examples_run_over_tcp_where_one_sided_operations_need_the_targets_progress(tmp_path):
    # Open MPI's pt2pt one-sided component over TCP: what several hosts without RDMA get.
    version = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" not in version:
        pytest.skip("the transport options are Open MPI's")
    _run_batch("tcp", 2, tmp_path, mca=("--mca", "osc", "pt2pt", "--mca", "btl", "self,tcp"))


@needs_mpi
def test_ptodist_run_under_mpirun_selects_the_mpi_backend(tmp_path):
    proc = _mpirun(2, [sys.executable, "-m", "ptodist", "run", "examples/05_remote_load_store.py", "-d", "0,1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # mpirun forwards each process's output as it comes, so two "OK\n" may interleave as "OKOK\n\n".
    assert proc.stdout.count("OK") == 2, proc.stdout
    assert "runs on ptodist's 'mpi' backend" in proc.stderr


FAULTY = '''
import os
import sys
import numpy as np
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

NR = pl.dynamic("NR")


@pl.jit.incore
def k(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
      sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(sig)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    if MODE == "error" and me == 1:
        pl.load(x, [0, 4], [1, 8])  # out of bounds, on rank 1 only
    if MODE == "deadlock":
        pld.system.wait(sig, [(me + 1) % n, 0], 1, cmp=pld.WaitCmp.Ge)  # every rank waits before it notifies
    if MODE == "clobber":
        for p in pl.range(n):
            pld.system.notify(sig, p, [0, 0], 1, op=pld.NotifyOp.Set)  # every rank Sets one cell
        pld.system.wait(sig, [0, 0], n, cmp=pld.WaitCmp.Eq)
    if MODE == "sleep" and me == 0:
        import time
        time.sleep(3600)  # never returns to ptodist
    if MODE == "sleep" and me != 0:
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)
    if MODE in ("spin", "busy", "exit", "kill") and me != 1 or MODE == "exitbusy" and me > 1:
        pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)  # for a notify rank 1 never sends
    if MODE == "spin" and me == 1:
        while pl.read(sig, [0, 0]) < 1: pass  # spins on a cell nobody writes
    if MODE == "busy" and me == 1 or MODE == "exitbusy" and me == 0:
        while True: pass  # computes for ever
    if MODE in ("exit", "exitbusy") and me == 1:
        os._exit(3)  # no Python, no report
    if MODE == "kill" and me == 1:
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    for p in pl.range(n):
        pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)


@pl.jit
def chip(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
         sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    k(x, y, sig)


@pl.jit.host
def host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        chip(x[r], y[r], pld.window(buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


MODE, P = sys.argv[1], int(sys.argv[2])
x = np.ones((P, 1, 8), np.float32)
try:
    # "spin" and "busy" take the hang timeout from PTODIST_HANG_TIMEOUT (their test sets it); the others 1 s.
    timeout = None if MODE in ("spin", "busy") else 1.0
    host(x, np.zeros_like(x), config=RunConfig(distributed_config=DistributedConfig(device_ids=list(range(P))),
                                               hang_timeout_s=timeout))
except Exception as e:
    # What this process raised, with its findings, for the test to compare (one file per process).
    from ptodist.check import findings
    who = os.environ.get("OMPI_COMM_WORLD_RANK", "shm")
    with open(f"{sys.argv[3]}/report-{who}.txt", "w") as f:
        f.write(f"{type(e).__name__}: {e}\\n" + "\\n".join(item.render() for item in findings.from_exception(e)))
    raise
print("FINISHED")
'''


def _faulty_script(tmp_path: Path) -> Path:
    script = tmp_path / "faulty.py"
    script.write_text(FAULTY)
    return script


def _line(script: Path, marker: str) -> int:
    return next(i for i, text in enumerate(script.read_text().splitlines(), 1) if marker in text)


def _report(path: Path) -> str:
    """A report the faulty script wrote, with timings masked."""
    return re.sub(r"\d+\.\d+", "#", path.read_text())


def _shm_report(script: Path, mode: str, n: int) -> str:
    env = dict(os.environ, PTODIST_BACKEND="shm")
    proc = subprocess.run([sys.executable, "-m", "ptodist", "run", str(script), mode, str(n), str(script.parent)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return _report(script.parent / "report-shm.txt")


@needs_mpi
@pytest.mark.parametrize("mode, n", [("error", 2), ("error", 4), ("deadlock", 2), ("deadlock", 4), ("clobber", 4)])
def test_an_error_or_a_hang_ends_the_whole_job_with_the_findings_of_shm(mode, n, tmp_path):
    script = _faulty_script(tmp_path)
    proc = _mpirun(n, [sys.executable, "-m", "ptodist", "run", str(script), mode, str(n), str(tmp_path)])
    assert proc.returncode != 0
    assert "FINISHED" not in proc.stdout
    # Every process raised the same error and exited with status 1: no MPI abort was needed.
    assert "MPI_ABORT" not in proc.stderr, proc.stderr
    reports = [_report(tmp_path / f"report-{r}.txt") for r in range(n)]
    assert all(rep == reports[0] for rep in reports), "the processes raised different errors"
    assert reports[0] == _shm_report(script, mode, n)
    if mode == "error":
        assert reports[0].startswith("RankError: rank 1 (device 1) failed in task 'k': KernelIndexError")
        assert f"{script}:{_line(script, 'out of bounds, on rank 1')}" in reports[0]
    elif mode == "clobber":
        # What each blocked cell received comes from the other processes' notify rings.
        assert "received 4 notify(s): =1 from rank 0 at" in reports[0]
        assert "Likely cause: NotifyOp.Set from ranks [0, 1, 2, 3] on one cell" in reports[0]
    else:
        assert reports[0].startswith("HangError: deadlock: every unfinished rank is blocked")
        assert "Wait-for cycle: rank 0 -> rank 1" in reports[0]
        raw = (tmp_path / "report-0.txt").read_text()
        assert f"[hang] ranks {', '.join(map(str, range(n)))} (see docs/pitfalls.md#all-ranks-hang)" in raw
    assert not _leftovers(str(script)), _leftovers(str(script))


DEFERRED = '''
import os
import sys
import numpy as np
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

SIZE = 8


@pl.jit
def waiter(data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[6], pl.INT32]],
           ready: pl.InOut[pld.DistributedTensor[[1], pl.INT32]], x: pl.Tensor[[1, SIZE], pl.FP32],
           got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    with pl.manual_scope():
        with pl.at(level=pl.Level.CORE_GROUP) as data_arrived:  # the older wait: only the younger one's dependant
            pld.system.defer_wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)  # asks the peer for the data
        with pl.at(level=pl.Level.CORE_GROUP) as hello:
            pld.system.defer_wait(sig, [1], 1, cmp=pld.WaitCmp.Ge)
        if MODE == "never":
            for i in range(2, 6):
                with pl.at(level=pl.Level.CORE_GROUP):
                    pld.system.defer_wait(sig, [i], 2, cmp=pld.WaitCmp.Eq)  # nobody notifies these
        with pl.at(level=pl.Level.CORE_GROUP, deps=[hello]):
            pld.system.notify(sig, 1, [0], 1, op=pld.NotifyOp.AtomicAdd)
        with pl.at(level=pl.Level.CORE_GROUP, deps=[data_arrived]):
            pl.store(pl.mul(pl.load(data, [0, 0], [1, SIZE]), 2.0), [0, 0], got)
    if MODE == "younger":
        pld.system.notify(ready, 1, [0], 1, op=pld.NotifyOp.AtomicAdd)  # both waits are pending
    return got


@pl.jit
def peer(data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[6], pl.INT32]],
         ready: pl.InOut[pld.DistributedTensor[[1], pl.INT32]], x: pl.Tensor[[1, SIZE], pl.FP32],
         got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    pld.system.wait(ready, [0], 1, cmp=pld.WaitCmp.Ge)
    pld.system.notify(sig, 0, [1], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)
    with pl.at(level=pl.Level.CORE_GROUP):
        pld.tile.remote_store(pl.load(x, [0, 0], [1, SIZE]), data, 0, [0, 0])
        pld.system.notify(sig, 0, [0], 1, op=pld.NotifyOp.AtomicAdd)
    return got


@pl.jit.host
def host(x: pl.Tensor[[2, 1, SIZE], pl.FP32], got: pl.Out[pl.Tensor[[2, 1, SIZE], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([6], dtype=pl.INT32)
    ready_buf = pld.alloc_window_buffer([1], dtype=pl.INT32)
    windows = (pld.window(data_buf, [1, SIZE], dtype=pl.FP32), pld.window(sig_buf, [6], dtype=pl.INT32),
               pld.window(ready_buf, [1], dtype=pl.INT32))
    waiter(*windows, x[0], got[0], device=0)
    peer(*windows, x[1], got[1], device=1)


MODE, P = sys.argv[1], int(sys.argv[2])
x = np.arange(2 * SIZE, dtype=np.float32).reshape(2, 1, SIZE)
got = np.zeros_like(x)
try:
    host(x, got, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), hang_timeout_s=30.0))
except Exception as e:
    who = os.environ.get("OMPI_COMM_WORLD_RANK", "shm")
    with open(f"{sys.argv[3]}/report-{who}.txt", "w") as f:
        f.write(f"{type(e).__name__}: {e}\\n")
    raise
assert (got[0, 0] == 2 * x[1, 0]).all(), got
print("FINISHED")
'''


@needs_mpi
def test_deferred_waits_end_when_any_holds_and_a_hang_in_them_names_every_one_as_shm_does(tmp_path):
    script = tmp_path / "deferred.py"
    script.write_text(DEFERRED)
    # Rank 0's older deferred wait holds only after its younger one completed: it waits for whichever holds first.
    proc = _mpirun(2, [sys.executable, "-m", "ptodist", "run", str(script), "younger", "2", str(tmp_path)])
    assert proc.returncode == 0 and proc.stdout.count("FINISHED") == 2, proc.stdout + proc.stderr
    proc = _mpirun(2, [sys.executable, "-m", "ptodist", "run", str(script), "never", "2", str(tmp_path)])
    assert proc.returncode != 0 and "FINISHED" not in proc.stdout
    reports = [_report(tmp_path / f"report-{r}.txt") for r in range(2)]
    assert reports[0] == reports[1] == _shm_report(script, "never", 2)
    assert reports[0].startswith("HangError: deadlock: every unfinished rank is blocked"), reports[0]
    line = _line(script, "asks the peer for the data")
    assert f"rank 0 (device 0): blocked at {script}:{line} in kernel 'waiter@" in reports[0], reports[0]
    assert "it waits for whichever of its 6 pending deferred waits holds first; the others:" in reports[0]
    for i in range(1, 6):
        sym, value = (">=", 1) if i == 1 else ("==", 2)
        assert f"pld.system.defer_wait on 'sig' (buffer 'sig_buf') cell [{i}] holds 0, needs {sym} {value}" \
            in reports[0], reports[0]
    assert not _leftovers(str(script)), _leftovers(str(script))


@needs_mpi
def test_a_rank_that_never_returns_is_reported_then_the_job_is_aborted(tmp_path):
    script = _faulty_script(tmp_path)
    proc = _mpirun(3, [sys.executable, "-m", "ptodist", "run", str(script), "sleep", "3", str(tmp_path)], timeout=120)
    assert proc.returncode != 0
    assert "FINISHED" not in proc.stdout
    err = proc.stderr
    assert "ptodist: HangError: no progress for" in err and "(hang timeout 1 s)" in err, err
    # Its pulse thread sampled where the rank is: the report names the line it never returns from.
    sleep = f"{script}:{_line(script, 'never returns to ptodist')}"
    assert f"rank 0 (device 0): running task 'k' at {sleep} in k (busy, not in a wait)" in err, err
    wait_line = _line(script, "pld.system.wait(sig, [0, 0], 1,")
    assert f"rank 1 (device 1): blocked at {script}:{wait_line} in kernel 'k'" in err, err
    assert f"Likely cause: rank 0 at {sleep} (kernel 'k') is running, not waiting" in err, err
    assert "ptodist: finding hang (see docs/pitfalls.md#all-ranks-hang) on ranks 1, 2" in err
    assert ("rank 0 (device 0) did not stop within 2 s after the run failed: it was running in task 'k' at "
            f"{sleep} in k") in err
    assert "MPI_Abort" in err
    assert not _leftovers(str(script)), _leftovers(str(script))


@needs_mpi
@pytest.mark.parametrize("mode, marker", [("spin", "spins on a cell nobody writes"), ("busy", "computes for ever")])
def test_a_rank_that_runs_without_communicating_is_a_hang_that_names_its_line(mode, marker, tmp_path):
    # Rank 1 loops (polling a cell nobody writes, or computing for ever) while rank 0 waits for its notify.
    # CPU time is not progress: after the hang timeout rank 0 reports rank 1 as running at its loop's line.
    script = _faulty_script(tmp_path)
    proc = _mpirun(2, [sys.executable, "-m", "ptodist", "run", str(script), mode, "2", str(tmp_path)],
                   env={"PTODIST_HANG_TIMEOUT": "2"}, timeout=120)
    assert proc.returncode != 0
    assert "FINISHED" not in proc.stdout
    err = proc.stderr
    loop = f"{script}:{_line(script, marker)}"
    wait_line = _line(script, "for a notify rank 1 never sends")
    assert "ptodist: HangError: no progress for" in err and "(hang timeout 2 s)" in err, err
    assert f"rank 0 (device 0): blocked at {script}:{wait_line} in kernel 'k'" in err, err
    assert f"rank 1 (device 1): running task 'k' at {loop} in k (busy, not in a wait)" in err, err
    assert (f"Likely cause: rank 1 at {loop} (kernel 'k') is running, not waiting, and made no communication "
            "progress, so the ranks that wait for it never get its notifies: the signalling is not at fault.") in err
    # A loop in the kernel never returns to ptodist, so the job ends with MPI_Abort after the report.
    assert ("rank 1 (device 1) did not stop within 2 s after the run failed: it was running in task 'k' at "
            f"{loop} in k") in err, err
    assert "MPI_Abort" in err
    assert not _leftovers(str(script)), _leftovers(str(script))


VANISHED = re.compile(r"ptodist: RankError: rank 1 \(device 1\) failed( in task 'k')?: RankDied: the rank process "
                      r"(vanished without reporting a result \(os\._exit, a signal or the OOM killer\)|called os\._exit)")


@needs_mpi
@pytest.mark.parametrize("mode, n, tcp", [("exit", 2, False), ("exit", 3, False), ("kill", 2, False),
                                          ("exitbusy", 2, False), ("exitbusy", 3, False), ("exit", 3, True)])
def test_a_rank_process_that_vanishes_is_named_by_every_surviving_process(mode, n, tcp, tmp_path):
    # Rank 1's process ends without Python (os._exit(3), or SIGKILL) while the other ranks wait for it. A
    # waiting rank sees its pid gone and reports it, then ends the job with MPI_Abort; a process that the
    # launcher terminates first (SIGTERM) prints the same report from its signal handler. With "exitbusy"
    # rank 0 computes for ever instead: its pulse thread reports, or its SIGTERM handler. Over TCP (Open
    # MPI's pt2pt one-sided component) no process may touch the dead one's window: the report still comes.
    script = _faulty_script(tmp_path)
    open_mpi = "Open MPI" in subprocess.run([MPIRUN, "--version"], capture_output=True, text=True).stdout
    if (mode == "exitbusy" or tcp) and not open_mpi:
        pytest.skip("verified with Open MPI (which ends the other processes with SIGTERM; its transports)")
    mca = ("--mca", "osc", "pt2pt", "--mca", "btl", "self,tcp") if tcp else ()
    proc = _mpirun(n, [sys.executable, "-m", "ptodist", "run", str(script), mode, str(n), str(tmp_path)], mca=mca,
                   timeout=120)
    assert proc.returncode != 0
    assert "FINISHED" not in proc.stdout
    err = proc.stderr
    # Once per surviving process. The kernel is named where the process read rank 1's status row: a waiting
    # rank that sees the death first (Open MPI terminates the others about 1 s after a process exits) does.
    assert len(VANISHED.findall(err)) == n - 1, err
    if mode in ("exit", "exitbusy"):  # the record rank 1's process left names its line (SIGKILL leaves none)
        exit_line = f"{script}:{_line(script, 'no Python, no report')}"
        # (in kernel 'k' where the process read rank 1's status row, else in its function k)
        assert len(re.findall(rf"the rank process called os\._exit\(3\) at {re.escape(exit_line)} in (kernel 'k'|k) "
                              r"\(its last Python line\)", err)) == n - 1, err
    assert "ptodist: finding rank_died on ranks 1" in err
    assert err.count("ptodist: the process of rank 1 (device 1) ended during the run; ") == n - 1, err
    if mode == "exitbusy":
        # Rank 0 never waits: its pulse thread reported and ended the job, or its SIGTERM handler reported.
        assert re.search(r"ended during the run; (rank 0 \(device 0\) ends the MPI job with MPI_Abort|the MPI "
                         r"launcher then ended rank 0 \(device 0\) \(SIGTERM\))\.", err), err
    assert not _leftovers(str(script)), _leftovers(str(script))


@needs_mpi
def test_a_job_with_the_wrong_process_count_is_refused_in_every_process(tmp_path):
    proc = _mpirun(2, [sys.executable, "-m", "ptodist", "run", "examples/04_barrier.py", "-d", "0,1,2"])
    assert proc.returncode != 0
    message = ("ConfigError: barrier_shift: the program has 3 ranks (DistributedConfig(device_ids=[0, 1, 2])) but "
               "this MPI job has 2 processes, and each MPI process runs one rank. Start it with `mpirun -n 3 ...`, "
               "or give device_ids 2 entries.")
    assert message in proc.stderr, proc.stderr
    assert "MPI_ABORT" not in proc.stderr


# -- selecting the backend (no MPI job needed) ------------------------------------------------------

def test_an_mpi_launcher_selects_the_mpi_backend(monkeypatch):
    from ptodist import RunConfig

    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "PTODIST_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    assert RunConfig().resolved_backend() == "shm"
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert RunConfig().resolved_backend() == "mpi"
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    monkeypatch.setenv("PMI_SIZE", "4")  # MPICH / Intel MPI
    assert RunConfig().resolved_backend() == "mpi"


def test_an_explicit_backend_wins_over_the_launcher(monkeypatch):
    from ptodist import RunConfig

    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert RunConfig(backend="shm").resolved_backend() == "shm"
    monkeypatch.setenv("PTODIST_BACKEND", "shm")
    assert RunConfig().resolved_backend() == "shm"
    assert RunConfig(backend="mpi").resolved_backend() == "mpi"


def test_the_mpi_backend_without_mpi4py_says_how_to_install_it(monkeypatch):
    from ptodist.backends import get_backend
    from ptodist.errors import ConfigError

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if it were not installed
    with pytest.raises(ConfigError) as info:
        get_backend("mpi")
    msg = str(info.value)
    assert "the 'mpi' backend needs mpi4py, which is not installed" in msg
    assert "pip install ptodist[mpi]" in msg and "apt-get install openmpi-bin libopenmpi-dev" in msg
    assert "mpirun -n P python SCRIPT" in msg


@pytest.mark.skipif(not HAVE_MPI4PY, reason="needs mpi4py: pip install -e '.[mpi]'")
def test_several_ranks_without_a_launcher_are_refused_before_mpi_starts(monkeypatch, capsys):
    from ptodist.errors import ConfigError

    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PTODIST_BACKEND", "mpi")
    started = "mpi4py.MPI" in sys.modules
    with pytest.raises(ConfigError) as info:
        _run_example("03_window_buffer", ["-d", "0,1"])
    assert ("the program has 2 ranks (DistributedConfig(device_ids=[0, 1])) and runs on the 'mpi' backend, where "
            "each MPI process runs one rank, but no MPI launcher started this process. Start it with "
            "`mpirun -n 2 python SCRIPT`, or choose another backend (RunConfig(backend='shm') or "
            "PTODIST_BACKEND=shm).") in str(info.value)
    # MPI was not started: no singleton MPI and no helper daemon in this process.
    assert ("mpi4py.MPI" in sys.modules) == started


def test_unknown_backends_list_mpi():
    from ptodist.backends import get_backend
    from ptodist.errors import ConfigError

    with pytest.raises(ConfigError, match="available: shm, sim, mpi"):
        get_backend("nccl")


if __name__ == "__main__":
    raise SystemExit(_batch_main(sys.argv[1:]))
