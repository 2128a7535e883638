"""RankContext: runs one rank's tasks and gives every memory, RMA and signal operation its meaning.

This is the one place where the semantics of ``pl.load``/``pl.store``/...
and ``pld.system.notify``/``wait``/``remote_load``/``put``/... live.  Data
moves with numpy; signals and cross-rank atomics go through the backend's
``RankMemory``; the status board records what the rank is doing so the
driver can explain a hang.
"""

from __future__ import annotations

import bisect
import enum
import functools
import itertools
import sys

import numpy as np

from .. import _atomics, context
from ..check.findings import padding_read
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
    NOTIFY_OP_FIX,
    WINDOW_KIND_PITFALL,
    KernelIndexError,
    KernelStateError,
    KernelValueError,
    PeerRangeError,
    ProgramError,
    ProgramTypeError,
    ProgramValueError,
    RankIdentityError,
    classified,
)
from ..language import core_group
from ..language import dtypes as dt
from ..language.control import loop_indices
from ..language.distributed.types import AsyncEvent, AsyncSession, AtomicType, CommCtx, NotifyOp, WaitCmp
from ..language.functions import Function, Kind
from ..language.regions import RegionResult
from ..language.scalar import Scalar, as_int
from ..language.tile_ops import Tile
from ..language.types import Direction, unit_dims_reshape
from ..source import is_internal, user_frame, user_location
from .collective_calls import CollectiveCalls, CollectiveState
from .events import EventLog, now_ns
from .status import LAST_OP_CODES, OTHER_WAITS, WAIT_CMPS
from .tasks import OverlapIndex, Task, TaskGraph, buffer_key, overlap
from .tensors import RankTensor, WindowTensor

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds

ATOMIC_ADD_DTYPES = (dt.FP32, dt.FP16, dt.BF16, dt.INT32, dt.INT16, dt.INT8)
_NOTIFY, _WAIT, _DEFER_WAIT = (LAST_OP_CODES[f"pld.system.{n}"] for n in ("notify", "wait", "defer_wait"))
_REMOTE_LOAD, _PUT, _GET = (LAST_OP_CODES[n] for n in ("pld.tile.remote_load", "pld.tensor.put", "pld.tensor.get"))
_call_site, _plain_region, _plain_flat = _atomics.call_site, _atomics.region, _atomics.flat
_INT32_MIN, _INT32_END = -2**31, 2**31


def _index(v, op: str, what: str) -> int:
    """``v`` as a plain int: an integer Scalar's value, else :func:`as_int`'s conversion (and its error).

    The hot paths test ``type(v) is int`` inline and call this only otherwise, so that the message's
    f-string is built only for what is not already an int.
    """
    if type(v) is Scalar and not v.dtype.is_float:
        return v.value
    return as_int(v, f"{op} {what}")


def _site_text(site) -> str:
    """A task's submit line (:attr:`Task.site`) as ``file:line``."""
    if isinstance(site, tuple):
        code, line = site
        return f"{code.co_filename}:{line}"
    return str(site) if site else "?"


