"""A task graph stated by hand: four ``pl.at`` regions in a ``pl.manual_scope()``, ordered by ``deps=``.

Every ``with pl.at(level=pl.Level.CORE_GROUP) as tid:`` region is one task; ``as tid`` names it, and
``deps=[tid, ...]`` makes a later region wait for it. In an ordinary (auto) scope the runtime would
also infer the edges from the tensors each region reads and writes; inside ``pl.manual_scope()`` it
infers nothing, so the ``deps=`` lists are the whole graph, a diamond:

    scale ──> shift ──┐
      └────> square ──┴──> combine

``shift`` and ``square`` both read what ``scale`` wrote and do not depend on each other; ``combine``
waits for both. Drop a ``deps=`` entry and nothing orders that pair any more: a race.

Run: ``python examples/single_device/task_graph.py``
"""

from __future__ import annotations

import torch

import ptodist.language as pl
from ptodist import RunConfig

ROWS, COLS = 64, 128


@pl.jit
def diamond(x: pl.Tensor, scaled: pl.Out[pl.Tensor], out: pl.Out[pl.Tensor]):
    shifted = pl.create_tensor([ROWS, COLS], dtype=pl.FP32)
    squared = pl.create_tensor([ROWS, COLS], dtype=pl.FP32)
    with pl.manual_scope():
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale") as scale:
            scaled[:] = pl.mul(x, 2.0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="shift", deps=[scale]) as shift:
            shifted[:] = pl.add(scaled, 1.0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="square", deps=[scale]) as square:
            squared[:] = pl.mul(scaled, scaled)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="combine", deps=[shift, square]):
            out[:] = pl.sub(squared, shifted)
    return scaled, out


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same computation in plain torch: ``(2x, (2x)^2 - (2x + 1))``."""
    s = x * 2.0
    return s, s * s - (s + 1.0)


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A seeded input and two zeroed outputs."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(ROWS, COLS, generator=g), torch.zeros(ROWS, COLS), torch.zeros(ROWS, COLS)


def run(x, scaled, out, config: RunConfig | None = None) -> torch.Tensor:
    """Run the program on one device; return ``out``."""
    diamond(x, scaled, out, config=config or RunConfig())
    return out


def main(argv: list[str] | None = None) -> int:
    x, scaled, out = inputs()
    run(x, scaled, out)
    want_scaled, want_out = reference(x)
    torch.testing.assert_close(scaled, want_scaled)
    torch.testing.assert_close(out, want_out)
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
