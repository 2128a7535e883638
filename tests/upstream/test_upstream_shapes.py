"""Shapes as upstream PyPTO accepts them: valid_shape on loads, size-1 rank changes, lower-rank stores.

Every program is a complete distributed run on both local backends (the ``backend`` fixture: shm and sim),
checked against numpy; the errors are checked word for word.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.errors import KernelIndexError, KernelValueError, ShapeError

SIZE = 8
NR = pl.dynamic("NR")
HERE = __file__


def line_of(fn, marker: str) -> int:
    """The line of ``fn``'s source that holds ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def run(prog, nr: int, backend: str, *args):
    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend)
    return ir.compile(prog, config=config)(*args)


def barrier(sig, me, n):
    for p in pl.range(n):
        pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for p in pl.range(n):
        pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)


# -- 1. valid_shape: the tile keeps its shape, only the valid part is read, checked and stored ----------------

def padded_ring_program(body):
    """Each rank: x [1, 1], y [8, 1] (the whole tile), z [8, 1] (only the valid part), window [1, 1]."""

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[[1, 1], pl.FP32], y: pl.Out[pl.Tensor[[8, 1], pl.FP32]],
              z: pl.Out[pl.Tensor[[8, 1], pl.FP32]], win: pl.InOut[pld.DistributedTensor[[1, 1], pl.FP32]],
              sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(win)
            body(x, y, z, win, sig, pld.rank(ctx), pld.nranks(ctx))
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, 1], pl.FP32], y: pl.Out[pl.Tensor[[8, 1], pl.FP32]],
                 z: pl.Out[pl.Tensor[[8, 1], pl.FP32]], win: pl.InOut[pld.DistributedTensor[[1, 1], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            return self.k(x, y, z, win, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[NR, 1, 1], pl.FP32], y: pl.Out[pl.Tensor[[NR, 8, 1], pl.FP32]],
                 z: pl.Out[pl.Tensor[[NR, 8, 1], pl.FP32]]):
            n = pld.world_size()
            wbuf = pld.alloc_window_buffer([1, 1], dtype=pl.FP32)
            sbuf = pld.alloc_window_buffer([n, 1], dtype=pl.INT32)
            for r in pl.range(n):
                self.chip(x[r], y[r], z[r], pld.window(wbuf, [1, 1], dtype=pl.FP32),
                          pld.window(sbuf, [n, 1], dtype=pl.INT32), device=r)
            return y

    return Prog


def ring_body(x, y, z, win, sig, me, n):
    t = pl.load(x, [0, 0], [8, 1], valid_shape=[1, 1])  # an [8, 1] tile over a [1, 1] tensor
    pl.store(t, [0, 0], win)  # writes the valid [1, 1] part only: it fits the [1, 1] window
    barrier(sig, me, n)
    got = pld.tile.remote_load(win, (me + 1) % n, [0, 0], [8, 1], valid_shape=[1, 1])
    pl.store(pl.mul(pl.fillpad(got, pl.PadValue.zero), 2.0), [0, 0], y)  # fillpad: all valid, the zeros show
    pl.store(pl.mul(got, 2.0), [4, 0], y)  # tile math keeps the valid region: one element written
    pl.store(got, [3, 0], z)  # only the valid element is written; [3, 0] + [8, 1] would not fit


@pytest.mark.parametrize("nr", [2, 4])
def test_valid_shape_reads_only_the_valid_part_and_pads_with_zeros(backend, nr):
    x = (np.arange(nr, dtype=np.float32) + 1.5).reshape(nr, 1, 1)
    y = np.full((nr, 8, 1), 7.0, np.float32)
    z = np.full((nr, 8, 1), -1.0, np.float32)
    run(padded_ring_program(ring_body), nr, backend, x, y, z)
    for r in range(nr):
        want_y = np.zeros((8, 1), np.float32)
        want_y[0, 0] = want_y[4, 0] = 2 * x[(r + 1) % nr, 0, 0]
        np.testing.assert_array_equal(y[r], want_y)
        want_z = np.full((8, 1), -1.0, np.float32)
        want_z[3, 0] = x[(r + 1) % nr, 0, 0]
        np.testing.assert_array_equal(z[r], want_z)


def test_load_tile_keeps_its_shape_and_remembers_the_valid_part(backend, capfd):
    def body(x, y, z, win, sig, me, n):
        t = pl.load(x, [0, 0], [8, 1], valid_shape=[1, 1])
        print(f"TILE {int(me)} {t.shape} {list(t.valid_shape)} {t.data[:, 0].tolist()}", flush=True)

    x = np.full((2, 1, 1), 5.0, np.float32)
    run(padded_ring_program(body), 2, backend, x, np.zeros((2, 8, 1), np.float32), np.zeros((2, 8, 1), np.float32))
    out = capfd.readouterr().out
    for r in range(2):
        assert f"TILE {r} [8, 1] [1, 1] [5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]" in out, out


def test_clamp_narrows_the_valid_part_to_the_tensor_edge(backend):
    def body(x, y, z, win, sig, me, n):
        pl.store(pl.load(x, [0, 0], [8, 1], clamp=True), [2, 0], z)  # valid part [1, 1]: z[2, 0] only

    x = np.array([[[3.0]], [[4.0]]], np.float32)
    z = np.zeros((2, 8, 1), np.float32)
    run(padded_ring_program(body), 2, backend, x, np.zeros((2, 8, 1), np.float32), z)
    for r in range(2):
        np.testing.assert_array_equal(z[r, :, 0], [0, 0, x[r, 0, 0], 0, 0, 0, 0, 0])


def ring_error(body, backend: str, cls: type) -> BaseException:
    """Run ``body`` on the padded ring program at P=2 (zeroed data); return the ``cls`` error a rank raised."""
    with pytest.raises(RankError) as info:
        run(padded_ring_program(body), 2, backend, np.zeros((2, 1, 1), np.float32),
            np.zeros((2, 8, 1), np.float32), np.zeros((2, 8, 1), np.float32))
    assert isinstance(info.value.original, cls)
    return info.value.original


def oob_load_body(x, y, z, win, sig, me, n):
    pl.load(x, [me, 0], [8, 1], valid_shape=[1, 1])  # MARK-OOB-LOAD: rank 1 reads row 1 of a 1-row tensor


def test_valid_part_outside_the_tensor_is_out_of_bounds(backend):
    err = ring_error(oob_load_body, backend, KernelIndexError)
    line = line_of(oob_load_body, "MARK-OOB-LOAD")
    assert str(err) == (
        f"pl.load at {HERE}:{line}: out of bounds on tensor 'x[1]' [1, 1] FP32: offsets [1, 0] with valid_shape "
        "[1, 1] (of a [8, 1] tile) reach [1, 2) in dimension 0, whose bounds are [0, 1). Only the valid region is "
        "read, but all of it must lie inside the tensor. Shrink valid_shape to what is left of the tensor at these "
        "offsets ([0, 1]), or pass clamp=True to narrow it to the edge.")


def oob_remote_load_body(x, y, z, win, sig, me, n):
    pld.tile.remote_load(win, 0, [0, 0], [8, 4], valid_shape=[1, 2])  # MARK-OOB-RL


def test_remote_load_valid_part_outside_the_window_is_out_of_bounds(backend):
    err = ring_error(oob_remote_load_body, backend, KernelIndexError)
    line = line_of(oob_remote_load_body, "MARK-OOB-RL")
    assert str(err) == (
        f"pld.tile.remote_load at {HERE}:{line}: out of bounds on window 'win' [1, 1] FP32 (buffer 'wbuf'): "
        "offsets [0, 0] with valid_shape [1, 2] (of a [8, 4] tile) reach [0, 2) in dimension 1, whose bounds are "
        "[0, 1). Only the valid region is read, but all of it must lie inside the tensor. Shrink valid_shape to "
        "what is left of the tensor at these offsets ([1, 1]), or pass clamp=True to narrow it to the edge.")


def full_tile_oob_body(x, y, z, win, sig, me, n):
    pl.load(x, [0, 0], [8, 1])  # MARK-FULL: no valid_shape, so the whole tile must fit


def test_without_valid_shape_the_whole_tile_must_fit(backend):
    err = ring_error(full_tile_oob_body, backend, KernelIndexError)
    line = line_of(full_tile_oob_body, "MARK-FULL")
    assert str(err).startswith(
        f"pl.load at {HERE}:{line}: out of bounds on tensor 'x[0]' [1, 1] FP32: offsets [0, 0] with shape [8, 1] "
        "reach [0, 8) in dimension 0, whose bounds are [0, 1).")


def big_valid_body(x, y, z, win, sig, me, n):
    pl.load(x, [0, 0], [1, 1], valid_shape=[2, 1])  # MARK-BIG


def test_valid_shape_larger_than_the_tile_is_refused(backend):
    err = ring_error(big_valid_body, backend, KernelValueError)
    line = line_of(big_valid_body, "MARK-BIG")
    assert str(err) == (
        f"pl.load at {HERE}:{line}: valid_shape [2, 1] must lie within the tile shape [1, 1]: the valid region is "
        "the leading part of the tile that holds data, one extent per tile dimension, each between 0 and that "
        "dimension's size. Give 2 extents no larger than [1, 1].")


# -- 2. a [SIZE] window or tensor given to a [1, SIZE] kernel parameter (and back) ------------------------------

def flat_program(kernel_shape, chip_shape=(SIZE,)):
    """The host's tensors and windows are [SIZE]; the per-device function declares ``chip_shape``, the kernel
    ``kernel_shape``."""
    chip_shape = list(chip_shape)

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[kernel_shape, pl.FP32], y: pl.Out[pl.Tensor[kernel_shape, pl.FP32]],
              win: pl.InOut[pld.DistributedTensor[kernel_shape, pl.FP32]],
              sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(win)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], win)
            barrier(sig, me, n)
            got = pld.tile.remote_load(win, (me + 1) % n, [0, 0], [1, SIZE])
            y = pl.store(pl.add(got, 1.0), [0, 0], y)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[chip_shape, pl.FP32], y: pl.Out[pl.Tensor[chip_shape, pl.FP32]],
                 win: pl.InOut[pld.DistributedTensor[chip_shape, pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            return self.k(x, y, win, sig)  # MARK-CALL

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[NR, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, SIZE], pl.FP32]]):
            n = pld.world_size()
            wbuf = pld.alloc_window_buffer([SIZE], dtype=pl.FP32)
            sbuf = pld.alloc_window_buffer([n, 1], dtype=pl.INT32)
            for r in pl.range(n):
                self.chip(x[r], y[r], pld.window(wbuf, [SIZE], dtype=pl.FP32),
                          pld.window(sbuf, [n, 1], dtype=pl.INT32), device=r)
            return y

    return Prog


