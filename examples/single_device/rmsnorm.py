"""RMSNorm of BF16 activations: ``y = x / sqrt(mean(x ** 2) + eps) * gamma``, computed in FP32.

Each block of ``TM`` rows is one tile of the full hidden size. The tile is cast to FP32, squared and
summed along the row (``pl.row_sum``), giving a ``[TM, 1]`` column of sums; ``pl.rsqrt`` of the mean
plus ``eps`` is the per-row scale, applied with ``pl.row_expand_mul`` (each row times its own
scalar). The per-column weight ``gamma`` (a ``[1, HIDDEN]`` row) is applied with
``pl.col_expand_mul``, then the result is cast back to BF16 and stored.

Run: ``python examples/single_device/rmsnorm.py``
"""

from __future__ import annotations

import torch

import ptodist.language as pl
from ptodist import RunConfig

ROWS, HIDDEN = 64, 256
TM = 16  # rows per tile
EPS = 1e-6


@pl.jit
def rms_norm(x: pl.Tensor, gamma: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        g = pl.cast(pl.load(gamma, [0, 0], [1, HIDDEN]), target_type=pl.FP32)
        for i in pl.range(0, ROWS, TM):
            t = pl.cast(pl.load(x, [i, 0], [TM, HIDDEN]), target_type=pl.FP32)
            sq_sum = pl.row_sum(pl.mul(t, t))
            rstd = pl.rsqrt(pl.add(pl.mul(sq_sum, 1.0 / HIDDEN), EPS))
            y = pl.col_expand_mul(pl.row_expand_mul(t, rstd), g)
            pl.store(pl.cast(y, target_type=pl.BF16), [i, 0], out)
    return out


def reference(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch (FP32 math, BF16 result)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()).to(torch.bfloat16)


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded input and weight (BF16) and a zeroed output."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, HIDDEN, generator=g).to(torch.bfloat16)
    gamma = (1.0 + 0.1 * torch.randn(1, HIDDEN, generator=g)).to(torch.bfloat16)
    return x, gamma, torch.zeros(ROWS, HIDDEN, dtype=torch.bfloat16)


def run(x, gamma, out, config: RunConfig | None = None) -> torch.Tensor:
    """Run the program on one device; return ``out``."""
    rms_norm(x, gamma, out, config=config or RunConfig())
    return out


def main(argv: list[str] | None = None) -> int:
    x, gamma, out = inputs()
    run(x, gamma, out)
    torch.testing.assert_close(out, reference(x, gamma))
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
