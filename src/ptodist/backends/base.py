"""The backend protocol: what a backend gives the runtime, and nothing more.

A backend starts ``world`` ranks and runs each one's tasks in a RankContext;
it provides symmetric memory (a window heap per rank), INT32 signal cells with
atomic add/set/load and an efficient, interruptible wait, and a status board
the driver reads to explain hangs.  ``RankMemory`` is the per-rank face of
that; ``Backend.run`` the driver's.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import time
import traceback
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from ..errors import PtodistError, RankFailure
from ..source import is_internal, is_library, is_ptodist, raise_lines

# Rank states on the status board.
IDLE, RUNNING, WAITING, DONE, FAILED = 0, 1, 2, 3, 4
STATE_NAMES = {IDLE: "not started", RUNNING: "running", WAITING: "waiting", DONE: "finished", FAILED: "failed"}

STATUS_DTYPE = np.dtype([
    ("state", np.int32),
    ("wait_buffer", np.int32),
    ("wait_cmp", np.int32),
    ("wait_cell0", np.int32),  # the first index of the cell waited on (often the sender's rank)
    ("samples", np.int32),     # how many times the rank's current line was sampled into ``busy``
    ("progress", np.int64),
    ("wait_offset", np.int64),
    ("wait_expected", np.int64),
    ("since", np.float64),
    ("task", "S64"),
    ("where", "S192"),
    ("what", "S128"),
    ("busy", "S192"),          # the rank's current line when last sampled (a running rank that stalls)
    ("last_op", np.int32),     # the last communication operation the rank began (an index of LAST_OPS; 0: none)
    ("last_site", np.int32),   # its source line, a slot of the rank's site table (-1: unknown)
])

# The operations ``last_op`` names: the ones a rank communicates with (written only by them, so cheaply).
LAST_OPS = ("", "pld.system.notify", "pld.system.wait", "pld.system.defer_wait", "pld.tile.remote_load",
            "pld.tile.remote_store", "pld.tensor.remote_store", "pld.tensor.put", "pld.tensor.get",
            "pld.tensor.barrier", "pld.tensor.allreduce", "pld.tensor.broadcast", "pld.tensor.allgather",
            "pld.tensor.reduce_scatter", "pld.tensor.all_to_all", "pld.tensor.all_to_all_v")
LAST_OP_CODES = {name: i for i, name in enumerate(LAST_OPS)}

# A hang is certain when every unfinished rank has been blocked, with nothing changing, this long.
CERTAIN_HANG_S = 0.5
# A watcher that did not look for this long (it was busy itself) starts timing afresh.
WATCH_GAP_S = 1.0
# How long a driver waits for ranks to answer a request for their current line.
SAMPLE_WAIT_S = 0.5
# The signal that asks a rank process for its current line.
SAMPLE_SIGNAL = signal.SIGUSR2


class Sent(ctypes.Structure):
    """One notify a rank sent, kept for hang reports (which notifies did a blocked cell receive?)."""

    _fields_ = [("seq", ctypes.c_int64), ("offset", ctypes.c_int64), ("buffer", ctypes.c_int32),
                ("owner", ctypes.c_int32), ("op", ctypes.c_int32), ("value", ctypes.c_int32),
                ("old", ctypes.c_int32), ("new", ctypes.c_int32), ("site", ctypes.c_int32), ("pad", ctypes.c_int32)]


HISTORY = 256      # notifies kept per rank (the latest)
SITES = 128        # distinct source lines a rank can name in its history
SITE_BYTES = 200


class StatusBoard:
    """Per rank: a status row, the latest notifies it sent, and the source lines they came from.

    All of it lives in memory the driver can read while the ranks run.
    """

    def __init__(self, raw: np.ndarray, world: int):
        self.world = world
        rows_end = STATUS_DTYPE.itemsize * world
        hist_end = rows_end + ctypes.sizeof(Sent) * HISTORY * world
        self.rows = raw[:rows_end].view(STATUS_DTYPE)  # structured array of STATUS_DTYPE, length world
        base = raw.ctypes.data
        self._history = [(Sent * HISTORY).from_address(base + rows_end + r * ctypes.sizeof(Sent) * HISTORY)
                         for r in range(world)]
        self._sites = raw[hist_end:hist_end + SITES * SITE_BYTES * world].view(f"S{SITE_BYTES}").reshape(world, SITES)
        self._site_index: dict = {}  # in a rank: (file, line) -> slot
        self._seq = 0

    def progress_counter(self, rank: int) -> ctypes.c_int64:
        """Return rank's progress word as a ctypes int: ``.value += 1`` is the cheapest update from Python."""
        addr = self.rows.ctypes.data + rank * STATUS_DTYPE.itemsize + STATUS_DTYPE.fields["progress"][1]
        return ctypes.c_int64.from_address(addr)

    @staticmethod
    def nbytes(world: int) -> int:
        return (STATUS_DTYPE.itemsize + ctypes.sizeof(Sent) * HISTORY + SITES * SITE_BYTES) * world

    def site_slot(self, rank: int, site) -> int:
        """The slot of ``site`` (the user's ``(file, line)``) in rank's site table, added if new; -1 if none."""
        if site is None:
            return -1
        slot = self._site_index.get(site, -1)
        if slot < 0 and len(self._site_index) < SITES:
            slot = self._site_index[site] = len(self._site_index)
            self._sites[rank, slot] = f"{site[0]}:{site[1]}".encode()[-SITE_BYTES:]
        return slot

    def site(self, rank: int, slot: int) -> str:
        """The ``file:line`` in slot ``slot`` of rank's site table ('' for none)."""
        return self._sites[rank, slot].decode(errors="replace") if 0 <= slot < SITES else ""

    def last_op_words(self, rank: int) -> ctypes.c_uint64 | None:
        """Rank's ``last_op`` and ``last_site`` words as one ctypes 64-bit word, ``last_op`` in its low half
        (little-endian): ``.value = op | (slot & 0xFFFFFFFF) << 32`` writes both at once, the cheapest update."""
        if sys.byteorder != "little":  # the one-store update assumes last_op is the low half; not kept elsewhere
            return None
        addr = self.rows.ctypes.data + rank * STATUS_DTYPE.itemsize + STATUS_DTYPE.fields["last_op"][1]
        return ctypes.c_uint64.from_address(addr)

    def last_op(self, rank: int) -> tuple[str, str]:
        """The last communication operation rank began and its ``file:line`` (``('', '')`` for none)."""
        row = self.rows[rank]
        code = int(row["last_op"])
        if not 0 < code < len(LAST_OPS):
            return "", ""
        return LAST_OPS[code], self.site(rank, int(row["last_site"]))

    def record_notify(self, rank: int, buffer: int, owner: int, offset: int, op: int, value: int, old: int,
                      new: int, site) -> None:
        """Keep one sent notify in rank's ring (``site``: the user's ``(file, line)``, or None)."""
        slot = self.site_slot(rank, site)
        self._seq += 1
        e = self._history[rank][self._seq % HISTORY]
        e.offset, e.buffer, e.owner, e.op, e.value, e.old, e.new, e.site = offset, buffer, owner, op, value, old, new, slot
        e.seq = self._seq  # written last: a reader sees whole entries

    def sent(self, rank: int) -> list[dict]:
        """The notifies ``rank`` sent that are still in its ring, oldest first (for the driver)."""
        out = []
        for e in self._history[rank]:
            if e.seq > 0:
                where = self.site(rank, e.site)
                out.append({"seq": e.seq, "rank": rank, "buffer": e.buffer, "owner": e.owner, "offset": e.offset,
                            "op": "Set" if e.op else "AtomicAdd", "value": e.value, "old": e.old, "new": e.new,
                            "where": where})
        return sorted(out, key=lambda d: d["seq"])

    def clear_history(self, rank: int) -> None:
        """Forget the notifies ``rank`` sent so far, and its last operation (a new dispatch on long-lived ranks
        starts afresh)."""
        ctypes.memset(ctypes.addressof(self._history[rank]), 0, ctypes.sizeof(self._history[rank]))
        self.rows[rank]["last_op"] = 0
        self.rows[rank]["last_site"] = -1

    def set_running(self, rank: int, task: str) -> None:
        row = self.rows[rank]
        row["task"] = task.encode()[:64]
        row["state"] = RUNNING
        row["progress"] += 1

    def set_waiting(self, rank: int, buffer_id: int, offset: int, cmp: int, expected: int, where: str,
                    what: str, cell0: int = -1) -> None:
        row = self.rows[rank]
        row["wait_cell0"] = cell0
        row["wait_buffer"] = buffer_id
        row["wait_offset"] = offset
        row["wait_cmp"] = cmp
        row["wait_expected"] = expected
        row["where"] = where.encode()[:192]
        row["what"] = what.encode()[:128]
        row["since"] = time.time()
        row["state"] = WAITING

    def finish(self, rank: int, state: int) -> None:
        self.rows[rank]["state"] = state
        self.rows[rank]["progress"] += 1

    def record_busy(self, rank: int, line: str) -> None:
        """Publish the line ``rank`` is running now (asked for when it stalls without waiting)."""
        row = self.rows[rank]
        row["busy"] = line.encode()[-192:]
        row["samples"] += 1

    def busy_line(self, rank: int) -> str:
        return self.rows[rank]["busy"].decode(errors="replace")


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


