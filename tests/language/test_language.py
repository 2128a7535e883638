"""The single-device language a kernel author relies on: scalars, dtypes, annotations, tile math, loops.

Everything here is pure (no program runs): it pins down the semantics that
kernels compute with, above all the device's C integer semantics.
"""

from __future__ import annotations

import ctypes
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist.errors import ProgramError
from ptodist.language.scalar import Scalar
from ptodist.language.tile_ops import Tile
from ptodist.language.types import Direction, DynDim, ScalarType, TensorType

# ---------------------------------------------------------------------------
# Scalar: the device's C semantics
# ---------------------------------------------------------------------------


def test_truncated_modulo_of_a_negative_neighbour_is_negative():
    # The documented pitfall: (r - 1) % n is -1 for r = 0 on the device, not n - 1.
    left = (Scalar(0, pl.INT32) - 1) % 4
    assert left == -1
    assert left.dtype is pl.INT32
    assert (Scalar(0, pl.INT32) - 1 + 4) % 4 == 3


@pytest.mark.parametrize("a, b, q, r", [
    (7, 2, 3, 1), (-7, 2, -3, -1), (7, -2, -3, 1), (-7, -2, 3, -1), (-1, 4, 0, -1), (6, 3, 2, 0),
])
def test_integer_division_and_modulo_truncate_toward_zero(a, b, q, r):
    x = Scalar(a, pl.INT32)
    assert x / b == q
    assert x // b == q  # `//` is C division too, not Python's floor division
    assert x % b == r
    assert (x / b).dtype is pl.INT32
    # The reflected forms (int on the left) follow the same rules.
    assert a / Scalar(b, pl.INT32) == q
    assert a // Scalar(b, pl.INT32) == q
    assert a % Scalar(b, pl.INT32) == r


def test_int32_arithmetic_wraps_around():
    big = Scalar(2**31 - 1, pl.INT32)
    assert big + 1 == -(2**31)
    assert (big + 1).dtype is pl.INT32
    assert Scalar(-(2**31), pl.INT32) - 1 == 2**31 - 1
    assert big * 2 == -2
    assert Scalar(2**32 + 5, pl.INT32) == 5  # construction wraps too
    assert -Scalar(-(2**31), pl.INT32) == -(2**31)
    assert Scalar(200, pl.UINT8) + 100 == 44
    assert Scalar(-1, pl.UINT8) == 255


def test_integer_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError, match="integer division by zero"):
        Scalar(1, pl.INT32) / 0
    with pytest.raises(ZeroDivisionError):
        Scalar(1, pl.INT32) % Scalar(0, pl.INT32)


def test_mixed_int_and_float_promotes_to_float():
    x = Scalar(7, pl.INT32)
    assert x + 0.5 == 7.5
    assert (x + 0.5).dtype.is_float
    assert x / 2.0 == 3.5  # a float divisor: true division
    assert 1.5 * x == 10.5
    y = Scalar(0.5, pl.FP32)
    assert (x + y).dtype is pl.FP32 and x + y == 7.5
    assert (y + x).dtype is pl.FP32


def test_mixed_integer_widths_promote_to_the_wider_type():
    s = Scalar(2**31 - 1, pl.INT32) + Scalar(1, pl.INT64)
    assert s.dtype is pl.INT64
    assert s == 2**31


def test_scalar_is_an_index():
    n = Scalar(3, pl.INT32)
    assert list(range(n)) == [0, 1, 2]
    assert [10, 20, 30, 40][Scalar(2, pl.INDEX)] == 30
    assert np.arange(5)[Scalar(4, pl.INT64)] == 4
    assert np.zeros((Scalar(2, pl.INT32), 3)).shape == (2, 3)
    assert int(Scalar(-3, pl.INT8)) == -3
    with pytest.raises(TypeError, match="FP32 Scalar cannot be used as an index; cast it first"):
        [1, 2][Scalar(1.0, pl.FP32)]


def test_scalar_comparisons_and_formatting():
    x = Scalar(5, pl.INT32)
    assert x == 5 and x != 4 and x < 6 and x <= 5 and x > 4 and x >= 5
    assert x == Scalar(5, pl.INT64)
    assert str(x) == "5" and f"{x:03d}" == "005"
    assert repr(x) == "Scalar(5, INT32)"
    assert hash(x) == hash(5)
    assert bool(Scalar(0, pl.INT32)) is False


