"""Errors the language and ``ptodist.testing`` raise on purpose: each a ``PtodistError`` *and* the builtin.

Every ``raise`` of ``ptodist.language`` and ``ptodist.testing.check`` raises a subclass of
:class:`~ptodist.errors.PtodistError` that also subclasses the builtin a user would catch
(``TypeError``, ``ValueError``), so ``except TypeError`` keeps working while reports, ``ptodist run``
and ``ptodist.testing.check`` treat it as ptodist's deliberate error, never as a bug in ptodist.
Each test triggers one raise site the way a user would and pins its class and exact message.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
from conftest import on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
import ptodist.testing
from ptodist import DistributedConfig, RunConfig
from ptodist.errors import (
    ApiTypeError,
    ConfigError,
    DeclarationError,
    KernelError,
    KernelValueError,
    OperationTypeError,
    OperationValueError,
    ProgramError,
    PtodistError,
    PtodistInternalError,
    RankError,
    TileIndexError,
    TileTypeError,
    TileValueError,
)
from ptodist.language.scalar import Scalar
from ptodist.language.tile_ops import Tile
from ptodist.rank import failures

SIZE = 4
NR = pl.dynamic("NR")


def _at(op: str) -> str:
    """How a message names ``op`` called by :func:`raises`: the op and the line of that call (the user's line)."""
    lines, first = inspect.getsourcelines(raises)
    return f"{op} at {__file__}:{first + next(i for i, t in enumerate(lines) if 'fn(*args, **kwargs)' in t)}"


def raises(cls: type, builtin: type, message: str, fn, *args, **kwargs) -> BaseException:
    """Call ``fn``; it must raise exactly ``cls`` (a PtodistError and ``builtin``) with ``message``."""
    with pytest.raises(builtin, match=f"^{re.escape(message)}$") as info:
        fn(*args, **kwargs)
    e = info.value
    assert type(e) is cls, f"raised {type(e).__name__}, not {cls.__name__}"
    assert isinstance(e, PtodistError) and isinstance(e, builtin)
    assert not isinstance(e, PtodistInternalError)
    assert str(e) == message
    assert failures.ptodist_bug(e) is None  # raised on purpose: never reported as a bug in ptodist
    return e


def _tile(values, dtype=pl.FP32) -> Tile:
    return Tile(np.asarray(values, dtype=dtype.np_dtype), dtype)


# ---------------------------------------------------------------------------
# The classes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls, bases", [
    (DeclarationError, (ProgramError, TypeError)),
    (OperationTypeError, (PtodistError, TypeError)),
    (OperationValueError, (PtodistError, ValueError)),
    (TileTypeError, (KernelError, TypeError)),
    (TileValueError, (KernelValueError, ValueError)),
    (ApiTypeError, (PtodistError, TypeError)),
    (ConfigError, (PtodistError, ValueError)),
])
def test_each_class_is_a_ptodist_error_and_the_builtin(cls, bases):
    assert issubclass(cls, PtodistError) and not issubclass(cls, PtodistInternalError)
    for base in bases:
        assert issubclass(cls, base)
    assert cls.__doc__ and "\n" not in cls.__doc__.strip()  # a one-line docstring
    assert cls.kind == "invalid_argument"  # reported as an argument to correct, never as another kind


def test_except_the_builtin_still_catches_them():
    try:
        pl.range(1, 2, 3, 4)
    except TypeError as e:
        caught = e
    assert isinstance(caught, OperationTypeError)
    try:
        pl.reshape(_tile(np.zeros((3, 4))), [5, 2])
    except ValueError as e:
        caught = e
    assert isinstance(caught, TileValueError)


# ---------------------------------------------------------------------------
# Declarations: decorators (functions.py) and annotations (types.py)
# ---------------------------------------------------------------------------


def test_a_decorator_on_something_that_is_not_a_function():
    raises(DeclarationError, TypeError,
           "a program function must wrap a Python function, got 5: put @pl.jit (or .incore/.host/.inline) or "
           "@pl.function directly above a def",
           pl.jit.incore, 5)


def test_jit_host_does_not_take_a_level():
    raises(DeclarationError, TypeError, "@pl.jit.host does not take level=: HOST is implied; remove level=",
           pl.jit.host, level=pl.Level.HOST)


def test_dynamic_needs_a_name():
    raises(DeclarationError, TypeError, "pl.dynamic() needs a non-empty name string, got ''", pl.dynamic, "")
    raises(DeclarationError, TypeError, "pl.dynamic() needs a non-empty name string, got 3", pl.dynamic, 3)


