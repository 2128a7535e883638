"""Signal round-trip latency: ptodist notify/wait ping-pong vs. multiprocessing pipes and a Condition.

Two ranks bounce a counter N times inside one kernel (rank 0 notifies, rank 1
waits then notifies back).  The alternatives do the same bounce between two
processes with ``multiprocessing.Pipe`` and with a shared ``Value`` guarded by
a ``Condition``.  Prints a Markdown table of the median round trip over
several repetitions, and ptodist's ratio to each alternative.

Run: ``python benchmarks/signal_latency.py [--rounds 20000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir


def make_pingpong(rounds: int):
    @pl.program
    class PingPong:
        @pl.function(type=pl.FunctionType.InCore)
        def bounce(self, t: pl.Out[pl.Tensor[[1, 1], pl.FP32]],
                   sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
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

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, t: pl.Out[pl.Tensor[[1, 1], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
            return self.bounce(t, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, t: pl.Out[pl.Tensor[[2, 1, 1], pl.FP32]]):
            b = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(t[r], pld.window(b, [2, 1], dtype=pl.INT32), device=r)
            return t

    return ir.compile(PingPong, distributed_config=DistributedConfig(device_ids=[0, 1]))


def ptodist_us(compiled) -> float:
    return float(compiled(np.zeros((2, 1, 1), np.float32))[0, 0, 0])


def _pipe_peer(conn, rounds):
    for _ in range(rounds):
        conn.send_bytes(conn.recv_bytes())


def pipe_us(rounds: int) -> float:
    a, b = mp.Pipe()
    p = mp.get_context("fork").Process(target=_pipe_peer, args=(b, rounds))
    p.start()
    t0 = time.perf_counter()
    for _ in range(rounds):
        a.send_bytes(b"x")
        a.recv_bytes()
    dt = time.perf_counter() - t0
    p.join()
    return dt / rounds * 1e6


def _cond_peer(value, cond, rounds):
    for i in range(rounds):
        with cond:
            cond.wait_for(lambda i=i: value.value >= 2 * i + 1)
            value.value += 1
            cond.notify_all()


def condition_us(rounds: int) -> float:
    ctx = mp.get_context("fork")
    value, cond = ctx.Value("i", 0, lock=False), ctx.Condition()
    p = ctx.Process(target=_cond_peer, args=(value, cond, rounds))
    p.start()
    t0 = time.perf_counter()
    for i in range(rounds):
        with cond:
            value.value += 1
            cond.notify_all()
            cond.wait_for(lambda i=i: value.value >= 2 * i + 2)
    dt = time.perf_counter() - t0
    p.join()
    return dt / rounds * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    compiled = make_pingpong(args.rounds)
    rows = {"ptodist notify/wait": [], "multiprocessing.Pipe": [], "multiprocessing.Condition": []}
    for _ in range(args.repeat):  # interleaved, so machine drift hits every contender alike
        rows["ptodist notify/wait"].append(ptodist_us(compiled))
        rows["multiprocessing.Pipe"].append(pipe_us(args.rounds))
        rows["multiprocessing.Condition"].append(condition_us(args.rounds))
    ours = statistics.median(rows["ptodist notify/wait"])
    print(f"Signal round trip between 2 processes ({args.rounds} rounds, median of {args.repeat}; "
          f"{mp.cpu_count()} CPUs)\n")
    print("| mechanism | round trip (µs) | min | max | ptodist / this |")
    print("|---|---:|---:|---:|---:|")
    for name, vals in rows.items():
        med = statistics.median(vals)
        print(f"| {name} | {med:.1f} | {min(vals):.1f} | {max(vals):.1f} | {ours / med:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
