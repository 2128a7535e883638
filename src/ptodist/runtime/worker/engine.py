"""The engine of a DistributedWorker: the queue of accepted dispatches, and driving it on the rank group.

Whoever waits drives: ``result()`` (and ``done``) advance the queue in the caller's thread; on a
group of rank processes (shm) a background thread also does after the first ``submit()``, so
accepted dispatches run while the caller does other work.  A group whose ranks run in this
process (sim threads, this MPI process's rank) runs a command when the queue is driven, so there
a submitted dispatch runs when the caller asks for a result (or polls ``done``).

A dispatch is made in ``intake.py`` (checked, bound, planned), finds its windows in ``arenas.py``, and
runs its sub-worker callbacks through ``callbacks.py``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace

from ... import backends, dfx
from ...backends.base import STOP_WRITE_S, note_where
from ...check.hang import carried_over
from ...config import RunConfig
from ...errors import DispatchValueError, HangError, RankError, UsageError
from ...language.types import Direction
from ...source import user_location
from . import early_reads
from .arenas import Arenas, _Agreed
from .binding import LocalBinding, SharedBinding
from .callbacks import in_callback, run_callback
from .handles import RunHandle
from .intake import Intake, _Dispatch
from .plans import _HostCall

DRIVE_SLICE_S = 0.05     # the background thread hands the engine back this often


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
        # Where the worker was prepared: a hang of a dispatch whose persistent windows kept the last one's
        # counters names the prepare() option that keeps them.
        self.prepared_at = str(user_location(1) or "") if persistent and not reset else ""
        self.callbacks = callbacks
        self.group = group
        self.binding = LocalBinding(group, self) if group.in_process else SharedBinding(group, self)
        self.intake = Intake(self, programs, callbacks, persistent, group)
        self.arenas = Arenas(self.binding, self.world, persistent, reset, self._agree)
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
        self.residents: dict = {}    # serial -> DeviceTensor / StackedDeviceTensor
        self.thread: threading.Thread | None = None
        self.waiters = 0             # callers driving the queue themselves (in result())
        # An mpi job's processes each drive a copy of the worker: a step that runs in each process on its
        # own (binding, planning, a callback) ends with the processes agreeing on whether it failed anywhere.
        self.agreement = getattr(group, "agree", None)
        self.interrupt: BaseException | None = None  # a callback's KeyboardInterrupt, raised by the driver

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
            d = self.intake.prepare(worker, index, compiled, args, config)
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
                step = "windows" if self.arenas.needs_new(d) else "segment"
                self._fail(d, self._agree(e, step, f"dispatch {d.handle.number} of '{d.compiled.name}'"))

    def _publish(self, d: _Dispatch, segment: int) -> None:
        self.intake.check_state(d.compiled)  # again for each segment: the caller or a callback may have changed it
        with self.state:
            if d.arena_key is not None:
                d.arena = self.arenas.arena_for(d, first=not d.published)
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

    def _command_over(self) -> None:
        watch, d = self.watch, self.watching
        self.watch = self.watching = None
        self.binding.returned()
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
        error = run_callback(d, call, self.callbacks)
        error = self._agree(error, "callback", f"dispatch {d.handle.number} of '{d.compiled.name}'")
        if error is None:
            d.cursor += 1
            return
        self._fail(d, error)
        if isinstance(error, KeyboardInterrupt):
            self.interrupt = error

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
            self.arenas.drop_all()
        finally:
            self.group.close()
        with self.state:
            for d in list(self.queue):
                d.handle._complete(None, UsageError(f"dispatch {d.handle.number} of '{d.compiled.name}' did "
                                                    "not run: the worker was closed"))
            self.queue.clear()
            self.intake.last_bound.clear()  # the last arguments: the caller's memory, no longer the worker's to hold
            self.binding.release()
            for t in self.residents.values():
                if t._file is not None:
                    t._file.close()
                    t._file = None
            self.residents.clear()

