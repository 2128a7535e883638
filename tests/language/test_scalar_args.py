"""Scalar arguments: one rule for every scalar parameter, at every level (host orchestrator, per-device function,
kernel) and on every backend.

Any kind of number is accepted (Python and numpy numbers, bools, 0-d arrays and tensors, pl.Scalars); an integer
parameter takes the integral values its dtype holds exactly and refuses the rest (a fraction, NaN, infinity, a value
outside its range) naming the parameter, the value and the range, as an integer tile refuses them; a float parameter
rounds as its dtype rounds.  Never a silent wrap: 2**40 + 7 is not 7.
"""

from __future__ import annotations

import ctypes
import inspect
import math

import ml_dtypes
import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, shared_array
from ptodist.errors import (
    DispatchError,
    DispatchTypeError,
    DispatchValueError,
    ProgramTypeError,
    ProgramValueError,
)

NR = pl.dynamic("NR")


def _program(dtype, out_dtype):
    """host(y, s: dtype) -> per_rank(y[r], s) -> kernel(y, s): the kernel writes s and whether it is a dtype
    Scalar into y [1, 2]."""

    @pl.jit.incore
    def kernel(y: pl.Out[pl.Tensor[[1, 2], out_dtype]], s: pl.Scalar[dtype]):
        pl.write(y, [0, 0], s)
        pl.write(y, [0, 1], 1 if s.dtype is dtype else 0)

    @pl.jit
    def per_rank(y: pl.Out[pl.Tensor[[1, 2], out_dtype]], s: pl.Scalar[dtype]):
        kernel(y, s)

    @pl.jit.host
    def host(y: pl.Out[pl.Tensor[[NR, 1, 2], out_dtype]], s: pl.Scalar[dtype]):
        for r in pl.range(pld.world_size()):
            per_rank(y[r], s, device=r)

    return host


def _run(host, value, backend, out_dtype=np.int64):
    y = np.zeros((2, 1, 2), out_dtype)
    cfg = RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1]))
    host.compile(y, 0, config=cfg)(y, value)
    assert (y[:, 0, 1] == 1).all(), "the kernel did not get a Scalar of the parameter's dtype"
    assert (y[0] == y[1]).all()
    return y[0, 0, 0].item()


INT32 = _program(pl.INT32, pl.INT64)
FP32 = _program(pl.FP32, pl.FP32)
FP16 = _program(pl.FP16, pl.FP32)


@pytest.mark.parametrize("value, expected", [
    (5, 5), (True, 1), (False, 0), (np.int64(-7), -7), (np.uint8(200), 200), (np.int32(2**31 - 1), 2**31 - 1),
    (np.float32(3.0), 3), (np.float64(-4.0), -4), (np.float16(2.0), 2), (ml_dtypes.bfloat16(8.0), 8),
    (np.array(9), 9), (np.array(10.0), 10), (ctypes.c_int64(11), 11), (-2**31, -2**31),
], ids=repr)
def test_an_integer_parameter_takes_every_kind_of_integral_number(value, expected, backend):
    assert _run(INT32, value, backend) == expected


def test_an_integer_parameter_takes_0d_torch_tensors(torch, backend):
    assert _run(INT32, torch.tensor(12), backend) == 12
    assert _run(INT32, torch.tensor(13.0), backend) == 13


@pytest.mark.parametrize("value, expected", [
    (1.5, 1.5), (2, 2.0), (np.float32(0.1), float(np.float32(0.1))), (0.1, float(np.float32(0.1))),
    (np.int64(3), 3.0), (np.float16(0.5), 0.5), (np.array(2.25), 2.25), (True, 1.0), (2**40 + 1, 2.0**40),
], ids=repr)
def test_a_float_parameter_rounds_as_its_dtype(value, expected, backend):
    assert _run(FP32, value, backend, np.float32) == expected


def test_an_fp16_parameter_rounds_to_fp16(backend):
    assert _run(FP16, 0.1, backend, np.float32) == float(np.float16(0.1))


def _where(fn, name: str) -> str:
    lines, first = inspect.getsourcelines(fn.fn)
    line = first + next(i for i, t in enumerate(lines) if f"{name}: pl.Scalar" in t)
    return f"{fn.name}() parameter '{name}' (declared pl.Scalar[pl.{'INT32' if fn is INT32 else 'FP32'}] at " \
           f"{inspect.getsourcefile(fn.fn)}:{line})"


