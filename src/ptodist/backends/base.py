"""The backend protocol: what a backend gives the runtime, and nothing more.

A backend starts ``world`` ranks and runs each one's tasks in a RankContext;
it provides symmetric memory (a window heap per rank), INT32 signal cells with
atomic add/set/load and an efficient, interruptible wait, and a status board
the driver reads to explain hangs.  ``RankMemory`` is the per-rank face of
that; ``Backend``/``RankGroup`` the driver's: a group of ranks started once runs ``Command``s
(one segment of a dispatch each), and a one-shot call is a group used once.
"""

from __future__ import annotations

import functools
import os
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..check.hang import rank_lines
from ..compiler.plan import DispatchPlan
from ..errors import RankDiedError, RankFailure
from ..rank.death import Death
from ..rank.status import SAMPLE_SIGNAL, StatusBoard

# A hang is certain when every unfinished rank has been blocked, with nothing changing, this long.
CERTAIN_HANG_S = 0.5
# A watcher that did not look for this long (it was busy itself) starts timing afresh.
WATCH_GAP_S = 1.0
# Ranks of a run cut short (a hang, an interrupt, a failure) that keep DFX records get this long to write them.
STOP_WRITE_S = 1.0
# After the first failure, wait this long for the other ranks' reports before stopping them.
GRACE_S = 0.2
# How long a driver waits for ranks to answer a request for their current line.
SAMPLE_WAIT_S = 0.5


class StallRule:
    """The one rule, on every backend, that decides when ranks hang.

    ``progress`` is every rank's progress word.  Ranks advance it only by communicating (a notify, a
    satisfied wait, an RMA, a task started or finished, a polling read that saw a new value), never by
    merely using the CPU: a loop that spins on a cell nobody writes is as hung as a blocked wait.
    ``observe`` returns ``(certain, idle_s)`` when the ranks hang: certain once every unfinished rank
    has been blocked in a wait nobody can satisfy for CERTAIN_HANG_S, otherwise after ``hang_timeout``
    seconds without progress.
    """

    def __init__(self, hang_timeout: float):
        self.hang_timeout = hang_timeout
        self.last: tuple | None = None
        self.last_change = self.last_seen = 0.0

    def observe(self, progress, now: float, all_blocked) -> tuple[bool, float] | None:
        """Look once; ``all_blocked()`` says whether every unfinished rank is blocked for good."""
        progress = tuple(int(p) for p in progress)
        if progress != self.last or now - self.last_seen > WATCH_GAP_S:
            # A change, or the first look after a while (the watcher was busy): start timing afresh.
            self.last, self.last_change, self.last_seen = progress, now, now
            return None
        self.last_seen = now
        idle = now - self.last_change
        if idle >= CERTAIN_HANG_S and all_blocked():
            return True, idle
        if idle >= self.hang_timeout:
            return False, idle
        return None


def sample_lines(board: StatusBoard, pids: dict[int, int], ranks) -> dict[int, str]:
    """Ask the rank processes ``ranks`` (``pids``: rank -> pid) for their current line; return the answers.

    A rank that does not answer within SAMPLE_WAIT_S (stuck in native code that never returns to
    the interpreter) is left out.
    """
    asked = {}
    for r in ranks:
        pid = pids.get(r)
        if pid is None:
            continue
        asked[r] = int(board.rows[r]["samples"])
        try:
            os.kill(pid, SAMPLE_SIGNAL)
        except ProcessLookupError:
            del asked[r]
    deadline = time.monotonic() + SAMPLE_WAIT_S
    while any(int(board.rows[r]["samples"]) == n for r, n in asked.items()) and time.monotonic() < deadline:
        time.sleep(0.002)  # a bounded wait for an answer: the ranks run the handler at their next bytecode
    return {r: board.busy_line(r) for r, n in asked.items() if int(board.rows[r]["samples"]) != n}


