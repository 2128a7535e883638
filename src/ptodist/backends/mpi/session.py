"""This process in the MPI job: loading mpi4py, the job communicator, and where every peer process runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ...config import started_by_mpi_launcher
from ...errors import ConfigError
from ...rank import death
from ...rank_output import job_excepthook

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


def _has_session() -> bool:
    """Whether this process made its session (and so started MPI)."""
    return _session is not None


def _get_session(MPI) -> _Session:
    global _session
    if _session is None:
        _session = _Session(MPI)
    return _session
