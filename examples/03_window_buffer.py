"""Step 03 — window buffer: every rank stages its own slice in a window and reads it back.

A window buffer is *symmetric* memory: ``pld.alloc_window_buffer`` (host only)
reserves the same number of bytes at the same offset on every rank, zero
filled, and ``pld.window(buf, shape, dtype=...)`` gives a typed view of it, a
``pld.DistributedTensor``. Later steps let peers reach into it (signals,
remote_load/store, put/get); here nothing is shared yet: ``pl.store``/``pl.load``
on a window touch the local rank's copy only, so each rank writes ``x[r]`` into
its window, loads it back and stores it to ``y[r]``. Golden: ``y == x``.

The buffer below is sized in **bytes** (``ROWS * COLS * FP32.get_byte()``);
``pld.alloc_window_buffer([ROWS, COLS], dtype=pl.FP32)`` is the equivalent
shape form.

Pitfall (SPEC §8.3, step 03): mixing up the two tensor types. A window passed
to a ``pl.Tensor`` parameter, or a plain tensor passed to a
``pld.DistributedTensor`` parameter, is a type error naming the parameter and
both types: only window memory can take part in RMA, signals and collectives.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

ROWS = 4
COLS = 64
NR = pl.dynamic("NR")


@pl.jit.incore
def stage_and_read_back(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                        staged: pl.InOut[pld.DistributedTensor[[ROWS, COLS], pl.FP32]]):
    tile = pl.load(x, [0, 0], [ROWS, COLS])
    staged = pl.store(tile, [0, 0], staged)       # into this rank's window
    back = pl.load(staged, [0, 0], [ROWS, COLS])  # out of this rank's window
    return pl.store(back, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
             staged: pl.InOut[pld.DistributedTensor[[ROWS, COLS], pl.FP32]]):
    return stage_and_read_back(x, y, staged)


@pl.jit.host
def window_roundtrip(x: pl.Tensor[[NR, ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[NR, ROWS, COLS], pl.FP32]]):
    staging_buf = pld.alloc_window_buffer(ROWS * COLS * pl.FP32.get_byte())
    for r in pl.range(pld.world_size()):
        staged = pld.window(staging_buf, [ROWS, COLS], dtype=pl.FP32)
        per_rank(x[r], y[r], staged, device=r)
    return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    x = torch.randn(nr, ROWS, COLS)
    y = torch.zeros(nr, ROWS, COLS)
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled = window_roundtrip.compile(x, y, config=cfg)
    compiled(x, y)

    assert torch.equal(y, x), f"mismatch: max error {(y - x).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
