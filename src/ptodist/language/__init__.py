"""``import ptodist.language as pl``: the single-device language.

Tiers: this module is the public surface (each name exported once, here);
the meaning of memory operations lives in the rank context
(``ptodist.rank.context``), tile math in ``tile_ops``, program structure in
``functions``, annotations in ``types``.
"""

from __future__ import annotations

import sys as _sys
import types as _types

from ..errors import OperationTypeError
from . import mixed as _mixed
from . import names as _names
from . import ops as _ops
from .control import (
    ForKind,
    ScopeMode,
    adir,
    at,
    auto_scope,
    cond,
    dump_tag,
    func_attr,
    get_block_idx,
    get_block_num,
    graph,
    manual_scope,
    no_dep,
    parallel,
    pipeline,
    range,
    scope,
    spmd,
    spmd_submit,
    static_assert,
    static_print,
    submit,
    unroll,
    while_,
    yield_,
)
from .distributed.types import AsyncEvent, AsyncSession, AtomicType
from .dtypes import (
    BF16,
    BOOL,
    FP4,
    FP8E4M3FN,
    FP8E5M2,
    FP8E8M0,
    FP16,
    FP32,
    HF4,
    HF8,
    INDEX,
    INT4,
    INT8,
    INT16,
    INT32,
    INT64,
    TASK_ID,
    UINT4,
    UINT8,
    UINT16,
    UINT32,
    UINT64,
    DataType,
)
from .functions import Function as JITFunction
from .functions import FunctionType, InlineFunction, Level, Program, Role, function, inline, jit, program
from .mixed import KernelType, SplitMode, SyncAllMode, cluster, cross_core_slot, split, split_aiv
from .ops.creation import Array, MemRefType
from .ops.expand import PadValue
from .ops.movement import CachePolicy
from .ops.pipes import AUTO
from .ops.sync import PipeType
from .scalar import Scalar
from .spaces import Mem, MemorySpace
from .text import loads, loads_program, parse, parse_program
from .tile_ops import Tile
from .types import (
    CompactMode,
    DynVar,
    InOut,
    IntLike,
    ManualDep,
    Out,
    Tensor,
    TensorLayout,
    TensorView,
    TileLayout,
    TileView,
    dynamic,
)
from .types import DistributedTensor as _DistributedTensor  # noqa: F401  (pld exports it)

# pl.parser: upstream's parser package, whose entry points are these (its AST machinery has no counterpart here).
parser = _types.SimpleNamespace(parse=parse, loads=loads, parse_program=parse_program, loads_program=loads_program,
                                function=function, program=program, inline=inline, InlineFunction=InlineFunction)

# pl.TaskId: the annotation of a scalar holding a task's id (what `as tid` and pl.submit give), for deps=.
TaskId = Scalar[TASK_ID]

# pl.Tuple[A, B]: the return annotation of a function that returns several tensors (``s, d = chip(...)``).
Tuple = tuple

# The op catalog: pl.tile, pl.tensor, pl.array, pl.system and the pl.* names (dispatchers and re-exports).
_spaces, _top = _ops.namespaces(__name__)
tile, tensor, array, system = _spaces["tile"], _spaces["tensor"], _spaces["array"], _spaces["system"]
system.AUTO = AUTO
system.syncall, system.cacheinvalid, system.fence = _mixed.syncall, _mixed.cacheinvalid, _mixed.fence
system.KernelType, system.SyncAllMode = KernelType, SyncAllMode
tensor.no_dep, tensor.dump_tag = no_dep, dump_tag  # upstream lists the task markers under pl.tensor too
globals().update(_top)
max = _top["maximum"]
min = _top["minimum"]


def cast(input, target_type: DataType | None = None, mode: str = "round", *, dtype: DataType | None = None):
    """Convert a Tensor, a Tile or a Scalar to ``target_type``."""
    target = target_type or dtype
    if isinstance(input, (Scalar, int, float)):
        if not isinstance(target, DataType):
            raise OperationTypeError(f"pl.cast needs target_type=<pl dtype>, got {target!r}")
        value = input.value if isinstance(input, Scalar) else input
        return Scalar(value if target.is_float else int(value), target)
    return _top["cast"](input, target, mode=mode)


# pl.ND, pl.DN, ...: the tensor layouts by their short names.
ND, DN, NZ, MX_A_ZZ, MX_B_NN = (TensorLayout.ND, TensorLayout.DN, TensorLayout.NZ, TensorLayout.MX_A_ZZ,
                                 TensorLayout.MX_B_NN)

__all__ = [
    "BF16", "BOOL", "FP8E4M3FN", "FP8E8M0", "FP16", "FP32", "INDEX", "INT8", "INT16", "INT32", "INT64", "UINT8",
    "FP4", "FP8E5M2", "HF4", "HF8", "INT4", "UINT4", "UINT16", "UINT32", "UINT64",
    "TensorLayout", "TileLayout", "TensorView", "TileView", "CompactMode", "DynVar", "IntLike", "ND", "DN", "NZ", "MX_A_ZZ", "MX_B_NN",
    "DataType", "FunctionType", "InOut", "Level", "Out", "Program", "Role", "Scalar", "Tensor", "Tile", "Tuple",
    "array", "at", "auto_scope", "cast", "cond", "dynamic", "function", "get_block_idx", "get_block_num", "jit",
    "manual_scope", "max", "min", "parallel", "program", "range", "spmd", "submit", "system", "tensor", "tile",
    "unroll", "yield_", "no_dep", "dump_tag", "static_assert", "static_print", "scope", "ScopeMode", "spmd_submit",
    "Array", "MemRefType", "PadValue", "AUTO", "Mem", "MemorySpace", "AtomicType", "AsyncEvent", "AsyncSession", "CachePolicy",
    "PipeType",
    "KernelType", "SplitMode", "SyncAllMode", "cluster", "cross_core_slot", "split", "split_aiv",
    "ForKind", "pipeline", "while_", "TASK_ID", "TaskId", "inline", "InlineFunction",
    "parse", "loads", "parse_program", "loads_program", "parser", "func_attr", "adir", "JITFunction", "ManualDep",
    "graph",
]
__all__ += sorted(set(_top) - set(__all__))

# A name pl lacks (pl.laod) is an AttributeError that names the near ones (pl.load).
_names.install(_sys.modules[__name__], "pl")
for _space in ("tile", "tensor", "array", "system"):
    _names.install(_spaces[_space], f"pl.{_space}")
