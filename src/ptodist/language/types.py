"""Parameter annotations: ``pl.Tensor[...]``, ``pl.Out``/``pl.InOut``, ``pl.Scalar[...]``, ``pl.dynamic``.

An annotation becomes a :class:`ParamSpec`, which the compiler checks against
the values a function is given (kind, dtype, shape with dynamic binding).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from enum import Enum

from ..errors import DeclarationError
from .dtypes import DataType
from .scalar import Scalar


class DynDim:
    """A named dimension bound at dispatch from the actual shapes (``pl.dynamic("NR")``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise DeclarationError(f"pl.dynamic() needs a non-empty name string, got {name!r}")
        self.name = name

    def __repr__(self) -> str:
        return f"pl.dynamic({self.name!r})"

    def __reduce__(self):
        return (DynDim, (self.name,))


def dynamic(name: str) -> DynDim:
    """Return a named dynamic dimension for annotations."""
    return DynDim(name)


Dim = "int | DynDim"


@dataclass(frozen=True)
class TensorType:
    """The type in ``pl.Tensor[[d0, ...], dtype]`` or ``pld.DistributedTensor[...]``."""

    shape: tuple | None
    dtype: DataType | None
    distributed: bool

    @property
    def type_name(self) -> str:
        base = "pld.DistributedTensor" if self.distributed else "pl.Tensor"
        if self.shape is None:
            return base
        dims = ", ".join(d.name if isinstance(d, DynDim) else str(d) for d in self.shape)
        return f"{base}[[{dims}], {self.dtype!r}]"


@dataclass(frozen=True)
class ScalarType:
    dtype: DataType | None

    @property
    def type_name(self) -> str:
        return f"pl.Scalar[{self.dtype!r}]" if self.dtype else "pl.Scalar"


class Direction(str, Enum):
    IN = "in"
    OUT = "out"
    INOUT = "inout"


@dataclass(frozen=True)
class Directed:
    direction: Direction
    inner: TensorType


def _tensor_type(item, distributed: bool) -> TensorType:
    if not isinstance(item, tuple) or len(item) < 2:
        name = "pld.DistributedTensor" if distributed else "pl.Tensor"
        raise DeclarationError(f"{name}[...] takes [shape, dtype] (and optionally a layout), got {item!r}")
    shape, dtype = item[0], item[1]
    if not isinstance(dtype, DataType):
        raise DeclarationError(f"the dtype in a tensor annotation must be a pl dtype such as pl.FP32, got {dtype!r}")
    dims = []
    for d in shape:
        if isinstance(d, DynDim):
            dims.append(d)
        else:
            try:
                dims.append(int(d.__index__()) if not isinstance(d, int) else d)
            except (AttributeError, TypeError):
                raise DeclarationError(f"a tensor dimension must be an int or pl.dynamic(...), got {d!r}") from None
    return TensorType(tuple(dims), dtype, distributed)


class Tensor:
    """Annotation ``pl.Tensor[[d0, d1, ...], dtype]``: an input tensor."""

    def __class_getitem__(cls, item) -> TensorType:
        return _tensor_type(item, distributed=False)


class DistributedTensor:
    """Annotation ``pld.DistributedTensor[[...], dtype]``: a window-bound tensor."""

    def __class_getitem__(cls, item) -> TensorType:
        return _tensor_type(item, distributed=True)


def _directed(item, direction: Direction) -> Directed:
    if item is Tensor:
        item = TensorType(None, None, False)
    elif item is DistributedTensor:
        item = TensorType(None, None, True)
    if not isinstance(item, TensorType):
        name = direction.name.title().replace("Inout", "InOut")
        raise DeclarationError(f"pl.{name}[...] wraps a tensor annotation, got {item!r}")
    return Directed(direction, item)


class Out:
    """Annotation ``pl.Out[T]``: the parameter is written."""

    def __class_getitem__(cls, item) -> Directed:
        return _directed(item, Direction.OUT)


class InOut:
    """Annotation ``pl.InOut[T]``: the parameter is read and written."""

    def __class_getitem__(cls, item) -> Directed:
        return _directed(item, Direction.INOUT)


def _scalar_class_getitem(cls, dtype) -> ScalarType:
    if not isinstance(dtype, DataType):
        raise DeclarationError(f"pl.Scalar[...] takes a pl dtype such as pl.INT32, got {dtype!r}")
    return ScalarType(dtype)


Scalar.__class_getitem__ = classmethod(_scalar_class_getitem)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its name, kind (``tensor``/``scalar``/``any``), direction and type."""

    name: str
    kind: str
    direction: Direction
    ttype: TensorType | ScalarType | None

    @property
    def type_name(self) -> str:
        if self.ttype is None:
            return "unannotated"
        name = self.ttype.type_name
        if self.direction is Direction.OUT:
            return f"pl.Out[{name}]"
        if self.direction is Direction.INOUT:
            return f"pl.InOut[{name}]"
        return name


def spec_from_annotation(name: str, ann) -> ParamSpec:
    """Turn one evaluated annotation into a ParamSpec."""
    if ann is inspect.Parameter.empty or ann is None:
        return ParamSpec(name, "any", Direction.IN, None)
    if ann is Tensor:
        ann = TensorType(None, None, False)
    elif ann is DistributedTensor:
        ann = TensorType(None, None, True)
    elif ann is Scalar:
        ann = ScalarType(None)
    if isinstance(ann, Directed):
        return ParamSpec(name, "tensor", ann.direction, ann.inner)
    if isinstance(ann, TensorType):
        return ParamSpec(name, "tensor", Direction.IN, ann)
    if isinstance(ann, ScalarType):
        return ParamSpec(name, "scalar", Direction.IN, ann)
    if ann in (int, float, bool):
        return ParamSpec(name, "scalar", Direction.IN, None)
    return ParamSpec(name, "any", Direction.IN, None)
