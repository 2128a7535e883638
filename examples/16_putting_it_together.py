"""Step 16 — putting it together: broadcast, allreduce and allgather composed in one kernel.

A miniature of how a model uses collectives, in one kernel per rank:

1. **broadcast** the weights: every rank starts with its own copy ``w[r]``,
   but only the root's (rank 0) is current; ``pld.tensor.broadcast`` makes
   it everyone's;
2. **local compute**: ``h = x[r] * w`` (the weights now agree everywhere);
3. **allgather** every rank's ``h``: ``gathered[r] == stack_k(x[k] * w)``;
4. **allreduce** ``h``: ``total[r] == sum_k x[k] * w`` (``--mode`` mesh or
   ring).

Each collective returns the rebound window, and each is synchronous across
ranks, so the next one may start right away: no extra barrier between them.
The allgather only reads the local ``h_win`` (it pushes), and the allreduce
that then overwrites ``h_win`` in place reads the peers' copies only after
its own opening barrier.

Signal windows. Collective signals are self-clearing: a finished collective
leaves every cell at zero, so one ``[P, 1]`` window ``sig`` serves both the
broadcast and the allgather (they share the mesh layout). The allreduce has
its own window ``ar_sig``, shaped for ``--mode``: ``[P, 1]`` for mesh,
``[2(P-1), P]`` for ring (with mesh it could share ``sig``; keeping it apart
makes the mode a one-word change).

Pitfall (SPEC §8.3, step 16): one signal window serving two layouts — say
``sig`` for the mesh broadcast and then for a ring allreduce. The layouts
count in different cells, so a window may serve one layout only; ptodist
rejects the call that brings the second layout, naming both call sites and
both layouts. One window per layout.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

COLS = 64
ROOT = 0


def build(nr: int, mode: str):
    """Return the composed program for ``nr`` ranks; the allreduce runs in ``mode`` ("mesh" or "ring")."""
    ar_sig_shape = [2 * (nr - 1), nr] if mode == "ring" else [nr, 1]

    @pl.program
    class PuttingItTogether:
        @pl.function(type=pl.FunctionType.InCore)
        def layer(self, x: pl.Tensor[[1, COLS], pl.FP32], w: pl.Tensor[[1, COLS], pl.FP32],
                  total: pl.Out[pl.Tensor[[1, COLS], pl.FP32]],
                  gathered: pl.Out[pl.Tensor[[nr, COLS], pl.FP32]],
                  w_win: pl.InOut[pld.DistributedTensor[[1, COLS], pl.FP32]],
                  h_win: pl.InOut[pld.DistributedTensor[[1, COLS], pl.FP32]],
                  g_win: pl.InOut[pld.DistributedTensor[[nr, COLS], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                  ar_sig: pl.InOut[pld.DistributedTensor[ar_sig_shape, pl.INT32]]):
            me = pld.rank(pld.get_comm_ctx(w_win))

            # 1. Broadcast the root's weights (mesh layout, signal `sig`).
            if me == ROOT:
                w_win = pl.store(pl.load(w, [0, 0], [1, COLS]), [0, 0], w_win)
            w_win = pld.tensor.broadcast(w_win, sig, root=ROOT)
            weights = pl.load(w_win, [0, 0], [1, COLS])

            # 2. Local compute.
            h = pl.mul(pl.load(x, [0, 0], [1, COLS]), weights)
            h_win = pl.store(h, [0, 0], h_win)

            # 3. Allgather h into g_win (mesh layout again: the self-cleared `sig` is reused).
            g_win = pld.tensor.allgather(h_win, g_win, sig)
            gathered = pl.store(pl.load(g_win, [0, 0], [nr, COLS]), [0, 0], gathered)

            # 4. Allreduce h in place (its own signal window, shaped for the mode).
            h_win = pld.tensor.allreduce(h_win, ar_sig, op=pld.ReduceOp.Sum, mode=mode)
            total = pl.store(pl.load(h_win, [0, 0], [1, COLS]), [0, 0], total)
            return total, gathered

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[1, COLS], pl.FP32], w: pl.Tensor[[1, COLS], pl.FP32],
                     total: pl.Out[pl.Tensor[[1, COLS], pl.FP32]],
                     gathered: pl.Out[pl.Tensor[[nr, COLS], pl.FP32]],
                     w_win: pl.InOut[pld.DistributedTensor[[1, COLS], pl.FP32]],
                     h_win: pl.InOut[pld.DistributedTensor[[1, COLS], pl.FP32]],
                     g_win: pl.InOut[pld.DistributedTensor[[nr, COLS], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                     ar_sig: pl.InOut[pld.DistributedTensor[ar_sig_shape, pl.INT32]]):
            return self.layer(x, w, total, gathered, w_win, h_win, g_win, sig, ar_sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1, COLS], pl.FP32], w: pl.Tensor[[nr, 1, COLS], pl.FP32],
                 total: pl.Out[pl.Tensor[[nr, 1, COLS], pl.FP32]],
                 gathered: pl.Out[pl.Tensor[[nr, nr, COLS], pl.FP32]]):
            w_buf = pld.alloc_window_buffer([1, COLS], dtype=pl.FP32)
            h_buf = pld.alloc_window_buffer([1, COLS], dtype=pl.FP32)
            g_buf = pld.alloc_window_buffer([nr, COLS], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            ar_sig_buf = pld.alloc_window_buffer(ar_sig_shape, dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                w_win = pld.window(w_buf, [1, COLS], dtype=pl.FP32)
                h_win = pld.window(h_buf, [1, COLS], dtype=pl.FP32)
                g_win = pld.window(g_buf, [nr, COLS], dtype=pl.FP32)
                sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
                ar_sig = pld.window(ar_sig_buf, ar_sig_shape, dtype=pl.INT32)
                self.per_rank(x[r], w[r], total[r], gathered[r], w_win, h_win, g_win, sig, ar_sig, device=r)
            return total, gathered

    return PuttingItTogether


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3",
                    help=f"comma-separated device ids, one rank each (ring: at least 2, dividing {COLS})")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--mode", default="ring", choices=["mesh", "ring"], help="the allreduce's schedule")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)
    if args.mode == "ring" and (nr < 2 or COLS % nr):
        ap.error(f"ring mode needs at least 2 ranks whose count divides COLS={COLS}, got {nr}")

    x = torch.randn(nr, 1, COLS)
    w = torch.randn(nr, 1, COLS)  # every rank's own copy; only the root's is current
    total = torch.zeros(nr, 1, COLS)
    gathered = torch.zeros(nr, nr, COLS)
    compiled = ir.compile(build(nr, args.mode), platform=args.platform,
                          distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, w, total, gathered)

    h = x * w[ROOT]  # [nr, 1, COLS]: each rank's h, computed with the root's weights
    expected_gathered = h.reshape(1, nr, COLS).expand_as(gathered)
    assert torch.equal(gathered, expected_gathered), \
        f"allgather P={nr}: max error {(gathered - expected_gathered).abs().max().item()}"
    expected_total = h.sum(dim=0, keepdim=True).expand_as(total)
    assert torch.allclose(total, expected_total, rtol=1e-5, atol=1e-5), \
        f"allreduce ({args.mode}) P={nr}: max error {(total - expected_total).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
