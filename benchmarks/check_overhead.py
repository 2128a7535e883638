"""What ``ptodist check`` costs: one checked schedule vs a plain run, on the tutorial examples and a big allreduce.

Contenders, per program, all in this process (interpreter start-up and imports
are not counted; each program's own work — making inputs, compiling,
planning, its golden check — is, as a user waits for it):

* **run**: the script as ``ptodist run`` runs it, on the default ``shm``
  backend (one forked process per rank);
* **sim**: the same on the ``sim`` backend, nothing recorded (the schedule
  alone: every rank a thread, one running at a time);
* **check**: one schedule of ``ptodist check`` (sim, every window access,
  notify and wait recorded, then the happens-before analysis).

Programs: every tutorial example with its default arguments, and a 16 MiB
allreduce (``pld.tensor.allreduce`` from the host orchestrator on a
``[1, 4 Mi]`` FP32 window, P = 2 and 4; the script below).  Contenders are
interleaved per repetition; the table shows medians (ms) and check / run.

Run: ``python benchmarks/check_overhead.py [--repeat 3] [--only 05_remote_load_store,...]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ptodist import compat
from ptodist.check import explore

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("[0-9][0-9]_*.py"))

BIG_ALLREDUCE = '''
"""16 MiB allreduce from the host orchestrator: y[r] = sum over ranks of x."""
import sys

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

N = 4 * 1024 * 1024  # FP32 elements: 16 MiB per rank
NR = int(sys.argv[1])


@pl.jit.incore
def stage_k(x: pl.Tensor[[1, N], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
    return pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)


@pl.jit.incore
def unstage_k(data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    return pl.store(pl.load(data, [0, 0], [1, N]), [0, 0], y)


@pl.jit
def stage(x: pl.Tensor[[1, N], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
    return stage_k(x, data)


@pl.jit
def unstage(data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    return unstage_k(data, y)


@pl.jit.host
def host(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
    sig = pld.window(pld.alloc_window_buffer([NR, 1], dtype=pl.INT32), [NR, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        stage(x[r], pld.window(buf, [1, N], dtype=pl.FP32), device=r)
    pld.tensor.allreduce(pld.window(buf, [1, N], dtype=pl.FP32), sig)
    for r in pl.range(pld.world_size()):
        unstage(pld.window(buf, [1, N], dtype=pl.FP32), y[r], device=r)
    return y


x = np.random.default_rng(0).integers(-8, 8, (NR, 1, N)).astype(np.float32)
y = np.zeros_like(x)
ir.compile(host, distributed_config=DistributedConfig(device_ids=list(range(NR))))(x, y)
assert np.array_equal(y, np.broadcast_to(x.sum(axis=0), y.shape)), "mismatch"
print("OK")
'''


def _run_script(script: str, argv: list[str], mode: str) -> float:
    """Seconds for one run of ``script`` in ``mode`` (run / sim / check); raises if it fails."""
    saved = sys.argv, os.environ.get("PTODIST_BACKEND")
    sys.argv = [script, *argv]
    os.environ["PTODIST_BACKEND"] = "sim" if mode == "sim" else "shm"
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            t0 = time.perf_counter()
            if mode == "check":
                with explore.checking(0) as session:
                    runpy.run_path(script, run_name="__main__")
                if session.findings:
                    raise RuntimeError(f"{script}: check found {len(session.findings)} finding(s)")
            else:
                runpy.run_path(script, run_name="__main__")
            elapsed = time.perf_counter() - t0
    except SystemExit as e:
        if e.code:
            raise RuntimeError(f"{script} {' '.join(argv)} exited with {e.code} ({mode})") from None
        elapsed = time.perf_counter() - t0
    finally:
        sys.argv = saved[0]
        if saved[1] is None:
            os.environ.pop("PTODIST_BACKEND", None)
        else:
            os.environ["PTODIST_BACKEND"] = saved[1]
    if "OK" not in out.getvalue().split():
        raise RuntimeError(f"{script} {' '.join(argv)} did not print OK ({mode})")
    return elapsed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="repetitions per program and contender (median shown)")
    ap.add_argument("--only", default="", help="comma-separated program names (default: all)")
    args = ap.parse_args(argv)
    compat.install()
    modes = ("run", "sim", "check")
    with tempfile.TemporaryDirectory(prefix="ptodist-check-bench-") as tmp:
        os.environ.setdefault("PTODIST_OUTPUT_ROOT", tmp)
        big = Path(tmp) / "allreduce_16mib.py"
        big.write_text(BIG_ALLREDUCE)
        programs = [(stem, str(REPO / "examples" / f"{stem}.py"), []) for stem in EXAMPLES]
        programs += [(f"allreduce 16 MiB P={p}", str(big), [str(p)]) for p in (2, 4)]
        if args.only:
            wanted = set(args.only.split(","))
            programs = [p for p in programs if p[0] in wanted]
        print(f"check overhead: median of {args.repeat} (ms); machine: {os.cpu_count()} cores\n")
        print("| program | run (shm) | sim | check (1 schedule) | check / run |")
        print("|---|---:|---:|---:|---:|")
        ratios = []
        for name, script, extra in programs:
            times: dict[str, list[float]] = {m: [] for m in modes}
            for i in range(args.repeat):
                for m in modes[i % len(modes):] + modes[:i % len(modes)]:  # rotate the order per repetition
                    times[m].append(_run_script(script, extra, m))
            med = {m: statistics.median(v) * 1e3 for m, v in times.items()}
            ratio = med["check"] / med["run"]
            if not name.startswith("allreduce 16"):
                ratios.append(ratio)
            print(f"| {name} | {med['run']:.0f} | {med['sim']:.0f} | {med['check']:.0f} | {ratio:.2f}x |", flush=True)
        if ratios:
            print(f"\ntutorial examples: check / run median {statistics.median(ratios):.2f}x, "
                  f"max {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