class RankContext(CollectiveCalls, context.Context):
    """The context of one running rank."""

    kind = "rank"
    _OPS: dict  # op name -> unbound method; filled in below the class

    def __init__(self, plan: DispatchPlan, rank: int, memory, host_arrays: list, wait_slice_s: float = 0.2,
                 events: EventLog | None = None, checked_args: dict | None = None):
        self.plan = plan
        self.rank = rank
        self.world = plan.world
        self.device_id = plan.device_ids[rank]
        self.memory = memory
        self.status = memory.status
        self._ledger = memory.status.ledger(rank)  # the progress and last-operation words, the notify ring
        # The board's last-operation words (what a rank that dies without reporting was doing), when it has them.
        last_op_words = getattr(memory.status, "last_op_words", None)
        self._last_op = last_op_words(rank) if last_op_words is not None else None
        self._site_slots: dict = {}  # (file, line) -> its slot in the board's site table
        # (id(code), instruction offset) -> (code, (site, slot word)) or (code, None) for ptodist's own: _here's cache
        self._call_sites: dict = {}
        self._site_slot = memory.status.site_slot
        self.host_arrays = host_arrays
        self.scalars: tuple = ()  # the dispatch's scalar arguments, by host parameter (its backend sets them)
        self.wait_slice_s = wait_slice_s
        self.task: str | None = None
        self.failed_task: str | None = None  # the innermost task an exception escaped from
        self._kernel_depth = 0
        self._deferred: list | None = None
        self._tasks_started = 0
        # Kernel argument signatures that passed the checks -> the kernel's parameters (_run_kernel); a
        # long-lived rank passes one dict to every dispatch's context.
        self._checked_args: dict = checked_args if checked_args is not None else {}
        self._spmd_blocks = 0
        self._region_blocks = 0  # the block count of the outlined pl.spmd region running (get_block_num)
        self.hand_signals: dict = {}    # window buffer id -> (shape, line) of the program's own notify/wait
        self._in_collective = 0
        self._coll = CollectiveState()  # the collectives' checked calls and layouts, the running one's call site
        # The plan is fixed for the run: window views and checked builtin calls are made once and reused.
        self._windows: dict = {}
        # The event log, when a diagnostic output asked for one; every hook below is skipped when None.
        self.events = events
        # Under `ptodist check` the log also takes every window access (for the happens-before checker).
        self._trace = events is not None and events.record_accesses
        self.checking = self._trace
        self._padding_reads: set = set()  # the lines whose padding read the checker was told of
        self._spans: tuple[list, list] | None = None  # window copies by address, for _touch
        self._task_id: int | None = None
        self._task_rec: dict | None = None  # the event record of the task running now (an event log only)
        # While the rank is blocked in a wait past its first slice, with an event log: the wait
        # (window, byte, cell, expected, cmp, line, start time, task record, pl.range indices), for a
        # stopped rank's records.
        self.blocked_in: tuple | None = None
        self._locals: list[tuple[int, int, str]] = []  # (start, end, id) of pl.create_tensor memory
        self._block_idx = 0
        self._polled: dict = {}  # (array address, index) -> the value pl.read saw there last
        self._dispatched_at: tuple | None = None  # (function, location) of the task whose arguments are being made
        # The dependency graph of the tasks this rank's orchestration submits (pl.at regions, pl.submit).
        self.graph = TaskGraph(self)
        self._manual = 0  # depth of pl.manual_scope blocks
        self._no_dep: set[int] = set()  # ids of the arguments pl.no_dep excluded from the next task's tracking
        self._left_conditions: list = []  # the deferred waits the last lazily run task left pending
        self._async_open: list = []  # the pld.tensor.put_async events not waited yet
        self._dump_keys: set = set()  # the memory pl.dump_tag marked for the selective dump
        # Under the checker, a rank's tasks are actors of the event log (rank/events.py): the task actors the
        # orchestration has not waited for yet, every task since then by the bytes it touches (complete ones
        # too), the actor of each task id, and the actor each pending deferred wait belongs to (by its id).
        self._open_actors: list[int] = []
        self._hb_tasks = OverlapIndex(keep_done=True) if self._trace else None
        self._tid_actor: dict[int, int] = {}
        self._cond_actor: dict[int, int] = {}
        self._kept: dict = {}  # (low, high) -> (root buffer, "host" or "local") of memory outside windows accessed

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
        self._site_slot = memory.status.site_slot
        self.host_arrays = host_arrays
        self._windows = {}
        self._spans = None
        self._polled = {}

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
                    self._dispatched_at = (name, task.location)
                    args = [self._materialize(a, spec) for a, spec in zip(task.args, fn.params)]
                    self._dispatched_at = None
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
            w = self._windows.get(key)
            if w is None:
                if buf.ranks is not None and self.rank not in buf.ranks:
                    fname, where = self._dispatched_at or ("a task", "?")
                    raise ProgramValueError(self._outside_group_text(
                        f"{fname}(..., device={self.rank})", f"window '{name}' (buffer '{buf.name}')", buf.ranks,
                        where))
                # The accessor holds the memory, not the context (no reference cycle; see _OPS).
                w = self._windows[key] = WindowTensor(name, buf, arg.shape, arg.dtype, self.rank, self.world,
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
            fname, at = self._dispatched_at or ("a task", "?")
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
            if not self._kernel_depth and not self._manual and (self._open_actors or not self.graph.idle):
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
        check = self._checked_args.get(signature) is not params
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
            if len(self._checked_args) >= 4096:  # signatures of shapes long gone (dynamic dims): start afresh
                self._checked_args.clear()
            self._checked_args[signature] = params  # kept alive by the entry, its id names no other list
        info = [self._tensor_info(spec.name, spec.direction.value, v) for spec, v in zip(params, values)
                if isinstance(v, RankTensor)] if events is not None else None
        named = list(zip((p.name for p in params), values)) if events is not None else ()
        outer = self._block_idx
        result, left = None, []
        blocks = [] if self._trace and self._spmd_blocks > 1 else None  # the blocks' actors, under the checker
        for i, b in enumerate(range(self._spmd_blocks) if self._spmd_blocks else (outer,)):
            self._block_idx = b
            parent = self._enter_block(b, fn.name, loc, blocks) if blocks is not None else None
            try:
                result = self._task_body(fn.name, core_group.kernel_body(fn, values), where=loc, info=info, deps=deps,
                                         tid=tid if i == 0 else None, lazy=lazy, tensors=named, dumps=dumps)
            finally:
                if parent is not None:
                    self.events.actor = parent
            left += self._left_conditions
        if blocks:
            self.events.join(blocks)  # the task (or call) is complete when all its blocks are
        self._block_idx = outer
        self._left_conditions = left
        return result

    def _task_body(self, name: str, body, kind: str = "task", where: object = "", info=None, deps=(),
                   tid: int | None = None, lazy: bool = False, tensors=(), dumps=()):
        """Run ``body`` as task ``tid`` (a new id when None).  Its deferred waits are waited for at its end, or,
        when ``lazy`` (a task of the graph), left in ``_left_conditions`` for the graph to complete it by.
        ``where`` (its ``str``: the task's line) is for the event log only."""
        outer_task, outer_deferred, outer_id = self.task, self._deferred, self._task_id
        self.task, self._deferred, self._task_id = name, [], self._new_tid() if tid is None else tid
        self._kernel_depth += 1
        self.status.set_running(self.rank, name)
        rec = self.events.task_begin(self._task_id, name, kind, str(where), self._block_idx, info or [], deps) \
            if self.events is not None else None
        outer_rec, self._task_rec = self._task_rec, rec
        try:
            result = body()
            if self._async_open:
                self._undrained()
            if self.events is not None and self.events.dump_args:
                self._dump(name, tensors, dumps)
            if lazy:
                self._left_conditions = list(self._deferred)
            else:
                for cond in self._deferred:
                    self._block_until(*cond)
            return result
        except BaseException:
            self.failed_task = self.failed_task or name
            raise
        finally:
            self._progressed()
            if rec is not None:
                self.events.task_end(rec)
            self._kernel_depth -= 1
            self.task, self._deferred, self._task_id = outer_task, outer_deferred, outer_id
            self._task_rec = outer_rec

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
        for llo, lhi, lid in self._locals:
            if llo <= lo < lhi:
                tensor_id, base = lid, llo
        return {"name": name, "direction": direction, "tensor": t.name, "tensor_id": tensor_id,
                "dtype": t.dtype.name, "shape": t.shape, "offset": lo - base, "nbytes": hi - lo}

    def _log(self, kind: str, name: str, start: int, where=None, **args) -> dict:
        """Record an operation; ``where`` defaults to the user's line that called it."""
        return self.events.op(kind, name, start, self._task_id, self._block_idx,
                              str(where if where is not None else user_location(2)), **args)

    def _new_tid(self) -> int:
        tid = self._tasks_started
        self._tasks_started += 1
        return tid

    def _check_deps(self, op: str, deps) -> None:
        for d in deps:
            if not isinstance(d, int) or not 0 <= d < self._tasks_started:
                raise ProgramError(f"{op} at {user_location(2)}: deps= must hold task ids of earlier tasks (from "
                                   f"`with pl.at(...) as tid` or pl.submit), got {d!r}")

    @staticmethod
    def _tensors(values):
        for v in values:
            if isinstance(v, RankTensor):
                yield v
            elif isinstance(v, (list, tuple)):
                yield from RankContext._tensors(v)

    def _buffers(self, values) -> frozenset:
        return frozenset(buffer_key(t) for t in self._tensors(values) if id(t) not in self._no_dep)

    def _submit_task(self, tid: int, name: str, run, deps, values, where: object = "", holdable: bool = False,
                     site: object = None) -> bool:
        """Hand a task to the graph (it runs now unless it must wait); True when it ran at once.

        ``where``: the line that submitted it (the checker's reports name it as where a dependency belongs);
        ``holdable``: its result does not depend on running at once (a ``pl.submit``: its outputs are its result);
        ``site``: that line as ``(code, line)``, where ``where`` is not known (read only by a hang report).
        """
        task = Task(tid, name, run, list(deps), self._buffers(values), self._manual > 0)
        task.site = where or site
        task.holdable = holdable and task.manual
        self._no_dep.clear()
        if self._trace:
            task.run = self._as_actor(task, run, str(where))
        return self.graph.submit(task)

    def _as_actor(self, task: Task, run, where: str):
        """Under the checker: make ``task`` an actor of the event log, forked from the orchestration where it is
        submitted; ``run``, wrapped so that the task runs as that actor, starting after the tasks it depends on
        (its deps=, and outside a manual scope every earlier task that shares bytes with it, complete or not)."""
        events = self.events
        explicit = [self._tid_actor[d] for d in task.deps if d in self._tid_actor]
        after = list(explicit)
        if not task.manual and task.buffers:
            after += [t.actor for t in self._hb_tasks.overlapping(task.buffers, prune=True)]
        actor = task.actor = events.fork(kind="task", name=task.name, task_id=task.tid, where=where,
                                         deps=list(task.deps), manual=task.manual,
                                         dep_lines=[events.actors[a]["where"] for a in explicit])
        self._tid_actor[task.tid] = actor
        self._open_actors.append(actor)
        if task.buffers:
            self._hb_tasks.add(task)

        def run_as_actor():
            outer, events.actor = events.actor, actor
            try:
                events.join(after)
                left = run()
            finally:
                events.actor = outer
            for c in left:  # its deferred waits complete it: they are the task's, whenever they hold
                self._cond_actor[id(c)] = actor
            return left

        return run_as_actor

    # -- the checker's actors for a mixed kernel's halves (language/core_group.py, language/ops/pipes.py) -------
    def hb_halves(self, labels: list) -> tuple | None:
        """Under the checker: fork one actor per half of a mixed kernel (``labels``: AIC, AIV0, ...) from the
        running one; returns ``(running actor, [the halves' actors])``, None when not checking."""
        if not self._trace:
            return None
        events = self.events
        parent = events.actor
        info = events.actors[parent]
        where = info["where"] if info.get("kind") == "task" else str(user_location(2))
        return parent, [events.fork(kind="half", name=label, task_id=self._task_id, where=where) for label in labels]

    def hb_act(self, actor: int) -> None:
        """What the rank records from now on is ``actor``'s (a half got the turn)."""
        self.events.actor = actor

    def hb_rejoin(self, parent: int, actors: list) -> None:
        """Back to ``parent``, after every one of ``actors`` (the halves of a finished mixed kernel)."""
        self.events.actor = parent
        self.events.join(actors)

    def hb_release(self):
        """Under the checker: a token for where the running actor is now (a pipe push, a barrier arrival)."""
        return self.events.release() if self._trace else None

    def hb_acquire(self, tokens: list) -> None:
        """Order the running actor after the points ``tokens`` mark (a pop after its push, after a barrier)."""
        self.events.acquire(tokens)

    def _await_overlapping(self, values) -> None:
        """The orchestration is about to touch ``values``: wait for the unfinished tasks that touch them; under
        the checker it goes on after every task since its last wait for all that touched them."""
        buffers = self._buffers(values)
        if not self.graph.idle:
            self.graph.wait_overlapping(buffers)
        if self._open_actors:
            tasks = self._hb_tasks.overlapping(buffers)
            if tasks:
                self.events.join([t.actor for t in tasks])
                for t in tasks:
                    t.joined = True  # ordered before all the orchestration does next: the index may drop it

    def _await_all(self) -> None:
        """The orchestration waits for every task it submitted (a collective, the end of the dispatch)."""
        if not self.graph.idle:
            self.graph.wait_for()
        if self._open_actors:
            self.events.join(self._open_actors)
            self._open_actors = []
            self._hb_tasks = OverlapIndex(keep_done=True)

    def submit(self, fn, args, kwargs, deps, blocks=0, dumps=()):
        op = "pl.spmd_submit" if blocks else "pl.submit"
        self._check_deps(op, deps)
        if not isinstance(fn, Function) or fn.kind is not Kind.KERNEL:
            raise ProgramTypeError(f"{op} at {user_location(2)}: the first argument must be a kernel "
                                   f"(@pl.jit.incore), got {fn!r}")
        if self._kernel_depth:
            raise ProgramError(f"{op} at {user_location(2)}: tasks are submitted by the orchestration, not from "
                               "inside a kernel; call the kernel directly here")
        tid, out = self._new_tid(), {}

        def run():
            saved, self._spmd_blocks = self._spmd_blocks, blocks
            try:
                out["result"] = self._run_kernel(fn, args, kwargs, deps, tid=tid, lazy=True, dumps=dumps)
            finally:
                self._spmd_blocks = saved
            return self._left_conditions

        # A task with one output at most may be held past its submission (sim): its result, the tensor it writes,
        # is the same whenever it runs; with more, what it returns when it runs at once may differ.
        holdable = sum(spec.kind == "tensor" and spec.direction is not Direction.IN for spec in fn.params) <= 1
        caller = sys._getframe(2)  # submit <- pl.submit <- the program: its line, for a hang report (no walk here)
        if self._submit_task(tid, fn.name, run, deps, _tracked(fn, args, kwargs),
                             user_location(2) if self._trace else "", holdable=holdable,
                             site=(caller.f_code, caller.f_lineno)):
            result = out["result"]
        else:  # it runs later: what it returns is its outputs, the tensors it was given to write
            outs = [v for spec, v in zip(fn.params, fn.bind_arguments(args, kwargs))
                    if spec.kind == "tensor" and spec.direction is not Direction.IN]
            result = None if not outs else outs[0] if len(outs) == 1 else tuple(outs)
        if isinstance(result, tuple):
            return (*result, tid)
        return result, tid

    # -- regions and scopes -------------------------------------------------------------
    def region(self, region, body, args):
        if self._kernel_depth:  # a region inside a task is part of that task
            return RegionResult(None, body(*args))
        level = getattr(region.level, "name", region.level)
        if level == "HOST":
            raise ProgramError(f"pl.at(level=pl.Level.HOST) at {user_location(2)}: a rank runs chip and core work; "
                               "the host level is the host orchestrator's (@pl.jit.host)")
        self._check_deps(f"pl.{region.kind}", region.deps)
        tid, out = self._new_tid(), {}
        where = user_location(2)
        name = region.name_hint or f"{self.task or 'region'}@{where.line if where is not None else '?'}"

        def run():
            saved, self._spmd_blocks = self._spmd_blocks, 0
            try:
                run_body = (lambda: self._blocks(region.blocks, body, args)) if region.kind == "spmd" else \
                    (lambda: body(*args))
                out["values"] = self._task_body(name, run_body, where=str(where), deps=region.deps, tid=tid,
                                                lazy=True, tensors=list(zip(body.__code__.co_varnames, args)),
                                                dumps=region.options.get("dumps", ()))
            finally:
                self._spmd_blocks = saved
            return self._left_conditions

        for t in region.options.get("no_dep_args", ()):
            self.exclude_from_deps(t)
        ran = self._submit_task(tid, name, run, region.deps, args, where)
        return RegionResult(tid, out.get("values") if ran else None, str(where))

    def _blocks(self, n: int, body, args):
        values = None
        saved, self._region_blocks = self._region_blocks, n
        blocks = [] if self._trace and n > 1 else None  # the blocks' actors, under the checker
        try:
            for b in range(n):
                self._block_idx = b
                parent = self._enter_block(b, None, None, blocks) if blocks is not None else None
                try:
                    values = body(*args)
                finally:
                    if parent is not None:
                        self.events.actor = parent
        finally:
            self._block_idx, self._region_blocks = 0, saved
        if blocks:
            self.events.join(blocks)  # the task is complete when all its blocks are
        return values

    def _enter_block(self, b: int, name, where, blocks: list) -> int:
        """Under the checker: run block ``b`` as an actor of its own, forked from the running one (the task the
        blocks belong to: blocks run concurrently); returns the running actor, to go back to after the block."""
        events = self.events
        parent = events.actor
        info = dict(events.actors[parent])
        if info.get("kind") != "task":  # blocks of a kernel called from the orchestration: the call is their task
            info = {"name": name, "task_id": self._task_id, "where": str(where), "deps": [], "manual": False}
        info.pop("parent", None)
        info["kind"], info["block"] = "block", b
        actor = events.fork(**info)
        blocks.append(actor)
        events.actor = actor
        return parent

    def region_begin(self, region):
        # A region run in place (its function's source was not available to outline it): its deps first.
        self._check_deps(f"pl.{region.kind}", region.deps)
        self.graph.wait_for(region.deps)
        if self._open_actors:
            self.events.join([self._tid_actor[d] for d in region.deps if d in self._tid_actor])
        if region.kind == "spmd":
            self._spmd_blocks = region.blocks
        return self._new_tid()

    def region_end(self, region, tid, failed: bool) -> None:
        if region.kind == "spmd":
            self._spmd_blocks = 0

    def scope_begin(self, manual: bool) -> None:
        if manual and self._manual:
            raise ProgramError(f"pl.manual_scope() at {user_location(2)}: a manual scope may not nest inside "
                               "another; flatten them into one")
        self._manual += manual

    def scope_end(self, manual: bool) -> None:
        self._manual -= manual

    def exclude_from_deps(self, tensor) -> None:
        self._no_dep.add(id(tensor))

    def dump_tag(self, tensor) -> None:
        self._dump_keys.add(buffer_key(self._tensor("pl.dump_tag", tensor)))

    def _dump(self, task: str, tensors, dumps) -> None:
        """Copy the task's tensors the dump asks for (all of them under enable_dump_args=2) into the event log."""
        marked = self._dump_keys | {buffer_key(t) for t in self._tensors(dumps)}
        for arg, t in tensors:
            if isinstance(t, RankTensor) and (self.events.dump_args == 2 or overlap(marked, [buffer_key(t)])):
                self.events.dumps.append({"task_id": self._task_id, "task": task, "arg": arg,
                                          "array": np.array(t.array, copy=True)})

    def condition_holds(self, cond) -> bool:
        """Poll a deferred wait without blocking; once it holds it is recorded like a wait that returned."""
        w, byte, _idx, expected, cmp, _loc = cond
        start = now_ns() if self.events is not None else 0
        ok, seen = self.memory.cell_wait(w.buffer.id, byte, cmp is WaitCmp.Ge, expected, 0.0)
        if ok:
            self._satisfied(cond, seen, start)
        return ok

    @staticmethod
    def watched(cond) -> tuple[int, int, int, bool]:
        """The cell a deferred wait watches: buffer id, INT32 cell index in the buffer, expected, whether ``>=``."""
        w, byte, _idx, expected, cmp, _loc = cond
        return w.buffer.id, byte >> 2, expected, cmp is WaitCmp.Ge

    def block_until_any(self, pending, own=None) -> list:
        """Block until some of ``pending`` (the task graph's deferred waits) hold; return those that do, oldest
        first, each recorded as a wait that returned (the checker joins the clocks of the notifies it needed).

        Every pending wait's cell is looked at in one vectorised pass per signal buffer (``PendingWaits``), and
        the backend's ``wait_any`` sleeps until a notify to this rank; a hit is confirmed with the backend's
        atomic read (an ``Eq`` cell may have moved on since the look).  A wait that lasts past its first slice
        is published on the status board: the oldest pending wait in the row, the next ones with it.

        ``own``: a wait of the rank's own, ``(w, byte, idx, expected, cmp, loc, what)``, that ends the block
        too, and is the one published in the row: the rank blocks in it while its tasks' deferred waits go on
        completing (on a device the scheduler completes them while a core waits).  Returns [] when it holds
        first (the caller confirms it).
        """
        memory, cells = self.memory, self.memory.cells
        start = now_ns() if self.events is not None else 0
        own_holds = None
        if own is not None:
            own_id, own_cell, own_expected, own_test = own[0].buffer.id, own[1] >> 2, own[3], _TESTS[own[4].name]

            def own_holds() -> bool:
                return own_test(int(cells(own_id)[own_cell]), own_expected)

        def check() -> bool:
            return (own_holds is not None and own_holds()) or pending.any_holds(cells)

        published = False
        while True:
            if own_holds is not None and own_holds():
                found = ()
            else:
                found = pending.holding(cells)
                if not found:
                    if published:
                        memory.wait_any(check, self.wait_slice_s)
                    elif not memory.wait_any(check, self.wait_slice_s):
                        self._publish_pending(pending, start, own)
                        published = True
                    continue
            if published:
                published = False
                self.blocked_in = None
                self.status.set_running(self.rank, self.task or "")
            if not found:
                return []
            held = []
            for d in found:
                w, byte, _idx, expected, cmp, _loc = d.cond
                ok, seen = memory.cell_wait(w.buffer.id, byte, cmp is WaitCmp.Ge, expected, 0.0)
                if ok:
                    self._satisfied(d.cond, seen, start)
                    held.append(d)
            if held:
                return held

    def _publish_pending(self, pending, start: int, own=None) -> None:
        """Say on the status board that this rank waits until any of ``pending`` holds (for a hang report); with
        ``own`` (a wait of its own, see block_until_any), that it waits in that one, the pending ones beside it."""
        here = user_location(3)

        def described(cond) -> tuple:
            w, byte, idx, expected, cmp, loc = cond
            cell = [int(i) for i in idx]
            return (w.buffer.id, byte, int(cmp is WaitCmp.Ge), expected, str(loc or here),
                    f"pld.system.defer_wait on '{w.name}' (buffer '{w.buffer.name}') cell {cell}",
                    cell[0] if cell else -1)

        edge = self._queued_edge(pending)
        if own is not None:
            w, byte, idx, expected, cmp, loc, what = own
            others = [described(d.cond) for d in pending.oldest(OTHER_WAITS)]
            self.status.set_waiting(self.rank, w.buffer.id, byte, WAIT_CMPS.index(cmp.name), expected, str(loc), what,
                                    int(idx[0]) if len(idx) else -1, others=others, more=len(pending),
                                    task=self.task or "", edge=edge)
            if self.events is not None:
                self.blocked_in = (w, byte, idx, expected, cmp, loc, start, self._task_rec, loop_indices())
            return
        first, *others = pending.oldest(1 + OTHER_WAITS)
        buffer_id, byte, ge, expected, where, what, cell0 = described(first.cond)
        self.status.set_waiting(self.rank, buffer_id, byte, ge, expected, where, what, cell0,
                                others=[described(d.cond) for d in others], more=len(pending) - 1,
                                task=first.task.name, edge=edge)
        if self.events is not None:
            w, byte, idx, expected, cmp, loc = first.cond
            self.blocked_in = (w, byte, idx, expected, cmp, loc or here, start, self._task_rec, loop_indices())

    def _queued_edge(self, pending) -> tuple[str, str] | None:
        """A task queued behind an incomplete one by an implicit overlap edge on the signal the incomplete one's
        deferred wait watches, as ``(its submit line, what the edge is)``; None when there is none.

        Only when the rank blocks past its first slice: the tasks' lines are resolved here, not at submission.
        The queued task may be what would satisfy the wait (its notify, or a peer's that answers it): then the
        two wait for each other, a deadlock no notify order explains.
        """
        # Bounded (the first 256 queued tasks, the 16 oldest waits): a rank on sim publishes at every block.
        queued = [t for t in itertools.islice(self.graph.waiting.values(), 256) if not t.manual and t.buffers]
        if not queued:
            return None
        for d in pending.oldest(16):
            waiter, w = d.task, d.cond[0]
            signal = [buffer_key(w)]
            for t in queued:
                if t in waiter.dependants and waiter.tid not in t.deps and overlap(t.buffers, signal):
                    at, waiter_at = _site_text(t.site), _site_text(waiter.site)
                    loc = d.cond[-1]
                    return at, (f"task '{t.name}' (submitted at {at}) takes '{w.name}' (buffer '{w.buffer.name}'), "
                                f"as does task '{waiter.name}' (submitted at {waiter_at}), whose "
                                f"pld.system.defer_wait{f' at {loc}' if loc else ''} watches it; outside a "
                                f"pl.manual_scope a task shares a tensor with an earlier unfinished one only after "
                                f"it completes, so '{t.name}' is queued until that deferred wait holds")
        return None

    def spmd(self, n: int):
        return _Spmd(self, n)

    def block_idx(self):
        return Scalar(self._block_idx, dt.INDEX)

    def block_num(self):
        return Scalar(self._spmd_blocks or self._region_blocks or 1, dt.INDEX)

    def _touch(self, op: str, t: RankTensor, view: np.ndarray, write: bool, atomic: bool = False) -> None:
        """Record an access to window memory for the checker; ``view`` holds exactly the elements touched.

        Whatever tensor the op was given (a window, a pl.slice of one, a host tensor), the address
        decides: only bytes inside some rank's copy of a window buffer are recorded.
        """
        if view.size == 0:
            return
        if self._spans is None:
            spans = sorted((byte_bounds(self.memory.window_bytes(b.id, r)), r, b.id)
                           for b in self.plan.windows if b.nbytes for r in range(self.world))
            self._spans = ([lo for (lo, _), _, _ in spans], spans)
        starts, spans = self._spans
        addr = view.__array_interface__["data"][0]
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr >= spans[i][0][1]:
            if len(self.events.actors) > 1:  # before the first task the orchestration alone touches this rank's memory
                self._touch_private(op, t, view, write, atomic, addr)
            return
        (lo, _), owner, buffer_id = spans[i]
        site = user_frame(2)
        self.events.access(op, write, atomic, owner, buffer_id, addr - lo, view.shape, view.strides, view.itemsize,
                           t.dtype.name, t.name, f"{site[0]}:{site[1]}" if site else "")

    def _touch_private(self, op: str, t: RankTensor, view: np.ndarray, write: bool, atomic: bool, addr: int) -> None:
        """Record an access to this rank's memory outside windows (a host tensor, a ``pl.create_tensor``
        tensor), by its root buffer's address range: the checker looks for races between the rank's tasks there."""
        root = view
        while isinstance(root.base, np.ndarray):
            root = root.base
        lo, hi = byte_bounds(root)
        kept = self._kept.get((lo, hi))
        if kept is None:  # kept alive until the dispatch ends: no later tensor takes these addresses
            kind = "local" if any(llo <= addr < lhi for llo, lhi, _ in self._locals) else "host"
            kept = self._kept[(lo, hi)] = (root, kind)
        kind = kept[1]
        site = user_frame(3)
        self.events.access(op, write, atomic, self.rank, None, addr - lo, view.shape, view.strides, view.itemsize,
                           t.dtype.name, t.name, f"{site[0]}:{site[1]}" if site else "", (kind, lo, hi))

    def padding_read(self, op: str, tile, axis: int) -> None:
        """Under ``ptodist check``: tell the checker that ``op`` reads ``tile``'s undefined padding on a device."""
        if not self._trace:
            return
        site = user_frame(2)
        where = f"{site[0]}:{site[1]}" if site else op
        if where not in self._padding_reads:
            self._padding_reads.add(where)
            self.events.finding(padding_read(self.rank, op, where, tile.data.shape, tile.valid_shape, axis,
                                             getattr(tile, "pad_src", None)))

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

    def _progressed(self) -> None:
        """Count communication progress: the hang detectors watch this word (CPU use alone is not progress)."""
        self._ledger.step(0)

    def _mark(self, op: int, site) -> None:
        """Publish operation ``op`` (a code of ``LAST_OPS``) at ``site`` (``(file, line)``) as the last
        communication operation this rank began.

        The status board keeps it for a rank that dies without reporting (``base.last_activity``);
        operations a collective makes are the collective's (marked once, at the user's call).
        """
        words = self._last_op
        if words is None or self._in_collective or site is None:
            return
        words.value = op | self._site_entry(site)[1]  # last_op and last_site, in one store

    def _site_entry(self, site) -> tuple:
        """``(site, slot word, slot)``: ``site`` (the user's ``(file, line)``, or None), its slot of the board's
        site table (-1: none, or the table is full) and that slot shifted into the ``last_site`` half of the
        last-op word (``op | slot word`` is the word to store)."""
        if site is None:
            return None, 0xFFFFFFFF << 32, -1
        slot = self._site_slots.get(site)
        if slot is None:
            slot = self._site_slots[site] = self._site_slot(self.rank, site)
        return site, (slot & 0xFFFFFFFF) << 32, slot

    def _here(self, frame) -> tuple | None:
        """:meth:`_site_entry` of the program's line at or above ``frame`` (at most four frames up; None when
        there is none: an operation of ptodist's own).

        Cached per call site, by its code and instruction: no stack walk, line number or code hash per
        operation; ptodist's own frames are cached too, as frames to step over.
        """
        sites = self._call_sites
        for _ in range(4):
            if frame is None:
                return None
            code = frame.f_code
            known = sites.get((id(code), frame.f_lasti))
            if known is None:
                name = code.co_filename
                entry = None if is_internal(name) else self._site_entry((name, frame.f_lineno))
                # The entry holds the code object: alive, its id is never another's, so the key stays its own.
                known = sites[(id(code), frame.f_lasti)] = (code, entry)
            if known[1] is not None:
                return known[1]
            frame = frame.f_back
        return None

    def _site_at(self, found, depth: int):
        """:meth:`_here` for what ``_atomics.call_site`` could not answer from the cache: ``found`` is a frame not
        cached yet, None when no program line is within reach, or NotImplemented (before Python 3.11) to look from
        ``depth`` frames above the operation."""
        if found is NotImplemented:
            found = sys._getframe(depth + 1)  # _site_at <- the operation <- ...
        return None if found is None else self._here(found)

    def _step_missed(self, missed, code: int, depth: int) -> None:
        """Finish an operation's step (``code``: of ``LAST_OPS``) that ``Ledger.step_at`` could not take from the
        call-site cache: ``missed`` is what it handed back, the caller's program line ``depth`` frames up."""
        here = self._site_at(missed, depth + 1)
        self._ledger.step(code | here[1] if here is not None else 0)

    def _tensor(self, op: str, t, what: str = "tensor") -> RankTensor:
        if isinstance(t, RankTensor):
            return t
        if isinstance(t, Tile):
            raise ProgramTypeError(f"{op} at {user_location(2)}: the {what} argument is a Tile (on-chip data); "
                                   "it needs a tensor in memory")
        raise ProgramTypeError(f"{op} at {user_location(2)}: the {what} argument must be a tensor, "
                               f"got {checks.value_kind(t)}")

    def _window(self, op: str, t, what: str) -> WindowTensor:
        if isinstance(t, WindowTensor):
            return t
        raise classified(ProgramTypeError(
            f"{op} at {user_location(2)}: '{what}' must be a pld.DistributedTensor (window) — remote memory "
            f"exists only in windows — got {checks.value_kind(t)}. Pass pld.window(buf, shape, dtype=...)."),
            pitfall=WINDOW_KIND_PITFALL)

    def _region(self, op: str, t: RankTensor, offsets, shape, valid_of=None, what: str = "tile") -> tuple:
        """The slices of ``t`` that the region at ``offsets`` of size ``shape`` covers, bounds-checked.

        ``valid_of``: ``shape`` is the valid extent of a ``what`` (a tile, a view) of that (larger) shape: only the
        valid region must lie inside ``t``, as upstream PyPTO checks a tail tile's load or slice (its
        ``pl.slice``/``pl.load`` docstrings: ``valid_shape`` bounds what is read, ``clamp`` cuts it to the edge).
        On a partly valid ``t`` the slices may reach past ``t.array``; numpy cuts them to the valid region.
        """
        # The hot path: plain ints inside the bounds, checked in C; anything else takes the checks below, and
        # their errors.
        sl = _plain_region(offsets, shape, t.array.shape)
        if sl is not None:
            return sl
        offsets = [o if type(o) is int else _index(o, op, "offset")
                   for o in (offsets if isinstance(offsets, (list, tuple)) else [offsets])]
        shape = [s if type(s) is int else _index(s, op, "shape") for s in shape]
        bounds = t.shape
        if len(offsets) != len(bounds) or len(shape) != len(bounds):
            raise KernelIndexError(f"{op} at {user_location(2)}: {t.describe()} has {len(bounds)} dimensions but "
                                   f"offsets {offsets} and shape {shape} have {len(offsets)} and {len(shape)}. "
                                   f"Give one offset and one size per dimension ({len(bounds)} each).")
        for i, (o, s, b) in enumerate(zip(offsets, shape, bounds)):
            if s < 0:
                raise KernelIndexError(
                    f"{op} at {user_location(2)}: out of bounds on {t.describe()}: offsets {offsets} with "
                    f"{'shape' if valid_of is None else 'valid_shape'} {shape} have a negative size in dimension "
                    f"{i}; sizes are 0 or more.")
            if o < 0 or o + s > b:  # Python ints: no overflow, whatever their size
                if valid_of is None:
                    raise KernelIndexError(
                        f"{op} at {user_location(2)}: out of bounds on {t.describe()}: offsets {offsets} with shape "
                        f"{shape} reach [{o}, {o + s}) in dimension {i}, whose bounds are [0, {b}).")
                left = [max(0, min(v, d - p)) for v, d, p in zip(shape, bounds, offsets)]
                raise KernelIndexError(
                    f"{op} at {user_location(2)}: out of bounds on {t.describe()}: offsets {offsets} with "
                    f"valid_shape {shape} (of a {list(valid_of)} {what}) reach [{o}, {o + s}) in dimension {i}, whose "
                    f"bounds are [0, {b}). Only the valid region is read, but all of it must lie inside the "
                    f"tensor. Shrink valid_shape to what is left of the tensor at these offsets ({left}), "
                    "or pass clamp=True to narrow it to the edge.")
        return tuple(slice(o, o + s) for o, s in zip(offsets, shape))

    def _peer(self, op: str, peer, w: WindowTensor) -> int:
        """The world rank of group rank ``peer`` of window ``w``'s comm domain (checked)."""
        p = peer if type(peer) is int else _index(peer, op, "peer")
        group = w.group
        if len(group) == self.world:
            return p if 0 <= p < self.world else self._world_peer(op, p)
        if self.rank not in group:
            raise ProgramValueError(self._outside_group_text(op, w.describe(), group))
        if not 0 <= p < len(group):
            n = len(group)
            hint = (" A negative neighbour index: integer % truncates toward zero on the device, so (r - 1) % n is "
                    "-1 for r = 0. Write (r - 1 + n) % n." if p < 0 else
                    " Peers are group ranks of the window's comm domain (0 .. nranks-1), not world ranks.")
            e = PeerRangeError(
                f"{op} at {user_location(2)}: peer {p} is outside [0, {n}) of the comm domain of {w.describe()}, "
                f"ranks {w.group_text()} (rank {self.rank} is group rank {group.index(self.rank)}, nranks {n}).{hint}")
            e.fix = (f"Keep peers in [0, nranks) of the window's domain: read nranks with "
                     f"pld.nranks(pld.get_comm_ctx({w.name})) and give group ranks, e.g. (r + 1) % n.")
            raise e
        return group[p]

    def _world_peer(self, op: str, peer) -> int:
        p = peer if type(peer) is int else _index(peer, op, "peer")
        if not 0 <= p < self.world:
            hint = ""
            if p < 0:
                hint = (" A negative neighbour index: integer % truncates toward zero on the device, so "
                        "(r - 1) % n is -1 for r = 0. Write (r - 1 + n) % n.")
                fix = "Keep peers in [0, world): write the left neighbour as (r - 1 + n) % n."
            else:
                hint = " peer is a rank index (0 .. world-1), not a device id."
                fix = ("Keep peers in [0, world): a peer is a rank index, not a device id; write the right neighbour "
                       "as (r + 1) % n.")
            e = PeerRangeError(f"{op} at {user_location(2)}: peer {p} is outside [0, {self.world}) "
                               f"(rank {self.rank}, world {self.world}).{hint}")
            e.fix = fix
            raise e
        return p

    @staticmethod
    def _valid_extent(op: str, shape, valid_shape, t: RankTensor, offsets, clamp: bool = False) -> tuple:
        """``(shape, valid)`` of a tile of ``shape`` loaded from ``t`` at ``offsets``: ``valid`` is ``valid_shape``
        (``shape`` when not given), checked to lie within the tile; ``clamp`` narrows it to ``t``'s edge."""
        shape = [as_int(d, f"{op} shape") for d in shape]
        if valid_shape is None:
            v = list(shape)
        else:
            v = [as_int(d, f"{op} valid_shape") for d in valid_shape]
            # A negative extent is left to the region check, which names it as an out-of-bounds region.
            if len(v) != len(shape) or any(a > b for a, b in zip(v, shape)):
                raise KernelValueError(
                    f"{op} at {user_location(2)}: valid_shape {v} must lie within the tile shape {shape}: the "
                    "valid region is the leading part of the tile that holds data, one extent per tile dimension, "
                    f"each between 0 and that dimension's size. Give {len(shape)} extents no larger than {shape}.")
        if clamp and isinstance(offsets, (list, tuple)) and len(offsets) == len(v) == len(t.shape):
            offs = [as_int(o, f"{op} offset") for o in offsets]
            v = [max(0, min(a, b - o)) if o >= 0 else a for a, b, o in zip(v, t.shape, offs)]
        return shape, v

    @staticmethod
    def _padded(data: np.ndarray, shape: list[int]) -> np.ndarray:
        """A tile of ``shape`` whose leading part is ``data`` and whose padding is zero."""
        if list(data.shape) == shape:
            return data.copy()
        out = np.zeros(shape, dtype=data.dtype)
        out[tuple(slice(0, a) for a in data.shape)] = data
        return out

    def _load(self, op, tensor, offsets, shapes, valid_shape, clamp=False):
        t = self._tensor(op, tensor)
        # A tile of lower rank than the tensor (one offset per tensor dimension) reads its trailing dimensions:
        # a [R, C] tile at [i, j, 0] of an [N, M, C] tensor is t[i, j:j+R, :C], as a store of it writes.
        lead = len(t.shape) - len(shapes) if isinstance(offsets, (list, tuple)) and \
            len(offsets) == len(t.shape) > len(shapes) else 0
        if lead:
            shapes = [1] * lead + list(shapes)
            valid_shape = None if valid_shape is None else [1] * lead + list(valid_shape)
        shape, valid = self._valid_extent(op, shapes, valid_shape, t, offsets, clamp)
        region = t.array[self._region(op, t, offsets, valid, shape if valid != shape else None)]
        if t.full_shape is not None and list(region.shape) != valid:
            valid = list(region.shape)  # a partly valid view: only what lies in its valid region is read
        if self._trace:
            self._touch(op, t, region, False)
        data = self._padded(region, shape)
        if lead:
            data, shape, valid = data.reshape(shape[lead:]), shape[lead:], valid[lead:]
        return Tile(data, t.dtype, valid if valid != shape else None)

    def _tile_data(self, op: str, tile, t: RankTensor) -> np.ndarray:
        if isinstance(tile, RankTensor):
            tile = Tile(tile.array, tile.dtype)
        if not isinstance(tile, Tile):
            raise ProgramTypeError(f"{op} at {user_location(2)}: expected a Tile, got {checks.value_kind(tile)}")
        data = tile.data
        if tile.dtype is t.dtype and tile.valid_shape == data.shape:  # the usual case: all of it, as it is
            return data
        if tile.dtype.np_dtype != t.dtype.np_dtype:
            raise ProgramTypeError(f"{op} at {user_location(2)}: the tile is {tile.dtype.name} but {t.describe()} "
                                   f"is {t.dtype.name}; convert with pl.cast(tile, target_type=pl.{t.dtype.name})")
        valid = tuple(slice(0, v) for v in tile.valid_shape)
        return tile.data[valid]

    def _store_region(self, op: str, t: RankTensor, offsets, data: np.ndarray) -> tuple:
        """Where a tile's valid part ``data`` goes in ``t`` at ``offsets``: ``(slices, data shaped to them)``.

        A tile of lower rank than ``t`` fills ``t``'s trailing dimensions; the leading ones it spans are of
        size 1 (a ``[R, C]`` tile stored at ``[i, j, 0]`` of an ``[N, M, C]`` tensor writes ``t[i, j:j+R, :C]``).
        """
        n = t.array.ndim
        if data.ndim < n and isinstance(offsets, (list, tuple)) and len(offsets) == n:
            data = data.reshape((1,) * (n - data.ndim) + data.shape)
        elif data.ndim != n:
            where = user_location(2)
            raise KernelIndexError(
                f"{op} at {where}: a {data.ndim}-D tile (valid part {list(data.shape)}) cannot be stored into "
                f"{t.describe()} at offsets {list(offsets) if isinstance(offsets, (list, tuple)) else offsets}: "
                f"the offsets need one entry per tensor dimension ({n}), and the tile at most {n} dimensions (a "
                "lower-rank tile fills the trailing dimensions). Give offsets with "
                f"{n} entries{', or reshape the tile' if data.ndim > n else ''}.")
        sl = self._region(op, t, offsets, data.shape)
        if t.full_shape is not None:  # a partly valid view: what falls outside its valid region is not written
            data = data[tuple(slice(0, n) for n in t.array[sl].shape)]
        return sl, data

    def _writable(self, op: str, t: RankTensor) -> None:
        if not t.writable:
            why = t.readonly_why or "it is an input (pl.Tensor)"
            raise classified(ProgramTypeError(
                f"{op} at {user_location(2)}: {t.describe()} is read-only: {why}. If it is written, annotate "
                "it pl.Out[...] or pl.InOut[...] where it is declared; otherwise write to an output instead."),
                kind="read_only")

    def _store(self, op, tile, offsets, tensor, atomic):
        t = self._tensor(op, tensor, "output_tensor")
        data = self._tile_data(op, tile, t)
        self._writable(op, t)
        sl, data = self._store_region(op, t, offsets, data)
        if atomic is AtomicType.Add:
            self._accumulate(op, t, t.array, sl, data, t.rank if isinstance(t, WindowTensor) else None)
        else:
            if self._trace:
                self._touch(op, t, t.array[sl], True)
            t.array[sl] = data
        return tensor

    def _flat_index(self, op, t: RankTensor, offset) -> tuple:
        if isinstance(offset, (list, tuple)):
            idx = tuple(as_int(o, f"{op} offset") for o in offset)
            if len(idx) != len(t.shape) or any(not 0 <= i < b for i, b in zip(idx, t.shape)):
                hint = (" A negative index: integer % truncates toward zero on the device, so (r - 1) % n is -1 "
                        "for r = 0. Write (r - 1 + n) % n.") if any(i < 0 for i in idx) else ""
                raise KernelIndexError(f"{op} at {user_location(2)}: index {list(idx)} is outside "
                                       f"{t.describe()}.{hint}")
        else:
            flat = as_int(offset, f"{op} offset")
            size = int(np.prod(t.shape, dtype=np.int64))
            if not 0 <= flat < size:
                raise KernelIndexError(f"{op} at {user_location(2)}: flat index {flat} is outside {t.describe()} "
                                       f"({size} elements)")
            idx = tuple(int(i) for i in np.unravel_index(flat, t.shape))
        if t.full_shape is not None and any(i >= a for i, a in zip(idx, t.array.shape)):
            raise KernelIndexError(
                f"{op} at {user_location(2)}: index {list(idx)} is outside the valid region "
                f"{list(t.array.shape)} of {t.describe()}: only the valid region is memory, nothing is there to "
                "read or write. Keep the index inside the valid region, or slice with a larger valid_shape.")
        return idx

    def _read(self, op, tensor, offset):
        t = self._tensor(op, tensor)
        idx = self._flat_index(op, t, offset)
        if self._trace:
            self._touch(op, t, t.array[tuple(slice(i, i + 1) for i in idx)], False)
        value = t.array[idx].item()
        # A polling read that sees a new value is progress; one that keeps seeing the same is not.
        key = (t.array.__array_interface__["data"][0], idx)
        if self._polled.get(key, value) != value:
            self._progressed()
        if len(self._polled) > 4096:
            self._polled.clear()
        self._polled[key] = value
        return Scalar(value, t.dtype)

    def _write(self, op, tensor, offset, value):
        t = self._tensor(op, tensor)
        self._writable(op, t)
        if t.dtype in dt.RAW_BITS:
            raise ProgramTypeError(f"{op} at {user_location(2)}: cannot write {value!r} into {t.describe()}: "
                                   + dt.raw_bits_why(t.dtype))
        idx = self._flat_index(op, t, offset)
        if self._trace:
            self._touch(op, t, t.array[tuple(slice(i, i + 1) for i in idx)], True)
        t.array[idx] = value.value if isinstance(value, Scalar) else value

    def _slice(self, op, tensor, shape, offset, valid_shape=None, clamp=False):
        """A view of ``tensor``'s region of ``shape`` at ``offset``; with ``valid_shape`` (or ``clamp``) only its
        valid region must lie inside ``tensor``, and only that region is memory (a tail tile's slice)."""
        t = self._tensor(op, tensor)
        if valid_shape is None and not clamp and t.full_shape is None:
            sl = self._region(op, t, offset, shape)
            return RankTensor(f"{t.name}[slice]", t.array[sl], t.dtype, t.writable, t.readonly_why)
        shape, valid = self._valid_extent(op, shape, valid_shape, t, offset, clamp)
        sl = self._region(op, t, offset, valid, shape if valid != shape else None, "view")
        # The slice is never valid where its source is not: numpy cuts the region to the source's valid region.
        return RankTensor(f"{t.name}[slice]", t.array[sl], t.dtype, t.writable, t.readonly_why, tuple(shape))

    def _create_tensor(self, op, shape, dtype):
        t = RankTensor("pl.create_tensor", np.zeros(shape, dtype=dtype.np_dtype), dtype)
        if self.events is not None:
            lo, hi = byte_bounds(t.array)
            self._locals.append((lo, hi, f"local:{len(self._locals)}"))
            self.events.allocated(hi - lo)
        return t

    # -- signals ------------------------------------------------------------------
    def _cell(self, op: str, w: WindowTensor, offsets) -> tuple[int, list[int]]:
        """The byte offset of signal cell ``offsets`` of ``w`` (checked), and the offsets as a list."""
        if w.dtype is dt.INT32:
            # The hot path of every notify and wait: a cell at plain int offsets inside the window, checked in C.
            flat = _plain_flat(offsets, w._shape)
            if flat >= 0:
                return flat * 4, offsets
        if w.dtype is not dt.INT32:
            raise ProgramTypeError(f"{op} at {user_location(2)}: signal cells are INT32, but {w.describe()} is "
                                   f"{w.dtype.name}. Use a separate INT32 window for signals.")
        if not isinstance(offsets, (list, tuple)):
            offsets = [offsets]
        shape = w.array.shape
        flat = 0
        try:
            # Hot path of every notify/wait: plain integer arithmetic, no numpy calls.
            for o, b in zip(offsets, shape, strict=True):
                i = o if type(o) is int else o.__index__()
                if not 0 <= i < b:
                    raise IndexError
                flat = flat * b + i
        except (ValueError, IndexError, AttributeError, TypeError):
            self._flat_index(op, w, offsets)  # raises the full, explained error
            raise
        return flat * 4, offsets

    def notify(self, target, peer, offsets, value, notify_op):
        """``pld.system.notify``. The hot path: checks inline where they are one test, helpers called only for
        what needs them, and the cell update with its bookkeeping one call of the rank's ledger."""
        op = "pld.system.notify"
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((target,))
        w = target if isinstance(target, WindowTensor) else self._window(op, target, "target")
        p = self._peer(op, peer, w)
        byte, cell = self._cell(op, w, offsets)
        v = value if type(value) is int else _index(value, op, "value")
        if not _INT32_MIN <= v < _INT32_END:
            v = self._int32(op, v, "value", w)
        if notify_op is NotifyOp.AtomicAdd:
            is_set = 0
        elif notify_op is NotifyOp.Set:
            is_set = 1
        else:
            raise classified(ProgramTypeError(f"{op} at {user_location(2)}: op= must be pld.NotifyOp.AtomicAdd or "
                                              f"pld.NotifyOp.Set, got {notify_op!r}"), fix=NOTIFY_OP_FIX)
        bid = w.buffer.id
        # Kept for hang reports: which notifies did each cell receive, from whom, from which line.
        if self._in_collective:
            slot, word = self._coll.site[2], 0  # the collective's mark stands for its notifies
        else:
            if bid not in self.hand_signals:
                self._hand_rolled(w)
            here = _call_site(self._call_sites, 1)  # notify <- pld.system.notify <- the program
            if type(here) is not tuple:
                here = self._site_at(here, 1) or self._site_entry(user_frame(2))
            slot, word = here[2], (_NOTIFY | here[1]) if here[0] is not None else 0
        start = now_ns() if self.events is not None else 0
        old = self.memory.notify(self._ledger, bid, p, byte, v, is_set, word, slot)
        if self.events is not None:
            new = v if is_set else old + v
            self._log("notify", op, start, buffer=w.buffer.name, buffer_id=w.buffer.id, owner=p,
                      cell=[int(i) for i in cell], offset=byte, op=notify_op.name, value=v, old=old, new=new)

    def _wait_args(self, op, signal, offsets, expected, cmp):
        w = signal if isinstance(signal, WindowTensor) else self._window(op, signal, "signal")
        byte, idx = self._cell(op, w, offsets)
        if not isinstance(cmp, WaitCmp):
            raise classified(ProgramTypeError(f"{op} at {user_location(2)}: cmp= must be pld.WaitCmp.Eq or "
                                              f"pld.WaitCmp.Ge, got {cmp!r}"),
                             fix=f"Pass cmp=pld.WaitCmp.Ge (the cell reaches the value) or cmp=pld.WaitCmp.Eq (the "
                                 f"cell equals it) to {op}.")
        if type(expected) is not int:
            expected = _index(expected, op, "expected")
        if not _INT32_MIN <= expected < _INT32_END:
            expected = self._int32(op, expected, "expected", w)
        return w, byte, idx, expected, cmp

    @staticmethod
    def _int32(op: str, v: int, what: str, w: WindowTensor) -> int:
        """Refuse a notify value or wait threshold that an INT32 signal cell cannot hold."""
        if -2**31 <= v < 2**31:
            return v
        raise KernelValueError(
            f"{op} at {user_location(2)}: {what} {v} does not fit the signal cell: {w.describe()} holds INT32 "
            f"values, [-2147483648, 2147483647]; the device would keep only the low 32 bits "
            f"({(v + 2**31) % 2**32 - 2**31}). "
            + ("Notify a count or tag that fits in INT32." if what == "value" else "Wait for a count that fits in INT32."))

    def wait(self, signal, offsets, expected, cmp):
        """``pld.system.wait``."""
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((signal,))
        w, byte, idx, expected, cmp = self._wait_args("pld.system.wait", signal, offsets, expected, cmp)
        if not self._in_collective:
            if w.buffer.id not in self.hand_signals:
                self._hand_rolled(w)
            if self._last_op is not None:
                here = _call_site(self._call_sites, 1)  # wait <- pld.system.wait <- the program
                if type(here) is not tuple:
                    here = self._site_at(here, 1)
                if here is not None:
                    self._last_op.value = _WAIT | here[1]
        self._block_until(w, byte, idx, expected, cmp, None)

    def _defer_wait(self, op, signal, offsets, expected, cmp):
        cond = (*self._wait_args(op, signal, offsets, expected, cmp), user_location(2))
        if cond[-1] is not None:
            self._mark(_DEFER_WAIT, (cond[-1].file, cond[-1].line))
        if self._deferred is None:
            self._block_until(*cond)
        elif len(self._deferred) >= 64:
            raise KernelValueError(f"{op} at {cond[-1]}: a task may register at most 64 deferred waits")
        else:
            self._deferred.append(cond)

    def _block_until(self, w: WindowTensor, byte: int, idx, expected: int, cmp: WaitCmp, loc,
                     what: str | None = None) -> None:
        ge = cmp is WaitCmp.Ge
        start = now_ns() if self.events is not None else 0
        # Fast path: satisfied within the first slice; what the rank waits on is published only after
        # it, for the hang report (the driver calls a hang certain only after a longer stillness).
        ok, seen = self.memory.cell_wait(w.buffer.id, byte, ge, expected, self.wait_slice_s)
        if not ok and self.graph.run_ready():  # the rank's ready tasks run while it would wait (as on a device)
            ok, seen = self.memory.cell_wait(w.buffer.id, byte, ge, expected, self.wait_slice_s)
        if not ok:
            loc = loc or user_location(2)
            what = what or f"pld.system.wait on '{w.name}' (buffer '{w.buffer.name}') cell {[int(i) for i in idx]}"
        # While tasks' deferred waits are pending, what this wait needs may come only once one of them holds and
        # its dependants run (as a device's scheduler completes them while a core waits): wait for either.
        while not ok and self.graph.pending:
            held = self.block_until_any(self.graph.pending, (w, byte, idx, expected, cmp, loc, what))
            if held:
                self.graph.held(held)
            else:
                ok, seen = self.memory.cell_wait(w.buffer.id, byte, ge, expected, 0.0)
        if not ok:
            self.status.set_waiting(self.rank, w.buffer.id, byte, int(ge), expected, str(loc), what,
                                    int(idx[0]) if len(idx) else -1, task=self.task or "")
            if self.events is not None:
                self.blocked_in = (w, byte, idx, expected, cmp, loc, start, self._task_rec, loop_indices())
            while not ok:
                ok, seen = self.memory.cell_wait(w.buffer.id, byte, ge, expected, self.wait_slice_s)
            self.blocked_in = None
            self.status.set_running(self.rank, self.task or "")
        self._satisfied((w, byte, idx, expected, cmp, loc), seen, start)

    def _satisfied(self, cond, seen: int, start: int) -> None:
        """A wait returned (its cell held ``seen``): a step of progress, and its record in the event log."""
        self._ledger.step(0)  # _progressed, inline
        if self.events is not None:
            w, byte, idx, expected, cmp, loc = cond
            # A task's deferred wait is that task's actor's, whoever was running when it held.
            actor = self._cond_actor.pop(id(cond), None) if self._cond_actor else None
            outer = self.events.actor
            if actor is not None:
                self.events.actor = actor
            # loc: a deferred wait runs at its task's end, but is attributed to its defer_wait line
            self._log("wait", "pld.system.wait", start, where=loc, buffer=w.buffer.name, buffer_id=w.buffer.id,
                      owner=self.rank, cell=[int(i) for i in idx], offset=byte, cmp=cmp.name, expected=expected,
                      seen=seen)
            self.events.actor = outer

    # -- remote memory access ---------------------------------------------------------
    def _accumulate(self, op, t, dst: np.ndarray, sl, data, owner: int | None):
        if t.dtype not in ATOMIC_ADD_DTYPES:
            raise ProgramTypeError(f"{op} at {user_location(2)}: atomic add supports "
                                   f"{', '.join(d.name for d in ATOMIC_ADD_DTYPES)}; {t.describe()} is {t.dtype.name}")
        if self._trace:
            self._touch(op, t, dst[sl], True, atomic=True)
        if owner is None:
            dst[sl] += data
            return
        with self.memory.locked(owner):
            dst[sl] += data

    def remote_load(self, target, peer, offsets, shape, valid_shape=None):
        """``pld.tile.remote_load``."""
        op = "pld.tile.remote_load"
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((target,))
        if type(offsets) is not list:
            offsets = list(offsets)
        if type(shape) is not list:
            shape = list(shape)
        w = target if isinstance(target, WindowTensor) else self._window(op, target, "target")
        p = self._peer(op, peer, w)
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, _REMOTE_LOAD)
        if missed is not None:
            self._step_missed(missed, _REMOTE_LOAD, 1)
        start = now_ns() if self.events is not None else 0
        if valid_shape is None:  # the whole tile is valid: the region is the tile (plain ints checked in C)
            sl = _plain_region(offsets, shape, w._shape) or self._region(op, w, offsets, shape)
            region = w.peer_array(p)[sl]
            data, valid = region.copy(), None
        else:
            shape, valid = self._valid_extent(op, shape, valid_shape, w, offsets)
            region = w.peer_array(p)[self._region(op, w, offsets, valid, shape if valid != shape else None)]
            data = self._padded(region, shape)
            if valid == shape:
                valid = None
        if self._trace:
            self._touch(op, w, region, False)
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=region.nbytes, direction="read")
        return _tile(data, w.dtype, valid)

    def remote_store(self, tile, target, peer, offsets, atomic, op="pld.tile.remote_store"):
        """``pld.tile.remote_store`` (and ``pld.tensor.remote_store``, named by ``op``)."""
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((tile, target))
        if type(offsets) is not list:
            offsets = list(offsets)
        w = target if isinstance(target, WindowTensor) else self._window(op, target, "target")
        p = self._peer(op, peer, w)
        if type(tile) is Tile and tile.dtype is w.dtype and tile.valid_shape == tile.data.shape:
            # The usual case, checked inline: a whole tile of the window's dtype and rank, at plain ints.
            data = tile.data
            sl = _plain_region(offsets, data.shape, w._shape)
            if sl is None:
                sl, data = self._store_region(op, w, offsets, data)
        else:
            sl, data = self._store_region(op, w, offsets, self._tile_data(op, tile, w))
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        code = LAST_OP_CODES[op]
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, code)
        if missed is not None:
            self._step_missed(missed, code, 1)
        start = now_ns() if self.events is not None else 0
        dst = w.peer_array(p)
        if atomic is AtomicType.Add:
            self._accumulate(op, w, dst, sl, data, p)
        else:
            if self._trace:
                self._touch(op, w, dst[sl], True)
            dst[sl] = data
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=data.nbytes, direction="write",
                      atomic=atomic.name if isinstance(atomic, AtomicType) else "None_")

    def _transfer_regions(self, op, dst: RankTensor, src: RankTensor, dst_offsets, src_offsets, shape, chunk_rows,
                          chunk_cols, pipeline):
        if pipeline and (as_int(chunk_rows, "chunk_rows") <= 0 or as_int(chunk_cols, "chunk_cols") <= 0):
            raise KernelValueError(f"{op} at {user_location(2)}: pipeline=True needs chunk_rows > 0 and "
                                   f"chunk_cols > 0 (got chunk_rows={chunk_rows}, chunk_cols={chunk_cols})")
        given = {"dst_offsets": dst_offsets, "src_offsets": src_offsets, "shape": shape}
        missing = [k for k, v in given.items() if v is None]
        if missing and len(missing) < 3:
            raise KernelValueError(f"{op} at {user_location(2)}: dst_offsets, src_offsets and shape go together; "
                                   f"{', '.join(missing)} missing")
        if missing:
            if dst.shape != src.shape:
                raise KernelValueError(f"{op} at {user_location(2)}: without a region, src and dst must have the "
                                       f"same shape; {src.describe()} vs {dst.describe()}. Give dst_offsets, "
                                       "src_offsets and shape.")
            whole = tuple(slice(None) for _ in dst.shape)
            return whole, whole
        return self._region(op, dst, dst_offsets, shape), self._region(op, src, src_offsets, shape)

    def put(self, dst, peer, src, dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline,
            op="pld.tensor.put"):
        """``pld.tensor.put`` (and ``pld.tile.put``, named by ``op``)."""
        transfer = (dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline)
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((dst, src))
        w = dst if isinstance(dst, WindowTensor) else self._window(op, dst, "dst")
        p = self._peer(op, peer, w)
        s = src if isinstance(src, RankTensor) else self._tensor(op, src, "src")
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, _PUT)
        if missed is not None:
            self._step_missed(missed, _PUT, 1)
        start = now_ns() if self.events is not None else 0
        dst_array = w.peer_array(p)
        nbytes = self._plain_copy(dst_array, w, s.array, s, transfer)
        if nbytes < 0:
            nbytes = self._copy(op, w, dst_array, p, s, s.array, *transfer)
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=nbytes, direction="write",
                      atomic=transfer[3].name if isinstance(transfer[3], AtomicType) else "None_")

    def get(self, dst, peer, src, dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline,
            op="pld.tensor.get"):
        """``pld.tensor.get`` (and ``pld.tile.get``, named by ``op``)."""
        transfer = (dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline)
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((dst, src))
        w = src if isinstance(src, WindowTensor) else self._window(op, src, "src")
        p = self._peer(op, peer, w)
        d = dst if isinstance(dst, RankTensor) else self._tensor(op, dst, "dst")
        if not d.writable:
            self._writable(op, d)
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, _GET)
        if missed is not None:
            self._step_missed(missed, _GET, 1)
        start = now_ns() if self.events is not None else 0
        src_array = w.peer_array(p)
        nbytes = self._plain_copy(d.array, d, src_array, w, transfer)
        if nbytes < 0:
            nbytes = self._copy(op, d, d.array, d.rank if isinstance(d, WindowTensor) else None, w, src_array,
                                *transfer)
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=nbytes, direction="read",
                      atomic=transfer[3].name if isinstance(transfer[3], AtomicType) else "None_")

    def _plain_copy(self, dst_array, dst, src_array, src, transfer) -> int:
        """The usual put / get, checked inline: plain-int regions of one dtype, no atomic, no pipeline, no trace.
        Returns the bytes moved, or -1 for anything else (then :meth:`_copy` checks, explains and moves)."""
        dst_offsets, src_offsets, shape, atomic, _, _, pipeline = transfer
        if pipeline or atomic is AtomicType.Add or src.dtype is not dst.dtype or self._trace or shape is None:
            return -1
        dsl = _plain_region(dst_offsets, shape, dst_array.shape)
        ssl = _plain_region(src_offsets, shape, src_array.shape) if dsl is not None else None
        if ssl is None:
            return -1
        data = src_array[ssl]
        dst_array[dsl] = data
        return data.nbytes

    def _copy(self, op, dst, dst_array, owner, src, src_array, dst_offsets, src_offsets, shape, atomic, chunk_rows,
              chunk_cols, pipeline) -> int:
        """Move a region from ``src_array`` into ``dst_array`` (``owner``: the rank whose window is written).

        Returns the number of bytes moved."""
        if src.dtype is not dst.dtype and src.dtype.np_dtype != dst.dtype.np_dtype:
            raise ProgramTypeError(f"{op} at {user_location(2)}: src {src.describe()} and dst {dst.describe()} "
                                   "have different dtypes")
        if not pipeline and dst_offsets is not None and src_offsets is not None and shape is not None:
            # The usual case: plain ints inside the bounds (checked in C), else _region's checks and errors.
            dsl = _plain_region(dst_offsets, shape, dst_array.shape) or self._region(op, dst, dst_offsets, shape)
            ssl = _plain_region(src_offsets, shape, src_array.shape) or self._region(op, src, src_offsets, shape)
        else:
            dsl, ssl = self._transfer_regions(op, dst, src, dst_offsets, src_offsets, shape, chunk_rows, chunk_cols,
                                              pipeline)
        data = src_array[ssl]
        if src.full_shape is not None or dst.full_shape is not None:
            # A partly valid view on either side: only what is valid on both sides moves (numpy has cut each
            # region to its view's valid region).
            room = dst_array[dsl].shape
            if data.shape != room:
                data = data[tuple(slice(0, min(a, b)) for a, b in zip(data.shape, room))]
                dsl = tuple(slice(s.indices(n)[0], s.indices(n)[0] + c) for s, n, c in zip(dsl, dst_array.shape,
                                                                                          data.shape))
        if self._trace:
            self._touch(op, src, data, False)
        if atomic is AtomicType.Add:
            self._accumulate(op, dst, dst_array, dsl, data, owner)
        else:
            if self._trace:
                self._touch(op, dst, dst_array[dsl], True)
            dst_array[dsl] = data
        return data.nbytes


    # -- pl.system.comm_*: signals on a one-cell INT32 tensor ----------------------------------------------
    def _comm_cell(self, op: str, signal) -> tuple[WindowTensor, int]:
        """The window cell a one-cell INT32 tensor views: its buffer as INT32 cells (a window of this rank's
        domain) and the cell's byte offset.  The tensor's memory decides, whatever view made it."""
        t = self._tensor(op, signal, "signal")
        if t.dtype is not dt.INT32:
            raise ProgramTypeError(f"{op} at {user_location(3)}: the signal must be INT32, but {t.describe()} is "
                                   f"{t.dtype.name}. Use a cell of an INT32 window.")
        if not t.shape or any(d != 1 for d in t.shape):
            raise ProgramValueError(f"{op} at {user_location(3)}: the signal must hold exactly one INT32 cell (every "
                                    f"dimension 1), but {t.describe()} has shape {t.shape}. Slice one cell: "
                                    "pl.slice(window, [1], [i]).")
        addr = t.array.__array_interface__["data"][0]
        for b in self.plan.windows:
            if b.nbytes and (b.ranks is None or self.rank in b.ranks):
                lo, hi = byte_bounds(self.memory.window_bytes(b.id, self.rank))
                if lo <= addr < hi and (addr - lo) % 4 == 0:
                    key = (b.id, (b.nbytes // 4,), "INT32", b.name)
                    w = self._windows.get(key)
                    if w is None:
                        w = self._windows[key] = WindowTensor(b.name, b, (b.nbytes // 4,), dt.INT32, self.rank,
                                                              self.world, functools.partial(_window_bytes,
                                                                                            self.memory, b.id))
                    return w, addr - lo
        raise ProgramValueError(f"{op} at {user_location(3)}: the signal {t.describe()} is not a cell of a window, so "
                                "no other rank can reach it. Use a cell of an INT32 window (pld.window), e.g. "
                                "pl.slice(signal_window, [1], [i]).")

    @staticmethod
    def _comm_int(op: str, v, what: str) -> int:
        if isinstance(v, bool) or (type(v) is Scalar and v.dtype.is_float) or not hasattr(v, "__index__"):
            raise ProgramTypeError(f"{op} at {user_location(3)}: {what} must be an INT32 integer (an int or an "
                                   f"integer pl.Scalar), got {v!r}")
        return v.__index__() if type(v) is not Scalar else v.value

    def _comm_notify(self, op, signal, value, mode):
        """``pl.system.comm_notify``: ``pld.system.notify`` on the cell the tensor views."""
        if mode not in _COMM_NOTIFY_OPS:
            raise ProgramValueError(f"{op} at {user_location(2)}: op= must be \"atomic_add\" or \"set\", got "
                                    f"{mode!r}")
        w, byte = self._comm_cell(op, signal)
        v = self._comm_int(op, value, "value")
        # A tensor can only view this rank's copy of a window: the notify is to this rank's own cell.
        self.notify(w, w.group.index(self.rank), [byte >> 2], v, _COMM_NOTIFY_OPS[mode])

    def _comm_condition(self, op, signal, cmp_value, cmp):
        if cmp not in _COMM_CMPS:
            raise ProgramValueError(f"{op} at {user_location(3)}: cmp= must be one of \"eq\", \"ne\", \"gt\", "
                                    f"\"ge\", \"lt\", \"le\", got {cmp!r}")
        w, byte = self._comm_cell(op, signal)
        expected = self._comm_int(op, cmp_value, "cmp_value")
        if not _INT32_MIN <= expected < _INT32_END:
            self._int32(op, expected, "expected", w)
        if cmp == "gt" and expected < _INT32_END - 1:  # > x is >= x + 1: the monotone wait the hang report knows
            cmp, expected = "ge", expected + 1
        return w, byte, expected, cmp

    def _comm_wait(self, op, signal, cmp_value, cmp):
        """``pl.system.comm_wait``: block until this rank's cell compares true (``eq`` / ``ge`` / ``gt`` are
        ``pld.system.wait``; ``ne`` / ``lt`` / ``le`` wait for the cell to change until it does)."""
        w, byte, expected, cmp = self._comm_condition(op, signal, cmp_value, cmp)
        if cmp in ("eq", "ge"):
            self.wait(w, [byte >> 2], expected, WaitCmp.Eq if cmp == "eq" else WaitCmp.Ge)
            return
        test, cells, i = _COMM_CMPS[cmp], self.memory.cells, byte >> 2
        start = now_ns() if self.events is not None else 0
        loc = user_location(2)
        what = f"{op} on '{signal.name}' (buffer '{w.buffer.name}') cell {i}"
        ok = test(int(cells(w.buffer.id)[i]), expected) or (self.graph.run_ready()
                                                            and test(int(cells(w.buffer.id)[i]), expected))
        while not ok and self.graph.pending:  # as in _block_until: the tasks' deferred waits complete meanwhile
            held = self.block_until_any(self.graph.pending, (w, byte, [i], expected, _CommCmp[cmp], loc, what))
            if held:
                self.graph.held(held)
            else:
                ok = test(int(cells(w.buffer.id)[i]), expected)
        published = False
        while not self.memory.wait_any(lambda: test(int(cells(w.buffer.id)[i]), expected), self.wait_slice_s):
            if not published:
                published = True
                if self.events is not None:  # for a stopped rank's records (dfx/flush.py)
                    self.blocked_in = (w, byte, [i], expected, _CommCmp[cmp], loc, start, self._task_rec,
                                       loop_indices())
                self.status.set_waiting(self.rank, w.buffer.id, byte, WAIT_CMPS.index(_CommCmp[cmp].name),
                                        expected, str(loc), what, i)
        if published:
            self.blocked_in = None
            self.status.set_running(self.rank, self.task or "")
        self._satisfied((w, byte, [i], expected, _CommCmp[cmp], loc), int(cells(w.buffer.id)[i]), start)

    def _comm_test(self, op, signal, cmp_value, cmp):
        """``pl.system.comm_test``: whether this rank's cell compares true now; a true test counts as a wait that
        returned (what the rank read after it is ordered after the notifies that made it true)."""
        w, byte, expected, cmp = self._comm_condition(op, signal, cmp_value, cmp)
        start = now_ns() if self.events is not None else 0
        seen = int(self.memory.cells(w.buffer.id)[byte >> 2])
        if cmp in ("eq", "ge"):  # confirmed with the backend's atomic read, as a wait's is
            ok, seen = self.memory.cell_wait(w.buffer.id, byte, cmp == "ge", expected, 0.0)
        else:
            ok = _COMM_CMPS[cmp](seen, expected)
        if ok:
            self._satisfied((w, byte, [byte >> 2], expected, _CommCmp[cmp], user_location(2)), seen, start)
        return Scalar(bool(ok), dt.BOOL)

    # -- pld.tensor.put_async, its session and its event -------------------------------------------------------
    # The data lands when put_async is called (as the device's CPU simulation does), but the transfer counts as
    # complete only at its wait: that is where the checker sees the write (a notify between the two races with
    # it), and a source changed before the wait is an error (the device may read it until then).
    def _async_session(self, op, sync_id, block_bytes):
        loc = user_location(2)
        if not self._kernel_depth:
            raise ProgramError(f"{op} at {loc}: is called outside a kernel; an SDMA session belongs to a kernel "
                               "(@pl.jit.incore): build it there, before the kernel's first pld.tensor.put_async.")
        if isinstance(sync_id, bool) or not isinstance(sync_id, int) or not 0 <= sync_id <= 7:
            raise ProgramValueError(f"{op} at {loc}: sync_id must be an int in [0, 7] (the device has 8 SDMA sync "
                                    f"flags), got {sync_id!r}")
        if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 0:
            raise ProgramValueError(f"{op} at {loc}: block_bytes must be an int >= 0 (the SDMA chunk size in bytes; "
                                    f"0 for the 1 MiB default), got {block_bytes!r}")
        return AsyncSession(sync_id, block_bytes or 1 << 20, self._task_id, str(loc))

    def _put_async(self, op, dst, peer, src, session, dst_offsets, src_offsets, shape):
        loc = user_location(2)
        if not isinstance(session, AsyncSession):
            raise ProgramTypeError(f"{op} at {loc}: session must be the pl.AsyncSession of "
                                   f"pld.system.async_session(), got {checks.value_kind(session)}")
        if session.task != self._task_id:
            raise ProgramValueError(f"{op} at {loc}: the session was built by another task (at {session.where}); "
                                    "build one in this kernel with pld.system.async_session()")
        w = dst if isinstance(dst, WindowTensor) else self._window(op, dst, "dst")
        p = self._peer(op, peer, w)
        s = self._tensor(op, src, "src")
        if s.dtype is not w.dtype:
            raise ProgramTypeError(f"{op} at {loc}: dst {w.describe()} and src {s.describe()} must have the same "
                                   "dtype")
        if len(w.shape) != len(s.shape):
            raise ProgramValueError(f"{op} at {loc}: dst rank ({len(w.shape)}) must match src rank "
                                    f"({len(s.shape)}); {w.describe()} and {s.describe()}")
        dsl, ssl = self._transfer_regions(op, w, s, dst_offsets, src_offsets, shape, 0, 0, False)
        sent = s.array[ssl].copy()
        if sum(d != 1 for d in sent.shape) > 1:
            raise ProgramValueError(f"{op} at {loc}: what moves must be logically 1-D (every dimension but one of "
                                    f"size 1: the SDMA engine moves one flat run), got shape {list(sent.shape)}. "
                                    "Move it with pld.tensor.put, or one row per put_async.")
        self._progressed()
        start = now_ns() if self.events is not None else 0
        w.peer_array(p)[dsl] = sent  # a peer's window on mpi is a RemoteArray: an assignment is its MPI Put
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=sent.nbytes, direction="write",
                      atomic="None_")
        event = AsyncEvent(session, str(loc), (w, p, dsl, s, ssl, sent))
        self._async_open.append(event)
        return event

    def _wait_async_event(self, op, event, session):
        loc = user_location(2)
        if not isinstance(event, AsyncEvent):
            raise ProgramTypeError(f"{op} at {loc}: event must be the pl.AsyncEvent pld.tensor.put_async returned, "
                                   f"got {checks.value_kind(event)}")
        if not isinstance(session, AsyncSession):
            raise ProgramTypeError(f"{op} at {loc}: session must be the pl.AsyncSession of "
                                   f"pld.system.async_session(), got {checks.value_kind(session)}")
        if event.session is not session:
            raise ProgramValueError(f"{op} at {loc}: the event was issued on another session (by the put_async at "
                                    f"{event.where}); wait with the session it was issued on")
        if event.transfer is None:  # drained by an earlier wait
            return Scalar(True, dt.BOOL)
        w, p, dsl, s, ssl, sent = event.transfer
        event.transfer = None
        self._async_open.remove(event)
        src_view = s.array[ssl]
        if src_view.tobytes() != sent.tobytes():
            raise KernelStateError(
                f"{op} at {loc}: the source {s.describe()} of the pld.tensor.put_async at {event.where} changed "
                "before this wait; the device may read the source until the wait returns, so the peer could "
                "receive either version. Write the source only after the wait (or put_async a copy).")
        if self._trace:  # the transfer's accesses, complete here
            self._touch("pld.tensor.put_async", s, src_view, False)
            self._touch("pld.tensor.put_async", w, w.peer_array(p)[dsl], True)
        self._progressed()
        return Scalar(True, dt.BOOL)

    def _undrained(self) -> None:
        """Refuse a task that returns with put_async transfers of its own not waited."""
        left = [e for e in self._async_open if e.session.task == self._task_id]
        if left:
            for e in left:
                self._async_open.remove(e)
            raise KernelStateError(
                f"pld.tensor.put_async at {left[0].where}: the kernel returned before waiting for its event "
                f"({len(left)} transfer{'s' if len(left) > 1 else ''} not waited); the data may still be in "
                "flight. Call pld.system.wait_async_event(event, session) before the kernel returns.")


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

# pl.system.comm_*: the notify modes, the comparisons (and how an event record names them)
_COMM_NOTIFY_OPS = {"atomic_add": NotifyOp.AtomicAdd, "set": NotifyOp.Set}
_COMM_CMPS = {"eq": int.__eq__, "ne": int.__ne__, "gt": int.__gt__, "ge": int.__ge__, "lt": int.__lt__,
              "le": int.__le__}
_CommCmp = {"eq": WaitCmp.Eq, "ge": WaitCmp.Ge}
_TESTS = {"Eq": int.__eq__, "Ge": int.__ge__, "Ne": int.__ne__, "Lt": int.__lt__, "Le": int.__le__,
          "Gt": int.__gt__}  # a wait's comparison (WaitCmp or _Cmp) by name: whether a cell's value satisfies it


class _Cmp(enum.Enum):
    """The comparisons of comm_wait / comm_test that pld.WaitCmp lacks, by the name their event record gives."""

    Ne = "ne"
    Gt = "gt"
    Lt = "lt"
    Le = "le"


_CommCmp.update({c.value: c for c in _Cmp})


class _Spmd:
    """``pl.spmd(n)``: iterate block indices, or as a ``with`` block run each kernel call n times."""

    def __init__(self, ctx: RankContext, n: int):
        self.ctx, self.n = ctx, n

    def __iter__(self):
        for b in range(self.n):
            self.ctx._block_idx = b
            yield Scalar(b, dt.INDEX)
        self.ctx._block_idx = 0

    def __enter__(self):
        self.ctx._spmd_blocks = self.n
        return self.ctx._tasks_started

    def __exit__(self, *exc):
        self.ctx._spmd_blocks = 0
        return False


def _tile(data: np.ndarray, dtype, valid) -> Tile:
    """``Tile(data, dtype, valid)`` for ``data`` already of ``dtype``'s numpy type (a copy of window memory):
    what the constructor would convert or check is already so, and the per-op cost is what matters here."""
    t = Tile.__new__(Tile)
    t.data, t.dtype, t.space = data, dtype, None
    t.valid_shape = tuple(valid) if valid is not None else data.shape
    return t


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


def _window_bytes(memory, buffer_id: int, rank: int):
    return memory.window_bytes(buffer_id, rank)


_MANUAL_DEP: dict = {}  # id(a kernel's params) -> (params, indices of its pl.ManualDep parameters)


def _tracked(fn: Function, args, kwargs) -> tuple:
    """The arguments of a call of kernel ``fn`` that its task's automatic dependencies follow: all of them but
    those whose parameter is annotated ``pl.ManualDep``."""
    params = fn.params
    entry = _MANUAL_DEP.get(id(params))
    if entry is None or entry[0] is not params:
        entry = _MANUAL_DEP[id(params)] = (params, [i for i, p in enumerate(params)
                                                    if getattr(p.ttype, "manual_dep", False)])
    if not entry[1]:
        return (*args, *kwargs.values())
    values = fn.bind_arguments(args, kwargs)
    return tuple(v for i, v in enumerate(values) if i not in entry[1])
