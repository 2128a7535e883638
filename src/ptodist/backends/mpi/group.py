"""The mpi backend and a DistributedWorker's group: process r runs rank r's part of every command."""

from __future__ import annotations

import sys

from ...compiler.plan import DispatchPlan, split_segments
from ...config import started_by_mpi_launcher
from ...errors import ConfigError
from ...rank_output import report_once
from ..base import Command, HostView, RunsNow
from .agree import _agree_on_plan, _exchange, _leave_job, _no_launcher
from .layout import ALIGN, CTL_BYTES
from .memory import _Arena
from .run import _MpiRun
from .session import _get_session, _has_session, _mpi4py, _Session, load_mpi
from .wire import _sync_host_tensors


class MpiBackend:
    """Runs a plan with one MPI process per rank (start the program with ``mpirun -n P``)."""

    name = "mpi"

    def __init__(self):
        _mpi4py()

    def run(self, plan: DispatchPlan, host_arrays: list, config, dfx=None, *, scalars: tuple = ()) -> None:
        if not _has_session() and plan.world != 1 and not started_by_mpi_launcher():
            # Refused before MPI starts: a process that starts MPI without a launcher gets a helper daemon.
            raise _no_launcher(plan.program, plan.device_ids)
        # A group used once: its window heap is allocated for this call (no arena).
        hosts = [HostView(a.shape, "", True, array=a) if a is not None else None for a in host_arrays]
        command = Command(0, 0, plan, [], 0, hosts, None, dfx, config.resolved_hang_timeout(), scalars=scalars)
        MpiGroup(_get_session(load_mpi()), list(plan.device_ids)).execute(command, host_arrays)

    def start(self, device_ids: list, objects: dict | None = None, startup_timeout_s: float = 0.0) -> MpiGroup:
        """This process's rank of a DistributedWorker: every process of the job prepares the same worker."""
        if not _has_session() and len(device_ids) != 1 and not started_by_mpi_launcher():
            raise _no_launcher("DistributedWorker", device_ids)
        session = _get_session(load_mpi())
        if session.size != len(device_ids):
            raise ConfigError(
                f"DistributedWorker: the worker has {len(device_ids)} ranks (device_ids {list(device_ids)}) but this "
                f"MPI job has {session.size} process{'es' if session.size != 1 else ''}, and each MPI process runs "
                f"one rank. Start it with `mpirun -n {len(device_ids)} ...`.")
        return MpiGroup(session, list(device_ids), keep_windows=True)


class MpiGroup:
    """A DistributedWorker's ranks on mpi: process r runs rank r's part of every command, in its own thread.

    Every process of the job drives its own copy of the worker, so the processes must take every step
    together: ``agree`` exchanges whether a step that runs in each process alone (binding, planning, a
    sub-worker callback) failed, and a process that cannot keep step ends the job (``kill``).
    """

    in_process = True      # the rank sees this process's memory: host tensors are used in place
    finishes_dfx = True    # the run merges the ranks' DFX files itself (one process per output directory)

    def __init__(self, session: _Session, device_ids: list, keep_windows: bool = False):
        self.session = session
        self.device_ids = device_ids
        self.world = len(device_ids)
        self.death_notes: dict = {}
        self.kept: dict = {}   # what a dispatch's rank keeps between its segments (context, event log)
        # A worker's windows that every command needs, allocated at its first and kept to its close: the control
        # window, and the heap of a plan without windows (allocating an MPI window is a collective call that
        # costs more than the rest of a small dispatch).
        self.keep_windows = keep_windows
        self.control = None
        self.no_heap: _Arena | None = None

    def new_arena(self, stride: int) -> _Arena:
        return _Arena(self.session, stride)

    def submit(self, command) -> RunsNow:
        return RunsNow(lambda: self.execute(command))

    def agree(self, error: BaseException | None, step: str, what: str) -> BaseException | None:
        """Every process at ``step``: exchange whether it failed here; return the error this process fails
        ``what`` with (None: it succeeded in every process).  See ``_exchange``."""
        error = _exchange(self.session, self.device_ids, step, what, error)[0]
        return report_once(error, self.session.rank) if error is not None else None

    def execute(self, command: Command, arrays: list | None = None) -> None:
        """Run one command in this process's rank (every process of the job runs it alike).

        ``arrays``: the host arrays, when the caller keeps the list (a one-shot call: a read-only input
        the job replaced by process 0's values must reach the ranks through it).  Every error it raises,
        every process raises; a process that cannot finish the command's steps with the others (an
        exception none of them agreed on) ends the job, since they would wait for it for ever.
        """
        plan = split_segments(command.plan, command.boundaries)[command.segment] if command.boundaries \
            else command.plan
        if command.segment == 0 or self.kept.get("number") != command.number:
            self.kept = {"number": command.number}
        what = f"this call of '{plan.program}'" if arrays is not None else \
            f"dispatch {command.number} of '{plan.program}'"
        if arrays is None:
            arrays = [h.array if h is not None else None for h in command.hosts]
        try:
            error = _agree_on_plan(self.session, plan, what, command.scalars)
            if error is None:
                _sync_host_tensors(self.session, arrays)
                arena, control = command.heap, None
                if self.keep_windows:
                    control = self._control()
                    if arena is None and not plan.window_heap_bytes:
                        arena = self.no_heap = self.no_heap or _Arena(self.session, ALIGN)
                error = _MpiRun(self.session, plan, arrays, command.hang_timeout, command.dfx, arena=arena,
                                kept=self.kept, last=command.last, what=what, scalars=command.scalars,
                                control=control).run()
        except BaseException as e:  # noqa: BLE001 - this process alone: the others wait in the next step
            self.kept = {}
            _leave_job(self.session, plan.device_ids, e, f"running {what}")
            raise
        if error is not None or command.last:
            self.kept = {}
        if error is not None:
            report_once(error, self.session.rank)  # every process raises it: process 0 prints its report
            raise error

    def reap(self) -> list:
        return []  # a process that dies ends the MPI job

    def kill(self) -> None:
        """The worker's driver stopped in this process alone, in the middle of a dispatch (an exception
        escaped it, e.g. Ctrl-C): the other processes would wait for this one in the dispatch's next step
        for ever, so the job ends."""
        self.kept = {}
        if self.session.size > 1:
            # Called while the worker handles the exception that stopped it: name it in the report.
            _leave_job(self.session, self.device_ids, sys.exc_info()[1], "driving its DistributedWorker")

    def _control(self):
        """The kept control window; None where MPI cannot allocate it (the run then tries, and reports why not)."""
        if self.control is None:
            MPI = self.session.MPI
            try:
                self.control = MPI.Win.Allocate(CTL_BYTES, 1, comm=self.session.comm)
            except MPI.Exception:
                return None
        return self.control

    def close(self) -> None:
        """Free the kept windows: collective, every process of the job closes its worker alike."""
        self.kept = {}
        if self.no_heap is not None:
            self.no_heap.close()
            self.no_heap = None
        if self.control is not None:
            self.control.Free()
            self.control = None