def test_const_min_max_on_scalars():
    c = pl.const(-1, pl.INT32)
    assert c.dtype is pl.INT32 and c == -1
    assert pl.const(3).dtype is pl.INT32
    assert pl.min(Scalar(3, pl.INT32), 5) == 3
    assert pl.max(Scalar(3, pl.INT32), 5) == 5
    assert pl.add(Scalar(2, pl.INT32), 3) == 5
    assert pl.div(Scalar(-7, pl.INT32), 2) == -3


# -- property tests against a C reference --------------------------------------

_C_TYPES = {pl.INT8: ctypes.c_int8, pl.INT32: ctypes.c_int32, pl.INT64: ctypes.c_int64}


def _c_wrap(value: int, dtype) -> int:
    """What a C variable of ``dtype`` holds after assigning ``value`` (two's complement)."""
    return _C_TYPES[dtype](value).value


def _c_div(a: int, b: int) -> int:
    return int(Fraction(a, b))  # int(Fraction) truncates toward zero, as C99 `/` does


def _ints(dtype):
    bits = dtype.bits
    return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


_DTYPES = st.sampled_from([pl.INT8, pl.INT32, pl.INT64])


@given(data=st.data(), dtype=_DTYPES)
def test_scalar_add_sub_mul_match_c(data, dtype):
    a, b = data.draw(_ints(dtype)), data.draw(_ints(dtype))
    x, y = Scalar(a, dtype), Scalar(b, dtype)
    assert (x + y).value == _c_wrap(a + b, dtype)
    assert (x - y).value == _c_wrap(a - b, dtype)
    assert (x * y).value == _c_wrap(a * b, dtype)
    assert (x + y).dtype is dtype


@given(data=st.data(), dtype=_DTYPES)
def test_scalar_div_mod_match_c(data, dtype):
    a = data.draw(_ints(dtype))
    b = data.draw(_ints(dtype).filter(lambda v: v != 0))
    x, y = Scalar(a, dtype), Scalar(b, dtype)
    q = _c_div(a, b)
    assert (x / y).value == _c_wrap(q, dtype)
    assert (x // y).value == _c_wrap(q, dtype)
    assert (x % y).value == _c_wrap(a - b * q, dtype)
    # C's identity: (a / b) * b + a % b == a (modulo the type's width)
    assert ((x / y) * y + x % y).value == a
    # The remainder has the dividend's sign and is smaller than the divisor.
    r = (x % y).value
    assert r == 0 or (r > 0) == (a > 0)
    assert abs(r) < abs(b)


@given(value=st.integers(-(2**70), 2**70), dtype=_DTYPES)
def test_scalar_construction_wraps_like_c(value, dtype):
    assert Scalar(value, dtype).value == _c_wrap(value, dtype)


@given(r=st.integers(0, 63), n=st.integers(1, 64))
def test_neighbour_index_hint_is_always_in_range(r, n):
    r = r % n
    me, nn = Scalar(r, pl.INT32), Scalar(n, pl.INT32)
    left = (me - 1 + nn) % nn
    assert 0 <= left.value < n
    assert left.value == (r - 1) % n  # Python's floor modulo agrees once the operand is non-negative
    assert ((me - 1) % nn).value == int(math.fmod(r - 1, n))  # C: the remainder takes the dividend's sign


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, nbytes", [
    (pl.FP32, 4), (pl.FP16, 2), (pl.BF16, 2), (pl.INT8, 1), (pl.INT16, 2), (pl.INT32, 4), (pl.INT64, 8),
    (pl.UINT8, 1), (pl.BOOL, 1), (pl.INDEX, 8), (pl.FP8E4M3FN, 1), (pl.FP8E8M0, 1),
])
def test_get_byte(dtype, nbytes):
    assert dtype.get_byte() == nbytes
    assert repr(dtype) == f"pl.{dtype.name}"


def test_bf16_is_ml_dtypes_bfloat16():
    assert pl.BF16.np_dtype == np.dtype(ml_dtypes.bfloat16)
    t = pl.full([1, 4], 1.5, pl.BF16)
    assert t.data.dtype == ml_dtypes.bfloat16
    # BF16 math stays in BF16 (8 bits of mantissa): 256 + 1 rounds back to 256.
    s = pl.add(pl.full([1, 1], 256.0, pl.BF16), 1.0)
    assert s.dtype is pl.BF16 and float(s.data[0, 0]) == 256.0


def test_index_is_a_64_bit_integer():
    assert pl.INDEX.bits == 64 and not pl.INDEX.is_float and pl.INDEX.is_signed
    assert Scalar(2**63, pl.INDEX) == -(2**63)


