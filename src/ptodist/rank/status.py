"""The status board: what each rank publishes about itself while it runs, for the driver to read.

One row per rank (state, task, the wait it is blocked in, its progress word, the line it was last
sampled at, its last communication operation), the other waits of a rank that waits for whichever of
several deferred waits holds first, and each rank's ring of the latest notifies it sent.
Ranks write their own row only; the driver (``backends/``) reads every row to detect and explain hangs.
"""

from __future__ import annotations

import ctypes
import functools
import signal
import sys
import time

import numpy as np

from .. import _atomics
from ..collectives.registry import REGISTRY as COLLECTIVES
from ..source import is_internal, is_library

# The signal that asks a rank process for its current line.
SAMPLE_SIGNAL = signal.SIGUSR2

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
    ("wait_others", np.int32),  # how many more waits the rank waits on at once (any one that holds ends the wait);
                                # the first OTHER_WAITS of them are in its rows of ``others``
    ("edge_where", "S192"),    # a task queued behind the waiting task by an implicit overlap edge: its submit line
    ("edge", "S1024"),         # and what the edge is (empty when there is none)
])

# A rank blocked until any of its pending deferred waits holds: the row holds the oldest, these the next ones.
OTHER_WAITS = 16
OTHER_DTYPE = np.dtype([
    ("buffer", np.int32),
    ("cmp", np.int32),
    ("cell0", np.int32),
    ("pad", np.int32),
    ("offset", np.int64),
    ("expected", np.int64),
    ("where", "S192"),
    ("what", "S128"),
])

# The operations ``last_op`` names: the ones a rank communicates with (written only by them, so cheaply).
# A collective's own notifies, waits and RMA are not marked: the rank's last operation is the collective.
LAST_OPS = ("", "pld.system.notify", "pld.system.wait", "pld.system.defer_wait", "pld.tile.remote_load",
            "pld.tile.remote_store", "pld.tensor.remote_store", "pld.tensor.put", "pld.tensor.get",
            *(c.op_name for c in COLLECTIVES.values()))
LAST_OP_CODES = {name: i for i, name in enumerate(LAST_OPS)}

class Sent(ctypes.Structure):
    """One notify a rank sent, kept for hang reports (which notifies did a blocked cell receive?)."""

    _fields_ = [("seq", ctypes.c_int64), ("offset", ctypes.c_int64), ("buffer", ctypes.c_int32),
                ("owner", ctypes.c_int32), ("op", ctypes.c_int32), ("value", ctypes.c_int32),
                ("old", ctypes.c_int32), ("new", ctypes.c_int32), ("site", ctypes.c_int32), ("pad", ctypes.c_int32)]