@pytest.mark.parametrize("value, cls, builtin, why", [
    (2**40 + 7, DispatchValueError, ValueError,
     "1099511627783 does not fit INT32 (range -2147483648..2147483647); pass a value in range, or declare the "
     "parameter with a wider dtype"),
    (2**31, DispatchValueError, ValueError,
     "2147483648 does not fit INT32 (range -2147483648..2147483647); pass a value in range, or declare the "
     "parameter with a wider dtype"),
    (np.uint64(2**64 - 1), DispatchValueError, ValueError,
     "18446744073709551615 does not fit INT32 (range -2147483648..2147483647); pass a value in range, or declare "
     "the parameter with a wider dtype"),
    (3.5, DispatchTypeError, TypeError,
     "3.5 has a fraction, but the parameter is INT32 (integers -2147483648..2147483647); pass an integer, or declare "
     "the parameter with a float dtype"),
    (np.float32(0.5), DispatchTypeError, TypeError,
     "0.5 has a fraction, but the parameter is INT32 (integers -2147483648..2147483647); pass an integer, or declare "
     "the parameter with a float dtype"),
    (float("nan"), DispatchValueError, ValueError,
     "nan has no INT32 value (integers -2147483648..2147483647); pass a finite integer"),
    (float("-inf"), DispatchValueError, ValueError,
     "-inf has no INT32 value (integers -2147483648..2147483647); pass a finite integer"),
    (np.array([1, 2]), DispatchTypeError, TypeError,
     "expected a scalar (a Python or numpy number, a 0-d array or tensor, or a pl.Scalar), got a numpy ndarray of "
     "shape [2]."),
    ("3", DispatchTypeError, TypeError,
     "expected a scalar (a Python or numpy number, a 0-d array or tensor, or a pl.Scalar), got '3' (str)."),
], ids=repr)
def test_an_integer_parameter_refuses_what_it_cannot_hold_naming_the_parameter(value, cls, builtin, why, backend):
    with pytest.raises(builtin) as info:
        _run(INT32, value, backend)
    assert type(info.value) is cls and isinstance(info.value, DispatchError)
    assert str(info.value) == f"{_where(INT32, 's')}: {why}"


def test_a_float_parameter_refuses_what_is_not_a_number(backend):
    with pytest.raises(DispatchTypeError) as info:
        _run(FP32, [1.0], backend, np.float32)
    assert str(info.value) == (f"{_where(FP32, 's')}: expected a scalar (a Python or numpy number, a 0-d array or "
                               "tensor, or a pl.Scalar), got [1.0] (list).")


# -- the same rule below the host: the per-device function's and the kernel's parameters ---------------------------

@pl.jit.incore
def _kernel32(y: pl.Out[pl.Tensor[[1, 2], pl.INT64]], s: pl.Scalar[pl.INT32]):
    pl.write(y, [0, 0], s)


@pl.jit
def _widening(y: pl.Out[pl.Tensor[[1, 2], pl.INT64]], s: pl.Scalar[pl.INDEX]):
    _kernel32(y, s * 1024)  # an INDEX value handed to an INT32 kernel parameter


@pl.jit
def _per_rank32(y: pl.Out[pl.Tensor[[1, 2], pl.INT64]], s: pl.Scalar[pl.INT32]):
    _kernel32(y, s)


@pl.jit.host
def _host_widening(y: pl.Out[pl.Tensor[[NR, 1, 2], pl.INT64]], s: pl.Scalar[pl.INDEX]):
    for r in pl.range(pld.world_size()):
        _widening(y[r], s, device=r)


@pl.jit.host
def _host_narrowing(y: pl.Out[pl.Tensor[[NR, 1, 2], pl.INT64]], s: pl.Scalar[pl.INDEX]):
    for r in pl.range(pld.world_size()):
        _per_rank32(y[r], s + 2**32, device=r)


def test_a_kernel_parameter_refuses_a_value_its_dtype_cannot_hold(backend):
    y = np.zeros((2, 1, 2), np.int64)
    cfg = RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1]))
    compiled = _host_widening.compile(y, 0, config=cfg)
    compiled(y, 5)
    assert y[:, 0, 0].tolist() == [5120, 5120]
    with pytest.raises(RankError) as info:
        compiled(y, 2**22)  # 2**32 in the kernel: no INT32 value
    e = info.value.original
    assert type(e) is ProgramValueError
    assert str(e) == (f"{_where_kernel()}: 4294967296 does not fit INT32 (range -2147483648..2147483647); pass a "
                      "value in range, or declare the parameter with a wider dtype")


