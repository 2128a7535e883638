"""Step 02 — three levels: host orchestrator → per-device orchestration → kernels.

Every distributed program has the same three layers:

* ``@pl.jit.host`` (``weighted_column_sum``) runs once, on the host. It owns
  the control plane: one loop over the ranks, one dispatch per rank with
  ``device=r``, handing each rank its slice ``x[r]``/``y[r]`` and its index.
* ``@pl.jit`` (``per_rank``) runs on one rank. It decides which kernels run
  and wires them together: here it allocates a scratch tensor and calls two
  kernels in sequence, the first writing the scratch, the second reading it.
* ``@pl.jit.incore`` (``scale_by_rank``, ``column_sum``) are the kernels: tile
  math on data they load and store. ``column_sum`` carries an accumulator tile
  through ``pl.range(..., init_values=...)``/``pl.yield_``.

Result: ``y[r] = (r + 1) * x[r].sum(rows)``.

Pitfall (SPEC §8.3, step 02): reading the rank identity anywhere but inside
the dispatch loop. A value computed once outside ``for r in ...`` is the same
for every rank; ``pld.rank``/``pld.nranks`` called in the host or in the
per-device orchestration is an error (they exist only inside a kernel). Pass
the loop variable ``r`` down as a scalar argument, after every tensor.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

ROWS = 8
COLS = 32
NR = pl.dynamic("NR")


@pl.jit.incore
def scale_by_rank(x: pl.Tensor[[ROWS, COLS], pl.FP32], scaled: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                  rank: pl.Scalar[pl.INT32]):
    """Kernel 1: ``scaled = x * (rank + 1)``."""
    tile = pl.load(x, [0, 0], [ROWS, COLS])
    factor = pl.cast(rank + 1, target_type=pl.FP32)
    return pl.store(pl.mul(tile, factor), [0, 0], scaled)


@pl.jit.incore
def column_sum(scaled: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[1, COLS], pl.FP32]]):
    """Kernel 2: add the rows of ``scaled`` one by one into a loop-carried accumulator tile."""
    zero = pl.full([1, COLS], dtype=pl.FP32, value=0.0)
    for i, (acc,) in pl.range(ROWS, init_values=(zero,)):
        row = pl.load(scaled, [i, 0], [1, COLS])
        total = pl.yield_(pl.add(acc, row))
    return pl.store(total, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[1, COLS], pl.FP32]],
             rank: pl.Scalar[pl.INT32]):
    # The intermediate lives on this rank only; the two kernel calls are two tasks,
    # ordered because the second reads what the first writes.
    scaled = pl.create_tensor([ROWS, COLS], dtype=pl.FP32)
    scaled = scale_by_rank(x, scaled, rank)
    return column_sum(scaled, y)


@pl.jit.host
def weighted_column_sum(x: pl.Tensor[[NR, ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, COLS], pl.FP32]]):
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

    x = torch.randn(nr, ROWS, COLS)
    y = torch.zeros(nr, 1, COLS)
    cfg = RunConfig(platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled = weighted_column_sum.compile(x, y, config=cfg)
    compiled(x, y)

    factor = torch.arange(1, nr + 1, dtype=torch.float32).view(nr, 1, 1)
    expected = (x * factor).sum(dim=1, keepdim=True)
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-4), \
        f"mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
