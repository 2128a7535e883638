"""The runtime surface upstream programs call: workers running inline chip regions, pypto.runtime's names."""

from __future__ import annotations

import numpy as np
import pytest

import ptodist.language as pl
from ptodist import DistributedConfig, RunConfig, ir, shared_array

M = 16


@pl.program
class TwoChipRegions:
    """Chip 0 computes a + b, chip 1 a - b: each chip task is an inline `with pl.at(level=CHIP)` block."""

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host_orch(self, a: pl.Tensor[[M, M], pl.FP32], b: pl.Tensor[[M, M], pl.FP32],
                  sum_buf: pl.Out[pl.Tensor[[M, M], pl.FP32]], sub_buf: pl.Out[pl.Tensor[[M, M], pl.FP32]]):
        with pl.at(level=pl.Level.CHIP, role=pl.Role.Orchestrator):
            with pl.at(level=pl.Level.CORE_GROUP):
                out_sum = pl.assemble(sum_buf, pl.add(a, b), [0, 0])
        with pl.at(level=pl.Level.CHIP, role=pl.Role.Orchestrator):
            with pl.at(level=pl.Level.CORE_GROUP):
                pl.assemble(sub_buf, pl.sub(a, b), [0, 0])
        return out_sum


def test_a_worker_runs_chip_tasks_outlined_from_inline_regions(backend):
    """The outlined blocks are made after the worker's ranks started: they travel to the ranks by value."""
    compiled = ir.compile(TwoChipRegions, platform="a2a3sim",
                          config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=backend))
    rng = np.random.default_rng(3)
    a, b, s, d = (shared_array((M, M)) for _ in range(4))
    a[...] = rng.standard_normal((M, M))
    b[...] = rng.standard_normal((M, M))
    with compiled.prepare() as rt:
        handle = rt.register(compiled)
        for _ in range(2):  # the second call reuses the plan the ranks received
            s[...] = 0
            d[...] = 0
            handle(a, b, s, d)
            np.testing.assert_array_equal(s, a + b)
            np.testing.assert_array_equal(d, a - b)
        rt.run(compiled, b, a, s, d)
        np.testing.assert_array_equal(d, b - a)
    # a one-shot call keeps its ranks for the next call too
    compiled(a, b, s, d)
    compiled(b, a, s, d)
    np.testing.assert_array_equal(d, b - a)


if __name__ == "__main__":
    pytest.main([__file__, "-v"])
