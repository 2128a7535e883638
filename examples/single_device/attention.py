"""Flash attention: ``softmax(q @ k.T * scale) @ v`` one KV block at a time, with an online softmax.

The ``[SQ, D]`` query tile stays on chip; the keys and values stream through in blocks of ``BK``
rows. For each block the scores ``s = q @ k_blk.T * scale`` update three carried values of
``pl.range(..., init_values=...)``: the running row maximum ``m``, the running softmax denominator
``den`` and the unnormalised output ``o``. When the maximum grows, the old ``den`` and ``o`` are
rescaled by ``exp(m_old - m_new)`` (``pl.row_expand_mul``), so after the last block ``o / den`` is the
exact softmax-weighted sum.

The sequence has ``SK = 200`` keys: the last block holds only 8. Its key and value tiles are loaded
with ``valid_shapes=[vlen, D]``; the scores' invalid columns are padded with ``-inf``
(``pl.fillpad(s, pad_value=pl.PadValue.min)``), so they weigh ``exp(-inf) = 0``, and the value
tile's padding rows are zeros.

Run: ``python examples/single_device/attention.py``
"""

from __future__ import annotations

import math

import torch

import ptodist.language as pl
from ptodist import RunConfig

SQ, SK, D = 64, 200, 64
BK = 64  # keys per block: SK is not a multiple of BK
SCALE = 1.0 / math.sqrt(D)


@pl.jit
def flash_attention(q: pl.Tensor, k: pl.Tensor, v: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        qt = pl.load(q, [0, 0], [SQ, D])
        m0 = pl.full([SQ, 1], dtype=pl.FP32, value=-math.inf)
        den0 = pl.full([SQ, 1], dtype=pl.FP32, value=0.0)
        o0 = pl.full([SQ, D], dtype=pl.FP32, value=0.0)
        for j, (m, den, o) in pl.range(0, SK, BK, init_values=(m0, den0, o0)):
            vlen = pl.min(BK, SK - j)
            kt = pl.load(k, [j, 0], [BK, D], valid_shapes=[vlen, D])
            vt = pl.load(v, [j, 0], [BK, D], valid_shapes=[vlen, D])
            s = pl.mul(pl.matmul(qt, pl.transpose(kt, 0, 1)), SCALE)  # [SQ, BK] FP32, valid [SQ, vlen]
            s = pl.fillpad(s, pad_value=pl.PadValue.min)
            m_new = pl.maximum(m, pl.row_max(s))
            p = pl.row_expand_expdif(s, m_new)
            alpha = pl.exp(pl.sub(m, m_new))
            den_new = pl.add(pl.mul(den, alpha), pl.row_sum(p))
            pv = pl.matmul(pl.cast(p, target_type=pl.FP16), vt)
            o_new = pl.add(pl.row_expand_mul(o, alpha), pv)
            m, den, o = pl.yield_(m_new, den_new, o_new)
        pl.store(pl.row_expand_div(o, den), [0, 0], out)
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch (FP32 math on the FP16 inputs)."""
    return torch.softmax(q.float() @ k.float().T * SCALE, dim=-1) @ v.float()


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded FP16 query, keys and values, and a zeroed FP32 output."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, D, generator=g).half() for n in (SQ, SK, SK))
    return q, k, v, torch.zeros(SQ, D)


def run(q, k, v, out, config: RunConfig | None = None) -> torch.Tensor:
    """Run the program on one device; return ``out``."""
    flash_attention(q, k, v, out, config=config or RunConfig())
    return out


def main(argv: list[str] | None = None) -> int:
    q, k, v, out = inputs()
    run(q, k, v, out)
    # The probabilities enter the second product as FP16 (as on the cube), the reference keeps FP32.
    torch.testing.assert_close(out, reference(q, k, v), rtol=2e-3, atol=2e-3)
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
