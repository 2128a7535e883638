"""The dispatch plan: what the host orchestrator asked for, rank by rank.

It is ptodist's IR dump: the windows to allocate and, for every rank, the
ordered tasks with their arguments.  ``to_json()`` is what ``output_dir``
holds as ``dispatch_plan.json``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from .. import context
from ..collectives.registry import domain_args
from ..errors import ProgramIndexError, ProgramTypeError, ProgramValueError
from ..language.dtypes import DataType
from ..language.scalar import Scalar
from ..language.types import Direction
from ..source import user_location

WINDOW_ALIGN = 64


@dataclass(eq=False)
class WindowBuffer:
    """A symmetric buffer: ``nbytes`` at ``offset`` in every rank's window heap.

    Its comm domain (``ranks``) is the set of ranks the host dispatched it to, as PyPTO infers it
    from the ``device=`` of every dispatch the buffer's windows are given to: group rank ``g`` is
    ``ranks[g]`` (sorted).  ``None`` until the plan is resolved (:func:`resolve_groups`).
    """

    id: int
    name: str
    nbytes: int
    offset: int
    location: str
    dispatched: set = field(default_factory=set)  # ranks a dispatch gave one of its windows to
    inherits: list = field(default_factory=list)  # data buffers of host collectives this one is the signal of
    ranks: tuple | None = None                     # the resolved comm domain, sorted world ranks

    def describe(self) -> str:
        return f"window buffer '{self.name}' ({self.nbytes} bytes)"

    def group_text(self) -> str:
        return "{" + ", ".join(map(str, self.ranks or ())) + "}"


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
    layout: str = "ND"  # the annotation's pl.TensorLayout: recorded for the reader, no value depends on it
    # How messages name it: "parameter 'x' of host orchestrator 'host' (prog.py:8), declared pl.Tensor[...]".
    declared: str = ""


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


@dataclass(frozen=True)
class ScalarArg:
    """A task's argument that is the host orchestrator's scalar parameter ``index`` as it is: the rank takes the
    dispatch's value (``Command.scalars``), so the plan serves every value (``compiler/scalars.py``)."""

    index: int
    name: str


@dataclass(eq=False)
class BuiltinCall:
    """A collective the host orchestrator called: it runs as a builtin task on every rank."""

    name: str
    args: tuple
    kwargs: dict
    loc: object  # source.Location of the host call
    nranks: int = 0  # the size of its comm domain when it was planned (0: not recorded)

    def describe(self) -> str:
        return f"pld.tensor.{self.name}"

    @functools.cached_property
    def key(self) -> tuple:
        """What makes two calls the same collective on the same memory: name, line and arguments (window views
        by buffer, shape and dtype). Made once per call (a rank keeps a plan across dispatches)."""
        return (self.name, self.loc, _arg_key(self.args), _arg_key(tuple(self.kwargs.items())))


def _arg_key(a):
    """A hashable identity of a builtin call's argument."""
    if isinstance(a, WindowView):
        return ("window", a.buffer.id, a.shape, a.dtype.name)
    if isinstance(a, HostTensorRef):
        return ("host", a.tensor.index, a.index)
    if isinstance(a, (list, tuple)):
        return tuple(_arg_key(x) for x in a)
    return repr(a)


@dataclass
class TaskSpec:
    """One dispatch to a rank: a per-device function and its arguments."""

    rank: int
    function: object
    args: list
    location: str
    seq: int

    @property
    def name(self) -> str:
        return self.function.describe() if isinstance(self.function, BuiltinCall) else self.function.name


