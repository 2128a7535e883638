"""Scalars with the device's C semantics.

Integer ``/``, ``//`` and ``%`` truncate toward zero, as C does on the device
(float ``//`` truncates and float ``%`` is C's ``fmod``),
so ``(0 - 1) % 4 == -1`` (a documented pitfall: a negative neighbour index).
Integer results wrap to the type's width.  A Scalar is usable wherever Python
wants an int (indexing, ``range``, shapes) through ``__index__``.
"""

from __future__ import annotations

import math
import operator

from ..errors import OperationTypeError, OperationValueError
from ..source import user_location
from . import dtypes as dt
from .dtypes import DataType


def _wrap(value: int, dtype: DataType) -> int:
    if dtype is dt.BOOL:
        return int(bool(value))
    bits = dtype.bits
    value &= (1 << bits) - 1
    if dtype.is_signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _c_div(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("integer division by zero in a Scalar expression")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - b * _c_div(a, b)


def _rank_of(dtype: DataType) -> tuple[int, int]:
    return (1 if dtype.is_float else 0, dtype.bits)


class Scalar:
    """A typed scalar value (``pl.Scalar[pl.INT32]`` parameters, ``pld.rank()``, loop indices)."""

    __slots__ = ("value", "dtype")

    def __init__(self, value, dtype: DataType = dt.INDEX):
        if isinstance(value, Scalar):
            value = value.value
        if dtype in dt.RAW_BITS:
            raise OperationTypeError(f"a Scalar of {dtype.name} at {user_location()}: " + dt.raw_bits_why(dtype))
        self.dtype = dtype
        self.value = float(value) if dtype.is_float else _wrap(int(value), dtype)

    # -- conversions -------------------------------------------------------
    def __index__(self) -> int:
        if self.dtype.is_float:
            raise OperationTypeError(f"a {self.dtype.name} Scalar cannot be used as an index; cast it first")
        return self.value

    def __int__(self) -> int:
        return int(self.value)

    def __float__(self) -> float:
        return float(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Scalar({self.value}, {self.dtype.name})"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    # -- arithmetic ---------------------------------------------------------
    def _binary(self, other, fn, reverse: bool = False):
        if isinstance(other, Scalar):
            odt, ov = other.dtype, other.value
        elif isinstance(other, bool):
            odt, ov = self.dtype, int(other)
        elif isinstance(other, int):
            odt, ov = self.dtype, other
        elif isinstance(other, float):
            odt, ov = (self.dtype if self.dtype.is_float else dt.FP32), other
        else:
            return NotImplemented
        rdt = max(self.dtype, odt, key=_rank_of)
        a, b = (ov, self.value) if reverse else (self.value, ov)
        return Scalar(fn(a, b, rdt.is_float), rdt)

    def __add__(self, o):
        return self._binary(o, lambda a, b, f: a + b)

    def __radd__(self, o):
        return self._binary(o, lambda a, b, f: a + b, True)

    def __sub__(self, o):
        return self._binary(o, lambda a, b, f: a - b)

    def __rsub__(self, o):
        return self._binary(o, lambda a, b, f: a - b, True)

    def __mul__(self, o):
        return self._binary(o, lambda a, b, f: a * b)

    def __rmul__(self, o):
        return self._binary(o, lambda a, b, f: a * b, True)

    def __truediv__(self, o):
        return self._binary(o, lambda a, b, f: a / b if f else _c_div(a, b))

    def __rtruediv__(self, o):
        return self._binary(o, lambda a, b, f: a / b if f else _c_div(a, b), True)

    def __floordiv__(self, o):
        return self._binary(o, lambda a, b, f: float(math.trunc(a / b)) if f else _c_div(a, b))

    def __rfloordiv__(self, o):
        return self._binary(o, lambda a, b, f: float(math.trunc(a / b)) if f else _c_div(a, b), True)

    def __mod__(self, o):
        return self._binary(o, lambda a, b, f: math.fmod(a, b) if f else _c_mod(a, b))

    def __rmod__(self, o):
        return self._binary(o, lambda a, b, f: math.fmod(a, b) if f else _c_mod(a, b), True)

    def __lshift__(self, o):
        return self._binary(o, lambda a, b, f: a << b)

    def __rshift__(self, o):
        return self._binary(o, lambda a, b, f: a >> b)

    def __and__(self, o):
        return self._binary(o, lambda a, b, f: a & b)

    def __or__(self, o):
        return self._binary(o, lambda a, b, f: a | b)

    def __xor__(self, o):
        return self._binary(o, lambda a, b, f: a ^ b)

    def __neg__(self):
        return Scalar(-self.value, self.dtype)

    def __pos__(self):
        return self

    def __abs__(self):
        return Scalar(abs(self.value), self.dtype)

    # -- comparisons give Python bools: they steer Python control flow ------
    def _cmp(self, other, op):
        if isinstance(other, Scalar):
            other = other.value
        if not isinstance(other, (int, float)):
            return NotImplemented
        return op(self.value, other)

    def __eq__(self, o):
        return self._cmp(o, operator.eq)

    def __ne__(self, o):
        return self._cmp(o, operator.ne)

    def __lt__(self, o):
        return self._cmp(o, operator.lt)

    def __le__(self, o):
        return self._cmp(o, operator.le)

    def __gt__(self, o):
        return self._cmp(o, operator.gt)

    def __ge__(self, o):
        return self._cmp(o, operator.ge)


def const(value, dtype: DataType | None = None) -> Scalar:
    """Return a typed constant (``pl.const(v, dtype)``; without dtype, INT32 for ints, FP32 for floats)."""
    if dtype is None:
        dtype = dt.FP32 if isinstance(value, float) else dt.INT32
    return Scalar(value, dtype)


def as_int(value, what: str = "value") -> int:
    """Return a plain int from an int or integer Scalar; TypeError otherwise."""
    if isinstance(value, bool):
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise OperationTypeError(f"{what} must be an integer, got {value!r} ({type(value).__name__})") from None


# -- scalar arguments: one rule for every parameter --------------------------------------------------------------

def int_range(dtype: DataType) -> tuple[int, int]:
    """The values an integer dtype holds (BOOL: 0 and 1)."""
    if dtype is dt.BOOL:
        return 0, 1
    bits = dtype.bits
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.is_signed else (0, (1 << bits) - 1)


def _number(value):
    """``value`` as a Python bool, int or float when it is a number of any kind, else None.

    A number: a Python or numpy number, a ``Scalar``, a ctypes number, a 0-d numpy array or torch tensor.
    """
    t = type(value)
    if t is int or t is float or t is bool:
        return value
    if t is Scalar:
        return value.value
    if getattr(t, "_ptodist_slot", False):  # a host scalar while its plan is made: checked, not used
        return value.peek()
    if isinstance(value, (int, float)):  # bool, np.float64 and other subclasses
        return bool(value) if isinstance(value, bool) else int(value) if isinstance(value, int) else float(value)
    module = t.__module__
    if module == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray):
            return _number(value.item()) if value.ndim == 0 else None
        if isinstance(value, (np.bool_, np.integer)):
            return value.item()
        return float(value) if isinstance(value, np.floating) else None
    if module.startswith("ml_dtypes"):  # a BF16 or FP8 number
        return float(value)
    if module.startswith("torch"):
        return _number(value.item()) if getattr(value, "ndim", None) == 0 and hasattr(value, "item") else None
    if module == "ctypes" and hasattr(value, "value") and isinstance(value.value, (int, float, bool)):
        return value.value
    return None


def _kind(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape):
        return f"a {type(value).__module__.split('.')[0]} {type(value).__name__} of shape {list(shape)}"
    return f"{value!r} ({type(value).__name__})"


def scalar_value(value, dtype: DataType | None, where, type_error: type = OperationTypeError,
                 value_error: type = OperationValueError) -> int | float:
    """The exact value a scalar parameter of ``dtype`` takes from ``value``, or an error naming ``where``.

    Any kind of number is accepted (see :func:`_number`; a bool is 0 or 1).  An integer dtype takes integral
    values it holds exactly: a fraction is a ``type_error``, NaN, infinity or a value outside the dtype's range a
    ``value_error`` (as an integer tile refuses them).  A float dtype takes any real number, rounded as the dtype
    rounds.  ``dtype`` None keeps the number's own kind (int or float).  ``where`` (anything whose ``str`` names
    the parameter) is formatted only for an error.
    """
    v = _number(value)
    if v is None:
        raise type_error(f"{where}: expected a scalar (a Python or numpy number, a 0-d array or tensor, or a "
                         f"pl.Scalar), got {_kind(value)}.")
    if dtype is None:
        return int(v) if type(v) is bool else v
    if dtype.is_float:
        try:
            f = float(v)
        except OverflowError:
            raise value_error(f"{where}: {v} does not fit {dtype.name}; pass a value within its range") from None
        import numpy as np

        with np.errstate(over="ignore", invalid="ignore"):  # rounded as the dtype rounds: beyond its range, inf
            return float(np.asarray(f, dtype=dtype.np_dtype))
    lo, hi, shown = *int_range(dtype), v
    if type(v) is float:
        if math.isnan(v) or math.isinf(v):
            raise value_error(f"{where}: {v!r} has no {dtype.name} value (integers {lo}..{hi}); pass a finite "
                              "integer")
        if not v.is_integer():
            raise type_error(f"{where}: {v!r} has a fraction, but the parameter is {dtype.name} (integers "
                             f"{lo}..{hi}); pass an integer, or declare the parameter with a float dtype")
        v = int(v)
    v = int(v)
    if not lo <= v <= hi:
        raise value_error(f"{where}: {shown!r} does not fit {dtype.name} (range {lo}..{hi}); pass a value in range, or "
                          "declare the parameter with a wider dtype")
    return v