@pytest.mark.parametrize("nr", [2, 4])
def test_size_window_and_tensor_fit_a_1_by_size_kernel_parameter(backend, nr):
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, SIZE)
    y = np.zeros((nr, SIZE), np.float32)
    run(flat_program([1, SIZE]), nr, backend, x, y)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x[(r + 1) % nr] + 1)


@pytest.mark.parametrize("nr", [2, 4])
def test_the_host_dispatches_size_tensors_and_windows_to_1_by_size_parameters(backend, nr):
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, SIZE)
    y = np.zeros((nr, SIZE), np.float32)
    run(flat_program([1, SIZE], chip_shape=(1, SIZE)), nr, backend, x, y)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x[(r + 1) % nr] + 1)


@pytest.mark.parametrize("nr", [2, 4])
def test_unit_dims_may_be_added_anywhere_and_dynamic_dims_bind(backend, nr):
    n_dyn = pl.dynamic("N")
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, SIZE) * 3
    y = np.zeros((nr, SIZE), np.float32)
    # [SIZE] -> [1, N]: N binds to SIZE.  The kernel's loads use [1, SIZE] regions, so a [1, SIZE, 1] would not do.
    run(flat_program([1, n_dyn]), nr, backend, x, y)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x[(r + 1) % nr] + 1)


