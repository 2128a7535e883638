"""Collectives as upstream PyPTO defines them: ring allreduce of any length, the host ring's return-barrier
row, multi-core allreduce signals of any stride >= core_num, all_to_all(_v) from a plain tensor with
upstream's count layouts, and recv_counts checked against what the peers send.

Every test runs a complete program (host orchestrator, dispatch loops, kernels) on sim and on shm, at P=2
and P=4, and checks the numbers against numpy; every run reads the signal windows back, which must end
all zero (the collectives are self-clearing).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.collectives.spec import flat_regions, ring_segments
from ptodist.errors import KernelValueError, ProgramTypeError, ProgramValueError, SignalLayoutError

THIS = Path(__file__).resolve()
BACKENDS = ["sim", "shm"]
Sum, Max = pld.ReduceOp.Sum, pld.ReduceOp.Max


def line_of(marker: str) -> int:
    for i, line in enumerate(THIS.read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# @{marker}"):
            return i
    raise AssertionError(marker)


def site(marker: str) -> str:
    return f"{THIS}:{line_of(marker)}"


def zeros(shape) -> list[int]:
    return [0] * len(shape)


def whole(t, shape):
    return pl.load(t, zeros(shape), list(shape))


def compiled(prog, nr: int, backend: str):
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend)
    return ir.compile(prog, config=cfg)


# -- allreduce programs ------------------------------------------------------------------------------

def allreduce_prog(nr: int, dtype, xs, sig, where: str, call):
    """Stage ``x`` into window ``a``, run ``call(a, g)`` at ``where`` (kernel/host), read ``a`` and ``g`` back."""
    xs, sig = list(xs), list(sig)
    nelem = int(np.prod(xs))

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[xs, dtype], y: pl.Out[pl.Tensor[xs, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
              a: pl.InOut[pld.DistributedTensor[xs, dtype]], g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]]):
            pl.store(whole(x, xs), zeros(xs), a)
            res = call(a, g)
            pl.store(whole(res, xs), zeros(xs), y)
            pl.store(whole(g, sig), zeros(sig), s)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[xs, dtype], y: pl.Out[pl.Tensor[xs, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
                 a: pl.InOut[pld.DistributedTensor[xs, dtype]], g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]]):
            return self.k(x, y, s, a, g)

        @pl.function(type=pl.FunctionType.InCore)
        def stage(self, x: pl.Tensor[xs, dtype], a: pl.InOut[pld.DistributedTensor[xs, dtype]]):
            pl.store(whole(x, xs), zeros(xs), a)

        @pl.function(type=pl.FunctionType.Orchestration)
        def pub(self, x: pl.Tensor[xs, dtype], a: pl.InOut[pld.DistributedTensor[xs, dtype]]):
            self.stage(x, a)

        @pl.function(type=pl.FunctionType.InCore)
        def out(self, y: pl.Out[pl.Tensor[xs, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
                a: pl.InOut[pld.DistributedTensor[xs, dtype]], g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]]):
            pl.store(whole(a, xs), zeros(xs), y)
            pl.store(whole(g, sig), zeros(sig), s)

        @pl.function(type=pl.FunctionType.Orchestration)
        def con(self, y: pl.Out[pl.Tensor[xs, dtype]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
                a: pl.InOut[pld.DistributedTensor[xs, dtype]], g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]]):
            self.out(y, s, a, g)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host_fn(self, x: pl.Tensor[[nr, *xs], dtype], y: pl.Out[pl.Tensor[[nr, *xs], dtype]],
                    s: pl.Out[pl.Tensor[[nr, *sig], pl.INT32]]):
            abuf = pld.alloc_window_buffer([nelem], dtype=dtype)
            gbuf = pld.alloc_window_buffer(sig, dtype=pl.INT32)
            a = pld.window(abuf, xs, dtype=dtype)
            g = pld.window(gbuf, sig, dtype=pl.INT32)
            if where == "kernel":
                for r in pl.range(pld.world_size()):
                    self.chip(x[r], y[r], s[r], a, g, device=r)
            else:
                for r in pl.range(pld.world_size()):
                    self.pub(x[r], a, device=r)
                res = call(a, g)
                for r in pl.range(pld.world_size()):
                    self.con(y[r], s[r], res, g, device=r)
            return y

    return Prog


def run_allreduce(nr, dtype, xs, sig, where, call, backend, seed=0):
    rng = np.random.default_rng(seed)
    if dtype.is_float:
        x = (rng.standard_normal((nr, *xs)) * 4).astype(dtype.np_dtype)
    else:
        x = rng.integers(-1000, 1000, (nr, *xs)).astype(dtype.np_dtype)
    y = np.zeros_like(x)
    s = np.full((nr, *sig), -7, np.int32)
    compiled(allreduce_prog(nr, dtype, xs, sig, where, call), nr, backend)(x, y, s)
    return x, y, s


def assert_allreduced(x, y, op, dtype):
    ref = x.astype(np.float64).sum(axis=0) if op is Sum else x.astype(np.float64).max(axis=0)
    for r in range(x.shape[0]):
        if op is Max or not dtype.is_float:
            np.testing.assert_array_equal(y[r].astype(np.float64), ref)
        else:
            tol = 2 * x.shape[0] * (2.0 ** -10 if dtype is pl.FP16 else 2.0 ** -23) * np.abs(x.astype(np.float64)).sum(0)
            assert np.all(np.abs(y[r].astype(np.float64) - ref) <= tol + 1e-30), (y[r], ref)
    # The ring's owner reduces each segment once and copies it around: every rank holds the same bits.
    for r in range(1, x.shape[0]):
        np.testing.assert_array_equal(y[r], y[0])


# -- 1. ring allreduce of any length -----------------------------------------------------------------

def test_ring_segments_are_balanced_and_fp16_aligned():
    # FP32 (4 bytes): floor(i * size / P).
    assert ring_segments(10, 4, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert ring_segments(3, 4, 4) == [(0, 0), (0, 1), (1, 2), (2, 3)]  # shorter than the rank count
    # FP16 (2 bytes): interior boundaries rounded up to 16 elements (32 bytes), capped at the size.
    assert ring_segments(100, 4, 2) == [(0, 32), (32, 64), (64, 80), (80, 100)]
    assert ring_segments(20, 4, 2) == [(0, 16), (16, 16), (16, 16), (16, 20)]
    assert ring_segments(7, 2, 2) == [(0, 7), (7, 7)]
    for lo, _ in ring_segments(1000, 7, 2):
        assert lo % 16 == 0 or lo == 1000
    # The boxes of a flat range cover it exactly, in row-major order.
    shape = [3, 4, 5]
    for lo, hi in [(0, 60), (7, 53), (19, 21), (20, 40), (0, 1), (59, 60)]:
        got = np.zeros(shape, int)
        for off, ext in flat_regions(shape, lo, hi):
            got[tuple(slice(o, o + e) for o, e in zip(off, ext))] += 1
        want = np.zeros(60, int)
        want[lo:hi] = 1
        np.testing.assert_array_equal(got.reshape(-1), want)


RING_CASES = [  # (where, dtype, op, xs): lengths that divide by no rank count, and shorter than it
    ("kernel", pl.FP32, Sum, [3, 5]),
    ("kernel", pl.FP32, Max, [1, 1]),
    ("kernel", pl.FP16, Sum, [5, 7]),
    ("kernel", pl.FP16, Sum, [3, 23]),
    ("kernel", pl.INT32, Sum, [2, 3, 3]),
    ("host", pl.FP32, Sum, [3, 5]),
    ("host", pl.FP32, Sum, [1, 3]),
    ("host", pl.FP32, Sum, [37]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
@pytest.mark.parametrize("where, dtype, op, xs", RING_CASES)
def test_ring_allreduce_of_any_length(where, dtype, op, xs, nr, backend):
    def call(a, g):
        return pld.tensor.allreduce(a, g, op=op, mode="ring")

    x, y, s = run_allreduce(nr, dtype, xs, [2 * (nr - 1), nr], where, call, backend)
    assert_allreduced(x, y, op, dtype)
    assert not s.any(), s


# -- 2. the host ring's [2*(NR-1)+1, NR] signal ------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
@pytest.mark.parametrize("xs", [[2, 5], [3]])
def test_host_ring_with_the_return_barrier_row(xs, nr, backend):
    def call(a, g):
        a = pld.tensor.allreduce(a, g, mode="ring")
        return pld.tensor.allreduce(a, g, mode="ring")  # the same signal again: it was left clear

    x, y, s = run_allreduce(nr, pl.FP32, xs, [2 * (nr - 1) + 1, nr], "host", call, backend, seed=nr)
    assert_allreduced(x * nr, y, Sum, pl.FP32)  # twice: sum of sums
    assert not s.any(), s


def ring_with_return_row_in_kernel(a, g):
    return pld.tensor.allreduce(a, g, mode="ring")  # @ring_return_row_kernel


def test_return_barrier_row_is_the_host_layout_only():
    nr = 2
    with pytest.raises(RankError) as info:
        run_allreduce(nr, pl.FP32, [1, 4], [3, 2], "kernel", ring_with_return_row_in_kernel, "sim")
    err = info.value.original
    assert isinstance(err, SignalLayoutError)
    msg = str(err)
    assert (f"pld.tensor.allreduce at {site('ring_return_row_kernel')}: a [2*(NR-1)+1, NR] = [3, 2] ring signal "
            "(with a row for the return barrier) is the host orchestrator's layout, but window 'gbuf' [3, 2] INT32 "
            "is used inside a kernel. Inside a kernel mode='ring' takes [2*(NR-1), NR] = [2, 2]") in msg


def ring_wrong_rows(a, g):
    return pld.tensor.allreduce(a, g, mode="ring")  # @ring_wrong_rows


def test_host_ring_signal_of_another_shape_is_rejected():
    with pytest.raises(SignalLayoutError) as info:
        run_allreduce(4, pl.FP32, [1, 4], [5, 4], "host", ring_wrong_rows, "sim")
    assert (f"pld.tensor.allreduce at {site('ring_wrong_rows')}: mode='ring' needs a signal of shape "
            "[2*(NR-1), NR] = [6, 4] (one row per ring round, one cell per rank), but window 'gbuf' [5, 4] INT32 "
            "has [5, 4]. A [NR, 1] signal is the mesh layout.") in str(info.value)


# -- 3. multi-core allreduce: a [NR, stride] signal with stride >= core_num --------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
@pytest.mark.parametrize("core_num, stride, xs", [(2, 2, [3, 5]), (2, 4, [3, 5]), (3, 8, [2, 7]), (4, 5, [1, 3])])
def test_multicore_allreduce_with_a_wider_signal(core_num, stride, xs, nr, backend):
    def call(a, g):
        return pld.tensor.allreduce(a, g, op=Sum, core_num=core_num)

    x, y, s = run_allreduce(nr, pl.FP32, xs, [nr, stride], "host", call, backend, seed=core_num)
    assert_allreduced(x, y, Sum, pl.FP32)
    assert not s.any(), s


def lanes_too_narrow(a, g):
    return pld.tensor.allreduce(a, g, core_num=3)  # @lanes_too_narrow


def test_multicore_signal_narrower_than_core_num_is_rejected():
    with pytest.raises(SignalLayoutError) as info:
        run_allreduce(2, pl.FP32, [1, 4], [2, 2], "host", lanes_too_narrow, "sim")
    msg = str(info.value)
    assert (f"pld.tensor.allreduce at {site('lanes_too_narrow')}: mesh signals have shape [NR, core_num] = [2, 3] "
            "(one column per lane), but window 'gbuf' [2, 2] INT32 has [2, 2]. A wider [NR, stride] signal "
            "(stride >= core_num = 3) works too.") in msg


# -- 4. all_to_all / all_to_all_v --------------------------------------------------------------------

def a2a_prog(nr: int, dtype, xs, where: str, call, *, counts_shape=None, plan_counts=False):
    """all_to_all(_v) from a plain tensor ``x`` (kernel) or a staged window ``a`` (host).

    ``call(w)`` gets ``w.x`` (the plain input, kernel only), ``w.a``, ``w.b`` (target), ``w.g`` (signal),
    ``w.c`` (this rank's counts tensor, kernel only), ``w.cw`` (a counts window staged from ``c``),
    ``w.q`` (an INT32 [NR, 1] window for recv_counts) and ``w.me``.
    Outputs: ``y`` (the target), ``rc`` (``q``), ``s`` (the signal).
    """
    xs = list(xs)
    cs = list(counts_shape or [nr, 1])
    sig = [nr, 1]
    nelem = int(np.prod(xs))
    ncount = int(np.prod(cs))

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[xs, dtype], c: pl.Tensor[cs, pl.INT32], y: pl.Out[pl.Tensor[xs, dtype]],
              rc: pl.Out[pl.Tensor[[nr, 1], pl.INT32]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
              a: pl.InOut[pld.DistributedTensor[xs, dtype]], b: pl.InOut[pld.DistributedTensor[xs, dtype]],
              g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]], cw: pl.InOut[pld.DistributedTensor[cs, pl.INT32]],
              q: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            me = pld.rank(pld.get_comm_ctx(b))
            res = call(SimpleNamespace(x=x, a=a, b=b, g=g, c=c, cw=cw, q=q, me=me))
            pl.store(whole(res, xs), zeros(xs), y)
            pl.store(whole(q, [nr, 1]), [0, 0], rc)
            pl.store(whole(g, sig), zeros(sig), s)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[xs, dtype], c: pl.Tensor[cs, pl.INT32], y: pl.Out[pl.Tensor[xs, dtype]],
                 rc: pl.Out[pl.Tensor[[nr, 1], pl.INT32]], s: pl.Out[pl.Tensor[sig, pl.INT32]],
                 a: pl.InOut[pld.DistributedTensor[xs, dtype]], b: pl.InOut[pld.DistributedTensor[xs, dtype]],
                 g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]], cw: pl.InOut[pld.DistributedTensor[cs, pl.INT32]],
                 q: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.k(x, c, y, rc, s, a, b, g, cw, q)

        @pl.function(type=pl.FunctionType.InCore)
        def stage(self, x: pl.Tensor[xs, dtype], c: pl.Tensor[cs, pl.INT32],
                  a: pl.InOut[pld.DistributedTensor[xs, dtype]], cw: pl.InOut[pld.DistributedTensor[cs, pl.INT32]]):
            pl.store(whole(x, xs), zeros(xs), a)
            pl.store(whole(c, cs), zeros(cs), cw)

        @pl.function(type=pl.FunctionType.Orchestration)
        def pub(self, x: pl.Tensor[xs, dtype], c: pl.Tensor[cs, pl.INT32],
                a: pl.InOut[pld.DistributedTensor[xs, dtype]], cw: pl.InOut[pld.DistributedTensor[cs, pl.INT32]]):
            self.stage(x, c, a, cw)

        @pl.function(type=pl.FunctionType.InCore)
        def out(self, y: pl.Out[pl.Tensor[xs, dtype]], rc: pl.Out[pl.Tensor[[nr, 1], pl.INT32]],
                s: pl.Out[pl.Tensor[sig, pl.INT32]], b: pl.InOut[pld.DistributedTensor[xs, dtype]],
                g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]], q: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            pl.store(whole(b, xs), zeros(xs), y)
            pl.store(whole(q, [nr, 1]), [0, 0], rc)
            pl.store(whole(g, sig), zeros(sig), s)

        @pl.function(type=pl.FunctionType.Orchestration)
        def con(self, y: pl.Out[pl.Tensor[xs, dtype]], rc: pl.Out[pl.Tensor[[nr, 1], pl.INT32]],
                s: pl.Out[pl.Tensor[sig, pl.INT32]], b: pl.InOut[pld.DistributedTensor[xs, dtype]],
                g: pl.InOut[pld.DistributedTensor[sig, pl.INT32]], q: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            self.out(y, rc, s, b, g, q)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host_fn(self, x: pl.Tensor[[nr, *xs], dtype], c: pl.Tensor[[nr, *cs], pl.INT32],
                    y: pl.Out[pl.Tensor[[nr, *xs], dtype]], rc: pl.Out[pl.Tensor[[nr, nr, 1], pl.INT32]],
                    s: pl.Out[pl.Tensor[[nr, *sig], pl.INT32]]):
            abuf = pld.alloc_window_buffer([nelem], dtype=dtype)
            bbuf = pld.alloc_window_buffer([nelem], dtype=dtype)
            gbuf = pld.alloc_window_buffer(sig, dtype=pl.INT32)
            cbuf = pld.alloc_window_buffer([ncount], dtype=pl.INT32)
            qbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            w = SimpleNamespace(x=None, c=None, host_x=x[0], a=pld.window(abuf, xs, dtype=dtype),
                                b=pld.window(bbuf, xs, dtype=dtype),
                                g=pld.window(gbuf, sig, dtype=pl.INT32), cw=pld.window(cbuf, cs, dtype=pl.INT32),
                                q=pld.window(qbuf, [nr, 1], dtype=pl.INT32), me=None)
            if where == "kernel":
                for r in pl.range(pld.world_size()):
                    self.chip(x[r], c[r], y[r], rc[r], s[r], w.a, w.b, w.g, w.cw, w.q, device=r)
            else:
                for r in pl.range(pld.world_size()):
                    self.pub(x[r], c[r], w.a, w.cw, device=r)
                res = call(w)
                for r in pl.range(pld.world_size()):
                    self.con(y[r], rc[r], s[r], res, w.g, w.q, device=r)
            return y

    return Prog


def run_a2a(nr, xs, where, call, counts, backend, dtype=pl.FP32, counts_shape=None):
    """Run; ``counts[src, dst]`` is staged as rank src's counts tensor ([NR, 1] by default)."""
    rng = np.random.default_rng(nr)
    x = (rng.standard_normal((nr, *xs)) * 10).astype(dtype.np_dtype)
    cs = list(counts_shape or [nr, 1])
    c = np.stack([np.asarray(counts[r]).reshape(cs) for r in range(nr)]).astype(np.int32) if counts_shape != \
        [nr, nr] else np.stack([np.asarray(counts)] * nr).astype(np.int32)
    y = np.zeros_like(x)
    rc = np.full((nr, nr, 1), -5, np.int32)
    s = np.full((nr, nr, 1), -7, np.int32)
    compiled(a2a_prog(nr, dtype, xs, where, call, counts_shape=cs), nr, backend)(x, c, y, rc, s)
    return x, y, rc, s


def a2a_v_want(x, counts):
    """want[dst][block src] = first counts[src, dst] rows of x[src]'s block dst; the rest stays zero."""
    nr = x.shape[0]
    rows = x.shape[1] // nr
    blocks = x.reshape(nr, nr, rows, *x.shape[2:])
    want = np.zeros_like(blocks)
    for src in range(nr):
        for dst in range(nr):
            k = int(counts[src][dst])
            want[dst, src, :k] = blocks[src, dst, :k]
    return want.reshape(x.shape)


def counts_for(nr: int, rows: int) -> np.ndarray:
    """counts[src, dst], every value in [0, rows], not symmetric."""
    return np.array([[(3 * s + d + 1) % (rows + 1) for d in range(nr)] for s in range(nr)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
def test_all_to_all_from_a_plain_tensor(nr, backend):
    xs = [nr * 2, 3]

    def call(w):
        return pld.tensor.all_to_all(w.x, w.b, w.g)  # x: the kernel's pl.Tensor parameter, not a window

    x, y, _, s = run_a2a(nr, xs, "kernel", call, np.zeros((nr, nr)), backend)
    blocks = x.reshape(nr, nr, 2, 3)
    np.testing.assert_array_equal(y.reshape(nr, nr, 2, 3), blocks.transpose(1, 0, 2, 3))
    assert not s.any(), s


A2AV_FORMS = ["tensor [NR,1] -> window", "tensor [NR] -> list", "Scalars -> Scalars", "list -> window",
              "window [NR,1] -> window"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
@pytest.mark.parametrize("form", A2AV_FORMS)
def test_all_to_all_v_count_layouts_in_a_kernel(form, nr, backend):
    rows = 3
    xs = [nr * rows, 2]
    counts = counts_for(nr, rows)
    expect = counts.T  # expect[q][p]: rows rank q receives from rank p

    def call(w):
        if form == "tensor [NR,1] -> window":
            return pld.tensor.all_to_all_v(w.x, w.b, w.g, w.c, w.q)
        if form == "tensor [NR] -> list":
            return pld.tensor.all_to_all_v(w.x, w.b, w.g, w.c, expect.tolist())  # [NR, NR]: row q for rank q
        if form == "Scalars -> Scalars":
            send = [pl.read(w.c, [p, 0]) for p in range(nr)]
            recv = [_expected_scalar(w.me, p, expect) for p in range(nr)]
            return pld.tensor.all_to_all_v(w.x, w.b, w.g, send, recv)
        if form == "list -> window":
            return pld.tensor.all_to_all_v(w.x, w.b, w.g, counts.tolist(), w.q)
        return pld.tensor.all_to_all_v(w.x, w.b, w.g, _staged(w), w.q)

    shape = [nr] if form == "tensor [NR] -> list" else None
    x, y, rc, s = run_a2a(nr, xs, "kernel", call, counts, backend, counts_shape=shape)
    np.testing.assert_array_equal(y, a2a_v_want(x, counts))
    assert not s.any(), s
    if form.endswith("-> window"):  # upstream: sender p's count for rank q lands in q's recv_counts[p, 0]
        np.testing.assert_array_equal(rc[:, :, 0], expect)


def _expected_scalar(me, p, expect):
    """recv_counts[p] on rank ``me`` as a Scalar computed at run time."""
    val = pl.const(0, pl.INT32)
    for q in range(expect.shape[0]):
        if int(me) == q:
            val = pl.const(int(expect[q][p]), pl.INT32)
    return val


def _staged(w):
    pl.store(whole(w.c, list(w.c.shape)), [0, 0], w.cw)
    return w.cw


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
def test_all_to_all_v_from_the_host_with_count_windows(nr, backend):
    rows = 2
    xs = [nr * rows, 3]
    counts = counts_for(nr, rows)

    def call(w):
        return pld.tensor.all_to_all_v(w.a, w.b, w.g, w.cw, w.q)

    x, y, rc, s = run_a2a(nr, xs, "host", call, counts, backend)
    np.testing.assert_array_equal(y, a2a_v_want(x, counts))
    np.testing.assert_array_equal(rc[:, :, 0], counts.T)
    assert not s.any(), s


def test_all_to_all_v_recv_counts_that_peers_do_not_send_is_an_error():
    nr = 2
    counts = np.array([[1, 2], [0, 1]])  # rank 0 sends 1 to itself, 2 to rank 1; rank 1 sends 0, 1
    xs = [nr * 2, 2]

    def call(w):
        return pld.tensor.all_to_all_v(w.x, w.b, w.g, w.c, [1, 1])  # @a2av_mismatch

    with pytest.raises(RankError) as info:
        run_a2a(nr, xs, "kernel", call, counts, "sim")
    err = info.value
    assert {f.rank for f in err.failures} == {0, 1}
    assert isinstance(err.original, KernelValueError)
    text = str(err)
    w = f"pld.tensor.all_to_all_v at {site('a2av_mismatch')}"
    assert (f"{w}: rank 0 expects recv_counts[1] = 1 rows from rank 1, but rank 1 sends send_counts[0] = 0. "
            "recv_counts on rank q must list") in text
    assert (f"{w}: rank 1 expects recv_counts[0] = 1 rows from rank 0, but rank 0 sends send_counts[1] = 2. "
            "recv_counts on rank q must list") in text
    assert "pass recv_counts as an INT32 [NR, 1] window to receive the counts the peers send" in text


def a2av_plan_mismatch(w):
    return pld.tensor.all_to_all_v(w.a, w.b, w.g, [[1, 2], [0, 1]], [[1, 0], [1, 1]])  # @a2av_plan_mismatch


def test_all_to_all_v_constant_counts_that_disagree_fail_before_any_rank_starts():
    nr = 2
    with pytest.raises(ProgramValueError) as info:
        run_a2a(nr, [4, 2], "host", a2av_plan_mismatch, np.zeros((nr, nr)), "sim")
    assert (f"pld.tensor.all_to_all_v at {site('a2av_plan_mismatch')}: rank 1 expects recv_counts[0] = 1 rows "
            "from rank 0, but rank 0 sends send_counts[1] = 2 rows to rank 1. recv_counts[q][p] must equal "
            "send_counts[p][q]") in str(info.value)


# -- under `ptodist check`: the happens-before checker must find nothing -------------------------------

CHECKED = ["ring odd length (kernel)", "ring with return row (host)", "multicore stride 4 (host)",
           "all_to_all_v counts window (kernel)", "all_to_all_v counts checked (kernel)"]


@pytest.mark.parametrize("case", CHECKED)
def test_no_finding_under_ptodist_check(case):
    from ptodist.check import explore

    nr = 4
    with explore.checking(0):
        if case.startswith("ring odd"):
            x, y, s = run_allreduce(nr, pl.FP16, [3, 7], [2 * (nr - 1), nr], "kernel",
                                    lambda a, g: pld.tensor.allreduce(a, g, mode="ring"), None)
            assert_allreduced(x, y, Sum, pl.FP16)
        elif case.startswith("ring with"):
            x, y, s = run_allreduce(nr, pl.FP32, [5], [2 * (nr - 1) + 1, nr], "host",
                                    lambda a, g: pld.tensor.allreduce(a, g, mode="ring"), None)
            assert_allreduced(x, y, Sum, pl.FP32)
        elif case.startswith("multicore"):
            x, y, s = run_allreduce(nr, pl.FP32, [3, 5], [nr, 4], "host",
                                    lambda a, g: pld.tensor.allreduce(a, g, core_num=3), None)
            assert_allreduced(x, y, Sum, pl.FP32)
        else:
            counts = counts_for(nr, 2)
            recv_window = case.endswith("window (kernel)")

            def call(w):
                recv = w.q if recv_window else counts.T.tolist()
                return pld.tensor.all_to_all_v(w.x, w.b, w.g, w.c, recv)

            x, y, rc, s = run_a2a(nr, [nr * 2, 2], "kernel", call, counts, None)
            np.testing.assert_array_equal(y, a2a_v_want(x, counts))
            if recv_window:
                np.testing.assert_array_equal(rc[:, :, 0], counts.T)
    assert not s.any(), s


def test_host_all_to_all_needs_a_window_input():
    nr = 2

    def call(w):
        return pld.tensor.all_to_all(w.host_x, w.b, w.g)  # @host_plain_input

    prog = a2a_prog(nr, pl.FP32, [2, 2], "host", call)
    x = np.zeros((nr, 2, 2), np.float32)
    with pytest.raises(ProgramTypeError) as info:
        compiled(prog, nr, "sim")(x, np.zeros((nr, nr, 1), np.int32), np.zeros_like(x),
                                  np.zeros((nr, nr, 1), np.int32), np.zeros((nr, nr, 1), np.int32))
    assert (f"pld.tensor.all_to_all at {site('host_plain_input')}: in the host orchestrator the input must be a "
            "pld.DistributedTensor (a window from pld.window: every rank sends its own copy)") in str(info.value)


# -- the MoE example: dispatch and combine with all_to_all_v -------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("devices", ["0,1", "0,1,2,3"])
def test_moe_dispatch_combine_example(devices, backend, capsys, monkeypatch):
    from conftest import run_example

    monkeypatch.setenv("PTODIST_BACKEND", backend)
    run_example(capsys, "moe_dispatch_combine", "-d", devices, "--seed", "1")
