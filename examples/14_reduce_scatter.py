"""Step 14 — reduce_scatter: rank r ends with the sum of every rank's block r, by hand or with the builtin.

Each rank holds P blocks of ``[ROWS, COLS]`` stacked as ``[P * ROWS, COLS]``;
block j is rank j's share. Afterwards rank r holds the element-wise sum over
all ranks of block r: ``y[r] == sum_k x[k][r * ROWS:(r + 1) * ROWS]``. It is
the first half of step 09's allreduce, kept as a collective of its own
(the sharded-gradient step of data-parallel training).

* By hand (default): stage ``x[r]`` in the ``data`` window, barrier on a
  ``[P, 1]`` signal, then read block r from every rank's window, in rank
  order, and sum. Nobody writes a window after the barrier, so no second
  barrier is needed.
* ``--use-builtin``: stage, then ``pld.tensor.reduce_scatter(data, sig)``;
  rank r finds its reduced block in rows ``r * ROWS ..`` of its own ``data``
  window; read only that block afterwards. The first dimension of the
  target must divide by P. Only ``op=pld.ReduceOp.Sum`` is supported.

Pitfall (SPEC §8.3, step 14): leaving your own block out of the reduction —
a loop ``for src ...: if src != me:`` copied from the barrier. Everything
synchronises and nothing races; each rank is simply short its own
contribution. Only the golden catches it.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

ROWS = 2
COLS = 64


def build(nr: int, use_builtin: bool):
    """Return the reduce_scatter program for ``nr`` ranks, by hand or with the builtin."""
    total = nr * ROWS

    @pl.program
    class ReduceScatter:
        @pl.function(type=pl.FunctionType.InCore)
        def reduce_scatter_by_hand(self, x: pl.Tensor[[total, COLS], pl.FP32],
                                   y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                                   data: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                                   sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)

            data = pl.store(pl.load(x, [0, 0], [total, COLS]), [0, 0], data)

            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)

            # Every rank's block `me`, my own included.
            acc = pl.full([ROWS, COLS], dtype=pl.FP32, value=0.0)
            for src in pl.range(n):
                acc = pl.add(acc, pld.tile.remote_load(data, src, [me * ROWS, 0], [ROWS, COLS]))
            return pl.store(acc, [0, 0], y)

        @pl.function(type=pl.FunctionType.InCore)
        def reduce_scatter_builtin(self, x: pl.Tensor[[total, COLS], pl.FP32],
                                   y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                                   data: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                                   sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            me = pld.rank(pld.get_comm_ctx(data))
            data = pl.store(pl.load(x, [0, 0], [total, COLS]), [0, 0], data)
            data = pld.tensor.reduce_scatter(data, sig, op=pld.ReduceOp.Sum)
            return pl.store(pl.load(data, [me * ROWS, 0], [ROWS, COLS]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[total, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            if use_builtin:
                return self.reduce_scatter_builtin(x, y, data, sig)
            return self.reduce_scatter_by_hand(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def reduce_scatter(self, x: pl.Tensor[[nr, total, COLS], pl.FP32],
                           y: pl.Out[pl.Tensor[[nr, ROWS, COLS], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([total, COLS], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                data = pld.window(data_buf, [total, COLS], dtype=pl.FP32)
                sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
                self.per_rank(x[r], y[r], data, sig, device=r)
            return y

    return ReduceScatter


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--use-builtin", action="store_true",
                    help="use pld.tensor.reduce_scatter instead of the hand-rolled version")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, nr * ROWS, COLS)
    y = torch.zeros(nr, ROWS, COLS)
    compiled = ir.compile(build(nr, args.use_builtin), platform=args.platform,
                          distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    # expected[r] = sum over ranks k of block r of x[k]
    expected = x.sum(dim=0).reshape(nr, ROWS, COLS)
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5), \
        f"P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