# ---------------------------------------------------------------------------
# Annotations become ParamSpecs
# ---------------------------------------------------------------------------


def test_annotations_are_parsed_into_param_specs():
    NR = pl.dynamic("NR")

    @pl.jit.incore
    def k(x: pl.Tensor[[1, 64], pl.FP32],
          y: pl.Out[pl.Tensor[[NR, 64], pl.FP16]],
          d: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]],
          w: pld.DistributedTensor[[4], pl.BF16],
          anything: pl.Tensor,
          out_any: pl.Out[pl.Tensor],
          r: pl.Scalar[pl.INT32],
          n: pl.Scalar[pl.INDEX],
          plain: int,
          bare):
        pass

    specs = {p.name: p for p in k.params}
    assert list(specs) == ["x", "y", "d", "w", "anything", "out_any", "r", "n", "plain", "bare"]

    x = specs["x"]
    assert (x.kind, x.direction) == ("tensor", Direction.IN)
    assert x.ttype == TensorType((1, 64), pl.FP32, False)
    assert x.type_name == "pl.Tensor[[1, 64], pl.FP32]"

    y = specs["y"]
    assert (y.kind, y.direction) == ("tensor", Direction.OUT)
    assert isinstance(y.ttype.shape[0], DynDim) and y.ttype.shape[0].name == "NR"
    assert y.ttype.shape[1] == 64 and y.ttype.dtype is pl.FP16
    assert y.type_name == "pl.Out[pl.Tensor[[NR, 64], pl.FP16]]"

    d = specs["d"]
    assert (d.kind, d.direction, d.ttype.distributed) == ("tensor", Direction.INOUT, True)
    assert d.type_name == "pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]"

    w = specs["w"]
    assert (w.direction, w.ttype) == (Direction.IN, TensorType((4,), pl.BF16, True))

    assert specs["anything"].ttype == TensorType(None, None, False)
    assert specs["anything"].type_name == "pl.Tensor"
    assert (specs["out_any"].kind, specs["out_any"].direction) == ("tensor", Direction.OUT)

    assert specs["r"].kind == "scalar" and specs["r"].ttype == ScalarType(pl.INT32)
    assert specs["r"].type_name == "pl.Scalar[pl.INT32]"
    assert specs["n"].ttype == ScalarType(pl.INDEX)
    assert specs["plain"].kind == "scalar"
    assert specs["bare"].kind == "any" and specs["bare"].type_name == "unannotated"


def test_closure_constants_work_in_annotations():
    def make(nr):
        @pl.jit.incore
        def k(x: pl.Tensor[[nr, 8], pl.FP32]):
            pass
        return k

    assert make(3).params[0].ttype.shape == (3, 8)
    assert make(5).params[0].ttype.shape == (5, 8)


def test_scalar_dimensions_are_accepted_in_annotations():
    assert pl.Tensor[[Scalar(4, pl.INT64), 2], pl.FP32].shape == (4, 2)


def test_bad_annotations_say_what_is_expected():
    with pytest.raises(TypeError, match=r"pl.Tensor\[...\] takes \[shape, dtype\]"):
        pl.Tensor[[1, 2]]
    with pytest.raises(TypeError, match="the dtype in a tensor annotation must be a pl dtype such as pl.FP32"):
        pl.Tensor[[1, 2], np.float32]
    with pytest.raises(TypeError, match=r"a tensor dimension must be an int or pl.dynamic\(...\), got 'a'"):
        pl.Tensor[["a", 2], pl.FP32]
    with pytest.raises(TypeError, match=r"pl.Scalar\[...\] takes a pl dtype such as pl.INT32"):
        pl.Scalar[int]
    with pytest.raises(TypeError, match=r"pl.Out\[...\] wraps a tensor annotation"):
        pl.Out[int]
    with pytest.raises(TypeError, match=r"pl.InOut\[...\] wraps a tensor annotation"):
        pl.InOut[pl.Scalar[pl.INT32]]
    with pytest.raises(TypeError, match="pl.dynamic\\(\\) needs a non-empty name string"):
        pl.dynamic("")


def test_unevaluable_annotation_names_function_and_location():
    def make():
        @pl.jit.incore
        def k(x: pl.Tensor[[UNDEFINED_NR, 8], pl.FP32]):  # noqa: F821
            pass
        return k

    k = make()
    with pytest.raises(ProgramError,
                       match=r"cannot evaluate the annotations of k\(\) at .*test_language.py:\d+: .*UNDEFINED_NR"):
        _ = k.params


