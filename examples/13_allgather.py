"""Step 13 — allgather: every rank ends with all ranks' blocks, by hand or with ``pld.tensor.allgather``.

Each rank contributes a ``[ROWS, COLS]`` block ``x[r]``; afterwards every
rank's ``[P * ROWS, COLS]`` gather window holds block ``src`` in rows
``src * ROWS .. (src + 1) * ROWS``: ``y[r] == concat(x[0], ..., x[P-1])``.

* By hand (default), the push form: rank r writes its block with
  ``remote_store`` into slot r of **every** rank's gather window (its own
  included), then a barrier on a ``[P, 1]`` signal. A rank notifies only
  after all its pushes, so once it has seen every peer's notify every slot
  of its own window is filled, and it may read it. Each slot has exactly one
  writer, so nothing overlaps.
* ``--use-builtin``: ``pld.tensor.allgather(x, gathered, sig)``. Inside a
  kernel the local data may be a plain tensor (here the input itself); the
  target is a window, either ``[P * ROWS, COLS]`` as here or
  ``[P, ROWS, COLS]`` (one leading slot index). The local data and the
  target must not be the same window buffer (the builtin rejects it): a
  push could overwrite local data its owner has not sent yet.

Pitfall (SPEC §8.3, step 13): gathering into the wrong slot — say offsets
``[me, 0]`` instead of ``[me * ROWS, 0]``. Slots then overlap (two ranks
write the same rows) and the tail of the window is never written; the
output looks plausible and is wrong; the golden check catches it.
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
    """Return the allgather program for ``nr`` ranks, by hand or with the builtin."""
    total = nr * ROWS

    @pl.program
    class Allgather:
        @pl.function(type=pl.FunctionType.InCore)
        def allgather_by_hand(self, x: pl.Tensor[[ROWS, COLS], pl.FP32],
                              y: pl.Out[pl.Tensor[[total, COLS], pl.FP32]],
                              gathered: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(gathered)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)

            # 1. Push my block into slot `me` of every rank's gather window.
            block = pl.load(x, [0, 0], [ROWS, COLS])
            for dst in pl.range(n):
                pld.tile.remote_store(block, gathered, dst, [me * ROWS, 0])

            # 2. Barrier: notify after my pushes; once every peer has notified, my window is full.
            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)

            # 3. Stage out.
            return pl.store(pl.load(gathered, [0, 0], [total, COLS]), [0, 0], y)

        @pl.function(type=pl.FunctionType.InCore)
        def allgather_builtin(self, x: pl.Tensor[[ROWS, COLS], pl.FP32],
                              y: pl.Out[pl.Tensor[[total, COLS], pl.FP32]],
                              gathered: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            gathered = pld.tensor.allgather(x, gathered, sig)
            return pl.store(pl.load(gathered, [0, 0], [total, COLS]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[total, COLS], pl.FP32]],
                     gathered: pl.InOut[pld.DistributedTensor[[total, COLS], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            if use_builtin:
                return self.allgather_builtin(x, y, gathered, sig)
            return self.allgather_by_hand(x, y, gathered, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def allgather(self, x: pl.Tensor[[nr, ROWS, COLS], pl.FP32],
                      y: pl.Out[pl.Tensor[[nr, total, COLS], pl.FP32]]):
            gather_buf = pld.alloc_window_buffer([total, COLS], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                gathered = pld.window(gather_buf, [total, COLS], dtype=pl.FP32)
                sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
                self.per_rank(x[r], y[r], gathered, sig, device=r)
            return y

    return Allgather


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--use-builtin", action="store_true",
                    help="use pld.tensor.allgather instead of the hand-rolled version")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, ROWS, COLS)
    y = torch.zeros(nr, nr * ROWS, COLS)
    compiled = ir.compile(build(nr, args.use_builtin), platform=args.platform,
                          distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    expected = x.reshape(1, nr * ROWS, COLS).expand_as(y)  # concat(x[0], ..., x[P-1]) on every rank
    assert torch.equal(y, expected), f"P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
