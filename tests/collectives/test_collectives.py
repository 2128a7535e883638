"""Collectives (`pld.tensor.*`): results against numpy, self-clearing signals, and the errors for misuse.

Every collective runs at both call sites: inside a kernel with an explicit signal, and from the host
orchestrator as a builtin task between two dispatch loops (stage, collective, read back).  Every run also
reads each rank's signal window back, so every property test checks that the signals were left at zero.
The property tests run on shm, on sim, and on sim under ``ptodist check`` (no finding allowed: the
collectives are correct, so any race or stale signal the checker saw would be a false positive).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from conftest import LOCAL_BACKENDS, marker_line
from hypothesis import given, settings
from hypothesis import strategies as st

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.backends.shm import ShmBackend
from ptodist.check import explore
from ptodist.errors import ProgramError, ProgramTypeError, ProgramValueError

THIS = Path(__file__).resolve()
Sum, Max, Min, Prod = pld.ReduceOp.Sum, pld.ReduceOp.Max, pld.ReduceOp.Min, pld.ReduceOp.Prod
EPS = {"FP32": 2.0 ** -23, "FP16": 2.0 ** -10, "BF16": 2.0 ** -7}


def zeros(shape) -> list[int]:
    return [0] * len(shape)


def whole(win, shape):
    return pl.load(win, zeros(shape), list(shape))


def build(nr: int, dtype, xs, sig, *, ws=None, ys=None, sig2=None, kernel=None, host=None, read=None,
          share=False):
    """A program with data windows ``a`` (shape ``xs``), ``b`` (``ws``) and signals ``g`` (``sig``), ``h``.

    Kernel site (``kernel`` given): one dispatch loop; the kernel stages ``x`` into ``a``, calls
    ``kernel(w)`` (``w`` has ``a, b, g, h, me, n``) and reads the window it returns into ``y``.
    Host site (``host`` given): a loop stages ``x`` into ``a``, the host orchestrator calls ``host(w)``
    and a second loop reads the window it returns into ``y``.
    Either way every rank then copies its own signal window ``g`` into ``s``.  ``h`` is a second view
    (shape ``sig2``) of ``g``'s buffer; ``share`` makes ``a`` and ``b`` views of one buffer.
    """
    xs, sig = list(xs), list(sig)
    ws, ys, sig2 = list(ws or xs), list(ys or xs), list(sig2 or sig)
    read = read or (lambda win, me, n: whole(win, ys))
    data_elems = max(int(np.prod(xs)), int(np.prod(ws))) if share else int(np.prod(xs))
    sig_elems = max(int(np.prod(sig)), int(np.prod(sig2)))

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[xs, dtype], y: pl.Out[pl.Tensor[ys, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
              a: pl.InOut[pld.DistributedTensor[xs, dtype]], b: pl.InOut[pld.DistributedTensor[ws, dtype]],
              g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]], h: pl.InOut[pld.DistributedTensor[sig2, pl.INT32]]):
            ctx = pld.get_comm_ctx(a)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            pl.store(whole(x, xs), zeros(xs), a)
            res = kernel(SimpleNamespace(a=a, b=b, g=g, h=h, me=me, n=n))
            pl.store(read(res, me, n), zeros(ys), y)
            pl.store(whole(g, sig), zeros(sig), s)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[xs, dtype], y: pl.Out[pl.Tensor[ys, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
                 a: pl.InOut[pld.DistributedTensor[xs, dtype]], b: pl.InOut[pld.DistributedTensor[ws, dtype]],
                 g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]],
                 h: pl.InOut[pld.DistributedTensor[sig2, pl.INT32]]):
            return self.k(x, y, s, a, b, g, h)

        @pl.function(type=pl.FunctionType.InCore)
        def stage(self, x: pl.Tensor[xs, dtype], a: pl.InOut[pld.DistributedTensor[xs, dtype]]):
            pl.store(whole(x, xs), zeros(xs), a)

        @pl.function(type=pl.FunctionType.Orchestration)
        def pub(self, x: pl.Tensor[xs, dtype], a: pl.InOut[pld.DistributedTensor[xs, dtype]]):
            self.stage(x, a)

        @pl.function(type=pl.FunctionType.InCore)
        def out(self, y: pl.Out[pl.Tensor[ys, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
                res: pl.InOut[pld.DistributedTensor[ys, dtype]], g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]]):
            ctx = pld.get_comm_ctx(res)
            pl.store(read(res, pld.rank(ctx), pld.nranks(ctx)), zeros(ys), y)
            pl.store(whole(g, sig), zeros(sig), s)

        @pl.function(type=pl.FunctionType.Orchestration)
        def con(self, y: pl.Out[pl.Tensor[ys, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
                res: pl.InOut[pld.DistributedTensor[ys, dtype]], g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]]):
            self.out(y, s, res, g)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host_fn(self, x: pl.Tensor[[nr, *xs], dtype], y: pl.Out[pl.Tensor[[nr, *ys], dtype]],
                    s: pl.Out[pl.Tensor[[nr, *sig], pl.INT32]]):
            abuf = pld.alloc_window_buffer([data_elems], dtype=dtype)
            bbuf = abuf if share else pld.alloc_window_buffer(ws, dtype=dtype)
            gbuf = pld.alloc_window_buffer([sig_elems], dtype=pl.INT32)
            w = SimpleNamespace(a=pld.window(abuf, xs, dtype=dtype), b=pld.window(bbuf, ws, dtype=dtype),
                                g=pld.window(gbuf, sig, dtype=pl.INT32), h=pld.window(gbuf, sig2, dtype=pl.INT32),
                                me=None, n=None)
            if host is None:
                for r in pl.range(pld.world_size()):
                    self.chip(x[r], y[r], s[r], w.a, w.b, w.g, w.h, device=r)
            else:
                for r in pl.range(pld.world_size()):
                    self.pub(x[r], w.a, device=r)
                res = host(w)
                for r in pl.range(pld.world_size()):
                    self.con(y[r], s[r], res, w.g, device=r)
            return y

    return Prog


def compile_prog(prog, nr: int, backend: str | None = None):
    """Compile for ``nr`` ranks; ``backend`` "check" means sim under a ptodist check session (see :func:`call`)."""
    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))),
                       backend=None if backend == "check" else backend)
    return ir.compile(prog, config=config)


def call(compiled, *args, backend: str | None = None):
    """Call ``compiled``; under "check", the happens-before checker must find nothing (CheckError otherwise)."""
    with explore.checking(0) if backend == "check" else contextlib.nullcontext():
        return compiled(*args)


def run(prog, nr: int, x: np.ndarray, ys, sig, backend: str | None = None):
    """Compile and run ``prog`` on ``nr`` ranks (on ``backend``); return (y, s, compiled).  ``s`` starts non-zero."""
    compiled = compile_prog(prog, nr, backend)
    y = np.zeros((nr, *ys), x.dtype)
    s = np.full((nr, *sig), -7, np.int32)
    call(compiled, x, y, s, backend=backend)
    return y, s, compiled


def at_site(where: str, call, **kw):
    """``build`` keywords placing ``call(w)`` at the kernel or the host site."""
    return {where: call, **kw}


def assert_signals_clear(s: np.ndarray) -> None:
    assert not s.any(), f"signal cells left non-zero: {s}"


# -- reference values --------------------------------------------------------------------------------

def random_values(rng: np.random.Generator, dtype, shape, op=Sum) -> np.ndarray:
    """Values for ``op`` that cannot overflow ``dtype`` on 8 ranks (Prod: near 1 or small ints)."""
    if dtype.is_float:
        v = rng.uniform(0.5, 1.5, shape) if op is Prod else rng.standard_normal(shape) * 4
    elif op is Prod:
        v = rng.choice([-2, -1, 1, 2], shape)
    elif op is Sum:
        v = rng.integers(-1000, 1000, shape)
    else:
        v = rng.integers(-2 ** 31, 2 ** 31 - 1, shape)
    return np.asarray(v).astype(dtype.np_dtype)


def reduce_ref(x: np.ndarray, op) -> np.ndarray:
    """The reduction over axis 0 in float64 (or int64)."""
    x64 = x.astype(np.float64 if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16 else np.int64)
    return {Sum: np.sum, Max: np.max, Min: np.min, Prod: np.prod}[op](x64, axis=0)


def assert_reduced(got: np.ndarray, x: np.ndarray, op, dtype) -> None:
    """``got`` is the ``op``-reduction of ``x`` over ranks: exact for ints and Max/Min, else within rounding."""
    ref = reduce_ref(x, op)
    if not dtype.is_float:
        np.testing.assert_array_equal(got.astype(np.int64), ref)
        return
    got64 = got.astype(np.float64)
    if op in (Max, Min):
        np.testing.assert_array_equal(got64, ref)
        return
    # Each of the P-1 combines (and the final store) rounds once, in whichever order the algorithm uses.
    scale = np.abs(x.astype(np.float64)).sum(axis=0) if op is Sum else np.abs(ref)
    tol = 2 * x.shape[0] * EPS[dtype.name] * scale
    err = np.abs(got64 - ref)
    assert np.all(err <= tol), f"{op.name} {dtype.name}: max error {err.max()} over tolerance {tol.max()}"


# -- strategies --------------------------------------------------------------------------------------

NRS = st.sampled_from([2, 3, 4, 8])
# The sim backend must give the same results; "check" runs sim under ptodist check, which must find nothing.
BACKENDS = [*LOCAL_BACKENDS, "check"]
SEEDS = st.integers(0, 2 ** 32 - 1)


def draw_shape(data, rows=(1, 4), cols=(1, 12)) -> list[int]:
    return [data.draw(st.integers(*rows), "rows"), data.draw(st.integers(*cols), "cols")]


def draw_ring_shape(data, nr: int) -> list[int]:
    """A 2-D shape with one dimension (either) a multiple of ``nr``."""
    shape = draw_shape(data, (1, 3), (1, 5))
    shape[data.draw(st.integers(0, 1), "ring axis")] = nr * data.draw(st.integers(1, 3), "chunk")
    return shape


# -- 1. results against numpy -----------------------------------------------------------------------

ALLREDUCE_CASES = [pytest.param(where, mode, dtype, id=f"{where}-{mode}-{dtype.name}")
                   for where in ("kernel", "host") for mode in ("mesh", "ring")
                   for dtype in (pl.FP32, pl.FP16, pl.BF16, pl.INT32)
                   if not (where == "host" and mode == "ring" and dtype is not pl.FP32)]  # host ring: FP32 only
MOVE_CASES = [pytest.param(where, dtype, id=f"{where}-{dtype.name}")
              for where in ("kernel", "host") for dtype in (pl.FP32, pl.INT32)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where, mode, dtype", ALLREDUCE_CASES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_allreduce_matches_numpy(where, mode, dtype, data, backend):
    nr = data.draw(NRS, "P")
    # The host ring is Sum only.
    op = Sum if where == "host" and mode == "ring" else data.draw(st.sampled_from([Sum, Max, Min, Prod]), "op")
    xs = draw_ring_shape(data, nr) if mode == "ring" else draw_shape(data)
    core_num = 1
    if mode == "ring":
        sig, variant = [2 * (nr - 1), nr], "explicit"
    elif where == "kernel":
        sig, variant = data.draw(st.sampled_from([[nr, 1], [nr]]), "signal"), "explicit"
    else:
        variant = data.draw(st.sampled_from(["explicit", "1-D", "omitted", "lanes", "lanes omitted"]), "signal")
        sig = {"1-D": [nr], "lanes": [nr, 2], "lanes omitted": [nr, 2]}.get(variant, [nr, 1])
        core_num = 2 if variant.startswith("lanes") else 1
    x = random_values(np.random.default_rng(data.draw(SEEDS, "seed")), dtype, (nr, *xs), op)

    def call(w):
        if variant.endswith("omitted"):
            return pld.tensor.allreduce(w.a, op=op, core_num=core_num)
        return pld.tensor.allreduce(w.a, w.g, op=op, mode=mode, core_num=core_num)

    y, s, _ = run(build(nr, dtype, xs, sig, **at_site(where, call)), nr, x, xs, sig, backend=backend)
    for r in range(nr):
        assert_reduced(y[r], x, op, dtype)
        np.testing.assert_array_equal(y[r], y[0])  # every rank holds the same bits
    assert_signals_clear(s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where, dtype", MOVE_CASES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_broadcast_matches_numpy(where, dtype, data, backend):
    nr = data.draw(NRS, "P")
    root = data.draw(st.integers(0, nr - 1), "root")
    sig = data.draw(st.sampled_from([[nr, 1], [nr]]), "signal")
    xs = draw_shape(data)
    x = random_values(np.random.default_rng(data.draw(SEEDS, "seed")), dtype, (nr, *xs), Max)

    def call(w):
        return pld.tensor.broadcast(w.a, w.g, root=root)

    y, s, _ = run(build(nr, dtype, xs, sig, **at_site(where, call)), nr, x, xs, sig, backend=backend)
    np.testing.assert_array_equal(y, np.broadcast_to(x[root], y.shape))
    assert_signals_clear(s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where, dtype", MOVE_CASES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_allgather_matches_numpy(where, dtype, data, backend):
    nr = data.draw(NRS, "P")
    stacked = data.draw(st.booleans(), "target [NR, *local]")
    # In a kernel the local data may also be a tile; from the host it is a window.
    as_tile = where == "kernel" and data.draw(st.booleans(), "local is a tile")
    xs = draw_shape(data)
    ws = [nr, *xs] if stacked else [nr * xs[0], xs[1]]
    x = random_values(np.random.default_rng(data.draw(SEEDS, "seed")), dtype, (nr, *xs), Max)

    def call(w):
        local = whole(w.a, xs) if as_tile else w.a
        return pld.tensor.allgather(local, w.b, w.g)

    y, s, _ = run(build(nr, dtype, xs, [nr, 1], ws=ws, ys=ws, **at_site(where, call)), nr, x, ws, [nr, 1], backend=backend)
    want = x if stacked else x.reshape(ws)
    np.testing.assert_array_equal(y, np.broadcast_to(want, y.shape))
    assert_signals_clear(s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where, dtype", MOVE_CASES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_reduce_scatter_matches_numpy(where, dtype, data, backend):
    nr = data.draw(NRS, "P")
    rows, cols = draw_shape(data, (1, 3), (1, 8))
    xs = [nr * rows, cols]
    x = random_values(np.random.default_rng(data.draw(SEEDS, "seed")), dtype, (nr, *xs), Sum)

    def call(w):
        return pld.tensor.reduce_scatter(w.a, w.g, op=Sum)

    y, s, _ = run(build(nr, dtype, xs, [nr, 1], **at_site(where, call)), nr, x, xs, [nr, 1], backend=backend)
    for r in range(nr):
        block = slice(r * rows, (r + 1) * rows)
        assert_reduced(y[r, block], x[:, block], Sum, dtype)
        y[r, block] = x[r, block]
    np.testing.assert_array_equal(y, x)  # the other row blocks are unchanged
    assert_signals_clear(s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where, dtype", MOVE_CASES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_all_to_all_matches_numpy(where, dtype, data, backend):
    nr = data.draw(NRS, "P")
    rows, cols = draw_shape(data, (1, 3), (1, 8))
    xs = [nr * rows, cols]
    x = random_values(np.random.default_rng(data.draw(SEEDS, "seed")), dtype, (nr, *xs), Max)

    def call(w):
        return pld.tensor.all_to_all(w.a, w.b, w.g)

    y, s, _ = run(build(nr, dtype, xs, [nr, 1], ws=xs, ys=xs, **at_site(where, call)), nr, x, xs, [nr, 1], backend=backend)
    blocks = x.reshape(nr, nr, rows, cols)  # [sender, block, rows, cols]
    np.testing.assert_array_equal(y.reshape(nr, nr, rows, cols), blocks.transpose(1, 0, 2, 3))
    assert_signals_clear(s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where, dtype", MOVE_CASES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_all_to_all_v_matches_numpy(where, dtype, data, backend):
    nr = data.draw(NRS, "P")
    rows, cols = draw_shape(data, (1, 3), (1, 8))
    xs = [nr * rows, cols]
    rng = np.random.default_rng(data.draw(SEEDS, "seed"))
    counts = rng.integers(0, rows + 1, (nr, nr))  # counts[src, dst]: rows src sends to dst
    as_array = data.draw(st.booleans(), "counts as an array")
    send, recv = (counts, counts.T.copy()) if as_array else (counts.tolist(), counts.T.tolist())
    x = random_values(rng, dtype, (nr, *xs), Max)

    def call(w):
        return pld.tensor.all_to_all_v(w.a, w.b, w.g, send, recv)

    y, s, _ = run(build(nr, dtype, xs, [nr, 1], ws=xs, ys=xs, **at_site(where, call)), nr, x, xs, [nr, 1], backend=backend)
    want = np.zeros_like(y).reshape(nr, nr, rows, cols)  # [receiver, sender, rows, cols]
    blocks = x.reshape(nr, nr, rows, cols)
    for src in range(nr):
        for dst in range(nr):
            c = counts[src, dst]
            want[dst, src, :c] = blocks[src, dst, :c]
    np.testing.assert_array_equal(y.reshape(nr, nr, rows, cols), want)
    assert_signals_clear(s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["kernel", "host"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_barrier_orders_a_neighbour_read(where, data, backend):
    # Each rank stages its row, crosses the barrier(s), then reads its right neighbour's window.
    nr = data.draw(NRS, "P")
    reps = data.draw(st.integers(1, 3), "barriers")
    sig = data.draw(st.sampled_from([[nr, 1], [nr]]), "signal")
    xs = draw_shape(data)
    x = random_values(np.random.default_rng(data.draw(SEEDS, "seed")), pl.FP32, (nr, *xs))

    def call(w):
        for _ in range(reps):
            pld.tensor.barrier(w.g)
        return w.a

    def read(win, me, n):
        return pld.tile.remote_load(win, (me + 1) % n, zeros(xs), xs)

    y, s, _ = run(build(nr, pl.FP32, xs, sig, read=read, **at_site(where, call)), nr, x, xs, sig, backend=backend)
    np.testing.assert_array_equal(y, np.roll(x, -1, axis=0))
    assert_signals_clear(s)


# -- 2. self-clearing: one signal window reused back to back ---------------------------------------

def chain_program(nr: int, where: str):
    """allreduce x3 (mesh) and x2 (ring) on two signal windows, then barrier, broadcast, allgather, barrier.

    Between steps every rank adds its own x again, so each collective sees rank-dependent data.
    Rank r ends with b[p] = P^4 * sum(x) + x[P-1] + x[p] and both signals read back.
    """
    xs, ws, gs, qs = [2, 2 * nr], [nr, 2, 2 * nr], [nr, 1], [2 * (nr - 1), nr]
    f32, i32 = pl.FP32, pl.INT32
    root = nr - 1

    def add_own(x, a):
        pl.store(pl.add(whole(a, xs), whole(x, xs)), zeros(xs), a)

    @pl.program
    class Chain:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[xs, f32], y: pl.Out[pl.Tensor[ws, f32]], sg: pl.Out[pl.Tensor[gs, i32]],
              sq: pl.Out[pl.Tensor[qs, i32]], a: pl.InOut[pld.DistributedTensor[xs, f32]],
              b: pl.InOut[pld.DistributedTensor[ws, f32]], g: pl.InOut[pld.DistributedTensor[gs, i32]],
              q: pl.InOut[pld.DistributedTensor[qs, i32]]):
            pl.store(whole(x, xs), zeros(xs), a)
            for _ in range(3):
                a = pld.tensor.allreduce(a, g)
            for _ in range(2):
                a = pld.tensor.allreduce(a, q, mode="ring")
            add_own(x, a)
            pld.tensor.barrier(g)
            a = pld.tensor.broadcast(a, g, root=root)
            add_own(x, a)
            b = pld.tensor.allgather(a, b, g)
            pld.tensor.barrier(g)
            pl.store(whole(b, ws), zeros(ws), y)
            pl.store(whole(g, gs), zeros(gs), sg)
            pl.store(whole(q, qs), zeros(qs), sq)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[xs, f32], y: pl.Out[pl.Tensor[ws, f32]], sg: pl.Out[pl.Tensor[gs, i32]],
                 sq: pl.Out[pl.Tensor[qs, i32]], a: pl.InOut[pld.DistributedTensor[xs, f32]],
                 b: pl.InOut[pld.DistributedTensor[ws, f32]], g: pl.InOut[pld.DistributedTensor[gs, i32]],
                 q: pl.InOut[pld.DistributedTensor[qs, i32]]):
            self.k(x, y, sg, sq, a, b, g, q)

        @pl.function(type=pl.FunctionType.InCore)
        def mix_k(self, x: pl.Tensor[xs, f32], a: pl.InOut[pld.DistributedTensor[xs, f32]]):
            add_own(x, a)

        @pl.function(type=pl.FunctionType.Orchestration)
        def mix(self, x: pl.Tensor[xs, f32], a: pl.InOut[pld.DistributedTensor[xs, f32]]):
            self.mix_k(x, a)

        @pl.function(type=pl.FunctionType.InCore)
        def out_k(self, y: pl.Out[pl.Tensor[ws, f32]], sg: pl.Out[pl.Tensor[gs, i32]],
                  sq: pl.Out[pl.Tensor[qs, i32]], b: pl.InOut[pld.DistributedTensor[ws, f32]],
                  g: pl.InOut[pld.DistributedTensor[gs, i32]], q: pl.InOut[pld.DistributedTensor[qs, i32]]):
            pl.store(whole(b, ws), zeros(ws), y)
            pl.store(whole(g, gs), zeros(gs), sg)
            pl.store(whole(q, qs), zeros(qs), sq)

        @pl.function(type=pl.FunctionType.Orchestration)
        def out(self, y: pl.Out[pl.Tensor[ws, f32]], sg: pl.Out[pl.Tensor[gs, i32]],
                sq: pl.Out[pl.Tensor[qs, i32]], b: pl.InOut[pld.DistributedTensor[ws, f32]],
                g: pl.InOut[pld.DistributedTensor[gs, i32]], q: pl.InOut[pld.DistributedTensor[qs, i32]]):
            self.out_k(y, sg, sq, b, g, q)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, *xs], f32], y: pl.Out[pl.Tensor[[nr, *ws], f32]],
                 sg: pl.Out[pl.Tensor[[nr, *gs], i32]], sq: pl.Out[pl.Tensor[[nr, *qs], i32]]):
            abuf = pld.alloc_window_buffer(xs, dtype=f32)
            bbuf = pld.alloc_window_buffer(ws, dtype=f32)
            gbuf = pld.alloc_window_buffer(gs, dtype=i32)
            qbuf = pld.alloc_window_buffer(qs, dtype=i32)
            a, b = pld.window(abuf, xs, dtype=f32), pld.window(bbuf, ws, dtype=f32)
            g, q = pld.window(gbuf, gs, dtype=i32), pld.window(qbuf, qs, dtype=i32)
            if where == "kernel":
                for r in pl.range(pld.world_size()):
                    self.chip(x[r], y[r], sg[r], sq[r], a, b, g, q, device=r)
                return y
            for r in pl.range(pld.world_size()):
                self.mix(x[r], a, device=r)  # a starts at zero
            a = pld.tensor.allreduce(a, g)
            a = pld.tensor.allreduce(a, g)
            a = pld.tensor.allreduce(a, g)
            a = pld.tensor.allreduce(a, q, mode="ring")
            a = pld.tensor.allreduce(a, q, mode="ring")
            for r in pl.range(pld.world_size()):
                self.mix(x[r], a, device=r)
            pld.tensor.barrier(g)
            a = pld.tensor.broadcast(a, g, root=root)
            for r in pl.range(pld.world_size()):
                self.mix(x[r], a, device=r)
            b = pld.tensor.allgather(a, b, g)
            pld.tensor.barrier(g)
            for r in pl.range(pld.world_size()):
                self.out(y[r], sg[r], sq[r], b, g, q, device=r)
            return y

    return Chain, xs, ws, gs, qs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["kernel", "host"])
@pytest.mark.parametrize("nr", [2, 3, 4, 8])
def test_reused_signals_give_correct_results_and_end_clear(nr, where, backend):
    prog, xs, ws, gs, qs = chain_program(nr, where)
    x = np.random.default_rng(nr).integers(-3, 4, (nr, *xs)).astype(np.float32)
    y = np.zeros((nr, *ws), np.float32)
    sg, sq = np.full((nr, *gs), -7, np.int32), np.full((nr, *qs), -7, np.int32)
    call(compile_prog(prog, nr, backend), x, y, sg, sq, backend=backend)
    gathered = nr ** 4 * x.sum(axis=0) + x[nr - 1] + x  # [P, *xs]: slot p on every rank
    np.testing.assert_array_equal(y, np.broadcast_to(gathered, y.shape))
    assert_signals_clear(sg)
    assert_signals_clear(sq)


# -- 3. validation errors ----------------------------------------------------------------------------
# Each faulty call carries a `# @name` marker so the expected call site (file:line) can be asserted.

def line_of(marker: str) -> int:
    return marker_line(THIS, marker)


def site(marker: str) -> str:
    return f"{THIS}:{line_of(marker)}"


def ring_on_mesh_signal(w):
    return pld.tensor.allreduce(w.a, w.g, mode="ring")  # @ring_on_mesh_signal


def mesh_on_ring_signal(w):
    return pld.tensor.allreduce(w.a, w.g)  # @mesh_on_ring_signal


def ring_max(w):
    return pld.tensor.allreduce(w.a, w.g, mode="ring", op=Max)  # @ring_max


def ring_fp16(w):
    return pld.tensor.allreduce(w.a, w.g, mode="ring")  # @ring_fp16


def root_scalar(w):
    root = w.me if w.me is not None else pld.world_size() - 1  # a Scalar at both sites
    return pld.tensor.broadcast(w.a, w.g, root=root)  # @root_scalar


def root_float(w):
    return pld.tensor.broadcast(w.a, w.g, root=1.0)  # @root_float


def root_out_of_range(w):
    return pld.tensor.broadcast(w.a, w.g, root=4)  # @root_out_of_range


def root_negative(w):
    return pld.tensor.broadcast(w.a, w.g, root=-1)  # @root_negative


def allgather_same_window(w):
    return pld.tensor.allgather(w.a, w.b, w.g)  # @allgather_same_window


def all_to_all_same_window(w):
    return pld.tensor.all_to_all(w.a, w.b, w.g)  # @all_to_all_same_window


def all_to_all_v_same_window(w):
    return pld.tensor.all_to_all_v(w.a, w.b, w.g, [1, 1], [1, 1])  # @all_to_all_v_same_window


def reduce_scatter_max(w):
    return pld.tensor.reduce_scatter(w.a, w.g, op=Max)  # @reduce_scatter_max


def mesh_then_ring(w):
    a = pld.tensor.allreduce(w.a, w.g)  # @mesh_first
    return pld.tensor.allreduce(a, w.h, mode="ring")  # @ring_second


def barrier_then_ring(w):
    pld.tensor.barrier(w.g)  # @barrier_first
    return pld.tensor.allreduce(w.a, w.h, mode="ring")  # @ring_after_barrier


def ring_then_mesh(w):
    a = pld.tensor.allreduce(w.a, w.h, mode="ring")  # @ring_first
    return pld.tensor.broadcast(a, w.g, root=0)  # @mesh_second


def lanes_in_ring(w):
    return pld.tensor.allreduce(w.a, w.g, mode="ring", core_num=2)  # @lanes_in_ring


def lanes_in_kernel(w):
    return pld.tensor.allreduce(w.a, w.g, core_num=2)  # @lanes_in_kernel


def lanes_in_kernel_mesh_signal(w):
    return pld.tensor.allreduce(w.a, w.g, core_num=2)  # @lanes_in_kernel_mesh_signal


def lanes_signal_too_narrow(w):
    return pld.tensor.allreduce(w.a, w.g, core_num=2)  # @lanes_signal_too_narrow


def lanes_not_an_int(w):
    return pld.tensor.allreduce(w.a, core_num="2")  # @lanes_not_an_int


def allgather_no_slot(w):
    return pld.tensor.allgather(w.a, w.b, w.g)  # @allgather_no_slot


def signal_as_target(w):
    return pld.tensor.allreduce(w.g, w.g)  # @signal_as_target


def counts_wrong_length(w):
    return pld.tensor.all_to_all_v(w.a, w.b, w.g, [1, 1, 1], [1, 1])  # @counts_wrong_length


def counts_too_large(w):
    return pld.tensor.all_to_all_v(w.a, w.b, w.g, [[1, 1], [1, 1]], [[1, 2], [1, 1]])  # @counts_too_large


def int64_allreduce(w):
    return pld.tensor.allreduce(w.a, w.g)  # @int64_allreduce


def no_signal_in_kernel(w):
    return pld.tensor.allreduce(w.a)  # @no_signal_in_kernel


E = SimpleNamespace
CASES = {  # name: (sites, P, dtype, xs, signal, build keywords, call, exception, message parts)
    "ring signal [NR,1]": E(sites="kernel host", nr=4, dtype=pl.FP32, xs=[2, 8], sig=[4, 1], kw={},
                            call=ring_on_mesh_signal, exc=ProgramValueError,
                            parts=["pld.tensor.allreduce at @ring_on_mesh_signal",
                                   "mode='ring' needs a signal of shape [2*(NR-1), NR] = [6, 4]",
                                   "window 'gbuf' [4, 1] INT32 has [4, 1]", "A [NR, 1] signal is the mesh layout"]),
    "mesh signal [2(NR-1),NR]": E(sites="kernel host", nr=4, dtype=pl.FP32, xs=[2, 8], sig=[6, 4], kw={},
                                  call=mesh_on_ring_signal, exc=ProgramValueError,
                                  parts=["pld.tensor.allreduce at @mesh_on_ring_signal",
                                         "mesh signals have shape [NR, 1] = [4, 1] (or [4])",
                                         "window 'gbuf' [6, 4] INT32 has [6, 4]",
                                         "That is the ring layout; pass mode='ring' or a [NR, 1] signal"]),
    "host ring Max": E(sites="host", nr=2, dtype=pl.FP32, xs=[2, 4], sig=[2, 2], kw={}, call=ring_max,
                       exc=ProgramValueError,
                       parts=["pld.tensor.allreduce at @ring_max",
                              "the host orchestrator's ring allreduce supports op=Sum on FP32 only (got Max on FP32)",
                              "use mode='mesh'"]),
    "host ring FP16": E(sites="host", nr=3, dtype=pl.FP16, xs=[2, 3], sig=[4, 3], kw={}, call=ring_fp16,
                        exc=ProgramValueError,
                        parts=["pld.tensor.allreduce at @ring_fp16", "supports op=Sum on FP32 only (got Sum on FP16)",
                               "use mode='mesh'"]),
    "root a Scalar": E(sites="kernel host", nr=2, dtype=pl.FP32, xs=[1, 4], sig=[2, 1], kw={}, call=root_scalar,
                       exc=ProgramTypeError,
                       parts=["pld.tensor.broadcast at @root_scalar",
                              "root= must be a Python int (a rank index known when the program is built)",
                              "(Scalar)"]),
    "root a float": E(sites="kernel host", nr=2, dtype=pl.FP32, xs=[1, 4], sig=[2, 1], kw={}, call=root_float,
                      exc=ProgramTypeError,
                      parts=["pld.tensor.broadcast at @root_float", "root= must be a Python int", "got 1.0 (float)"]),
    "root out of range": E(sites="kernel host", nr=4, dtype=pl.FP32, xs=[1, 4], sig=[4, 1], kw={},
                           call=root_out_of_range, exc=ProgramValueError,
                           parts=["pld.tensor.broadcast at @root_out_of_range", "root=4 is outside [0, 4)"]),
    "root negative": E(sites="kernel host", nr=4, dtype=pl.FP32, xs=[1, 4], sig=[4, 1], kw={},
                       call=root_negative, exc=ProgramValueError,
                       parts=["pld.tensor.broadcast at @root_negative", "root=-1 is outside [0, 4)"]),
    "allgather in place": E(sites="kernel host", nr=2, dtype=pl.FP32, xs=[2, 3], sig=[2, 1],
                            kw={"ws": [2, 2, 3], "ys": [2, 2, 3], "share": True}, call=allgather_same_window,
                            exc=ProgramValueError,
                            parts=["pld.tensor.allgather at @allgather_same_window",
                                   "local data and target are the same window buffer 'abuf'",
                                   "Use separate windows."]),
    "all_to_all in place": E(sites="kernel host", nr=2, dtype=pl.INT32, xs=[2, 3], sig=[2, 1], kw={"share": True},
                             call=all_to_all_same_window, exc=ProgramValueError,
                             parts=["pld.tensor.all_to_all at @all_to_all_same_window",
                                    "input and target are the same window buffer 'abuf'", "Use separate windows."]),
    "all_to_all_v in place": E(sites="kernel host", nr=2, dtype=pl.INT32, xs=[2, 3], sig=[2, 1],
                               kw={"share": True}, call=all_to_all_v_same_window, exc=ProgramValueError,
                               parts=["pld.tensor.all_to_all_v at @all_to_all_v_same_window",
                                      "input and target are the same window buffer 'abuf'",
                                      "Use separate windows."]),
    "reduce_scatter Max": E(sites="kernel host", nr=2, dtype=pl.FP32, xs=[2, 3], sig=[2, 1], kw={},
                            call=reduce_scatter_max, exc=ProgramValueError,
                            parts=["pld.tensor.reduce_scatter at @reduce_scatter_max",
                                   "reduce_scatter supports op=pld.ReduceOp.Sum only, got Max"]),
    "mesh then ring on one signal": E(sites="kernel host", nr=3, dtype=pl.FP32, xs=[1, 3], sig=[3, 1],
                                      kw={"sig2": [4, 3]}, call=mesh_then_ring, exc=ProgramValueError,
                                      parts=["pld.tensor.allreduce at @ring_second",
                                             "signal window buffer 'gbuf' is used with the ring layout [4, 3]",
                                             "but pld.tensor.allreduce at @mesh_first used it with the mesh "
                                             "layout [3, 1]",
                                             "give each layout its own signal window"]),
    "barrier then ring on one signal": E(sites="kernel host", nr=2, dtype=pl.FP32, xs=[1, 4], sig=[2, 1],
                                         kw={"sig2": [2, 2]}, call=barrier_then_ring, exc=ProgramValueError,
                                         parts=["pld.tensor.allreduce at @ring_after_barrier",
                                                "is used with the ring layout [2, 2]",
                                                "but pld.tensor.barrier at @barrier_first used it with the mesh "
                                                "layout [2, 1]"]),
    "ring then broadcast on one signal": E(sites="kernel host", nr=4, dtype=pl.FP32, xs=[1, 4], sig=[4, 1],
                                           kw={"sig2": [6, 4]}, call=ring_then_mesh, exc=ProgramValueError,
                                           parts=["pld.tensor.broadcast at @mesh_second",
                                                  "is used with the mesh layout [4, 1]",
                                                  "but pld.tensor.allreduce at @ring_first used it with the ring "
                                                  "layout [6, 4]"]),
    "core_num with ring": E(sites="kernel host", nr=2, dtype=pl.FP32, xs=[1, 4], sig=[2, 2], kw={},
                            call=lanes_in_ring, exc=ProgramValueError,
                            parts=["pld.tensor.allreduce at @lanes_in_ring",
                                   "core_num > 1 is available only for the host orchestrator's mesh allreduce"]),
    "core_num in a kernel": E(sites="kernel", nr=3, dtype=pl.FP32, xs=[1, 4], sig=[3, 2], kw={},
                              call=lanes_in_kernel, exc=ProgramValueError,
                              parts=["pld.tensor.allreduce at @lanes_in_kernel",
                                     "core_num > 1 is available only for the host orchestrator's mesh allreduce"]),
    # core_num is checked before the signal: in a kernel the natural [NR, 1] signal must not hide that rule.
    "core_num in a kernel, [NR,1] signal": E(sites="kernel", nr=3, dtype=pl.FP32, xs=[1, 4], sig=[3, 1], kw={},
                                             call=lanes_in_kernel_mesh_signal, exc=ProgramValueError,
                                             parts=["pld.tensor.allreduce at @lanes_in_kernel_mesh_signal",
                                                    "core_num > 1 is available only for the host orchestrator's "
                                                    "mesh allreduce"]),
    "core_num=2 with a [NR,1] signal": E(sites="host", nr=3, dtype=pl.FP32, xs=[1, 4], sig=[3, 1], kw={},
                                         call=lanes_signal_too_narrow, exc=ProgramValueError,
                                         parts=["pld.tensor.allreduce at @lanes_signal_too_narrow",
                                                "mesh signals have shape [NR, core_num] = [3, 2] (one column per "
                                                "lane), but window 'gbuf' [3, 1] INT32 has [3, 1]"]),
    "core_num not an int": E(sites="host", nr=2, dtype=pl.FP32, xs=[1, 4], sig=[2, 1], kw={},
                             call=lanes_not_an_int, exc=ProgramValueError,
                             parts=["pld.tensor.allreduce at @lanes_not_an_int",
                                    "core_num= must be an int >= 1, got '2'"]),
    "allgather target without a slot per rank": E(sites="kernel host", nr=2, dtype=pl.FP32, xs=[1, 8],
                                                  sig=[2, 1], kw={"ws": [3, 8], "ys": [3, 8]},
                                                  call=allgather_no_slot, exc=ProgramValueError,
                                                  parts=["pld.tensor.allgather at @allgather_no_slot",
                                                         "the target needs one slot per rank for the local data "
                                                         "[1, 8]: shape [2, 1, 8] or [2, 8]",
                                                         "window 'bbuf' [3, 8] FP32 has [3, 8]"]),
    "the signal as the target": E(sites="kernel host", nr=2, dtype=pl.INT32, xs=[2, 1], sig=[2, 1], kw={},
                                  call=signal_as_target, exc=ProgramValueError,
                                  parts=["pld.tensor.allreduce at @signal_as_target",
                                         "the signal and the target are the same window buffer 'gbuf'",
                                         "Give the signal its own INT32 window."]),
    "all_to_all_v counts of the wrong length": E(sites="kernel host", nr=2, dtype=pl.INT32, xs=[2, 3], sig=[2, 1],
                                                 kw={}, call=counts_wrong_length, exc=ProgramValueError,
                                                 parts=["pld.tensor.all_to_all_v at @counts_wrong_length",
                                                        "send_counts must hold one count per rank, as [2] (this "
                                                        "rank's) or [2, 2] (row r for rank r), got shape [3]"]),
    "all_to_all_v counts beyond the block": E(sites="kernel host", nr=2, dtype=pl.INT32, xs=[2, 3], sig=[2, 1],
                                              kw={}, call=counts_too_large, exc=ProgramValueError,
                                              parts=["pld.tensor.all_to_all_v at @counts_too_large",
                                                     "recv_counts [[1, 2], [1, 1]] must be integers in [0, 1] (rows per "
                                                     "block)"]),
    "allreduce on INT64": E(sites="kernel host", nr=2, dtype=pl.INT64, xs=[2, 4], sig=[2, 1], kw={},
                            call=int64_allreduce, exc=ProgramTypeError,
                            parts=["pld.tensor.allreduce at @int64_allreduce",
                                   "allreduce supports FP32, FP16, BF16, INT32",
                                   "window 'abuf' [2, 4] INT64 is INT64"]),
    "kernel allreduce without signal": E(sites="kernel", nr=2, dtype=pl.FP32, xs=[1, 4], sig=[2, 1], kw={},
                                         call=no_signal_in_kernel, exc=ProgramError,
                                         parts=["pld.tensor.allreduce at @no_signal_in_kernel",
                                                "inside a kernel the signal is required",
                                                "(a [NR, 1] INT32 window for mesh, [2*(NR-1), NR] for ring)",
                                                "only the host orchestrator may omit it"]),
}
ERROR_CASES = [pytest.param(name, where, id=f"{where}: {name}")
               for name, case in CASES.items() for where in case.sites.split()]


def expand(part: str) -> str:
    """Replace ``@marker`` by the marker's file:line."""
    words = [site(word[1:]) if word.startswith("@") else word for word in part.split(" ")]
    return " ".join(words)


