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
from conftest import source_line

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir, shared_array

REPO = Path(__file__).resolve().parents[2]
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


# ---------------------------------------------------------------------------
# Valid regions: a tail slice whose full shape runs past the tensor
# ---------------------------------------------------------------------------

@pl.jit.incore
def inc_tile(x: pl.Tensor[[16, 128], pl.FP32], y: pl.InOut[pl.Tensor[[16, 128], pl.FP32]]):
    y = pl.store(pl.add(pl.load(x, [0, 0], [16, 128]), 1.0), [0, 0], y)
    return y


@pl.jit
def tail_tiles(x: pl.Tensor[[20, 128], pl.FP32], y: pl.InOut[pl.Tensor[[24, 128], pl.FP32]],
               a: pl.Tensor[[16, 128], pl.FP32], b: pl.InOut[pl.Tensor[[16, 128], pl.FP32]]):
    for row in pl.range(0, 32, 16):  # rows 16..31 hold only 4 rows of x: a tail tile
        valid = pl.min(16, 20 - row)
        xs = pl.slice(x, [16, 128], [row, 0], valid_shape=[valid, 128])
        ys = pl.slice(y, [16, 128], [row, 0], valid_shape=[valid, 128])
        ys = inc_tile(xs, ys)
    # Past the end of a 16-row tensor with nothing valid (upstream's dynamic batch of size 16 in 16-row tiles).
    a_tail = pl.slice(a, [16, 128], [16, 0], valid_shape=[0, 128])
    b_tail = pl.slice(b, [16, 128], [16, 0], valid_shape=[0, 128])
    b_tail = inc_tile(a_tail, b_tail)
    return y


def test_a_slice_whose_valid_region_is_inside_the_tensor_runs_and_touches_only_that_region(backend):
    x = np.arange(20 * 128, dtype=np.float32).reshape(20, 128)
    y = np.full((24, 128), -7.0, np.float32)  # rows 20..23 lie outside every valid region: never written
    a = np.ones((16, 128), np.float32)
    b = np.full((16, 128), 5.0, np.float32)
    tail_tiles(x, y, a, b, config=RunConfig(backend=backend))
    expected = np.full((24, 128), -7.0, np.float32)
    expected[:20] = x + 1
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(b, np.full((16, 128), 5.0, np.float32))


@pl.jit
def clamped_tail(x: pl.Tensor[[20, 128], pl.FP32], y: pl.Out[pl.Tensor[[2, 128], pl.FP32]]):
    tail = pl.slice(x, [16, 128], [16, 0], clamp=True)  # valid rows cut to the 4 the tensor has
    y = pl.store(pl.load(tail, [3, 0], [1, 128]), [0, 0], y)
    inner = pl.slice(tail, [8, 128], [2, 0])  # a slice of the tail is valid where the tail is: rows 18, 19
    y = pl.store(pl.load(inner, [1, 0], [1, 128]), [1, 0], y)
    return y


