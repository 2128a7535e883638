"""The deferred waits a rank's incomplete tasks still wait for, checked all at once.

A task that registered ``pld.system.defer_wait`` conditions that did not hold when it ran is
incomplete; each pending condition is one :class:`Deferred` here.  When no task is ready the rank
blocks until *any* of them holds (a device's scheduler waits for whichever completes first), so it
must tell quickly which of possibly thousands hold.  The conditions are kept in numpy arrays by
signal buffer and comparison (the watched cell's index and the expected value), and one pass per
group gathers the watched cells of the rank's copy of the buffer and compares them: the rank
context reads the cells (``cells(buffer_id)``: an INT32 array of the buffer as it is now) and
confirms each hit with the backend's own atomic read before it counts.

A condition that held is dropped by overwriting its expected value with one no INT32 cell reaches
(``>= 2**40`` never holds; ``== 2**40`` neither), so a pass needs no mask; a group's arrays are
compacted once half of them are dropped, so the work per condition stays bounded.  Age (the order the conditions were
added: the order their tasks ran, then the order of the ``defer_wait`` calls) orders what holds.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

_NEVER = 1 << 40  # an expected value no INT32 cell is >= or == to: a dropped condition
_MIN_ROOM = 16  # a group's smallest arrays; it is compacted only past this many dropped slots


class Deferred:
    """One pending deferred wait: its condition (as the rank context made it), its task, its age."""

    __slots__ = ("cond", "task", "seq", "group", "slot")

    def __init__(self, cond, task, seq: int, group: _Group, slot: int):
        self.cond = cond
        self.task = task
        self.seq = seq
        self.group = group  # None once dropped
        self.slot = slot

    @property
    def watched(self) -> bool:
        """Whether it is still pending (not dropped)."""
        return self.group is not None


class _Group:
    """The pending conditions on one signal buffer with one comparison: cell indexes and expected values."""

    __slots__ = ("buffer_id", "ge", "cells", "expected", "entries", "dropped", "first")

    def __init__(self, buffer_id: int, ge: bool):
        self.buffer_id = buffer_id
        self.ge = ge
        self.cells = np.zeros(_MIN_ROOM, np.int64)
        self.expected = np.full(_MIN_ROOM, _NEVER, np.int64)
        self.entries: list = []  # Deferred by slot, None where dropped; oldest first
        self.dropped = 0
        self.first = 0  # no live slot before this one

    def live(self):
        """The live entries, oldest first."""
        entries = self.entries
        while entries[self.first] is None:  # a group with no live entry is gone: this stops
            self.first += 1
        return (d for d in itertools.islice(entries, self.first, None) if d is not None)

    def add(self, d: Deferred, cell: int, expected: int) -> None:
        n = len(self.entries)
        if n == len(self.cells):
            self.cells = np.concatenate([self.cells, np.zeros(n, np.int64)])
            self.expected = np.concatenate([self.expected, np.full(n, _NEVER, np.int64)])
        self.cells[n] = cell
        self.expected[n] = expected
        self.entries.append(d)

    def holds(self, values: np.ndarray) -> np.ndarray:
        """Per slot, whether the cell ``values`` (the buffer's cells as INT32) satisfy its condition."""
        n = len(self.entries)
        seen = values[self.cells[:n]]
        return seen >= self.expected[:n] if self.ge else seen == self.expected[:n]

    def compact(self) -> None:
        """Forget the dropped slots (keeping the order: oldest first)."""
        keep = [i for i, d in enumerate(self.entries) if d is not None]
        room = max(_MIN_ROOM, 2 * len(keep))
        cells, expected = np.zeros(room, np.int64), np.full(room, _NEVER, np.int64)
        cells[:len(keep)] = self.cells[keep]
        expected[:len(keep)] = self.expected[keep]
        self.cells, self.expected = cells, expected
        self.entries = [self.entries[i] for i in keep]
        for slot, d in enumerate(self.entries):
            d.slot = slot
        self.dropped = 0
        self.first = 0


class PendingWaits:
    """The pending deferred waits of one rank, by signal buffer and comparison."""

    def __init__(self):
        self._groups: dict[tuple[int, bool], _Group] = {}
        self._seq = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, cond, task, buffer_id: int, cell: int, expected: int, ge: bool) -> Deferred:
        """Watch ``cond`` of ``task``: cell index ``cell`` (INT32 cells from the buffer's start) of buffer
        ``buffer_id`` reaching ``expected`` (``>=`` when ``ge``, else ``==``)."""
        key = (buffer_id, ge)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(buffer_id, ge)
        d = Deferred(cond, task, self._seq, group, len(group.entries))
        self._seq += 1
        group.add(d, cell, expected)
        self._count += 1
        return d

    def drop(self, d: Deferred) -> None:
        """Stop watching ``d`` (it held)."""
        group = d.group
        if group is None:
            return
        group.expected[d.slot] = _NEVER
        group.entries[d.slot] = None
        d.group = None
        group.dropped += 1
        self._count -= 1
        if group.dropped == len(group.entries):
            del self._groups[(group.buffer_id, group.ge)]
        elif group.dropped > _MIN_ROOM and 2 * group.dropped > len(group.entries):
            group.compact()

    def holding(self, cells) -> list[Deferred]:
        """The watched conditions that hold in the cells ``cells(buffer_id)`` gives, oldest first."""
        found: list = []
        for group in self._groups.values():
            slots = np.flatnonzero(group.holds(cells(group.buffer_id)))
            if len(slots):
                entries = group.entries
                found.append([entries[i] for i in slots])
        if len(found) == 1:
            return found[0]
        return list(heapq.merge(*found, key=_age))

    def any_holds(self, cells) -> bool:
        """Whether some watched condition holds in the cells ``cells(buffer_id)`` gives."""
        for group in self._groups.values():
            if group.holds(cells(group.buffer_id)).any():
                return True
        return False

    def oldest(self, k: int) -> list[Deferred]:
        """The ``k`` oldest watched conditions, oldest first (what a hang report lists)."""
        live = [group.live() for group in self._groups.values()]
        out = []
        for d in heapq.merge(*live, key=_age):
            out.append(d)
            if len(out) == k:
                break
        return out


def _age(d: Deferred) -> int:
    return d.seq
