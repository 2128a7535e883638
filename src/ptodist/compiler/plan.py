"""The dispatch plan: what the host orchestrator asked for, rank by rank.

It is ptodist's IR dump: the windows to allocate and, for every rank, the
ordered tasks with their arguments.  ``to_json()`` is what ``output_dir``
holds as ``dispatch_plan.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from .. import context
from ..errors import ProgramIndexError, ProgramTypeError
from ..language.dtypes import DataType
from ..language.scalar import Scalar
from ..language.types import Direction
from ..source import user_location

WINDOW_ALIGN = 64


@dataclass(eq=False)
class WindowBuffer:
    """A symmetric buffer: ``nbytes`` at ``offset`` in every rank's window heap."""

    id: int
    name: str
    nbytes: int
    offset: int
    location: str

    def describe(self) -> str:
        return f"window buffer '{self.name}' ({self.nbytes} bytes)"


@dataclass(frozen=True, eq=False)
class WindowView:
    """What ``pld.window(buf, shape, dtype=...)`` returns on the host: a typed view descriptor."""

    buffer: WindowBuffer
    shape: tuple
    dtype: DataType
    location: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.get_byte()

    def __repr__(self) -> str:
        return f"<window of '{self.buffer.name}' {list(self.shape)} {self.dtype.name}>"


@dataclass(frozen=True)
class HostTensorSpec:
    """A host orchestrator tensor parameter, as bound at dispatch."""

    index: int
    name: str
    shape: tuple
    dtype: DataType
    direction: Direction


@dataclass(frozen=True, eq=False)
class HostTensorRef:
    """A host tensor or an indexed part of it (``x[r]`` drops the leading rank dimension)."""

    tensor: HostTensorSpec
    index: tuple = ()

    @property
    def shape(self) -> tuple:
        return self.tensor.shape[len(self.index):]

    @property
    def dtype(self) -> DataType:
        return self.tensor.dtype

    @property
    def name(self) -> str:
        if not self.index:
            return self.tensor.name
        return f"{self.tensor.name}[{', '.join(map(str, self.index))}]"

    def __getitem__(self, idx) -> HostTensorRef:
        idx = idx if isinstance(idx, tuple) else (idx,)
        out = []
        for k, i in enumerate(idx):
            try:
                i = i.__index__()
            except (AttributeError, TypeError):
                raise ProgramTypeError(f"host tensor '{self.name}' at {user_location(2)} can only be indexed by "
                                       f"integers (x[r]), got {i!r}") from None
            dim = len(self.index) + k
            if dim >= len(self.tensor.shape):
                raise ProgramIndexError(f"host tensor '{self.tensor.name}' at {user_location(2)} has "
                                        f"{len(self.tensor.shape)} dimensions; index {list(self.index) + list(idx)} "
                                        "has too many")
            if not 0 <= i < self.tensor.shape[dim]:
                size = self.tensor.shape[dim]
                world = getattr(context.current(), "world", None)
                if dim == 0 and isinstance(world, int) and size <= i < world:
                    # The loop is right; the tensor has fewer slices than the world has ranks.
                    hint = (f" The host tensor has {size} slice{'s' if size != 1 else ''} along its leading "
                            f"dimension but the world has {world} ranks (len(device_ids) = {world}): pass one slice "
                            f"per rank (a leading dimension of {world}), or run on {size} device"
                            f"{'s' if size != 1 else ''}.")
                elif dim == 0:
                    hint = " Its leading dimension is the rank count: loop with `for r in pl.range(pld.world_size())`."
                else:
                    hint = ""
                raise ProgramIndexError(
                    f"{self.tensor.name}[{i}] at {user_location(2)}: index {i} is out of range for dimension {dim} "
                    f"of host tensor '{self.tensor.name}' (size {size}).{hint}")
            out.append(i)
        return HostTensorRef(self.tensor, self.index + tuple(out))

    def __repr__(self) -> str:
        return f"<host tensor {self.name} {list(self.shape)} {self.dtype.name}>"

    def bind_dynamic(self, dim, dyn) -> None:
        """Accepted for compatibility: dims bind from the actual shapes anyway."""


@dataclass(eq=False)
class BuiltinCall:
    """A collective the host orchestrator called: it runs as a builtin task on every rank."""

    name: str
    args: tuple
    kwargs: dict
    loc: object  # source.Location of the host call

    def describe(self) -> str:
        return f"pld.tensor.{self.name}"


@dataclass
class TaskSpec:
    """One dispatch to a rank: a per-device function and its arguments."""

    rank: int
    function: object
    args: list
    location: str
    seq: int


@dataclass
class DispatchPlan:
    program: str
    world: int
    device_ids: list[int]
    host_tensors: list[HostTensorSpec]
    windows: list[WindowBuffer]
    tasks: list[list[TaskSpec]]
    window_heap_bytes: int = 0
    commless: int = 0  # chip calls made without device= (placed round-robin over the chips)

    def to_json(self) -> dict:
        """Return a JSON-serialisable description (the plan as a reader wants it)."""
        return {
            "program": self.program,
            "world_size": self.world,
            "device_ids": list(self.device_ids),
            "host_tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype.name, "direction": t.direction.value}
                for t in self.host_tensors
            ],
            "windows": [
                {"id": w.id, "name": w.name, "nbytes": w.nbytes, "offset": w.offset, "defined_at": w.location}
                for w in self.windows
            ],
            "window_heap_bytes_per_rank": self.window_heap_bytes,
            "ranks": [
                {
                    "rank": r,
                    "device_id": self.device_ids[r],
                    "tasks": [
                        {"seq": t.seq, "function": t.function.describe() if isinstance(t.function, BuiltinCall)
                         else t.function.name, "builtin": isinstance(t.function, BuiltinCall),
                         "dispatched_at": t.location, "args": [_arg_json(a) for a in t.args],
                         **({"options": {k: _option_json(v) for k, v in t.function.kwargs.items()}}
                            if isinstance(t.function, BuiltinCall) else {})}
                        for t in self.tasks[r]
                    ],
                }
                for r in range(self.world)
            ],
        }


def _option_json(v):
    if isinstance(v, Enum):
        return v.name
    if isinstance(v, (int, float, bool, str)) or v is None:
        return v
    return repr(v)


def _arg_json(a) -> dict:
    if isinstance(a, HostTensorRef):
        return {"kind": "host_tensor", "tensor": a.tensor.name, "index": list(a.index), "shape": list(a.shape),
                "dtype": a.dtype.name}
    if isinstance(a, WindowView):
        return {"kind": "window", "buffer": a.buffer.name, "shape": list(a.shape), "dtype": a.dtype.name}
    if isinstance(a, Scalar):
        return {"kind": "scalar", "value": a.value, "dtype": a.dtype.name}
    if isinstance(a, (int, float, bool, str)) or a is None:
        return {"kind": "constant", "value": a}
    return {"kind": "object", "repr": repr(a)}


def split_segments(plan: DispatchPlan, boundaries: list[int]) -> list[DispatchPlan]:
    """Split each rank's tasks at the host's sub-worker calls (their ``seq``s, ``boundaries``).

    Segment ``j`` holds the tasks between callback ``j-1`` and callback ``j``.
    """
    out = []
    for j in range(len(boundaries) + 1):
        lo = boundaries[j - 1] if j else -1
        hi = boundaries[j] if j < len(boundaries) else float("inf")
        tasks = [[t for t in ts if lo < t.seq < hi] for ts in plan.tasks]
        out.append(replace(plan, tasks=tasks))
    return out