def forbid_ranks(monkeypatch) -> None:
    """Fail the test if any rank is started: host-level errors must come from planning."""

    def started(*args, **kwargs):
        raise AssertionError("ShmBackend.run was called: the error should have come before any rank started")

    monkeypatch.setattr(ShmBackend, "run", started)


@pytest.mark.parametrize("name, where", ERROR_CASES)
def test_misuse_is_rejected_with_site_cause_and_fix(name, where, monkeypatch):
    case = CASES[name]
    prog = build(case.nr, case.dtype, case.xs, case.sig, **at_site(where, case.call, **case.kw))
    ys = case.kw.get("ys", case.xs)
    x = np.zeros((case.nr, *case.xs), case.dtype.np_dtype)
    if where == "host":
        forbid_ranks(monkeypatch)
        with pytest.raises(case.exc) as info:
            run(prog, case.nr, x, ys, case.sig)
        err = info.value
    else:
        with pytest.raises(RankError) as info:
            run(prog, case.nr, x, ys, case.sig)
        assert isinstance(info.value.original, case.exc), info.value
        assert {f.rank for f in info.value.failures} == set(range(case.nr))  # every rank, the same way
        err = info.value.original
    for part in case.parts:
        assert expand(part) in str(err), f"{expand(part)!r} not in:\n{err}"


