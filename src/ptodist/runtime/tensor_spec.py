"""``pypto.runtime.tensor_spec``: TensorSpec (a tensor's name, shape, dtype and initial values) and ScalarSpec.

A harness describes a program's arguments with them and makes the tensors with :meth:`TensorSpec.create_tensor`.
A torch dtype makes a torch tensor (as in PyPTO); a numpy dtype or a ``pl`` dtype makes a numpy array, so the
same specs serve programs run without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ApiTypeError, ConfigError
from ..language import dtypes as dt

# The scalar C types an orchestration's scalar arguments may have, and the ctypes constructor of each.
SCALAR_CTYPE_MAP: dict[str, str] = {
    "int64": "ctypes.c_int64",
    "int32": "ctypes.c_int32",
    "uint64": "ctypes.c_uint64",
    "uint32": "ctypes.c_uint32",
    "float": "ctypes.c_float",
    "double": "ctypes.c_double",
}


def _torch():
    import sys

    return sys.modules.get("torch")


def _is_torch_dtype(dtype) -> bool:
    torch = _torch()
    return torch is not None and isinstance(dtype, torch.dtype)


def _numpy_dtype(dtype, name: str) -> np.dtype:
    if isinstance(dtype, dt.DataType):
        return np.dtype(dtype.np_dtype)
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ApiTypeError(f"TensorSpec({name!r}): dtype {dtype!r} is not a torch dtype, a numpy dtype or a pl "
                           "dtype (pl.FP32, ...); give one of those") from None


@dataclass
class TensorSpec:
    """One tensor argument of a program: ``name``, ``shape``, ``dtype``, how to fill it, and whether it is an output.

    ``init_value``: None (zeros), a number (every element), a tensor or array (copied, cast to ``dtype``), one of
    ``torch.randn`` / ``torch.rand`` / ``torch.zeros`` / ``torch.ones`` (called with the shape and dtype), or any
    other callable taking no argument and returning the values.  An output (``is_output=True``) starts as zeros.
    """

    name: str
    shape: list[int]
    dtype: Any
    init_value: Any = field(default=None)
    is_output: bool = False

    def create_tensor(self):
        """Return a new tensor (torch for a torch dtype, else numpy) made as the spec says."""
        shape = [int(d) for d in self.shape]
        if _is_torch_dtype(self.dtype):
            return self._torch_tensor(_torch(), shape)
        npd = _numpy_dtype(self.dtype, self.name)
        init = self.init_value
        if init is None or self.is_output:
            return np.zeros(shape, npd)
        if isinstance(init, (bool, int, float)):
            return np.full(shape, init, npd)
        if callable(init) and not hasattr(init, "shape"):
            init = init()
        if hasattr(init, "detach"):  # a torch tensor given for a numpy dtype
            init = init.detach().cpu().numpy()
        if hasattr(init, "shape") or isinstance(init, (list, tuple)):
            return self._checked(np.array(init, dtype=npd))
        raise self._unsupported()

    def _torch_tensor(self, torch, shape):
        init = self.init_value
        if init is None or self.is_output:
            return torch.zeros(shape, dtype=self.dtype)
        if isinstance(init, (bool, int, float)):
            return torch.full(shape, init, dtype=self.dtype)
        if isinstance(init, torch.Tensor):
            return self._checked(init.to(dtype=self.dtype))
        if isinstance(init, np.ndarray):
            return self._checked(torch.as_tensor(init).to(dtype=self.dtype))
        if callable(init):
            if init in (torch.randn, torch.rand, torch.zeros, torch.ones):
                return init(shape, dtype=self.dtype)
            return self._checked(torch.as_tensor(init(), dtype=self.dtype))
        raise self._unsupported()

    def _checked(self, value):
        if list(value.shape) != [int(d) for d in self.shape]:
            raise ConfigError(f"TensorSpec({self.name!r}): init_value has shape {list(value.shape)}, the spec's "
                              f"shape is {list(self.shape)}; give values of the spec's shape")
        return value

    def _unsupported(self) -> ApiTypeError:
        return ApiTypeError(f"TensorSpec({self.name!r}): unsupported init_value type "
                            f"{type(self.init_value).__name__}; give None, a number, a tensor or array, or a "
                            "callable returning one")


@dataclass
class ScalarSpec:
    """One scalar argument of a program: ``name``, ``value`` and its C type (one of :data:`SCALAR_CTYPE_MAP`)."""

    name: str
    value: int | float
    ctype: str = "int64"

    def __post_init__(self) -> None:
        if self.ctype not in SCALAR_CTYPE_MAP:
            raise ConfigError(f"Unsupported ctype {self.ctype!r} for scalar {self.name!r}. Supported: "
                              f"{list(SCALAR_CTYPE_MAP)}")


__all__ = ["SCALAR_CTYPE_MAP", "ScalarSpec", "TensorSpec"]
