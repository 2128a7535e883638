"""The rank side of a group: a forked rank serves one command after another (``_serve``): it reads the
command from the frame, maps the memory it names, runs it (``rank.body.run_rank``) and reports into the
control mapping.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import pickle
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from ... import _atomics
from ...compiler.plan import DispatchPlan, split_segments
from ...errors import PtodistInternalError, RankFailure
from ...language import dtypes as dt
from ...rank import death
from ...rank.body import RankStopped, run_rank
from ...rank.context import CommandKept, RankContext
from ...rank.events import EventLog
from ...rank.status import DONE, FAILED, install_line_sampler
from .. import resources
from .memory import ShmMemory, WindowHeap
from .wire import (
    ABORTED,
    CMD_FAILED,
    FDS_PER_MESSAGE,
    FRAME_HEAD,
    IDLE_YIELD_S,
    OK,
    RESULT_BYTES,
    _PlanUnpickler,
    _Wire,
)

if TYPE_CHECKING:
    from .group import RankGroup

ABORT_POLL_S = 0.02        # a rank blocked in a wait notices an abort this often


class _GroupMemory(ShmMemory):
    """ShmMemory for a group's ranks: a wait also ends when the driver aborts the command."""

    def __init__(self, *args, abort_addr: int, state: _RankState, **kwargs):
        super().__init__(*args, **kwargs)
        self.abort_addr = abort_addr
        self.state = state

    _slice_s = ABORT_POLL_S

    def _between_slices(self) -> None:
        if _atomics.load(self.abort_addr) > self.state.command:
            self.state.stopping = True  # the abort signal, arriving now, must not stop the stop
            raise RankStopped()

    def cell_wait(self, buffer_id, offset, ge, expected, timeout_s):
        addr = self._at[buffer_id][self.rank] + offset
        value = _atomics.load(addr)
        if value >= expected if ge else value == expected:  # already there: no clock to read, no wait to set up
            return True, value
        end = time.monotonic() + timeout_s
        spin, yld = self.spin_s, self.yield_s
        while True:
            left = end - time.monotonic()
            ok, value = _atomics.wait(addr, self.sleepers_addr, int(ge), expected, spin, yld,
                                      max(min(ABORT_POLL_S, left), 0.0))
            if ok:
                return ok, value
            if _atomics.load(self.abort_addr) > self.state.command:
                self.state.stopping = True  # the abort signal, arriving now, must not stop the stop
                raise RankStopped()
            if left <= ABORT_POLL_S:
                return ok, value
            spin = yld = 0.0


class _RankState:
    """What a serving rank keeps between commands."""

    def __init__(self, group: RankGroup, rank: int, sock: socket.socket):
        self.group = group
        self.rank = rank
        self.sock = sock
        self.layout = group.layout
        self.maps: dict[int, tuple[mmap.mmap | None, np.ndarray]] = {t: (None, m) for t, m in group.inherited.items()}
        self.plans: dict[int, tuple] = {}
        self.functions: dict = {}
        self.command = -1
        self.running = False
        self.stopping = False  # a RankStopped was raised in this command (by the abort signal or a wait)
        self.dispatch = None  # (dispatch id, ctx, log, dfx) of the dispatch whose segments are running
        self.memories: dict = {}  # (plan id, heap) -> _GroupMemory, reused by later dispatches
        self.views: dict = {}     # host tensor descriptor -> its array, while its memory is mapped
        self.unmapping: list = []  # dropped mappings a view still held when they were dropped
        self.result = group.words("result")
        self.done = group.words("done")
        self.finished = group.addr(group.layout.finished)
        self.no_sleepers = group.addr(group.layout.zero)
        # The last command whose payload needed nothing mapped, dropped or decoded anew, with what
        # running it made (its memory and host views): the same payload again reuses them.
        self.last_payload: bytes | None = None
        self.last_command: _Wire | None = None
        self.last_bound: tuple | None = None  # (memory, hosts, CommandKept) of last_command
        self.next_ctx: RankContext | None = None  # a fresh context for last_command, made while idle
        self.checked_args: dict = {}  # kernel argument signatures that passed their checks (RankContext)