class RankMemory(Protocol):
    """Symmetric memory and signal cells as one rank sees them."""

    rank: int
    world: int
    status: StatusBoard

    def window_bytes(self, buffer_id: int, rank: int) -> np.ndarray:
        """Return the raw bytes (uint8) of window buffer ``buffer_id`` on ``rank``."""

    def notify(self, ledger, buffer_id: int, rank: int, offset: int, value: int, is_set: int, word: int,
               slot: int) -> int:
        """A notify: atomically add ``value`` to (``is_set``: overwrite) the INT32 cell at byte ``offset``, and
        account it in the notifying rank's ``ledger`` (``word``: its last-operation word, 0 to leave that;
        ``slot``: its line's site slot); return the cell's old value."""

    def cell_add(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        """Atomically add to the INT32 cell at byte ``offset``; return the old value."""

    def cell_set(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        """Atomically overwrite the INT32 cell; return the old value."""

    def cell_load(self, buffer_id: int, rank: int, offset: int) -> int:
        """Return the INT32 cell's current value."""

    def cell_wait(self, buffer_id: int, offset: int, ge: bool, expected: int, timeout_s: float) -> tuple[bool, int]:
        """Block until the local cell is ``== expected`` (or ``>=`` if ``ge``), at most ``timeout_s``."""

    def cells(self, buffer_id: int) -> np.ndarray:
        """This rank's copy of buffer ``buffer_id`` as INT32 cells, as they are now (to look at many at once;
        a hit is confirmed with ``cell_wait``)."""

    def wait_any(self, check, timeout_s: float) -> bool:
        """Block until ``check()`` (a look at this rank's cells through ``cells``) is true, at most ``timeout_s``
        (0: look once); return whether it is.  Every notify to this rank makes the waiter look again."""

    def locked(self, rank: int) -> AbstractContextManager:
        """Hold rank ``rank``'s accumulate lock (atomic tile adds into its windows)."""

    def compile_steps(self, steps: list):
        """A collective's recorded operations (``rank/replay.py``) as an object whose ``run(ledger, start)``
        runs them in one call, each as its primitive would, and returns the index of a wait that did not hold
        within a slice (or the step count); None where there is no such form (every call then runs through
        the primitives)."""


def notify_cell(memory: RankMemory, ledger, buffer_id: int, rank: int, offset: int, value: int, is_set: int,
                word: int, slot: int) -> int:
    """:meth:`RankMemory.notify` for a memory whose cells are not plain shared memory (the ledger's one-call
    form needs their address): the cell operation, then the ledger's step and ring entry."""
    old = (memory.cell_set if is_set else memory.cell_add)(buffer_id, rank, offset, value)
    ledger.step(word)
    ledger.sent(buffer_id, rank, offset, is_set, value, old, slot)
    return old


@dataclass
class HostView:
    """One host tensor argument of a command: where its rank finds it.

    In-process groups (sim, mpi) see the driver's memory and get the ``array`` itself; the shm
    group's ranks are other processes and map ``token`` (a shared file the driver sent them) at
    ``offset`` with ``strides`` (``token`` -1: an empty tensor the rank makes itself).
    """

    shape: tuple
    dtype: str
    writable: bool
    token: int = -1
    offset: int = 0
    strides: tuple | None = None
    array: np.ndarray | None = None

    @functools.cached_property
    def key(self) -> tuple:
        """What identifies the view for a rank that maps it (hashable)."""
        return (self.token, self.offset, tuple(self.shape), self.strides, self.dtype, self.writable)


@dataclass
class SharedHeap:
    """A window arena in a shared file: ``token`` as sent to the ranks, ``data`` the driver's mapping of it."""

    token: int
    stride: int
    data: np.ndarray
    base: int = 0   # where rank 0's heap starts in ``data`` (rank r's at ``base + r * stride``)


@dataclass
class Command:
    """One segment of one dispatch, for a rank group to run.

    A dispatch's tasks are split at the host's sub-worker calls (``boundaries``: their ``seq``);
    segment ``j`` runs the tasks between callback ``j-1`` and callback ``j``, and the ranks keep
    their context (task ids, event log) from one segment of a dispatch to the next.
    """

    number: int                 # the dispatch's number on its worker (segments of a dispatch share it)
    plan_id: int
    plan: DispatchPlan
    boundaries: list
    segment: int
    hosts: list                 # HostView | None per host parameter
    heap: object                # the window arena (the group's own, or a SharedHeap), or None (no windows)
    dfx: object                 # DfxRequest or None
    hang_timeout: float
    blob: bytes | None = None   # shm: the plan pickled by reference, the first time the ranks see it
    maps: list = field(default_factory=list)   # shm: (token, size) of memory sent with this command
    fds: list = field(default_factory=list)    # shm: their descriptors
    drops: list = field(default_factory=list)  # shm: tokens of memory the ranks unmap
    forget_plans: bool = False  # shm: the ranks drop the plans they keep
    scalars: tuple = ()         # the dispatch's scalar arguments by host parameter (None for a tensor): the values
    #                             its plan's ScalarArgs take (one plan serves every value of a scalar passed on)

    @property
    def last(self) -> bool:
        return self.segment == len(self.boundaries)


class Watch(Protocol):
    """A command in progress."""

    error: BaseException | None   # RankError / HangError when it failed
    broken: str | None            # why the group cannot run another command, or None

    def poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds (an in-process group runs the command now); return whether it ended."""

    def interrupt(self, wait_s: float) -> list[dict] | None:
        """The driver was interrupted: stop the ranks, giving them ``wait_s`` to write their records.

        Returns where each rank was before it stopped (``check.hang.rank_state``'s dicts), when known."""


class Arena(Protocol):
    """A window heap of ``stride`` bytes per rank, kept by a group across commands."""

    stride: int
    rows: np.ndarray   # [ranks this process can write, stride] uint8: what the driver zeroes


class RankGroup(Protocol):
    """Ranks started once that run one command after another (a one-shot call is a group used once)."""

    world: int
    device_ids: list
    in_process: bool   # whether the ranks see the driver's memory (HostView.array) or need shared files
    finishes_dfx: bool  # whether running a dispatch's last command also merges its DFX files (else the worker does)
    death_notes: dict

    def new_arena(self, stride: int) -> Arena:
        """A zeroed window heap (in-process groups; the shm worker makes its own shared files).

        Every process of the group calls this in the same order (mpi: a collective)."""

    def submit(self, command: Command) -> Watch:
        """Start ``command`` (an in-process group runs it when the watch is polled)."""

    def reap(self) -> list:
        """The RankFailures of ranks that died while idle."""

    def kill(self) -> None:
        """Stop every rank now; the group runs nothing more."""

    def close(self) -> None:
        """Stop the ranks and free what the group holds; safe to call again."""


class Backend(Protocol):
    """Starts groups of ranks; runs one-shot dispatches."""

    name: str

    def start(self, device_ids: list, objects: dict, startup_timeout_s: float) -> RankGroup:
        """Start a group of ``len(device_ids)`` ranks for a DistributedWorker.

        ``objects``: the functions reachable from the worker's programs, by ``id`` (a group whose
        ranks are forked processes sends plans by reference into this table).
        """

    def run(self, plan, host_arrays: list, config, dfx=None) -> None:
        """Run every rank's tasks once; host tensors are read and written in place.

        ``dfx`` (a ``ptodist.dfx.DfxRequest``) asks each rank to keep an event log
        and write its diagnostic outputs, and the driver to merge them.

        Raises RankError when a rank fails and HangError when the ranks stop
        making progress; on any ending no rank is left running.  (The shm backend also
        takes ``owner=``, the calling CompiledProgram: it keeps that program's idle rank
        processes for its next call, since forking a large driver costs tens of ms; they
        are stopped after an error, an interrupt, a short idle time, the owner's end or exit.)
        """


class RunsNow:
    """The watch of an in-process group's command: the first poll runs it to its end."""

    def __init__(self, run):
        self._run = run
        self.error: BaseException | None = None
        self.broken: str | None = None
        self.done = False

    def interrupt(self, wait_s: float) -> None:
        pass  # the command ran in the interrupted thread: it stopped with it (and said where its ranks were)

    def poll(self, timeout: float) -> bool:
        if not self.done:
            self.done = True
            try:
                self._run()
            except Exception as e:  # noqa: BLE001 - the dispatch fails with it (RankError, HangError, ...)
                self.error = e
        return True


INTERRUPTED_HEAD = "where each rank was when the run was interrupted:"


def note_where(error: BaseException, states: list[dict] | None) -> None:
    """Add where each rank was (``states``: ``check.hang.rank_state``'s, one per rank) to ``error``, the
    interrupt (Ctrl-C; SIGTERM under ``ptodist run``) that cut a run short: Python prints it under the
    traceback, ``ptodist run`` above its last line.  An exception is no interrupt: it is reported as itself."""
    if not states or isinstance(error, Exception):
        return
    text = "\n".join([INTERRUPTED_HEAD, *rank_lines(states)])
    if hasattr(error, "add_note"):
        error.add_note(text)
    else:  # Python 3.10: no notes in tracebacks, but ptodist run prints them
        error.__notes__ = [*getattr(error, "__notes__", ()), text]


def died(note: str, when: str = "") -> str:
    """The message of a rank process that ended without reporting (so without a traceback)."""
    return f"the rank process {note}, without reporting a result (so there is no traceback){when}"


def rank_died(rank: int, device_id: int, task: str | None, note: str, death: Death | None,
              activity: str = "") -> RankFailure:
    """The failure of a rank process that ended without reporting: ``note`` says how it ended (``"was killed by
    signal 11 (SIGSEGV)"``), ``death`` is the record it left (``rank.death``: its last Python line and stack),
    ``activity`` what its status row says it did last (:func:`last_activity`)."""
    if death is None:  # killed from outside (SIGKILL: a kill -9, the OOM killer): nothing more is known
        return RankFailure(rank, device_id, task, "RankDied", died(note, activity), "")
    at = death.at(task)
    if death.exited:
        message = (f"the rank process called {death.cause}{at}, which ends a process at once, without reporting "
                   f"a result{activity}")
    else:
        message = f"the rank process {note}{at}, without reporting a result{activity}"
    error = RankDiedError(message)
    line = at.split(" in ", 1)[0].removeprefix(" at ")
    if death.exited and line:
        error.fix = (f"Remove the {death.cause.split('(')[0]} call at {line}: it ends the rank's process before the "
                     "rank can report, so the dispatch fails without a result or a traceback. Return from the "
                     "kernel instead, or raise an exception (the dispatch then fails with its traceback).")
    elif line:
        error.fix = (f"A native crash ({death.cause}) in the call at {line}: check what that line hands to native "
                     "code (an address or a buffer given to ctypes, a C extension's arguments, an array's size or "
                     "lifetime); the Python stack shows how the rank got there.")
    return RankFailure(rank, device_id, task, "RankDied", message, death.stack(), error)


def last_activity(board: StatusBoard, rank: int, named: bool = False) -> str:
    """What ``rank`` was doing, read off its status row, for a rank that died without reporting.

    Returns text to append to the death's message (``shm.died(note, last_activity(board, r))``):
    ``"; it was running 'k', and its last operation was pld.system.notify at FILE:LINE"``, or ``""`` when
    the row holds nothing (the rank died before its first task); ``named``: the message names the task already.
    """
    row = board.rows[rank]
    task = row["task"].decode(errors="replace")
    op, where = board.last_op(rank)
    if named:
        return f"; its last communication was {op}" + (f" at {where}" if where else "") if op else ""
    if not task and not op:
        return ""
    parts = []
    if task:
        parts.append(f"it was running '{task}'")
    if op:
        parts.append(f"its last operation was {op}" + (f" at {where}" if where else ""))
    elif task:
        parts.append("it had made no communication operation yet")
    return "; " + ", and ".join(parts)
