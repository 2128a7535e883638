"""Where a rank is: the program lines its operations come from, as slots of the status board's site table.

An operation finds its program line through a per-call-site cache (``RankContext._call_sites``, read by the native
``_atomics.call_site``); what the cache cannot answer is found here, once per call site.  The last operation a rank
began is published as one word (operation code and site slot), for a rank that dies without reporting.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..source import is_internal


@dataclass
class SiteState:
    """The status board's site table as a rank fills it."""

    slot: object  # the board's site_slot(rank, (file, line)) -> that line's slot (-1: the table is full)
    slots: dict = field(default_factory=dict)  # (file, line) -> its slot in the board's site table


class Sites:
    """The call sites and marks of :class:`~ptodist.rank.context.RankContext` (a part of it, with the site
    table's state in ``self._sites``, a :class:`SiteState`)."""

    def _progressed(self) -> None:
        """Count communication progress: the hang detectors watch this word (CPU use alone is not progress)."""
        self._ledger.step(0)

    def _mark(self, op: int, site) -> None:
        """Publish operation ``op`` (a code of ``LAST_OPS``) at ``site`` (``(file, line)``) as the last
        communication operation this rank began.

        The status board keeps it for a rank that dies without reporting (``base.last_activity``);
        operations a collective makes are the collective's (marked once, at the user's call).
        """
        words = self._last_op
        if words is None or self._in_collective or site is None:
            return
        words.value = op | self._site_entry(site)[1]  # last_op and last_site, in one store

    def _site_entry(self, site) -> tuple:
        """``(site, slot word, slot)``: ``site`` (the user's ``(file, line)``, or None), its slot of the board's
        site table (-1: none, or the table is full) and that slot shifted into the ``last_site`` half of the
        last-op word (``op | slot word`` is the word to store)."""
        if site is None:
            return None, 0xFFFFFFFF << 32, -1
        slot = self._sites.slots.get(site)
        if slot is None:
            slot = self._sites.slots[site] = self._sites.slot(self.rank, site)
        return site, (slot & 0xFFFFFFFF) << 32, slot

    def _here(self, frame) -> tuple | None:
        """:meth:`_site_entry` of the program's line at or above ``frame`` (at most four frames up; None when
        there is none: an operation of ptodist's own).

        Cached per call site, by its code and instruction: no stack walk, line number or code hash per
        operation; ptodist's own frames are cached too, as frames to step over.
        """
        sites = self._call_sites
        for _ in range(4):
            if frame is None:
                return None
            code = frame.f_code
            known = sites.get((id(code), frame.f_lasti))
            if known is None:
                name = code.co_filename
                entry = None if is_internal(name) else self._site_entry((name, frame.f_lineno))
                # The entry holds the code object: alive, its id is never another's, so the key stays its own.
                known = sites[(id(code), frame.f_lasti)] = (code, entry)
            if known[1] is not None:
                return known[1]
            frame = frame.f_back
        return None

    def _site_at(self, found, depth: int):
        """:meth:`_here` for what ``_atomics.call_site`` could not answer from the cache: ``found`` is a frame not
        cached yet, None when no program line is within reach, or NotImplemented (before Python 3.11) to look from
        ``depth`` frames above the operation."""
        if found is NotImplemented:
            found = sys._getframe(depth + 1)  # _site_at <- the operation <- ...
        return None if found is None else self._here(found)

    def _step_missed(self, missed, code: int, depth: int) -> None:
        """Finish an operation's step (``code``: of ``LAST_OPS``) that ``Ledger.step_at`` could not take from the
        call-site cache: ``missed`` is what it handed back, the caller's program line ``depth`` frames up."""
        here = self._site_at(missed, depth + 1)
        self._ledger.step(code | here[1] if here is not None else 0)
