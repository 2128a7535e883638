"""What the diagnostic outputs (DFX) cost: every flag off vs every flag on, on signal-heavy programs.

Two programs, both dominated by signal operations:

* **ping-pong**: 2 ranks bounce a counter ``--rounds`` times inside one kernel
  (rank 0 notifies, rank 1 waits then notifies back); timed inside the kernel,
  so the result is the round trip.  A round trip has 4 operations on its
  critical path (notify, wait, notify, wait).
* **host allreduce loop**: the host orchestrator calls the builtin
  ``pld.tensor.allreduce`` ``--calls`` times on a 4 KiB window with an explicit
  signal (each call a task on every rank made of notifies, waits and gets),
  between two timer kernels; the result is the time per call (max over ranks).

Modes: ``off`` (``RunConfig()`` defaults: no event log, the hooks see
``events is None``) and ``on`` (``enable_chip_swimlane``, ``enable_dep_gen``,
``enable_scope_stats``: every operation is recorded, and each rank writes its
files when its dispatch ends, outside the timed region; *call wall* includes
that).  A third mode, ``no hooks`` (skipped with ``--no-baseline``), is the
events-free baseline for ``off``: the ranks run the current ``rank/context.py``
(with its concern modules) compiled with every ``self.events is [not] None`` test replaced by a constant,
so that CPython drops the hook code (built at run time; nothing under ``src/``
changes).  Modes are interleaved per repetition (order rotating) and the table
shows medians.

The cost of the disabled hooks is also estimated from first principles: each
signal or RMA operation runs two ``self.events is not None`` tests when off
(one guards the start timestamp, one the record), a task three; the script
times exactly that code on a ``RankContext`` with ``events = None`` and
multiplies.

Run: ``python benchmarks/dfx_overhead.py [--rounds 5000] [--calls 500] [--repeat 5] [--no-baseline]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import timeit
import types
from pathlib import Path

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, dfx

NR = pl.dynamic("NR")
ALL_ON = {"enable_chip_swimlane": True, "enable_dep_gen": True, "enable_scope_stats": True}
SIZE = 1024  # FP32 elements of the allreduce window: 4 KiB
CHECKS_PER_OP = 2  # `start = now_ns() if self.events is not None else 0` and `if self.events is not None:`
CHECKS_PER_TASK = 3  # _run_kernel's info, _task_body's record, and its `rec is not None` in `finally`


# -- the programs -----------------------------------------------------------------------------------------------

def pingpong(rounds: int):
    @pl.jit.incore
    def bounce(t: pl.Out[pl.Tensor[[1, 1], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
        me = pld.rank(pld.get_comm_ctx(sig))
        other = 1 - me
        t0 = time.perf_counter()
        for i in pl.range(rounds):
            if me == 0:
                pld.system.notify(sig, other, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
                pld.system.wait(sig, [1, 0], i + 1, cmp=pld.WaitCmp.Ge)
            else:
                pld.system.wait(sig, [0, 0], i + 1, cmp=pld.WaitCmp.Ge)
                pld.system.notify(sig, other, [1, 0], 1, op=pld.NotifyOp.AtomicAdd)
        pl.write(t, [0, 0], (time.perf_counter() - t0) / rounds * 1e6)
        return t

    @pl.jit
    def chip(t: pl.Out[pl.Tensor[[1, 1], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
        return bounce(t, sig)

    @pl.jit.host
    def host(t: pl.Out[pl.Tensor[[NR, 1, 1], pl.FP32]]):
        buf = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
        for r in pl.range(pld.world_size()):
            chip(t[r], pld.window(buf, [2, 1], dtype=pl.INT32), device=r)
        return t

    def measure(compiled) -> float:
        """µs per round trip."""
        return float(compiled(np.zeros((2, 1, 1), np.float32))[0, 0, 0])

    return host, (np.zeros((2, 1, 1), np.float32),), measure


def allreduce_loop(calls: int):
    @pl.jit.incore
    def stamp(t: pl.Out[pl.Tensor[[1], pl.INT64]]):
        pl.write(t, [0], time.perf_counter_ns())
        return t

    @pl.jit
    def clock(t: pl.Out[pl.Tensor[[1], pl.INT64]]):
        return stamp(t)

    @pl.jit.host
    def host(t0: pl.Out[pl.Tensor[[NR, 1], pl.INT64]], t1: pl.Out[pl.Tensor[[NR, 1], pl.INT64]]):
        sig = pld.window(pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32), [pld.world_size(), 1],
                         dtype=pl.INT32)
        data = pld.window(pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32), [1, SIZE], dtype=pl.FP32)
        pld.tensor.allreduce(data, sig)  # warm-up; ends with a barrier, so the ranks start t0 together
        for r in pl.range(pld.world_size()):
            clock(t0[r], device=r)
        for _ in pl.range(calls):
            pld.tensor.allreduce(data, sig)
        for r in pl.range(pld.world_size()):
            clock(t1[r], device=r)
        return t0, t1

    def measure(compiled) -> float:
        """µs per call, max over ranks."""
        t0, t1 = np.zeros((2, 1), np.int64), np.zeros((2, 1), np.int64)
        compiled(t0, t1)
        return float((t1 - t0).max()) / calls / 1e3

    return host, (np.zeros((2, 1), np.int64), np.zeros((2, 1), np.int64)), measure


# -- the events-free baseline -----------------------------------------------------------------------------------

def events_free_rank_context():
    """Return a RankContext compiled from the current rank/context.py and its concern modules with every hook
    compiled out.

    ``self.events is not None`` becomes ``False`` and ``self.events is None`` becomes ``True``: CPython drops
    ``if False:`` blocks and folds ``x if False else y`` to ``y`` when it compiles, so this class runs exactly
    the current code minus the hooks.  Nothing on disk changes.
    """
    import importlib

    import ptodist.rank.context as rank_module

    real = rank_module.RankContext
    hooks, stripped_modules = 0, {}
    for name in {c.__module__ for c in real.__mro__ if c.__module__.startswith("ptodist.rank.")}:
        path = Path(importlib.import_module(name).__file__)
        source = path.read_text()
        count = source.count("self.events is not None") + source.count("self.events is None")
        stripped = source.replace("self.events is not None", "False").replace("self.events is None", "True")
        if "self.events is" in stripped:
            raise RuntimeError(f"{path.name}'s hooks are not all of the form `self.events is [not] None`")
        hooks += count
        # A file name inside the package, so that source locations skip its frames as they skip the real one's.
        filename = str(path.with_name(f"_{path.stem}_without_hooks.py"))
        module = types.ModuleType(f"ptodist.rank._{path.stem}_without_hooks")
        module.__package__ = "ptodist.rank"
        module.__file__ = filename
        sys.modules[module.__name__] = module
        exec(compile(stripped, filename, "exec"), module.__dict__)
        stripped_modules[name] = module
    if hooks == 0:
        raise RuntimeError("rank/context.py's hooks are not of the form `self.events is [not] None`")
    # The stripped modules import the real concern mixins: put the class together from the stripped ones.
    own = {k: v for k, v in vars(getattr(stripped_modules[real.__module__], real.__name__)).items()
           if k not in ("__dict__", "__weakref__")}
    bases = tuple(getattr(stripped_modules[b.__module__], b.__name__) if b.__module__ in stripped_modules else b
                  for b in real.__bases__)
    cls = type(real.__name__, bases, own)
    cls._OPS = {op: getattr(cls, fn.__name__) for op, fn in real._OPS.items()}
    return cls, hooks


class Backend:
    """Switches the class the shm backend's rank processes build (they are forked: they see the switch)."""

    def __init__(self, baseline_cls):
        import ptodist.backends.shm.server as shm  # where the rank processes build their context

        self.shm = shm
        self.current = shm.RankContext
        self.baseline_cls = baseline_cls

    def use(self, mode: str) -> None:
        if mode == "no hooks":
            cls = self.baseline_cls

            def make(plan, rank, memory, host_arrays, events=None):
                assert events is None
                return cls(plan, rank, memory, host_arrays)

            self.shm.RankContext = make
        else:
            self.shm.RankContext = self.current


