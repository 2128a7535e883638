"""A rank's signal operations: ``pld.system.notify`` / ``wait`` / ``defer_wait`` and ``pl.system.comm_*`` on a
one-cell INT32 tensor.

``notify`` and ``wait`` are the hot path: the language calls them on the rank context directly; a cell at plain int
offsets is checked in C, the program's line comes from the per-call-site cache, and the cell update with its
bookkeeping is one call of the rank's ledger.
"""

from __future__ import annotations

import enum
import functools

from .. import _atomics
from ..errors import NOTIFY_OP_FIX, KernelValueError, ProgramTypeError, ProgramValueError, classified
from ..language import dtypes as dt
from ..language.control import loop_indices
from ..language.distributed.types import NotifyOp, WaitCmp
from ..language.scalar import Scalar
from ..source import user_frame, user_location
from .events import now_ns
from .memory_calls import _index, _window_bytes
from .status import LAST_OP_CODES, WAIT_CMPS
from .tensors import WindowTensor

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds

_NOTIFY, _WAIT, _DEFER_WAIT = (LAST_OP_CODES[f"pld.system.{n}"] for n in ("notify", "wait", "defer_wait"))
_call_site, _plain_flat = _atomics.call_site, _atomics.flat
_INT32_MIN, _INT32_END = -2**31, 2**31


class SignalCalls:
    """The signal operations of :class:`~ptodist.rank.context.RankContext` (a part of it)."""

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
        if self._coll.recording is not None:
            self._coll.recording.notify(bid, p, byte, v, is_set, word, slot)
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
        elif self._coll.recording is not None:
            self._coll.recording.wait(w, byte, idx, expected, cmp)
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
            if self._coll.recording is not None:
                self._coll.recording.slow = True  # its record may hold the operations of the tasks run meanwhile
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
                self._run.blocked_in = (w, byte, idx, expected, cmp, loc, start, self._run.task_rec, loop_indices())
            while not ok:
                ok, seen = self.memory.cell_wait(w.buffer.id, byte, ge, expected, self.wait_slice_s)
            self._run.blocked_in = None
            self.status.set_running(self.rank, self.task or "")
        self._satisfied((w, byte, idx, expected, cmp, loc), seen, start)

    def _satisfied(self, cond, seen: int, start: int) -> None:
        """A wait returned (its cell held ``seen``): a step of progress, and its record in the event log."""
        self._ledger.step(0)  # _progressed, inline
        if self.events is not None:
            w, byte, idx, expected, cmp, loc = cond
            # A task's deferred wait is that task's actor's, whoever was running when it held.
            actor = self._tasks.cond_actor.pop(id(cond), None) if self._tasks.cond_actor else None
            outer = self.events.actor
            if actor is not None:
                self.events.actor = actor
            # loc: a deferred wait runs at its task's end, but is attributed to its defer_wait line
            self._log("wait", "pld.system.wait", start, where=loc, buffer=w.buffer.name, buffer_id=w.buffer.id,
                      owner=self.rank, cell=[int(i) for i in idx], offset=byte, cmp=cmp.name, expected=expected,
                      seen=seen)
            self.events.actor = outer

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
                    w = self._run.windows.get(key)
                    if w is None:
                        w = self._run.windows[key] = WindowTensor(b.name, b, (b.nbytes // 4,), dt.INT32, self.rank,
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
                    self._run.blocked_in = (w, byte, [i], expected, _CommCmp[cmp], loc, start, self._run.task_rec,
                                       loop_indices())
                self.status.set_waiting(self.rank, w.buffer.id, byte, WAIT_CMPS.index(_CommCmp[cmp].name),
                                        expected, str(loc), what, i)
        if published:
            self._run.blocked_in = None
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


# pl.system.comm_*: the notify modes, the comparisons (and how an event record names them)
_COMM_NOTIFY_OPS = {"atomic_add": NotifyOp.AtomicAdd, "set": NotifyOp.Set}
_COMM_CMPS = {"eq": int.__eq__, "ne": int.__ne__, "gt": int.__gt__, "ge": int.__ge__, "lt": int.__lt__,
              "le": int.__le__}
_CommCmp = {"eq": WaitCmp.Eq, "ge": WaitCmp.Ge}



class _Cmp(enum.Enum):
    """The comparisons of comm_wait / comm_test that pld.WaitCmp lacks, by the name their event record gives."""

    Ne = "ne"
    Gt = "gt"
    Lt = "lt"
    Le = "le"


_CommCmp.update({c.value: c for c in _Cmp})