# ---------------------------------------------------------------------------
# Tile math on numpy
# ---------------------------------------------------------------------------


def _tile(values, dtype=pl.FP32) -> Tile:
    return Tile(np.asarray(values, dtype=dtype.np_dtype), dtype)


def test_elementwise_ops_with_broadcasting():
    a = _tile([[1, 2, 3, 4], [5, 6, 7, 8]])
    row = _tile([[10, 20, 30, 40]])
    col = _tile([[100], [200]])
    np.testing.assert_array_equal(pl.add(a, row).data, a.data + row.data)
    np.testing.assert_array_equal(pl.sub(a, col).data, a.data - col.data)
    np.testing.assert_array_equal(pl.mul(a, row).data, a.data * row.data)
    np.testing.assert_array_equal(pl.div(a, col).data, a.data / col.data)
    np.testing.assert_array_equal(pl.maximum(a, 4.5).data, np.maximum(a.data, 4.5))
    np.testing.assert_array_equal(pl.minimum(a, row).data, a.data)
    assert pl.add(a, row).shape == [2, 4] and pl.add(a, row).dtype is pl.FP32


def test_tile_scalar_ops_keep_the_tile_dtype():
    a = _tile([[1, 2], [3, 4]])
    np.testing.assert_array_equal(pl.add(a, 1).data, [[2, 3], [4, 5]])
    np.testing.assert_array_equal(pl.mul(a, Scalar(3, pl.INT32)).data, [[3, 6], [9, 12]])
    np.testing.assert_array_equal(pl.sub(10.0, a).data, [[9, 8], [7, 6]])
    np.testing.assert_array_equal(pl.adds(a, 0.5).data, [[1.5, 2.5], [3.5, 4.5]])
    assert pl.add(a, Scalar(3, pl.INT32)).dtype is pl.FP32
    h = _tile([[1, 2]], pl.FP16)
    assert pl.mul(h, 2.0).dtype is pl.FP16 and pl.mul(h, 2.0).data.dtype == np.float16


def test_tile_operators():
    a = _tile([[1, 2], [4, 8]])
    b = _tile([[2, 2], [2, 2]])
    np.testing.assert_array_equal((a + b).data, [[3, 4], [6, 10]])
    np.testing.assert_array_equal((a - b).data, [[-1, 0], [2, 6]])
    np.testing.assert_array_equal((a * b).data, [[2, 4], [8, 16]])
    np.testing.assert_array_equal((a / b).data, [[0.5, 1], [2, 4]])
    np.testing.assert_array_equal((1 + a).data, [[2, 3], [5, 9]])
    np.testing.assert_array_equal((1 - a).data, [[0, -1], [-3, -7]])
    np.testing.assert_array_equal((8 / a).data, [[8, 4], [2, 1]])
    np.testing.assert_array_equal((2 * a).data, [[2, 4], [8, 16]])
    np.testing.assert_array_equal((-a).data, [[-1, -2], [-4, -8]])
    np.testing.assert_array_equal(abs(-a).data, a.data)
    np.testing.assert_array_equal(pl.neg(a).data, -a.data)
    np.testing.assert_array_equal(pl.abs(_tile([[-1, 1]])).data, [[1, 1]])


def test_integer_tile_division_truncates_like_scalars():
    a = _tile([[-7, 7, -1, 6]], pl.INT32)
    q = pl.div(a, 2)
    assert q.dtype is pl.INT32
    np.testing.assert_array_equal(q.data, [[-3, 3, 0, 3]])
    np.testing.assert_array_equal((a / _tile([[2, -2, 4, -3]], pl.INT32)).data, [[-3, -3, 0, -2]])


def test_unary_math():
    a = _tile([[1.0, 4.0, 16.0]])
    np.testing.assert_allclose(pl.exp(a).data, np.exp(a.data), rtol=1e-6)
    np.testing.assert_allclose(pl.log(a).data, np.log(a.data), rtol=1e-6)
    np.testing.assert_allclose(pl.sqrt(a).data, [[1, 2, 4]])
    np.testing.assert_allclose(pl.rsqrt(a).data, [[1, 0.5, 0.25]])
    assert pl.rsqrt(a).dtype is pl.FP32


