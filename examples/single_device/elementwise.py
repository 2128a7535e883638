"""Elementwise: ``out = relu(a * b + c) * 0.5`` over a 128x256 FP32 tensor, one 32x64 tile at a time.

The ``@pl.jit`` function is the control plane; its ``pl.at(level=pl.Level.CORE_GROUP)`` block is the
device work. Inside it, two ``pl.range`` loops walk the tensors tile by tile: each step loads three
tiles, combines them with tile ops (``pl.mul``, ``pl.add``, ``pl.relu``, a scalar ``pl.mul``) and
stores the result at the same offsets.

Run: ``python examples/single_device/elementwise.py``
"""

from __future__ import annotations

import torch

import ptodist.language as pl
from ptodist import RunConfig

ROWS, COLS = 128, 256
TM, TN = 32, 64  # one tile


@pl.jit
def fused_elementwise(a: pl.Tensor, b: pl.Tensor, c: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        for i in pl.range(0, ROWS, TM):
            for j in pl.range(0, COLS, TN):
                ta = pl.load(a, [i, j], [TM, TN])
                tb = pl.load(b, [i, j], [TM, TN])
                tc = pl.load(c, [i, j], [TM, TN])
                y = pl.relu(pl.add(pl.mul(ta, tb), tc))
                pl.store(pl.mul(y, 0.5), [i, j], out)
    return out


def reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch."""
    return torch.relu(a * b + c) * 0.5


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded inputs and a zeroed output."""
    g = torch.Generator().manual_seed(seed)
    a, b, c = (torch.randn(ROWS, COLS, generator=g) for _ in range(3))
    return a, b, c, torch.zeros(ROWS, COLS)


def run(a, b, c, out, config: RunConfig | None = None) -> torch.Tensor:
    """Run the program on one device; return ``out``."""
    fused_elementwise(a, b, c, out, config=config or RunConfig())
    return out


def main(argv: list[str] | None = None) -> int:
    a, b, c, out = inputs()
    run(a, b, c, out)
    torch.testing.assert_close(out, reference(a, b, c))
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