def test_a_rank_change_that_moves_elements_is_still_a_shape_error(backend):
    with pytest.raises(RankError) as info:
        run(flat_program([2, SIZE // 2]), 2, backend, np.zeros((2, SIZE), np.float32),
            np.zeros((2, SIZE), np.float32))
    err = info.value.original
    assert isinstance(err, ShapeError)
    decl, call = line_of(flat_program, "def k(self, x"), line_of(flat_program, "MARK-CALL")
    assert str(err) == (
        f"k() parameter 'x' (declared pl.Tensor[[2, 4], pl.FP32] at {HERE}:{decl}), called at {HERE}:{call}: the "
        "argument has shape [8] (1 dims) but the annotation [2, 4] has 2 dims.")
    assert err.fix == "Pass an argument with 2 dimensions ([2, 4]), or make the annotation match the argument's 1."


# -- 3. a 2-D tile stored into a 3-D tensor (leading dimensions of size 1) ----------------------------------------

def gather_program(nr: int, rows: int, cols: int):
    """Rank r puts its [rows, cols] block into every peer's [nr, rows, cols] window at [r, 0, 0]; each rank then
    copies the gathered blocks into its 3-D output row by row, at offsets [p, j, 0]."""

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[[rows, cols], pl.FP32], y: pl.Out[pl.Tensor[[nr, rows, cols], pl.FP32]],
              win: pl.InOut[pld.DistributedTensor[[nr, rows, cols], pl.FP32]],
              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(win)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            block = pl.load(x, [0, 0], [rows, cols])
            for p in pl.range(n):
                pld.tile.remote_store(block, win, p, [me, 0, 0])  # 2-D tile into a 3-D window
            barrier(sig, me, n)
            for p in pl.range(n):
                for j in pl.range(rows):
                    row = pl.load(win, [p, j, 0], [1, 1, cols])
                    flat = pl.reshape(row, [1, cols])
                    y = pl.store(flat, [p, j, 0], y)  # 2-D [1, cols] tile at [p, j, 0] of a 3-D tensor
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[rows, cols], pl.FP32], y: pl.Out[pl.Tensor[[nr, rows, cols], pl.FP32]],
                 win: pl.InOut[pld.DistributedTensor[[nr, rows, cols], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.k(x, y, win, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, rows, cols], pl.FP32], y: pl.Out[pl.Tensor[[nr, nr, rows, cols], pl.FP32]]):
            wbuf = pld.alloc_window_buffer([nr, rows, cols], dtype=pl.FP32)
            sbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(x[r], y[r], pld.window(wbuf, [nr, rows, cols], dtype=pl.FP32),
                          pld.window(sbuf, [nr, 1], dtype=pl.INT32), device=r)
            return y

    return Prog


@pytest.mark.parametrize("nr", [2, 4])
def test_2d_tile_stores_into_a_3d_tensor_and_window(backend, nr):
    rows, cols = 3, 4
    x = np.random.default_rng(nr).standard_normal((nr, rows, cols)).astype(np.float32)
    y = np.zeros((nr, nr, rows, cols), np.float32)
    run(gather_program(nr, rows, cols), nr, backend, x, y)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x)


