"""The ``mpi`` backend: one MPI process per rank, windows as MPI-3 RMA windows.

``mpirun -n P python SCRIPT`` starts P copies of the program.  Every copy runs
the host orchestrator, so every process plans the same dispatch; process r of
``MPI_COMM_WORLD`` then runs rank r's tasks, and only those.

Two MPI windows per run, allocated collectively over the world and zeroed:

    heap      the window heap: every window buffer at its plan offset
    control   abort word | accumulate lock | hang claim | arrived | result length |
              who ends the job, and the ranks it found vanished |
              this rank's status board (state, the wait it is blocked in, the
              notifies it sent, the line it runs when it stalls) | its pickled
              result (read when the job is aborted)

Every process holds a passive-target epoch on both windows (``Lock_all``) for
the whole run.  Signal cells are touched only by MPI atomics (``Fetch_and_op``
with SUM, REPLACE or NO_OP), so they are atomic with respect to each other on
any transport.  A peer's window data moves with ``Get`` and ``Put``
(``Accumulate`` for atomic adds); every ``Put`` is completed at its target
before the next notify, so data is visible before the signal announcing it.

There is no driver process.  A rank that waits, and a rank that has finished,
watches the other ranks' status boards and diagnoses a hang itself, with the
stall rule every backend uses (``base.StallRule``: only communication is
progress, never CPU time).  Beside the rank's thread a helper thread (``_Pulse``)
runs MPI's progress engine and, when its rank runs without progress, publishes
the line the rank is at, so a hang report names where a busy rank spins.  A rank
that fails or finds a hang sets every rank's abort word; the others stop at
their next wait (after the grace period the ``shm`` driver gives), all processes
exchange their results and raise the same error.  Each process's rank writes
into private copies of the host tensors; at the end the bytes every rank
changed are exchanged, so each process returns with every rank's outputs.

A rank process that dies without Python (``os._exit``, a signal, the OOM killer)
cannot report.  Every process knows each peer's pid and machine; a watching
rank that finds a peer on its machine gone prints which rank vanished, tells
the others that it ends the job and which ranks vanished (the ender words) and
ends it with ``MPI_Abort``; beside a rank that does not watch (it computes, or
waits in an MPI call) the pulse thread does that.  A process that the launcher
terminates (SIGTERM, as Open MPI does once a process of the job exited) prints
the same report if the ender words name a vanished rank or its pulse thread
saw one gone before the signal came, or else says that the launcher ended it,
then dies of the signal.  Pids mean nothing across machines: there only the
launcher's message names the process that exited.
"""

from __future__ import annotations

import hashlib
import operator
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..check import findings
from ..check.hang import hang_from_states, rank_state
from ..compiler.plan import BuiltinCall, DispatchPlan, HostTensorRef, WindowView, split_segments
from ..config import started_by_mpi_launcher
from ..dfx import finish_run
from ..errors import (
    ConfigError,
    DispatchValueError,
    HangError,
    KernelValueError,
    PtodistError,
    PtodistInternalError,
    RankError,
    RankFailure,
)
from ..language.scalar import Scalar
from ..language.types import Direction
from ..rank import death
from ..rank.body import RankStopped, run_rank
from ..rank.context import RankContext
from ..rank.events import EventLog
from ..rank.failures import rank_failure
from ..rank.status import (
    DONE,
    FAILED,
    OTHER_DTYPE,
    OTHER_WAITS,
    RUNNING,
    STATE_NAMES,
    STATUS_DTYPE,
    WAITING,
    StatusBoard,
    cell_holds,
    current_line,
    waited_cells,
)
from ..rank_output import job_excepthook, report_once
from .base import Command, HostView, RunsNow, StallRule, notify_cell, rank_died
from .shm import GRACE_S

ALIGN = 64
CHECK_S = 0.02          # how often a waiting or finished rank looks at the abort word and the other ranks
PULSE_S = 0.01          # how often a rank runs MPI progress (and looks at its own progress) while it computes
BUSY_AFTER_S = 0.5      # a running rank without progress this long (at most half the hang timeout) is sampled
RESAMPLE_S = 0.1        # and sampled again this often while it stays so
RESULT_BYTES = 1 << 16  # room for a rank's pickled result in its control window
MERGE_BLOCK = 4096      # host tensor bytes are exchanged in blocks of this size
MAX_CHUNK = 1 << 30     # MPI counts are C ints: larger contiguous transfers go in pieces
TYPE_CACHE = 512        # derived datatypes kept per run (one per distinct region shape)
# After a failure, how long the other ranks get to stop before the job is ended with MPI_Abort:
# as long as the hang timeout, within these bounds.
STOP_WAIT_MIN_S, STOP_WAIT_MAX_S = 2.0, 10.0
END_WAIT_S = 0.5  # how long a process that ends the job waits for the peers to be told who ends it
# A peer gone this long without the rank thread reporting it (the rank computes, or is stuck in an MPI call
# to the dead peer): the pulse thread reports it.
PULSE_REPORT_S = 0.25
PEEK_DEAD_S = 0.2  # how long to try reading a dead peer's status row (its window may have died with it)

# The control window (byte offsets).  ABORT, LOCK, HANG and ENDER are touched only by MPI atomics; the
# rest is written by its owner with plain stores and read by the others with Get.
CTL_ABORT = 0
CTL_LOCK = 4
CTL_HANG = 8    # on rank 0 only: rank + 1 of the rank that reported a hang
CTL_ARRIVED = 16
CTL_RESULT_LEN = 24
# One INT32 accumulate, by a process that reported and ends the job with MPI_Abort: its rank + 1, then a
# bit mask of the ranks it found vanished (ranks below ENDER_RANKS).  A process read it without MPI calls.
CTL_ENDER = 32
ENDER_WORDS = 8
ENDER_RANKS = 32 * (ENDER_WORDS - 1)
CTL_BOARD = 64
# What a watcher reads of each rank, from CTL_ARRIVED: its status row and its other waits (they follow the row).
CTL_PEEK_END = CTL_BOARD + STATUS_DTYPE.itemsize + OTHER_DTYPE.itemsize * OTHER_WAITS
CTL_RESULT = -(-(CTL_BOARD + StatusBoard.nbytes(1)) // ALIGN) * ALIGN
CTL_BYTES = CTL_RESULT + RESULT_BYTES

# numpy dtypes an MPI Accumulate can add natively; the others (FP16, BF16) add under the lock.
_ACCUMULATE_TYPES = {np.dtype(np.float32): "FLOAT", np.dtype(np.float64): "DOUBLE", np.dtype(np.int8): "INT8_T",
                     np.dtype(np.int16): "INT16_T", np.dtype(np.int32): "INT32_T", np.dtype(np.int64): "INT64_T",
                     np.dtype(np.uint8): "UINT8_T"}

INSTALL_HINT = ("Install mpi4py with `pip install ptodist[mpi]` and the system's MPI library (Debian/Ubuntu: "
                "`apt-get install openmpi-bin libopenmpi-dev`), then start the program with "
                "`mpirun -n P python SCRIPT`.")


def _mpi4py():
    """Import the mpi4py package (this does not start MPI); raise ConfigError saying how to install it."""
    try:
        import mpi4py
    except ImportError:
        raise ConfigError(f"the 'mpi' backend needs mpi4py, which is not installed in {sys.executable}. "
                          f"{INSTALL_HINT}") from None
    return mpi4py


def load_mpi():
    """Import and return ``mpi4py.MPI`` (which starts MPI); raise ConfigError saying how to install it."""
    mpi4py = _mpi4py()
    if "mpi4py.MPI" not in sys.modules and getattr(mpi4py.rc, "thread_level", None) == "multiple":
        # Only the thread that runs the rank calls MPI.  Asking for less than MPI_THREAD_MULTIPLE also lets
        # Open MPI use its pt2pt one-sided component (TCP networks), which refuses MPI_THREAD_MULTIPLE.
        mpi4py.rc.thread_level = "serialized"
    try:
        from mpi4py import MPI
    except Exception as e:  # noqa: BLE001 - e.g. the MPI shared library is missing
        raise ConfigError(f"the 'mpi' backend could not load MPI: {type(e).__name__}: {e}. {INSTALL_HINT}") from None
    return MPI


class _Session:
    """This process's MPI state, made once: a private communicator and where the process runs."""

    def __init__(self, MPI):
        self.MPI = MPI
        # A duplicate, so that ptodist's collectives never match a program's own MPI calls.
        self.comm = MPI.COMM_WORLD.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_size = local.Get_size()
        local.Free()
        # The machine's cores, not this process's affinity: a launcher may bind each process to one core.
        self.oversubscribed = self.local_size > (os.cpu_count() or 1)
        self.host = MPI.Get_processor_name()
        # A helper thread may call MPI (never at the same time as the rank thread) only from this level on.
        self.threaded_progress = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        # os._exit and native crashes write this process's stack to a file its peers on this machine hold open.
        self.record = death.new_file(f"rank{self.rank}")
        death.arm(self.record)
        # Every process's (pid, start time, machine, record file): a process can tell whether a peer on its machine
        # is alive, and where it was if it died without reporting.
        self.processes = self.comm.allgather((os.getpid(), _start_time(os.getpid()), _machine(self.host),
                                              self.record))
        me = self.processes[self.rank]
        self.same_machine = [r for r, p in enumerate(self.processes) if r != self.rank and p[2] == me[2]]
        self.peer_records = {}  # rank -> this process's descriptor of the peer's record file
        for r in self.same_machine:
            try:  # opened while the peer lives: the file outlives it, and vanishes with the last process of the job
                self.peer_records[r] = os.open(f"/proc/{self.processes[r][0]}/fd/{self.processes[r][3]}", os.O_RDONLY)
            except OSError:
                pass  # (another pid namespace, no /proc): a death is then reported without its line
        # Whether a dead peer's window can still be read: Open MPI's shared-memory one-sided component maps
        # every window of a one-machine job, so its memory outlives the process.  Elsewhere (TCP, UCX, RDMA)
        # an operation aimed at a dead process may wait for ever or end this process.
        self.dead_peers_readable = (MPI.get_vendor()[0] == "Open MPI" and self.local_size == self.size
                                    and os.environ.get("OMPI_MCA_osc", "sm") == "sm")
        if self.size > 1:  # an error every process raises and none catches: one report, the others point at it
            previous = sys.excepthook
            sys.excepthook = lambda kind, error, tb: job_excepthook(kind, error, tb, previous)


def _machine(host: str) -> str:
    """What identifies this machine, and the pid namespace its pids mean something in."""
    parts = [host]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    return "|".join(parts)


_HAVE_PROC = os.path.exists("/proc/self/stat")
# The signals with which a launcher (or a user) ends a job.
_STOP_SIGNALS = frozenset(int(getattr(signal, n)) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n))


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of stat: the start time, in clock ticks after boot
    except (IndexError, ValueError):
        return None