def _serve(group: RankGroup, rank: int, sock: socket.socket, parent: int) -> None:
    """Body of a long-lived rank: serve commands until killed; never returns."""
    try:
        _enter_rank(rank, group.world, group.device_ids[rank])
        _atomics.die_with_parent()
        if os.getppid() != parent:
            death.quiet_exit(1)
        death.arm(group.fault_fds[rank])  # os._exit and native crashes leave the rank's stack for the driver
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
        state = _RankState(group, rank, sock)

        def on_abort(signum, frame):
            # At most once a command: a second RankStopped would cut short the unwinding of the first
            # (the records a stopped rank closes on its way out).
            if state.running and not state.stopping and _atomics.load(group.addr(group.layout.abort)) > state.command:
                state.stopping = True
                raise RankStopped()

        signal.signal(signal.SIGUSR1, on_abort)
        install_line_sampler(group.status, rank)
        resources.one_blas_thread()
        resources.pin_rank(rank, group.world)
        _rank_started(rank)
        group.words("up")[rank] = 1
        _atomics.fetch_add(group.addr(group.layout.started), group.driver_sleepers, 1)
        doorbell = group.addr(group.layout.doorbell)
        while True:
            c = state.command + 1
            while not _atomics.wait(doorbell, group.rank_sleepers, 1, c + 1, group.ctl_spin_s, IDLE_YIELD_S, 1.0)[0]:
                if os.getppid() != parent:
                    death.quiet_exit(1)
            state.command = c
            number, command = _read_command(state)
            code, failure = _run_command(state, number, command)
            _report(state, code, failure)
            if group.once:  # a one-shot call's rank: nothing more will come; free the core at once
                death.quiet_exit(0)
            _prepare_next(state)
    except BaseException:  # noqa: BLE001 - a rank that cannot serve dies; the driver reports it
        death.quiet_exit(70)


def _rank_started(rank: int) -> None:
    """Called in a rank once it is set up, before it reports that it is up."""


def _read_command(state: _RankState) -> tuple[int, _Wire]:
    """The published command: its dispatch's number and the command, with its memory mapped and drops done."""
    group = state.group
    length = group.frame_length.value
    number = group.frame_number.value
    if length < 0:
        _, fds, _, _ = socket.recv_fds(state.sock, 16, 1)
        with mmap.mmap(fds[0], -length, prot=mmap.PROT_READ) as m:
            payload = m[:]
        os.close(fds[0])
    else:
        start = state.layout.frame + FRAME_HEAD
        payload = group._mm[start:start + length]
    if payload == state.last_payload:  # the same command as the last one: nothing new to map or to drop
        if state.unmapping:
            _unmap(state, [])
        return number, state.last_command
    command = _Wire(*pickle.loads(payload))
    last = state.last_command
    if last is not None and command[:-1] == last[:-1]:
        # The last command with other scalar arguments (a step counter): its memory and prepared context serve.
        if state.unmapping:
            _unmap(state, [])
        state.last_payload, state.last_command = payload, command
        return number, command
    state.last_payload = state.last_command = state.last_bound = state.next_ctx = None
    maps = command.maps
    fds: list[int] = []
    while len(fds) < len(maps):
        _, got, _, _ = socket.recv_fds(state.sock, 16, FDS_PER_MESSAGE)
        fds.extend(got)
    for (token, size), fd in zip(maps, fds):
        m = mmap.mmap(fd, size)
        os.close(fd)  # the mapping keeps the file alive
        state.maps[token] = (m, np.frombuffer(m, dtype=np.uint8))
    drops = command.drops
    if drops:  # memories over a dropped heap, and views of dropped memory, go too
        state.memories = {k: v for k, v in state.memories.items() if k[1] is None or k[1][0] not in drops}
        state.views = {k: v for k, v in state.views.items() if k[0] not in drops}
    gone = []
    for token in drops:
        entry = state.maps.pop(token, None)
        if entry is not None:
            gone.append(entry[0])
            del entry
    if gone or state.unmapping:
        _unmap(state, gone)
    if command.forget_plans:
        state.plans.clear()
        state.memories.clear()
    if not (maps or drops or command.forget_plans or command.blob is not None):
        state.last_payload, state.last_command = payload, command
    return number, command


def _unmap(state: _RankState, mappings: list) -> None:
    """Unmap dropped memory now, or, while a view still holds it, at a later command.

    Views are freed by reference counting as soon as the dispatch that used them is over (a rank
    context holds no reference cycle); a full garbage collection here would cost a torch-sized
    process hundreds of milliseconds per dispatch.
    """
    left = []
    for m in [*state.unmapping, *mappings]:
        try:
            m.close()
        except BufferError:
            left.append(m)
    state.unmapping = left


def _host_view(state: _RankState, desc) -> np.ndarray:
    token, offset, shape, strides, dtype_name, writable = desc
    dtype = dt.from_name(dtype_name).np_dtype
    if token < 0:  # an empty tensor: nothing was mapped
        a = np.zeros(shape, dtype=dtype)
    else:
        a = np.ndarray(shape, dtype=dtype, buffer=state.maps[token][1], offset=offset, strides=strides)
    if not writable:
        a.flags.writeable = False
    return a


