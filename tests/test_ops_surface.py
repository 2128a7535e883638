"""The rest of upstream's op surface: atomic stores (``pl.AtomicType``), the ``pl.tile`` / ``pl.tensor`` /
``pl.system`` names that complete upstream's lists, and ``pld.tile.put`` / ``get``.

Every program runs on both local backends (the ``backend`` fixture) and its numbers are checked against numpy.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.check import explore

SIZE = 8


def cfg(backend: str, nr: int = 1) -> RunConfig:
    if nr == 1:
        return RunConfig(backend=backend)
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend)


# -- atomic stores --------------------------------------------------------------------------------------------

@pl.jit
def split_k(a: pl.Tensor, b: pl.Tensor, c: pl.Out[pl.Tensor]):
    # Each block multiplies one K-strip and adds its partial product into the whole of c.
    with pl.spmd(4):
        k = pl.get_block_idx() * 8
        part = pl.matmul(pl.load(a, [0, k], [16, 8]), pl.load(b, [k, 0], [8, 16]))
        c = pl.assemble(c, part, [0, 0], atomic=pl.AtomicType.Add)
    return c


def test_atomic_assemble_sums_every_blocks_partial_product(backend):
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (16, 32)).astype(np.float32)
    b = rng.integers(-4, 5, (32, 16)).astype(np.float32)
    c = np.full((16, 16), 100, np.float32)  # atomic adds onto what the output held
    split_k(a, b, c, config=cfg(backend))
    np.testing.assert_array_equal(c, 100 + a @ b)


@pl.jit
def tile_atomics(x: pl.Tensor, out: pl.Out[pl.Tensor], mode: pl.Scalar[pl.INT32]):
    with pl.spmd(4):
        t = pl.load(x, [pl.get_block_idx() * 2, 0], [2, SIZE])
        pl.store(t, [0, 0], out, atomic=pl.AtomicType.Add)   # every block adds into rows 0..1
        pl.tile.store(t, [2, 0], out, atomic=1)             # the int form of AtomicType.Add
    with pl.at(level=pl.Level.CORE_GROUP):
        acc = pl.tile.full([2, SIZE], pl.INT32, 0)
        for i in pl.range(4):
            acc = pl.tile.assemble(acc, pl.load(x, [i * 2, 0], [2, SIZE]), [0, 0], atomic=pl.AtomicType.Add)
        pl.store(acc, [4, 0], out, atomic=pl.AtomicType.None_)
    return out


def test_atomic_store_and_tile_assemble_add_instead_of_overwriting(backend):
    x = np.arange(8 * SIZE, dtype=np.int32).reshape(8, SIZE)
    out = np.ones((6, SIZE), np.int32)
    tile_atomics(x, out, 0, config=cfg(backend))
    total = x.reshape(4, 2, SIZE).sum(axis=0)
    np.testing.assert_array_equal(out[0:2], 1 + total)
    np.testing.assert_array_equal(out[2:4], 1 + total)
    np.testing.assert_array_equal(out[4:6], total)


@pl.jit.incore
def bad_mode(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], out, atomic="add")


def test_an_unknown_atomic_mode_is_an_error_not_a_plain_store():
    x = np.zeros((1, SIZE), np.float32)
    with pytest.raises(RankError) as info:
        bad_mode(x, np.zeros_like(x), config=RunConfig(backend="sim"))
    assert isinstance(info.value.original, TypeError)
    assert (f"pl.store at {__file__}:" in str(info.value)
            and "atomic='add' is not an atomic mode; pass atomic=pl.AtomicType.Add to add into the destination, "
                "or pl.AtomicType.None_ (the default) to overwrite it" in str(info.value)), str(info.value)


def _window_program(nr: int, body):
    """A one-kernel program: ``body(w)`` runs on every rank with ``w.x, w.y, w.data, w.sig, w.me, w.n``."""
    @pl.program
    class P:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
              data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            body(SimpleNamespace(x=x, y=y, data=data, sig=sig, me=pld.rank(ctx), n=pld.nranks(ctx)))
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.k(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            dbuf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            sbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(x[r], y[r], pld.window(dbuf, [1, SIZE], dtype=pl.FP32),
                          pld.window(sbuf, [nr, 1], dtype=pl.INT32), device=r)
            return y

    return P


def _barrier(w):
    for p in pl.range(w.n):
        pld.system.notify(w.sig, p, [w.me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for p in pl.range(w.n):
        pld.system.wait(w.sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)


def _add_into_rank_0(atomic):
    def body(w):
        t = pl.load(w.x, [0, 0], [1, SIZE])
        if w.me == 0:
            pl.store(t, [0, 0], w.data, atomic=atomic)  # rank 0 adds into its own window ...
        else:
            pld.tile.remote_store(t, w.data, 0, [0, 0], atomic=pl.AtomicType.Add)  # ... as its peers add into it
        _barrier(w)
        pl.store(pl.load(w.data, [0, 0], [1, SIZE]), [0, 0], w.y)
    return body


@pytest.mark.parametrize("nr", [2, 4])
def test_atomic_stores_from_every_rank_into_one_window_sum_exactly(backend, nr):
    x = (np.arange(nr * SIZE, dtype=np.float32) + 1).reshape(nr, 1, SIZE)
    y = ir.compile(_window_program(nr, _add_into_rank_0(pl.AtomicType.Add)), config=cfg(backend, nr))(x)
    np.testing.assert_array_equal(y[0], x.sum(axis=0))


def test_the_checker_allows_atomic_adds_into_one_region_but_reports_a_plain_store_among_them():
    x = np.ones((3, 1, SIZE), np.float32)
    atomic = ir.compile(_window_program(3, _add_into_rank_0(pl.AtomicType.Add)), config=cfg("sim", 3))
    for seed in range(3):
        out = explore.run_checked(lambda: atomic(x), seed)
        assert out.exit_code == 0 and not out.findings, [f.message for f in out.findings]
    plain = ir.compile(_window_program(3, _add_into_rank_0(pl.AtomicType.None_)), config=cfg("sim", 3))
    out = explore.run_checked(lambda: plain(x), 0)
    races = [f for f in out.findings if f.kind == "race"]
    assert races, [f.message for f in out.findings]
    assert "pl.store (write of 'data')" in races[0].message and "atomic add" in races[0].message, races[0].message


def test_atomic_stores_of_every_rank_into_one_host_tensor_sum_exactly(backend):
    @pl.program
    class Shared:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[[1, SIZE], pl.FP32], total: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
            pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], total, atomic=pl.AtomicType.Add)
            return total

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, SIZE], pl.FP32], total: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
            return self.k(x, total)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[3, 1, SIZE], pl.FP32], total: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                self.chip(x[r], total, device=r)
            return total

    x = np.arange(3 * SIZE, dtype=np.float32).reshape(3, 1, SIZE)
    total = np.full((1, SIZE), 0.5, np.float32)
    ir.compile(Shared, config=cfg(backend, 3))(x, total)
    np.testing.assert_array_equal(total, 0.5 + x.sum(axis=0))