# _atomics.Ledger writes these entries; the layout it assumes:
assert ctypes.sizeof(Sent) == 48 and Sent.offset.offset == 8 and Sent.buffer.offset == 16 and Sent.site.offset == 40

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
        others_end = rows_end + OTHER_DTYPE.itemsize * OTHER_WAITS * world
        hist_end = others_end + ctypes.sizeof(Sent) * HISTORY * world
        self.rows = raw[:rows_end].view(STATUS_DTYPE)  # structured array of STATUS_DTYPE, length world
        # [world, OTHER_WAITS] of OTHER_DTYPE: right after the rows, so that reading a rank's row and its other
        # waits is one contiguous read (mpi's watchers read them remotely)
        self.others = raw[rows_end:others_end].view(OTHER_DTYPE).reshape(world, OTHER_WAITS)
        base = raw.ctypes.data
        self._history = [(Sent * HISTORY).from_address(base + others_end + r * ctypes.sizeof(Sent) * HISTORY)
                         for r in range(world)]
        self._sites = raw[hist_end:hist_end + SITES * SITE_BYTES * world].view(f"S{SITE_BYTES}").reshape(world, SITES)
        self._site_index: dict = {}  # in a rank: (file, line) -> slot
        self._ledgers: dict = {}  # rank -> its _atomics.Ledger, made on first use
        self._row_words: dict[int, tuple] = {}  # rank -> what _words made for it
        self._wait_row_words: dict[int, tuple] = {}  # rank -> what _wait_words made for it
        self._edged: set[int] = set()  # in a rank: ranks whose row holds an edge (cleared at the next wait)

    def progress_counter(self, rank: int) -> ctypes.c_int64:
        """Rank's progress word as a ctypes int (made once per rank; the rank's ledger, ``set_running`` and ``finish``
        write it, the driver's hang detection reads it)."""
        return self._words(rank)[1]

    @staticmethod
    def nbytes(world: int) -> int:
        return (STATUS_DTYPE.itemsize + OTHER_DTYPE.itemsize * OTHER_WAITS + ctypes.sizeof(Sent) * HISTORY
                + SITES * SITE_BYTES) * world

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
        (little-endian): ``.value = op | (slot & 0xFFFFFFFF) << 32`` writes both at once, the cheapest update.
        None on a big-endian machine (the one-store update assumes last_op is the low half)."""
        return self._words(rank)[3]

    def last_op(self, rank: int) -> tuple[str, str]:
        """The last communication operation rank began and its ``file:line`` (``('', '')`` for none)."""
        row = self.rows[rank]
        code = int(row["last_op"])
        if not 0 < code < len(LAST_OPS):
            return "", ""
        return LAST_OPS[code], self.site(rank, int(row["last_site"]))

    def ledger(self, rank: int, last_op: bool = True):
        """Rank's progress word, last-operation word (unless ``last_op`` is False) and ring of sent notifies,
        updated by one C call per operation (``_atomics.Ledger``); one per rank and board, so that the ring's
        sequence numbers stay in order."""
        ledger = self._ledgers.get(rank)
        if ledger is None:
            last_op = self.last_op_words(rank) if last_op else None
            ledger = self._ledgers[rank] = _atomics.Ledger(
                ctypes.addressof(self.progress_counter(rank)), ctypes.addressof(last_op) if last_op is not None else 0,
                ctypes.addressof(self._history[rank]), HISTORY)
        return ledger

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
        last_op = self._words(rank)[3]
        if last_op is not None:
            last_op.value = 0xFFFFFFFF << 32  # last_op 0 (none), last_site -1, in one store
        else:
            self.rows[rank]["last_op"] = 0
            self.rows[rank]["last_site"] = -1

    def _words(self, rank: int) -> tuple:
        """Rank's ``state`` and ``progress`` words and ``task`` field as ctypes objects, and its last-op words
        (:meth:`last_op_words`), made at the rank's first update.

        A rank writes them at every task of every dispatch; a store through a ctypes object costs a fraction
        of an item assignment on a structured row.
        """
        words = self._row_words.get(rank)
        if words is None:
            row = self.rows.ctypes.data + rank * STATUS_DTYPE.itemsize
            at = STATUS_DTYPE.fields
            last_op = ctypes.c_uint64.from_address(row + at["last_op"][1]) if sys.byteorder == "little" else None
            words = self._row_words[rank] = (
                ctypes.c_int32.from_address(row + at["state"][1]), ctypes.c_int64.from_address(row + at["progress"][1]),
                (ctypes.c_char * at["task"][0].itemsize).from_address(row + at["task"][1]), last_op)
        return words

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def _task_field(task: str, size: int) -> bytes:
        """``task`` as the ``size`` bytes of a ``task`` field, zero-padded (encoded once per name)."""
        return task.encode()[:size].ljust(size, b"\0")

    def set_running(self, rank: int, task: str) -> None:
        state, progress, field, _ = self._words(rank)
        field.raw = self._task_field(task, len(field))
        state.value = RUNNING
        progress.value += 1

    def set_waiting(self, rank: int, buffer_id: int, offset: int, cmp: int, expected: int, where: str,
                    what: str, cell0: int = -1, others=(), more: int = 0, task: str | None = None,
                    edge: tuple[str, str] | None = None) -> None:
        """Publish that ``rank`` waits on a cell; ``others``: more waits it waits on at the same time, any one
        of which ends the wait (``(buffer_id, offset, cmp, expected, where, what, cell0)``, at most
        OTHER_WAITS are kept), ``more`` of them in all; ``task``: the task the wait belongs to, when it is
        not the one the row names (a deferred wait's); ``edge``: ``(submit line, text)`` of a task queued
        behind a waiting task by an implicit overlap edge."""
        if edge is not None or rank in self._edged:
            row = self.rows[rank]
            row["edge_where"], row["edge"] = (edge[0].encode()[:192], edge[1].encode()[:1024]) if edge else (b"", b"")
            if edge is None:
                self._edged.discard(rank)
            else:
                self._edged.add(rank)
        fields = self._wait_words(rank)
        if task is not None:
            field = self._words(rank)[2]
            field.raw = self._task_field(task, len(field))
        for field, value in zip(fields, (cell0, buffer_id, offset, cmp, expected, time.time(), more)):
            field.value = value
        for field, text in zip(fields[7:], (where, what)):
            size = len(field)
            field.raw = text.encode()[:size].ljust(size, b"\0")
        if more:
            table = self.others[rank]
            for i, (b, off, c, exp, at, text, c0) in enumerate(others[:OTHER_WAITS]):
                table[i] = (b, c, c0, 0, off, exp, at.encode()[:192], text.encode()[:128])
        self._words(rank)[0].value = WAITING  # last: a reader that sees the state finds the wait written

    def _wait_words(self, rank: int) -> tuple:
        """Rank's ``wait_cell0``, ``wait_buffer``, ``wait_offset``, ``wait_cmp``, ``wait_expected``, ``since``,
        ``wait_others``, ``where`` and ``what`` fields as ctypes objects (a rank writes them at every wait that
        blocks)."""
        words = self._wait_row_words.get(rank)
        if words is None:
            row = self.rows.ctypes.data + rank * STATUS_DTYPE.itemsize
            at = STATUS_DTYPE.fields
            kinds = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
                     np.dtype(np.float64): ctypes.c_double}
            words = self._wait_row_words[rank] = tuple(
                (kinds.get(at[name][0]) or ctypes.c_char * at[name][0].itemsize).from_address(row + at[name][1])
                for name in ("wait_cell0", "wait_buffer", "wait_offset", "wait_cmp", "wait_expected", "since",
                             "wait_others", "where", "what"))
        return words

    def finish(self, rank: int, state: int) -> None:
        word, progress, _, _ = self._words(rank)
        word.value = state
        progress.value += 1

    def record_busy(self, rank: int, line: str) -> None:
        """Publish the line ``rank`` is running now (asked for when it stalls without waiting)."""
        row = self.rows[rank]
        row["busy"] = line.encode()[-192:]
        row["samples"] += 1

    def busy_line(self, rank: int) -> str:
        return self.rows[rank]["busy"].decode(errors="replace")


# A status row's wait_cmp: how the cell compares with the expected value (pld.WaitCmp's Eq and Ge; the others
# are pl.system.comm_wait's), by code.
WAIT_CMPS = ("Eq", "Ge", "Ne", "Lt", "Le", "Gt")
_CMP_TESTS = (int.__eq__, int.__ge__, int.__ne__, int.__lt__, int.__le__, int.__gt__)


def cell_holds(cmp: int, value: int, expected: int) -> bool:
    """Whether a cell holding ``value`` ends a wait with comparison code ``cmp`` (of ``WAIT_CMPS``)."""
    return _CMP_TESTS[cmp](value, expected)


def waited_cells(row, others) -> list[tuple[int, int, int, int]]:
    """The cells a waiting rank's status row (and its rows of ``others``) says it waits on, any one of which
    ends its wait: ``(buffer_id, byte offset, comparison code, expected)``, the row's first."""
    cells = [(int(row["wait_buffer"]), int(row["wait_offset"]), int(row["wait_cmp"]), int(row["wait_expected"]))]
    for o in others[:min(int(row["wait_others"]), OTHER_WAITS)]:
        cells.append((int(o["buffer"]), int(o["offset"]), int(o["cmp"]), int(o["expected"])))
    return cells


def current_line(frame) -> str:
    """The innermost line of the user's program on ``frame``'s stack, as ``file:line in function``.

    Library frames are passed over as ptodist's are: a rank sampled inside numpy, under a ``pl.read`` of its
    spin loop, is running the loop's line.  A stack with no program frame names its innermost frame outside
    ptodist (a library the rank called), else its innermost frame (ptodist's own code, e.g. a host collective).
    """
    inner, library = frame, None
    while frame is not None:
        name = frame.f_code.co_filename
        if not is_internal(name):
            if not is_library(name):
                return _line(frame)
            library = library or frame
        frame = frame.f_back
    pick = library or inner
    return "" if pick is None else _line(pick)


def _line(frame) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def install_line_sampler(board: StatusBoard, rank: int) -> None:
    """In a rank process: answer SAMPLE_SIGNAL by publishing the line the rank is running."""

    def on_sample(signum, frame):
        board.record_busy(rank, current_line(frame))

    signal.signal(SAMPLE_SIGNAL, on_sample)
