"""A feed-forward block: ``out = silu(x @ w1) @ w2`` on FP16 operands, FP32 accumulation.

Each block of ``TM`` tokens is one program step: ``pl.matmul`` of the ``[TM, D]`` activation tile with
the whole ``[D, H]`` up-projection gives an FP32 ``[TM, H]`` accumulator; SiLU
(``h / (1 + exp(-h))``) runs on it as vector ops; the activation is cast to FP16 (the operand type
of the second product) and multiplied by the ``[H, D]`` down-projection. The FP32 result is stored.

Run: ``python examples/single_device/ffn.py``
"""

from __future__ import annotations

import torch

import ptodist.language as pl
from ptodist import RunConfig

TOKENS, D, H = 64, 128, 256
TM = 32  # tokens per step


@pl.jit
def ffn(x: pl.Tensor, w1: pl.Tensor, w2: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        up = pl.load(w1, [0, 0], [D, H])
        down = pl.load(w2, [0, 0], [H, D])
        for i in pl.range(0, TOKENS, TM):
            xt = pl.load(x, [i, 0], [TM, D])
            h = pl.matmul(xt, up)  # [TM, H] FP32
            act = pl.div(h, pl.add(pl.exp(pl.neg(h)), 1.0))
            y = pl.matmul(pl.cast(act, target_type=pl.FP16), down)
            pl.store(y, [i, 0], out)
    return out


def reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch (FP32 products of FP16 operands, FP16 activation)."""
    h = x.float() @ w1.float()
    return torch.nn.functional.silu(h).half().float() @ w2.float()


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded FP16 activations and weights, and a zeroed FP32 output."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, D, generator=g).half()
    w1 = (torch.randn(D, H, generator=g) / D ** 0.5).half()
    w2 = (torch.randn(H, D, generator=g) / H ** 0.5).half()
    return x, w1, w2, torch.zeros(TOKENS, D)


def run(x, w1, w2, out, config: RunConfig | None = None) -> torch.Tensor:
    """Run the program on one device; return ``out``."""
    ffn(x, w1, w2, out, config=config or RunConfig())
    return out


def main(argv: list[str] | None = None) -> int:
    x, w1, w2, out = inputs()
    run(x, w1, w2, out)
    # The activation is rounded to FP16 on both sides; where the two SiLUs differ in the last FP32 bit
    # the rounding can differ by one FP16 ulp, hence more than FP32's default tolerance.
    torch.testing.assert_close(out, reference(x, w1, w2), rtol=1e-3, atol=1e-3)
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