def _where_kernel() -> str:
    """How the kernel's parameter is named: where it is declared, and the call that gave the value."""
    first = inspect.getsourcelines(_kernel32.fn)[1]
    lines, call = inspect.getsourcelines(_widening.fn)
    call += next(i for i, t in enumerate(lines) if "_kernel32(y, s * 1024)" in t)
    file = inspect.getsourcefile(_kernel32.fn)
    return f"_kernel32() parameter 's' (declared pl.Scalar[pl.INT32] at {file}:{first + 1}), called at {file}:{call}"


def test_a_per_device_parameter_refuses_a_value_its_dtype_cannot_hold_before_running(backend):
    y = np.zeros((2, 1, 2), np.int64)
    cfg = RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1]))
    with pytest.raises(ProgramValueError) as info:
        _host_narrowing.compile(y, 0, config=cfg)(y, 0)
    lines, first = inspect.getsourcelines(_per_rank32.fn)
    host_lines, host_first = inspect.getsourcelines(_host_narrowing.fn)
    dispatched = host_first + next(i for i, t in enumerate(host_lines) if "_per_rank32(y[r]" in t)
    assert str(info.value) == (
        f"_per_rank32() parameter 's' (declared pl.Scalar[pl.INT32] at {inspect.getsourcefile(_per_rank32.fn)}:"
        f"{first + 1}), called at {inspect.getsourcefile(_host_narrowing.fn)}:{dispatched}: 4294967296 does not fit "
        "INT32 (range -2147483648..2147483647); pass a value in range, or declare the parameter with a wider dtype")


def test_an_integer_scalar_is_refused_the_same_way_as_an_integer_tile_refuses_it():
    # The rule of integer tiles (a fraction: TypeError, out of range: ValueError) is the rule of integer arguments.
    with pytest.raises(TypeError, match="has a fraction"):
        pl.add(pl.full([1, 2], 0, pl.INT32), 3.5)
    with pytest.raises(ValueError, match="does not fit the tile's INT32"):
        pl.add(pl.full([1, 2], 0, pl.INT32), 2**40)
    assert issubclass(ProgramTypeError, TypeError) and issubclass(ProgramValueError, ValueError)


# -- plans: a scalar's value selects a plan only when the host orchestrator uses it ---------------------------------

@pl.jit.incore
def _put_value(y: pl.Out[pl.Tensor[[1, 2], pl.FP32]], s: pl.Scalar[pl.FP32]):
    pl.write(y, [0, 0], s)
    pl.write(y, [0, 1], pl.div(pl.full([1, 1], 1.0, pl.FP32), s).data[0, 0].item())  # 1 / s in FP32


@pl.jit
def _per_rank_value(y: pl.Out[pl.Tensor[[1, 2], pl.FP32]], s: pl.Scalar[pl.FP32]):
    _put_value(y, s)


@pl.jit.host
def _passes_on(y: pl.Out[pl.Tensor[[NR, 1, 2], pl.FP32]], s: pl.Scalar[pl.FP32]):
    print("planning _passes_on")
    for r in pl.range(pld.world_size()):
        _per_rank_value(y[r], s, device=r)


@pl.jit.host
def _uses_sign(y: pl.Out[pl.Tensor[[NR, 1, 2], pl.FP32]], s: pl.Scalar[pl.FP32]):
    print("planning _uses_sign")
    sign = math.copysign(1.0, s)  # the host computes with the value: the plan holds for this value only
    for r in pl.range(pld.world_size()):
        _per_rank_value(y[r], sign, device=r)


def _values(compiled, value) -> list:
    y = np.zeros((2, 1, 2), np.float32)
    compiled(y, value)
    assert (y[0] == y[1]).all()
    return y[0, 0].tolist()


def _compiled(host, backend):
    y = np.zeros((2, 1, 2), np.float32)
    return host.compile(y, 0.0, config=RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1])))