def _run_command(state: _RankState, number: int, command: _Wire) -> tuple[int, RankFailure | None]:
    group, rank = state.group, state.rank
    plan_id = command.plan_id
    if command.blob is not None:
        plan, boundaries = _PlanUnpickler(io.BytesIO(command.blob), group.objects, state.functions).load()
        state.plans[plan_id] = (plan, split_segments(plan, boundaries))
    plan, segments = state.plans[plan_id]
    segment = command.segment
    status = group.status
    if segment == 0:
        state.dispatch = None
        status.clear_history(rank)
        ctx, state.next_ctx = state.next_ctx, None
        if command is state.last_command and state.last_bound is not None:
            memory, hosts, kept = state.last_bound
        else:
            memory, hosts = _bind(state, plan, command)
            kept = CommandKept()
            ctx = None
            if command is state.last_command:
                state.last_bound = (memory, hosts, kept)
        dfx = command.dfx
        log = None
        if dfx is not None:
            log = EventLog(rank, plan.device_ids[rank], dfx.dispatch, dump_args=dfx.dump_args)
            ctx = None
        if ctx is None:
            ctx = RankContext(plan, rank, memory, hosts, events=log, checked_args=state.checked_args, kept=kept)
        ctx.scalars = pickle.loads(command.scalars) if command.scalars else ()
        state.dispatch = (number, ctx, log, dfx)
    dispatch_id, ctx, log, dfx = state.dispatch
    if dispatch_id != number:
        raise PtodistInternalError("a later segment arrived for a dispatch this rank did not start")
    ctx.plan = segments[segment]
    status.set_running(rank, "")
    last = segment == len(segments) - 1
    state.running, state.stopping = True, False
    try:
        outcome = run_rank(ctx, log, dfx, last=last, dedicated=True)  # a rank process runs nothing else
    finally:
        state.running = False
    code = ABORTED if outcome.stopped else CMD_FAILED if outcome.failure is not None else OK
    if last or code != OK:
        state.dispatch = None
    return code, outcome.failure


def _prepare_next(state: _RankState) -> None:
    """While idle: make the context that the same command, sent again, will run in.

    A caller dispatching in a loop sends the same command again; a context is cheap state with
    no side effect when made, so making it here takes its cost off the next dispatch's path.
    """
    command = state.last_command
    if command is None or state.last_bound is None or command.segment != 0 or command.dfx is not None:
        return
    try:
        memory, hosts, kept = state.last_bound
        state.next_ctx = RankContext(state.plans[command.plan_id][0], state.rank, memory, hosts,
                                     checked_args=state.checked_args, kept=kept)
    except Exception:  # noqa: BLE001 - the command makes its context itself, as any other
        state.next_ctx = None


def _bind(state: _RankState, plan: DispatchPlan, command: _Wire) -> tuple[_GroupMemory, list]:
    """The memory (window heap) and the host tensor views of ``command``'s dispatch."""
    group, rank = state.group, state.rank
    key = (command.plan_id, command.heap)
    memory = state.memories.get(key)
    if memory is None:
        if command.heap is not None:
            token, stride, base = command.heap
            heap = WindowHeap.for_plan(state.maps[token][1], base, stride, plan)
        else:
            heap = WindowHeap(group.arena, 0, 0, [], [])
        memory = state.memories[key] = _GroupMemory(
            group.arena, state.layout, rank, group.world, heap, group.status,
            abort_addr=group.addr(group.layout.abort), state=state)
    hosts = []
    for d in command.hosts:
        if d is None:
            hosts.append(None)
            continue
        view = state.views.get(d)
        if view is None:
            view = state.views[d] = _host_view(state, d)
            if len(state.views) > 4096:  # descriptors of long-gone tensors: start afresh
                state.views = {d: view}
        hosts.append(view)
    return memory, hosts


def _report(state: _RankState, code: int, failure: RankFailure | None) -> None:
    group, rank = state.group, state.rank
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stdout must not stop the rank
        pass
    if failure is not None:
        payload = pickle.dumps(failure)
        if len(payload) > RESULT_BYTES - 8:
            failure.exception = None
            failure.traceback = failure.traceback[-(RESULT_BYTES // 4):]
            failure.message = failure.message[:RESULT_BYTES // 4]
            payload = pickle.dumps(failure)
        off = state.layout.results + rank * RESULT_BYTES
        group.arena[off + 8:off + 8 + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        ctypes.c_int64.from_address(group.base + off).value = len(payload)
    state.result[rank] = code
    state.done[rank] = state.command + 1
    group.status.finish(rank, DONE if code == OK else FAILED)
    # Only the last rank wakes the driver; a failure is seen at the driver's next periodic check.
    old = _atomics.fetch_add(state.finished, state.no_sleepers, 1)
    if old + 1 >= group.world * (state.command + 1):
        _atomics.fetch_add(state.finished, group.driver_sleepers, 0)


# -- a rank's environment and output (imported here, before the ranks fork) --------------------

from ...rank_output import enter_rank as _enter_rank  # noqa: E402 - RANK, WORLD_SIZE, ...; [rank r] lines
