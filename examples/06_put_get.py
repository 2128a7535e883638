"""Step 06 — tensor-level point to point: put (push) and get (pull), each paired with notify/wait.

* ``pld.tensor.put(dst, peer, src)`` writes local ``src`` into rank ``peer``'s
  copy of window ``dst``. The destination must be a window; the source may be
  any local tensor (here the input slice itself).
* ``pld.tensor.get(dst, peer, src)`` reads rank ``peer``'s copy of window
  ``src`` into local ``dst``. The source must be a window; the destination may
  be any local tensor (here the output slice itself).

With no offsets/shape the whole slice moves. Neither call signals anything,
so each is paired with one notify/wait on a one-cell INT32 signal window,
between exactly the two ranks the transfer connects:

* ``--mode put``: put ``x[r]`` into the next rank's inbox, *then* notify it;
  wait for your own cell (the previous rank's put has landed), then read your
  inbox: ``y[r] = x[(r - 1 + P) % P]``.
* ``--mode get``: stage ``x[r]`` in your outbox, *then* notify the previous
  rank (the one that reads from you); wait for your own cell (the next rank
  has staged), then get its outbox: ``y[r] = x[(r + 1) % P]``.

Each cell has exactly one writer, so ``AtomicAdd``/``Ge 1`` is unambiguous.
The left neighbour is ``(r - 1 + n) % n``: integer ``%`` truncates toward
zero, so ``(r - 1) % n`` is -1 for rank 0.

Pitfall (SPEC §8.3, step 06): a put (or get) without the notify/wait. The
receiver's read is then unordered with the sender's write — a data race
that may pass on one run and fail on the next. It is the same race as in
step 05 (SPEC §8.1).
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
def put_to_next(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                inbox: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(inbox)
    me = pld.rank(ctx)
    n = pld.nranks(ctx)
    nxt = (me + 1) % n

    pld.tensor.put(inbox, nxt, x)                                        # 1. data to the next rank
    pld.system.notify(sig, nxt, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)   # 2. then tell it so
    pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)                 # 3. the previous rank's data is here
    return pl.store(pl.load(inbox, [0, 0], [1, SIZE]), [0, 0], y)


@pl.jit.incore
def get_from_next(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                  outbox: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(outbox)
    me = pld.rank(ctx)
    n = pld.nranks(ctx)
    prev = (me - 1 + n) % n
    nxt = (me + 1) % n

    outbox = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], outbox)    # 1. stage for my reader
    pld.system.notify(sig, prev, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # 2. tell my reader (r - 1)
    pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)                 # 3. the next rank has staged
    pld.tensor.get(y, nxt, outbox)                                       # 4. pull its outbox into y
    return y


@pl.jit
def per_rank_put(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 inbox: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    return put_to_next(x, y, inbox, sig)


@pl.jit
def per_rank_get(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 outbox: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    return get_from_next(x, y, outbox, sig)


@pl.jit.host
def ring_put(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    inbox_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([1, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        inbox = pld.window(inbox_buf, [1, SIZE], dtype=pl.FP32)
        sig = pld.window(sig_buf, [1, 1], dtype=pl.INT32)
        per_rank_put(x[r], y[r], inbox, sig, device=r)
    return y


@pl.jit.host
def ring_get(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    outbox_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([1, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        outbox = pld.window(outbox_buf, [1, SIZE], dtype=pl.FP32)
        sig = pld.window(sig_buf, [1, 1], dtype=pl.INT32)
        per_rank_get(x[r], y[r], outbox, sig, device=r)
    return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--mode", default="put", choices=["put", "get"],
                    help="push with put (y[r] = x[r-1]) or pull with get (y[r] = x[r+1])")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    host = ring_put if args.mode == "put" else ring_get
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled = host.compile(x, y, config=cfg)
    compiled(x, y)

    # torch.roll(x, s, 0)[r] = x[(r - s) % P]: put receives from r - 1, get pulls from r + 1.
    expected = torch.roll(x, shifts=1 if args.mode == "put" else -1, dims=0)
    assert torch.equal(y, expected), f"{args.mode} mode mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