def looped_program(nr: int, loop: str):
    """Host allreduce in a loop: without a signal (``for``/``while``) or with an explicit one (``signal``)."""
    xs = [1, 4]

    @pl.program
    class Looped:
        @pl.function(type=pl.FunctionType.InCore)
        def stage(self, x: pl.Tensor[xs, pl.FP32], a: pl.InOut[pld.DistributedTensor[xs, pl.FP32]]):
            pl.store(whole(x, xs), zeros(xs), a)

        @pl.function(type=pl.FunctionType.Orchestration)
        def pub(self, x: pl.Tensor[xs, pl.FP32], a: pl.InOut[pld.DistributedTensor[xs, pl.FP32]]):
            self.stage(x, a)

        @pl.function(type=pl.FunctionType.InCore)
        def out_k(self, y: pl.Out[pl.Tensor[xs, pl.FP32]], a: pl.InOut[pld.DistributedTensor[xs, pl.FP32]]):
            pl.store(whole(a, xs), zeros(xs), y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def out(self, y: pl.Out[pl.Tensor[xs, pl.FP32]], a: pl.InOut[pld.DistributedTensor[xs, pl.FP32]]):
            self.out_k(y, a)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, *xs], pl.FP32], y: pl.Out[pl.Tensor[[nr, *xs], pl.FP32]]):
            abuf = pld.alloc_window_buffer(xs, dtype=pl.FP32)
            sbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            a = pld.window(abuf, xs, dtype=pl.FP32)
            for r in pl.range(pld.world_size()):
                self.pub(x[r], a, device=r)
            if loop == "for":
                for _ in pl.range(2):  # @for_loop
                    a = pld.tensor.allreduce(a)  # @allreduce_in_for
            elif loop == "while":
                i = 0
                while i < 2:  # @while_loop
                    a = pld.tensor.allreduce(a, op=pld.ReduceOp.Max)  # @allreduce_in_while
                    i += 1
            else:
                for _ in pl.range(2):
                    a = pld.tensor.allreduce(a, pld.window(sbuf, [nr, 1], dtype=pl.INT32))
            for r in pl.range(pld.world_size()):
                self.out(y[r], a, device=r)
            return y

    return Looped