def test_cast_tiles_and_scalars():
    a = _tile([[1.25, -2.5]])
    h = pl.cast(a, target_type=pl.FP16)
    assert h.dtype is pl.FP16 and h.data.dtype == np.float16
    b = pl.cast(a, pl.BF16)
    assert b.dtype is pl.BF16 and b.data.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(pl.cast(b, dtype=pl.FP32).data, a.data)
    i = pl.cast(_tile([[3, -4]], pl.INT32), target_type=pl.FP32)
    assert i.dtype is pl.FP32 and i.data.tolist() == [[3.0, -4.0]]
    s = pl.cast(Scalar(3, pl.INT32), target_type=pl.FP32)
    assert s.dtype is pl.FP32 and s == 3.0
    assert pl.cast(Scalar(7, pl.INT64), target_type=pl.INT8).dtype is pl.INT8
    with pytest.raises(TypeError, match=r"pl.cast needs target_type=<pl dtype>"):
        pl.cast(a)


def test_row_reductions_keep_a_size_one_last_axis():
    a = _tile([[1, 5, 3], [-2, -8, 0]])
    assert pl.row_sum(a).shape == [2, 1]
    np.testing.assert_array_equal(pl.row_sum(a).data, [[9], [-10]])
    np.testing.assert_array_equal(pl.row_max(a).data, [[5], [0]])
    np.testing.assert_array_equal(pl.row_min(a).data, [[1], [-8]])
    assert pl.row_sum(_tile([[1, 2]], pl.FP16)).dtype is pl.FP16


def test_matmul_accumulates_in_fp32():
    a = _tile([[1, 2], [3, 4]], pl.FP16)
    b = _tile([[5, 6], [7, 8]], pl.FP16)
    c = pl.matmul(a, b)
    assert c.dtype is pl.FP32 and c.shape == [2, 2]
    np.testing.assert_array_equal(c.data, [[19, 22], [43, 50]])
    assert pl.matmul(a, b, out_dtype=pl.FP16).dtype is pl.FP16
    ci = pl.matmul(_tile([[1, 2]], pl.INT8), _tile([[3], [4]], pl.INT8))
    assert ci.dtype is pl.INT32 and ci.data.tolist() == [[11]]
    with pytest.raises(ValueError, match=r"pl.matmul: inner dimensions differ: \[2, 2\] @ \[3, 1\]"):
        pl.matmul(a, _tile([[1], [2], [3]], pl.FP16))


def test_full_accepts_both_argument_orders():
    a = pl.full([2, 3], 1.5, pl.FP32)
    b = pl.full([2, 3], pl.FP32, 1.5)
    c = pl.full([2, 3], dtype=pl.INT32, value=7)
    d = pl.full([2], value=Scalar(4, pl.INT32), dtype=pl.INT32)
    assert a.shape == b.shape == [2, 3]
    np.testing.assert_array_equal(a.data, b.data)
    assert a.dtype is b.dtype is pl.FP32
    assert c.dtype is pl.INT32 and (c.data == 7).all()
    assert d.data.tolist() == [4, 4]
    assert (pl.full([1, 2], dtype=pl.FP16).data == 0).all()


def test_reshape_slice_assemble():
    a = _tile(np.arange(12).reshape(3, 4))
    r = pl.reshape(a, [4, 3])
    assert r.shape == [4, 3] and r.data.ravel().tolist() == list(range(12))
    with pytest.raises(ValueError, match=r"pl.reshape: cannot reshape \[3, 4\] \(12 elements\) to \[5, 2\]"):
        pl.reshape(a, [5, 2])

    s = pl.slice(a, [2, 2], [1, 1])
    assert s.data.tolist() == [[5, 6], [9, 10]]
    s.data[...] = 0  # a slice is a copy: the source tile is untouched
    assert a.data[1, 1] == 5
    with pytest.raises(IndexError, match=r"pl.slice at .*: region at offsets \[2, 3\] with shape \[2, 2\] is outside the \[3, 4\] tile"):
        pl.slice(a, [2, 2], [2, 3])

    dst = pl.full([3, 4], 0.0, pl.FP32)
    out = pl.assemble(dst, pl.full([1, 2], 9.0, pl.FP32), [2, 1])
    assert out.data.tolist()[2] == [0, 9, 9, 0]
    assert (dst.data == 0).all()  # assemble returns a new tile
    with pytest.raises(IndexError, match=r"pl.assemble at .*: region at offsets \[2, 3\] with shape \[1, 2\]"):
        pl.assemble(dst, pl.full([1, 2], 9.0, pl.FP32), [2, 3])


def test_broadcast_failure_names_both_shapes():
    with pytest.raises(ValueError, match=r"pl.add: shapes \[2, 3\] and \[2, 2\] do not broadcast"):
        pl.add(pl.full([2, 3], 0.0, pl.FP32), pl.full([2, 2], 0.0, pl.FP32))


