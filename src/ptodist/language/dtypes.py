"""Data types of the language and their numpy (and torch) counterparts."""

from __future__ import annotations

import ml_dtypes
import numpy as np


class DataType:
    """A PyPTO element type; ``get_byte()`` is its size in bytes."""

    __slots__ = ("name", "np_dtype", "is_float", "is_signed")

    def __init__(self, name: str, np_dtype, is_float: bool, is_signed: bool):
        self.name = name
        self.np_dtype = np.dtype(np_dtype)
        self.is_float = is_float
        self.is_signed = is_signed

    def get_byte(self) -> int:
        """Return the element size in bytes."""
        return self.np_dtype.itemsize

    @property
    def bits(self) -> int:
        return 8 * self.np_dtype.itemsize

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

ALL = (FP32, FP16, BF16, INT8, INT16, INT32, INT64, UINT8, BOOL, INDEX, FP8E4M3FN, FP8E8M0)
_BY_NAME = {d.name: d for d in ALL}
# INDEX shares int64's numpy type; the plain integer type wins the reverse lookup.
_BY_NP = {d.np_dtype: d for d in reversed(ALL)}


def from_name(name: str) -> DataType:
    return _BY_NAME[name]


def from_numpy(dtype) -> DataType | None:
    """Return the DataType for a numpy dtype, or None when there is none."""
    return _BY_NP.get(np.dtype(dtype))


_TORCH_NAMES = {
    "float32": FP32, "float16": FP16, "bfloat16": BF16, "int8": INT8, "int16": INT16,
    "int32": INT32, "int64": INT64, "uint8": UINT8, "bool": BOOL,
}


def from_torch(torch_dtype) -> DataType | None:
    """Return the DataType for a torch dtype (by name, so torch is not imported here)."""
    return _TORCH_NAMES.get(str(torch_dtype).removeprefix("torch."))


def to_torch(dtype: DataType):
    import torch

    return getattr(torch, {v.name: k for k, v in _TORCH_NAMES.items()}[dtype.name])
