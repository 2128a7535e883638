"""The engine of a DistributedWorker: accepting dispatches, the queue, and driving it on the rank group.

Whoever waits drives: ``result()`` (and ``done``) advance the queue in the caller's thread; on a
group of rank processes (shm) a background thread also does after the first ``submit()``, so
accepted dispatches run while the caller does other work.  A group whose ranks run in this
process (sim threads, this MPI process's rank) runs a command when the queue is driven, so there
a submitted dispatch runs when the caller asks for a result (or polls ``done``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

from ... import backends, dfx
from ...backends import resources
from ...backends.base import STOP_WRITE_S, died, note_where
from ...check.hang import carried_over
from ...compiler.plan import HostTensorRef
from ...compiler.state import stale_message, state_of
from ...config import RunConfig
from ...errors import (
    ConfigError,
    DispatchStateError,
    DispatchValueError,
    HangError,
    RankError,
    UsageError,
)
from ...language.scalar import Scalar
from ...language.types import Direction
from ...source import user_location
from ..program import note_dispatch
from . import early_reads
from .binding import Arena, LocalBinding, SharedBinding, _Bound
from .callbacks import call_callback, is_tensor_value
from .handles import RunHandle, StackedDeviceTensor
from .plans import Planner, _HostCall, _PlanEntry

DRIVE_SLICE_S = 0.05     # the background thread hands the engine back this often


@dataclass(eq=False)
class _Dispatch:
    handle: RunHandle
    compiled: object
    entry: _PlanEntry
    args: list
    values: list
    config: RunConfig
    dfx: object
    arena_key: int | None
    cursor: int = 0
    published: bool = False
    arena: Arena | None = None
    residents: set = field(default_factory=set)  # serials of the resident files it uses
    carried: int | None = None  # persistent windows not zeroed: the dispatch whose windows it starts from


_tls = threading.local()


class _Agreed(Exception):
    """A step's failure every process of an mpi job already agreed on: fail the dispatch with ``error``."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def in_callback():
    """The dispatch whose sub-worker callback this thread is running, or None."""
    return getattr(_tls, "callback", None)


