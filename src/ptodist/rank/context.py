"""RankContext: runs one rank's tasks and gives every memory, RMA and signal operation its meaning.

The semantics of ``pl.load``/``pl.store``/... and ``pld.system.notify``/``wait``/``remote_load``/``put``/...
live in the concern mixins RankContext is made of, one module each (``task_calls``, ``memory_calls``,
``signal_calls``, ``waiting``, ``rma_calls``, ``collective_calls``, ``sites``); this module runs a dispatch's
tasks, makes their arguments and runs kernels.  Data moves with numpy; signals and cross-rank atomics go
through the backend's ``RankMemory``; the status board records what the rank is doing so the driver can
explain a hang.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .. import context
from ..compiler import checks
from ..compiler.plan import (
    BuiltinCall,
    DispatchPlan,
    HostPiece,
    HostTensorRef,
    ScalarArg,
    WindowView,
)
from ..errors import (
    WINDOW_KIND_PITFALL,
    ProgramError,
    ProgramTypeError,
    ProgramValueError,
    RankIdentityError,
    classified,
)
from ..language import core_group
from ..language import dtypes as dt
from ..language.distributed.types import CommCtx, NotifyOp, WaitCmp
from ..language.functions import Function, Kind
from ..language.scalar import Scalar
from ..language.types import Direction, unit_dims_reshape
from ..source import user_location
from .collective_calls import CollectiveCalls, CollectiveState
from .events import EventLog
from .memory_calls import AccessState, MemoryCalls, _window_bytes
from .rma_calls import RmaCalls
from .signal_calls import SignalCalls
from .sites import Sites, SiteState
from .task_calls import TaskCalls, TaskState, _tracked
from .tasks import OverlapIndex, TaskGraph
from .tensors import RankTensor, WindowTensor
from .waiting import Waiting

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds


@dataclass
class RunState:
    """What running a rank's tasks keeps, besides what every operation reads (the context's own attributes)."""

    checked_args: dict  # kernel argument signatures that passed the checks -> the kernel's parameters
    # The plan is fixed for the run: window views are made once and reused.
    windows: dict = field(default_factory=dict)
    dispatched_at: tuple | None = None  # (function, location) of the task whose arguments are being made
    task_id: int | None = None
    task_rec: dict | None = None  # the event record of the task running now (an event log only)
    failed_task: str | None = None  # the innermost task an exception escaped from
    # While the rank is blocked in a wait past its first slice, with an event log: the wait
    # (window, byte, cell, expected, cmp, line, start time, task record, pl.range indices), for a
    # stopped rank's records.
    blocked_in: tuple | None = None
    async_open: list = field(default_factory=list)  # the pld.tensor.put_async events not waited yet


@dataclass
class CommandKept:
    """What a long-lived rank's dispatches of one command share (the same plan, window heap and host views, so
    the same memory): the window views made from it, and the host collectives checked, with their replays."""

    windows: dict = field(default_factory=dict)   # RunState.windows
    builtins: dict = field(default_factory=dict)  # CollectiveState.carried


class RankContext(TaskCalls, MemoryCalls, SignalCalls, Waiting, RmaCalls, CollectiveCalls, Sites, context.Context):
    """The context of one running rank."""

    kind = "rank"
    _OPS: dict  # op name -> unbound method; filled in below the class

    def __init__(self, plan: DispatchPlan, rank: int, memory, host_arrays: list, wait_slice_s: float = 0.2,
                 events: EventLog | None = None, checked_args: dict | None = None, kept: CommandKept | None = None):
        # What the operations read on their hot path is an attribute of the context itself (one lookup); what
        # one concern alone keeps is in that concern's state object (_sites, _run, _coll, _access, _tasks).
        self.plan = plan
        self.rank = rank
        self.world = plan.world
        self.memory = memory
        self.status = memory.status
        self._ledger = memory.status.ledger(rank)  # the progress and last-operation words, the notify ring
        # The board's last-operation words (what a rank that dies without reporting was doing), when it has them.
        last_op_words = getattr(memory.status, "last_op_words", None)
        self._last_op = last_op_words(rank) if last_op_words is not None else None
        # (id(code), instruction offset) -> (code, (site, slot word)) or (code, None) for ptodist's own: _here's cache
        self._call_sites: dict = {}
        self._sites = SiteState(memory.status.site_slot)  # the board's site table as this rank fills it
        self.host_arrays = host_arrays
        self.scalars: tuple = ()  # the dispatch's scalar arguments, by host parameter (its backend sets them)
        self.wait_slice_s = wait_slice_s
        self.task: str | None = None
        self._kernel_depth = 0
        self._deferred: list | None = None
        # Kernel argument signatures that passed the checks -> the kernel's parameters (_run_kernel); a
        # long-lived rank passes one dict to every dispatch's context.
        kept = kept if kept is not None else CommandKept()
        self._run = RunState(checked_args if checked_args is not None else {}, kept.windows)
        self.hand_signals: dict = {}    # window buffer id -> (shape, line) of the program's own notify/wait
        self._in_collective = 0
        # The collectives' checked calls and layouts, the running one's call site; the host collectives' checked
        # calls and replays the same command's earlier dispatches made (rank/replay.py).
        self._coll = CollectiveState(carried=kept.builtins)
        # The event log, when a diagnostic output asked for one; every hook below is skipped when None.
        self.events = events
        # Under `ptodist check` the log also takes every window access (for the happens-before checker).
        self.checking = events is not None and events.record_accesses
        self._access = AccessState()  # what pl.read polled, and under the checker the memory accesses touched
        # The dependency graph of the tasks this rank's orchestration submits (pl.at regions, pl.submit).
        self.graph = TaskGraph(self)
        # Under the checker, a rank's tasks are actors of the event log (rank/events.py): the task actors the
        # orchestration has not waited for yet (the rest of what it keeps of them is TaskState's).
        self._open_actors: list[int] = []
        self._tasks = TaskState(OverlapIndex(keep_done=True) if self.checking else None)

    @property
    def device_id(self) -> int:
        """The device this rank runs as."""
        return self.plan.device_ids[self.rank]

    @property
    def failed_task(self) -> str | None:
        """The innermost task an exception escaped from."""
        return self._run.failed_task

    @property
    def blocked_in(self) -> tuple | None:
        """The wait the rank is blocked in past its first slice, with an event log (see :class:`RunState`)."""
        return self._run.blocked_in

    def next_segment(self, plan: DispatchPlan, memory, host_arrays: list) -> None:
        """Run the next segment of this dispatch (after a sub-worker callback): ``plan``'s tasks over ``memory``.

        What the dispatch keeps (task ids, the event log, signal layouts) stays; what was made from the
        previous segment's memory (window views, the progress word) is made again.
        """
        self.plan = plan
        self.memory = memory
        self.status = memory.status
        self._ledger = memory.status.ledger(self.rank)
        last_op_words = getattr(memory.status, "last_op_words", None)
        self._last_op = last_op_words(self.rank) if last_op_words is not None else None
        self._sites.slot = memory.status.site_slot
        self.host_arrays = host_arrays
        self._run.windows = {}
        self._coll.builtins, self._coll.carried = {}, {}  # their arguments were made from the previous memory
        self._access.spans = None
        self._access.polled = {}

    # -- running the plan -------------------------------------------------------
    def run_all(self) -> None:
        """Run this rank's dispatched tasks in order, each after the other ranks' tasks the host orders it after."""
        if self.events is not None:
            self.events.scope("begin", "dispatch", self.plan.program, self.events.dispatch)
        after: dict = {}  # seq -> the edges this rank's task waits for before it starts
        then: dict = {}   # seq -> the edges this rank's task releases once complete
        for e in self.plan.edges:
            if e.consumer.rank == self.rank:
                after.setdefault(e.consumer.seq, []).append(e)
            if e.producer.rank == self.rank:
                then.setdefault(e.producer.seq, []).append(e)
        # Where each rank holds its own copy of the host tensors (mpi), the edges carry the bytes too.
        moves = self.plan.transfers if self.plan.edges and hasattr(self.memory, "send_host") else None
        with context.using(self):
            for task in self.plan.tasks[self.rank]:
                if task.seq in after:
                    self._await_order(task, after[task.seq])
                if moves is not None and (self.rank, task.seq) in moves.receives:
                    self._receive_host(task, moves.receives[(self.rank, task.seq)])
                if isinstance(task.function, BuiltinCall):
                    self._run_builtin(task.function)
                else:
                    fn: Function = task.function
                    name = fn.name
                    self._run.dispatched_at = (name, task.location)
                    args = [self._materialize(a, spec) for a, spec in zip(task.args, fn.params)]
                    self._run.dispatched_at = None
                    self.task = name
                    self.status.set_running(self.rank, name)
                    fn.invoke(*args)
                    if self._open_actors or not self.graph.idle:
                        self._await_all()  # the dispatch is done when every task it submitted is complete
                    self.task = None
                if moves is not None and (self.rank, task.seq) in moves.sends:
                    self._send_host(moves.sends[(self.rank, task.seq)])
                if task.seq in then:
                    for e in then[task.seq]:  # complete, deferred waits included: release the tasks waiting for it
                        self._order_notify(e.consumer.rank, self.rank, 1, task.location)
        if self.events is not None:
            self.events.scope("end", "dispatch", self.plan.program, self.events.dispatch)

    def _await_order(self, task, edges) -> None:
        """Wait until the producer of each edge (a task on another rank sharing host tensors with ``task``) is
        complete: one token in cell [producer rank] of the order signal, taken back so the cell ends at zero."""
        w = self._order_window()
        self.task = task.name
        try:
            for e in edges:
                p = e.producer.rank
                self._block_until(w, 4 * p, [p], 1, WaitCmp.Ge, task.location,
                                  what=f"the host's order of chip tasks: {e.describe()}")
                self._order_notify(self.rank, p, -1, task.location)
        finally:
            self.task = None

    def _order_notify(self, peer: int, cell: int, value: int, location: str) -> None:
        """Add ``value`` to cell ``cell`` of ``peer``'s order signal, attributed to the host's dispatch line."""
        file, _, line = location.rpartition(":")
        outer = self._coll.site
        self._coll.site = self._site_entry((file, int(line)) if line.isdigit() else None)
        self._in_collective += 1  # the host's signalling, not the program's: no hand-rolled signal, no last op
        try:
            self.notify(self._order_window(), peer, [cell], value, NotifyOp.AtomicAdd)
        finally:
            self._in_collective -= 1
            self._coll.site = outer

    def _host_piece(self, p: HostPiece) -> np.ndarray:
        a = self.host_arrays[p.tensor]
        return a[p.index] if p.index else a

    def _send_host(self, sends) -> None:
        """Send each consumer the pieces of this rank's host tensors it needs (written here, complete now)."""
        for consumer, pieces in sends:
            data = np.concatenate([np.ascontiguousarray(self._host_piece(p)).reshape(-1).view(np.uint8)
                                   for p in pieces])
            self.memory.send_host(consumer.rank, consumer.seq, data)

    def _receive_host(self, task, pieces) -> None:
        """Bring this rank's copy of ``task``'s host regions up to date: every piece as its latest write left it,
        applied oldest first (this rank's own pieces from a snapshot, the others' as received)."""
        own = {p: self._host_piece(p).copy() for p in pieces if p.rank == self.rank}
        got: dict = {}
        for q in sorted({p.rank for p in pieces} - {self.rank}):
            theirs = [p for p in pieces if p.rank == q]
            data = self.memory.recv_host(q, task.seq, sum(self._host_piece(p).nbytes for p in theirs))
            at = 0
            for p in theirs:
                view = self._host_piece(p)
                got[p] = data[at:at + view.nbytes].view(view.dtype).reshape(view.shape)
                at += view.nbytes
        for p in pieces:
            self._host_piece(p)[...] = own[p] if p.rank == self.rank else got[p]

    def _order_window(self) -> WindowTensor:
        buf = self.plan.order_signal
        return self._materialize(WindowView(buf, (self.world,), dt.INT32, buf.location), None)

    def _materialize(self, arg, spec):
        if isinstance(arg, HostTensorRef):
            spec_t = arg.tensor
            array = self.host_arrays[spec_t.index][arg.index] if arg.index else self.host_arrays[spec_t.index]
            if spec_t.direction is Direction.IN:
                return _conform_rank(spec, RankTensor(
                    arg.name, array, spec_t.dtype, False,
                    f"it is {spec_t.declared}, an input" if spec_t.declared else
                    f"it is an input (pl.Tensor) of the host orchestrator (parameter '{spec_t.name}')"))
            return _conform_rank(spec, RankTensor(arg.name, array, spec_t.dtype))
        if isinstance(arg, WindowView):
            buf = arg.buffer
            name = spec.name if spec is not None and spec.kind == "tensor" else buf.name
            key = (buf.id, arg.shape, arg.dtype.name, name)
            w = self._run.windows.get(key)
            if w is None:
                if buf.ranks is not None and self.rank not in buf.ranks:
                    fname, where = self._run.dispatched_at or ("a task", "?")
                    raise ProgramValueError(self._outside_group_text(
                        f"{fname}(..., device={self.rank})", f"window '{name}' (buffer '{buf.name}')", buf.ranks,
                        where))
                # The accessor holds the memory, not the context (no reference cycle; see _OPS).
                w = self._run.windows[key] = WindowTensor(name, buf, arg.shape, arg.dtype, self.rank, self.world,
                                                      functools.partial(_window_bytes, self.memory, buf.id))
            return _conform_rank(spec, w)
        if type(arg) is ScalarArg:  # a host scalar the plan left open: this dispatch's value
            arg = self.scalars[arg.index]
        return self._scalar_for(spec, arg)

    def _scalar_for(self, spec, value, fn: Function | None = None):
        """``value`` as scalar parameter ``spec`` takes it: a Scalar of its dtype, exact (or the parameter's error).

        ``fn``: the function whose parameter it is (a kernel call); else the task being dispatched.
        """
        if spec is None or spec.kind != "scalar":
            return value
        dtype = spec.ttype.dtype if spec.ttype is not None else None
        if dtype is None and type(value) is Scalar:  # no dtype of its own to take: the Scalar keeps its
            return value
        if fn is not None:  # as check_arg names it (the checks of a kernel's first call with these kinds)
            where = checks.LazyText(lambda: f"{checks.param_where(fn, spec)}, called at {user_location(2)}")
        else:
            fname, at = self._run.dispatched_at or ("a task", "?")
            where = checks.LazyText(lambda: f"{fname}() parameter '{spec.name}' ({spec.type_name}), dispatched at {at}")
        v = checks.scalar_argument(fn, spec, value, where)
        return v if dtype is None else Scalar(v, dtype)

    # -- functions and tasks ----------------------------------------------------------
    def call_function(self, fn: Function, args, kwargs, device):
        if device is not None:
            raise ProgramError(f"{fn.name}(..., device=...) at {user_location(2)}: device= is only for the host "
                               "orchestrator's dispatch; inside a rank call the function without it.")
        if fn.kind is Kind.KERNEL:
            if core_group.collecting(fn):  # an AIC/AIV function called by a group function: runs with its peers
                return core_group.defer_half(fn, args, kwargs)
            if not self._kernel_depth and not self._tasks.manual and (self._open_actors or not self.graph.idle):
                self._await_overlapping(_tracked(fn, args, kwargs))
            return self._run_kernel(fn, args, kwargs)
        if fn.kind is Kind.SUBWORKER:
            raise ProgramError(f"{fn.name}() at {user_location(2)}: '{fn.name}' is a sub-worker function "
                               "(pl.Role.SubWorker), a host-side callback; it cannot run inside a rank.")
        return fn.invoke(*args, **kwargs)

    def _run_kernel(self, fn: Function, args, kwargs, deps=(), tid: int | None = None, lazy: bool = False,
                    dumps=()):
        values = fn.bind_arguments(args, kwargs)
        params, events = fn.params, self.events
        # The checks judge the arguments' kinds, dtypes and shapes only: a signature that passed them once
        # passes again (checked_args outlives the dispatch on a long-lived rank).
        signature = (id(params), *[(type(v), v.dtype, v.array.shape, v.full_shape) if isinstance(v, RankTensor)
                                   else type(v) for v in values])
        check = self._run.checked_args.get(signature) is not params
        loc = user_location(2) if check or events is not None else None
        bindings: dict = {}
        for i, (spec, v) in enumerate(zip(params, values)):
            v = _conform_rank(spec, v)
            if check:
                checks.check_arg(fn, spec, v, loc, self.world, bindings)
            if spec.kind == "tensor" and spec.direction is Direction.IN and v.writable \
                    and not isinstance(v, WindowTensor):
                # A pl.Tensor parameter is an input of this kernel: a store into it is a bug, not an output.
                v = v.read_only(f"it is parameter '{spec.name}' of {fn.kind.value} '{fn.name}' ({fn.location}), "
                                f"declared {spec.type_name}, an input")
            values[i] = self._scalar_for(spec, v, fn)
        if check:
            if len(self._run.checked_args) >= 4096:  # signatures of shapes long gone (dynamic dims): start afresh
                self._run.checked_args.clear()
            self._run.checked_args[signature] = params  # kept alive by the entry, its id names no other list
        info = [self._tensor_info(spec.name, spec.direction.value, v) for spec, v in zip(params, values)
                if isinstance(v, RankTensor)] if events is not None else None
        named = list(zip((p.name for p in params), values)) if events is not None else ()
        tasks = self._tasks  # read and set per block: looked up once
        outer = tasks.block_idx
        result, left = None, []
        blocks = [] if self.checking and tasks.spmd_blocks > 1 else None  # the blocks' actors, under the checker
        for i, b in enumerate(range(tasks.spmd_blocks) if tasks.spmd_blocks else (outer,)):
            tasks.block_idx = b
            parent = self._enter_block(b, fn.name, loc, blocks) if blocks is not None else None
            try:
                result = self._task_body(fn.name, core_group.kernel_body(fn, values), where=loc, info=info, deps=deps,
                                         tid=tid if i == 0 else None, lazy=lazy, tensors=named, dumps=dumps)
            finally:
                if parent is not None:
                    self.events.actor = parent
            left += tasks.left
        if blocks:
            self.events.join(blocks)  # the task (or call) is complete when all its blocks are
        tasks.block_idx = outer
        tasks.left = left
        return result

    def _task_body(self, name: str, body, kind: str = "task", where: object = "", info=None, deps=(),
                   tid: int | None = None, lazy: bool = False, tensors=(), dumps=()):
        """Run ``body`` as task ``tid`` (a new id when None).  Its deferred waits are waited for at its end, or,
        when ``lazy`` (a task of the graph), left in ``self._tasks.left`` for the graph to complete it by.
        ``where`` (its ``str``: the task's line) is for the event log only."""
        run = self._run  # what the running task keeps: saved, set and restored here
        outer_task, outer_deferred, outer_id = self.task, self._deferred, run.task_id
        self.task, self._deferred, run.task_id = name, [], self._new_tid() if tid is None else tid
        self._kernel_depth += 1
        self.status.set_running(self.rank, name)
        rec = self.events.task_begin(run.task_id, name, kind, str(where), self._tasks.block_idx, info or [], deps) \
            if self.events is not None else None
        outer_rec, run.task_rec = run.task_rec, rec
        try:
            result = body()
            if run.async_open:
                self._undrained()
            if self.events is not None and self.events.dump_args:
                self._dump(name, tensors, dumps)
            if lazy:
                self._tasks.left = list(self._deferred)
            else:
                for cond in self._deferred:
                    self._block_until(*cond)
            return result
        except BaseException:
            run.failed_task = run.failed_task or name
            raise
        finally:
            self._progressed()
            if rec is not None:
                self.events.task_end(rec)
            self._kernel_depth -= 1
            self.task, self._deferred, run.task_id = outer_task, outer_deferred, outer_id
            run.task_rec = outer_rec

    def _tensor_info(self, name: str, direction: str, t: RankTensor) -> dict:
        """Describe a task argument for deps.json: which memory it is, and where in it."""
        lo, hi = byte_bounds(t.array)
        tensor_id, base = f"private:{lo:x}", lo
        for i, a in enumerate(self.host_arrays):
            if a is not None:
                alo, ahi = byte_bounds(a)
                if alo <= lo < ahi:
                    tensor_id, base = f"host:{i}", alo
        for buf in self.plan.windows:
            blo, bhi = byte_bounds(self.memory.window_bytes(buf.id, self.rank))
            if blo <= lo < bhi:
                tensor_id, base = f"window:{buf.name}", blo
        for llo, lhi, lid in self._access.locals:
            if llo <= lo < lhi:
                tensor_id, base = lid, llo
        return {"name": name, "direction": direction, "tensor": t.name, "tensor_id": tensor_id,
                "dtype": t.dtype.name, "shape": t.shape, "offset": lo - base, "nbytes": hi - lo}

    def _log(self, kind: str, name: str, start: int, where=None, **args) -> dict:
        """Record an operation; ``where`` defaults to the user's line that called it."""
        return self.events.op(kind, name, start, self._run.task_id, self._tasks.block_idx,
                              str(where if where is not None else user_location(2)), **args)

    # -- identity ---------------------------------------------------------------
    def world_size(self):
        raise ProgramError(f"pld.world_size() at {user_location(2)} is host-only. Inside a kernel use "
                           "pld.nranks(pld.get_comm_ctx(window)).")

    def get_comm_ctx(self, tensor):
        if not isinstance(tensor, WindowTensor):
            raise classified(ProgramTypeError(f"pld.get_comm_ctx at {user_location(2)}: needs a pld.DistributedTensor "
                                              f"(a window), got {checks.value_kind(tensor)}"),
                             pitfall=WINDOW_KIND_PITFALL,
                             fix="Pass a window (pld.window(buf, shape, dtype=...)) to pld.get_comm_ctx.")
        group = tensor.group
        if self.rank not in group:
            raise ProgramValueError(self._outside_group_text("pld.get_comm_ctx", tensor.describe(), group,
                                                             user_location(2)))
        # rank / nranks are relative to the window's comm domain (the ranks its buffer was dispatched to).
        return CommCtx(len(group), group.index(self.rank))

    def comm_rank(self, comm):
        return Scalar(self._identity("pld.rank", comm).rank_index, dt.INT32)

    def comm_nranks(self, comm):
        return Scalar(self._identity("pld.nranks", comm).world, dt.INT32)

    def _identity(self, op, comm) -> CommCtx:
        if self._kernel_depth == 0:
            raise RankIdentityError(
                f"{op}() at {user_location(2)} is called outside a kernel (in the per-device orchestration). "
                "Rank identity is read inside a kernel; or pass the host loop variable r as a scalar argument.")
        if not isinstance(comm, CommCtx):
            raise ProgramTypeError(f"{op}() at {user_location(2)}: takes pld.get_comm_ctx(window), got {comm!r}")
        return comm

    # -- memory operations ----------------------------------------------------------
    def memory_op(self, name, *args):
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            # The orchestration touching memory that unfinished tasks use waits for them first.
            self._await_overlapping(args)
        return self._OPS[name](self, name, *args)


