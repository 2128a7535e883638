"""Remote memory access and signals: regions, atomics, and the errors a user sees for misuse.

The programs that run do so on both local backends (the ``backend`` fixture): shm and sim must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.errors import KernelIndexError, ProgramTypeError, ProgramValueError

N = 8


def compile_body(body, nr: int = 2, dtype=pl.FP32, backend: str | None = None):
    """Compile a program whose kernel is `body(x, y, win, sig, me, n)` on windows [nr, N] and signals [nr, 1]."""

    @pl.jit.incore
    def k(x: pl.Tensor[[nr, N], dtype], y: pl.Out[pl.Tensor[[nr, N], dtype]],
          win: pl.InOut[pld.DistributedTensor[[nr, N], dtype]],
          sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
        ctx = pld.get_comm_ctx(win)
        body(x, y, win, sig, pld.rank(ctx), pld.nranks(ctx))
        return y

    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend)
    return ir.compile(on_every_rank(k), config=config)


def barrier(sig, me, n):
    for p in pl.range(n):
        pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for p in pl.range(n):
        pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)


def test_put_and_get_with_regions(backend):
    # Rank r puts its row r into row r of every peer's window, then gets the peers' rows back.
    def body(x, y, win, sig, me, n):
        for p in pl.range(n):
            pld.tensor.put(win, p, x, [me, 0], [me, 0], [1, N])
        barrier(sig, me, n)
        for p in pl.range(n):
            pld.tensor.get(y, p, win, [p, 0], [p, 0], [1, N])

    x = np.random.default_rng(0).standard_normal((3, 3, N)).astype(np.float32)
    y = compile_body(body, 3, backend=backend)(x)
    for r in range(3):
        for p in range(3):
            np.testing.assert_array_equal(y[r, p], x[p, p])


def test_atomic_put_accumulates_from_every_rank(backend):
    def body(x, y, win, sig, me, n):
        for p in pl.range(n):
            pld.tensor.put(win, p, x, atomic=pld.AtomicType.Add)
        barrier(sig, me, n)
        pl.store(pl.load(win, [0, 0], [n, N]), [0, 0], y)

    x = np.arange(4 * 4 * N, dtype=np.int32).reshape(4, 4, N)
    y = compile_body(body, 4, pl.INT32, backend=backend)(x)
    for r in range(4):
        np.testing.assert_array_equal(y[r], x.sum(axis=0))


def test_atomic_add_rejects_unsupported_dtypes(backend):
    def body(x, y, win, sig, me, n):
        pld.tensor.put(win, 0, x, atomic=pld.AtomicType.Add)

    x = np.zeros((2, 2, N), np.int64)
    with pytest.raises(RankError) as info:
        compile_body(body, 2, pl.INT64, backend=backend)(x)
    assert isinstance(info.value.original, ProgramTypeError)
    assert "atomic add supports FP32, FP16, BF16, INT32, INT16, INT8" in str(info.value)
    assert "is INT64" in str(info.value)


def test_partial_region_is_rejected_before_running():
    def make():
        @pl.program
        class Bad:
            @pl.function(type=pl.FunctionType.InCore)
            def k(self, x: pl.Tensor[[1, N], pl.FP32], win: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
                pld.tensor.put(win, 0, x, [0, 0], shape=[1, N])

            @pl.function(type=pl.FunctionType.Orchestration)
            def chip(self, x: pl.Tensor[[1, N], pl.FP32], win: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
                self.k(x, win)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[2, 1, N], pl.FP32]):
                b = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
                for r in pl.range(pld.world_size()):
                    self.chip(x[r], pld.window(b, [1, N], dtype=pl.FP32), device=r)

        return Bad

    with pytest.raises(ProgramValueError) as info:
        ir.compile(make(), distributed_config=DistributedConfig(device_ids=[0, 1]))
    msg = str(info.value)
    assert "pld.tensor.put in kernel 'k' at" in msg and "test_rma.py" in msg
    assert "dst_offsets, src_offsets and shape go together; dst_offsets, shape given without src_offsets" in msg


def test_pipeline_without_chunks_is_rejected_before_running():
    @pl.jit.incore
    def k(x: pl.Tensor[[1, N], pl.FP32], win: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
        pld.tensor.put(win, 0, x, pipeline=True, chunk_rows=1)

    @pl.jit
    def chip(x: pl.Tensor[[1, N], pl.FP32], win: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
        k(x, win)

    @pl.jit.host
    def host(x: pl.Tensor[[2, 1, N], pl.FP32]):
        b = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
        for r in pl.range(pld.world_size()):
            chip(x[r], pld.window(b, [1, N], dtype=pl.FP32), device=r)

    with pytest.raises(ValueError, match=r"pipeline=True needs chunk_rows > 0 and chunk_cols > 0; chunk_cols is "
                                         r"not given"):
        host.compile(config=None)


def test_remote_load_out_of_bounds_names_everything(backend):
    def body(x, y, win, sig, me, n):
        pld.tile.remote_load(win, 0, [1, 4], [1, N])

    with pytest.raises(RankError) as info:
        compile_body(body, 2, backend=backend)(np.zeros((2, 2, N), np.float32))
    assert isinstance(info.value.original, KernelIndexError)
    msg = str(info.value)
    assert "pld.tile.remote_load at" in msg and "test_rma.py" in msg
    assert "out of bounds on window 'win' [2, 8] FP32" in msg
    assert "offsets [1, 4] with shape [1, 8] reach [4, 12) in dimension 1, whose bounds are [0, 8)" in msg


def test_notify_on_a_data_window_is_a_type_error(backend):
    def body(x, y, win, sig, me, n):
        pld.system.notify(win, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)

    with pytest.raises(RankError) as info:
        compile_body(body, 2, backend=backend)(np.zeros((2, 2, N), np.float32))
    assert "signal cells are INT32, but window 'win' [2, 8] FP32" in str(info.value)


def test_notify_peer_out_of_range_gives_the_modulo_hint(backend):
    def body(x, y, win, sig, me, n):
        pld.system.notify(sig, (me - 1) % n, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)

    with pytest.raises(RankError) as info:
        compile_body(body, 2, backend=backend)(np.zeros((2, 2, N), np.float32))
    assert info.value.rank == 0
    assert "peer -1 is outside [0, 2)" in str(info.value)
    assert "(r - 1 + n) % n" in str(info.value)


def test_set_overwrites_and_eq_waits_for_an_exact_value(backend):
    # Rank 1 sets rank 0's cell to 7; rank 0 waits for == 7 and records what it saw.
    def body(x, y, win, sig, me, n):
        if me == 1:
            pld.system.notify(sig, 0, [1, 0], 7, op=pld.NotifyOp.Set)
        else:
            pld.system.wait(sig, [1, 0], 7, cmp=pld.WaitCmp.Eq)
            pl.write(y, [0, 0], pl.read(sig, [1, 0]))

    y = compile_body(body, 2, pl.INT32, backend=backend)(np.zeros((2, 2, N), np.int32))
    assert y[0, 0, 0] == 7


def test_windows_start_zeroed(backend):
    def body(x, y, win, sig, me, n):
        pl.store(pl.load(win, [0, 0], [n, N]), [0, 0], y)

    y = compile_body(body, 2, backend=backend)(np.ones((2, 2, N), np.float32))
    assert not y.any()


def test_hand_rolled_signal_reused_as_a_collective_signal_of_another_layout(backend):
    nr = 2

    @pl.program
    class Reuse:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, grid: pl.InOut[pld.DistributedTensor[[nr, nr], pl.INT32]],
              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            me = pld.rank(pld.get_comm_ctx(grid))
            for p in pl.range(nr):
                pld.system.notify(grid, p, [me, p], 1, op=pld.NotifyOp.AtomicAdd)  # HAND-ROLLED
            for p in pl.range(nr):
                pld.system.wait(grid, [p, me], 1, cmp=pld.WaitCmp.Ge)
            pld.tensor.barrier(sig)  # COLLECTIVE: the same buffer, another shape

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, grid: pl.InOut[pld.DistributedTensor[[nr, nr], pl.INT32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            self.k(grid, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1], pl.FP32]):
            b = pld.alloc_window_buffer([nr, nr], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(pld.window(b, [nr, nr], dtype=pl.INT32), pld.window(b, [nr, 1], dtype=pl.INT32), device=r)

    with pytest.raises(RankError) as info:
        ir.compile(Reuse, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=backend))(
            np.zeros((2, 1), np.float32))
    from ptodist.errors import SignalLayoutError

    assert isinstance(info.value.original, SignalLayoutError)
    msg = str(info.value)
    lines = {m: next(i for i, s in enumerate(open(__file__), 1) if f"# {m}" in s and "def " not in s)
             for m in ("HAND-ROLLED", "COLLECTIVE")}
    assert f"pld.tensor.barrier at {__file__}:{lines['COLLECTIVE']}: signal window buffer 'b' was used by " \
           f"hand-rolled notify/wait at {__file__}:{lines['HAND-ROLLED']} as [2, 2]" in msg
    assert "give the collective its own signal window" in msg