@dataclass(frozen=True)
class OrderEdge:
    """The host's order between two chip tasks on different ranks: ``consumer`` starts only once ``producer`` is
    complete, because they share host-tensor bytes (``shared``: the consumer's argument) and one of them writes."""

    producer: TaskSpec
    consumer: TaskSpec
    shared: str

    def describe(self) -> str:
        return (f"'{self.consumer.name}' waits for '{self.producer.name}' on rank {self.producer.rank} "
                f"(they share {self.shared})")


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
    # Chip calls placed round-robin that were given another rank's slice: (message, locations), for the checker.
    misplaced: list = field(default_factory=list)
    # The host's order of chip tasks across ranks (order_chip_tasks): the edges, and the signal window they are
    # honoured on (cell [p] of rank r counts the completions of rank p's producers that rank r has yet to take).
    edges: list[OrderEdge] = field(default_factory=list)
    order_signal: WindowBuffer | None = None

    @functools.cached_property
    def transfers(self) -> HostTransfers:
        """What the edges carry where each rank holds its own copy of the host tensors (mpi)."""
        return host_transfers(self.tasks)

    def to_json(self) -> dict:
        """Return a JSON-serialisable description (the plan as a reader wants it)."""
        after: dict = {}
        for e in self.edges:
            after.setdefault((e.consumer.rank, e.consumer.seq), []).append(e)
        return {
            "program": self.program,
            "world_size": self.world,
            "device_ids": list(self.device_ids),
            "host_tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype.name, "direction": t.direction.value,
                 **({"layout": t.layout} if t.layout != "ND" else {})}
                for t in self.host_tensors
            ],
            "windows": [
                {"id": w.id, "name": w.name, "nbytes": w.nbytes, "offset": w.offset, "defined_at": w.location,
                 "ranks": list(w.ranks) if w.ranks is not None else list(range(self.world))}
                for w in self.windows
            ],
            "window_heap_bytes_per_rank": self.window_heap_bytes,
            "ranks": [
                {
                    "rank": r,
                    "device_id": self.device_ids[r],
                    "tasks": [
                        {"seq": t.seq, "function": t.name, "builtin": isinstance(t.function, BuiltinCall),
                         "dispatched_at": t.location, "args": [_arg_json(a) for a in t.args],
                         **({"options": {k: _option_json(v) for k, v in t.function.kwargs.items()}}
                            if isinstance(t.function, BuiltinCall) else {}),
                         **({"after": [{"rank": e.producer.rank, "seq": e.producer.seq, "shares": e.shared}
                                       for e in after[(r, t.seq)]]} if (r, t.seq) in after else {})}
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
    if isinstance(a, ScalarArg):
        return {"kind": "argument", "parameter": a.name}
    if isinstance(a, (int, float, bool, str)) or a is None:
        return {"kind": "constant", "value": a}
    return {"kind": "object", "repr": repr(a)}


def resolve_groups(plan: DispatchPlan) -> None:
    """Fix every window buffer's comm domain, keep each host collective on its domain's ranks only, order the tasks.

    A buffer lives on the ranks its windows were dispatched to (``device=r``), merged with the domain of
    the data window of every host collective it is the signal of; a buffer no dispatch reached lives on
    every rank.  Then the chip tasks are ordered across ranks (:func:`order_chip_tasks`).  Idempotent.
    """
    world = plan.world

    def ranks_of(buf: WindowBuffer, seen: frozenset = frozenset()) -> set:
        got = set(buf.dispatched)
        for data in buf.inherits:
            if data is not buf and data.id not in seen:
                got |= ranks_of(data, seen | {buf.id})
        return got

    for buf in plan.windows:
        if buf.ranks is None:
            got = ranks_of(buf)
            buf.ranks = tuple(sorted(got)) if got else tuple(range(world))
    checked: set = set()
    for r in range(world):
        kept = []
        for t in plan.tasks[r]:
            if isinstance(t.function, BuiltinCall):
                b = t.function
                group = builtin_group(b)
                if id(b) not in checked:
                    checked.add(id(b))
                    _check_builtin_group(b, group)
                if group is not None and r not in group:
                    continue
            kept.append(t)
        plan.tasks[r] = kept
    order_chip_tasks(plan)


def _check_builtin_group(b: BuiltinCall, group: tuple | None) -> None:
    """A host collective runs over one comm domain: its target and signal windows must share it."""
    if group is None:
        return
    data, *others = domain_args(b.name, b.args, b.kwargs)
    for v in others:
        if isinstance(v, WindowView) and v.buffer.ranks != group:
            raise ProgramValueError(
                f"{b.describe()} at {b.loc}: window buffer '{v.buffer.name}' lives on ranks {v.buffer.group_text()} "
                f"but the collective runs over the comm domain of its data window buffer '{data.buffer.name}', "
                f"ranks {_ranks_text(group)}: a collective's target and signal must be dispatched to the same "
                "ranks. Allocate a separate signal buffer for each domain.")
    if b.nranks and len(group) != b.nranks:
        raise ProgramValueError(
            f"{b.describe()} at {b.loc}: when it was called, window buffer '{data.buffer.name}' had been dispatched "
            f"to {b.nranks} rank(s), but its comm domain is {_ranks_text(group)} ({len(group)} ranks): dispatch "
            "its windows to every rank of the domain before the collective.")


def _ranks_text(ranks) -> str:
    return "{" + ", ".join(map(str, ranks)) + "}"


def builtin_group(b: BuiltinCall) -> tuple | None:
    """The ranks a host collective runs over: its data window's comm domain (barrier: its signal's)."""
    data = domain_args(b.name, b.args)
    return data[0].buffer.ranks if data and isinstance(data[0], WindowView) else None


def split_segments(plan: DispatchPlan, boundaries: list[int]) -> list[DispatchPlan]:
    """Split each rank's tasks at the host's sub-worker calls (their ``seq``s, ``boundaries``).

    Segment ``j`` holds the tasks between callback ``j-1`` and callback ``j``.  A callback runs once every rank
    ended the segment before it, so a segment orders only its own tasks: its edges are its own.
    """
    out = []
    for j in range(len(boundaries) + 1):
        lo = boundaries[j - 1] if j else -1
        hi = boundaries[j] if j < len(boundaries) else float("inf")
        tasks = [[t for t in ts if lo < t.seq < hi] for ts in plan.tasks]
        edges = order_edges(tasks) if boundaries and plan.edges else plan.edges  # one segment: the plan's own
        out.append(replace(plan, tasks=tasks, edges=edges))
    return out


ORDER_SIGNAL = "chip_task_order"


def order_chip_tasks(plan: DispatchPlan) -> None:
    """Order the plan's chip tasks across ranks as the host submitted them: find the edges, reserve their signal.

    Each rank runs its own tasks in submission order; tasks on different ranks run concurrently unless they share
    host-tensor bytes with one of them writing.  Then the later-submitted one waits for the earlier one's
    completion, as PyPTO's host orders chip tasks by submission and by the tensors they share.  Idempotent.
    """
    if plan.order_signal is not None or plan.world < 2:
        return
    plan.edges = order_edges(plan.tasks)
    if not plan.edges:
        return
    offset = -(-plan.window_heap_bytes // WINDOW_ALIGN) * WINDOW_ALIGN
    buf = WindowBuffer(len(plan.windows), ORDER_SIGNAL, 4 * plan.world, offset,
                       "the host's order of chip tasks", ranks=tuple(range(plan.world)))
    plan.windows.append(buf)
    plan.window_heap_bytes = offset + -(-buf.nbytes // WINDOW_ALIGN) * WINDOW_ALIGN
    plan.order_signal = buf


def order_edges(tasks: list[list[TaskSpec]]) -> list[OrderEdge]:
    """The edges that order ``tasks`` (each rank's list, in submission order) across ranks.

    A task waits, on each other rank, for the latest earlier-submitted task whose host-tensor regions overlap its
    own with at least one of the two writing (its own rank runs its tasks in order anyway).  An edge already implied
    by an earlier task of the consumer's rank waiting for a later-or-equal task of the producer's rank is left out,
    so each producer notifies each consumer rank at most once and each edge takes exactly one token.  Window
    arguments are per-rank memory and order nothing; a collective runs on every rank of its domain and reads the
    host tensors it is given.
    """
    world = len(tasks)
    seen = _Accesses()
    edges: list[OrderEdge] = []
    waited: dict = {}  # (producer rank, consumer rank) -> the latest producer seq the consumer rank waited for
    ordered = sorted((t for ts in tasks for t in ts), key=lambda t: (t.seq, t.rank))
    by_seq: dict = {}
    for t in ordered:
        by_seq.setdefault(t.seq, []).append(t)
    for group in by_seq.values():  # a collective's tasks share a seq: none of them waits for another
        found = []
        for t in group:
            accesses = _accesses(t)
            latest: dict = {}  # producer rank -> (its task, what they share)
            for tensor, index, write, name in accesses:
                for rank, (other, _) in seen.conflicts(tensor, index, write).items():
                    if rank != t.rank and (rank not in latest or other.seq > latest[rank][0].seq):
                        latest[rank] = (other, name)
            for rank in range(world):
                if rank in latest:
                    other, name = latest[rank]
                    if other.seq > waited.get((rank, t.rank), -1):
                        waited[(rank, t.rank)] = other.seq
                        edges.append(OrderEdge(other, t, name))
            found.append((t, accesses))
        for t, accesses in found:
            for tensor, index, write, name in accesses:
                seen.record(tensor, index, write, t, name)
    return edges


def _accesses(t: TaskSpec) -> list[tuple]:
    """``(tensor index, region index, writes, name)`` of every host tensor task ``t`` is given."""
    out: list = []

    def visit(v, write: bool) -> None:
        if isinstance(v, HostTensorRef):
            out.append((v.tensor.index, v.index, write and v.tensor.direction is not Direction.IN, v.name))
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x, write)

    if isinstance(t.function, BuiltinCall):  # a collective reads the host tensors it is given (counts, inputs)
        visit(list(t.function.args) + list(t.function.kwargs.values()), False)
        return out
    params = getattr(t.function, "params", None) or []
    for i, v in enumerate(t.args):
        spec = params[i] if i < len(params) else None
        # A parameter without a tensor annotation may be written: count it as a write.
        visit(v, spec is None or spec.kind != "tensor" or spec.direction is not Direction.IN)
    return out


class _Accesses:
    """Host-tensor accesses so far, by region, answering: which task on each rank last touched bytes of a region.

    A region is a tensor and an index prefix (``x``, ``x[r]``, ``x[r, i]``); two regions overlap when one's index is
    a prefix of the other's.  ``_at`` holds the accesses to exactly a region, ``_under`` those at or below it.
    """

    def __init__(self):
        self._at: dict = {}     # (tensor, index) -> ({rank: (task, name)} of writes, of reads)
        self._under: dict = {}  # (tensor, prefix) -> the same, over every region at or below the prefix

    def conflicts(self, tensor: int, index: tuple, write: bool) -> dict:
        """Per rank, the latest access that conflicts with a read (``write`` False) or write of the region."""
        got: dict = {}
        kinds = (0, 1) if write else (0,)
        entries = [self._at.get((tensor, index[:k])) for k in range(len(index))]
        entries.append(self._under.get((tensor, index)))
        for entry in entries:
            if entry is None:
                continue
            for kind in kinds:
                for rank, hit in entry[kind].items():
                    if rank not in got or hit[0].seq > got[rank][0].seq:
                        got[rank] = hit
        return got

    def record(self, tensor: int, index: tuple, write: bool, task: TaskSpec, name: str) -> None:
        kind = 0 if write else 1
        self._at.setdefault((tensor, index), ({}, {}))[kind][task.rank] = (task, name)
        for k in range(len(index) + 1):
            self._under.setdefault((tensor, index[:k]), ({}, {}))[kind][task.rank] = (task, name)


@dataclass(frozen=True)
class HostPiece:
    """Bytes of a host tensor as the write of task ``seq`` left them, found in rank ``rank``'s copy."""

    seq: int
    rank: int
    tensor: int   # the host tensor's index
    index: tuple  # the region: an index prefix of the tensor


@dataclass
class HostTransfers:
    """Host-tensor bytes the ranks must pass each other when each holds its own copy of the host tensors.

    ``receives[(rank, seq)]``: the pieces task ``seq`` of ``rank`` needs before it starts, oldest write first (its
    own rank's pieces among them, so that applying them in order leaves every byte as its latest write left it);
    ``sends[(rank, seq)]``: once task ``seq`` of ``rank`` is complete, the consumers to send their pieces of this
    rank's copy to, as ``(consumer task, pieces)``; ``stale[rank]``: ``(tensor, index, fresh)`` in submission
    order, where ``fresh`` False marks a region another rank wrote after this rank's copy of it was current.
    """

    receives: dict = field(default_factory=dict)
    sends: dict = field(default_factory=dict)
    stale: list = field(default_factory=list)


def host_transfers(tasks: list[list[TaskSpec]]) -> HostTransfers:
    """What the ranks pass each other, for each rank's private copy of the host tensors to read as one shared copy.

    A task needs, for every byte of its host regions, the bytes as the latest earlier-submitted write left them.
    Where that write ran on another rank, the task receives the piece from that rank's copy, sent once the piece's
    last write on that rank is complete (the order's edges make the task wait for it).  A write is passed over
    when a later one covers its whole piece.
    """
    out = HostTransfers(stale=[[] for _ in tasks])
    latest: dict = {}  # (tensor, index) -> (seq, rank) of the latest write of exactly that region
    below: dict = {}   # (tensor, prefix) -> the written indexes that start with the prefix
    touched: list[set] = [set() for _ in tasks]  # per rank: the tensors its tasks were given
    by_seq: dict = {}
    for t in sorted((t for ts in tasks for t in ts), key=lambda t: (t.seq, t.rank)):
        by_seq.setdefault(t.seq, []).append(t)
    for group in by_seq.values():
        for t in group:
            pieces = [p for tensor, region in _outer_regions(_accesses(t))
                      for p in _latest_pieces(tensor, region, latest, below)]
            if any(p.rank != t.rank for p in pieces):
                pieces.sort(key=lambda p: p.seq)
                out.receives[(t.rank, t.seq)] = tuple(pieces)
                for q in sorted({p.rank for p in pieces} - {t.rank}):
                    theirs = tuple(p for p in pieces if p.rank == q)
                    out.sends.setdefault((q, max(p.seq for p in theirs)), []).append((t, theirs))
        for t in group:
            for tensor, index, write, _ in _accesses(t):
                touched[t.rank].add(tensor)
                out.stale[t.rank].append((tensor, index, True))  # received, then written: current
                if write:
                    latest[(tensor, index)] = (t.seq, t.rank)
                    for k in range(len(index) + 1):
                        below.setdefault((tensor, index[:k]), set()).add(index)
                    for r, seen in enumerate(touched):
                        if r != t.rank and tensor in seen:
                            out.stale[r].append((tensor, index, False))
    return out


def _outer_regions(accesses: list) -> list[tuple]:
    """The distinct ``(tensor, index)`` regions of a task's accesses that no other of them contains."""
    regions = {(tensor, index) for tensor, index, _, _ in accesses}
    return sorted(r for r in regions
                  if not any(o != r and o[0] == r[0] and r[1][:len(o[1])] == o[1] for o in regions))


def _latest_pieces(tensor: int, region: tuple, latest: dict, below: dict) -> list[HostPiece]:
    """The writes so far that are the latest for some byte of ``region``, each as its piece of the region."""
    found = [(*latest[(tensor, region[:k])], region[:k]) for k in range(len(region)) if (tensor, region[:k]) in latest]
    found += [(*latest[(tensor, index)], index) for index in below.get((tensor, region), ())]
    found.sort()
    pieces = []
    for k, (seq, rank, index) in enumerate(found):
        piece = index if len(index) >= len(region) else region
        if not any(piece[:len(later)] == later for _, _, later in found[k + 1:]):  # not covered by a later write
            pieces.append(HostPiece(seq, rank, tensor, piece))
    return pieces