@pytest.mark.parametrize("loop, call", [("for", "allreduce_in_for"), ("while", "allreduce_in_while")])
def test_host_allreduce_without_signal_in_a_loop_is_rejected(loop, call, monkeypatch):
    forbid_ranks(monkeypatch)
    with pytest.raises(ProgramError) as info:
        compile_prog(looped_program(2, loop), 2)(np.zeros((2, 1, 4), np.float32))
    msg = str(info.value)
    assert f"pld.tensor.allreduce at {site(call)}: called without a signal inside a loop" in msg
    assert f"(the loop at {__file__}:{line_of(loop + '_loop')})" in msg
    assert "Pass an explicit signal window" in msg and "hoist the allreduce out of the loop" in msg


def test_host_allreduce_without_signal_in_a_helpers_loop_is_rejected(monkeypatch):
    # The loop is in a helper the host calls, not in the host function itself.
    forbid_ranks(monkeypatch)

    def twice(data):
        for _ in range(2):
            data = pld.tensor.allreduce(data)
        return data

    @pl.program
    class Helper:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[[1, 4], pl.FP32], d: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
            pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], d)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, 4], pl.FP32], d: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
            self.k(x, d)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[2, 1, 4], pl.FP32]):
            buf = pld.alloc_window_buffer([1, 4], dtype=pl.FP32)
            for r in pl.range(pld.world_size()):
                self.chip(x[r], pld.window(buf, [1, 4], dtype=pl.FP32), device=r)
            twice(pld.window(buf, [1, 4], dtype=pl.FP32))

    with pytest.raises(ProgramError, match=r"called without a signal inside a loop \(the loop at .*test_collectives"):
        compile_prog(Helper, 2)(np.zeros((2, 1, 4), np.float32))


