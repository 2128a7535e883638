"""Programs upstream PyPTO accepts run here, and every check made before a run cites the rule it enforces.

* Argument order: only a function the host orchestrator dispatches (its "child") must take its tensors before its
  scalars (PyPTO's distributed hello-rank page); a kernel, an L2 program's orchestration and an outlined chip
  region take their parameters in any order, as upstream's examples do.
* Valid regions: a ``pl.slice`` whose valid region lies inside the tensor is legal even where its full shape runs
  past the end (upstream's tail tiles); nothing outside the valid region is read or written.
* The audit: every check function in ``compiler/checks.py`` is listed, with its rule, in docs/errors.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir, shared_array

REPO = Path(__file__).resolve().parent.parent
NR = pl.dynamic("NR")


def cfg(backend: str, world: int = 2) -> RunConfig:
    return RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=list(range(world))))


# ---------------------------------------------------------------------------
# Argument order: a scalar before a tensor in a kernel
# ---------------------------------------------------------------------------

@pl.jit.incore
def add_scalar_first(s: pl.Scalar[pl.FP32], x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
    y = pl.store(pl.add(pl.load(x, [0, 0], [1, 8]), s), [0, 0], y)
    return y


@pl.jit.incore
def scale_scalar_between(x: pl.Tensor[[1, 8], pl.FP32], k: pl.Scalar[pl.INT32],
                         y: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
    t = pl.mul(pl.load(x, [0, 0], [1, 8]), pl.cast(k, target_type=pl.FP32))
    y = pl.store(pl.add(t, pl.load(y, [0, 0], [1, 8])), [0, 0], y)
    return y


@pl.jit
def per_rank_kernel_scalars_first(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                                  r: pl.Scalar[pl.INT32]):
    y = add_scalar_first(1.5, x, y)
    y = scale_scalar_between(x, r, y)
    return y


@pl.jit.host
def host_kernel_scalars_first(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        per_rank_kernel_scalars_first(x[r], y[r], r, device=r)


def test_a_kernel_taking_a_scalar_before_its_tensors_runs(backend):
    x = np.arange(16, dtype=np.float32).reshape(2, 1, 8)
    y = np.zeros_like(x)
    host_kernel_scalars_first(x, y, config=cfg(backend))
    expected = (x + 1.5) + x * np.arange(2, dtype=np.float32).reshape(2, 1, 1)
    np.testing.assert_array_equal(y, expected)


def test_a_kernel_taking_a_scalar_before_its_tensors_runs_in_a_kept_worker(backend):
    x = np.arange(16, dtype=np.float32).reshape(2, 1, 8)
    compiled = host_kernel_scalars_first.compile(x, np.zeros_like(x), config=cfg(backend))
    with compiled.prepare() as rt:
        for step in range(2):
            x = (np.arange(16, dtype=np.float32) + step).reshape(2, 1, 8)
            xs, ys = shared_array(x.shape, np.float32), shared_array(x.shape, np.float32)
            xs[...] = x
            rt(xs, ys)
            np.testing.assert_array_equal(ys, (x + 1.5) + x * np.arange(2, dtype=np.float32).reshape(2, 1, 1))


@pl.program
class VectorDagScalarBetween:
    """Upstream's examples/models/02_vector_dag.py shape: an InCore kernel ``(a, scalar, output)``."""

    @pl.function(type=pl.FunctionType.InCore)
    def kernel_add(self, a: pl.Tensor[[16, 16], pl.FP32], b: pl.Tensor[[16, 16], pl.FP32],
                   output: pl.Out[pl.Tensor[[16, 16], pl.FP32]]) -> pl.Tensor[[16, 16], pl.FP32]:
        return pl.store(pl.add(pl.load(a, [0, 0], [16, 16]), pl.load(b, [0, 0], [16, 16])), [0, 0], output)

    @pl.function(type=pl.FunctionType.InCore)
    def kernel_add_scalar(self, a: pl.Tensor[[16, 16], pl.FP32], scalar: pl.Scalar[pl.FP32],
                          output: pl.Out[pl.Tensor[[16, 16], pl.FP32]]) -> pl.Tensor[[16, 16], pl.FP32]:
        return pl.store(pl.add(pl.load(a, [0, 0], [16, 16]), scalar), [0, 0], output)

    @pl.function(type=pl.FunctionType.InCore)
    def kernel_mul(self, a: pl.Tensor[[16, 16], pl.FP32], b: pl.Tensor[[16, 16], pl.FP32],
                   output: pl.Out[pl.Tensor[[16, 16], pl.FP32]]) -> pl.Tensor[[16, 16], pl.FP32]:
        return pl.store(pl.mul(pl.load(a, [0, 0], [16, 16]), pl.load(b, [0, 0], [16, 16])), [0, 0], output)

    @pl.function(type=pl.FunctionType.Orchestration)
    def orch(self, a: pl.Tensor[[16, 16], pl.FP32], b: pl.Tensor[[16, 16], pl.FP32],
             f: pl.Out[pl.Tensor[[16, 16], pl.FP32]]) -> pl.Tensor[[16, 16], pl.FP32]:
        c = pl.create_tensor([16, 16], dtype=pl.FP32)
        c = self.kernel_add(a, b, c)
        d = pl.create_tensor([16, 16], dtype=pl.FP32)
        d = self.kernel_add_scalar(c, 1.0, d)
        e = pl.create_tensor([16, 16], dtype=pl.FP32)
        e = self.kernel_add_scalar(c, 2.0, e)
        g = pl.create_tensor([16, 16], dtype=pl.FP32)
        g = self.kernel_mul(d, e, g)
        f = self.kernel_add(g, c, f)
        return f


def test_the_upstream_vector_dag_with_a_scalar_between_tensors_runs(backend):
    compiled = ir.compile(VectorDagScalarBetween, platform="a2a3sim", config=RunConfig(backend=backend))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 16), dtype=np.float32), rng.standard_normal((16, 16), dtype=np.float32)
    f = np.zeros((16, 16), np.float32)
    compiled(a, b, f)
    c = a + b
    np.testing.assert_allclose(f, (c + 1) * (c + 2) + c, rtol=1e-6)


@pl.jit
def l2_scalar_first(s: pl.Scalar[pl.FP32], x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
    y = add_scalar_first(s, x, y)
    return y


def test_an_l2_orchestration_taking_a_scalar_first_runs(backend):
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    y = np.zeros_like(x)
    l2_scalar_first(3.0, x, y, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(y, x + 3.0)


def test_a_kernel_called_directly_with_a_scalar_first_runs(backend):
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    y = np.zeros_like(x)
    add_scalar_first(-2.0, x, y, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(y, x - 2.0)


@pl.jit.host
def host_region_scalar_first(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
    s = 0.5
    with pl.at(level=pl.Level.CHIP):
        add_scalar_first(s, x, y)


def test_a_chip_region_reading_a_scalar_before_a_tensor_runs(backend):
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    y = np.zeros_like(x)
    host_region_scalar_first(x, y, config=cfg(backend, 1))
    np.testing.assert_array_equal(y, x + 0.5)
