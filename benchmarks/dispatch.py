"""Dispatch latency: a prepared DistributedWorker vs. one-shot calls vs. a torch.distributed (gloo) barrier.

Every contender runs P ranks that do (almost) nothing, so what is measured is the
cost of getting work to P processes and learning that it is done:

* **prepared** ``rt(x)``: a ``DistributedWorker`` (``compiled.prepare()``) dispatching a
  program whose per-device function calls one empty kernel; the ranks were started
  once, the host tensor is shared memory.
* **prepared, submitted**: the same with ``rt.submit`` (two dispatches in flight),
  time per dispatch over a stream of them.
* **one-shot** ``compiled(x)``: the same program called directly; its first call forked
  the ranks, later calls reuse them (a program keeps its rank group between calls, but
  closes it after 5 s idle: each repetition makes one untimed call first, because the other
  contenders can take longer than that).
* **new host tensors**: a second table with a program that has an output: in place
  ``rt(x, y)``, inputs only ``y = rt(x)`` (the worker makes the output every dispatch) and
  fresh ``rt(x_new, y_new)`` (new shared tensors every dispatch, dropped after it).
* **a host collective**: a third table: the in-place program with one 4 KiB host allreduce
  added (on its own worker), and what the allreduce adds to a dispatch.
* **gloo barrier**: P processes in ``torch.distributed`` (gloo over loopback) doing
  ``dist.barrier()``; a barrier is the smallest round trip that involves every rank.
* **prepared on mpi**: the prepared ``rt(x)`` under ``mpirun -n P`` (the ``mpi`` backend: every
  process runs the script and its copy of the worker, process r runs rank r); one job per
  repetition, ``--dispatches`` dispatches after 100 untimed ones; rank 0's time per dispatch.

Each row interleaves the contenders (repetition 1 of each, then repetition 2, ...)
and reports medians.  Prints a Markdown table; the header has the CPU count and the
load average, which the numbers depend on.

Run: ``python benchmarks/dispatch.py [--dispatches 2000] [--one-shot 20] [--barriers 2000] [--fresh 200]
[--repeat 5] [--ps 2,4] [--no-mpi]``
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import gloo_group  # benchmarks/gloo_group.py, beside this script
import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

GOAL_US = {2: 100.0, 4: 150.0}  # per prepared dispatch, by P


@pl.jit.incore
def empty_kernel(x: pl.Tensor[[1, 4], pl.FP32]):
    pass


@pl.jit
def per_rank(x: pl.Tensor[[1, 4], pl.FP32]):
    empty_kernel(x)


@pl.jit.host
def empty(x: pl.Tensor[[pl.dynamic("NR"), 1, 4], pl.FP32]):
    for r in pl.range(pld.world_size()):
        per_rank(x[r], device=r)


@pl.jit
def per_rank_out(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    empty_kernel(x)


@pl.jit.host
def empty_out(x: pl.Tensor[[pl.dynamic("NR"), 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[pl.dynamic("NR"), 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        per_rank_out(x[r], y[r], device=r)


def with_allreduce(p: int):
    """``empty_out`` plus one host allreduce of 4 KiB per rank: what a dispatch's collective adds."""

    @pl.jit.host
    def reduced_out(x: pl.Tensor[[pl.dynamic("NR"), 1, 4], pl.FP32],
                    y: pl.Out[pl.Tensor[[pl.dynamic("NR"), 1, 4], pl.FP32]]):
        data = pld.window(pld.alloc_window_buffer([1, 1024], dtype=pl.FP32), [1, 1024], dtype=pl.FP32)
        sig = pld.window(pld.alloc_window_buffer([p, 1], dtype=pl.INT32), [p, 1], dtype=pl.INT32)
        for r in pl.range(pld.world_size()):
            per_rank_out(x[r], y[r], device=r)
        pld.tensor.allreduce(data, sig)

    return reduced_out


