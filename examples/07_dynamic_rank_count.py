"""Step 07 — dynamic rank count: one source that runs unchanged at any P.

``NR = pl.dynamic("NR")`` names a dimension that is bound at dispatch from
the actual argument shapes, so no rank count is baked into the program:

* host shapes are ``[NR, 1, SIZE]`` (one slice per rank, however many);
* the signal window is ``[NR, 1]``: one cell per source rank, allocated as
  ``[pld.world_size(), 1]`` INT32 and bound to ``NR`` again in the kernel;
* kernels take the rank count from ``pld.nranks(ctx)`` and loop or index
  with it; the golden is computed from the actual P.

The program is a periodic three-point stencil (a halo exchange): each rank
stages ``x[r]``, tells both neighbours it is ready (cell ``[me, 0]`` of
theirs), waits for both neighbours (cells ``[left, 0]`` and ``[right, 0]``
of its own), then reads their slices:
``y[r] = x[(r - 1 + P) % P] + x[r] + x[(r + 1) % P]``. Only neighbours
synchronise, not the whole world. At P = 2 both neighbours are the same rank;
its cell then counts 2 and ``Ge 1`` still holds. Run it with ``-d 0,1``,
``-d 0,1,2``, ``-d 0,1,2,3`` or eight ids: same source, same answer.

Pitfall (SPEC §8.3, step 07): a hard-coded rank count in host shapes (say
``pl.Tensor[[2, 1, SIZE], ...]``). It works at P = 2 and is a shape error at
any other P; ptodist names the parameter and dimension and suggests
``pl.dynamic("NR")``.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

SIZE = 64
NR = pl.dynamic("NR")


@pl.jit.incore
def neighbour_sum(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                  halo: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(halo)
    me = pld.rank(ctx)
    n = pld.nranks(ctx)
    left = (me - 1 + n) % n  # not (me - 1) % n: that is -1 for rank 0
    right = (me + 1) % n

    own = pl.load(x, [0, 0], [1, SIZE])
    halo = pl.store(own, [0, 0], halo)

    pld.system.notify(sig, left, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.notify(sig, right, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.wait(sig, [left, 0], 1, cmp=pld.WaitCmp.Ge)
    pld.system.wait(sig, [right, 0], 1, cmp=pld.WaitCmp.Ge)

    from_left = pld.tile.remote_load(halo, left, [0, 0], [1, SIZE])
    from_right = pld.tile.remote_load(halo, right, [0, 0], [1, SIZE])
    total = pl.add(pl.add(from_left, own), from_right)
    return pl.store(total, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
             halo: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
             sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return neighbour_sum(x, y, halo, sig)


@pl.jit.host
def stencil(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    halo_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        halo = pld.window(halo_buf, [1, SIZE], dtype=pl.FP32)
        sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
        per_rank(x[r], y[r], halo, sig, device=r)
    return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1", help="comma-separated device ids, one rank each (any count)")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled = stencil.compile(x, y, config=cfg)
    compiled(x, y)

    # torch.roll(x, 1, 0)[r] = x[r - 1]; torch.roll(x, -1, 0)[r] = x[r + 1] (both cyclic).
    expected = torch.roll(x, 1, 0) + x + torch.roll(x, -1, 0)
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5), \
        f"P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