def test_host_allreduce_with_a_signal_in_a_loop_runs(backend):
    x = np.random.default_rng(1).integers(-5, 6, (3, 1, 4)).astype(np.float32)
    y = compile_prog(looped_program(3, "signal"), 3, backend)(x)
    np.testing.assert_array_equal(y, np.broadcast_to(3 * x.sum(axis=0), y.shape))


# -- 4. the dispatch plan ----------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["omitted", "explicit", "lanes", "ring"])
def test_host_builtin_is_a_task_on_every_rank_in_the_plan(variant, backend):
    nr = 3
    sig = {"ring": [2 * (nr - 1), nr], "lanes": [nr, 2]}.get(variant, [nr, 1])
    xs = [2, 6]

    def call(w):
        if variant == "omitted":
            return pld.tensor.allreduce(w.a, op=Max)  # @plan_allreduce
        if variant == "ring":
            return pld.tensor.allreduce(w.a, w.g, mode="ring")
        return pld.tensor.allreduce(w.a, w.g, core_num=2 if variant == "lanes" else 1)

    x = np.random.default_rng(2).integers(-5, 6, (nr, *xs)).astype(np.float32)
    y, s, compiled = run(build(nr, pl.FP32, xs, sig, host=call), nr, x, xs, sig, backend=backend)
    assert_reduced(y[0], x, Max if variant == "omitted" else Sum, pl.FP32)
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert plan["world_size"] == nr and len(plan["ranks"]) == nr
    seqs = set()
    for r, rank in enumerate(plan["ranks"]):
        assert rank["rank"] == r
        names = [t["function"] for t in rank["tasks"]]
        assert names == ["pub", "pld.tensor.allreduce", "con"]  # stage, builtin, read back: in order
        task = rank["tasks"][1]
        assert task["builtin"] is True
        assert "test_collectives.py:" in task["dispatched_at"]
        assert task["options"] == {"op": "Max" if variant == "omitted" else None,
                                   "mode": "ring" if variant == "ring" else "mesh",
                                   "core_num": 2 if variant == "lanes" else 1}
        target, signal = task["args"]
        assert target == {"kind": "window", "buffer": "abuf", "shape": xs, "dtype": "FP32"}
        if variant == "omitted":
            assert signal["buffer"] == f"allreduce_signal@test_collectives.py:{line_of('plan_allreduce')}"
            assert signal["shape"] == [nr, 1] and signal["dtype"] == "INT32"
        else:
            assert signal == {"kind": "window", "buffer": "gbuf", "shape": sig, "dtype": "INT32"}
        seqs.add(task["seq"])
    assert len(seqs) == 1, "the builtin is one call, planned once for every rank"
    if variant == "omitted":  # the synthesised signal window is allocated like any other
        assert any(w["name"].startswith("allreduce_signal@") and w["nbytes"] == nr * 4 for w in plan["windows"])