def _process_gone(pid: int, start: int | None) -> bool:
    """Whether the process ``pid`` (started at ``start``) on this machine has ended (a zombie has ended)."""
    if _HAVE_PROC:
        fields = _proc_stat(pid)
        if fields is None:
            return not Path(f"/proc/{pid}").exists()
        if fields[0] in (b"Z", b"X", b"x"):
            return True
        try:
            return start is not None and int(fields[19]) != start  # the pid was reused
        except (IndexError, ValueError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # it exists, as another user's process
    return False


_session: _Session | None = None


def job_communicator():
    """ptodist's communicator of this MPI job, or None when this process is not part of one."""
    if _session is None and not started_by_mpi_launcher():
        return None  # one process without a launcher: nothing to agree with (the backend refuses more)
    return _get_session(load_mpi()).comm


def _get_session(MPI) -> _Session:
    global _session
    if _session is None:
        _session = _Session(MPI)
    return _session


class MpiBackend:
    """Runs a plan with one MPI process per rank (start the program with ``mpirun -n P``)."""

    name = "mpi"

    def __init__(self):
        _mpi4py()

    def run(self, plan: DispatchPlan, host_arrays: list, config, dfx=None, *, scalars: tuple = ()) -> None:
        if _session is None and plan.world != 1 and not started_by_mpi_launcher():
            # Refused before MPI starts: a process that starts MPI without a launcher gets a helper daemon.
            raise _no_launcher(plan.program, plan.device_ids)
        # A group used once: its window heap is allocated for this call (no arena).
        hosts = [HostView(a.shape, "", True, array=a) if a is not None else None for a in host_arrays]
        command = Command(0, 0, plan, [], 0, hosts, None, dfx, config.resolved_hang_timeout(), scalars=scalars)
        MpiGroup(_get_session(load_mpi()), list(plan.device_ids)).execute(command, host_arrays)

    def start(self, device_ids: list, objects: dict | None = None, startup_timeout_s: float = 0.0) -> MpiGroup:
        """This process's rank of a DistributedWorker: every process of the job prepares the same worker."""
        if _session is None and len(device_ids) != 1 and not started_by_mpi_launcher():
            raise _no_launcher("DistributedWorker", device_ids)
        session = _get_session(load_mpi())
        if session.size != len(device_ids):
            raise ConfigError(
                f"DistributedWorker: the worker has {len(device_ids)} ranks (device_ids {list(device_ids)}) but this "
                f"MPI job has {session.size} process{'es' if session.size != 1 else ''}, and each MPI process runs "
                f"one rank. Start it with `mpirun -n {len(device_ids)} ...`.")
        return MpiGroup(session, list(device_ids))


class _Arena:
    """A worker's window heap on mpi: one MPI window, kept across commands; ``rows`` this rank's heap."""

    def __init__(self, session: _Session, stride: int):
        self.session = session
        self.stride = stride
        self.win = _allocate(session, stride, "DistributedWorker")
        self.rows = np.frombuffer(self.win.tomemory(), np.uint8)[:stride].reshape(1, stride)
        self.rows[:] = 0

    def close(self) -> None:
        """Free the window: collective, every process of the job closes its worker alike."""
        if self.win is not None:
            self.rows = None
            self.win.Free()
            self.win = None


class MpiGroup:
    """A DistributedWorker's ranks on mpi: process r runs rank r's part of every command, in its own thread.

    Every process of the job drives its own copy of the worker, so the processes must take every step
    together: ``agree`` exchanges whether a step that runs in each process alone (binding, planning, a
    sub-worker callback) failed, and a process that cannot keep step ends the job (``kill``).
    """

    in_process = True      # the rank sees this process's memory: host tensors are used in place
    finishes_dfx = True    # the run merges the ranks' DFX files itself (one process per output directory)

    def __init__(self, session: _Session, device_ids: list):
        self.session = session
        self.device_ids = device_ids
        self.world = len(device_ids)
        self.death_notes: dict = {}
        self.kept: dict = {}   # what a dispatch's rank keeps between its segments (context, event log)

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
                error = _MpiRun(self.session, plan, arrays, command.hang_timeout, command.dfx, arena=command.heap,
                                kept=self.kept, last=command.last, what=what, scalars=command.scalars).run()
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

    def close(self) -> None:
        self.kept = {}


def _allocate(session: _Session, nbytes: int, program: str):
    MPI = session.MPI
    try:
        return MPI.Win.Allocate(nbytes, 1, comm=session.comm)
    except MPI.Exception as e:
        raise ConfigError(
            f"{program}: MPI could not allocate the RMA windows ({nbytes} bytes of window heap per rank): {e}. "
            "One-sided communication needs MPI_Win_allocate with passive target; with Open MPI over TCP, run "
            "with `--mca osc pt2pt` (or `--mca osc ucx` where UCX is installed); see docs/multi-node.md.") from None


# -- before the run: one plan, one set of inputs ------------------------------------------------------

def _arg_key(a):
    if isinstance(a, WindowView):
        return ("window", a.buffer.id, tuple(a.shape), a.dtype.name)
    if isinstance(a, HostTensorRef):
        return ("host", a.tensor.index, tuple(a.index))
    if isinstance(a, Scalar):
        return ("scalar", a.value, a.dtype.name)
    if isinstance(a, (list, tuple)):
        return tuple(_arg_key(x) for x in a)
    if isinstance(a, (int, float, bool, str)) or a is None:
        return a
    return type(a).__name__


def plan_digest(plan: DispatchPlan, scalars: tuple = ()) -> str:
    """A digest of what the ranks will do: windows, host tensors, every rank's tasks and arguments, and the
    dispatch's scalar arguments (exactly: ``-0.0`` is not ``0.0``)."""
    tasks = [[(t.function.describe() if isinstance(t.function, BuiltinCall) else t.function.name,
               tuple(_arg_key(a) for a in t.args)) for t in ts] for ts in plan.tasks]
    parts = (plan.program, plan.world, tuple(plan.device_ids), plan.window_heap_bytes,
             tuple((w.name, w.offset, w.nbytes) for w in plan.windows),
             tuple((t.index, t.name, tuple(t.shape), t.dtype.name, t.direction.value) for t in plan.host_tensors),
             tasks, tuple((type(v).__name__, v.hex() if isinstance(v, float) else repr(v)) for v in scalars))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _agree_on_plan(s: _Session, plan: DispatchPlan, what: str, scalars: tuple = ()) -> BaseException | None:
    """Check, in every process alike, that the job has one process per rank and one plan (with the same scalar
    arguments: each process's rank takes its own); return the error every process raises (a process that failed
    to prepare the command sends its error instead of a plan)."""
    error, everyone = _exchange(s, plan.device_ids, "segment", what, None,
                                (plan.world, plan_digest(plan, scalars)))
    if error is not None:
        return error
    worlds = sorted({w for w, _ in everyone})
    if worlds != [s.size]:
        ids = list(plan.device_ids)
        if s.size == 1 and not started_by_mpi_launcher():
            return _no_launcher(plan.program, plan.device_ids)
        return ConfigError(
            f"{plan.program}: the program has {plan.world} ranks (DistributedConfig(device_ids={ids})) but this "
            f"MPI job has {s.size} process{'es' if s.size != 1 else ''}, and each MPI process runs one rank. "
            f"Start it with `mpirun -n {plan.world} ...`, or give device_ids {s.size} "
            f"entr{'ies' if s.size != 1 else 'y'}.")
    differ = [p for p, (_, d) in enumerate(everyone) if d != everyone[0][1]]
    if differ:
        return DispatchValueError(
            f"{plan.program}: MPI process(es) {differ} planned a different dispatch than process 0 (other "
            "windows, tasks or scalar arguments). Every process runs the host orchestrator and must plan the "
            "same thing: do not derive shapes, scalar arguments or control flow of the host orchestrator from "
            "the process (its MPI rank, host name, unseeded randomness).")
    return None


# -- taking each step together --------------------------------------------------------------------------------

PICKLED_ERROR_MAX = 1 << 20  # a larger pickled exception travels as its type and text only
# The steps the processes take together where a step can fail in some of them (``_exchange``), as a report
# names them.
_STEPS = {"accept": "binding and planning a dispatch", "windows": "making a worker's window memory",
          "segment": "the plan of a command", "callback": "a sub-worker callback", "outputs": "exchanging outputs",
          "dfx": "exchanging DFX files", "dfx written": "writing DFX files"}


def _exchange(s: _Session, device_ids, step: str, what: str, error: BaseException | None,
              value=None) -> tuple[BaseException | None, list | None]:
    """Every process of the job at ``step``: send ``value``, or ``error`` where the step failed in this process.

    Returns ``(error, values)``: ``values`` every process's value when the step succeeded everywhere;
    else ``error``, what this process fails ``what`` with, and ``values`` None.  Every process fails alike,
    with the failure that weighs most (an interrupt, then another exit, then an ordinary exception; the
    lowest process among equals): a process whose own failure weighs as much raises its own (with its
    traceback), the others a copy (``_rebuild``).  A note names the process it was raised in.  Processes at
    different steps are out of step (they made different calls): every later exchange would pair
    unrelated data, so the job ends.
    """
    mine = (step, _failure(error) if error is not None else None, value)
    if s.size == 1:
        everyone = [mine]
    else:
        everyone = s.comm.allgather(mine)
    steps = [st for st, _, _ in everyone]
    if any(st != step for st in steps):
        if s.rank == 0:
            at = ", ".join(f"process {p} at {_STEPS.get(st, st)}" for p, st in enumerate(steps))
            _say([f"ptodist: the processes of the MPI job are out of step ({at}): every process of the job must "
                  "make the same calls on ptodist (the same dispatches and worker calls, in the same order), and "
                  "here they did not, so the MPI job is ended with MPI_Abort."])
        else:
            time.sleep(END_WAIT_S)  # process 0 reports, then ends the job
        _abort(s)
    failed = [(p, f) for p, (_, f, _) in enumerate(everyone) if f is not None]
    if not failed:
        return None, [v for _, _, v in everyone]
    if error is not None and s.size == 1:
        return error, None
    chosen, first = max(failed, key=lambda pf: (pf[1]["weight"], -pf[0]))

    def where(p: int) -> str:
        return f"MPI process {p} (rank {p}, device {device_ids[p]})"

    others = [(p, f) for p, f in failed if p != s.rank]
    if error is not None and _weight(error) == first["weight"]:
        also = "".join(f"; {where(p)} failed at this step too: {f['summary']}" for p, f in others)
        error.add_note(f"raised in {where(s.rank)}{also}. Every process of the MPI job fails {what}.")
        return error, None
    out = _rebuild(first)
    note = (f"raised in {where(chosen)}, not in this process ({s.rank}). Every process of the MPI job fails "
            f"{what}. Its traceback in process {chosen}:\n{first['traceback'].rstrip()}")
    if error is not None:
        note += f"\nThis process failed at this step too: {type(error).__name__}: {error}"
    out.add_note(note)
    return out, None


def _weight(e: BaseException) -> int:
    return 2 if isinstance(e, KeyboardInterrupt) else 0 if isinstance(e, Exception) else 1


def _failure(e: BaseException) -> dict:
    """A failure as the other processes can take it: its text, its traceback, and the exception pickled
    (or its importable classes, most derived first, when it cannot be: a class local to a function)."""
    try:
        data = pickle.dumps(e)
        data = data if len(data) <= PICKLED_ERROR_MAX else None
    except Exception:  # noqa: BLE001 - anything may fail to pickle: the classes and the text still travel
        data = None
    classes = []
    for cls in type(e).__mro__:
        try:
            classes.append(pickle.dumps(cls))
        except Exception:  # noqa: BLE001 - a class that cannot be named in another process
            continue
    try:
        args = pickle.dumps(e.args)
    except Exception:  # noqa: BLE001 - its text stands for them
        args = pickle.dumps((str(e),))
    return {"weight": _weight(e), "summary": f"{type(e).__name__}: {e}", "args": args,
            "traceback": "".join(traceback.format_exception(e)), "exception": data, "classes": classes}


def _rebuild(f: dict) -> BaseException:
    """The exception another process raised: itself if it unpickles here, else its nearest class that does,
    made from its arguments."""
    if f["exception"] is not None:
        try:
            e = pickle.loads(f["exception"])
            if isinstance(e, BaseException):
                return e
        except Exception:  # noqa: BLE001 - e.g. a class whose __init__ the pickled arguments do not fit
            pass
    try:
        args = pickle.loads(f["args"])
    except Exception:  # noqa: BLE001 - arguments of a class not importable here
        args = (f["summary"],)
    for data in f["classes"]:
        try:
            e = pickle.loads(data)(*args)
        except Exception:  # noqa: BLE001 - not importable here, or its __init__ wants other arguments
            continue
        if isinstance(e, BaseException):
            return e
    return Exception(f["summary"])


def _abort(s: _Session) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    s.comm.Abort(1)


def _leave_job(s: _Session, device_ids, error: BaseException | None, doing: str) -> None:
    """This process stopped ``doing`` alone (``error`` escaped it); the others would wait for it in the next
    collective step for ever: say so, and end the job.  Nothing to do in a job of one process."""
    if s.size == 1:
        return
    lines = ["".join(traceback.format_exception(error)).rstrip()] if error is not None else []
    why = f" ({type(error).__name__}{': ' if str(error) else ''}{error})" if error is not None else ""
    lines.append(f"ptodist: MPI process {s.rank} (rank {s.rank}, device {device_ids[s.rank]}) stopped {doing} "
                 f"alone{why}; the other processes would wait for it for ever in the next step they take "
                 "together, so it ends the MPI job with MPI_Abort.")
    _say(lines)
    _abort(s)


def _no_launcher(program: str, device_ids) -> ConfigError:
    return ConfigError(
        f"{program}: the program has {len(device_ids)} ranks (DistributedConfig(device_ids={list(device_ids)})) "
        "and runs on the 'mpi' backend, where each MPI process runs one rank, but no MPI launcher started this "
        f"process. Start it with `mpirun -n {len(device_ids)} python SCRIPT`, or choose another backend "
        "(RunConfig(backend='shm') or PTODIST_BACKEND=shm).")


def _byte_view(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _bcast_bytes(comm, MPI, buf: np.ndarray, root: int) -> None:
    for lo in range(0, buf.size, MAX_CHUNK):
        piece = buf[lo:lo + MAX_CHUNK]
        comm.Bcast([piece, piece.size, MPI.BYTE], root=root)


def _sync_host_tensors(s: _Session, host_arrays: list) -> None:
    """Give every process process 0's host tensors, so all ranks start from the same inputs.

    Each process made its own (for instance with unseeded ``torch.randn``); the golden a script computes
    after the call then agrees with what the ranks computed.
    """
    for i, a in enumerate(host_arrays):
        if a is None or a.size == 0:
            continue
        if s.rank == 0:
            _bcast_bytes(s.comm, s.MPI, _byte_view(np.ascontiguousarray(a)), 0)
            continue
        got = np.empty(a.shape, a.dtype)
        _bcast_bytes(s.comm, s.MPI, _byte_view(got), 0)
        if np.array_equal(_byte_view(got), _byte_view(np.ascontiguousarray(a))):
            continue
        if a.flags.writeable and a.flags.c_contiguous:
            a[...] = got
        else:
            host_arrays[i] = got  # a read-only input: the ranks read process 0's values


# -- remote window memory ---------------------------------------------------------------------------------

class _RemoteBytes:
    """A peer's bytes of one window buffer: what ``window_bytes`` returns for another rank.

    Supports what ``WindowTensor`` does with raw bytes: ``[:n]`` and ``.view(dtype)``.
    """

    def __init__(self, memory: MpiMemory, rank: int, disp: int, nbytes: int):
        self._memory, self._rank, self._disp, self.nbytes = memory, rank, disp, nbytes

    @property
    def shape(self) -> tuple:
        return (self.nbytes,)

    def __len__(self) -> int:
        return self.nbytes

    def __getitem__(self, key) -> _RemoteBytes:
        if not isinstance(key, slice):
            raise PtodistInternalError(f"a peer's window bytes support [a:b] only, got [{key!r}]")
        start, stop, step = key.indices(self.nbytes)
        if step != 1:
            raise PtodistInternalError(f"a peer's window bytes support [a:b] only, got step {step}")
        return _RemoteBytes(self._memory, self._rank, self._disp + start, max(stop - start, 0))

    def view(self, dtype) -> RemoteArray:
        dtype = np.dtype(dtype)
        return RemoteArray(self._memory, self._rank, self._disp, dtype, (self.nbytes // dtype.itemsize,))


class _Shaped:
    """``ndim``, ``size`` and ``nbytes`` from ``shape`` and ``dtype``, as numpy arrays have them."""

    shape: tuple
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


class RemoteArray(_Shaped):
    """A typed, C-ordered array in a peer's window: indexing reads (MPI Get), assigning writes (MPI Put).

    ``a[key]`` returns a :class:`RemoteRegion` (read when converted, ``+=`` accumulates);
    ``a[key] = value`` puts ``value`` there.  Keys are ints and step-1 slices.
    """

    def __init__(self, memory: MpiMemory, rank: int, disp: int, dtype: np.dtype, shape: tuple):
        self._memory, self.rank, self.disp, self.dtype, self.shape = memory, rank, disp, dtype, tuple(shape)

    def reshape(self, *shape) -> RemoteArray:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise KernelValueError(f"cannot reshape a remote array of size {self.size} into shape {shape}")
        return RemoteArray(self._memory, self.rank, self.disp, self.dtype, shape)

    def view(self, dtype) -> RemoteArray:
        dtype = np.dtype(dtype)
        return RemoteArray(self._memory, self.rank, self.disp, dtype, (self.nbytes // dtype.itemsize,))

    def _box(self, key) -> tuple[tuple, tuple, tuple]:
        """Return (starts, sizes, result shape) of the rectangular region ``key`` selects."""
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > self.ndim:
            raise IndexError(f"too many indices ({len(key)}) for a remote array of shape {self.shape}")
        key = key + (slice(None),) * (self.ndim - len(key))
        starts, sizes, out = [], [], []
        for k, n in zip(key, self.shape):
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step != 1:
                    raise PtodistInternalError(f"a peer's window supports step-1 slices only, got {k!r}")
                size = max(stop - start, 0)
                starts.append(start)
                sizes.append(size)
                out.append(size)
            else:
                i = operator.index(k)
                if i < 0:
                    i += n
                if not 0 <= i < n:
                    raise IndexError(f"index {k} is out of bounds for a dimension of size {n}")
                starts.append(i)
                sizes.append(1)
        return tuple(starts), tuple(sizes), tuple(out)

    def __getitem__(self, key) -> RemoteRegion:
        starts, sizes, out = self._box(key)
        return RemoteRegion(self, starts, sizes, out)

    def __setitem__(self, key, value) -> None:
        starts, sizes, out = self._box(key)
        if isinstance(value, RemoteRegion) and value._added and value._array is self and value._starts == starts \
                and value._sizes == sizes:
            value._added = False  # `a[k] += x` ends by assigning the region back; the add already happened
            return
        data = np.ascontiguousarray(np.broadcast_to(np.asarray(value, dtype=self.dtype), out))
        self._memory.put(self.rank, self.disp, self.shape, starts, sizes, data)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self[()].__array__(dtype)

    def copy(self) -> np.ndarray:
        return self[()].copy()

    def __repr__(self) -> str:
        return f"<remote array {list(self.shape)} {self.dtype} on rank {self.rank}>"


class RemoteRegion(_Shaped):
    """A region of a :class:`RemoteArray`; nothing moves until it is read (``copy``, ``np.asarray``) or added to."""

    def __init__(self, array: RemoteArray, starts: tuple, sizes: tuple, shape: tuple):
        self._array, self._starts, self._sizes, self.shape = array, starts, sizes, shape
        self.dtype = array.dtype
        self._added = False

    def copy(self) -> np.ndarray:
        """Read the region from the peer (MPI Get)."""
        a = self._array
        return a._memory.get(a.rank, a.disp, a.shape, self._starts, self._sizes, a.dtype).reshape(self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        data = self.copy()
        return data if dtype is None else data.astype(dtype, copy=False)

    def __iadd__(self, other) -> RemoteRegion:
        a = self._array
        data = np.ascontiguousarray(np.broadcast_to(np.asarray(other, dtype=a.dtype), self.shape))
        a._memory.accumulate(a.rank, a.disp, a.shape, self._starts, self._sizes, data)
        self._added = True
        return self

    def __repr__(self) -> str:
        return f"<remote region {list(self.shape)} {self.dtype} on rank {self._array.rank}>"


# -- the rank's memory ------------------------------------------------------------------------------------

class _OwnBoard:
    """This rank's status board: a one-rank StatusBoard in its control window, addressed by its rank."""

    def __init__(self, raw: np.ndarray):
        self.board = StatusBoard(raw, 1)
        self.row = self.board.rows[0]

    def set_running(self, rank: int, task: str) -> None:
        self.board.set_running(0, task)

    def set_waiting(self, rank: int, *args, **kwargs) -> None:
        self.board.set_waiting(0, *args, **kwargs)

    def finish(self, rank: int, state: int) -> None:
        self.board.finish(0, state)

    def ledger(self, rank: int):
        return self.board.ledger(0, last_op=False)  # the driver finds what a lost rank last did by itself

    def site_slot(self, rank: int, site) -> int:
        return self.board.site_slot(0, site)


class MpiMemory:
    """RankMemory over MPI windows: the local rank's heap is a numpy array, a peer's a :class:`RemoteArray`."""

    def __init__(self, run: _MpiRun):
        s = run.session
        self.MPI = MPI = s.MPI
        self.run = run
        self.rank = s.rank
        self.world = s.size
        self.heap, self.ctl = run.heap, run.ctl
        self.heap_mem, self.ctl_mem = run.heap_mem, run.ctl_mem
        self.offsets = [w.offset for w in run.plan.windows]
        self.sizes = [w.nbytes for w in run.plan.windows]
        self.status = _OwnBoard(self.ctl_mem[CTL_BOARD:CTL_BOARD + StatusBoard.nbytes(1)])
        self._peers: dict = {}
        self._sends: list = []  # (request, buffer) of the host-tensor bytes sent to other ranks
        self._dirty: set[int] = set()  # ranks with puts not yet completed at the target
        self._types: OrderedDict = OrderedDict()
        self._acc_types = {dt: getattr(MPI, name) for dt, name in _ACCUMULATE_TYPES.items()}
        self._value = np.zeros(1, np.int32)
        self._snapshots: dict = {}  # buffer id -> the array cells() reads the buffer's cells into
        self._compare = np.zeros(1, np.int32)
        self._result = np.zeros(1, np.int32)
        self._sum, self._replace, self._no_op = MPI.SUM, MPI.REPLACE, MPI.NO_OP
        comm, any_source, any_tag = run.comm, MPI.ANY_SOURCE, MPI.ANY_TAG
        # A probe on ptodist's own communicator (no message is ever pending there) runs MPI's progress engine.
        self._progress = lambda: comm.Iprobe(any_source, any_tag)
        # Waits poll (MPI has no wake-up for a cell): spin, yield the core (the rank waited for may need it),
        # then sleep in short steps.  Ranks outnumbering their machine's cores spin only briefly.
        if s.oversubscribed:
            self.spin_s, self.yield_s, self.sleep_s = 2e-6, 1e-3, (50e-6, 250e-6)
        else:
            self.spin_s, self.yield_s, self.sleep_s = 300e-6, 2e-3, (50e-6, 250e-6)

    # -- windows ----------------------------------------------------------------------------------
    def window_bytes(self, buffer_id: int, rank: int):
        """Rank ``rank``'s bytes of buffer ``buffer_id``: a numpy array for this rank, else remote bytes."""
        off, n = self.offsets[buffer_id], self.sizes[buffer_id]
        if rank == self.rank:
            return self.heap_mem[off:off + n]
        key = (buffer_id, rank)
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = _RemoteBytes(self, rank, off, n)
        return peer

    def _datatype(self, shape: tuple, sizes: tuple, itemsize: int, base):
        """The target datatype of a region (None when it is contiguous), made of ``base`` elements.

        The region's trailing dimensions that it covers whole form one contiguous block; each outer
        dimension it spans adds an hvector of the block.  Its lower bound is the region's first byte.
        """
        d = len(shape)
        k = d - 1
        block = sizes[k] if d else 1
        while k > 0 and sizes[k] == shape[k]:
            k -= 1
            block *= sizes[k]
        if all(sizes[i] == 1 for i in range(k)):
            return None
        key = (shape, sizes, itemsize, base.py2f())
        t = self._types.get(key)
        if t is not None:
            self._types.move_to_end(key)
            return t
        elem = block * itemsize if base == self.MPI.BYTE else block
        made = [base.Create_contiguous(elem)]
        stride = itemsize * int(np.prod(shape[k:], dtype=np.int64))
        for i in range(k - 1, -1, -1):
            if sizes[i] > 1:
                made.append(made[-1].Create_hvector(sizes[i], 1, stride))
            stride *= shape[i]
        t = made.pop().Commit()
        for m in made:
            m.Free()
        self._types[key] = t
        if len(self._types) > TYPE_CACHE:
            self._types.popitem(last=False)[1].Free()
        return t

    @staticmethod
    def _offset(shape: tuple, starts: tuple, itemsize: int) -> int:
        off, stride = 0, itemsize
        for n, s in zip(reversed(shape), reversed(starts)):
            off += s * stride
            stride *= n
        return off

    def _settle(self, rank: int) -> None:
        """Complete earlier puts to ``rank`` at their target (MPI does not order a put and a later get)."""
        if rank in self._dirty:
            self.heap.Flush(rank)
            self._dirty.discard(rank)

    def get(self, rank: int, disp: int, shape: tuple, starts: tuple, sizes: tuple, dtype: np.dtype) -> np.ndarray:
        """Read a region of rank ``rank``'s array at heap byte ``disp`` into a new contiguous array."""
        out = np.empty(sizes, dtype)
        if out.size == 0:
            return out
        self._settle(rank)
        self._move(self.heap.Get, rank, _byte_view(out), disp + self._offset(shape, starts, dtype.itemsize),
                   self._datatype(shape, sizes, dtype.itemsize, self.MPI.BYTE))
        return out

    def put(self, rank: int, disp: int, shape: tuple, starts: tuple, sizes: tuple, data: np.ndarray) -> None:
        """Write contiguous ``data`` into a region of rank ``rank``'s array; complete at the next notify."""
        if data.size == 0:
            return
        self._move(self.heap.Put, rank, _byte_view(data), disp + self._offset(shape, starts, data.itemsize),
                   self._datatype(shape, sizes, data.itemsize, self.MPI.BYTE))
        self._dirty.add(rank)

    def _move(self, call, rank: int, raw: np.ndarray, at: int, target_type) -> None:
        """``call`` (Get or Put) the local bytes ``raw`` to/from rank ``rank``'s heap at byte ``at``.

        ``target_type`` is the derived datatype of a strided region, or None for a contiguous one (moved
        in pieces of at most MAX_CHUNK bytes).  Locally complete on return: ``raw`` may be read or reused.
        """
        BYTE = self.MPI.BYTE
        if target_type is None:
            for lo in range(0, raw.size, MAX_CHUNK):
                piece = raw[lo:lo + MAX_CHUNK]
                call([piece, piece.size, BYTE], rank, (at + lo, piece.size, BYTE))
        else:
            call([raw, raw.size, BYTE], rank, (at, 1, target_type))
        self.heap.Flush_local(rank)

    def accumulate(self, rank: int, disp: int, shape: tuple, starts: tuple, sizes: tuple, data: np.ndarray) -> None:
        """Add contiguous ``data`` into a region of rank ``rank``'s array (the caller holds its lock)."""
        if data.size == 0:
            return
        base = self._acc_types.get(data.dtype)
        if base is None:
            # No MPI type for FP16/BF16: read, add, write back; the lock makes it atomic.
            current = self.get(rank, disp, shape, starts, sizes, data.dtype)
            current += data.reshape(current.shape)
            self.put(rank, disp, shape, starts, sizes, current)
            return
        self._settle(rank)
        at = disp + self._offset(shape, starts, data.itemsize)
        t = self._datatype(shape, sizes, data.itemsize, base)
        flat = data.reshape(-1)
        if t is None:
            for lo in range(0, flat.size, MAX_CHUNK // data.itemsize):
                piece = flat[lo:lo + MAX_CHUNK // data.itemsize]
                self.heap.Accumulate([piece, piece.size, base], rank, (at + lo * data.itemsize, piece.size, base),
                                     self._sum)
        else:
            self.heap.Accumulate([flat, flat.size, base], rank, (at, 1, t), self._sum)
        self.heap.Flush_local(rank)
        self._dirty.add(rank)

    def flush_all(self) -> None:
        """Complete every outstanding put and accumulate at its target."""
        if self._dirty:
            self.heap.Flush_all()
            self._dirty.clear()
        self.heap.Sync()

    def free_types(self) -> None:
        for t in self._types.values():
            t.Free()
        self._types.clear()

    # -- host-tensor bytes between ranks (the host's order of chip tasks) -------------------------
    # Each process holds its own copy of the host tensors: a chip task that reads what a task of another rank
    # wrote receives those bytes, sent once the writer is complete (before the notify its edge waits for).
    def send_host(self, rank: int, tag: int, data: np.ndarray) -> None:
        """Send ``data`` (bytes of this rank's host tensors) to ``rank``'s task ``tag``; completes later."""
        comm = self.run.host_comm
        self._sends.append((comm.Isend([data, self.MPI.BYTE], rank, tag % self.run.tag_end), data))

    def recv_host(self, rank: int, tag: int, nbytes: int) -> np.ndarray:
        """The bytes ``rank`` sends this rank's task ``tag``; its edge's wait came first, so they are on their way."""
        out = np.empty(nbytes, np.uint8)
        req = self.run.host_comm.Irecv([out, self.MPI.BYTE], rank, tag % self.run.tag_end)
        delay, most = self.sleep_s
        control = self.run.control
        while True:
            with self.run.lock:
                if req.Test():
                    return out
            control.poll(time.monotonic(), watching=False)  # a vanished sender ends the job, an abort this rank
            time.sleep(delay)
            delay = min(delay * 2, most)

    def settle_sends(self, ok: bool) -> None:
        """After every rank ended: complete the sends (all were received when the run succeeded), or let them go."""
        if ok:
            self.MPI.Request.Waitall([req for req, _ in self._sends])
        else:
            for req, data in self._sends:
                req.Free()
                self.run._abandoned.append(data)  # MPI may still read it
        self._sends.clear()

    # -- signal cells -----------------------------------------------------------------------------
    def _atomic(self, win, rank: int, disp: int, value: int, op) -> int:
        self._value[0] = value
        win.Fetch_and_op(self._value, self._result, rank, disp, op)
        win.Flush(rank)
        return int(self._result[0])

    def _before_notify(self) -> None:
        # Data first: this rank's stores (Sync) and its puts (flush) are visible before the signal is.
        self.run.control.check_abort()
        if self._dirty:
            self.heap.Flush_all()
            self._dirty.clear()
        self.heap.Sync()

    def notify(self, ledger, buffer_id: int, rank: int, offset: int, value: int, is_set: int, word: int,
               slot: int) -> int:
        return notify_cell(self, ledger, buffer_id, rank, offset, value, is_set, word, slot)

    def cell_add(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        self._before_notify()
        return self._atomic(self.heap, rank, self.offsets[buffer_id] + offset, value, self._sum)

    def cell_set(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        self._before_notify()
        return self._atomic(self.heap, rank, self.offsets[buffer_id] + offset, value, self._replace)

    def cell_load(self, buffer_id: int, rank: int, offset: int) -> int:
        return self._atomic(self.heap, rank, self.offsets[buffer_id] + offset, 0, self._no_op)

    def cell_wait(self, buffer_id: int, offset: int, ge: bool, expected: int, timeout_s: float) -> tuple[bool, int]:
        """Poll the local cell with MPI atomics (which also drive MPI progress for the peers' RMA)."""
        disp = self.offsets[buffer_id] + offset
        seen = [0]

        def holds() -> bool:
            v = seen[0] = self._atomic(self.heap, self.rank, disp, 0, self._no_op)
            return (v >= expected) if ge else (v == expected)

        return self.wait_any(holds, timeout_s), seen[0]

    def cells(self, buffer_id: int) -> np.ndarray:
        """This rank's copy of buffer ``buffer_id`` as INT32 cells, read now: one atomic read of every cell
        (``MPI_Get_accumulate`` with ``MPI_NO_OP``, element-wise atomic with the peers' notifies, whatever the
        window's memory model)."""
        n = self.sizes[buffer_id] // 4
        out = self._snapshots.get(buffer_id)
        if out is None:
            out = self._snapshots[buffer_id] = np.zeros(n, np.int32)
        INT = self.MPI.INT32_T
        self.heap.Get_accumulate([out, n, INT], [out, n, INT], self.rank, (self.offsets[buffer_id], n, INT),
                                 self._no_op)
        self.heap.Flush(self.rank)
        return out

    def wait_any(self, check, timeout_s: float) -> bool:
        """Poll ``check()`` (a look at this rank's cells, with MPI atomics) until it holds, at most ``timeout_s``:
        spin, then yield, then sleep, as ranks may outnumber cores; MPI has no wake-up for a cell."""
        now = start = time.monotonic()
        deadline = start + timeout_s
        spin_end = start + self.spin_s
        yield_end = spin_end + self.yield_s
        delay, most = self.sleep_s
        next_check = start + CHECK_S
        control = self.run.control
        while True:
            if check():
                self.heap.Sync()  # the peers' puts that came before the notifies are now visible locally
                return True
            # Where one-sided operations are emulated (TCP, UCX without hardware atomics) the peers'
            # notifies and gets complete only while this process runs MPI's progress engine.
            self._progress()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_S
                control.poll(now, watching=int(self.status.row["state"]) == WAITING)
            if now >= deadline:
                return False
            if now < spin_end:
                continue
            if now < yield_end:
                os.sched_yield()
                continue
            time.sleep(delay)
            delay = min(delay * 2, most)

    @contextmanager
    def locked(self, rank: int):
        """Hold rank ``rank``'s accumulate lock: a compare-and-swap word in its control window."""
        me = self.rank + 1
        delay, most = self.sleep_s
        next_check = time.monotonic() + CHECK_S
        while True:
            self._value[0], self._compare[0] = me, 0
            self.ctl.Compare_and_swap(self._value, self._compare, self._result, rank, CTL_LOCK)
            self.ctl.Flush(rank)
            if self._result[0] == 0:
                break
            self._progress()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_S
                self.run.control.poll(now, watching=False)
            time.sleep(delay)
            delay = min(delay * 2, most)
        try:
            yield
        finally:
            # The adds made under the lock are complete before the next holder reads.
            self._settle(rank)
            self.heap.Sync()
            self._value[0], self._compare[0] = 0, me
            self.ctl.Compare_and_swap(self._value, self._compare, self._result, rank, CTL_LOCK)
            self.ctl.Flush(rank)


# -- watching: abort and hangs ----------------------------------------------------------------------------

class _Peek:
    """What a watcher reads of one rank: has it finished, its status row."""

    __slots__ = ("arrived", "row", "others")

    def __init__(self, raw: np.ndarray):
        self.arrived = bool(raw[CTL_ARRIVED:CTL_ARRIVED + 4].view(np.int32)[0])
        row_end = CTL_BOARD + STATUS_DTYPE.itemsize
        self.row = raw[CTL_BOARD:row_end].view(STATUS_DTYPE)[0]
        self.others = raw[row_end:CTL_PEEK_END].view(OTHER_DTYPE)


class _Control:
    """Per process: the abort word, the hang watcher (the ``shm`` driver's job, done by the ranks), and the
    watch on the peer processes of this machine."""

    def __init__(self, run: _MpiRun):
        self.run = run
        self.abort_seen: float | None = None
        self.hang: dict | None = None  # the hang this process found, as HangError's fields
        self.hang_timeout = run.hang_timeout
        self.rule = StallRule(run.hang_timeout)
        self.seen: list[_Peek | None] = [None] * run.world  # each rank as this process last read it
        self.reported = False  # this process printed a report of vanished ranks (or is printing it)
        self._report_lock = threading.Lock()
        # Peers on this machine the pulse thread saw gone before this process was told to stop (rank -> when).
        self.gone: dict[int, float] = {}
        self.stop_fd: int | None = None  # the read end of the signal wakeup pipe, while there is one
        self.told_to_stop = False        # a SIGTERM (SIGINT, SIGHUP) reached this process
        self._next_scan = 0.0
        self._abort_word = run.ctl_mem[CTL_ABORT:CTL_ABORT + 4].view(np.int32)
        self._ender_words = run.ctl_mem[CTL_ENDER:CTL_ENDER + 4 * ENDER_WORDS].view(np.uint32)

    # -- abort ------------------------------------------------------------------------------------
    def aborted(self, now: float | None = None) -> bool:
        """Whether some rank has asked every rank to stop (remembering when this process first saw it)."""
        if self.abort_seen is not None:
            return True
        self.run.ctl.Sync()
        if self._abort_word[0] == 0:
            return False
        self.abort_seen = time.monotonic() if now is None else now
        return True

    def check_abort(self, now: float | None = None) -> None:
        """Stop this rank (raise RankStopped) once another rank's failure is older than the grace period."""
        if self.aborted(now) and (time.monotonic() if now is None else now) - self.abort_seen >= GRACE_S:
            raise RankStopped

    def signal_abort(self) -> None:
        """Set every rank's abort word."""
        run = self.run
        one, res = np.ones(1, np.int32), np.zeros(1, np.int32)
        for r in range(run.world):
            run.ctl.Fetch_and_op(one, res, r, CTL_ABORT, run.MPI.REPLACE)
        run.ctl.Flush_all()
        self.aborted()

    def poll(self, now: float, watching: bool) -> None:
        """From a wait or a lock spin: end the job if a peer vanished; stop after an abort; look for a hang
        when ``watching``."""
        self.check_peers()
        self.check_abort(now)
        if watching and self.abort_seen is None and self.hang is None:
            hang = self.step(now)
            if hang is not None and self.found_hang(hang):
                raise RankStopped

    def found_hang(self, hang: dict) -> bool:
        """Report ``hang`` if no other rank reported one first; return whether this rank did.

        Ranks that watch find a hang at about the same time; the first to claim rank 0's hang word
        reports it, from a snapshot taken before any rank stopped.  A later snapshot could show the
        first reporter as finished.
        """
        run = self.run
        claim, free, res = np.array([run.rank + 1], np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
        run.ctl.Compare_and_swap(claim, free, res, 0, CTL_HANG)
        run.ctl.Flush(0)
        if res[0] != 0:
            return False
        self.hang = hang
        run.result["hang"] = hang
        run.publish_result()
        self.signal_abort()
        return True

    # -- hangs ------------------------------------------------------------------------------------
    def step(self, now: float) -> dict | None:
        """Look at every rank once; return a hang (HangError's fields) when the ranks are stuck."""
        run = self.run
        peeks = [run.peek(r) for r in range(run.world)]
        self.seen = peeks
        pending = [r for r, p in enumerate(peeks) if not p.arrived and int(p.row["state"]) not in (DONE, FAILED)]
        if not pending:
            return None
        found = self.rule.observe([p.row["progress"] for p in peeks], now, lambda: self._all_blocked(peeks, pending))
        return None if found is None else run.hang_fields(*found)

    def _all_blocked(self, peeks: list[_Peek], pending: list[int]) -> bool:
        memory = self.run.memory
        windows = len(self.run.plan.windows)
        for r in pending:
            row = peeks[r].row
            if int(row["state"]) != WAITING:
                return False
            for buffer_id, offset, cmp, expected in waited_cells(row, peeks[r].others):
                if not 0 <= buffer_id < windows:
                    return False
                if cell_holds(cmp, memory.cell_load(buffer_id, r, offset), expected):
                    return False
        return True

    # -- peer processes ---------------------------------------------------------------------------
    def ender(self) -> int | None:
        """The rank that reported and ended the job with MPI_Abort, if one did (read locally, no MPI call)."""
        e = int(self._ender_words[0])
        return e - 1 if e > 0 else None

    def ender_found(self) -> set[int]:
        """The ranks that the process ending the job found vanished (read locally, no MPI call)."""
        words = [int(w) for w in self._ender_words[1:]]
        return {32 * i + b for i, w in enumerate(words) for b in range(32) if w >> b & 1}

    def vanished(self) -> list[int]:
        """The ranks whose process, on this machine, ended during the run without ending the job on purpose
        (no MPI call: /proc only)."""
        processes, ender = self.run.session.processes, self.ender()
        return [r for r in self.run.session.same_machine if r != ender and _process_gone(*processes[r][:2])]

    def scan(self) -> None:
        """From the pulse thread: note the peers on this machine that are gone, until a stop signal arrives.

        After the launcher's SIGTERM the peers die of the same order, not by vanishing: the signal wakeup
        pipe, read before and after each look, keeps them out.  (The rank thread needs no such care: it runs
        the signal's handler before it could look.)
        """
        now = time.monotonic()
        if self.stop_fd is None or self.told_to_stop or now < self._next_scan:
            return
        self._next_scan = now + CHECK_S
        if self._stop_signalled():
            return
        found = [r for r in self.vanished() if r not in self.gone]
        if found and not self._stop_signalled():
            for r in found:
                self.gone[r] = now
        if self.gone and not self.reported and now - min(self.gone.values()) >= PULSE_REPORT_S:
            self.run.report_from_pulse(sorted(self.gone))

    def claim_report(self, timeout: float = -1) -> bool:
        """Whether this thread is the one of this process that prints the report of vanished ranks."""
        got = self._report_lock.acquire(timeout=timeout)
        try:
            if self.reported:
                return False
            self.reported = True
            return True
        finally:
            if got:
                self._report_lock.release()

    def _stop_signalled(self) -> bool:
        try:
            data = os.read(self.stop_fd, 512)
        except OSError:  # nothing there (or the pipe is closed)
            data = b""
        if any(b in _STOP_SIGNALS for b in data):
            self.told_to_stop = True
        return self.told_to_stop

    def check_peers(self) -> None:
        """End the job when a peer process on this machine vanished: it can neither report nor take part."""
        run = self.run
        run.ctl.Sync()
        dead = self.vanished()
        if not dead:
            return
        if self.claim_report():
            for r in dead:
                # Its last status row (the task it ran), where its window outlives it (shared memory);
                # else what this process read of it last.
                if run.session.dead_peers_readable:
                    self.seen[r] = run.peek_dead(r, PEEK_DEAD_S) or self.seen[r]
            run.report_vanished(dead, f"{run.who(run.rank)} ends the MPI job with MPI_Abort.")
        self.end_job(dead)

    def end_job(self, dead: tuple | list = ()) -> None:
        """After this process reported: tell the live peers who ends the job and which ranks vanished, then
        end it (MPI_Abort).

        A peer that the launcher then terminates, or that sees this process gone, knows it did not vanish,
        and which ranks did.
        The word is sent without waiting for the peers (emulated one-sided operations complete only while
        the target runs MPI's progress engine, and a peer that never returns to ptodist may not).
        """
        run = self.run
        words = np.zeros(ENDER_WORDS, np.uint32)
        words[0] = run.rank + 1
        for r in dead:
            if r < ENDER_RANKS:
                words[1 + r // 32] |= np.uint32(1 << (r % 32))
        words = words.view(np.int32)
        sent = [run.ctl.Raccumulate(words, r, (CTL_ENDER, ENDER_WORDS, run.MPI.INT), run.MPI.REPLACE)
                for r in range(run.world) if r != run.rank and r not in dead]
        deadline = time.monotonic() + END_WAIT_S
        while sent and time.monotonic() < deadline:
            with run.lock:  # the pulse thread may call MPI too
                sent = [q for q in sent if not q.Test()]
            if sent:
                time.sleep(1e-4)
        sys.stdout.flush()
        sys.stderr.flush()
        run.comm.Abort(1)


class _Serialized:
    """An MPI object whose calls take one lock: the rank thread and the pulse thread never call MPI at once."""

    def __init__(self, obj, lock: threading.Lock):
        self._obj, self._lock = obj, lock

    def __getattr__(self, name: str):
        attr = getattr(self._obj, name)
        if not callable(attr):
            return attr
        lock = self._lock

        def call(*args, **kwargs):
            with lock:
                return attr(*args, **kwargs)

        setattr(self, name, call)  # looked up once per name
        return call


class _Pulse(threading.Thread):
    """While the rank runs: run MPI's progress engine, publish the line the rank is at when it stalls, and
    watch the peer processes of this machine (``_Control.scan``).

    Progress matters where one-sided operations are emulated (TCP, UCX without hardware atomics): a
    peer's get from, or notify to, a rank that is computing completes only while that rank's process runs
    MPI's progress engine.  A rank that runs without communication progress for ``stall_s`` (a long
    computation, or a loop that never ends) has its current line sampled into its status row
    (``record_busy``), where the watching ranks read it for a hang report.
    """

    def __init__(self, board: StatusBoard, comm, lock: threading.Lock, MPI, stall_s: float, scan):
        super().__init__(name="ptodist-mpi-pulse", daemon=True)
        self.board, self.row = board, board.rows[0]
        self.scan = scan  # looks at the peer processes of this machine (``_Control.scan``)
        self.comm, self.lock = comm, lock  # comm None: no MPI calls from this thread
        self.any_source, self.any_tag = MPI.ANY_SOURCE, MPI.ANY_TAG
        self.target = threading.get_ident()  # the rank's thread: made by it
        self.stall_s = stall_s
        self.stopping = threading.Event()

    def run(self) -> None:
        row = self.row
        last, since, next_sample, sampled = None, time.monotonic(), 0.0, False
        while not self.stopping.wait(PULSE_S):
            now = time.monotonic()
            try:
                progress = int(row["progress"])
                if progress != last:
                    last, since = progress, now
                    if sampled:
                        row["busy"] = b""  # the line of an earlier stall
                        sampled = False
                elif int(row["state"]) == RUNNING and now - since >= self.stall_s and now >= next_sample:
                    next_sample = now + RESAMPLE_S
                    frame = sys._current_frames().get(self.target)
                    if frame is not None:
                        self.board.record_busy(0, current_line(frame))
                        sampled = True
                    del frame
                self.scan()
            except Exception:  # noqa: BLE001 - a diagnostic that fails must not stop MPI progress
                pass
            if self.comm is not None and self.lock.acquire(blocking=False):  # else the rank thread is in MPI
                try:
                    self.comm.Iprobe(self.any_source, self.any_tag)
                finally:
                    self.lock.release()

    def stop(self) -> None:
        self.stopping.set()
        self.join()


# -- one run ------------------------------------------------------------------------------------------------

class _MpiRun:
    """One dispatch in this process: windows, this rank's tasks, the end of the run, the exchange."""

    def __init__(self, session: _Session, plan: DispatchPlan, host_arrays: list, hang_timeout: float, dfx,
                 arena: _Arena | None = None, kept: dict | None = None, last: bool = True, what: str = "",
                 scalars: tuple = ()):
        self.session = session
        self.scalars = scalars  # the dispatch's scalar arguments (what its plan's ScalarArgs take)
        self.MPI = session.MPI
        self.plan = plan
        self.rank = session.rank
        self.world = session.size
        self.host_arrays = host_arrays
        self.dfx = dfx
        self.hang_timeout = hang_timeout
        self.arena = arena  # a worker's window heap (kept, zeroed by the worker); None: one for this run
        self.kept = kept if kept is not None else {}
        self.last = last
        self.what = what or f"this call of '{plan.program}'"  # what a failure of this run fails, in its notes
        self.stop_wait = min(max(self.hang_timeout, STOP_WAIT_MIN_S), STOP_WAIT_MAX_S)
        self.result: dict = {"rank": self.rank, "failure": None, "stopped": False, "hang": None}
        self._abandoned: list = []  # buffers of reads from dead peers that did not complete

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> BaseException | None:
        """Run this rank's part; return the error every process of the job raises (None: it succeeded)."""
        MPI, comm = self.MPI, self.session.comm
        if self.arena is not None:
            heap, heap_bytes = self.arena.win, self.arena.stride
        else:
            heap_bytes = max(-(-self.plan.window_heap_bytes // ALIGN) * ALIGN, ALIGN)
            try:
                heap = _allocate(self.session, heap_bytes, self.plan.program)
            except ConfigError as e:
                return e
        try:
            ctl = MPI.Win.Allocate(CTL_BYTES, 1, comm=comm)
        except MPI.Exception as e:
            if self.arena is None:
                heap.Free()
            return ConfigError(f"{self.plan.program}: MPI could not allocate its control window: {e}")
        # While the rank runs, every MPI call of this process goes through one lock (see _Pulse).
        self.lock = lock = threading.Lock()
        self.heap, self.ctl, self.comm = _Serialized(heap, lock), _Serialized(ctl, lock), _Serialized(comm, lock)
        try:
            self.heap_mem = np.frombuffer(heap.tomemory(), np.uint8)[:heap_bytes]
            self.ctl_mem = np.frombuffer(ctl.tomemory(), np.uint8)[:CTL_BYTES]
            if self.arena is None:
                self.heap_mem[:] = 0
            self.ctl_mem[:] = 0
            comm.Barrier()  # every window is zero before any rank reaches into a peer's
            heap.Lock_all(MPI.MODE_NOCHECK)
            ctl.Lock_all(MPI.MODE_NOCHECK)
            self.control = _Control(self)
            self._catch_termination()
            # The host's order of chip tasks passes host-tensor bytes on a communicator of this run's own.
            self.host_comm = _Serialized(comm.Dup(), lock) if self.plan.edges else None
            self.tag_end = int(comm.Get_attr(MPI.TAG_UB)) + 1
            self.memory = MpiMemory(self)
            views = self._host_views()
            pulse = _Pulse(self.memory.status.board, comm if self.session.threaded_progress else None, lock, MPI,
                           min(BUSY_AFTER_S, self.hang_timeout / 2), self.control.scan)
            pulse.start()
            try:
                self._rank_body(views)
                self._finish()
            finally:
                pulse.stop()
            heap.Unlock_all()
            ctl.Unlock_all()
            self.memory.free_types()
            results = comm.allgather(self.result)
            if self.host_comm is not None:
                self.memory.settle_sends(outcome(results) is None)
                self.host_comm.Free()
        finally:
            self._release_termination()
            self.heap_mem = self.ctl_mem = None
            self.memory = None
            if self.arena is None:
                heap.Free()
            ctl.Free()
        error = outcome(results)
        # A worker's dispatch writes its DFX files once, after its last segment (or its failure).
        shared = None
        if self.dfx is not None and (self.last or error is not None):
            failed, shared = self._share_dfx()
            error = error or failed
        if error is None:
            error = self._merge_outputs(views)
        if shared is not None:
            error = self._write_dfx(*shared) or error
        return error

    def _host_views(self) -> list:
        """Private copies of the host tensors the ranks write; inputs read-only, as on ``shm``."""
        views: list = [None] * len(self.host_arrays)
        for i, a in enumerate(self.host_arrays):
            if a is not None:
                views[i] = a.copy()
        for spec in self.plan.host_tensors:
            if spec.direction is Direction.IN:
                v = self.host_arrays[spec.index].view()
                v.flags.writeable = False
                views[spec.index] = v
        return views

    # -- processes that vanish, a launcher that ends the job --------------------------------------
    def _vanished_report(self, dead: list[int]) -> list[str]:
        """The RankError lines for the ranks whose process vanished, as every surviving process prints them."""
        failures = []
        for r in dead:
            seen = self.control.seen[r]
            task = (seen.row["task"].decode(errors="replace") or None) if seen is not None else None
            finished = seen is not None and seen.arrived
            fd = self.session.peer_records.get(r)
            record = death.read(fd) if fd is not None else None
            if record is not None:  # it called os._exit, or died of a fatal signal: its record says where
                note = f"vanished{' after it finished its tasks' if finished else ''} ({record.cause})"
                failures.append(rank_died(r, self.plan.device_ids[r], task, note, record))
                continue
            when = "after it finished its tasks" if finished else "without reporting a result"
            failures.append(RankFailure(r, self.plan.device_ids[r], task, "RankDied",
                                        f"the rank process vanished {when} (os._exit, a signal or the OOM killer)", ""))
        error = RankError(failures)
        return [f"ptodist: RankError: {error}", *(f.summary() for f in findings.from_exception(error))]

    def who(self, rank: int) -> str:
        return f"rank {rank} (device {self.plan.device_ids[rank]})"

    def report_vanished(self, dead: list[int], then: str) -> None:
        """Print which ranks vanished (the caller claimed the report), and what happens ``then``."""
        gone = ", ".join(self.who(r) for r in dead)
        _say([*self._vanished_report(dead), f"ptodist: the process of {gone} ended during the run; {then}"])

    def report_from_pulse(self, dead: list[int]) -> None:
        """From the pulse thread: the rank thread did not report a vanished peer (it computes, or waits in an
        MPI call to the dead peer that may never return): report it, and end the job where this thread may
        call MPI."""
        if not self.control.claim_report():
            return
        if self.session.threaded_progress:
            self.report_vanished(dead, f"{self.who(self.rank)} ends the MPI job with MPI_Abort.")
            self.control.end_job(dead)
        else:
            self.report_vanished(dead, "the MPI launcher is left to end the job.")

    def peek_dead(self, rank: int, wait_s: float) -> _Peek | None:
        """Read a dead rank's status row if that completes within ``wait_s`` (None otherwise): where the
        one-sided operations need the target's progress, a read from a dead process never completes."""
        raw = np.zeros(CTL_PEEK_END, np.uint8)
        piece = raw[CTL_ARRIVED:]
        try:
            req = self.ctl.Rget([piece, piece.size, self.MPI.BYTE], rank, (CTL_ARRIVED, piece.size, self.MPI.BYTE))
            deadline = time.monotonic() + wait_s
            while True:
                with self.lock:
                    done = req.Test()
                if done:
                    return _Peek(raw)
                if time.monotonic() >= deadline:
                    self._abandoned.append(raw)  # MPI may still write into it
                    return None
                time.sleep(1e-4)
        except self.MPI.Exception:
            return None

    def _catch_termination(self) -> None:
        """During the run, say why before dying of SIGTERM (the launcher ending the job, mostly).

        A wakeup pipe tells the pulse thread when a stop signal arrived (Python runs handlers in the main
        thread only, maybe later): a peer seen gone after that was ended by the launcher, not vanished.
        """
        self._old_term = self._wakeup = None
        if threading.current_thread() is not threading.main_thread():
            return
        old = signal.getsignal(signal.SIGTERM)
        if old == signal.SIG_IGN:
            return
        self._old_term = signal.SIG_DFL if old is None else old
        signal.signal(signal.SIGTERM, self._terminated)
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        theirs = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if theirs != -1:
            signal.set_wakeup_fd(theirs)  # the program's own (asyncio's): leave it
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, w)
        self.control.stop_fd = r

    def _release_termination(self, close: bool = True) -> None:
        """Put SIGTERM's handler and the wakeup fd back; ``close``: also close the pipe (not while the pulse
        thread may read it)."""
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None
        if self._wakeup is not None:
            current = signal.set_wakeup_fd(-1)
            if current not in (-1, self._wakeup[1]):
                signal.set_wakeup_fd(current)  # the program set its own meanwhile: keep it
        if self._wakeup is not None and close:
            self.control.stop_fd = None
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def _terminated(self, signum, frame) -> None:
        """SIGTERM during the run: print the best report this process can (no MPI call), then die of it."""
        control = self.control
        me = self.who(self.rank)
        # Seen gone before the signal came, or named by the process that ended the job; not the latter itself.
        dead = sorted((set(control.gone) | control.ender_found()) - {control.ender(), self.rank})
        if control.reported:
            pass  # this process reported the vanished ranks
        elif dead:
            # (The lock may be held by the code this handler interrupted: then only a short wait for it.)
            if control.claim_report(timeout=0.1):
                self.report_vanished(dead, f"the MPI launcher then ended {me} (SIGTERM).")
        elif control.ender() is None:  # else the process that ended the job reported why
            _say([f"ptodist: the MPI launcher ended {me} (SIGTERM) during the run: another process of the job "
                  "ended or failed (see the launcher's message; a process on another machine cannot be named "
                  "from here), or the job was cancelled."])
        self._release_termination(close=False)
        os.kill(os.getpid(), signum)

    # -- this rank --------------------------------------------------------------------------------
    def _rank_body(self, views: list) -> None:
        plan, rank, memory = self.plan, self.rank, self.memory
        ctx, log = self.kept.get("ctx"), self.kept.get("log")
        try:
            if ctx is None:
                log = EventLog(rank, plan.device_ids[rank], self.dfx.dispatch, dump_args=self.dfx.dump_args) \
                    if self.dfx is not None else None
                ctx = RankContext(plan, rank, memory, views, events=log)
            else:
                ctx.next_segment(plan, memory, views)
            ctx.scalars = self.scalars
        except BaseException as e:  # noqa: BLE001 - reported to every process like a failure of the tasks
            self.result["failure"] = rank_failure(plan, rank, None, e)
        else:
            self.kept["ctx"], self.kept["log"] = ctx, log
            outcome = run_rank(ctx, log, self.dfx, last=self.last, settle=memory.flush_all)
            self.result["failure"], self.result["stopped"] = outcome.failure, outcome.stopped
        ok = self.result["failure"] is None and not self.result["stopped"]
        memory.status.finish(rank, DONE if ok else FAILED)
        if self.result["failure"] is not None and not self.control.aborted():
            self.control.signal_abort()
        self.result["hang"] = self.control.hang
        self.publish_result()
        self.ctl_mem[CTL_ARRIVED:CTL_ARRIVED + 4].view(np.int32)[0] = 1
        self.ctl.Sync()

    def publish_result(self) -> None:
        """Keep this rank's result in its control window, where an aborting process can read it."""
        data = pickle.dumps(self.result)
        if len(data) > RESULT_BYTES:
            slim = dict(self.result)
            f = slim.get("failure")
            if f is not None:
                slim["failure"] = type(f)(f.rank, f.device_id, f.task, f.error_type, f.message[:8192],
                                          f.traceback[-16384:])
            data = pickle.dumps(slim)
        data = data[:RESULT_BYTES]
        self.ctl_mem[CTL_RESULT:CTL_RESULT + len(data)] = np.frombuffer(data, np.uint8)
        self.ctl_mem[CTL_RESULT_LEN:CTL_RESULT_LEN + 8].view(np.int64)[0] = len(data)
        self.ctl.Sync()

    def _read_result(self, rank: int) -> dict | None:
        head = np.zeros(8, np.uint8)
        self.ctl.Get([head, 8, self.MPI.BYTE], rank, (CTL_RESULT_LEN, 8, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        n = int(head.view(np.int64)[0])
        if not 0 < n <= RESULT_BYTES:
            return None
        data = np.zeros(n, np.uint8)
        self.ctl.Get([data, n, self.MPI.BYTE], rank, (CTL_RESULT, n, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        try:
            return pickle.loads(data.tobytes())
        except Exception:  # noqa: BLE001 - a result cut short: this rank's report is lost, not the others'
            return None

    # -- reading the other ranks ------------------------------------------------------------------
    def peek(self, rank: int) -> _Peek:
        if rank == self.rank:
            self.ctl.Sync()
            return _Peek(self.ctl_mem[:CTL_PEEK_END].copy())
        raw = np.zeros(CTL_PEEK_END, np.uint8)
        piece = raw[CTL_ARRIVED:]
        self.ctl.Get([piece, piece.size, self.MPI.BYTE], rank, (CTL_ARRIVED, piece.size, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        return _Peek(raw)

    def _board(self, rank: int) -> tuple[StatusBoard, bool, np.ndarray]:
        """Rank ``rank``'s whole status board (a copy, and the bytes it lives in) and whether it has finished."""
        n = StatusBoard.nbytes(1)
        raw = np.zeros(CTL_BOARD + n, np.uint8)
        piece = raw[CTL_ARRIVED:]
        self.ctl.Get([piece, piece.size, self.MPI.BYTE], rank, (CTL_ARRIVED, piece.size, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        board = raw[CTL_BOARD:]
        return StatusBoard(board, 1), bool(raw[CTL_ARRIVED:CTL_ARRIVED + 4].view(np.int32)[0]), board

    def hang_fields(self, certain: bool, idle: float) -> dict:
        """Describe the hang as the ``shm`` driver does (``check.hang``), as fields every process can take."""
        states, sent = [], []
        for r in range(self.world):
            board, arrived, _raw = self._board(r)
            row = board.rows[0]
            # A running rank's line is where its pulse thread found it, running without progress.
            states.append(rank_state(self.plan, r, row, arrived, self.memory.cell_load, self._busy_line(row),
                                     others=board.others[0]))
            for e in board.sent(0):
                e["rank"] = r
                sent.append(e)
        e = hang_from_states(states, sent, certain, idle, self.hang_timeout)
        return {"message": str(e), "states": e.ranks, "certain": e.certain, "diagnosis": e.diagnosis}

    @staticmethod
    def _busy_line(row) -> str | None:
        """The line a running rank was sampled at after it stopped making progress (None: not sampled)."""
        if int(row["samples"]) > 0:
            return row["busy"].decode(errors="replace") or None
        return None

    # -- the end of the run -----------------------------------------------------------------------
    def _finish(self) -> None:
        """Wait for every rank to end, watching for hangs; abort the job if a rank cannot be stopped."""
        req = self.comm.Ibarrier()
        delay = 1e-4
        next_check = 0.0
        control = self.control
        while True:
            with self.lock:  # the pulse thread calls MPI too
                if req.Test():
                    break
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_S
                control.check_peers()
                if control.aborted(now):
                    if now - control.abort_seen >= self.stop_wait:
                        self._abort_job(now)
                elif control.hang is None:
                    hang = control.step(now)
                    if hang is not None:
                        control.found_hang(hang)
            time.sleep(delay)
            delay = min(delay * 2, 5e-3)

    def _abort_job(self, now: float) -> None:
        """Some rank did not stop after a failure: print what is known, then end the job (MPI_Abort)."""
        peeks = [self.peek(r) for r in range(self.world)]
        arrived = [r for r, p in enumerate(peeks) if p.arrived]
        # One process reports: the lowest that has finished (the others wait for the abort, or for longer).
        if arrived and arrived[0] != self.rank and now - self.control.abort_seen < 2 * self.stop_wait + 5:
            return
        results = [self._read_result(r) if r in arrived and r != self.rank else None for r in range(self.world)]
        results[self.rank] = self.result
        error = outcome(results)
        missing = [r for r in range(self.world) if r not in arrived]
        lines = []
        if error is not None:
            lines.append(f"ptodist: {type(error).__name__}: {error}")
            if isinstance(error, PtodistError):
                lines += [f.summary() for f in findings.from_exception(error)]
        for r in missing:
            row = peeks[r].row
            state = STATE_NAMES.get(int(row["state"]), "unknown")
            task = row["task"].decode(errors="replace")
            line = self._busy_line(row) if int(row["state"]) == RUNNING else None
            where = (f" in task '{task}'" if task else "") + (f" at {line}" if line else "")
            lines.append(f"ptodist: rank {r} (device {self.plan.device_ids[r]}) did not stop within "
                         f"{self.stop_wait:g} s after the run failed: it was {state}{where}. A kernel that does not "
                         "return to ptodist (sleeping, blocked in a call, looping without communicating) cannot be "
                         "stopped by another process, so the MPI job is ended with MPI_Abort.")
        print("\n".join(lines), file=sys.stderr)
        self.control.end_job()

    # -- outputs ----------------------------------------------------------------------------------
    def _merge_outputs(self, views: list) -> BaseException | None:
        """Give every process every rank's writes: exchange the changed blocks, apply the changed bytes.

        All processes start from the same host tensors, so the bytes a rank changed are those that differ
        from the original; they are applied rank by rank, in the same order everywhere.  Returns the error
        every process raises when finding its changes failed in one of them.
        """
        B = MERGE_BLOCK
        meta: dict[int, np.ndarray] = {}
        payload = []
        padded = {}
        failed = None
        try:
            if self.plan.edges:
                _reset_stale(self.plan.transfers.stale[self.rank], views, self.host_arrays)
            for spec in self.plan.host_tensors:
                if spec.direction is Direction.IN:
                    continue
                orig = _byte_view(self.host_arrays[spec.index])
                new = _byte_view(views[spec.index])
                if orig.size == 0:
                    continue
                nb = -(-orig.size // B)
                o, n = np.zeros(nb * B, np.uint8), np.zeros(nb * B, np.uint8)
                o[:orig.size], n[:new.size] = orig, new
                padded[spec.index] = o.reshape(nb, B)
                blocks = np.flatnonzero((o != n).reshape(nb, B).any(axis=1))
                if blocks.size:
                    meta[spec.index] = blocks
                    payload.append(n.reshape(nb, B)[blocks].reshape(-1))
            mine = np.concatenate(payload) if payload else np.zeros(0, np.uint8)
            results = {i: o.copy() for i, o in padded.items()}
        except Exception as e:  # noqa: BLE001 - e.g. no memory for the copies: every process fails the call
            failed = e
        failed, everyone = _exchange(self.session, self.plan.device_ids, "outputs", self.what, failed, meta)
        if failed is not None:
            return failed
        for p, theirs in enumerate(everyone):
            size = sum(b.size for b in theirs.values()) * B
            if size == 0:
                continue
            data = mine if p == self.rank else np.empty(size, np.uint8)
            _bcast_bytes(self.session.comm, self.MPI, data, p)
            at = 0
            for index in sorted(theirs):
                blocks = theirs[index]
                new = data[at:at + blocks.size * B].reshape(-1, B)
                at += blocks.size * B
                out = results[index]
                out[blocks] = np.where(new != padded[index][blocks], new, out[blocks])
        for index, out in results.items():
            target = _byte_view(self.host_arrays[index])
            target[:] = out.reshape(-1)[:target.size]
        return None

    # -- diagnostic outputs -----------------------------------------------------------------------
    def _share_dfx(self) -> tuple[BaseException | None, tuple[list, bool] | None]:
        """Every rank's DFX files, for every process, and whether this process merges the swimlanes; or the
        error every process raises when reading them failed in one."""
        failed, mine, key = None, {}, None
        try:
            d = self.dfx.rank_dir(self.rank)
            if d.is_dir():
                for p in sorted(d.rglob("*")):
                    if p.is_file():
                        mine[str(p.relative_to(d))] = p.read_bytes()
            # One merge per output directory: processes that share one (same host, same path) elect the lowest.
            key = (self.session.host, str(Path(self.dfx.root).resolve()))
        except Exception as e:  # noqa: BLE001 - an unreadable file: every process fails the call
            failed = e
        failed, everyone = _exchange(self.session, self.plan.device_ids, "dfx", self.what, failed, (mine, key))
        if failed is not None:
            return failed, None
        return None, ([files for files, _ in everyone], [k for _, k in everyone].index(key) == self.rank)

    def _write_dfx(self, everyone: list, merger: bool) -> BaseException | None:
        """Write the other ranks' DFX files (and merge them); return the error every process raises when that
        failed in one (a full disk, a folder it may not write)."""
        failed = None
        try:
            for r, files in enumerate(everyone):
                d = self.dfx.rank_dir(r)
                for rel, data in files.items():
                    path = d / rel
                    if path.exists():
                        continue  # written by its own rank into a directory this process shares
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                    tmp.write_bytes(data)
                    os.replace(tmp, path)
            if merger:
                finish_run(self.dfx, self.world, self.plan.device_ids)
        except Exception as e:  # noqa: BLE001 - every process fails the call with it
            failed = e
        return _exchange(self.session, self.plan.device_ids, "dfx written", self.what, failed)[0]


def _say(lines: list[str]) -> None:
    """Write ``lines`` to stderr at once, bypassing Python's buffers (also safe inside a signal handler)."""
    if lines:
        try:
            os.write(2, ("\n".join(lines) + "\n").encode(errors="replace"))
        except OSError:
            pass


def _reset_stale(ops: list, views: list, originals: list) -> None:
    """Give back the original bytes of the regions another rank wrote after this rank's copy of them was current
    (``ops``: ``HostTransfers.stale`` of this rank), so that only copies holding a byte's latest write count as
    changing it in the merge."""
    depth: dict = {}
    for tensor, index, _ in ops:
        depth[tensor] = max(depth.get(tensor, 0), len(index))
    masks = {t: np.zeros(views[t].shape[:d], bool) for t, d in depth.items()
             if views[t] is not None and views[t].flags.writeable}
    for tensor, index, fresh in ops:
        if tensor in masks:
            masks[tensor][index] = not fresh
    for tensor, mask in masks.items():
        if mask.any():
            views[tensor][mask] = originals[tensor][mask]


def outcome(results: list) -> BaseException | None:
    """The error every process raises, from every rank's result (None: the run succeeded)."""
    results = [r for r in results if r]
    failures = sorted((r["failure"] for r in results if r.get("failure") is not None), key=lambda f: f.rank)
    if failures:
        return RankError(failures)
    hangs = [r["hang"] for r in results if r.get("hang")]
    if hangs:
        h = hangs[0]
        return HangError(h["message"], h["states"], h["certain"], h["diagnosis"])
    stopped = [r["rank"] for r in results if r.get("stopped")]
    if stopped:
        return PtodistInternalError(f"ranks {stopped} were stopped, but no rank reported a failure or a hang")
    return None
