"""A rank waiting for any of its tasks' deferred waits: polled, blocked on, published on the status board.

The task graph (``rank/tasks.py``) keeps the pending deferred waits; it asks the rank context whether one holds
and to block until some do.  A wait that lasts past its first slice is published for a hang report, with a task
queued behind the one that waits, when an implicit overlap edge makes the two wait for each other.
"""

from __future__ import annotations

import itertools

from ..language.control import loop_indices
from ..language.distributed.types import WaitCmp
from ..source import user_location
from .events import now_ns
from .status import OTHER_WAITS, WAIT_CMPS
from .tasks import buffer_key, overlap


def _site_text(site) -> str:
    """A task's submit line (:attr:`Task.site`) as ``file:line``."""
    if isinstance(site, tuple):
        code, line = site
        return f"{code.co_filename}:{line}"
    return str(site) if site else "?"


_TESTS = {"Eq": int.__eq__, "Ge": int.__ge__, "Ne": int.__ne__, "Lt": int.__lt__, "Le": int.__le__,
          "Gt": int.__gt__}  # a wait's comparison (WaitCmp or _Cmp) by name: whether a cell's value satisfies it


class Waiting:
    """The deferred-wait machinery of :class:`~ptodist.rank.context.RankContext` (a part of it)."""

    def condition_holds(self, cond) -> bool:
        """Poll a deferred wait without blocking; once it holds it is recorded like a wait that returned."""
        w, byte, _idx, expected, cmp, _loc = cond
        start = now_ns() if self.events is not None else 0
        ok, seen = self.memory.cell_wait(w.buffer.id, byte, cmp is WaitCmp.Ge, expected, 0.0)
        if ok:
            self._satisfied(cond, seen, start)
        return ok

    @staticmethod
    def watched(cond) -> tuple[int, int, int, bool]:
        """The cell a deferred wait watches: buffer id, INT32 cell index in the buffer, expected, whether ``>=``."""
        w, byte, _idx, expected, cmp, _loc = cond
        return w.buffer.id, byte >> 2, expected, cmp is WaitCmp.Ge

    def block_until_any(self, pending, own=None) -> list:
        """Block until some of ``pending`` (the task graph's deferred waits) hold; return those that do, oldest
        first, each recorded as a wait that returned (the checker joins the clocks of the notifies it needed).

        Every pending wait's cell is looked at in one vectorised pass per signal buffer (``PendingWaits``), and
        the backend's ``wait_any`` sleeps until a notify to this rank; a hit is confirmed with the backend's
        atomic read (an ``Eq`` cell may have moved on since the look).  A wait that lasts past its first slice
        is published on the status board: the oldest pending wait in the row, the next ones with it.

        ``own``: a wait of the rank's own, ``(w, byte, idx, expected, cmp, loc, what)``, that ends the block
        too, and is the one published in the row: the rank blocks in it while its tasks' deferred waits go on
        completing (on a device the scheduler completes them while a core waits).  Returns [] when it holds
        first (the caller confirms it).
        """
        memory, cells = self.memory, self.memory.cells
        start = now_ns() if self.events is not None else 0
        own_holds = None
        if own is not None:
            own_id, own_cell, own_expected, own_test = own[0].buffer.id, own[1] >> 2, own[3], _TESTS[own[4].name]

            def own_holds() -> bool:
                return own_test(int(cells(own_id)[own_cell]), own_expected)

        def check() -> bool:
            return (own_holds is not None and own_holds()) or pending.any_holds(cells)

        published = False
        while True:
            if own_holds is not None and own_holds():
                found = ()
            else:
                found = pending.holding(cells)
                if not found:
                    if published:
                        memory.wait_any(check, self.wait_slice_s)
                    elif not memory.wait_any(check, self.wait_slice_s):
                        self._publish_pending(pending, start, own)
                        published = True
                    continue
            if published:
                published = False
                self._run.blocked_in = None
                self.status.set_running(self.rank, self.task or "")
            if not found:
                return []
            held = []
            for d in found:
                w, byte, _idx, expected, cmp, _loc = d.cond
                ok, seen = memory.cell_wait(w.buffer.id, byte, cmp is WaitCmp.Ge, expected, 0.0)
                if ok:
                    self._satisfied(d.cond, seen, start)
                    held.append(d)
            if held:
                return held

    def _publish_pending(self, pending, start: int, own=None) -> None:
        """Say on the status board that this rank waits until any of ``pending`` holds (for a hang report); with
        ``own`` (a wait of its own, see block_until_any), that it waits in that one, the pending ones beside it."""
        here = user_location(3)

        def described(cond) -> tuple:
            w, byte, idx, expected, cmp, loc = cond
            cell = [int(i) for i in idx]
            return (w.buffer.id, byte, int(cmp is WaitCmp.Ge), expected, str(loc or here),
                    f"pld.system.defer_wait on '{w.name}' (buffer '{w.buffer.name}') cell {cell}",
                    cell[0] if cell else -1)

        edge = self._queued_edge(pending)
        if own is not None:
            w, byte, idx, expected, cmp, loc, what = own
            others = [described(d.cond) for d in pending.oldest(OTHER_WAITS)]
            self.status.set_waiting(self.rank, w.buffer.id, byte, WAIT_CMPS.index(cmp.name), expected, str(loc), what,
                                    int(idx[0]) if len(idx) else -1, others=others, more=len(pending),
                                    task=self.task or "", edge=edge)
            if self.events is not None:
                self._run.blocked_in = (w, byte, idx, expected, cmp, loc, start, self._run.task_rec, loop_indices())
            return
        first, *others = pending.oldest(1 + OTHER_WAITS)
        buffer_id, byte, ge, expected, where, what, cell0 = described(first.cond)
        self.status.set_waiting(self.rank, buffer_id, byte, ge, expected, where, what, cell0,
                                others=[described(d.cond) for d in others], more=len(pending) - 1,
                                task=first.task.name, edge=edge)
        if self.events is not None:
            w, byte, idx, expected, cmp, loc = first.cond
            self._run.blocked_in = (w, byte, idx, expected, cmp, loc or here, start, self._run.task_rec, loop_indices())

    def _queued_edge(self, pending) -> tuple[str, str] | None:
        """A task queued behind an incomplete one by an implicit overlap edge on the signal the incomplete one's
        deferred wait watches, as ``(its submit line, what the edge is)``; None when there is none.

        Only when the rank blocks past its first slice: the tasks' lines are resolved here, not at submission.
        The queued task may be what would satisfy the wait (its notify, or a peer's that answers it): then the
        two wait for each other, a deadlock no notify order explains.
        """
        # Bounded (the first 256 queued tasks, the 16 oldest waits): a rank on sim publishes at every block.
        queued = [t for t in itertools.islice(self.graph.waiting.values(), 256) if not t.manual and t.buffers]
        if not queued:
            return None
        for d in pending.oldest(16):
            waiter, w = d.task, d.cond[0]
            signal = [buffer_key(w)]
            for t in queued:
                if t in waiter.dependants and waiter.tid not in t.deps and overlap(t.buffers, signal):
                    at, waiter_at = _site_text(t.site), _site_text(waiter.site)
                    loc = d.cond[-1]
                    return at, (f"task '{t.name}' (submitted at {at}) takes '{w.name}' (buffer '{w.buffer.name}'), "
                                f"as does task '{waiter.name}' (submitted at {waiter_at}), whose "
                                f"pld.system.defer_wait{f' at {loc}' if loc else ''} watches it; outside a "
                                f"pl.manual_scope a task shares a tensor with an earlier unfinished one only after "
                                f"it completes, so '{t.name}' is queued until that deferred wait holds")
        return None