def counts_program(nr: int, rows: int, cols: int):
    """Host all_to_all_v whose counts are a host tensor [NR, NR] (row r: what rank r sends)."""
    xs = [nr * rows, cols]
    i32 = pl.INT32

    @pl.program
    class Counts:
        @pl.function(type=pl.FunctionType.InCore)
        def stage(self, x: pl.Tensor[xs, i32], a: pl.InOut[pld.DistributedTensor[xs, i32]]):
            pl.store(whole(x, xs), zeros(xs), a)

        @pl.function(type=pl.FunctionType.Orchestration)
        def pub(self, x: pl.Tensor[xs, i32], a: pl.InOut[pld.DistributedTensor[xs, i32]]):
            self.stage(x, a)

        @pl.function(type=pl.FunctionType.InCore)
        def out_k(self, y: pl.Out[pl.Tensor[xs, i32]], b: pl.InOut[pld.DistributedTensor[xs, i32]]):
            pl.store(whole(b, xs), zeros(xs), y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def out(self, y: pl.Out[pl.Tensor[xs, i32]], b: pl.InOut[pld.DistributedTensor[xs, i32]]):
            self.out_k(y, b)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, *xs], i32], send: pl.Tensor[[nr, nr], i32],
                 recv: pl.Tensor[[nr, nr], i32], y: pl.Out[pl.Tensor[[nr, *xs], i32]]):
            abuf = pld.alloc_window_buffer(xs, dtype=i32)
            bbuf = pld.alloc_window_buffer(xs, dtype=i32)
            gbuf = pld.alloc_window_buffer([nr, 1], dtype=i32)
            a, b = pld.window(abuf, xs, dtype=i32), pld.window(bbuf, xs, dtype=i32)
            for r in pl.range(pld.world_size()):
                self.pub(x[r], a, device=r)
            b = pld.tensor.all_to_all_v(a, b, pld.window(gbuf, [nr, 1], dtype=i32), send, recv)
            for r in pl.range(pld.world_size()):
                self.out(y[r], b, device=r)
            return y

    return Counts


def test_host_all_to_all_v_takes_counts_from_a_host_tensor(backend):
    # The builtin's keyword arguments (here the counts) are host tensors materialised on each rank.
    nr, rows, cols = 2, 2, 3
    counts = np.array([[1, 2], [2, 0]], np.int32)
    x = np.arange(nr * nr * rows * cols, dtype=np.int32).reshape(nr, nr * rows, cols) + 1
    y = compile_prog(counts_program(nr, rows, cols), nr, backend)(x, counts, counts.T.copy())
    want = np.zeros((nr, nr, rows, cols), np.int32)
    blocks = x.reshape(nr, nr, rows, cols)
    for src in range(nr):
        for dst in range(nr):
            want[dst, src, :counts[src, dst]] = blocks[src, dst, :counts[src, dst]]
    np.testing.assert_array_equal(y.reshape(want.shape), want)