class Engine:
    """Everything a worker owns, and the engine that runs its queue (no reference to the facade)."""

    def __init__(self, programs: list, config: RunConfig, persistent: bool, reset: bool, callbacks: dict, group,
                 backend: str):
        self.backend = backend
        self.job = backends.capabilities(backend).job  # the processes that each run every dispatch (DFX's folder)
        self.programs = programs
        self.config = config
        self.device_ids = list(programs[0].device_ids)
        self.world = len(self.device_ids)
        self.persistent = persistent
        self.reset = reset
        # Where the worker was prepared, and per arena the last dispatch that ran on it: a hang of a dispatch
        # whose persistent windows kept the last one's counters names the prepare() option that keeps them.
        self.prepared_at = str(user_location(1) or "") if persistent and not reset else ""
        self.last_on_arena: dict = {}
        self.callbacks = callbacks
        self.group = group
        self.binding = LocalBinding(group, self) if group.in_process else SharedBinding(group, self)
        encode = None if group.in_process else (lambda plan, bounds: group.encode_plan((plan, bounds)))
        self.planner = Planner(callbacks, persistent, encode or (lambda plan, bounds: None))
        self.state = threading.RLock()
        self.engine = threading.Lock()
        self.wakeup = threading.Condition(self.state)
        self.queue: deque[_Dispatch] = deque()
        self.watch = None
        self.watching: _Dispatch | None = None
        self.broken: str | None = None
        self.closing = False
        self.closed = False
        self.dispatches = 0
        self.arenas: dict = {}       # 0 (shared by every program), or a program's index when persistent
        self.residents: dict = {}    # serial -> DeviceTensor / StackedDeviceTensor
        self.thread: threading.Thread | None = None
        self.waiters = 0             # callers driving the queue themselves (in result())
        self.last_bound: dict = {}   # program index -> _Bound of its last dispatch
        # An mpi job's processes each drive a copy of the worker: a step that runs in each process on its
        # own (binding, planning, a callback) ends with the processes agreeing on whether it failed anywhere.
        self.agreement = getattr(group, "agree", None)
        self.interrupt: BaseException | None = None  # a callback's KeyboardInterrupt, raised by the driver
        # What the programs' code reads, as the ranks were started with it: a dispatch runs only while the
        # driver's state is the same (compiler.state).
        self.program_state = state_of([f for c in programs for f in (c.host, *c.extra_functions)])
        self.started_with = self.program_state.stamp()

    def check_resident(self, t, where: str) -> None:
        if t._core is not self:
            raise DispatchValueError(f"{where}: {t.describe()} belongs to another DistributedWorker; a resident tensor "
                                     "lives in the ranks of the worker that allocated it. Allocate it on this "
                                     "worker, or move the data through the host (copy_from on the other, copy_to "
                                     "here).")
        if t.freed:
            raise DispatchValueError(f"{where}: {t.describe()} was freed (free_tensor / free_stacked_tensor); "
                                     "allocate a new one with alloc_tensor / alloc_stacked_tensor.")


    def accept(self, worker, index: int, compiled, args: tuple, config: RunConfig | None,
               call: str) -> RunHandle:
        """Bind and plan a dispatch of ``compiled`` and queue it; raise what stops it.

        In an mpi job every process binds and plans on its own: the processes agree on whether that
        succeeded everywhere before any of them queues the dispatch, so all queue it or all raise.
        """
        error = None
        try:
            d = self._prepare(worker, index, compiled, args, config)
        except BaseException as e:  # noqa: BLE001 - raised once the processes agree on it
            error = e
        error = self._agree(error, "accept", f"this dispatch of '{compiled.name}' (it is not accepted)")
        if error is not None:
            raise error
        session = getattr(getattr(self.group, "backend", None), "session", None)
        if session is not None:  # under `ptodist check`: host lines touching its outputs before result()
            loc = user_location(2)
            early_reads.dispatched(d.args, str(loc) if loc else "")
            if call == "submit()":
                early_reads.watch(session, d.handle, compiled, d.args)
        with self.state:
            d.handle.number = self.dispatches
            self.dispatches += 1
            k = compiled.dispatch_number()
            if d.dfx is not None:
                d.dfx = replace(d.dfx, dispatch=k)
            self.queue.append(d)
        return d.handle

    def _prepare(self, worker, index: int, compiled, args: tuple, config: RunConfig | None) -> _Dispatch:
        """Bind ``args`` and plan the dispatch: all of accepting it that can fail (numbers are taken after)."""
        self.check_ranks()
        self.check_state(compiled)  # before planning: a plan made under other values would be kept
        cfg = config or self.config
        if config is not None:
            if config.distributed_config is not None and list(config.distributed_config.device_ids) != \
                    self.device_ids:
                raise DispatchValueError(f"{compiled.name}: called with device_ids "
                                         f"{config.distributed_config.device_ids} but the worker runs on "
                                         f"{self.device_ids}; prepare another worker for other devices")
            name = backends.name_for(config)
            if name != self.backend:
                raise ConfigError(f"{compiled.name}: this dispatch's config selects the '{name}' backend, but the "
                                  f"worker's ranks run on '{self.backend}'; a worker keeps the backend it was "
                                  "prepared on. Prepare another worker with that config.")
        with self.state:  # binding registers memory the engine thread also reads
            last = self.last_bound.get(index) if config is None else None
            if last is not None and last.matches(args, self.binding):
                values, hosts, entry = last.values, last.hosts, last.entry  # the same arguments as last time
            else:
                note_dispatch(compiled, self.backend)
                values, hosts, created = compiled.bind(args, adapt=lambda v, n: self.binding.adapt(v, n, compiled),
                                                       new_output=self.binding.new_output)
                entry = self.planner.plan_for(index, compiled, values, hosts)
                self.planner.check_args(compiled, entry, hosts)
                last = self.last_bound[index] = _Bound.of(args, values, hosts, entry) if not created else None
            residents = last.residents if last is not None else None
            if residents is None:
                residents = {h.resident._file.serial for h in hosts if h is not None and h.resident is not None}
                if last is not None:
                    last.residents = residents
            arena_key = None
            if entry.heap:
                arena_key = index if self.persistent else 0
                if self.persistent:
                    self.planner.check_layout(index, compiled, entry)
            on = cfg.with_dfx_setting()  # what PTODIST_DFX (ptodist run --dfx) adds to the config's own outputs
            request = dfx.request_for(on, lambda: compiled.output_dir, -1, job=self.job) \
                if on.enable_chip_swimlane or on.enable_dep_gen or on.enable_scope_stats else None
            if any(t.index >= len(hosts) for t in entry.plan.host_tensors):
                # pl.create_tensor in the host: fresh zeroed intermediates, after every parameter (scalars too)
                hosts = hosts + self._intermediates(compiled, entry, len(hosts))
            handle = RunHandle(worker, compiled.name, -1)
            return _Dispatch(handle, compiled, entry, hosts, values, cfg, request, arena_key, residents=residents)

    def _intermediates(self, compiled, entry, first: int) -> list:
        """The host intermediates of a dispatch (``pl.create_tensor`` in the host): zeroed, bound like arguments."""
        out = []
        for spec in sorted(entry.plan.host_tensors, key=lambda t: t.index):
            if spec.index >= first:
                value = self.binding.new_intermediate(spec.shape, spec.dtype)
                out.append(self.binding.adapt(value, spec.name, compiled))
        return out

    def check_ranks(self) -> None:
        """With nothing in flight: raise RankError when a rank died while the worker was idle."""
        dead = self.group.reap() if not self.queue else []
        if dead:
            self.group.kill()
            notes = self.group.death_notes
            self.broken = (f"rank {dead[0].rank} (device {dead[0].device_id}) died while the worker was idle "
                           f"({notes[dead[0].rank]})")
            for f in dead:
                f.task = None  # its status row still names the last task of an earlier dispatch
                f.message = (died(notes[f.rank], ", while the worker was idle between dispatches")
                             + "; the worker stopped its other ranks. Close it and prepare a new one.")
            raise RankError(dead)

    def stale(self) -> list[str]:
        """What of the Python state the programs read is no longer what the ranks were started with."""
        state = self.program_state
        if state.unchanged(self.started_with):  # the quick check, every dispatch
            return []
        now = state.stamp()
        changed = self.started_with.changed(now)
        if not changed:  # values rebound to equal ones: the ranks hold equal values; check against these now
            self.started_with = now
        return changed

    def check_state(self, compiled) -> None:
        """Raise DispatchStateError when the Python state the programs read is no longer what the ranks
        were started with."""
        changed = self.stale()
        if changed:
            raise DispatchStateError(stale_message(self.program_state, changed, compiled.name))

    def _agree(self, error: BaseException | None, step: str, what: str) -> BaseException | None:
        """The error ``step`` fails ``what`` with in this process: its own, or (mpi) another process's."""
        return error if self.agreement is None else self.agreement(error, step, what)

    def check_usable(self, call: str) -> None:
        """Raise UsageError when the worker is closed or broken, or ``call`` is refused in a callback."""
        if self.closed or self.closing:
            raise UsageError(f"DistributedWorker.{call}: called after close(): the worker is closed. Prepare a new "
                             "one with compiled.prepare().")
        if in_callback() is not None and call.startswith(("run", "submit", "__call__", "close")):
            raise UsageError(f"DistributedWorker.{call}: called from inside a sub-worker callback, which runs "
                             "while its own dispatch is in progress; dispatch after result() returns instead.")
        if self.broken is not None and call.startswith(("run", "submit", "__call__")):
            raise UsageError(f"DistributedWorker.{call}: the worker cannot run more dispatches: {self.broken}. "
                             "Close it and prepare a new one.")

    # -- driving ----------------------------------------------------------------------------------
    def _try_step(self, until: RunHandle | None, deadline: float | None) -> bool:
        """Advance the queue one step unless another thread is driving it; return whether this one did."""
        if not self.engine.acquire(blocking=False):
            return False
        try:
            self._step(until, deadline)
        finally:
            self.engine.release()
        return True

    def drive(self, until: RunHandle, deadline: float | None) -> None:
        """Advance the queue until ``until`` has finished or ``deadline`` passes."""
        if in_callback() is not None:
            raise UsageError("RunHandle.result(): called from inside a sub-worker callback, whose own dispatch "
                             "cannot finish until the callback returns; wait after the dispatch instead.")
        with self.state:
            self.waiters += 1  # the background thread stays out of the way of a caller that drives itself
        try:
            while not until._finished:
                if not self._try_step(until, deadline):
                    wait = 0.002 if deadline is None else max(min(0.002, deadline - time.monotonic()), 0.0)
                    until._wait(wait)
                if deadline is not None and time.monotonic() >= deadline:
                    return
        finally:
            with self.state:
                self.waiters -= 1
                self._nudge_thread()

    def poke(self, watch: bool = True) -> None:
        """Advance the queue without waiting: publish what can be; with ``watch``, also look at the ranks."""
        if in_callback() is None and self.engine.acquire(blocking=False):
            try:
                self._step(None, time.monotonic(), watch)
            finally:
                self.engine.release()

    def _step(self, until: RunHandle | None, deadline: float | None, watch: bool = True) -> None:
        """Run the queue (engine held): publish, watch, run callbacks, complete handles.

        Anything that escapes (Ctrl-C, or a bug) may leave a command without its watch, so
        the worker stops its ranks, as a one-shot run does, and fails what it had accepted.
        """
        try:
            if watch:
                self._advance(until, deadline)
            else:
                self._kick()
        except BaseException as e:
            why = "interrupted (KeyboardInterrupt)" if isinstance(e, KeyboardInterrupt) else \
                f"its driver failed ({type(e).__name__}: {e})"
            self._stop_command(e)
            self._abandon(why)
            raise
        interrupt, self.interrupt = self.interrupt, None
        if interrupt is not None and threading.current_thread() is not self.thread:
            raise interrupt  # its dispatch failed with it; no command was running, so nothing else is affected

    def _stop_command(self, error: BaseException) -> None:
        """Stop the command in flight, letting ranks with an event log write it; merge what they wrote."""
        watch, d = self.watch, self.watching
        if watch is None:
            return
        try:
            note_where(error, watch.interrupt(STOP_WRITE_S if d.dfx is not None else 0.0))
            if d.dfx is not None and not self.group.finishes_dfx:
                dfx.finish_run(d.dfx, self.world, self.device_ids, error=error)
        except Exception:  # noqa: BLE001 - best effort: the interruption is the error to report
            pass

    def _abandon(self, why: str) -> None:
        self.broken = self.broken or why
        self.group.kill()
        self.watch = self.watching = None
        with self.state:
            for d in list(self.queue):
                d.handle._complete(None, UsageError(f"dispatch {d.handle.number} of '{d.compiled.name}' did not "
                                                    f"finish: the worker stopped, {why}. Close it and prepare "
                                                    "a new one."))
            self.queue.clear()
            self.wakeup.notify_all()

    def _advance(self, until: RunHandle | None, deadline: float | None) -> None:
        while True:
            self._kick()
            if self.watch is None or (until is not None and until._finished) or self.interrupt is not None:
                return
            left = DRIVE_SLICE_S if deadline is None else deadline - time.monotonic()
            over = self.watch.poll(max(min(left, DRIVE_SLICE_S), 0.0))
            if over:
                self._command_over()
            elif deadline is not None and time.monotonic() >= deadline:
                return
            elif until is None:
                return  # the background thread: hand the engine back now and then

    def _kick(self) -> None:
        """Publish the head dispatch's next segment, running callbacks and completing handles on the way."""
        while self.watch is None:
            with self.state:
                if not self.queue:
                    return
                d = self.queue[0]
            if self.broken is not None:
                self._fail(d, UsageError(f"dispatch {d.handle.number} of '{d.compiled.name}' did not run: "
                                         f"{self.broken}. Close the worker and prepare a new one."))
                continue
            if d.cursor == len(d.entry.steps):
                self._finish(d)
                continue
            kind, what = d.entry.steps[d.cursor]
            if kind == "call":
                self._callback(d, what)
                if self.interrupt is not None:
                    return  # the driver raises it now
                continue
            try:
                self._publish(d, what)
            except _Agreed as e:
                self._fail(d, e.error)
            except Exception as e:  # noqa: BLE001 - a dispatch that cannot be published fails alone
                # In an mpi job, where it failed in this process alone, the others went on to agree on the new
                # window arena, or (publishing done) on the segment's plan: this one joins them with its error.
                step = "windows" if self._needs_arena(d) else "segment"
                self._fail(d, self._agree(e, step, f"dispatch {d.handle.number} of '{d.compiled.name}'"))

    def _publish(self, d: _Dispatch, segment: int) -> None:
        self.check_state(d.compiled)  # again for each segment: the caller or a callback may have changed it
        with self.state:
            if d.arena_key is not None:
                d.arena = self._arena_for(d, first=not d.published)
            command = self.binding.command(d, segment)
            try:
                watch = self.group.submit(command)
            except BaseException as e:
                # Some ranks may hold part of the command: they cannot be trusted with the next one.
                self._abandon(f"a command could not be sent to the ranks ({type(e).__name__}: {e})")
                raise
            self.binding.sent(command)
            self.watch, self.watching = watch, d
            d.published = True

    def _needs_arena(self, d: _Dispatch) -> bool:
        """Whether publishing ``d``'s first segment makes a new window arena (none yet, or one too small)."""
        if d.arena_key is None or d.published:
            return False
        arena = self.arenas.get(d.arena_key)
        return arena is None or arena.stride < d.entry.heap

    def _arena_for(self, d: _Dispatch, first: bool) -> Arena:
        """The window heap for ``d``, zeroed as its first segment needs (later segments keep it)."""
        heap = d.entry.heap
        arena = self.arenas.get(d.arena_key)
        if not first:
            return arena
        if self._needs_arena(d):
            error = None
            try:
                resources.check_windows(d.compiled.name, d.entry.plan.windows, self.world)
            except Exception as e:  # noqa: BLE001 - raised once the processes agree on it
                error = e
            # In an mpi job a new arena is a collective allocation: every process makes it, or none.
            error = self._agree(error, "windows", f"dispatch {d.handle.number} of '{d.compiled.name}'")
            if error is not None:
                raise _Agreed(error)
            old = arena
            stride = heap if self.persistent else max(heap, 2 * arena.stride if arena else heap)
            arena = self.arenas[d.arena_key] = self.binding.new_arena(stride)
            if old is not None:  # too small: the ranks drop it with this command
                if self.persistent and old.used:
                    # The program's windows keep their layout; the heap grew by the host's chip-task order
                    # signal (a plan with edges after one without): the windows keep their bytes.
                    arena.rows[:, :old.stride] = old.rows
                    arena.used = True
                self.binding.drop_arena(old)
        if self.persistent:
            if arena.used and self.reset:
                arena.rows[:] = 0
            elif arena.used:
                d.carried = self.last_on_arena.get(d.arena_key)
            self.last_on_arena[d.arena_key] = d.handle.number
        else:
            arena.rows[:, :heap] = 0  # windows start zeroed in every dispatch; only the part this plan uses
        order = d.entry.plan.order_signal
        if order is not None:  # its tokens start at zero, whatever a failed dispatch before left in kept windows
            arena.rows[:, order.offset:order.offset + order.nbytes] = 0
        arena.used = True
        return arena

    def _command_over(self) -> None:
        watch, d = self.watch, self.watching
        self.watch = self.watching = None
        if watch.broken is not None:
            self.broken = watch.broken
        if isinstance(watch.error, RankError) and any(f.state_changed for f in watch.error.failures):
            # The ranks' state is no longer the driver's (in rank processes, silently so): nothing more runs.
            self.broken = self.broken or (f"the code of dispatch {d.handle.number} changed Python state the "
                                          "program reads (see that dispatch's error)")
        if watch.error is not None:
            error = watch.error
            if d.carried is not None and isinstance(error, HangError):
                error = carried_over(error, self.prepared_at, d.handle.number, d.carried)
            self._fail(d, error)
            return
        d.cursor += 1

    def _callback(self, d: _Dispatch, call: _HostCall) -> None:
        """Run a sub-worker callback; whatever it raises fails its dispatch (``result()`` raises it).

        SystemExit too: it ends the script where ``result()`` raises it, as the callback meant, whichever
        thread ran the callback.  A KeyboardInterrupt (Ctrl-C) also leaves the call that drives the queue
        (``_step``), so that it is not held until some ``result()``.  Nothing else is affected: no command
        runs during a callback, and the worker stays usable.  In an mpi job every process runs the
        callback, and the processes agree on whether it failed anywhere before going on.
        """
        error = None
        _tls.callback = d
        try:
            fn = self.callbacks.get(call.function.name)
            args = [self._callback_arg(d, a) for a in call.args]
            if fn is not None:
                names = [p.name for p in call.function.params]
                tensors = [isinstance(a, HostTensorRef) or is_tensor_value(v) for a, v in zip(call.args, args)]
                call_callback(fn, call.function.name, names, args, tensors)
            else:
                call.function.invoke(*args)
        except BaseException as e:  # noqa: BLE001 - the dispatch fails with the callback's error
            e.add_note(f"raised by sub-worker callback '{call.function.name}' (called at {call.location}) in "
                       f"dispatch {d.handle.number} of '{d.compiled.name}'")
            error = e
        finally:
            _tls.callback = None
        error = self._agree(error, "callback", f"dispatch {d.handle.number} of '{d.compiled.name}'")
        if error is None:
            d.cursor += 1
            return
        self._fail(d, error)
        if isinstance(error, KeyboardInterrupt):
            self.interrupt = error

    @staticmethod
    def _callback_arg(d: _Dispatch, a):
        if isinstance(a, HostTensorRef):
            value = d.args[a.tensor.index].value
            if isinstance(value, StackedDeviceTensor):
                return value[a.index[0]] if a.index else value
            return value[a.index] if a.index else value
        if isinstance(a, Scalar):
            return a.value
        return a

    def _finish(self, d: _Dispatch) -> None:
        error = None
        if d.dfx is not None and not self.group.finishes_dfx:
            try:
                dfx.finish_run(d.dfx, self.world, self.device_ids)
            except Exception as e:  # noqa: BLE001 - the dispatch fails with the merge's error
                error = e
        if error is not None:
            self._complete(d, None, error)
            return
        outs = [a.value for p, a in zip(d.compiled.host.params, d.args) if a is not None and
                p.direction is not Direction.IN]
        value = None if not outs else outs[0] if len(outs) == 1 else tuple(outs)
        self._complete(d, value, None)

    def _fail(self, d: _Dispatch, error: BaseException) -> None:
        if d.dfx is not None and d.published and not self.group.finishes_dfx:
            try:
                dfx.finish_run(d.dfx, self.world, self.device_ids, error=error)
            except Exception:  # noqa: BLE001 - the dispatch's own error is the one to report
                pass
        self._complete(d, None, error)

    def _complete(self, d: _Dispatch, value, error) -> None:
        with self.state:
            if self.queue and self.queue[0] is d:
                self.queue.popleft()
            d.handle._complete(value, error)
            early_reads.finished(d.handle, error)
            self._nudge_thread()

    # -- the background thread ---------------------------------------------------------------------
    def _nudge_thread(self) -> None:
        """Wake the background thread when there is work it may take (``state`` held).

        Only then: a thread woken for nothing takes the GIL from the caller's, a cost on every dispatch of
        a caller that drives its own dispatches (``rt(x)`` after a ``submit``).
        """
        if self.thread is not None and self.queue and not self.waiters:
            self.wakeup.notify_all()

    def start_thread(self) -> None:
        if self.group.in_process:
            return  # its commands run in the thread that drives them: the caller's, when it waits
        with self.state:
            if self.thread is None and not self.closed:
                self.thread = threading.Thread(target=self._run_thread, name="ptodist-worker", daemon=True)
                self.thread.start()
            self.wakeup.notify_all()

    def _run_thread(self) -> None:
        try:
            self._thread_loop()
        except BaseException:  # noqa: BLE001 - _step has failed every handle already; nothing to report to
            pass

    def _thread_loop(self) -> None:
        while True:
            with self.state:
                while (not self.queue or self.waiters) and not self.closing and not self.closed:
                    self.wakeup.wait()
                if self.closed or (self.closing and not self.queue):
                    return
            if not self._try_step(None, None):
                with self.state:
                    self.wakeup.wait(0.005)

    # -- waiting for resident tensors to be unused ------------------------------------------------
    def wait_unused(self, t) -> None:
        """Wait for the accepted dispatches that use resident tensor ``t`` (none inside a callback)."""
        if t._file is None or in_callback() is not None:
            return
        serial = t._file.serial
        while True:
            with self.state:
                users = [d for d in self.queue if serial in d.residents]
            if not users:
                return
            self.drive(users[-1].handle, None)

    # -- closing ----------------------------------------------------------------------------------
    def drain(self) -> None:
        while True:
            with self.state:
                if not self.queue:
                    return
                last = self.queue[-1].handle
            self.drive(last, None)

    def release(self) -> None:
        """Stop the ranks and free everything (no draining); safe to call again."""
        with self.state:
            if self.closed:
                return
            self.closed = True
            self.wakeup.notify_all()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        try:
            for arena in self.arenas.values():
                self.binding.drop_arena(arena)
            self.arenas.clear()
        finally:
            self.group.close()
        with self.state:
            for d in list(self.queue):
                d.handle._complete(None, UsageError(f"dispatch {d.handle.number} of '{d.compiled.name}' did "
                                                    "not run: the worker was closed"))
            self.queue.clear()
            self.binding.release()
            for t in self.residents.values():
                if t._file is not None:
                    t._file.close()
                    t._file = None
            self.residents.clear()

