"""Step 09 — two-phase allreduce by hand: reduce-scatter, then allgather, one signal row per phase.

Every efficient allreduce has this shape. The vector is cut into P chunks of
``SIZE / P`` elements, and rank r *owns* chunk r:

1. stage: every rank stores ``x[r]`` in its ``data`` window;
2. barrier A (signal row 0): all inputs are staged;
3. reduce-scatter: rank r reads chunk r from every window (rank order) and
   sums them, then writes the sum over chunk r of its **own** window. That
   in-place write is safe: in this phase chunk r of any window is read by
   rank r alone, and every other rank reads chunks that rank r never writes;
4. barrier B (signal row 1): every owner has written its reduced chunk;
5. allgather: rank r reads chunk c from rank c's window, for every c, into
   its output.

Each rank moves ``2 * (P - 1) / P * SIZE`` elements instead of mesh's
``(P - 1) * SIZE`` (step 08); at P = 2 the two schedules move the same amount.

The signal is ``[2, P]`` INT32: row = phase, column = the rank that arrived.
Rank r bumps cell ``[phase, r]`` on every peer and waits on cells
``[phase, src]`` of its own copy.

Pitfall (SPEC §8.3, step 09): reusing one signal row for both barriers.
Counters are monotonic: after barrier A every cell of row 0 already holds 1,
so barrier B's ``wait(..., 1, Ge)`` on row 0 passes at once — before the
peers have written their reduced chunks — and the allgather reads stale
input data. Give each barrier its own row (as here), or wait for 2 the
second time. ptodist reports a wait that is satisfied only by notifies older
than the previous wait on that cell as a "stale signal".
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

SIZE = 256
PHASE_RS, PHASE_AG = 0, 1  # signal rows: one per barrier


def build(nr: int):
    """Return the two-phase allreduce program for ``nr`` ranks (``SIZE`` must divide by ``nr``)."""
    if SIZE % nr:
        raise ValueError(f"SIZE={SIZE} must divide by the rank count, got {nr}")
    chunk = SIZE // nr

    @pl.program
    class TwoPhaseAllreduce:
        @pl.function(type=pl.FunctionType.InCore)
        def two_phase_step(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                           data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                           sig: pl.InOut[pld.DistributedTensor[[2, nr], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            mine = me * chunk  # offset of the chunk this rank owns

            # 1. Stage.
            data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)

            # 2. Barrier A on row PHASE_RS: every input is staged.
            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(sig, peer, [PHASE_RS, me], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(sig, [PHASE_RS, src], 1, cmp=pld.WaitCmp.Ge)

            # 3. Reduce-scatter: sum my chunk over all ranks, in rank order; keep it in my window.
            acc = pl.full([1, chunk], dtype=pl.FP32, value=0.0)
            for src in pl.range(n):
                acc = pl.add(acc, pld.tile.remote_load(data, src, [0, mine], [1, chunk]))
            data = pl.store(acc, [0, mine], data)

            # 4. Barrier B on its own row PHASE_AG: every reduced chunk is in place.
            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(sig, peer, [PHASE_AG, me], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(sig, [PHASE_AG, src], 1, cmp=pld.WaitCmp.Ge)

            # 5. Allgather: chunk c comes from its owner, rank c.
            for c in pl.range(n):
                y = pl.store(pld.tile.remote_load(data, c, [0, c * chunk], [1, chunk]), [0, c * chunk], y)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[2, nr], pl.INT32]]):
            return self.two_phase_step(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def allreduce(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([2, nr], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
                sig = pld.window(sig_buf, [2, nr], dtype=pl.INT32)
                self.per_rank(x[r], y[r], data, sig, device=r)
            return y

    return TwoPhaseAllreduce


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3",
                    help=f"comma-separated device ids, one rank each (the count must divide {SIZE})")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)
    if SIZE % nr:
        ap.error(f"the rank count must divide SIZE={SIZE}, got {nr} ranks")

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    compiled = ir.compile(build(nr), platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    expected = x.sum(dim=0, keepdim=True).expand_as(y)
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5), \
        f"P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