# Every pl/pld memory, RMA and signal operation by name.  Unbound functions, kept on the class: a
# table of bound methods would make each RankContext a reference cycle, which only the garbage
# collector frees, and with it the views of host tensors and windows the context holds.
RankContext._OPS = {
    "pl.load": RankContext._load, "pl.store": RankContext._store, "pl.assemble": RankContext._store,
    "pl.read": RankContext._read,
    "pl.write": RankContext._write, "pl.slice": RankContext._slice, "pl.create_tensor": RankContext._create_tensor,
    "pld.system.defer_wait": RankContext._defer_wait,
    "pl.system.comm_notify": RankContext._comm_notify, "pl.system.comm_wait": RankContext._comm_wait,
    "pl.system.comm_test": RankContext._comm_test,
    "pld.system.async_session": RankContext._async_session, "pld.tensor.put_async": RankContext._put_async,
    "pld.system.wait_async_event": RankContext._wait_async_event,
}

def _conform_rank(spec, v):
    """``v`` viewed with the rank of tensor parameter ``spec`` when the two differ only by dimensions of size 1.

    A ``[SIZE]`` window given to a ``[1, SIZE]`` parameter (or a ``[1, SIZE]`` tensor to a ``[SIZE]`` one) is the
    same memory in the same order: the kernel sees it with the declared shape, and writes go through. Anything
    else is left as it is, for the argument check to explain.
    """
    if spec is None or spec.kind != "tensor" or not isinstance(v, RankTensor):
        return v
    declared = getattr(spec.ttype, "shape", None)
    if declared is None or len(declared) == len(v.shape):
        return v
    shape = unit_dims_reshape(tuple(declared), tuple(v.shape))
    return v if shape is None else v.reshaped(shape)
