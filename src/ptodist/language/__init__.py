"""``import ptodist.language as pl``: the single-device language.

Tiers: this module is the public surface (each name exported once, here);
the meaning of memory operations lives in the rank context
(``ptodist.rank.context``), tile math in ``tile_ops``, program structure in
``functions``, annotations in ``types``.
"""

from __future__ import annotations

from ..errors import OperationTypeError, TileTypeError
from . import tile_ops as _t
from .control import (
    at,
    auto_scope,
    cond,
    get_block_idx,
    get_block_num,
    manual_scope,
    parallel,
    range,
    spmd,
    submit,
    unroll,
    yield_,
)
from .dtypes import (
    BF16,
    BOOL,
    FP8E4M3FN,
    FP8E8M0,
    FP16,
    FP32,
    INDEX,
    INT8,
    INT16,
    INT32,
    INT64,
    UINT8,
    DataType,
)
from .functions import FunctionType, Level, Program, Role, function, jit, program
from .memory_ops import create_tensor, full, load, read, slice, store, write
from .scalar import Scalar, const
from .tile_ops import Tile, matmul, move, reshape
from .types import DistributedTensor as _DistributedTensor  # noqa: F401  (pld exports it)
from .types import InOut, Out, Tensor, dynamic

# pl.Tuple[A, B]: the return annotation of a function that returns several tensors (``s, d = chip(...)``).
Tuple = tuple


def _scalar_or_tile(name: str, tile_fn, scalar_fn):
    def op(a, b):
        if isinstance(a, _t.Tile) or isinstance(b, _t.Tile):
            return tile_fn(a, b)
        if isinstance(a, (Scalar, int, float)) and isinstance(b, (Scalar, int, float)):
            return scalar_fn(a if isinstance(a, Scalar) else Scalar(a, INDEX if isinstance(a, int) else FP32), b)
        raise TileTypeError(f"pl.{name} takes Tiles or scalars, got {type(a).__name__} and {type(b).__name__}; "
                            "load tensors into tiles with pl.load first")

    op.__name__ = name
    op.__doc__ = f"``pl.{name}(a, b)``: elementwise on tiles (broadcasting), or scalar arithmetic."
    return op


add = _scalar_or_tile("add", _t.add, lambda a, b: a + b)
sub = _scalar_or_tile("sub", _t.sub, lambda a, b: a - b)
mul = _scalar_or_tile("mul", _t.mul, lambda a, b: a * b)
div = _scalar_or_tile("div", _t.div, lambda a, b: a / b)
maximum = _scalar_or_tile("maximum", _t.maximum, lambda a, b: a if a >= b else b)
minimum = _scalar_or_tile("minimum", _t.minimum, lambda a, b: a if a <= b else b)
max = maximum
min = minimum
adds, subs, muls, divs = add, sub, mul, div
neg, exp, log, sqrt, rsqrt = _t.neg, _t.exp, _t.log, _t.sqrt, _t.rsqrt
abs = _t.abs_
row_sum, row_max, row_min = _t.row_sum, _t.row_max, _t.row_min
assemble = _t.assemble


def cast(input, target_type: DataType | None = None, mode: str = "round", *, dtype: DataType | None = None):
    """Convert a Tile or a Scalar to ``target_type``."""
    target = target_type or dtype
    if isinstance(input, (Scalar, int, float)):
        if not isinstance(target, DataType):
            raise OperationTypeError(f"pl.cast needs target_type=<pl dtype>, got {target!r}")
        value = input.value if isinstance(input, Scalar) else input
        return Scalar(value if target.is_float else int(value), target)
    return _t.cast(input, target, mode)


__all__ = [
    "BF16", "BOOL", "FP8E4M3FN", "FP8E8M0", "FP16", "FP32", "INDEX", "INT8", "INT16", "INT32", "INT64", "UINT8",
    "DataType", "FunctionType", "InOut", "Level", "Out", "Program", "Role", "Scalar", "Tensor", "Tile", "Tuple",
    "abs", "add", "adds", "assemble", "at", "auto_scope", "cast", "cond", "const", "create_tensor", "div", "divs",
    "dynamic", "exp", "full", "function", "get_block_idx", "get_block_num", "jit", "load", "log", "manual_scope",
    "matmul", "max", "maximum", "min", "minimum", "move", "mul", "muls", "neg", "parallel", "program", "range",
    "read", "reshape", "row_max", "row_min", "row_sum", "rsqrt", "slice", "spmd", "sqrt", "store", "sub",
    "subs", "submit", "unroll", "write", "yield_",
]
