"""Step 10 — ring allreduce by hand: 2(P-1) rounds, each rank talking only to its two neighbours.

The same two phases as step 09 (reduce-scatter, then allgather), scheduled
around a ring. The vector is cut into P chunks; in every round each rank
reads **one** chunk from its left neighbour ``(r - 1 + P) % P``:

* reduce-scatter, rounds ``k = 0 .. P-2``: rank r reads chunk
  ``(r - k - 1) % P`` from the left and adds it into its own copy of that
  chunk. Each partial sum travels one hop per round; after P-1 rounds rank r
  holds the complete sum of chunk ``(r + 1) % P``;
* allgather, rounds ``k = 0 .. P-2``: rank r copies chunk ``(r - k) % P`` (a
  complete sum) from the left over its own copy.

Per round a rank moves ``SIZE / P`` elements whatever P is: the ring is the
schedule that scales to many ranks (the same total bytes as step 09).

Synchronisation is a neighbour handshake, not a barrier. The signal is
``[2(P-1), P]`` INT32, **one row per round**: when rank r has finished
writing the chunk its right neighbour reads in round g, it bumps cell
``[g, r]`` on the right neighbour; before reading in round g, rank r waits
for cell ``[g, left]`` of its own copy. Every cell is written once, so
``AtomicAdd``/``Ge 1`` never sees a stale count.

No acknowledgement is needed before a chunk is overwritten in the allgather
phase: rank r starting round g proves (through the chain of waits around the
ring, P-1 hops) that its right neighbour finished round ``g - (P - 1)``,
which is the round in which it read the old value of that chunk.

Pitfall (SPEC §8.3, step 10): the left neighbour written ``(r - 1) % P``.
Integer ``%`` truncates toward zero on the device, so rank 0 gets -1: its
first ``wait`` names cell ``[0, -1]`` and its ``remote_load`` peer -1.
ptodist stops rank 0 at the first of them with an error naming the index
and the window (for a negative peer it also suggests ``(r - 1 + n) % n``).
The chunk indices have the same trap, which is why each adds ``n`` before
``%``.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

SIZE = 256


def build(nr: int):
    """Return the ring-allreduce program for ``nr >= 2`` ranks (``SIZE`` must divide by ``nr``)."""
    if nr < 2 or SIZE % nr:
        raise ValueError(f"the ring needs at least 2 ranks and SIZE={SIZE} must divide by their count, got {nr}")
    chunk = SIZE // nr
    rounds = 2 * (nr - 1)

    @pl.program
    class RingAllreduce:
        @pl.function(type=pl.FunctionType.InCore)
        def ring_step(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                      data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                      sig: pl.InOut[pld.DistributedTensor[[rounds, nr], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            left = (me - 1 + n) % n  # not (me - 1) % n: that is -1 for rank 0
            right = (me + 1) % n

            # Stage all chunks; round 0's chunk is ready for the right neighbour.
            data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)
            pld.system.notify(sig, right, [0, me], 1, op=pld.NotifyOp.AtomicAdd)

            # Reduce-scatter: rounds 0 .. n-2 (signal rows 0 .. n-2).
            for k in pl.range(n - 1):
                c = (me - k - 1 + n) % n
                pld.system.wait(sig, [k, left], 1, cmp=pld.WaitCmp.Ge)
                partial = pld.tile.remote_load(data, left, [0, c * chunk], [1, chunk])
                mine = pl.load(data, [0, c * chunk], [1, chunk])
                data = pl.store(pl.add(mine, partial), [0, c * chunk], data)
                # Chunk c is what the right neighbour reads next round.
                pld.system.notify(sig, right, [k + 1, me], 1, op=pld.NotifyOp.AtomicAdd)

            # Allgather: rounds n-1 .. 2n-3 (signal rows n-1 .. 2n-3); I now own chunk (me + 1) % n.
            for k in pl.range(n - 1):
                row = n - 1 + k
                c = (me - k + n) % n
                pld.system.wait(sig, [row, left], 1, cmp=pld.WaitCmp.Ge)
                done = pld.tile.remote_load(data, left, [0, c * chunk], [1, chunk])
                data = pl.store(done, [0, c * chunk], data)
                if row + 1 < rounds:  # the last round has no successor row
                    pld.system.notify(sig, right, [row + 1, me], 1, op=pld.NotifyOp.AtomicAdd)

            return pl.store(pl.load(data, [0, 0], [1, SIZE]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[rounds, nr], pl.INT32]]):
            return self.ring_step(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def allreduce(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([rounds, nr], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
                sig = pld.window(sig_buf, [rounds, nr], dtype=pl.INT32)
                self.per_rank(x[r], y[r], data, sig, device=r)
            return y

    return RingAllreduce


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3",
                    help=f"comma-separated device ids, one rank each (at least 2; the count must divide {SIZE})")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)
    if nr < 2 or SIZE % nr:
        ap.error(f"the ring needs at least 2 ranks whose count divides SIZE={SIZE}, got {nr}")

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    compiled = ir.compile(build(nr), platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    expected = x.sum(dim=0, keepdim=True).expand_as(y)
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5), \
        f"P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    # Each chunk is summed once, by its owner, then copied: the ranks agree bit for bit.
    assert all(torch.equal(y[r], y[0]) for r in range(nr)), "the ranks' results differ"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