def test_a_scalar_the_host_only_passes_on_is_planned_once_and_each_dispatch_gets_its_value(backend, capsys):
    compiled = _compiled(_passes_on, backend)
    got = [_values(compiled, v) for v in (0.0, -0.0, 2.0, 0.5, -0.0, 0.0)]
    assert got == [[0.0, math.inf], [-0.0, -math.inf], [2.0, 0.5], [0.5, 2.0], [-0.0, -math.inf], [0.0, math.inf]]
    assert [math.copysign(1.0, v) for v, _ in got] == [1.0, -1.0, 1.0, 1.0, -1.0, 1.0]
    assert capsys.readouterr().out.count("planning _passes_on") == 1
    plan = (compiled.output_dir / "dispatch_plan.json").read_text()
    assert '{\n              "kind": "argument",\n              "parameter": "s"\n            }' in plan


def test_a_scalar_the_host_uses_selects_its_plan_by_its_exact_bits(backend, capsys):
    compiled = _compiled(_uses_sign, backend)
    # -0.0 == 0.0, but the host's copysign tells them apart: each has its own plan.
    assert [_values(compiled, v) for v in (0.0, -0.0, 0.0, -0.0)] == [[1.0, 1.0], [-1.0, -1.0]] * 2
    nan = float("nan")
    assert _values(compiled, nan) == [1.0, 1.0]
    assert _values(compiled, nan) == [1.0, 1.0]  # a NaN finds its own plan again
    assert capsys.readouterr().out.count("planning _uses_sign") == 3
    assert str(compiled).splitlines()[0].endswith(": 3 dispatch plan(s)")


@pl.jit.incore
def _put_int(y: pl.Out[pl.Tensor[[1, 2], pl.INT64]], a: pl.Scalar[pl.INDEX], b: pl.Scalar[pl.INDEX]):
    pl.write(y, [0, 0], a)
    pl.write(y, [0, 1], b)


@pl.jit
def _per_rank_int(y: pl.Out[pl.Tensor[[1, 2], pl.INT64]], a: pl.Scalar[pl.INDEX], b: pl.Scalar[pl.INDEX]):
    _put_int(y, a, b)


@pl.jit.host
def _branches(y: pl.Out[pl.Tensor[[NR, 1, 2], pl.INT64]], a: pl.Scalar[pl.INDEX], b: pl.Scalar[pl.INDEX]):
    # b is used only when a > 0: a plan made for a <= 0 holds for any b, one made for a > 0 for its b only.
    extra = b * 10 if a > 0 else 7
    for r in pl.range(pld.world_size()):
        _per_rank_int(y[r], a, extra, device=r)


def test_a_scalar_the_host_uses_only_on_some_branch_keys_the_plans_made_on_that_branch(backend):
    y = np.zeros((2, 1, 2), np.int64)
    compiled = _branches.compile(y, 0, 0, config=RunConfig(
        backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1])))
    got = []
    for a, b in [(-1, 5), (-1, 6), (1, 5), (1, 6), (-2, 9), (1, 5), (2, 6)]:
        compiled(y, a, b)
        got.append(y[1, 0].tolist())
    assert got == [[-1, 7], [-1, 7], [1, 50], [1, 60], [-2, 7], [1, 50], [2, 60]]


@pl.jit.host
def _loops(y: pl.Out[pl.Tensor[[NR, 1, 2], pl.INT64]], n: pl.Scalar[pl.INDEX], b: pl.Scalar[pl.INDEX]):
    for _ in range(n):  # the value shapes the plan: n dispatches per rank
        for r in pl.range(pld.world_size()):
            _per_rank_int(y[r], n, b, device=r)


def test_plans_kept_are_bounded_least_recently_used_first():
    y = np.zeros((2, 1, 2), np.int64)
    compiled = _loops.compile(y, 1, 0, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
    for n in range(300):
        compiled.lower(y, n % 3 + 1 + 3 * (n // 3 % 100), n)  # 300 values of n the host uses; b is passed on
    assert str(compiled).splitlines()[0].endswith(": 256 dispatch plan(s)")
    compiled(y, 2, 41)
    assert y[:, 0].tolist() == [[2, 41], [2, 41]]


def test_a_worker_plans_a_step_counter_once(backend, capsys):
    cfg = RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1]))
    y = shared_array((2, 1, 2), np.float32)
    compiled = _passes_on.compile(y, 0.0, config=cfg)  # plans once for the compiled program's own calls
    capsys.readouterr()
    with compiled.prepare() as rt:
        for step in range(50):
            rt(y, float(step))
            assert y[:, 0, 0].tolist() == [step, step]
    assert capsys.readouterr().out.count("planning _passes_on") == 1