def current_line(frame) -> str:
    """The innermost line of the user's program on ``frame``'s stack, as ``file:line in function``.

    A stack with no user frame (ptodist's own code, e.g. a host collective) names its innermost frame.
    """
    inner = frame
    while frame is not None:
        code = frame.f_code
        if not is_internal(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    if inner is None:
        return ""
    return f"{inner.f_code.co_filename}:{inner.f_lineno} in {inner.f_code.co_name}"


def install_line_sampler(board: StatusBoard, rank: int) -> None:
    """In a rank process: answer SAMPLE_SIGNAL by publishing the line the rank is running."""

    def on_sample(signum, frame):
        board.record_busy(rank, current_line(frame))

    signal.signal(SAMPLE_SIGNAL, on_sample)


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

    def cell_add(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        """Atomically add to the INT32 cell at byte ``offset``; return the old value."""

    def cell_set(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        """Atomically overwrite the INT32 cell; return the old value."""

    def cell_load(self, buffer_id: int, rank: int, offset: int) -> int:
        """Return the INT32 cell's current value."""

    def cell_wait(self, buffer_id: int, offset: int, ge: bool, expected: int, timeout_s: float) -> tuple[bool, int]:
        """Block until the local cell is ``== expected`` (or ``>=`` if ``ge``), at most ``timeout_s``."""

    def locked(self, rank: int) -> AbstractContextManager:
        """Hold rank ``rank``'s accumulate lock (atomic tile adds into its windows)."""


class Backend(Protocol):
    """Runs a dispatch plan on ``world`` ranks."""

    name: str

    def run(self, plan, host_arrays: list, config, dfx=None) -> None:
        """Run every rank's tasks; host tensors are read and written in place.

        ``dfx`` (a ``ptodist.dfx.DfxRequest``) asks each rank to keep an event log
        and write its diagnostic outputs, and the driver to merge them.

        Raises RankError when a rank fails and HangError when the ranks stop
        making progress; on any ending no rank is left running.
        """


# Exceptions that say what the machine could not do, not what the code did wrong: never a bug in ptodist.
ENVIRONMENT_ERRORS = (MemoryError, OSError, RecursionError)


def ptodist_bug(e: BaseException) -> traceback.FrameSummary | None:
    """The frame of ptodist's own code that raised ``e`` by mistake, or None when ``e`` is not a bug in ptodist.

    The rule: ``e`` is a bug in ptodist when

    * it is an ``Exception`` but not a ``PtodistError`` (those ptodist raises on purpose), nor one the
      environment causes (``MemoryError``, ``OSError``, ``RecursionError``);
    * the innermost frame of its traceback that is not library code (the standard library, numpy, torch,
      any installed package: frames :func:`ptodist.source.is_library` names) is ptodist's — so an error
      raised in the program's own code, or inside a library the program itself called, is the program's;
    * and that frame did not raise it with a ``raise`` statement of its own: ptodist's language layer
      raises builtin ``TypeError``/``ValueError``/``IndexError``/``ZeroDivisionError`` on purpose for
      values the program got wrong (tiles that do not broadcast, a float index), always with ``raise``.

    So a builtin error that numpy raises for bad data that ptodist handed it without checking counts as
    a bug in ptodist: a check is missing there, and the report must say so (the program's line is still
    in the traceback).
    """
    if not isinstance(e, Exception) or isinstance(e, (PtodistError, *ENVIRONMENT_ERRORS)):
        return None
    frames = traceback.extract_tb(e.__traceback__)
    for i in range(len(frames) - 1, -1, -1):
        f = frames[i]
        if is_ptodist(f.filename):
            if i == len(frames) - 1 and f.lineno in raise_lines(f.filename):
                return None  # raised on purpose
            return f
        if not is_library(f.filename):
            return None  # the program's own code, or a library it called itself
    return None


def user_traceback(e: BaseException) -> str:
    """Format the rank's traceback; for errors ptodist raised on purpose, without ptodist's own frames.

    For a bug in ptodist (:func:`ptodist_bug`) every frame is kept.
    """
    frames = traceback.extract_tb(e.__traceback__)
    innermost_is_user = bool(frames) and not is_internal(frames[-1].filename)
    if isinstance(e, PtodistError) or (innermost_is_user and ptodist_bug(e) is None):
        frames = traceback.StackSummary.from_list([f for f in frames if not is_internal(f.filename)])
    lines = ["Traceback (most recent call last):\n", *frames.format(),
             *traceback.format_exception_only(type(e), e)]
    return "".join(lines)


def rank_failure(plan, rank: int, task: str | None, e: BaseException) -> RankFailure:
    """What a rank reports when ``e`` escaped its tasks: the traceback as text, the exception when it pickles.

    ``internal`` says whether ``e`` is a bug in ptodist (:func:`ptodist_bug`)."""
    tb = user_traceback(e)
    exc = e if isinstance(e, PtodistError) or type(e).__module__ == "builtins" else None
    try:
        exc = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - exceptions that do not survive pickling travel as text only
        exc = None
    return RankFailure(rank, plan.device_ids[rank], task, type(e).__name__, str(e), tb, exc,
                       internal=ptodist_bug(e) is not None)


def last_activity(board: StatusBoard, rank: int) -> str:
    """What ``rank`` was doing, read off its status row, for a rank that died without reporting.

    Returns text to append to the death's message (``shm.died(note, last_activity(board, r))``):
    ``"; it was running 'k', and its last operation was pld.system.notify at FILE:LINE"``, or ``""`` when
    the row holds nothing (the rank died before its first task).
    """
    row = board.rows[rank]
    task = row["task"].decode(errors="replace")
    op, where = board.last_op(rank)
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