# -- the estimate -----------------------------------------------------------------------------------------------

def hook_cost_ns(number: int = 2_000_000) -> float:
    """ns for one op's disabled hooks: the two tests as rank/context.py writes them, minus the same loop without them."""
    from ptodist.rank.context import RankContext
    from ptodist.rank.events import now_ns

    ctx = RankContext.__new__(RankContext)
    ctx.__dict__.update({f"attr{i}": i for i in range(30)})  # an instance dict the size of a real one
    ctx.events = None
    env = {"ctx": ctx, "now_ns": now_ns}
    hooks = "start = now_ns() if ctx.events is not None else 0\nif ctx.events is not None:\n    pass"
    empty = "start = 0"
    best = []
    for stmt in (hooks, empty):
        best.append(min(timeit.repeat(stmt, globals=env, number=number, repeat=5)) / number * 1e9)
    return max(best[0] - best[1], 0.0)


# -- driver -----------------------------------------------------------------------------------------------------

def ops_per_unit(out: Path, kind: str, units: int) -> float:
    """Signal and RMA records per rank per unit (round or call), from an `on` run's records."""
    recs = json.loads((dfx.latest_run(out) / "rank0" / "d0" / "chip_swimlane_records.json").read_text())["records"]
    ops = [r for r in recs if r["kind"] in ("notify", "wait", "rma")]
    if kind == "allreduce":
        return len(ops) / (units + 1)  # the warm-up call is recorded too
    return len(ops) / units


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5000, help="ping-pong round trips per run")
    ap.add_argument("--calls", type=int, default=500, help="allreduce calls per run")
    ap.add_argument("--repeat", type=int, default=5, help="repetitions per mode; the table shows medians")
    ap.add_argument("--no-baseline", action="store_true", help="skip the events-free `no hooks` mode")
    args = ap.parse_args(argv)

    modes = ["off", "on"]
    notes = []
    backend = Backend(None)
    if not args.no_baseline:
        try:
            cls, hooks = events_free_rank_context()
            backend = Backend(cls)
            modes.insert(0, "no hooks")
            notes.append(f"`no hooks`: the current rank/context.py with its {hooks} `self.events is [not] None` "
                         "tests compiled out, run in place of it.")
        except Exception as e:  # noqa: BLE001 - the baseline is optional; say why it is missing
            notes.append(f"`no hooks` not measured: {type(e).__name__}: {e}")

    tmp = Path(tempfile.mkdtemp(prefix="dfx_overhead_"))
    benches = {"ping-pong": pingpong(args.rounds), "allreduce": allreduce_loop(args.calls)}
    units = {"ping-pong": args.rounds, "allreduce": args.calls}
    compiled = {}
    for name, (host, example, _measure) in benches.items():
        for mode in modes:
            flags = ALL_ON if mode == "on" else {}
            cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]),
                            output_dir=str(tmp / f"{name}-{mode.replace(' ', '_')}"), **flags)
            compiled[name, mode] = host.compile(*example, config=cfg)
    samples = {key: [] for key in compiled}
    walls = {key: [] for key in compiled}
    try:
        for rep in range(args.repeat):
            order = modes[rep % len(modes):] + modes[:rep % len(modes)]  # rotate, so drift hits every mode alike
            for name, (_host, _example, measure) in benches.items():
                for mode in order:
                    backend.use(mode)
                    t = time.perf_counter()
                    samples[name, mode].append(measure(compiled[name, mode]))
                    walls[name, mode].append((time.perf_counter() - t) * 1e3)
                    print(f"rep {rep + 1}/{args.repeat} {name:9} {mode:8} {samples[name, mode][-1]:8.2f} µs",
                          file=sys.stderr)
        backend.use("off")
        per_unit = {name: ops_per_unit(compiled[name, "on"].output_dir, name, units[name]) for name in benches}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    hook_ns = hook_cost_ns()
    crit_ops = {"ping-pong": 2 * per_unit["ping-pong"], "allreduce": per_unit["allreduce"]}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"DFX cost, P = 2, median of {args.repeat} ({os.cpu_count()} CPUs, load {load:.2f}); ping-pong: "
          f"{args.rounds} round trips per run, allreduce: {args.calls} calls of 4 KiB per run\n")
    print("| program | unit | ops on the path per unit | mode | µs per unit | min | max | call wall (ms) "
          "| (mode − off) / op (µs) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for name in benches:
        off = statistics.median(samples[name, "off"])
        unit = "round trip" if name == "ping-pong" else "call"
        for mode in modes:
            vals = samples[name, mode]
            med = statistics.median(vals)
            extra = f"{(med - off) / crit_ops[name]:+.2f}" if mode != "off" else ""
            print(f"| {name} | {unit} | {crit_ops[name]:.0f} | {mode} | {med:.2f} | {min(vals):.2f} | "
                  f"{max(vals):.2f} | {statistics.median(walls[name, mode]):.1f} | {extra} |")
    print()
    print(f"Disabled hooks, estimated: {hook_ns:.1f} ns per operation ({CHECKS_PER_OP} `events is not None` tests, "
          f"timed on a RankContext), {CHECKS_PER_TASK * hook_ns / CHECKS_PER_OP:.1f} ns per task.")
    for name in benches:
        off = statistics.median(samples[name, "off"])
        cost = crit_ops[name] * hook_ns / 1e3
        print(f"- {name}: {crit_ops[name]:.0f} ops on the path per unit x {hook_ns:.1f} ns = {cost * 1e3:.0f} ns, "
              f"{100 * cost / off:.3f} % of the `off` median ({off:.2f} µs).")
        if "no hooks" in modes:
            base = statistics.median(samples[name, "no hooks"])
            print(f"  measured `off` − `no hooks`: {off - base:+.2f} µs per unit ({100 * (off - base) / base:+.1f} %), "
                  f"within the run-to-run spread of {min(samples[name, 'off']):.2f}–{max(samples[name, 'off']):.2f} "
                  f"µs" if abs(off - base) <= max(samples[name, "off"]) - min(samples[name, "off"]) else
                  f"  measured `off` − `no hooks`: {off - base:+.2f} µs per unit ({100 * (off - base) / base:+.1f} %)")
    for note in notes:
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
