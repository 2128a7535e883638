"""Step 01 — hello rank: every rank adds its own index to its slice, y[r] = x[r] + r.

The rank index reaches the kernel as a scalar parameter, and scalars come
after every tensor parameter (the runtime packs tensors first).
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
from ptodist import DistributedConfig, RunConfig

SIZE = 64
NR = pl.dynamic("NR")


@pl.jit.incore
def add_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
             rank: pl.Scalar[pl.INT32]):
    tile = pl.load(x, [0, 0], [1, SIZE])
    tile = pl.add(tile, pl.cast(rank, target_type=pl.FP32))
    return pl.store(tile, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
             rank: pl.Scalar[pl.INT32]):
    return add_rank(x, y, rank)


@pl.jit.host
def hello(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    import ptodist.language.distributed as pld

    for r in pl.range(pld.world_size()):
        per_rank(x[r], y[r], r, device=r)
    return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled = hello.compile(x, y, config=cfg)
    compiled(x, y)

    expected = x + torch.arange(nr, dtype=torch.float32).view(nr, 1, 1)
    assert torch.allclose(y, expected), f"mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
