"""Split-K matrix product: ``c = a @ b`` with K = 512 taken in four chunks of 128.

The first chunk starts the accumulator with ``pl.matmul``; every later chunk adds its partial product
into it with ``pl.matmul_acc`` (the accumulator is a carried value of ``pl.range(...,
init_values=...)``). Operands take the cube's path: loaded into ``Mat`` (L1), moved into ``Left``
and ``Right``; the FP32 accumulator is stored straight to the output.

Run: ``python examples/single_device/splitk_matmul.py``
"""

from __future__ import annotations

import torch

import ptodist.language as pl
from ptodist import RunConfig

M, K, N = 64, 512, 128
TK = 128  # K per chunk


@pl.jit
def splitk_matmul(a: pl.Tensor, b: pl.Tensor, c: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        a0 = pl.load(a, [0, 0], [M, TK], target_memory=pl.MemorySpace.Mat)
        b0 = pl.load(b, [0, 0], [TK, N], target_memory=pl.MemorySpace.Mat)
        a0 = pl.move(a0, target_memory=pl.MemorySpace.Left)
        b0 = pl.move(b0, target_memory=pl.MemorySpace.Right)
        first = pl.matmul(a0, b0)  # [M, N] FP32 in Acc
        for k, (acc,) in pl.range(TK, K, TK, init_values=(first,)):
            ak = pl.load(a, [0, k], [M, TK], target_memory=pl.MemorySpace.Mat)
            bk = pl.load(b, [k, 0], [TK, N], target_memory=pl.MemorySpace.Mat)
            ak = pl.move(ak, target_memory=pl.MemorySpace.Left)
            bk = pl.move(bk, target_memory=pl.MemorySpace.Right)
            acc = pl.yield_(pl.matmul_acc(acc, ak, bk))
        pl.store(acc, [0, 0], c)
    return c


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch (FP32 product of the FP16 operands)."""
    return a.float() @ b.float()


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded FP16 operands and a zeroed FP32 output."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).half()
    b = torch.randn(K, N, generator=g).half()
    return a, b, torch.zeros(M, N)


def run(a, b, c, config: RunConfig | None = None) -> torch.Tensor:
    """Run the program on one device; return ``c``."""
    splitk_matmul(a, b, c, config=config or RunConfig())
    return c


def main(argv: list[str] | None = None) -> int:
    a, b, c = inputs()
    run(a, b, c)
    # Summation order differs (chunks of 128 vs one pass), hence a tolerance above FP32's default.
    torch.testing.assert_close(c, reference(a, b), rtol=1e-4, atol=1e-3)
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
