"""Step 05 — tile-level RMA: a one-step ring shift with remote_load (pull) or remote_store (push).

* ``pld.tile.remote_load(win, peer, offsets, shape)`` reads a region of rank
  ``peer``'s copy of window ``win`` into a local tile (the reader initiates);
* ``pld.tile.remote_store(tile, win, peer, offsets)`` writes a local tile into
  rank ``peer``'s copy (the writer initiates).

Only ``pld.DistributedTensor`` (window) memory is reachable from other ranks.
Both modes move every slice one step around the ring, from opposite sides:

* ``--mode load``: stage ``x[r]`` in your own window, barrier, then pull the
  next rank's window: ``y[r] = x[(r + 1) % P]``;
* ``--mode store``: push ``x[r]`` into the next rank's window, barrier, then
  read your own window, which the previous rank filled:
  ``y[r] = x[(r - 1 + P) % P]``.

The barrier is step 04's (every rank notifies every peer, then waits for
every peer); here it only orders the RMA, so its tally is not output.

Pitfall (SPEC §8.3, step 05): RMA before the ordering barrier. In load mode
the pull must come after the peer's store, in store mode the local read after
the peer's push; without the barrier between them they race and the result
depends on timing (the golden may catch it on one run and miss it on the
next). It is a data race (SPEC §8.1): the read and the unordered write, on
two ranks.
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
def shift_by_load(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                  data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me = pld.rank(ctx)
    n = pld.nranks(ctx)

    data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)  # stage locally

    for peer in pl.range(n):
        if peer != me:
            pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for src in pl.range(n):
        if src != me:
            pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)

    got = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, SIZE])  # pull from the next rank
    return pl.store(got, [0, 0], y)


@pl.jit.incore
def shift_by_store(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                   data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                   sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me = pld.rank(ctx)
    n = pld.nranks(ctx)

    tile = pl.load(x, [0, 0], [1, SIZE])
    pld.tile.remote_store(tile, data, (me + 1) % n, [0, 0])  # push into the next rank

    for peer in pl.range(n):
        if peer != me:
            pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for src in pl.range(n):
        if src != me:
            pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)

    got = pl.load(data, [0, 0], [1, SIZE])  # what the previous rank pushed here
    return pl.store(got, [0, 0], y)


@pl.jit
def per_rank_load(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                  data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return shift_by_load(x, y, data, sig)


@pl.jit
def per_rank_store(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                   data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                   sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return shift_by_store(x, y, data, sig)


@pl.jit.host
def ring_shift_load(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
        sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
        per_rank_load(x[r], y[r], data, sig, device=r)
    return y


@pl.jit.host
def ring_shift_store(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
        sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
        per_rank_store(x[r], y[r], data, sig, device=r)
    return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--mode", default="load", choices=["load", "store"],
                    help="pull with remote_load (y[r] = x[r+1]) or push with remote_store (y[r] = x[r-1])")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    host = ring_shift_load if args.mode == "load" else ring_shift_store
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled = host.compile(x, y, config=cfg)
    compiled(x, y)

    # torch.roll(x, s, 0)[r] = x[(r - s) % P]: load pulls from r + 1, store receives from r - 1.
    expected = torch.roll(x, shifts=-1 if args.mode == "load" else 1, dims=0)
    assert torch.equal(y, expected), f"{args.mode} mode mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