def in_place_us(rt, x, y, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        rt(x, y)
    return (time.perf_counter() - t0) / n * 1e6


def inputs_only_us(rt, x, n: int) -> float:
    """``y = rt(x)``: the worker makes the output for each dispatch; the caller drops the last one."""
    t0 = time.perf_counter()
    for _ in range(n):
        y = rt(x)
    del y
    return (time.perf_counter() - t0) / n * 1e6


def fresh_us(rt, p: int, n: int) -> float:
    """A new pair of shared tensors every dispatch (made before the clock starts), dropped after it."""
    pairs = [(torch.zeros(p, 1, 4).share_memory_(), torch.zeros(p, 1, 4).share_memory_()) for _ in range(n)]
    t0 = time.perf_counter()
    for _ in range(n):
        x, y = pairs.pop()
        rt(x, y)
        del x, y
    return (time.perf_counter() - t0) / n * 1e6


def prepared_us(rt, x, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        rt(x)
    return (time.perf_counter() - t0) / n * 1e6


def submitted_us(rt, compiled, x, n: int) -> float:
    t0 = time.perf_counter()
    pending = []
    for _ in range(n):
        pending.append(rt.submit(compiled, x))
        if len(pending) == 2:
            pending.pop(0).result()
    for h in pending:
        h.result()
    return (time.perf_counter() - t0) / n * 1e6


def one_shot_us(compiled, x, n: int) -> float:
    compiled(x)  # untimed: the rank group, forked again if it was closed while idle
    t0 = time.perf_counter()
    for _ in range(n):
        compiled(x)
    return (time.perf_counter() - t0) / n * 1e6


# -- gloo: P forked processes, one Pipe each ----------------------------------------------------

def _gloo_worker(rank: int, p: int, port: int, conn) -> None:
    try:
        dist = gloo_group.join(rank, p, port)
        conn.send(("ready", None))
        while True:
            k = conn.recv()
            if k is None:
                break
            dist.barrier()  # warm-up, and everyone starts together
            t0 = time.perf_counter()
            for _ in range(k):
                dist.barrier()
            conn.send(("ok", (time.perf_counter() - t0) / k * 1e6))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the driver
        conn.send(("error", f"{type(e).__name__}: {e}"))


class GlooBarrier(gloo_group.Workers):
    """P gloo processes; ``measure(k)`` times k barriers on all of them (µs per barrier, slowest rank)."""

    def __init__(self, p: int):
        super().__init__(p, _gloo_worker)

    def measure(self, k: int) -> float:
        self.send(k)
        replies = self.collect(600.0)
        errors = [v for s, v in replies if s != "ok"]
        if errors:
            raise RuntimeError(errors[0])
        return max(v for _, v in replies)


def gloo_available() -> str | None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        return "torch.distributed was built without gloo"
    return None


def mpi_prepared_us(p: int, n: int) -> tuple[float | None, str]:
    """The prepared ``rt(x)`` on the mpi backend: one ``mpirun -n p`` job of this script; (µs, why not)."""
    from collectives import mpi_launcher  # benchmarks/collectives.py, beside this script

    argv, why = mpi_launcher()
    if argv is None:
        return None, why
    try:
        out = subprocess.run(argv + ["-n", str(p), sys.executable, os.path.abspath(__file__), "--mpi-worker-run",
                                     str(n)], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"mpirun failed: {e}"
    m = re.search(r"^MPI_PREPARED_US ([\d.]+)$", out.stdout, re.M)
    if m is None:
        return None, f"the mpirun job printed no time (exit {out.returncode}): {out.stderr.strip()[-300:]}"
    return float(m.group(1)), ""


def _mpi_worker_run(n: int) -> int:
    """One process of the ``mpirun`` job ``mpi_prepared_us`` starts."""
    from mpi4py import MPI

    p = MPI.COMM_WORLD.Get_size()
    x = torch.zeros(p, 1, 4)
    compiled = empty.compile(x, config=RunConfig(backend="mpi",
                                                 distributed_config=DistributedConfig(device_ids=list(range(p)))))
    with compiled.prepare() as rt:
        prepared_us(rt, x, 100)  # warm-up
        us = prepared_us(rt, x, n)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"MPI_PREPARED_US {us:.1f}", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dispatches", type=int, default=2000, help="prepared dispatches per repetition")
    ap.add_argument("--one-shot", type=int, default=20, help="one-shot calls per repetition")
    ap.add_argument("--barriers", type=int, default=2000, help="gloo barriers per repetition")
    ap.add_argument("--fresh", type=int, default=200, help="dispatches per repetition with new host tensors")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ps", default="2,4", help="comma-separated rank counts")
    ap.add_argument("--no-mpi", action="store_true", help="leave out the prepared dispatch on the mpi backend")
    ap.add_argument("--mpi-worker-run", type=int, help=argparse.SUPPRESS)  # a process of that mpirun job
    args = ap.parse_args(argv)
    if args.mpi_worker_run is not None:
        return _mpi_worker_run(args.mpi_worker_run)
    ps = [int(p) for p in args.ps.split(",")]
    no_gloo = gloo_available()
    no_mpi = "left out (--no-mpi)" if args.no_mpi else None
    load0 = os.getloadavg()
    rows, fresh_rows = [], []
    for p in ps:
        compiled = empty.compile(config=RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p)))))
        x = torch.zeros(p, 1, 4).share_memory_()
        compiled(x)  # plans (and says which backend runs it) before anything is timed
        gloo = GlooBarrier(p) if no_gloo is None else None
        samples: dict[str, list[float]] = {"prepared": [], "submitted": [], "one-shot": [], "gloo": [], "mpi": []}
        try:
            with compiled.prepare() as rt:
                prepared_us(rt, x, 100)  # warm-up
                for _ in range(args.repeat):
                    samples["prepared"].append(prepared_us(rt, x, args.dispatches))
                    samples["submitted"].append(submitted_us(rt, compiled, x, args.dispatches))
                    samples["one-shot"].append(one_shot_us(compiled, x, args.one_shot))
                    if gloo is not None:
                        samples["gloo"].append(gloo.measure(args.barriers))
                    if no_mpi is None:
                        us, why = mpi_prepared_us(p, args.dispatches)
                        if us is None:
                            no_mpi = why
                        else:
                            samples["mpi"].append(us)
        finally:
            if gloo is not None:
                gloo.close()
        rows.append((p, {k: statistics.median(v) if v else None for k, v in samples.items()}))
        compiled_out = empty_out.compile(x, x.clone(), config=RunConfig(
            distributed_config=DistributedConfig(device_ids=list(range(p)))))
        y = torch.zeros(p, 1, 4).share_memory_()
        fresh: dict[str, list[float]] = {"in-place": [], "inputs-only": [], "fresh": [], "allreduce": []}
        compiled_ar = with_allreduce(p).compile(x, y, config=RunConfig(
            distributed_config=DistributedConfig(device_ids=list(range(p)))))
        with compiled_out.prepare() as rt, compiled_ar.prepare() as rt_ar:
            in_place_us(rt, x, y, 100)  # warm-up
            in_place_us(rt_ar, x, y, 100)
            for _ in range(args.repeat):
                fresh["in-place"].append(in_place_us(rt, x, y, args.fresh))
                fresh["inputs-only"].append(inputs_only_us(rt, x, args.fresh))
                fresh["fresh"].append(fresh_us(rt, p, args.fresh))
                fresh["allreduce"].append(in_place_us(rt_ar, x, y, args.fresh))
        fresh_rows.append((p, {k: statistics.median(v) for k, v in fresh.items()}))
    load1 = os.getloadavg()
    print(f"## Dispatch latency — median µs per dispatch over {args.repeat} repetitions "
          f"({os.cpu_count()} CPUs; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end)\n")
    print("| P | prepared `rt(x)` | prepared, `submit` (2 in flight) | one-shot `compiled(x)` | gloo `barrier()` "
          "| prepared on mpi | one-shot / prepared | prepared / gloo barrier |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def fmt(v):
        return "n/a" if v is None else f"{v:.1f}"

    for p, m in rows:
        ratio_os = m["one-shot"] / m["prepared"]
        ratio_g = "n/a" if m["gloo"] is None else f"{m['prepared'] / m['gloo']:.2f}"
        print(f"| {p} | {fmt(m['prepared'])} | {fmt(m['submitted'])} | {fmt(m['one-shot'])} | {fmt(m['gloo'])} "
              f"| {fmt(m['mpi'])} | {ratio_os:.0f} | {ratio_g} |")
    if no_gloo is not None:
        print(f"\ngloo: n/a ({no_gloo})")
    if no_mpi is not None:
        print(f"\nprepared on mpi: n/a ({no_mpi})")
    print(f"\n## Prepared dispatch with new host tensors — median µs per dispatch over {args.repeat} repetitions\n")
    print("| P | in place `rt(x, y)` | inputs only `y = rt(x)` | fresh `rt(x_new, y_new)` | inputs only / in place "
          "| fresh / in place |")
    print("|---|---:|---:|---:|---:|---:|")
    for p, m in fresh_rows:
        print(f"| {p} | {m['in-place']:.1f} | {m['inputs-only']:.1f} | {m['fresh']:.1f} "
              f"| {m['inputs-only'] / m['in-place']:.2f} | {m['fresh'] / m['in-place']:.2f} |")
    worst = max(max(m["inputs-only"], m["fresh"]) / m["in-place"] for _, m in fresh_rows)
    print(f"\nGoal: inputs-only and fresh dispatches within 2x of in place — {'met' if worst <= 2 else 'not met'} "
          f"(worst {worst:.2f}x).")
    print(f"\n## Prepared dispatch with a host collective — median µs per dispatch over {args.repeat} repetitions\n")
    print("| P | in place `rt(x, y)` | the same with one 4 KiB host allreduce | what the allreduce adds |")
    print("|---|---:|---:|---:|")
    for p, m in fresh_rows:
        print(f"| {p} | {m['in-place']:.1f} | {m['allreduce']:.1f} | {m['allreduce'] - m['in-place']:.1f} |")
    for p, m in rows:
        if p in GOAL_US:
            verdict = "met" if m["prepared"] <= GOAL_US[p] else "not met"
            print(f"\nGoal: at most {GOAL_US[p]:.0f} µs per prepared dispatch at P = {p} — {verdict} "
                  f"({m['prepared']:.1f} µs).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
