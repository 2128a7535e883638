"""Step 04 — a barrier by hand: notify every peer, wait for every peer, then read a peer's window.

A barrier is built from the two signal primitives:

* ``pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)`` adds
  1 to cell ``[me, 0]`` of rank ``peer``'s copy of the INT32 signal window;
* ``pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)`` blocks until this
  rank's own cell ``[src, 0]`` is at least 1, i.e. until rank ``src`` arrived.

Each rank notifies every other rank, then waits for every other rank. Every
rank owns one row of each peer's signal window, and it never notifies
itself, so afterwards rank r's signal window holds 1 in every row but its
own: the kernel copies those cells into ``arrivals[r]`` and the golden checks
``arrivals == 1 - I``.

What a barrier is for: ordering. Each rank first stages ``x[r]`` in its data
window; only after the barrier does it ``remote_load`` the next rank's window,
so ``y[r] = x[(r + 1) % P]`` holds on every run. Loading before the barrier
would race the peer's store (sometimes the peer's slice, sometimes zeros).

Signal counters are monotonic: nothing resets them, so this signal window
serves one rendezvous. A second barrier on the same cells would see the old
1s and pass at once; use fresh cells (or wait for 2).

Pitfall (SPEC §8.3, step 04): the shared-cell variant, where every rank bumps
one counter cell on each peer and waits for ``P - 1``. With ``NotifyOp.Set``
each arrival overwrites the earlier ones, so the count never reaches
``P - 1`` (and ``Eq`` can miss a value that went past): every rank hangs.
Use ``AtomicAdd`` with ``Ge``. ptodist reports such a hang within about a
second, with each rank's blocked cell, its value and the expected one, and
names ``Set`` on a multi-writer cell as a cause.
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
def barrier_then_load(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                      arrivals: pl.Out[pl.Tensor[[NR], pl.INT32]],
                      data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                      sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me = pld.rank(ctx)
    n = pld.nranks(ctx)

    # 1. Stage this rank's slice where peers can read it.
    data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)

    # 2. The barrier: arrive at every peer, then wait until every peer has arrived here.
    for peer in pl.range(n):
        if peer != me:
            pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for src in pl.range(n):
        if src != me:
            pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)

    # Every peer has notified exactly once and will not again: the row is final.
    for src in pl.range(n):
        pl.write(arrivals, [src], pl.read(sig, [src, 0]))

    # 3. Ordered by the barrier: the next rank's slice is in its window by now.
    nxt = (me + 1) % n
    got = pld.tile.remote_load(data, nxt, [0, 0], [1, SIZE])
    return pl.store(got, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
             arrivals: pl.Out[pl.Tensor[[NR], pl.INT32]],
             data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
             sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return barrier_then_load(x, y, arrivals, data, sig)


@pl.jit.host
def barrier_shift(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
                  arrivals: pl.Out[pl.Tensor[[NR, NR], pl.INT32]]):
    data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
        sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
        per_rank(x[r], y[r], arrivals[r], data, sig, device=r)
    return y, arrivals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    arrivals = torch.full((nr, nr), -1, dtype=torch.int32)
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled = barrier_shift.compile(x, y, arrivals, config=cfg)
    compiled(x, y, arrivals)

    expected_arrivals = 1 - torch.eye(nr, dtype=torch.int32)
    assert torch.equal(arrivals, expected_arrivals), \
        f"signal rows: got {arrivals.tolist()}, expected {expected_arrivals.tolist()}"
    expected = torch.roll(x, shifts=-1, dims=0)  # expected[r] = x[(r + 1) % P]
    assert torch.equal(y, expected), f"mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