def test_a_tensor_annotation_needs_shape_and_dtype():
    raises(DeclarationError, TypeError, "pl.Tensor[...] takes [shape, dtype] (and optionally a layout), got [1, 2]",
           lambda: pl.Tensor[[1, 2]])
    raises(DeclarationError, TypeError,
           "pld.DistributedTensor[...] takes [shape, dtype] (and optionally a layout), got [1]",
           lambda: pld.DistributedTensor[[1]])


def test_a_tensor_annotation_needs_a_pl_dtype():
    raises(DeclarationError, TypeError,
           "the dtype in a tensor annotation must be a pl dtype such as pl.FP32, got 'x'",
           lambda: pl.Tensor[[4], "x"])
    raises(DeclarationError, TypeError,
           "the dtype in a tensor annotation must be a pl dtype such as pl.FP32, got <class 'numpy.float32'>",
           lambda: pl.Tensor[[1, 2], np.float32])


def test_a_tensor_dimension_must_be_an_int_or_dynamic():
    raises(DeclarationError, TypeError, "a tensor dimension must be an int or pl.dynamic(...), got 'a'",
           lambda: pl.Tensor[["a", 2], pl.FP32])
    # A float Scalar is no dimension either (its own index error is replaced by the annotation's).
    raises(DeclarationError, TypeError,
           "a tensor dimension must be an int or pl.dynamic(...), got Scalar(4.0, FP32)",
           lambda: pl.Tensor[[Scalar(4.0, pl.FP32)], pl.FP32])


def test_out_and_inout_wrap_a_tensor_annotation():
    raises(DeclarationError, TypeError, "pl.Out[...] wraps a tensor annotation, got <class 'int'>",
           lambda: pl.Out[int])
    raises(DeclarationError, TypeError, "pl.InOut[...] wraps a tensor annotation, got ScalarType(dtype=pl.INT32)",
           lambda: pl.InOut[pl.Scalar[pl.INT32]])


def test_a_scalar_annotation_needs_a_pl_dtype():
    raises(DeclarationError, TypeError, "pl.Scalar[...] takes a pl dtype such as pl.INT32, got <class 'int'>",
           lambda: pl.Scalar[int])


# ---------------------------------------------------------------------------
# Operations: scalars, loops, loads (scalar.py, control.py, memory_ops.py, __init__.py)
# ---------------------------------------------------------------------------


def test_a_float_scalar_is_no_index():
    raises(OperationTypeError, TypeError, "a FP32 Scalar cannot be used as an index; cast it first",
           lambda: [1, 2][Scalar(1.0, pl.FP32)])


def test_range_bounds_must_be_integers():
    raises(OperationTypeError, TypeError, "a pl.range bound must be an integer, got 2.5 (float)", pl.range, 2.5)
    raises(OperationTypeError, TypeError, "a pl.range bound must be an integer, got Scalar(2.0, FP32) (Scalar)",
           pl.range, Scalar(2.0, pl.FP32))


def test_range_takes_one_to_three_bounds():
    raises(OperationTypeError, TypeError, "pl.range takes 1 to 3 positional arguments (start, stop, step), got 4",
           pl.range, 1, 2, 3, 4)
    raises(OperationTypeError, TypeError, "pl.range takes 1 to 3 positional arguments (start, stop, step), got 0",
           pl.range)


def test_yield_must_match_the_carried_values():
    def loop():
        for _i, (acc,) in pl.range(2, init_values=(0,)):
            pl.yield_(acc, acc)

    raises(OperationValueError, ValueError,
           "pl.yield_ got 2 value(s) but the loop carries 1 (one per entry of init_values)", loop)


def test_load_needs_the_tile_shape():
    raises(OperationTypeError, TypeError, "pl.load needs the tile shape: pl.load(tensor, offsets, shapes)",
           pl.load, np.zeros((2, 2), np.float32), [0, 0])


def test_casting_a_scalar_needs_a_target_dtype():
    raises(OperationTypeError, TypeError, "pl.cast needs target_type=<pl dtype>, got None", pl.cast, 3)
    raises(OperationTypeError, TypeError, "pl.cast needs target_type=<pl dtype>, got 'int32'",
           pl.cast, Scalar(3, pl.INT32), "int32")


# ---------------------------------------------------------------------------
# Tile math (the op catalog, language/ops/, and pl.add & co.)
# ---------------------------------------------------------------------------


def test_arithmetic_needs_tiles_or_scalars():
    raises(TileTypeError, TypeError,
           "pl.add takes tensors, tiles or scalars, got str and int: pass tensors (pl.tensor level), tiles "
           "(pl.tile level; pl.load a region of a tensor into a tile), or numbers",
           pl.add, "x", 1)
    raises(TileTypeError, TypeError,
           "pl.maximum takes tensors, tiles or scalars, got ndarray and ndarray: pass tensors (pl.tensor level), "
           "tiles (pl.tile level; pl.load a region of a tensor into a tile), or numbers",
           pl.maximum, np.zeros(2), np.zeros(2))


