"""Programs written as upstream PyPTO writes them: chip calls without ``device=``, chip calls that return
tuples, host intermediates (``pl.create_tensor`` in the host), ``pl.dynamic`` arithmetic, and L2 programs
with several orchestrations and no host.

Every test runs a complete program on the sim backend and on the default shm backend and checks the numbers
against numpy (at P=2 and P=4 where the program is distributed).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import source_line

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir
from ptodist.errors import DispatchTypeError, ProgramError, ProgramTypeError, ShapeError

SIZE = 16
NR = pl.dynamic("NR")
FILE = __file__


def cfg(nr: int, backend: str | None) -> RunConfig:
    return RunConfig(platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(nr))),
                     **({"backend": backend} if backend else {}))


BACKENDS = ["sim", None]  # None: the default (shm)


def rand(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------
# 1. A chip call without device=: round-robin over the chips, in submit order
# ---------------------------------------------------------------------------


@pl.jit.incore
def scale_kernel(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 k: pl.Scalar[pl.FP32]):
    t = pl.mul(pl.load(x, [0, 0], [1, SIZE]), k)
    return pl.store(t, [0, 0], y)


@pl.jit
def scale(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], k: pl.Scalar[pl.FP32]):
    return scale_kernel(x, y, k)


@pl.jit.incore
def whoami_kernel(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], w: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(w))
    return pl.store(pl.full([1, SIZE], dtype=pl.FP32, value=0.0) + pl.cast(me, target_type=pl.FP32), [0, 0], y)


@pl.jit
def whoami(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], w: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    return whoami_kernel(y, w)


@pl.jit.host
def commless(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
             where: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        scale(x[r], y[r], 2.0)  # no device=: the r-th comm-less call lands on chip r % P
        whoami(where[r], pld.window(buf, [1, 1], dtype=pl.INT32), device=r)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
def test_chip_calls_without_device_go_round_robin(nr, backend):
    x = rand(nr, 1, SIZE)
    y = np.zeros_like(x)
    where = np.full_like(x, -1.0)
    compiled = commless.compile(x, y, where, config=cfg(nr, backend))
    compiled(x, y, where)
    np.testing.assert_allclose(y, 2.0 * x, rtol=1e-6)
    np.testing.assert_array_equal(where[:, 0, 0], np.arange(nr, dtype=np.float32))
    # The pinned calls do not advance the round-robin: comm-less call r runs on chip r.
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    for r, rank in enumerate(plan["ranks"]):
        assert [(t["function"], t["args"][0].get("index")) for t in rank["tasks"]] == \
            [("scale", [r]), ("whoami", [r])]


@pl.jit.host
def three_commless(x: pl.Tensor[[3, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[3, 1, SIZE], pl.FP32]]):
    for i in pl.range(3):
        scale(x[i], y[i], 3.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_comm_less_calls_wrap_around_the_chips(backend):
    x = rand(3, 1, SIZE)
    y = np.zeros_like(x)
    compiled = three_commless.compile(x, y, config=cfg(2, backend))
    compiled(x, y)
    np.testing.assert_allclose(y, 3.0 * x, rtol=1e-6)
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    placed = [[t["args"][0]["index"][0] for t in rank["tasks"]] for rank in plan["ranks"]]
    assert placed == [[0, 2], [1]]  # calls 0, 1, 2 on chips 0, 1, 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_chip_program_lands_on_chip_0(backend):
    x = rand(3, 1, SIZE)
    y = np.zeros_like(x)
    three_commless(x, y, config=cfg(1, backend))
    np.testing.assert_allclose(y, 3.0 * x, rtol=1e-6)


# ---------------------------------------------------------------------------
# 2. Chip calls that return tuples; 3. pl.create_tensor in the host
# ---------------------------------------------------------------------------


@pl.jit.incore
def sum_diff_kernel(a: pl.Tensor[[1, SIZE], pl.FP32], b: pl.Tensor[[1, SIZE], pl.FP32],
                    s: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], d: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    ta = pl.load(a, [0, 0], [1, SIZE])
    tb = pl.load(b, [0, 0], [1, SIZE])
    pl.store(pl.add(ta, tb), [0, 0], s)
    pl.store(pl.sub(ta, tb), [0, 0], d)


@pl.jit
def sum_diff(a: pl.Tensor[[1, SIZE], pl.FP32], b: pl.Tensor[[1, SIZE], pl.FP32],
             out_s: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], out_d: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]
             ) -> tuple[pl.Tensor[[1, SIZE], pl.FP32], pl.Tensor[[1, SIZE], pl.FP32]]:
    sum_diff_kernel(a, b, out_s, out_d)
    return out_s, out_d


@pl.jit.incore
def mul_kernel(a: pl.Tensor[[1, SIZE], pl.FP32], b: pl.Tensor[[1, SIZE], pl.FP32],
               f: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    return pl.store(pl.mul(pl.load(a, [0, 0], [1, SIZE]), pl.load(b, [0, 0], [1, SIZE])), [0, 0], f)


@pl.jit
def multiply(a: pl.Tensor[[1, SIZE], pl.FP32], b: pl.Tensor[[1, SIZE], pl.FP32],
             f: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]) -> pl.Tensor[[1, SIZE], pl.FP32]:
    return mul_kernel(a, b, f)  # not a parameter name: the one pl.Out parameter is the result


@pl.jit.host
def sum_times_diff(a: pl.Tensor[[NR, 1, SIZE], pl.FP32], b: pl.Tensor[[NR, 1, SIZE], pl.FP32],
                   f: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    sums = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    diffs = pl.create_tensor([pld.world_size(), 1, SIZE], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        s, d = sum_diff(a[r], b[r], sums[r], diffs[r], device=r)
        out = multiply(s, d, f[r], device=r)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
def test_tuple_results_and_host_intermediates(nr, backend):
    a, b = rand(nr, 1, SIZE), rand(nr, 1, SIZE) + 1
    f = sum_times_diff(a, b, config=cfg(nr, backend))  # inputs only: f is created and returned
    np.testing.assert_allclose(f, (a + b) * (a - b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_class_program_returning_a_tuple_on_one_chip(backend):
    @pl.program
    class SumDiff:
        @pl.function(type=pl.FunctionType.InCore)
        def kern(self, a: pl.Tensor[[1, SIZE], pl.FP32], b: pl.Tensor[[1, SIZE], pl.FP32],
                 s: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], d: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
            ta, tb = pl.load(a, [0, 0], [1, SIZE]), pl.load(b, [0, 0], [1, SIZE])
            pl.store(pl.add(ta, tb), [0, 0], s)
            pl.store(pl.sub(ta, tb), [0, 0], d)

        @pl.function(level=pl.Level.CHIP, role=pl.Role.Orchestrator)
        def chip_orch(self, a: pl.Tensor[[1, SIZE], pl.FP32], b: pl.Tensor[[1, SIZE], pl.FP32],
                      out_s: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], out_d: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]
                      ) -> pl.Tuple[pl.Tensor[[1, SIZE], pl.FP32], pl.Tensor[[1, SIZE], pl.FP32]]:
            self.kern(a, b, out_s, out_d)
            return out_s, out_d

        @pl.function(level=pl.Level.CHIP, role=pl.Role.Orchestrator)
        def combine(self, s: pl.Tensor[[1, SIZE], pl.FP32], d: pl.Tensor[[1, SIZE], pl.FP32],
                    f: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
            return multiply(s, d, f)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host_orch(self, a: pl.Tensor[[1, SIZE], pl.FP32], b: pl.Tensor[[1, SIZE], pl.FP32],
                      f: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
            buf_s = pl.create_tensor([1, SIZE], dtype=pl.FP32)
            buf_d = pl.create_tensor([1, SIZE], dtype=pl.FP32)
            s, d = self.chip_orch(a, b, buf_s, buf_d)
            self.combine(s, d, f)
            return f

    a, b = rand(1, SIZE), rand(1, SIZE)
    f = np.zeros_like(a)
    compiled = ir.compile(SumDiff, config=RunConfig(**({"backend": backend} if backend else {})))
    compiled(a, b, f)
    np.testing.assert_allclose(f, (a + b) * (a - b), rtol=1e-5, atol=1e-6)


@pl.jit.incore
def noop_kernel(a: pl.Tensor[[1, SIZE], pl.FP32]):
    pass


@pl.jit
def two_out_ambiguous(a: pl.Tensor[[1, SIZE], pl.FP32], p: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                      q: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]) -> pl.Tensor[[1, SIZE], pl.FP32]:
    noop_kernel(a)
    return noop_kernel(a)


@pl.jit.host
def uses_an_ambiguous_result(a: pl.Tensor[[NR, 1, SIZE], pl.FP32], p: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
                             q: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        res = two_out_ambiguous(a[r], p[r], q[r], device=r)
        scale(res, p[r], 1.0, device=r)


def test_a_result_that_cannot_be_matched_is_an_error_when_used():
    a = rand(2, 1, SIZE)
    with pytest.raises(ProgramTypeError) as info:
        uses_an_ambiguous_result(a, config=cfg(2, "sim"))
    line = source_line(uses_an_ambiguous_result, "res = two_out_ambiguous(")
    assert str(info.value) == (
        f"two_out_ambiguous() at {FILE}:{line}: its result is used in the host, but 'two_out_ambiguous' "
        f"({FILE}:{two_out_ambiguous.line}) returns 1 value that ptodist cannot match to its parameters: its "
        "return statement does not name parameters, and it has 2 pl.Out and 2 pl.Out/pl.InOut tensor parameters.")
    assert info.value.fix == ("End 'two_out_ambiguous' with `return <its output parameters>` (e.g. `return out`), "
                              "or use the arguments you passed for its outputs directly in the host.")


@pl.jit.host
def creates_a_bad_tensor(a: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    tmp = pl.create_tensor([0, SIZE], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        scale(a[r], y[r], 1.0, device=r)
    return tmp


def test_a_host_intermediate_needs_a_positive_shape():
    with pytest.raises(ProgramError) as info:
        creates_a_bad_tensor(rand(2, 1, SIZE), config=cfg(2, "sim"))
    line = source_line(creates_a_bad_tensor, "tmp = pl.create_tensor(")
    assert str(info.value) == (f"pl.create_tensor([0, 16]) at {FILE}:{line}: every dimension must be positive; "
                               "give the tensor's shape, e.g. pl.create_tensor([NR, 1, 64], dtype=pl.FP32)")


# ---------------------------------------------------------------------------
# 4. pl.dynamic dims as symbolic values
# ---------------------------------------------------------------------------

M = pl.dynamic("M")
N = pl.dynamic("N")


@pl.jit.incore
def gather_kernel(x: pl.Tensor[[1, SIZE], pl.FP32],
                  out: pl.Out[pl.Tensor[[1, NR * SIZE], pl.FP32]],
                  data: pl.InOut[pld.DistributedTensor[[NR, SIZE], pl.FP32]],
                  sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me = pld.rank(ctx)
    pl.store(pl.load(x, [0, 0], [1, SIZE]), [me, 0], data)
    for p in pl.range(NR):  # NR bound from this kernel's argument shapes
        pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for p in pl.range(NR):
        pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)
    for p in pl.range(NR):
        row = pld.tile.remote_load(data, p, [p, 0], [1, SIZE])
        pl.store(row, [0, p * SIZE], out)
    return out


@pl.jit
def gather(x: pl.Tensor[[1, SIZE], pl.FP32], out: pl.Out[pl.Tensor[[1, NR * SIZE], pl.FP32]],
           data: pl.InOut[pld.DistributedTensor[[NR, SIZE], pl.FP32]],
           sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return gather_kernel(x, out, data, sig)


@pl.jit.host
def gather_host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], out: pl.Out[pl.Tensor[[NR, 1, NR * SIZE], pl.FP32]]):
    data_buf = pld.alloc_window_buffer(NR * SIZE * pl.FP32.get_byte())  # bytes, from the bound NR
    sig_buf = pld.alloc_window_buffer([NR, 1], dtype=pl.INT32)
    for r in pl.range(NR):
        data = pld.window(data_buf, [NR, SIZE], dtype=pl.FP32)
        sig = pld.window(sig_buf, [NR, 1], dtype=pl.INT32)
        gather(x[r], out[r], data, sig, device=r)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nr", [2, 4])
def test_dynamic_arithmetic_in_annotations_windows_and_ranges(nr, backend):
    x = rand(nr, 1, SIZE)
    out = gather_host(x, config=cfg(nr, backend))  # the output's shape [NR, 1, NR * SIZE] from x's
    assert out.shape == (nr, 1, nr * SIZE)
    expect = np.broadcast_to(x.reshape(1, 1, nr * SIZE), (nr, 1, nr * SIZE))
    np.testing.assert_array_equal(out, expect)


@pl.jit.incore
def double_rows_kernel(x: pl.Tensor[[M, N], pl.FP32], y: pl.Out[pl.Tensor[[M * 2, N], pl.FP32]]):
    for i in pl.range(M):
        t = pl.load(x, [i, 0], [1, N])
        pl.store(t, [2 * i, 0], y)
        pl.store(pl.add(t, t), [2 * i + 1, 0], y)
    return y


@pl.jit
def double_rows(x: pl.Tensor[[M, N], pl.FP32], y: pl.Out[pl.Tensor[[M * 2, N], pl.FP32]]):
    return double_rows_kernel(x, y)


@pl.jit.host
def double_rows_host(y: pl.Out[pl.Tensor[[M * 2, N], pl.FP32]], x: pl.Tensor[[M, N], pl.FP32]):
    tmp = pl.create_tensor([M * 2, N], dtype=pl.FP32)
    t = double_rows(x, tmp)
    double_rows(x, y)
    return t


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_expression_dim_binds_its_name_by_solving(backend):
    x = rand(3, 5)
    y = np.zeros((6, 5), np.float32)
    double_rows_host(y, x, config=cfg(1, backend))  # M and N bind from x; y's [M * 2, N] is checked
    expect = np.empty((6, 5), np.float32)
    expect[0::2], expect[1::2] = x, 2 * x
    np.testing.assert_array_equal(y, expect)


def test_an_expression_dim_that_disagrees_is_a_shape_error():
    x = rand(3, 5)
    y = np.zeros((7, 5), np.float32)
    with pytest.raises(ShapeError) as info:
        double_rows_host(y, x, config=cfg(1, "sim"))
    line = source_line(double_rows_host, "def double_rows_host(")
    assert str(info.value) == (
        f"double_rows_host() parameter 'y' (declared pl.Out[pl.Tensor[[M * 2, N], pl.FP32]] at {FILE}:{line}): "
        "dimension 0 is M * 2 = 6 (M = 3), but the argument has 7 (shape [7, 5]).")
    assert info.value.fix == ("Pass an argument whose dimension 0 is M * 2 for the sizes the other arguments bind, "
                              "or change the annotation.")


@pl.jit.host
def two_unknowns(x: pl.Tensor[[M * N], pl.FP32], y: pl.Out[pl.Tensor[[M * N], pl.FP32]]):
    pass


def test_a_dim_no_argument_binds_is_an_error_naming_it():
    with pytest.raises(ShapeError) as info:
        two_unknowns(rand(6), config=cfg(1, "sim"))
    line = source_line(two_unknowns, "def two_unknowns(")
    assert str(info.value) == (
        f"two_unknowns() parameter 'x' (declared pl.Tensor[[M * N], pl.FP32] at {FILE}:{line}): dimension 0 is "
        "M * N = 6 (shape [6]), but pl.dynamic 'M', 'N' cannot be bound: they are not any argument's dimension "
        "on their own, and M * N = 6 does not determine them.")
    assert info.value.fix == ("Annotate a dimension of some parameter with M alone (e.g. pl.Tensor[[M, ...], ...]) "
                              "so the argument shapes bind it.")


K = pl.dynamic("K")


@pl.jit.incore
def uses_unbound_kernel(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    for _ in pl.range(K):
        pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], y)


@pl.jit
def uses_unbound(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    return uses_unbound_kernel(x, y)


@pl.jit.host
def calls_unbound(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        uses_unbound(x[r], y[r], device=r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dynamic_name_used_in_a_kernel_that_nothing_binds(backend):
    from ptodist.errors import RankError

    with pytest.raises(RankError) as info:
        calls_unbound(rand(2, 1, SIZE), config=cfg(2, backend))
    line = source_line(uses_unbound_kernel, "for _ in pl.range(K):")
    msg = str(info.value)
    assert (f"pl.dynamic('K') used at {FILE}:{line} cannot be bound: no tensor parameter of kernel "
            f"'uses_unbound_kernel' ({FILE}:{uses_unbound_kernel.line}) or of the functions that called it "
            "('uses_unbound') has it in its annotation, so no argument's shape gives it a value. Annotate a "
            "tensor parameter of uses_unbound_kernel() with K (e.g. pl.Tensor[[K, ...], ...]), or pass the size "
            "as a pl.Scalar parameter.") in msg


@pl.jit.host
def window_of_unbound(x: pl.Tensor[[NR, 1, SIZE], pl.FP32]):
    pld.alloc_window_buffer(K * SIZE * pl.FP32.get_byte())


def test_a_dynamic_name_the_host_cannot_bind():
    with pytest.raises(ShapeError) as info:
        window_of_unbound(rand(2, 1, SIZE), config=cfg(2, "sim"))
    line = source_line(window_of_unbound, "pld.alloc_window_buffer(")
    assert str(info.value) == (
        f"pl.dynamic('K') (in K * 16 * 4) used at {FILE}:{line} cannot be bound: no tensor parameter of host "
        f"'window_of_unbound' ({FILE}:{window_of_unbound.line}) has it in its annotation, so no argument's shape "
        "gives it a value. Annotate a tensor parameter of window_of_unbound() with K (e.g. pl.Tensor[[K, ...], "
        "...]), or pass the size as a pl.Scalar parameter.")


def test_dynamic_expressions_print_and_pickle():
    import pickle

    e = (M + 1) * 2 - N // 3
    assert str(e) == "(M + 1) * 2 - N // 3"
    assert pl.Tensor[[M * 2, N], pl.FP32].type_name == "pl.Tensor[[M * 2, N], pl.FP32]"
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.evaluate({"M": 4, "N": 7}) == 8


# ---------------------------------------------------------------------------
# 5. L2 programs: several Orchestration functions, no host
# ---------------------------------------------------------------------------


@pl.program
class AddSub:
    @pl.function(type=pl.FunctionType.InCore)
    def add_kernel(self, a: pl.Tensor[[M, SIZE], pl.FP32], b: pl.Tensor[[M, SIZE], pl.FP32],
                   c: pl.Out[pl.Tensor[[M, SIZE], pl.FP32]]):
        for i in pl.range(M):
            pl.store(pl.add(pl.load(a, [i, 0], [1, SIZE]), pl.load(b, [i, 0], [1, SIZE])), [i, 0], c)
        return c

    @pl.function(type=pl.FunctionType.InCore)
    def sub_kernel(self, a: pl.Tensor[[M, SIZE], pl.FP32], b: pl.Tensor[[M, SIZE], pl.FP32],
                   c: pl.Out[pl.Tensor[[M, SIZE], pl.FP32]]):
        for i in pl.range(M):
            pl.store(pl.sub(pl.load(a, [i, 0], [1, SIZE]), pl.load(b, [i, 0], [1, SIZE])), [i, 0], c)
        return c

    @pl.function(type=pl.FunctionType.Orchestration)
    def subtract(self, x: pl.Tensor[[M, SIZE], pl.FP32], y: pl.Tensor[[M, SIZE], pl.FP32],
                 diff: pl.Out[pl.Tensor[[M, SIZE], pl.FP32]]) -> pl.Tensor[[M, SIZE], pl.FP32]:
        return self.sub_kernel(x, y, diff)

    @pl.function(type=pl.FunctionType.Orchestration)
    def add(self, a: pl.Tensor[[M, SIZE], pl.FP32], b: pl.Tensor[[M, SIZE], pl.FP32],
            out: pl.Out[pl.Tensor[[M, SIZE], pl.FP32]]) -> pl.Tensor[[M, SIZE], pl.FP32]:
        return self.add_kernel(a, b, out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_l2_program_with_several_orchestrations(backend):
    compiled = ir.compile(AddSub, config=RunConfig(**({"backend": backend} if backend else {})))
    assert compiled.orchestration_names == ["add", "subtract"]
    assert compiled.param_names == ["a", "b", "out"]  # the first orchestration by name, as PyPTO reports
    assert compiled["subtract"].param_names == ["x", "y", "diff"]
    assert compiled["subtract"].output_indices == [2]
    a, b = rand(3, SIZE), rand(3, SIZE)
    out = np.zeros_like(a)
    compiled["add"](a, b, out)
    np.testing.assert_allclose(out, a + b, rtol=1e-6)
    diff = compiled.subtract(a, b)  # attribute form, inputs only: the output is created and returned
    np.testing.assert_allclose(diff, a - b, rtol=1e-6)
    assert (compiled["add"].output_dir.parent.parent) == compiled.output_dir
    assert compiled["add"].output_dir.name == "add"


def test_l2_program_errors():
    compiled = ir.compile(AddSub, config=RunConfig(backend="sim"))
    with pytest.raises(KeyError) as info:
        compiled["mul"]
    assert str(info.value) == "No orchestration 'mul' in program 'AddSub'. Available: ['add', 'subtract']."
    a = rand(2, SIZE)
    with pytest.raises(DispatchTypeError) as info:
        compiled(a, a)
    assert str(info.value) == (
        "AddSub(...): program 'AddSub' has 2 L2 orchestrations ['add', 'subtract'] and no host orchestrator, so it "
        "is ambiguous which one to run. Select one explicitly: compiled['add'](...) or compiled.add(...).")
    with pytest.raises(AttributeError):
        _ = compiled.mul


@pl.program
class OnlyScale:
    @pl.function(type=pl.FunctionType.Orchestration)
    def run(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
        return scale_kernel(x, y, 4.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_l2_program_with_one_orchestration_is_called_directly(backend):
    compiled = ir.compile(OnlyScale, config=RunConfig(**({"backend": backend} if backend else {})))
    assert compiled.orchestration_names == []
    assert compiled.param_names == ["x", "y"]
    x = rand(1, SIZE)
    y = compiled(x)
    np.testing.assert_allclose(y, 4.0 * x, rtol=1e-6)
    with pytest.raises(KeyError) as info:
        compiled["run"]
    assert str(info.value) == ("No orchestration 'run' in program 'OnlyScale'. Available: []. 'OnlyScale' is not an "
                               "L2 program with several orchestrations: call it directly, compiled(...).")


def test_a_program_with_no_host_and_no_orchestration_is_refused():
    with pytest.raises(ProgramError) as info:
        @pl.program
        class KernelsOnly:
            @pl.function(type=pl.FunctionType.InCore)
            def kernel(self, x: pl.Tensor[[1, 8], pl.FP32]):
                pass
    line = source_line(test_a_program_with_no_host_and_no_orchestration_is_refused, "class KernelsOnly:")
    assert str(info.value) == (
        "@pl.program class KernelsOnly needs exactly one host orchestrator (@pl.function(level=pl.Level.HOST, "
        "role=pl.Role.Orchestrator)); found none, and no Orchestration function "
        "(@pl.function(type=pl.FunctionType.Orchestration)) for an L2 program either "
        f"(class KernelsOnly at {FILE}:{line}). Add a host orchestrator that dispatches its per-device "
        "functions, or mark the function(s) the program runs on one chip "
        "@pl.function(type=pl.FunctionType.Orchestration).")


@pytest.mark.parametrize("backend", BACKENDS)
def test_l2_orchestrations_and_comm_less_calls_on_a_worker(backend):
    from ptodist import shared_array

    def shared(a):
        out = shared_array(a.shape, a.dtype)
        out[...] = a
        return out

    compiled = ir.compile(AddSub, config=RunConfig(**({"backend": backend} if backend else {})))
    a, b = shared(rand(3, SIZE)), shared(rand(3, SIZE))
    out, diff = shared(np.zeros_like(a)), shared(np.zeros_like(a))
    with compiled["add"].prepare(extra_compiled=[compiled["subtract"]]) as rt:
        rt.run(compiled["add"], a, b, out)
        rt.run(compiled["subtract"], a, b, diff)
    np.testing.assert_allclose(out, a + b, rtol=1e-6)
    np.testing.assert_allclose(diff, a - b, rtol=1e-6)
    with pytest.raises(DispatchTypeError, match=r"AddSub.prepare\(\): program 'AddSub' has 2 L2 orchestrations"):
        compiled.prepare()

    x, y = shared(rand(3, 1, SIZE)), shared(np.zeros((3, 1, SIZE), np.float32))
    with three_commless.compile(x, y, config=cfg(2, backend)).prepare() as rt:
        rt(x, y)
    np.testing.assert_allclose(y, 3.0 * x, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_intermediates_on_a_worker_are_fresh_and_zeroed_every_dispatch(backend):
    a, b = rand(2, 1, SIZE), rand(2, 1, SIZE) + 1
    with sum_times_diff.compile(a, b, config=cfg(2, backend)).prepare() as rt:
        for _ in range(3):
            f = np.zeros_like(a) if backend == "sim" else ptodist.shared_array(a.shape, np.float32)
            x, y = (a, b) if backend == "sim" else (_shared(a), _shared(b))
            rt(x, y, f)
            np.testing.assert_allclose(f, (a + b) * (a - b), rtol=1e-5, atol=1e-6)


def _shared(a: np.ndarray) -> np.ndarray:
    out = ptodist.shared_array(a.shape, a.dtype)
    out[...] = a
    return out
