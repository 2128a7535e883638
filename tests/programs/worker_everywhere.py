"""One DistributedWorker program, run the same way on every backend (tests/worker/test_worker_backends.py).

Resident and stacked tensors, persistent windows, two dispatches in flight, a sub-worker callback.
``python worker_everywhere.py WORLD OUT_DIR`` writes ``OUT_DIR/process{p}.json``; on mpi every process
of the job runs it (``mpirun -n WORLD``), elsewhere one process does.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir

N = 4


def build(world: int):
    @pl.program
    class Everywhere:
        @pl.function(type=pl.FunctionType.InCore)
        def step(self, x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
                 z: pl.Out[pl.Tensor[[1, N], pl.FP32]], acc: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[world, 1], pl.INT32]], k: pl.Scalar[pl.INT32]):
            ctx = pld.get_comm_ctx(acc)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            total = pl.add(pl.load(acc, [0, 0], [1, N]), pl.load(x, [0, 0], [1, N]))  # acc persists: k * x
            pl.store(total, [0, 0], acc)
            pl.store(total, [0, 0], z)
            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(sig, [src, 0], k, cmp=pld.WaitCmp.Ge)  # the signals persist too
            pl.store(pld.tile.remote_load(acc, (me + 1) % n, [0, 0], [1, N]), [0, 0], y)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
                 z: pl.Out[pl.Tensor[[1, N], pl.FP32]], acc: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[world, 1], pl.INT32]], k: pl.Scalar[pl.INT32]):
            return self.step(x, y, z, acc, sig, k)

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def tally(self, y: pl.Tensor[[world, 1, N], pl.FP32], k: pl.Scalar[pl.INT32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[world, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[world, 1, N], pl.FP32]],
                 z: pl.Out[pl.Tensor[[world, 1, N], pl.FP32]], k: pl.Scalar[pl.INT32]):
            acc = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
            sig = pld.alloc_window_buffer([world, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(x[r], y[r], z[r], pld.window(acc, [1, N], dtype=pl.FP32),
                          pld.window(sig, [world, 1], dtype=pl.INT32), k, device=r)
            self.tally(y, k)

    return Everywhere


def run(world: int, backend: str | None = None) -> dict:
    """Run the scenario; return what this process saw (plain lists, for JSON)."""
    devices = DistributedConfig(device_ids=list(range(world)))
    compiled = ir.compile(build(world), distributed_config=devices)
    config = RunConfig(distributed_config=devices, backend=backend)
    x_host = np.arange(world * N, dtype=np.float32).reshape(world, 1, N) + 1
    tallies = []
    with compiled.prepare(config, persistent=True, reset_persistent_windows=False,
                          callbacks={"tally": lambda y, k: tallies.append([int(k), float(np.asarray(y).sum())])}) as rt:
        x = rt.alloc_stacked_tensor(x_host)
        z = rt.alloc_stacked_tensor(np.zeros_like(x_host))
        ys = [ptodist.shared_array((world, 1, N), pl.FP32) for _ in range(3)]
        first = rt.submit(compiled, x, ys[0], z, 1)   # two in flight
        second = rt.submit(compiled, x, ys[1], z, 2)
        first.result()
        second.result()
        rt.run(compiled, x, ys[2], z, 3)
        z_host = np.zeros_like(x_host)
        rt.copy_stacked_from(z, z_host)
        backend_name = rt._core.backend
    return {"backend": backend_name, "ys": [y.tolist() for y in ys], "z": z_host.tolist(), "tallies": tallies}


def expected(world: int) -> dict:
    x = np.arange(world * N, dtype=np.float32).reshape(world, 1, N) + 1
    right = x[[(r + 1) % world for r in range(world)]]
    ys = [(k * right).tolist() for k in (1, 2, 3)]
    return {"ys": ys, "z": (3 * x).tolist(), "tallies": [[k, float((k * right).sum())] for k in (1, 2, 3)]}


if __name__ == "__main__":
    world, out = int(sys.argv[1]), sys.argv[2]
    result = run(world)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    with open(os.path.join(out, f"process{rank}.json"), "w") as f:
        json.dump(result, f)