def test_a_tile_cannot_hold_a_numpy_dtype_without_a_pl_dtype():
    raises(TileTypeError, TypeError,
           "a tile cannot hold numpy dtype complex128: convert the data to one of float32, float16, bfloat16, "
           "int8, int16, int32, int64, uint8, bool, float8_e4m3fn, float8_e8m0fnu, float8_e5m2, uint16, uint32, "
           "uint64, int4, uint4, float4_e2m1fn",
           Tile, np.zeros(2, np.complex128))


def test_a_tile_operand_must_be_a_tile_or_a_scalar():
    t = pl.full([2], 1.0, pl.FP32)
    raises(TileTypeError, TypeError,
           "pl.add: tile operand must be a Tile or a scalar, got ndarray; load tensors into tiles with pl.load first",
           pl.add, t, np.zeros(2))
    raises(TileTypeError, TypeError,
           "pl.mul: tile operand must be a Tile or a scalar, got str; load tensors into tiles with pl.load first",
           lambda: t * "x")


def test_a_tile_operation_needs_a_tile():
    raises(TileTypeError, TypeError,
           "pl.tile.add: needs at least one Tile operand, got int, float; load tensor data into a tile with pl.load",
           pl.tile.add, 1, 2.0)
    raises(TileTypeError, TypeError,
           "pl.tile.div: needs at least one Tile operand, got int, int; load tensor data into a tile with pl.load",
           pl.tile.div, 1, 2)


def test_tiles_that_do_not_broadcast():
    raises(TileValueError, ValueError,
           "pl.add: shapes [2, 3] and [2, 2] do not broadcast "
           "(operands could not be broadcast together with shapes (2,3) (2,2) )",
           pl.add, pl.full([2, 3], 0.0, pl.FP32), pl.full([2, 2], 0.0, pl.FP32))


def test_unary_math_takes_a_tile():
    levels = ": pass tensors (pl.tensor level), tiles (pl.tile level; pl.load a region of a tensor into a tile)"
    raises(TileTypeError, TypeError, "pl.exp takes tensors or tiles, got float" + levels, pl.exp, 3.0)
    raises(TileTypeError, TypeError, "pl.abs takes tensors or tiles, got int" + levels, pl.abs, -1)
    raises(TileTypeError, TypeError, "pl.tile.exp takes a Tile, got float", pl.tile.exp, 3.0)


def test_casting_a_tile_needs_a_target_dtype_a_tile_and_a_known_mode():
    t = _tile([1.5, 2.5])
    raises(TileTypeError, TypeError, "pl.cast needs target_type=<pl dtype>, got None", pl.cast, t)
    raises(TileTypeError, TypeError, "pl.cast takes tensors or tiles, got str and DataType: pass tensors "
           "(pl.tensor level), tiles (pl.tile level; pl.load a region of a tensor into a tile)",
           pl.cast, "x", pl.INT32)
    raises(TileValueError, ValueError, "pl.cast mode='sideways': use one of round, rint, floor, ceil, trunc, none",
           pl.cast, t, pl.INT32, mode="sideways")


def test_row_reductions_take_a_tile_of_at_least_one_dimension():
    raises(TileTypeError, TypeError, "pl.tile.row_sum takes a Tile of at least one dimension, got float",
           pl.tile.row_sum, 3.0)
    raises(TileTypeError, TypeError,
           "pl.tile.row_max takes a Tile of at least one dimension, got Tile(shape=[], dtype=FP32)",
           pl.row_max, Tile(np.float32(1.0)))


def test_matmul_takes_two_tiles_with_matching_inner_dimensions():
    a = _tile(np.ones((2, 2)))
    raises(TileTypeError, TypeError,
           "pl.matmul takes two Tiles, got Tile and ndarray; load tensors into tiles with pl.load first",
           pl.matmul, a, np.ones((2, 2)))
    raises(TileValueError, ValueError, "pl.matmul: inner dimensions differ: [2, 2] @ [3, 1]",
           pl.matmul, a, _tile(np.ones((3, 1))))


def test_reshape_keeps_the_element_count():
    raises(TileValueError, ValueError, "pl.reshape: cannot reshape [3, 4] (12 elements) to [5, 2]",
           pl.reshape, _tile(np.zeros((3, 4))), [5, 2])


