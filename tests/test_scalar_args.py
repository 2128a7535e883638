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

import ml_dtypes
import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig
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
