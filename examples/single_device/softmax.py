"""Row softmax over rows longer than a tile, with a ragged last tile.

Each row has ``COLS = 200`` elements; a tile holds ``TN = 64`` columns, so every row takes four tiles
and the last one has only 8 valid columns. The ragged tile is loaded with ``valid_shapes=[TM, vlen]``
(only its valid part is read from the tensor) and, where a reduction reads it, padded with the
smallest value, ``-inf`` (``pl.fillpad(tile, pad_value=pl.PadValue.min)``), so that the padding
neither wins the row maximum nor adds to the row sum (``exp(-inf - m)`` is 0).

Two passes per block of ``TM`` rows, as an online softmax does it:

1. walk the row's tiles keeping a running maximum ``m`` and a running sum ``s`` of ``exp(x - m)``,
   rescaling ``s`` whenever ``m`` grows (the carried values of ``pl.range(..., init_values=...)``);
2. walk them again writing ``exp(x - m) / s``; a tile with a ragged tail stores only its valid part.

Run: ``python examples/single_device/softmax.py``
"""

from __future__ import annotations

import math

import torch

import ptodist.language as pl
from ptodist import RunConfig

ROWS, COLS = 64, 200
TM, TN = 16, 64  # one tile: COLS is not a multiple of TN


@pl.jit
def ragged_softmax(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        for i in pl.range(0, ROWS, TM):
            m0 = pl.full([TM, 1], dtype=pl.FP32, value=-math.inf)
            s0 = pl.full([TM, 1], dtype=pl.FP32, value=0.0)
            for j, (m, s) in pl.range(0, COLS, TN, init_values=(m0, s0)):
                vlen = pl.min(TN, COLS - j)
                t = pl.load(x, [i, j], [TM, TN], valid_shapes=[TM, vlen])
                t = pl.fillpad(t, pad_value=pl.PadValue.min)
                m_new = pl.maximum(m, pl.row_max(t))
                rescaled = pl.mul(s, pl.exp(pl.sub(m, m_new)))
                s_new = pl.add(rescaled, pl.row_sum(pl.row_expand_expdif(t, m_new)))
                m, s = pl.yield_(m_new, s_new)
            for j in pl.range(0, COLS, TN):
                vlen = pl.min(TN, COLS - j)
                t = pl.load(x, [i, j], [TM, TN], valid_shapes=[TM, vlen])
                y = pl.row_expand_div(pl.row_expand_expdif(t, m), s)
                pl.store(y, [i, j], out)  # the valid [TM, vlen] part only
    return out


def reference(x: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch."""
    return torch.softmax(x, dim=-1)


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded input and a zeroed output."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(ROWS, COLS, generator=g) * 4.0, torch.zeros(ROWS, COLS)


def run(x, out, config: RunConfig | None = None) -> torch.Tensor:
    """Run the program on one device; return ``out``."""
    ragged_softmax(x, out, config=config or RunConfig())
    return out


def main(argv: list[str] | None = None) -> int:
    x, out = inputs()
    run(x, out)
    torch.testing.assert_close(out, reference(x))
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