def lower_rank_program(body):
    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, y: pl.Out[pl.Tensor[[2, 3, 4], pl.FP32]]):
            body(y)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, y: pl.Out[pl.Tensor[[2, 3, 4], pl.FP32]]):
            return self.k(y)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, y: pl.Out[pl.Tensor[[2, 2, 3, 4], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                self.chip(y[r], device=r)
            return y

    return Prog


def test_2d_tile_fills_the_trailing_dims_of_a_3d_tensor(backend):
    def body(y):
        pl.store(pl.full([2, 4], pl.FP32, 5.0), [1, 1, 0], y)  # y[1, 1:3, :] = 5

    y = np.zeros((2, 2, 3, 4), np.float32)
    run(lower_rank_program(body), 2, backend, y)
    want = np.zeros((2, 3, 4), np.float32)
    want[1, 1:3, :] = 5
    for r in range(2):
        np.testing.assert_array_equal(y[r], want)


def short_offsets_body(y):
    pl.store(pl.full([2, 4], pl.FP32, 1.0), [0, 0], y)  # MARK-SHORT


def test_lower_rank_store_needs_one_offset_per_tensor_dim(backend):
    with pytest.raises(RankError) as info:
        run(lower_rank_program(short_offsets_body), 2, backend, np.zeros((2, 2, 3, 4), np.float32))
    assert isinstance(info.value.original, KernelIndexError)
    line = line_of(short_offsets_body, "MARK-SHORT")
    assert str(info.value.original) == (
        f"pl.store at {HERE}:{line}: a 2-D tile (valid part [2, 4]) cannot be stored into tensor 'y[0]' [2, 3, 4] "
        "FP32 at offsets [0, 0]: the offsets need one entry per tensor dimension (3), and the tile at most 3 "
        "dimensions (a lower-rank tile fills the trailing dimensions). Give offsets with 3 entries.")


def oob_lower_rank_body(y):
    pl.store(pl.full([2, 4], pl.FP32, 1.0), [0, 2, 0], y)  # MARK-LR-OOB: rows 2..3 of a 3-row dimension


def test_lower_rank_store_out_of_bounds_names_the_region(backend):
    with pytest.raises(RankError) as info:
        run(lower_rank_program(oob_lower_rank_body), 2, backend, np.zeros((2, 2, 3, 4), np.float32))
    assert isinstance(info.value.original, KernelIndexError)
    line = line_of(oob_lower_rank_body, "MARK-LR-OOB")
    assert str(info.value.original) == (
        f"pl.store at {HERE}:{line}: out of bounds on tensor 'y[0]' [2, 3, 4] FP32: offsets [0, 2, 0] with shape "
        "[1, 2, 4] reach [2, 4) in dimension 1, whose bounds are [0, 3).")


def accumulate_program(nr: int, cols: int):
    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, y: pl.Out[pl.Tensor[[2, cols], pl.FP32]],
              win: pl.InOut[pld.DistributedTensor[[1, 2, cols], pl.FP32]],
              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(win)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            mine = pl.add(pl.full([2, cols], pl.FP32, 0.0), pl.cast(me, pl.FP32) + 1.0)
            for p in pl.range(n):
                pld.tile.remote_store(mine, win, p, [0, 0, 0], atomic=pld.AtomicType.Add)  # 2-D into 3-D
            barrier(sig, me, n)
            y = pl.store(pl.reshape(pl.load(win, [0, 0, 0], [1, 2, cols]), [2, cols]), [0, 0], y)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, y: pl.Out[pl.Tensor[[2, cols], pl.FP32]],
                 win: pl.InOut[pld.DistributedTensor[[1, 2, cols], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.k(y, win, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, y: pl.Out[pl.Tensor[[nr, 2, cols], pl.FP32]]):
            wbuf = pld.alloc_window_buffer([1, 2, cols], dtype=pl.FP32)
            sbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(y[r], pld.window(wbuf, [1, 2, cols], dtype=pl.FP32),
                          pld.window(sbuf, [nr, 1], dtype=pl.INT32), device=r)
            return y

    return Prog


@pytest.mark.parametrize("nr", [2, 4])
def test_atomic_remote_store_of_a_2d_tile_into_a_3d_window(backend, nr):
    y = np.zeros((nr, 2, 4), np.float32)
    run(accumulate_program(nr, 4), nr, backend, y)
    np.testing.assert_array_equal(y, np.full((nr, 2, 4), sum(range(1, nr + 1)), np.float32))


def test_a_lower_rank_tile_loads_from_the_trailing_dimensions_of_a_tensor():
    from conftest import run_in_rank

    def body(x, y, z):
        pl.store(pl.load(x, [1, 0, 0], [2, 4]), [0, 0], y)  # x[1, 0:2, 0:4]
        pl.store(pl.load(x, [2, 1, 1], [2, 4], valid_shape=[1, 3]), [0, 0], z)  # x[2, 1:2, 1:4], zero padding

    x = np.arange(24, dtype=np.float32).reshape(3, 2, 4)
    _, y, z = run_in_rank(body, x, np.zeros((2, 4), np.float32), np.full((2, 4), -1.0, np.float32))
    np.testing.assert_array_equal(y, x[1])
    want = np.full((2, 4), -1.0, np.float32)
    want[0, :3] = x[2, 1, 1:4]
    np.testing.assert_array_equal(z, want)


def test_a_lower_rank_tile_past_the_tensor_is_out_of_bounds():
    from conftest import run_in_rank

    def body(x):
        pl.load(x, [2, 1, 0], [2, 4])

    with pytest.raises(RankError, match=r"out of bounds on tensor 'a0' \[3, 2, 4\] FP32: offsets \[2, 1, 0\] with shape "
                                        r"\[1, 2, 4\] reach \[1, 3\) in dimension 1, whose bounds are \[0, 2\)"):
        run_in_rank(body, np.zeros((3, 2, 4), np.float32))