def test_clamp_cuts_a_slice_to_the_tensor_edge_and_a_slice_of_it_keeps_that_edge(backend):
    x = np.arange(20 * 128, dtype=np.float32).reshape(20, 128)
    y = np.zeros((2, 128), np.float32)
    clamped_tail(x, y, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(y, x[[19, 19]])


@pl.jit
def tail_tile_reads(x: pl.Tensor[[20, 128], pl.FP32], y: pl.Out[pl.Tensor[[16, 128], pl.FP32]]):
    tail = pl.slice(x, [16, 128], [16, 0], valid_shape=[4, 128])
    t = pl.load(tail, [0, 0], [16, 128])  # only the valid rows hold data; the rest of the tile is zero padding
    y = pl.store(t, [0, 0], y)
    return y


def test_a_load_from_a_tail_slice_reads_only_its_valid_rows(backend):
    x = np.arange(20 * 128, dtype=np.float32).reshape(20, 128)
    y = np.full((16, 128), -1.0, np.float32)
    tail_tile_reads(x, y, config=RunConfig(backend=backend))
    expected = np.full((16, 128), -1.0, np.float32)
    expected[:4] = x[16:]  # the tile's valid part is the 4 rows: its store writes those only
    np.testing.assert_array_equal(y, expected)


@pl.jit
def valid_region_outside(x: pl.Tensor[[20, 128], pl.FP32]):
    pl.slice(x, [16, 128], [16, 0], valid_shape=[8, 128])
    return x


@pl.jit
def read_past_the_valid_region(x: pl.Tensor[[20, 128], pl.FP32]):
    tail = pl.slice(x, [16, 128], [16, 0], valid_shape=[4, 128])
    pl.read(tail, [5, 0])
    return x


def test_a_valid_region_outside_the_tensor_is_out_of_bounds():
    with pytest.raises(RankError) as info:
        valid_region_outside(np.zeros((20, 128), np.float32), config=RunConfig(backend="sim"))
    line = source_line(valid_region_outside, "pl.slice(")
    assert info.value.original.kind == "out_of_bounds"
    assert str(info.value.original) == (
        f"pl.slice at {__file__}:{line}: out of bounds on tensor 'x' [20, 128] FP32: offsets [16, 0] with "
        "valid_shape [8, 128] (of a [16, 128] view) reach [16, 24) in dimension 0, whose bounds are [0, 20). Only "
        "the valid region is read, but all of it must lie inside the tensor. Shrink valid_shape to what is left "
        "of the tensor at these offsets ([4, 128]), or pass clamp=True to narrow it to the edge.")


def test_an_element_outside_the_valid_region_is_no_memory_to_read():
    with pytest.raises(RankError) as info:
        read_past_the_valid_region(np.zeros((20, 128), np.float32), config=RunConfig(backend="sim"))
    line = source_line(read_past_the_valid_region, "pl.read(")
    assert str(info.value.original) == (
        f"pl.read at {__file__}:{line}: index [5, 0] is outside the valid region [4, 128] of tensor 'x[slice]' "
        "[16, 128] FP32 (valid [4, 128]): only the valid region is memory, nothing is there to read or write. "
        "Keep the index inside the valid region, or slice with a larger valid_shape.")


def test_a_tile_slice_takes_its_valid_shape():
    from ptodist.language.memory_ops import slice as pl_slice
    from ptodist.language.tile_ops import Tile

    tile = Tile(np.arange(32, dtype=np.float32).reshape(4, 8))
    part = pl_slice(tile, [2, 8], [2, 0], valid_shape=[1, 8])
    assert part.valid_shape == (1, 8)
    np.testing.assert_array_equal(part.data, tile.data[2:4])


# ---------------------------------------------------------------------------
# The audit: every check cites its rule
# ---------------------------------------------------------------------------

def _check_functions() -> list[str]:
    """The check functions of compiler/checks.py: every public top-level function named ``check_*`` / ``lint_*``,
    or that raises, or that judges a value (``scalar_argument``, ``dispatch_result``)."""
    tree = ast.parse((REPO / "src" / "ptodist" / "compiler" / "checks.py").read_text())
    names = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        raises = any(isinstance(n, ast.Raise) for n in ast.walk(node))
        if raises or node.name.startswith(("check_", "lint_")) or node.name in ("scalar_argument", "dispatch_result"):
            names.append(node.name)
    return names


def _audit_table() -> str:
    text = (REPO / "docs" / "errors.md").read_text()
    start = text.index("## Checks before a run and the rule each enforces")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_every_check_in_compiler_checks_cites_its_rule_in_the_audit_table():
    table = _audit_table()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([A-Za-z_.]+)`[^\n]*$", table, re.M)}
    names = _check_functions()
    assert {"check_task_args_order", "check_arg", "check_coverage", "check_rank_slices", "lint_transfers",
            "bind_shape", "finish_bindings"} <= set(names)
    missing = [n for n in names if n not in rows]
    assert not missing, f"checks with no row in docs/errors.md's audit table: {missing}"
    for name in names:
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        assert len(cells) == 5 and all(cells), f"{name}: every column of its row is filled in: {cells}"
        rule = cells[3]
        assert rule.startswith(("upstream", "no upstream rule", "ptodist cannot run", "(")), (
            f"{name}: the rule column names an upstream rule or says why ptodist refuses without one: {rule}")


@pl.jit.incore
def tail_views(x: pl.Tensor[[20, 128], pl.FP32], y: pl.InOut[pl.Tensor[[20, 128], pl.FP32]],
               win: pl.InOut[pld.DistributedTensor[[16, 128], pl.FP32]], z: pl.Out[pl.Tensor[[16, 128], pl.FP32]]):
    tail = pl.slice(y, [16, 128], [16, 0], valid_shape=[4, 128])
    tail[0:8, :] = pl.full([8, 128], dtype=pl.FP32, value=3.0)  # rows 16..19 of y: the valid ones
    part = tail[2:8, 0:64]  # valid where tail is: rows 18, 19
    pl.write(part, [1, 1], 9.0)  # y[19, 1]
    x_tail = pl.slice(x, [16, 128], [16, 0], valid_shape=[4, 128])
    pld.tensor.put(win, 0, x_tail)  # moves the 4 valid rows into the window's rows 0..3
    z = pl.store(pl.load(win, [0, 0], [16, 128]), [0, 0], z)
    return z


@pl.jit
def per_rank_tail_views(x: pl.Tensor[[20, 128], pl.FP32], y: pl.InOut[pl.Tensor[[20, 128], pl.FP32]],
                        win: pl.InOut[pld.DistributedTensor[[16, 128], pl.FP32]],
                        z: pl.Out[pl.Tensor[[16, 128], pl.FP32]]):
    return tail_views(x, y, win, z)


@pl.jit.host
def host_tail_views(x: pl.Tensor[[20, 128], pl.FP32], y: pl.InOut[pl.Tensor[[20, 128], pl.FP32]],
                    z: pl.Out[pl.Tensor[[16, 128], pl.FP32]]):
    buf = pld.alloc_window_buffer([16, 128], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        per_rank_tail_views(x, y, pld.window(buf, [16, 128], dtype=pl.FP32), z, device=r)


def test_subscripts_writes_and_puts_through_a_tail_view_touch_only_its_valid_rows(backend):
    x = np.arange(20 * 128, dtype=np.float32).reshape(20, 128)
    y = np.zeros((20, 128), np.float32)
    z = np.full((16, 128), -1.0, np.float32)
    host_tail_views(x, y, z, config=cfg(backend, 1))
    expected_y = np.zeros((20, 128), np.float32)
    expected_y[16:] = 3.0
    expected_y[19, 1] = 9.0
    np.testing.assert_array_equal(y, expected_y)
    expected_z = np.zeros((16, 128), np.float32)  # the window is zeroed; the put filled its rows 0..3
    expected_z[:4] = x[16:]
    np.testing.assert_array_equal(z, expected_z)
