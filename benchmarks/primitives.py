"""Per-primitive Python cost: each pld signal / RMA primitive against the bare call it wraps.

Inside one kernel on rank 0 of a P = 2 ``shm`` run, each primitive is called ``--calls`` times in a
plain Python loop, then the bare operation it stands for is called as many times in the same kind
of loop; the difference per call is what ptodist adds (argument checks, peer translation, the status
board's last-operation word, the progress counter, dispatch).  Both loops have the same shape, so
the loop itself cancels out.  Repeated ``--repeat`` times, interleaved; medians are reported.

| primitive | bare call |
|---|---|
| ``pld.system.notify`` (AtomicAdd, to the peer) | ``_atomics.fetch_add`` on the peer's cell |
| ``pld.system.wait`` (already satisfied) | ``_atomics.wait`` on the own cell (returns at once) |
| ``pld.tile.remote_load`` of a 16x16 FP32 tile | ``peer[r0:r1, c0:c1].copy()`` |
| ``pld.tile.remote_store`` of a 16x16 FP32 tile | ``peer[r0:r1, c0:c1] = tile`` |
| ``pld.tensor.put`` of a 16x16 FP32 region | ``peer[r0:r1, c0:c1] = local[r0:r1, c0:c1]`` |
| ``pld.tensor.get`` of a 16x16 FP32 region | ``local[r0:r1, c0:c1] = peer[r0:r1, c0:c1]`` |

Run: ``python benchmarks/primitives.py [--calls 20000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, context, ir

OPS = ("notify", "wait (satisfied)", "remote_load 16x16", "remote_store 16x16", "put 16x16", "get 16x16")
T = 16       # tile side
SIDE = 64    # window side (FP32)


def make_program(calls: int, repeat: int):
    n_ops = len(OPS)

    @pl.program
    class Primitives:
        @pl.function(type=pl.FunctionType.InCore)
        def bench(self, out: pl.Out[pl.Tensor[[2, 6, 64], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]],
                  win: pl.InOut[pld.DistributedTensor[[64, 64], pl.FP32]],
                  local: pl.InOut[pl.Tensor[[64, 64], pl.FP32]]):
            me = int(pld.rank(pld.get_comm_ctx(sig)))
            if me != 0:
                return out
            from ptodist import _atomics  # the bare calls, as the shm backend makes them

            peer = 1
            memory = context.current().memory
            sleepers = memory.sleepers_addr
            peer_cell = sig.peer_array(peer).ctypes.data  # cell [0, 0] on the peer
            own_cell = sig.array.ctypes.data + 4  # cell [1, 0] here: 0, so `>= 0` holds
            peer_win = win.peer_array(peer)
            local_arr = local.array
            tile = pl.load(local, [0, 0], [T, T])
            tile_data = tile.data
            Add, Ge = pld.NotifyOp.AtomicAdd, pld.WaitCmp.Ge
            r0, r1, c0, c1 = T, 2 * T, 0, T
            offs, shp = [r0, c0], [T, T]
            rng = range(calls)
            perf = time.perf_counter_ns

            def primitive(k):
                t0 = perf()
                if k == 0:
                    for _ in rng:
                        pld.system.notify(sig, peer, [0, 0], 1, op=Add)
                elif k == 1:
                    for _ in rng:
                        pld.system.wait(sig, [1, 0], 0, cmp=Ge)
                elif k == 2:
                    for _ in rng:
                        pld.tile.remote_load(win, peer, offs, shp)
                elif k == 3:
                    for _ in rng:
                        pld.tile.remote_store(tile, win, peer, offs)
                elif k == 4:
                    for _ in rng:
                        pld.tensor.put(win, peer, local, offs, offs, shp)
                else:
                    for _ in rng:
                        pld.tensor.get(local, peer, win, offs, offs, shp)
                return (perf() - t0) / calls / 1e3

            def bare(k):
                t0 = perf()
                if k == 0:
                    for _ in rng:
                        _atomics.fetch_add(peer_cell, sleepers, 1)
                elif k == 1:
                    for _ in rng:
                        _atomics.wait(own_cell, sleepers, 1, 0, 50e-6, 0.0, 0.2)
                elif k == 2:
                    for _ in rng:
                        peer_win[r0:r1, c0:c1].copy()
                elif k == 3:
                    for _ in rng:
                        peer_win[r0:r1, c0:c1] = tile_data
                elif k == 4:
                    for _ in rng:
                        peer_win[r0:r1, c0:c1] = local_arr[r0:r1, c0:c1]
                else:
                    for _ in rng:
                        local_arr[r0:r1, c0:c1] = peer_win[r0:r1, c0:c1]
                return (perf() - t0) / calls / 1e3

            for rep in range(repeat):
                for k in range(n_ops):
                    out.array[0, k, rep] = primitive(k)
                    out.array[1, k, rep] = bare(k)
            return out

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, out: pl.Out[pl.Tensor[[2, 6, 64], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]],
                 win: pl.InOut[pld.DistributedTensor[[64, 64], pl.FP32]],
                 local: pl.InOut[pl.Tensor[[64, 64], pl.FP32]]):
            return self.bench(out, sig, win, local)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, out: pl.Out[pl.Tensor[[2, 2, 6, 64], pl.FP32]], local: pl.InOut[pl.Tensor[[2, 64, 64], pl.FP32]]):
            s = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
            w = pld.alloc_window_buffer([64, 64], dtype=pl.FP32)
            for r in pl.range(pld.world_size()):
                self.chip(out[r], pld.window(s, [2, 1], dtype=pl.INT32), pld.window(w, [64, 64], dtype=pl.FP32),
                          local[r], device=r)
            return out

    return ir.compile(Primitives, distributed_config=DistributedConfig(device_ids=[0, 1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    if not 1 <= args.repeat <= 64:
        ap.error("--repeat must be in [1, 64]")
    compiled = make_program(args.calls, args.repeat)
    out = np.zeros((2, 2, len(OPS), 64), np.float32)
    compiled(out, np.ones((2, SIDE, SIDE), np.float32))
    res = out[0, :, :, :args.repeat]  # rank 0: [primitive/bare, op, repetition]
    print(f"Per-primitive cost on rank 0 of a P = 2 shm run ({args.calls} calls per op, median of "
          f"{args.repeat} interleaved repetitions)\n")
    print("| primitive | ptodist (µs/op) | bare (µs/op) | overhead (µs/op) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for k, name in enumerate(OPS):
        ours, base = float(np.median(res[0, k])), float(np.median(res[1, k]))
        over = statistics.median(float(a - b) for a, b in zip(res[0, k], res[1, k]))
        print(f"| {name} | {ours:.2f} | {base:.2f} | {over:.2f} | {ours / base:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
