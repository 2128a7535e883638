"""The host's top-level collectives (``pld.all_reduce``, ``pld.all_gather``, ...): each allocates its own signal.

Every program stages per-rank data into windows, calls one top-level collective in the host orchestrator and
reads the result back; the numbers are checked against numpy at P=2 and P=4 on shm, on sim, and on sim under
``ptodist check`` (the checker sees the ``pld.tensor.*`` collective the call makes: no finding allowed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import LOCAL_BACKENDS, on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, RankError, RunConfig, ir, shared_array
from ptodist.check import explore
from ptodist.errors import (
    CheckError,
    KernelStateError,
    ProgramError,
    ProgramTypeError,
    ProgramValueError,
    SignalLayoutError,
)

S = 8  # columns
M = 3  # all_to_all_v: rows per rank block
BACKENDS = [*LOCAL_BACKENDS, "check"]


def zeros(shape) -> list[int]:
    return [0] * len(shape)


def build(nr: int, xs, ws, host, read=None):
    """A program: rank r stages ``x[r]`` (shape ``xs``) into window ``a`` and ``cnt[r]`` into INT32 window ``c``
    (``[nr]``); the host calls ``host(w)`` (``w``: windows ``a``, ``b`` (shape ``ws``), ``c``, ``d`` (INT32
    ``[nr, 1]``), ``g`` (INT32 ``[nr]``)); rank r reads the window it returns (``read(res, me, n)``, by default
    all of it, shape ``ws``) into ``y[r]`` and ``d`` into ``rc[r]``."""
    xs, ws = list(xs), list(ws)
    read = read or (lambda res, me, n: pl.load(res, zeros(ws), ws))

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def stage(self, x: pl.Tensor[xs, pl.FP32], cnt: pl.Tensor[[nr], pl.INT32],
                  a: pl.InOut[pld.DistributedTensor[xs, pl.FP32]], c: pl.InOut[pld.DistributedTensor[[nr], pl.INT32]],
                  g: pl.InOut[pld.DistributedTensor[[nr], pl.INT32]]):
            pl.store(pl.load(x, zeros(xs), xs), zeros(xs), a)
            pl.store(pl.load(cnt, [0], [nr]), [0], c)

        @pl.function(type=pl.FunctionType.Orchestration)
        def pub(self, x: pl.Tensor[xs, pl.FP32], cnt: pl.Tensor[[nr], pl.INT32],
                a: pl.InOut[pld.DistributedTensor[xs, pl.FP32]], c: pl.InOut[pld.DistributedTensor[[nr], pl.INT32]],
                g: pl.InOut[pld.DistributedTensor[[nr], pl.INT32]]):
            self.stage(x, cnt, a, c, g)

        @pl.function(type=pl.FunctionType.InCore)
        def out(self, y: pl.Out[pl.Tensor[ws, pl.FP32]], rc: pl.Out[pl.Tensor[[nr, 1], pl.INT32]],
                res: pl.InOut[pld.DistributedTensor[ws, pl.FP32]], d: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(res)
            pl.store(read(res, pld.rank(ctx), pld.nranks(ctx)), zeros(ws), y)
            pl.store(pl.load(d, [0, 0], [nr, 1]), [0, 0], rc)

        @pl.function(type=pl.FunctionType.Orchestration)
        def con(self, y: pl.Out[pl.Tensor[ws, pl.FP32]], rc: pl.Out[pl.Tensor[[nr, 1], pl.INT32]],
                res: pl.InOut[pld.DistributedTensor[ws, pl.FP32]], d: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            self.out(y, rc, res, d)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host_fn(self, x: pl.Tensor[[nr, *xs], pl.FP32], cnt: pl.Tensor[[nr, nr], pl.INT32],
                    y: pl.Out[pl.Tensor[[nr, *ws], pl.FP32]], rc: pl.Out[pl.Tensor[[nr, nr, 1], pl.INT32]]):
            abuf = pld.alloc_window_buffer(xs, dtype=pl.FP32)
            bbuf = pld.alloc_window_buffer(ws, dtype=pl.FP32)
            cbuf = pld.alloc_window_buffer([nr], dtype=pl.INT32)
            dbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            gbuf = pld.alloc_window_buffer([nr], dtype=pl.INT32)
            w = SimpleNamespace(a=pld.window(abuf, xs, dtype=pl.FP32), b=pld.window(bbuf, ws, dtype=pl.FP32),
                                c=pld.window(cbuf, [nr], dtype=pl.INT32), d=pld.window(dbuf, [nr, 1], dtype=pl.INT32),
                                g=pld.window(gbuf, [nr], dtype=pl.INT32))
            for r in pl.range(pld.world_size()):
                self.pub(x[r], cnt[r], w.a, w.c, w.g, device=r)
            res = host(w)
            for r in pl.range(pld.world_size()):
                self.con(y[r], rc[r], res, w.d, device=r)
            return y

    return Prog


def run(prog, nr: int, x: np.ndarray, ws, backend: str, cnt: np.ndarray | None = None):
    """Run ``prog`` on ``nr`` ranks; return (y, rc)."""
    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))),
                       backend=None if backend in ("check", None) else backend)
    compiled = ir.compile(prog, config=config)
    cnt = np.zeros((nr, nr), np.int32) if cnt is None else cnt
    y = np.full((nr, *ws), -1, np.float32)
    rc = np.full((nr, nr, 1), -1, np.int32)
    with explore.checking(0) if backend == "check" else contextlib.nullcontext():
        compiled(x, cnt, y, rc)
    return y, rc


def data(nr: int, shape) -> np.ndarray:
    return np.random.default_rng(nr).standard_normal((nr, *shape)).astype(np.float32)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.mark.parametrize("nr", [2, 4])
@pytest.mark.parametrize("op", [pld.ReduceOp.Sum, pld.ReduceOp.Max])
def test_all_reduce_mesh_reduces_every_rank(nr, op, backend):
    x = data(nr, [1, S])
    y, _ = run(build(nr, [1, S], [1, S], lambda w: pld.all_reduce(w.a, op=op)), nr, x, [1, S], backend)
    ref = x.max(axis=0) if op is pld.ReduceOp.Max else x.sum(axis=0, dtype=np.float64)
    for r in range(nr):
        np.testing.assert_allclose(y[r], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nr", [2, 4])
def test_all_reduce_ring_sums_every_rank(nr, backend):
    x = data(nr, [1, S])
    prog = build(nr, [1, S], [1, S], lambda w: pld.all_reduce(w.a, op=pld.ReduceOp.Sum, mode="ring", nranks=nr))
    y, _ = run(prog, nr, x, [1, S], backend)
    for r in range(nr):
        np.testing.assert_allclose(y[r], x.sum(axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nr", [2, 4])
def test_broadcast_copies_the_roots_data(nr, backend):
    x = data(nr, [1, S])
    y, _ = run(build(nr, [1, S], [1, S], lambda w: pld.broadcast(w.a, root=1)), nr, x, [1, S], backend)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x[1])


@pytest.mark.parametrize("nr", [2, 4])
def test_all_gather_collects_every_ranks_chunk(nr, backend):
    x = data(nr, [1, S])
    y, _ = run(build(nr, [1, S], [nr, S], lambda w: pld.all_gather(w.a, w.b)), nr, x, [nr, S], backend)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x[:, 0, :])


@pytest.mark.parametrize("nr", [2, 4])
def test_reduce_scatter_leaves_each_rank_its_summed_row(nr, backend):
    x = data(nr, [nr, S])
    y, _ = run(build(nr, [nr, S], [nr, S], lambda w: pld.reduce_scatter(w.a)), nr, x, [nr, S], backend)
    for r in range(nr):
        np.testing.assert_allclose(y[r][r], x[:, r, :].sum(axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nr", [2, 4])
def test_all_to_all_transposes_the_blocks(nr, backend):
    x = data(nr, [nr, S])
    y, _ = run(build(nr, [nr, S], [nr, S], lambda w: pld.all_to_all(w.a, w.b)), nr, x, [nr, S], backend)
    for r in range(nr):
        for src in range(nr):
            np.testing.assert_array_equal(y[r][src], x[src][r])


@pytest.mark.parametrize("nr", [2, 4])
def test_all_to_all_v_sends_the_counted_rows(nr, backend):
    x = data(nr, [nr * M, S])
    cnt = np.array([[(p + q) % (M + 1) for q in range(nr)] for p in range(nr)], np.int32)  # cnt[p][q]: p -> q
    prog = build(nr, [nr * M, S], [nr * M, S], lambda w: pld.all_to_all_v(w.a, w.b, w.c, w.d, nranks=nr))
    y, rc = run(prog, nr, x, [nr * M, S], backend, cnt)
    for r in range(nr):
        for src in range(nr):
            k = cnt[src][r]
            np.testing.assert_array_equal(y[r][src * M:src * M + k], x[src][r * M:r * M + k])
            assert rc[r][src][0] == k


@pytest.mark.parametrize("nr", [2, 4])
def test_barrier_orders_the_staging_before_the_peer_reads(nr, backend):
    x = data(nr, [1, S])

    def peer_row(res, me, n):
        return pld.tile.remote_load(res, peer=(me + 1) % n, offsets=[0, 0], shape=[1, S])

    prog = build(nr, [1, S], [1, S], lambda w: (pld.barrier(w.g), w.a)[1], read=peer_row)
    y, _ = run(prog, nr, x, [1, S], backend)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x[(r + 1) % nr])


def test_barrier_returns_its_signal():
    seen = {}

    def host(w):
        seen["returned"], seen["given"] = pld.barrier(w.g), w.g
        return w.a

    run(build(2, [1, S], [1, S], host), 2, data(2, [1, S]), [1, S], "sim")
    assert seen["returned"] is seen["given"]


@pytest.mark.parametrize("nr", [2, 4])
def test_a_prepared_worker_runs_them_call_after_call(nr, local_backend):
    """Kept rank processes run the same plan again: the signals each call allocated are clear for the next."""
    def host(w):
        pld.all_to_all(w.a, w.b)
        return pld.reduce_scatter(w.b)

    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=local_backend)
    compiled = ir.compile(build(nr, [nr, S], [nr, S], host), config=config)
    with compiled.prepare() as rt:
        for i in range(3):
            x = shared_array((nr, nr, S), np.float32)
            x[...] = np.random.default_rng(i).standard_normal((nr, nr, S))
            cnt = shared_array((nr, nr), np.int32)
            y, rc = shared_array((nr, nr, S), np.float32), shared_array((nr, nr, 1), np.int32)
            rt(x, cnt, y, rc)
            # all_to_all: rank q's row r is x[r][q]; reduce_scatter: rank r's row r sums that over q
            for r in range(nr):
                np.testing.assert_allclose(y[r][r], x[r].sum(axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)


def test_the_decorator_form_called_directly():
    @pl.jit.incore
    def stage(x: pl.Tensor[[1, S], pl.FP32], a: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]]):
        pl.store(pl.load(x, [0, 0], [1, S]), [0, 0], a)

    @pl.jit.incore
    def unstage(y: pl.Out[pl.Tensor[[1, S], pl.FP32]], a: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]]):
        pl.store(pl.load(a, [0, 0], [1, S]), [0, 0], y)

    @pl.jit
    def put_in(x: pl.Tensor[[1, S], pl.FP32], a: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]]):
        stage(x, a)

    @pl.jit
    def take_out(y: pl.Out[pl.Tensor[[1, S], pl.FP32]], a: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]]):
        unstage(y, a)

    @pl.jit.host
    def host(x: pl.Tensor[[2, 1, S], pl.FP32], y: pl.Out[pl.Tensor[[2, 1, S], pl.FP32]]):
        a = pld.window(pld.alloc_window_buffer([1, S], dtype=pl.FP32), [1, S], dtype=pl.FP32)
        for r in pl.range(pld.world_size()):
            put_in(x[r], a, device=r)
        a = pld.all_reduce(a, op=pld.ReduceOp.Min)
        for r in pl.range(pld.world_size()):
            take_out(y[r], a, device=r)

    x = data(2, [1, S])
    y = host(x, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend="sim"))
    np.testing.assert_array_equal(y, np.broadcast_to(x.min(axis=0), y.shape))


@pytest.mark.parametrize("nr", [2, 4])
def test_barrier_in_a_kernel(nr, backend):
    def body(w):
        pld.barrier(w.sig)  # a kernel's barrier: pld.tensor.barrier

    run_ring(nr, body, backend)


# -- misuse: upstream's wrappers refuse these, before anything runs ----------------------------------

def compile_error(nr: int, host, xs=(1, S), ws=(1, S)) -> str:
    with pytest.raises(ProgramValueError) as e:
        run(build(nr, xs, ws, host), nr, data(nr, list(xs)), list(ws), "sim")
    return str(e.value)


def line_of(text: str) -> str:
    """``file:line`` of the line of this file containing ``text``."""
    lines = open(__file__).read().splitlines()
    return f"{__file__}:{next(i for i, line in enumerate(lines, 1) if text in line and 'line_of' not in line)}"


def test_all_reduce_refuses_an_unknown_mode():
    msg = compile_error(2, lambda w: pld.all_reduce(w.a, mode="tree"))  # unknown mode
    assert msg == f"pld.all_reduce at {line_of('# unknown mode')}: mode must be \"mesh\" or \"ring\", got 'tree'."


def test_all_reduce_ring_needs_nranks():
    msg = compile_error(2, lambda w: pld.all_reduce(w.a, mode="ring"))  # ring without nranks
    assert msg == (f"pld.all_reduce(mode='ring') at {line_of('# ring without nranks')}: needs nranks, the rank "
                   "count as a positive int (the ring signal is [2*(nranks-1)+1, nranks]), got None.")


def test_all_reduce_mesh_refuses_nranks():
    msg = compile_error(2, lambda w: pld.all_reduce(w.a, nranks=2))  # mesh with nranks
    assert msg == (f"pld.all_reduce at {line_of('# mesh with nranks')}: nranks is only used with mode='ring'; "
                   "omit it for a mesh allreduce (or pass mode='ring').")


def test_all_reduce_ring_refuses_other_ops():
    msg = compile_error(2, lambda w: pld.all_reduce(w.a, mode="ring", nranks=2, op=pld.ReduceOp.Max))  # ring Max
    assert msg == (f"pld.all_reduce(mode='ring') at {line_of('# ring Max')}: supports only op=pld.ReduceOp.Sum, "
                   "got <ReduceOp.Max: 1>. Use mode='mesh' for Max.")


def test_reduce_scatter_refuses_other_ops():
    msg = compile_error(2, lambda w: pld.reduce_scatter(w.a, op=pld.ReduceOp.Min), xs=(2, S), ws=(2, S))  # rs Min
    assert msg == (f"pld.reduce_scatter at {line_of('# rs Min')}: supports only op=pld.ReduceOp.Sum, got "
                   "<ReduceOp.Min: 2>. Reduce with pld.tensor.reduce_scatter inside a kernel for other ops.")


def test_a_wrong_nranks_is_named_as_the_fault():
    host = lambda w: pld.all_reduce(w.a, mode="ring", nranks=4)  # noqa: E731  # ring nranks=4 on 2
    with pytest.raises(SignalLayoutError) as e:
        run(build(2, [1, S], [1, S], host), 2, data(2, [1, S]), [1, S], "sim")
    assert str(e.value) == (
        f"pld.all_reduce(mode='ring') at {line_of('# ring nranks=4 on 2')}: nranks=4 is not the number of ranks the "
        "collective runs over (the ranks its target window is dispatched to; all of them unless the host "
        "dispatched it to fewer). Pass that rank count, e.g. nranks=NR for the NR of "
        "DistributedConfig(device_ids=...).")


def test_all_to_all_v_needs_a_positive_nranks():
    host = lambda w: pld.all_to_all_v(w.a, w.b, w.c, w.d, nranks=0)  # noqa: E731  # a2av nranks=0
    msg = compile_error(2, host, xs=(2 * M, S), ws=(2 * M, S))
    assert msg == (f"pld.all_to_all_v at {line_of('# a2av nranks=0')}: needs nranks, the rank count as a "
                   "positive int (it sizes the [nranks, 1] signal and MAX_RECV = target rows // nranks), got 0.")


def test_a_top_level_collective_in_a_kernel_says_it_is_host_only():
    @pl.jit.incore
    def k(a: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]]):
        pld.all_reduce(a)  # in a kernel

    compiled = ir.compile(on_every_rank(k), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]),
                                                             backend="sim"))
    with pytest.raises(RankError) as e:
        compiled(np.zeros((2, 1), np.float32))
    assert isinstance(e.value.original, ProgramError)
    assert (f"pld.all_reduce at {line_of('# in a kernel')}: is called outside the host orchestrator; it allocates "
            "its signal window, which only the host orchestrator (@pl.jit.host) can do. Call it there, or inside a "
            "kernel call pld.tensor.allreduce(target, signal, ...) with a signal window the host passes in.") \
        in str(e.value)


# -- pl.system.comm_notify / comm_wait / comm_test: signals on one window cell --------------------------------

def ring(nr: int, body):
    """A program: rank r writes ``x[r]`` into its right neighbour's ``data`` window, then ``body(w)`` (``w``: me,
    n, nxt, data, sig (INT32 ``[nr]``)) synchronises, then it copies its own ``data`` into ``y[r]``."""

    @pl.jit.incore
    def k(x: pl.Tensor[[1, S], pl.FP32], y: pl.Out[pl.Tensor[[1, S], pl.FP32]],
          data: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]],
          sig: pl.InOut[pld.DistributedTensor[[nr], pl.INT32]]):
        ctx = pld.get_comm_ctx(data)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        w = SimpleNamespace(me=me, n=n, nxt=(me + 1) % n, data=data, sig=sig)
        pld.tile.remote_store(pl.load(x, [0, 0], [1, S]), data, w.nxt, [0, 0])
        body(w)
        pl.store(pl.load(data, [0, 0], [1, S]), [0, 0], y)

    return on_every_rank(k)


def run_ring(nr: int, body, backend: str, **config_args) -> np.ndarray:
    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))),
                       backend=None if backend in ("check", None) else backend, **config_args)
    compiled = ir.compile(ring(nr, body), config=config)
    x = data(nr, [1, S])
    y = np.zeros_like(x)
    with explore.checking(0) if backend == "check" else contextlib.nullcontext():
        compiled(x, y)
    np.testing.assert_array_equal(y, np.roll(x, 1, axis=0))  # y[r] = x[r - 1]
    return y


def cell(w, i: int = 0):
    return pl.slice(w.sig, [1], [i])


@pytest.mark.parametrize("nr", [2, 4])
def test_comm_wait_orders_a_peers_write_before_the_read(nr, backend):
    def body(w):
        pld.system.notify(w.sig, w.nxt, [0], 1, op=pld.NotifyOp.AtomicAdd)
        pl.system.comm_wait(cell(w), 0, cmp="gt")

    run_ring(nr, body, backend)


@pytest.mark.parametrize("nr", [2, 4])
def test_comm_notify_from_the_receiver_and_a_comm_test_poll(nr, backend):
    def body(w):
        pld.system.notify(w.sig, w.nxt, [0], -1, op=pld.NotifyOp.AtomicAdd)  # cells only go down: le / lt hold
        pl.system.comm_wait(cell(w), -1, cmp="le")
        while not pl.system.comm_test(cell(w), 0, cmp="lt"):
            pass
        pl.system.comm_notify(cell(w, 1), 5, op="set")  # this rank's own cell
        pl.system.comm_notify(cell(w, 1), 2, op="atomic_add")
        pl.system.comm_wait(cell(w, 1), 7, cmp="eq")
        assert bool(pl.system.comm_test(cell(w, 1), 7, cmp="ge"))
        assert not bool(pl.system.comm_test(cell(w, 1), 7, cmp="ne"))

    run_ring(nr, body, backend)


def test_a_read_before_comm_wait_is_a_race_the_checker_reports():
    seen = {}

    def body(w):
        seen["early"] = pl.load(w.data, [0, 0], [1, S])  # races with the peer's remote_store
        pld.system.notify(w.sig, w.nxt, [0], 1, op=pld.NotifyOp.AtomicAdd)
        pl.system.comm_wait(cell(w), 1, cmp="ge")

    with pytest.raises(CheckError) as e:
        run_ring(2, body, "check")
    assert "race" in str(e.value)


@pytest.mark.parametrize("backend_name", LOCAL_BACKENDS)
def test_a_comm_wait_that_never_holds_is_a_hang_report_with_its_comparison(backend_name):
    def body(w):
        pl.system.comm_notify(cell(w, 1), 3, op="set")
        pl.system.comm_wait(cell(w, 1), 3, cmp="ne")  # holds 3 for ever

    with pytest.raises(HangError) as e:
        run_ring(2, body, backend_name, hang_timeout_s=2.0)
    assert (f"blocked at {line_of('# holds 3 for ever')} in kernel 'k': pl.system.comm_wait on 'sig[slice]' "
            "(buffer 'sig_buf') cell 1 holds 3, needs != 3") in str(e.value)


def comm_error(body, kind=ProgramError) -> str:
    with pytest.raises(RankError) as e:
        run_ring(2, body, "sim")
    assert isinstance(e.value.original, kind)
    return str(e.value.original)


@pytest.mark.parametrize(("call", "text"), [
    (lambda w: pl.system.comm_notify(cell(w), 1, op="add"),  # bad op
     "op= must be \"atomic_add\" or \"set\", got 'add'"),
    (lambda w: pl.system.comm_wait(cell(w), 1, cmp=">="),  # bad cmp
     "cmp= must be one of \"eq\", \"ne\", \"gt\", \"ge\", \"lt\", \"le\", got '>='"),
    (lambda w: pl.system.comm_test(pl.slice(w.sig, [2], [0]), 1, cmp="eq"),  # two cells
     "the signal must hold exactly one INT32 cell (every dimension 1), but tensor 'sig[slice]' [2] INT32 has "
     "shape [2]. Slice one cell: pl.slice(window, [1], [i])."),
    (lambda w: pl.system.comm_notify(pl.slice(w.data, [1, 1], [0, 0]), 1, op="set"),  # an FP32 cell
     "the signal must be INT32, but tensor 'data[slice]' [1, 1] FP32 is FP32. Use a cell of an INT32 window."),
    (lambda w: pl.system.comm_wait(pl.create_tensor([1], dtype=pl.INT32), 1, cmp="eq"),  # not a window
     "the signal tensor 'pl.create_tensor' [1] INT32 is not a cell of a window, so no other rank can reach it. "
     "Use a cell of an INT32 window (pld.window), e.g. pl.slice(signal_window, [1], [i])."),
])
def test_comm_misuse_is_refused(call, text):
    op = "comm_notify" if "comm_notify" in line_of_lambda(call) else \
        "comm_wait" if "comm_wait" in line_of_lambda(call) else "comm_test"
    msg = comm_error(call)
    loc = f"{__file__}:{call.__code__.co_firstlineno}"
    assert msg == f"pl.system.{op} at {loc}: {text}"


def line_of_lambda(fn) -> str:
    return open(__file__).read().splitlines()[fn.__code__.co_firstlineno - 1]


# -- pld.system.async_session / pld.tensor.put_async / pld.system.wait_async_event ---------------------------

def async_ring(nr: int, body, backend: str = "sim") -> np.ndarray:
    """``ring`` with the write made by ``body(w, x_tile_tensor)`` instead of remote_store (``w.x``: the input)."""

    @pl.jit.incore
    def k(x: pl.Tensor[[1, S], pl.FP32], y: pl.Out[pl.Tensor[[1, S], pl.FP32]],
          stage: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]],
          data: pl.InOut[pld.DistributedTensor[[1, S], pl.FP32]],
          sig: pl.InOut[pld.DistributedTensor[[nr], pl.INT32]]):
        ctx = pld.get_comm_ctx(data)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        pl.store(pl.load(x, [0, 0], [1, S]), [0, 0], stage)
        body(SimpleNamespace(me=me, n=n, nxt=(me + 1) % n, data=data, sig=sig, stage=stage, x=x))
        pld.system.wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)
        pl.store(pl.load(data, [0, 0], [1, S]), [0, 0], y)

    Prog = on_every_rank(k)

    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))),
                       backend=None if backend in ("check", None) else backend)
    compiled = ir.compile(Prog, config=config)
    x = data(nr, [1, S])
    y = np.zeros_like(x)
    with explore.checking(0) if backend == "check" else contextlib.nullcontext():
        compiled(x, y)
    np.testing.assert_array_equal(y, np.roll(x, 1, axis=0))  # y[r] = x[r - 1]
    return y


def put_then_wait(w):
    sess = pld.system.async_session(sync_id=1)
    ev = pld.tensor.put_async(w.data, w.nxt, w.stage, sess)
    done = pld.system.wait_async_event(ev, sess)
    assert bool(done) and done.dtype is pl.BOOL
    pld.system.notify(w.sig, w.nxt, [0], 1, op=pld.NotifyOp.AtomicAdd)


@pytest.mark.parametrize("nr", [2, 4])
def test_put_async_lands_by_its_wait(nr, backend):
    async_ring(nr, put_then_wait, backend)


@pytest.mark.parametrize("nr", [2, 4])
def test_put_async_of_a_region_from_a_plain_tensor(nr, backend):
    def body(w):
        sess = pld.system.async_session()
        half = S // 2
        ev1 = pld.tensor.put_async(w.data, w.nxt, w.x, sess, [0, 0], [0, 0], [1, half])
        ev2 = pld.tensor.put_async(w.data, w.nxt, w.x, sess, [0, half], [0, half], [1, S - half])
        pld.system.wait_async_event(ev2, sess)
        pld.system.wait_async_event(ev1, sess)
        pld.system.notify(w.sig, w.nxt, [0], 1, op=pld.NotifyOp.AtomicAdd)

    async_ring(nr, body, backend)


def test_a_notify_before_the_wait_is_a_race_the_checker_reports():
    def body(w):
        sess = pld.system.async_session()
        ev = pld.tensor.put_async(w.data, w.nxt, w.stage, sess)
        pld.system.notify(w.sig, w.nxt, [0], 1, op=pld.NotifyOp.AtomicAdd)  # the data may still be in flight
        pld.system.wait_async_event(ev, sess)

    async_ring(2, body, "sim")  # the numbers alone do not show it
    with pytest.raises(CheckError) as e:
        async_ring(2, body, "check")
    assert "race" in str(e.value) and "pld.tensor.put_async" in str(e.value)


def async_error(body, kind) -> str:
    with pytest.raises(RankError) as e:
        async_ring(2, body)
    assert isinstance(e.value.original, kind), repr(e.value.original)
    return str(e.value.original)


def test_a_kernel_that_returns_with_a_transfer_not_waited_is_refused():
    def body(w):
        sess = pld.system.async_session()
        pld.tensor.put_async(w.data, w.nxt, w.stage, sess)  # never waited
        pld.system.notify(w.sig, w.nxt, [0], 1, op=pld.NotifyOp.AtomicAdd)

    msg = async_error(body, KernelStateError)
    assert msg == (f"pld.tensor.put_async at {line_of('# never waited')}: the kernel returned before waiting for "
                   "its event (1 transfer not waited); the data may still be in flight. Call "
                   "pld.system.wait_async_event(event, session) before the kernel returns.")


def test_a_source_changed_before_the_wait_is_refused():
    def body(w):
        sess = pld.system.async_session()
        ev = pld.tensor.put_async(w.data, w.nxt, w.stage, sess)
        pl.store(pl.full([1, S], dtype=pl.FP32, value=0.0), [0, 0], w.stage)
        pld.system.wait_async_event(ev, sess)  # after the source changed

    msg = async_error(body, KernelStateError)
    assert msg.startswith(f"pld.system.wait_async_event at {line_of('# after the source changed')}: the source "
                          "window 'stage' [1, 8] FP32")
    assert msg.endswith("changed before this wait; the device may read the source until the wait returns, so the "
                        "peer could receive either version. Write the source only after the wait (or put_async a "
                        "copy).")


@pytest.mark.parametrize(("call", "kind", "text"), [
    (lambda w: pld.system.async_session(sync_id=8),  # sync_id 8
     ProgramValueError, "sync_id must be an int in [0, 7] (the device has 8 SDMA sync flags), got 8"),
    (lambda w: pld.system.async_session(block_bytes=-1),  # negative block
     ProgramValueError, "block_bytes must be an int >= 0 (the SDMA chunk size in bytes; 0 for the 1 MiB "
                        "default), got -1"),
    (lambda w: pld.tensor.put_async(w.data, w.nxt, w.stage, None),  # no session
     ProgramTypeError, "session must be the pl.AsyncSession of pld.system.async_session(), got a NoneType"),
    (lambda w: pld.system.wait_async_event(
        pld.tensor.put_async(w.data, w.nxt, w.stage, pld.system.async_session()), pld.system.async_session()),
     ProgramValueError, "the event was issued on another session (by the put_async at "),
])
def test_async_misuse_is_refused(call, kind, text):
    msg = async_error(call, kind)
    assert f" at {__file__}:{call.__code__.co_firstlineno}: {text}" in msg


def test_put_async_moves_one_flat_run():
    @pl.jit.incore
    def k(a: pl.InOut[pld.DistributedTensor[[2, S], pl.FP32]]):
        sess = pld.system.async_session()
        pld.tensor.put_async(a, 0, a, sess)  # two rows

    compiled = ir.compile(on_every_rank(k), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]),
                                                             backend="sim"))
    with pytest.raises(RankError) as e:
        compiled(np.zeros((2, 1), np.float32))
    assert isinstance(e.value.original, ProgramValueError)
    assert str(e.value.original) == (
        f"pld.tensor.put_async at {line_of('# two rows')}: what moves must be logically 1-D (every dimension but "
        "one of size 1: the SDMA engine moves one flat run), got shape [2, 8]. Move it with pld.tensor.put, or "
        "one row per put_async.")


def test_async_session_outside_a_kernel_is_refused():
    @pl.program
    class Prog:
        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host_fn(self, x: pl.Tensor[[2, 1, S], pl.FP32]):
            pld.system.async_session()  # in the host
            return x

    compiled = ir.compile(Prog, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]),
                                                 backend="sim"))
    with pytest.raises(ProgramError) as e:
        compiled(np.zeros((2, 1, S), np.float32))
    assert str(e.value) == (f"pld.system.async_session() at {line_of('# in the host')} is called in the host "
                            "orchestrator; it belongs in a kernel (@pl.jit.incore) dispatched to a rank.")


# -- the same programs under mpirun (the mpi backend) -----------------------------------------------------------

def mpi_batch(nr: int) -> list[str]:
    """What an MPI process of an ``nr``-process job runs: each family once, checked against numpy."""
    done = []
    x = data(nr, [1, S])
    y, _ = run(build(nr, [1, S], [1, S], lambda w: pld.all_reduce(w.a)), nr, x, [1, S], None)
    np.testing.assert_allclose(y, np.broadcast_to(x.sum(axis=0, dtype=np.float64), y.shape), rtol=1e-5, atol=1e-5)
    done.append("all_reduce")
    y, _ = run(build(nr, [1, S], [nr, S], lambda w: pld.all_gather(w.a, w.b)), nr, x, [nr, S], None)
    np.testing.assert_array_equal(y, np.broadcast_to(x[:, 0], y.shape))
    done.append("all_gather")
    test_comm_notify_from_the_receiver_and_a_comm_test_poll(nr, None)
    done.append("comm")
    async_ring(nr, put_then_wait, None)
    done.append("put_async")
    return done


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs an MPI launcher (mpirun) and mpi4py")
@pytest.mark.parametrize("nr", [2, 4])
def test_the_families_run_under_mpirun(nr, tmp_path):
    pytest.importorskip("mpi4py")
    env = {k: v for k, v in os.environ.items() if k != "PTODIST_BACKEND"}  # the launcher selects mpi
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    flags = ["--oversubscribe", "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo"] \
        if "Open MPI" in version or "OpenRTE" in version else []  # more ranks than cores, on loopback
    proc = subprocess.run(["mpirun", "-n", str(nr), *flags, sys.executable, __file__, str(nr), str(tmp_path)],
                          cwd=Path(__file__).parent, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for r in range(nr):
        assert (tmp_path / f"rank{r}").read_text() == "all_reduce all_gather comm put_async"


if __name__ == "__main__":  # one process of test_the_families_run_under_mpirun's job
    from mpi4py import MPI

    families = mpi_batch(int(sys.argv[1]))
    (Path(sys.argv[2]) / f"rank{MPI.COMM_WORLD.Get_rank()}").write_text(" ".join(families))
