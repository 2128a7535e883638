"""A complete allreduce (the README's tour program): every rank ends with the sum of all ranks' vectors.

Each rank stages its vector in a symmetric window, arrives at a barrier built
from AtomicAdd notifies, then reads every peer's window with remote_load and
sums.  Runs at any rank count: ``python examples/allreduce.py -d 0,1,2,3``.
"""

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

N = 256
NR = pl.dynamic("NR")


@pl.jit.incore
def allreduce_kernel(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    data = pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)       # stage my vector
    for peer in pl.range(n):                                         # arrive: notify everyone first,
        pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for peer in pl.range(n):                                         # then wait for everyone
        pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
    acc = pl.full([1, N], dtype=pl.FP32, value=0.0)
    for peer in pl.range(n):                                         # read every window, mine included
        acc = pl.add(acc, pld.tile.remote_load(data, peer, [0, 0], [1, N]))
    return pl.store(acc, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
             data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
             sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return allreduce_kernel(x, y, data, sig)


@pl.jit.host
def allreduce(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        data = pld.window(data_buf, [1, N], dtype=pl.FP32)
        sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
        per_rank(x[r], y[r], data, sig, device=r)
    return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]

    x = torch.randn(len(ids), 1, N)
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    y = allreduce(x, config=cfg)                    # compile + run; the output is created and returned
    assert torch.allclose(y, x.sum(dim=0, keepdim=True).expand_as(y), rtol=1e-5, atol=1e-5)
    print(f"OK: allreduce over {len(ids)} ranks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