def test_arithmetic_on_something_else_names_the_levels():
    with pytest.raises(TypeError, match=r"pl.add takes tensors, tiles or scalars, got str and int: pass tensors "
                                        r"\(pl.tensor level\), tiles \(pl.tile level; pl.load a region of a tensor "
                                        r"into a tile\), or numbers"):
        pl.add("x", 1)


# ---------------------------------------------------------------------------
# Loops
# ---------------------------------------------------------------------------


def test_range_indices_are_index_scalars_with_c_semantics():
    idx = list(pl.range(3))
    assert idx == [0, 1, 2]
    assert all(isinstance(i, Scalar) and i.dtype is pl.INDEX for i in idx)
    assert [(i - 1) % 3 for i in pl.range(3)] == [-1, 0, 1]
    assert list(pl.range(1, 7, 2)) == [1, 3, 5]
    assert list(pl.range(3, 0, -1)) == [3, 2, 1]
    assert list(pl.range(Scalar(2, pl.INT32))) == [0, 1]
    assert list(pl.parallel(2)) == [0, 1] and list(pl.unroll(2)) == [0, 1]


def test_range_rejects_bad_bounds():
    with pytest.raises(TypeError, match=r"a pl.range bound must be an integer, got 2.5 \(float\)"):
        pl.range(2.5)
    with pytest.raises(TypeError, match="pl.range takes 1 to 3 positional arguments"):
        pl.range()


def test_range_with_init_values_carries_values_and_leaves_the_final_one():
    for i, (acc,) in pl.range(5, init_values=(0,)):
        acc_out = pl.yield_(acc + i)
    assert acc_out == 0 + 1 + 2 + 3 + 4


def test_range_carries_several_values():
    for i, (s, p) in pl.range(1, 5, init_values=(0, 1)):
        s_out, p_out = pl.yield_(s + i, p * i)
    assert (s_out, p_out) == (10, 24)


def test_range_carries_tiles():
    tile = pl.full([1, 4], 0.0, pl.FP32)
    for _i, (t,) in pl.range(3, init_values=(tile,)):
        t_out = pl.yield_(pl.add(t, 1.0))
    assert t_out.data.tolist() == [[3.0, 3.0, 3.0, 3.0]]


def test_range_init_values_accepts_a_single_value():
    seen = []
    for _i, (acc,) in pl.range(3, init_values=10):
        seen.append(acc)
        acc = pl.yield_(acc - 1)
    assert seen == [10, 9, 8] and acc == 7


def test_yield_count_must_match_init_values():
    with pytest.raises(ValueError, match=r"pl.yield_ got 2 value\(s\) but the loop carries 1 \(one per entry of "
                                         r"init_values\)"):
        for _i, (acc,) in pl.range(2, init_values=(0,)):
            pl.yield_(acc, acc)


def test_nested_carried_loops_yield_to_the_innermost():
    for i, (outer,) in pl.range(3, init_values=(0,)):
        for j, (inner,) in pl.range(2, init_values=(0,)):
            inner_out = pl.yield_(inner + j + 1)
        outer_out = pl.yield_(outer + inner_out * (i + 1))
    assert inner_out == 3
    assert outer_out == 3 * (1 + 2 + 3)


def test_c_reference_sanity():
    # The C reference used by the property tests: truncation, not flooring.
    assert _c_div(-7, 2) == -3 and _c_div(7, -2) == -3 and math.floor(-7 / 2) == -4
    assert _c_wrap(2**31, pl.INT32) == -(2**31)


def test_cast_float_to_int_rounds_by_mode():
    t = _tile([[1.5, 2.5, -1.5, 0.4, -2.7]], pl.FP32)
    assert pl.cast(t, pl.INT32).data.tolist() == [[2, 2, -2, 0, -3]]            # default: to nearest, ties to even
    assert pl.cast(t, pl.INT32, mode="trunc").data.tolist() == [[1, 2, -1, 0, -2]]
    assert pl.cast(t, pl.INT32, mode="floor").data.tolist() == [[1, 2, -2, 0, -3]]
    assert pl.cast(t, pl.INT32, mode="ceil").data.tolist() == [[2, 3, -1, 1, -2]]
    with pytest.raises(ValueError, match=r"pl.cast mode='sideways': use one of round, rint, floor, ceil, trunc"):
        pl.cast(t, pl.INT32, mode="sideways")
