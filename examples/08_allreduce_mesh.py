"""Step 08 — mesh allreduce by hand: stage, one barrier, then every rank reads every peer and sums.

The simplest allreduce there is, built only from step 04's barrier and step
05's ``remote_load``:

1. every rank stages its vector ``x[r]`` in its ``data`` window;
2. a barrier on a ``[P, 1]`` signal (rank r bumps cell ``[r, 0]`` on every
   peer, then waits until each peer's cell on its own copy is at least 1):
   after it, every window holds its rank's vector;
3. every rank reads all P windows, in rank order ``0, 1, ..., P-1``, and adds
   them up, so every rank computes the same sum in the same order and gets
   bitwise the same result.

Nothing writes a window after the barrier, so one barrier is enough: there is
no second phase that could overwrite data a slower peer is still reading.
Every rank moves ``(P - 1) * N`` elements over the links — fine for small P;
steps 09 and 10 cut that.

The program comes from a factory, ``build(nr)``: the rank count is a plain
Python int in the factory's closure, so the annotations can use it
(``[nr, 1]`` signals, ``[nr, 1, SIZE]`` host tensors) and the same source
serves any P.

Pitfall (SPEC §8.3, step 08): leaving out the barrier. The remote loads then
race the peers' staging stores. At P = 2 the peer usually wins the race and
the run passes; at P = 4 some rank reads a window that is still zero, and the
sum is silently wrong. The race is there at every P, whether or not a given
run shows it.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

SIZE = 256


def build(nr: int):
    """Return the mesh-allreduce program for ``nr`` ranks."""

    @pl.program
    class MeshAllreduce:
        @pl.function(type=pl.FunctionType.InCore)
        def mesh_step(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                      data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                      sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)

            # 1. Stage my vector where every peer can read it.
            data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)

            # 2. Barrier: arrive at every peer, then wait for every peer to arrive here.
            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)

            # 3. Read every window (mine included, through the same call) in rank order and sum.
            acc = pl.full([1, SIZE], dtype=pl.FP32, value=0.0)
            for src in pl.range(n):
                acc = pl.add(acc, pld.tile.remote_load(data, src, [0, 0], [1, SIZE]))
            return pl.store(acc, [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.mesh_step(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def allreduce(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
                sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
                self.per_rank(x[r], y[r], data, sig, device=r)
            return y

    return MeshAllreduce


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    compiled = ir.compile(build(nr), platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    expected = x.sum(dim=0, keepdim=True).expand_as(y)
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5), \
        f"P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    # Same summation order on every rank: the copies agree bit for bit.
    assert all(torch.equal(y[r], y[0]) for r in range(nr)), "the ranks' results differ"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
