"""Step 15 — all_to_all: every rank sends a different block to every rank, by hand or with the builtin.

Each rank holds P blocks of ``[ROWS, COLS]`` stacked as ``[P * ROWS, COLS]``;
block p is addressed to rank p. Afterwards rank r holds, in block ``src``,
what rank ``src`` addressed to it:
``y[r][src * ROWS:(src + 1) * ROWS] == x[src][r * ROWS:(r + 1) * ROWS]`` —
a transpose of the (sender, receiver) block matrix, the exchange behind
expert-parallel MoE dispatch and combine.

* By hand (default), the pull form: stage ``x[r]`` in the ``send`` window,
  barrier on a ``[P, 1]`` signal, then read block r from every rank's
  ``send`` window into block ``src`` of the output. Nothing writes ``send``
  after the barrier, and what is received goes elsewhere.
* ``--use-builtin``: stage ``x[r]`` in ``send``, then
  ``pld.tensor.all_to_all(send, recv, sig)`` fills the ``recv`` window; the
  two windows have the same shape, with a first dimension that divides by P.
  (``pld.tensor.all_to_all_v`` is the variable-size form: only the first
  ``send_counts[p]`` rows of block p travel.)

Pitfall (SPEC §8.3, step 15): one window as both source and result. Received
blocks then land on blocks that other ranks are still reading: in the form
above, rank r would overwrite its block p with rank p's data while rank p may
not yet have read the block addressed to it. The builtin rejects it at the
call, before any data moves ("input and target are the same window
buffer"); by hand it is a data race, which ptodist's checker is specified
to report.
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
    """Return the all_to_all program for ``nr`` ranks, by hand or with the builtin."""
    total = nr * ROWS

    @pl.program
    class AllToAll:
        @pl.function(type=pl.FunctionType.InCore)
        def all_to_all_by_hand(self, x: pl.Tensor[[total, COLS], pl.FP32],
                               y: pl.Out[pl.Tensor[[total, COLS], pl.FP32]],
                               send: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                               sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(send)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)

            send = pl.store(pl.load(x, [0, 0], [total, COLS]), [0, 0], send)

            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)

            # Block `me` of rank src's send window is addressed to me; it goes to block src.
            for src in pl.range(n):
                block = pld.tile.remote_load(send, src, [me * ROWS, 0], [ROWS, COLS])
                y = pl.store(block, [src * ROWS, 0], y)
            return y

        @pl.function(type=pl.FunctionType.InCore)
        def all_to_all_builtin(self, x: pl.Tensor[[total, COLS], pl.FP32],
                               y: pl.Out[pl.Tensor[[total, COLS], pl.FP32]],
                               send: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                               recv: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                               sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            send = pl.store(pl.load(x, [0, 0], [total, COLS]), [0, 0], send)
            recv = pld.tensor.all_to_all(send, recv, sig)
            return pl.store(pl.load(recv, [0, 0], [total, COLS]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[total, COLS], pl.FP32], y: pl.Out[pl.Tensor[[total, COLS], pl.FP32]],
                     send: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                     recv: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            if use_builtin:
                return self.all_to_all_builtin(x, y, send, recv, sig)
            return self.all_to_all_by_hand(x, y, send, sig)  # receives straight into y: no recv window

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def all_to_all(self, x: pl.Tensor[[nr, total, COLS], pl.FP32],
                       y: pl.Out[pl.Tensor[[nr, total, COLS], pl.FP32]]):
            send_buf = pld.alloc_window_buffer([total, COLS], dtype=pl.FP32)
            recv_buf = pld.alloc_window_buffer([total, COLS], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                send = pld.window(send_buf, [total, COLS], dtype=pl.FP32)
                recv = pld.window(recv_buf, [total, COLS], dtype=pl.FP32)
                sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
                self.per_rank(x[r], y[r], send, recv, sig, device=r)
            return y

    return AllToAll


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--use-builtin", action="store_true",
                    help="use pld.tensor.all_to_all instead of the hand-rolled version")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, nr * ROWS, COLS)
    y = torch.zeros(nr, nr * ROWS, COLS)
    compiled = ir.compile(build(nr, args.use_builtin), platform=args.platform,
                          distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    # View as [sender, receiver-block, ROWS, COLS]; the result swaps the first two axes.
    expected = x.reshape(nr, nr, ROWS, COLS).transpose(0, 1).reshape(nr, nr * ROWS, COLS)
    assert torch.equal(y, expected), f"P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