@pl.jit.host
def _host_direct(y: pl.Out[pl.Tensor[[NR, 1, 2], pl.INT64]], s: pl.Scalar[pl.INDEX]):
    for r in pl.range(pld.world_size()):
        _per_rank32(y[r], s, device=r)  # an INDEX value handed, as it is, to an INT32 parameter


def test_a_value_a_per_device_parameter_cannot_hold_is_refused_before_running_whatever_the_plan_cache(backend):
    y = np.zeros((2, 1, 2), np.int64)
    cfg = RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1]))
    with pytest.raises(ProgramValueError) as fresh:
        _host_direct.compile(y, 2**40, config=cfg)  # planned for this value
    compiled = _host_direct.compile(y, 5, config=cfg)
    compiled(y, -7)
    assert y[:, 0, 0].tolist() == [-7, -7]
    with pytest.raises(ProgramValueError) as cached:
        compiled(y, 2**40)  # the plan made for 5 serves every value: the value is checked all the same
    assert str(cached.value) == str(fresh.value)
    assert "_per_rank32() parameter 's' (declared pl.Scalar[pl.INT32] at " in str(cached.value)
    assert str(cached.value).endswith(": 1099511627776 does not fit INT32 (range -2147483648..2147483647); pass a "
                                      "value in range, or declare the parameter with a wider dtype")
    assert y[:, 0, 0].tolist() == [-7, -7]  # nothing ran


@pl.jit.incore
def _stage(x: pl.Tensor[[1, 4], pl.FP32], w: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
    pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], w)


@pl.jit.incore
def _take(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], w: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
    pl.store(pl.load(w, [0, 0], [1, 4]), [0, 0], y)


@pl.jit
def _stage_rank(x: pl.Tensor[[1, 4], pl.FP32], w: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
    _stage(x, w)


@pl.jit
def _take_rank(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], w: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
    _take(y, w)


@pl.jit.host
def _broadcast_from(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]], root: int):
    buf = pld.alloc_window_buffer([1, 4], dtype=pl.FP32)
    sbuf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    w = pld.window(buf, [1, 4], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        _stage_rank(x[r], w, device=r)
    pld.tensor.broadcast(w, pld.window(sbuf, [pld.world_size(), 1], dtype=pl.INT32), root=root)
    for r in pl.range(pld.world_size()):
        _take_rank(y[r], w, device=r)


def test_a_scalar_given_to_a_host_collective_selects_the_plan(backend):
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    y = np.zeros_like(x)
    compiled = _broadcast_from.compile(x, y, 0, config=RunConfig(
        backend=backend, distributed_config=DistributedConfig(device_ids=[0, 1])))
    for root in (0, 1, 0, np.int64(1)):
        compiled(x, y, root)
        assert (y == x[int(root)]).all()


def test_a_sub_worker_callback_gets_each_dispatchs_scalar(backend):
    @pl.program
    class Calls:
        @pl.function(type=pl.FunctionType.InCore)
        def kernel(self, x: pl.InOut[pl.Tensor[[1, 4], pl.FP32]], s: pl.Scalar[pl.FP32]):
            pl.write(x, [0, 0], s)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.InOut[pl.Tensor[[1, 4], pl.FP32]], s: pl.Scalar[pl.FP32]):
            self.kernel(x, s)

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def inspect(self, x: pl.Tensor[[NR, 1, 4], pl.FP32], step: pl.Scalar[pl.FP32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.InOut[pl.Tensor[[NR, 1, 4], pl.FP32]], s: pl.Scalar[pl.FP32]):
            for r in pl.range(pld.world_size()):
                self.chip(x[r], s, device=r)
            self.inspect(x, s)

    from ptodist import ir

    compiled = ir.compile(Calls, config=RunConfig(backend=backend,
                                                  distributed_config=DistributedConfig(device_ids=[0, 1])))
    seen = []
    x = shared_array((2, 1, 4), np.float32)
    with compiled.prepare(callbacks={"inspect": lambda t, step: seen.append((step, float(t[0, 0, 0])))}) as rt:
        for v in (1.0, 2.0, -0.0):
            rt(x, v)
    assert seen == [(1.0, 1.0), (2.0, 2.0), (-0.0, -0.0)]
    assert math.copysign(1.0, seen[2][0]) == -1.0
