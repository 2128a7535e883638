"""A host orchestrator's collective, recorded on its first run and replayed in one native call after.

The first call of a builtin collective (one line, the same windows and options) runs its algorithm through
the primitives, as every call used to.  While it runs, each notify, wait, put and get also records what it
did to memory: the cell and value, the cell and threshold, the regions it moved.  When the backend's memory
has a native form of that record (shm: ``Ledger.run_steps``), later calls replay it: the same atomics and
wake-ups, the same progress steps and ring of sent notifies, the same element-wise adds under the owner's
accumulate lock, in the same order, without a Python call per operation.  A wait that does not hold within
a slice is handed back and waited for the primitive's way (``_block_until``: published for a hang report,
an abort answered, the rank's ready tasks run), and the replay resumes after it.

A record is replayed only where it is the whole truth:

* the collective declares a fixed schedule (``fixed_schedule`` in its registry entry): what a rank does
  depends on the call's arguments and options, never on data (all_to_all_v's counts are data);
* every operation of the run stepped the rank's progress word once and was recorded, and none was of a kind
  the record cannot hold (a ``remote_load``, a tile store): otherwise the call is never replayed;
* no event log or access checker watches the rank (they see each primitive as it runs), and the record
  addresses the memory it runs on: it stays with the rank context that made it, whose windows and host
  views it recorded, and a long-lived rank passes it on only to the next dispatches of the same command
  (the same window heap and host views), kept by call and the dispatch's scalar arguments (which a call's
  arguments may be made of).

A first run whose wait outlasted a slice is not kept (the rank may have run other tasks meanwhile): the next
call records again.
"""

from __future__ import annotations

from ..language.distributed.types import WaitCmp


class Recording:
    """What one run of a collective did, operation by operation (``steps``, in the form the memory's
    ``compile_steps`` takes), with each wait's arguments for ``_block_until`` by step index."""

    __slots__ = ("steps", "waits", "unfit", "slow")

    def __init__(self) -> None:
        self.steps: list[tuple] = []
        self.waits: dict[int, tuple] = {}
        self.unfit: str | None = None  # an operation the record cannot hold: never replayed
        self.slow = False  # a wait outlasted its first slice: record again next time

    def notify(self, buffer_id: int, rank: int, byte: int, value: int, is_set: int, word: int, slot: int) -> None:
        if word:  # a collective's notifies leave the last-operation word to its mark
            self.unfit = "a notify with a last-operation word"
        self.steps.append(("notify", buffer_id, rank, byte, value, is_set, slot))

    def wait(self, w, byte: int, idx, expected: int, cmp) -> None:
        self.waits[len(self.steps)] = (w, byte, idx, expected, cmp)
        self.steps.append(("wait", w.buffer.id, byte, cmp is WaitCmp.Ge, expected))

    def moved(self, dst, src, add: bool, owner: int | None) -> None:
        """A put or get: ``dst[...] = src``, or with ``add`` ``dst[...] += src`` under ``owner``'s accumulate lock
        (None: no lock, private memory)."""
        self.steps.append(("add", dst, src, owner) if add else ("copy", dst, src))


class Replay:
    """Recording and replaying the host orchestrator's collectives: a part of
    :class:`~ptodist.rank.context.RankContext` (its record lives in ``self._coll``)."""

    def _recorded(self, call, group: tuple, site: tuple):
        """Run ``call`` through the primitives, recording it; return its replay ``(steps, waits)``, False
        when it is not to be replayed, or None when this run cannot tell (record again)."""
        rec = self._coll.recording = Recording()
        before = self._ledger.steps()
        try:
            self._run_collective(call, group, True, site)
        finally:
            self._coll.recording = None
        if rec.slow:
            return None
        if rec.unfit is not None or self._ledger.steps() - before != len(rec.steps):
            return False
        steps = self.memory.compile_steps(rec.steps)
        return False if steps is None else (steps, rec.waits)

    def _replayed(self, replay) -> None:
        """Run a recorded collective natively; a wait that outlasts a slice is waited for the primitive's way."""
        steps, waits = replay
        ledger = self._ledger
        at = steps.run(ledger, 0)
        while at < steps.count:
            self._block_until(*waits[at], None)
            at = steps.run(ledger, at + 1)
