"""Data types of the language and their numpy (and torch) counterparts."""

from __future__ import annotations

import ml_dtypes
import numpy as np


class DataType:
    """A PyPTO element type; ``get_byte()`` is its size in bytes (a 4-bit type counts one byte)."""

    __slots__ = ("name", "np_dtype", "is_float", "is_signed", "bits")

    def __init__(self, name: str, np_dtype, is_float: bool, is_signed: bool, bits: int | None = None):
        self.name = name
        self.np_dtype = np.dtype(np_dtype)
        self.is_float = is_float
        self.is_signed = is_signed
        self.bits = bits or 8 * self.np_dtype.itemsize

    def get_byte(self) -> int:
        """Return the element size in bytes, rounded up to one byte (as upstream's ``get_byte``)."""
        return max(1, self.bits // 8)

    def __repr__(self) -> str:
        return f"pl.{self.name}"

    def __reduce__(self):
        return (from_name, (self.name,))


FP32 = DataType("FP32", np.float32, True, True)
FP16 = DataType("FP16", np.float16, True, True)
BF16 = DataType("BF16", ml_dtypes.bfloat16, True, True)
INT8 = DataType("INT8", np.int8, False, True)
INT16 = DataType("INT16", np.int16, False, True)
INT32 = DataType("INT32", np.int32, False, True)
INT64 = DataType("INT64", np.int64, False, True)
UINT8 = DataType("UINT8", np.uint8, False, False)
BOOL = DataType("BOOL", np.bool_, False, False)
INDEX = DataType("INDEX", np.int64, False, True)
FP8E4M3FN = DataType("FP8E4M3FN", ml_dtypes.float8_e4m3fn, True, True)
FP8E8M0 = DataType("FP8E8M0", ml_dtypes.float8_e8m0fnu, True, False)
FP8E5M2 = DataType("FP8E5M2", ml_dtypes.float8_e5m2, True, True)
UINT16 = DataType("UINT16", np.uint16, False, False)
UINT32 = DataType("UINT32", np.uint32, False, False)
UINT64 = DataType("UINT64", np.uint64, False, False)
# 4-bit types hold one element per byte here (upstream packs two per byte in device memory); values
# keep their 4-bit range: integers wrap modulo 16, FP4 (E2M1) rounds to nearest even and saturates at 6.
INT4 = DataType("INT4", ml_dtypes.int4, False, True, bits=4)
UINT4 = DataType("UINT4", ml_dtypes.uint4, False, False, bits=4)
FP4 = DataType("FP4", ml_dtypes.float4_e2m1fn, True, True, bits=4)
# The HiSilicon float formats have no numpy type: an element is its raw bit pattern in a uint8.
HF8 = DataType("HF8", np.uint8, True, True)
HF4 = DataType("HF4", np.uint8, True, True, bits=4)

ALL = (FP32, FP16, BF16, INT8, INT16, INT32, INT64, UINT8, BOOL, INDEX, FP8E4M3FN, FP8E8M0, FP8E5M2, UINT16,
       UINT32, UINT64, INT4, UINT4, FP4, HF8, HF4)
# Types whose elements are raw bits no numpy conversion understands: copied, never converted.
RAW_BITS = (HF8, HF4)
_BY_NAME = {d.name: d for d in ALL}
# A task's id (``pl.array.create(n, pl.TASK_ID)``, ``pl.TaskId``): an integer handle, not a tensor element type.
TASK_ID = _BY_NAME["TASK_ID"] = DataType("TASK_ID", np.int64, False, True)
# INDEX shares int64's numpy type, HF8 and HF4 uint8's: the plain integer type wins the reverse lookup.
_BY_NP = {d.np_dtype: d for d in reversed(ALL)}


def from_name(name: str) -> DataType:
    return _BY_NAME[name]


def from_numpy(dtype) -> DataType | None:
    """Return the DataType for a numpy dtype, or None when there is none."""
    return _BY_NP.get(np.dtype(dtype))


_TORCH_NAMES = {
    "float32": FP32, "float16": FP16, "bfloat16": BF16, "int8": INT8, "int16": INT16,
    "int32": INT32, "int64": INT64, "uint8": UINT8, "bool": BOOL, "uint16": UINT16, "uint32": UINT32,
    "uint64": UINT64, "float8_e4m3fn": FP8E4M3FN, "float8_e5m2": FP8E5M2, "float8_e8m0fnu": FP8E8M0,
}


_FROM_TORCH: dict = {}  # torch dtype -> DataType or None, as met (every dispatch asks)
_TO_TORCH: dict = {}    # DataType name -> torch dtype, as met


def from_torch(torch_dtype) -> DataType | None:
    """Return the DataType for a torch dtype (by name, so torch is not imported here)."""
    try:
        return _FROM_TORCH[torch_dtype]
    except KeyError:
        found = _FROM_TORCH[torch_dtype] = _TORCH_NAMES.get(str(torch_dtype).removeprefix("torch."))
        return found


def to_torch(dtype: DataType):
    found = _TO_TORCH.get(dtype.name)
    if found is None:
        import torch

        found = _TO_TORCH[dtype.name] = getattr(torch, {v.name: k for k, v in _TORCH_NAMES.items()}[dtype.name])
    return found


def convert(data: np.ndarray, source: DataType, target: DataType) -> np.ndarray:
    """Return ``data`` (``source``'s storage) as ``target``'s storage.

    Floats round to nearest, ties to even, straight from the source values (no intermediate rounding);
    integers wrap to ``target``'s width. A float source meant for an integer target must already hold
    integral values (``pl.cast`` applies its ``mode`` first).
    """
    if source.np_dtype == target.np_dtype:
        return data.copy()
    if not source.is_float and data.dtype.itemsize < 8 and data.dtype.kind not in "iub":
        data = data.astype(np.int8 if source.is_signed else np.uint8)  # a 4-bit integer, widened exactly
    if target.is_float:
        if not source.is_float and target.np_dtype.type.__module__ != "numpy":
            # ml_dtypes would round an integer to float32 first: rounding twice
            data = _float64_round_to_odd(data)
        return data.astype(target.np_dtype)
    if target.bits < 8:
        if source.is_float:
            with np.errstate(invalid="ignore"):
                data = data.astype(np.float64).astype(np.int64)
        # ml_dtypes' 4-bit integers wrap modulo 16 from a machine integer
        return data.astype(np.int64).astype(target.np_dtype)
    return data.astype(target.np_dtype)


def _float64_round_to_odd(data: np.ndarray) -> np.ndarray:
    """Integers as float64, exact below 2**53; above, rounded to odd, so that the one later rounding to a
    narrower float (at most 51 bits of precision) gives what rounding the integer itself would."""
    out = data.astype(np.float64)
    for i in zip(*np.nonzero(np.abs(out) >= 2.0 ** 53)):  # few: integers past float64's exact range
        x = int(data[i])
        f = float(x)
        if int(f) != x:
            toward_zero = f if abs(int(f)) < abs(x) else float(np.nextafter(f, 0.0))
            # setting the last bit picks the odd one of the two neighbours of x
            out[i] = (np.array(toward_zero).view(np.int64) | 1).view(np.float64)
    return out


def raw_bits_why(dtype: DataType) -> str:
    """Why a value cannot become a ``dtype`` element or come out of one (HF8, HF4: raw bits here)."""
    return (f"ptodist keeps {dtype.name} (a HiSilicon float format) as raw bits and does not emulate its encoding "
            f"or rounding; load, store and move {dtype.name} data as it is, and compute in FP32/FP16/BF16")


# The types torch and ml_dtypes both have, but cannot hand each other: their bits pass as integers.
_THROUGH_BITS = (BF16, FP8E4M3FN, FP8E5M2, FP8E8M0)


def torch_as_numpy(t, dtype: DataType) -> np.ndarray:
    """Return a numpy view of the contiguous CPU torch tensor ``t``, whose element type is ``dtype``.

    numpy has no BF16 or FP8 type of its own (torch cannot hand those over), so their bits pass through an
    integer view of the same width.
    """
    if dtype in _THROUGH_BITS:
        import torch

        return t.view({1: torch.int8, 2: torch.int16}[dtype.np_dtype.itemsize]).numpy().view(dtype.np_dtype)
    return t.numpy()


def numpy_as_torch(a: np.ndarray, dtype: DataType):
    """Return a torch tensor sharing ``a``'s memory (the inverse of :func:`torch_as_numpy`)."""
    import torch

    if dtype in _THROUGH_BITS:
        return torch.from_numpy(a.view({1: np.int8, 2: np.int16}[a.itemsize])).view(to_torch(dtype))
    return torch.from_numpy(a)


def portable(a: np.ndarray) -> np.ndarray:
    """Return ``a`` in a numpy type that ``np.save`` / ``np.load`` round-trip, with the same values.

    numpy cannot reload the ml_dtypes types (BF16 and FP8 come back as raw bytes, or not at all): their
    values widen exactly to float32, 4-bit integers to int8 / uint8.
    """
    dtype = from_numpy(a.dtype)
    if dtype is None or a.dtype.type.__module__ == "numpy":
        return a
    if dtype.is_float:
        return a.astype(np.float32)
    return a.astype(np.int8 if dtype.is_signed else np.uint8)
