"""Single-device costs: the Python overhead of one tile op, and each single-device example against torch.

* **Tile op overhead**: ``pl.tile.add`` on two 64x64 FP32 tiles, ``pl.add`` on the same tiles (the
  dispatcher picks the tile level) and the Tile operator ``a + b``, against the bare ``np.add`` of their
  arrays. Each contender is timed over ``--calls`` back-to-back calls; the table shows µs per call and
  the overhead over ``np.add`` (goal: at most 3 µs).
* **Examples**: every program of ``examples/single_device/`` called as a user calls it
  (``fn(*tensors, config=RunConfig(backend=...))``: compile, plan, run the one device, copy back) on
  the ``shm`` and the ``sim`` backend, against the same computation in plain torch (the example's
  ``reference``). Each call is timed on its own after one warm-up call. torch runs on
  ``--torch-threads`` threads (default 1, as the program's numpy does): on a loaded 2-core machine a
  second intra-op thread that has to wait for a core turns a 10 µs softmax into milliseconds.

Repetitions interleave the contenders (repetition 1 of each, then repetition 2, ...); the tables show
medians. Prints Markdown tables; the header has the CPU count and the load average.

Run: ``python benchmarks/single_device.py [--calls 20000] [--repeat 7] [--only NAME,...]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import ptodist.language as pl
from ptodist import RunConfig

GOAL_US = 3.0  # overhead of one tile op over the bare numpy call
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "single_device"
STEMS = ["elementwise", "softmax", "rmsnorm", "ffn", "splitk_matmul", "task_graph", "attention"]
OUTPUTS = {"task_graph": 2}  # trailing output arguments of an example's run(); 1 where not listed


# -- (a) one tile op ---------------------------------------------------------------------------------
def op_contenders() -> dict:
    """name -> a function of ``n`` that makes ``n`` calls and returns the seconds they took."""
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    a, b = pl.Tile(x, pl.FP32), pl.Tile(y, pl.FP32)
    tile_add, unified_add, np_add = pl.tile.add, pl.add, np.add

    # One loop per contender, the callee bound to a local: the loop itself costs the same in each.
    def bare(n):
        t0 = time.perf_counter()
        for _ in range(n):
            np_add(x, y)
        return time.perf_counter() - t0

    def tile(n):
        t0 = time.perf_counter()
        for _ in range(n):
            tile_add(a, b)
        return time.perf_counter() - t0

    def unified(n):
        t0 = time.perf_counter()
        for _ in range(n):
            unified_add(a, b)
        return time.perf_counter() - t0

    def operator(n):
        t0 = time.perf_counter()
        for _ in range(n):
            a + b  # noqa: B018 - the operator call is what is timed
        return time.perf_counter() - t0

    np.testing.assert_array_equal(tile_add(a, b).data, x + y)
    np.testing.assert_array_equal(unified_add(a, b).data, x + y)
    return {"`np.add(x, y)`": bare, "`pl.tile.add(a, b)`": tile, "`pl.add(a, b)`": unified, "`a + b`": operator}


def bench_op(calls: int, repeat: int) -> dict[str, list[float]]:
    contenders = op_contenders()
    for fn in contenders.values():
        fn(min(calls, 1000))  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            samples[name].append(fn(calls) / calls * 1e6)
    return samples


# -- (b) the examples --------------------------------------------------------------------------------------
def load(stem: str):
    spec = importlib.util.spec_from_file_location(f"single_device_{stem}", EXAMPLES / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_example(stem: str, repeat: int, torch_calls: int) -> dict[str, list[float]]:
    """ms per call: the program on shm and on sim, and the torch reference."""
    m = load(stem)
    args = m.inputs()
    ins = args[:-OUTPUTS.get(stem, 1)]
    configs = {"shm": RunConfig(backend="shm"), "sim": RunConfig(backend="sim")}

    def torch_ms():
        t0 = time.perf_counter()
        for _ in range(torch_calls):
            m.reference(*ins)
        return (time.perf_counter() - t0) / torch_calls * 1e3

    for cfg in configs.values():
        m.run(*args, config=cfg)  # warm-up (and the first message on which backend runs it)
    torch_ms()
    samples: dict[str, list[float]] = {"shm": [], "sim": [], "torch": []}
    for _ in range(repeat):
        for name, cfg in configs.items():
            samples[name].append(timed(lambda cfg=cfg: m.run(*args, config=cfg)) * 1e3)
        samples["torch"].append(torch_ms())
    return samples


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000, help="tile-op calls per repetition")
    ap.add_argument("--repeat", type=int, default=7, help="repetitions per contender")
    ap.add_argument("--torch-calls", type=int, default=20, help="torch reference calls per repetition")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (torch.set_num_threads)")
    ap.add_argument("--only", default=",".join(STEMS), help="comma-separated examples to time")
    ap.add_argument("--no-examples", action="store_true", help="time the tile op only")
    args = ap.parse_args(argv)
    stems = [] if args.no_examples else [s for s in args.only.split(",") if s]
    unknown = sorted(set(stems) - set(STEMS))
    if unknown:
        ap.error(f"unknown example(s): {', '.join(unknown)} (known: {', '.join(STEMS)})")
    torch.set_num_threads(args.torch_threads)
    load0 = os.getloadavg()
    op = {k: statistics.median(v) for k, v in bench_op(args.calls, args.repeat).items()}
    rows = [(stem, {k: statistics.median(v) for k, v in bench_example(stem, args.repeat, args.torch_calls).items()})
            for stem in stems]
    load1 = os.getloadavg()

    print(f"## One tile op on 64x64 FP32 — median µs per call over {args.repeat} repetitions of {args.calls} calls "
          f"({os.cpu_count()} CPUs; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end)\n")
    print("| call | µs per call | overhead over `np.add` (µs) | ratio to `np.add` |")
    print("|---|---:|---:|---:|")
    base = op["`np.add(x, y)`"]
    for name, us in op.items():
        extra = "" if us is base else f"{us - base:+.2f}"
        print(f"| {name} | {us:.2f} | {extra} | {us / base:.2f} |")
    worst = max(us - base for name, us in op.items() if name != "`np.add(x, y)`")
    print(f"\nGoal: at most {GOAL_US:.0f} µs overhead per tile op — {'met' if worst <= GOAL_US else 'not met'} "
          f"(worst {worst:.2f} µs).")
    if rows:
        print(f"\n## Single-device examples — median ms per call over {args.repeat} repetitions "
              f"(torch: the mean of {args.torch_calls} calls per repetition, {args.torch_threads} "
              f"thread(s))\n")
        print("| example | program (shm) | program (sim) | torch | shm / torch | sim / torch |")
        print("|---|---:|---:|---:|---:|---:|")
        for stem, m in rows:
            print(f"| {stem} | {m['shm']:.2f} | {m['sim']:.2f} | {m['torch']:.3f} | {m['shm'] / m['torch']:.0f} "
                  f"| {m['sim'] / m['torch']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