def test_slice_and_assemble_regions_need_one_entry_per_dimension():
    a = _tile(np.zeros((3, 4)))
    raises(TileValueError, ValueError, f"{_at('pl.slice')}: offsets [0] and shape [2, 2] must have 2 entries, one "
           "per dimension of the [3, 4] tile", pl.slice, a, [2, 2], [0])
    raises(TileValueError, ValueError, f"{_at('pl.assemble')}: offsets [0, 0, 0] and shape [1, 2] must have 2 "
           "entries, one per dimension of the [3, 4] tile", pl.assemble, a, _tile(np.zeros((1, 2))), [0, 0, 0])


def test_slice_and_assemble_regions_must_lie_in_the_tile():
    a = _tile(np.zeros((3, 4)))
    raises(TileIndexError, IndexError, f"{_at('pl.slice')}: region at offsets [2, 3] with shape [2, 2] is outside "
           "the [3, 4] tile: dimension 0 reaches [2, 4), whose bounds are [0, 3).", pl.slice, a, [2, 2], [2, 3])
    raises(TileIndexError, IndexError, f"{_at('pl.assemble')}: region at offsets [2, 3] with shape [1, 2] is outside "
           "the [3, 4] tile: dimension 1 reaches [3, 5), whose bounds are [0, 4).",
           pl.assemble, a, _tile(np.zeros((1, 2))), [2, 3])
    raises(TileIndexError, IndexError, f"{_at('pl.slice')}: region at offsets [0, 0] with shape [-1, 2] is outside "
           "the [3, 4] tile: dimension 0 has a negative size (-1); sizes are 0 or more.", pl.slice, a, [-1, 2], [0, 0])
    raises(TileIndexError, IndexError, f"{_at('pl.slice')}: region at offsets [9223372036854775807, 0] with shape "
           "[1, 2] is outside the [3, 4] tile: dimension 0 reaches [9223372036854775807, 9223372036854775808), whose "
           "bounds are [0, 3).", pl.slice, a, [1, 2], [2**63 - 1, 0])


def test_a_tile_error_in_a_kernel_is_the_rank_errors_original_and_not_a_ptodist_bug():
    @pl.jit.incore
    def bad_add(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
        t = pl.load(x, [0, 0], [1, SIZE])
        t = pl.add(t, pl.full([1, SIZE - 1], 1.0, pl.FP32))
        return pl.store(t, [0, 0], y)

    host = on_every_rank(bad_add)
    config = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend="sim")
    with pytest.raises(RankError) as info:
        host(np.zeros((2, 1, SIZE), np.float32), np.zeros((2, 1, SIZE), np.float32), config=config)
    e = info.value
    assert type(e) is RankError and not e.internal
    assert type(e.original) is TileValueError
    assert ("failed in task 'bad_add': TileValueError: pl.add: shapes [1, 4] and [1, 3] do not broadcast"
            in str(e))


# ---------------------------------------------------------------------------
# ptodist.testing.check's own arguments
# ---------------------------------------------------------------------------


@pl.jit.host
def _host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32]):
    return x


def test_check_schedules_must_be_a_positive_integer():
    raises(ConfigError, ValueError, "ptodist.testing.check(schedules=0): must be an integer of at least 1",
           ptodist.testing.check, _host, schedules=0)
    raises(ConfigError, ValueError, "ptodist.testing.check(schedules=True): must be an integer of at least 1",
           ptodist.testing.check, _host, schedules=True)


def test_check_seed_must_be_an_integer():
    raises(ConfigError, ValueError, "ptodist.testing.check(seed='7'): must be an integer",
           ptodist.testing.check, _host, seed="7")


def test_check_replay_seed_must_be_an_integer(monkeypatch):
    monkeypatch.setenv(ptodist.testing.REPLAY_ENV, "soon")
    raises(ConfigError, ValueError, "PTODIST_CHECK_SEED='soon': the schedule seed to replay must be an integer",
           ptodist.testing.check, _host)


def test_check_needs_the_devices_of_a_host_function_outside_a_device_ids_test():
    raises(ApiTypeError, TypeError,
           "ptodist.testing.check(_host, ...): pass config=RunConfig(distributed_config=DistributedConfig("
           "device_ids=[...])) (or config=DistributedConfig(...)) to say on which devices it runs, or call check() "
           "in a test that uses the device_ids fixture",
           ptodist.testing.check, _host, np.zeros((2, 1, SIZE), np.float32))


def test_check_takes_a_program():
    raises(ApiTypeError, TypeError,
           "ptodist.testing.check() takes a @pl.jit.host function, a @pl.program class or a compiled program "
           "(host.compile(...), ptodist.ir.compile(...)), got 42",
           ptodist.testing.check, 42)


def test_check_config_is_a_run_config_or_a_distributed_config():
    raises(ApiTypeError, TypeError,
           "ptodist.testing.check(config=...): expects a RunConfig or a DistributedConfig, got list",
           ptodist.testing.check, _host, config=[0, 1])
