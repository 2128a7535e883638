"""The driver's watch over a command: ``CommandWatch`` turns rank failures, deaths and stalls into the
error to raise, and aborts the ranks; ``_Monitor`` applies the one stall rule to the status board.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from ... import _atomics
from ...check.hang import hang_error
from ...compiler.plan import DispatchPlan
from ...errors import HangError, RankError, RankFailure, UsageError
from ...rank.status import RUNNING, WAITING, cell_holds, waited_cells
from ..base import GRACE_S, StallRule, sample_lines
from .memory import ShmMemory, WindowHeap
from .wire import CMD_FAILED

if TYPE_CHECKING:
    from .group import RankGroup

POLL_S = 0.02
STOP_S = 2.0               # ranks that do not stop this long after an abort are killed


class _Monitor:
    """Decides, from the status board, when ranks that stopped making progress hang, and explains it."""

    def __init__(self, memory: ShmMemory, plan: DispatchPlan, pids: dict[int, int], hang_timeout: float):
        self.memory = memory
        self.plan = plan
        self.world = plan.world
        self.pids = pids  # rank -> pid of the ranks still running (read, not owned)
        self.hang_timeout = hang_timeout
        self.rows = memory.status.rows
        self.rule = StallRule(hang_timeout)

    def check(self, done: set[int]) -> None:
        """Raise HangError when the unfinished ranks are certainly blocked, or idle past the timeout."""
        found = self.rule.observe(self.rows["progress"], time.monotonic(), lambda: self._all_blocked(done))
        if found is not None:
            raise self.hang(*found, done)

    def _all_blocked(self, done: set[int]) -> bool:
        pending = [r for r in range(self.world) if r not in done]
        if not pending:
            return False
        others = self.memory.status.others
        for r in pending:
            row = self.rows[r]
            if row["state"] != WAITING:
                return False
            for buffer_id, offset, cmp, expected in waited_cells(row, others[r]):
                if cell_holds(cmp, self.memory.cell_load(buffer_id, r, offset), expected):
                    return False
        return True

    def hang(self, certain: bool, idle: float, done: set[int]) -> HangError:
        """Return the HangError describing every rank's state now (with the lines busy ranks run)."""
        busy = {}
        if not certain:
            running = [r for r in range(self.world) if r not in done and self.rows[r]["state"] == RUNNING]
            busy = sample_lines(self.memory.status, self.pids, running)
        return hang_error(self.plan, self.memory.status, self.memory.cell_load, done, certain, idle,
                          self.hang_timeout, busy)



class CommandWatch:
    """The driver's watch over one command: how it ended (``error``), and whether the group broke.

    ``poll(timeout)`` returns True once every rank has finished the command (or the group had
    to be killed); then ``error`` is the RankError or HangError to raise (None when all went
    well) and ``broken`` says why the group can run nothing more (None while it can).
    """

    def __init__(self, group: RankGroup, index: int, plan: DispatchPlan, heap: WindowHeap | None,
                 hang_timeout: float):
        self.group = group
        self.index = index
        self.plan = plan
        self.target = group.world * (index + 1)
        self.heap = heap
        self.hang_timeout = hang_timeout
        self.monitor: _Monitor | None = None  # made at the first check: most commands end before one
        self.failures: dict[int, RankFailure] = {}
        self.first_failure: float | None = None
        self.aborted_at: float | None = None
        self.hang: HangError | None = None
        self.last_check = time.monotonic()
        self.error: BaseException | None = None
        self.broken: str | None = None
        self.over = False

    def poll(self, timeout: float) -> bool:
        """Watch for at most ``timeout`` seconds; return True when the command is over."""
        group = self.group
        finished = group.finished_addr
        end = time.monotonic() + timeout
        while not self.over:
            n = _atomics.load(finished)
            if n >= self.target:
                self._finish()
                break
            left = end - time.monotonic()
            ok, _ = _atomics.wait(finished, group.driver_sleepers, 1, self.target, group.ctl_spin_s, 0.0,
                                  max(min(POLL_S, left), 0.0))
            if ok:
                continue
            now = time.monotonic()
            if now - self.last_check >= POLL_S:  # a zero-timeout poll (RunHandle.done) checks no more often
                self.last_check = now
                self._check()
            if self.over or time.monotonic() >= end:
                break
        return self.over

    def interrupt(self, wait_s: float) -> list[dict] | None:
        """The driver was interrupted (Ctrl-C, SIGTERM): stop the ranks and give them ``wait_s`` to stop.

        A stopped rank with an event log writes what it recorded (its pending wait included) before it
        reports; the caller kills what is left.  Returns where each rank was (as a hang report says it).
        """
        if self.over:
            return None
        done = self._done()
        where = None
        try:
            where = self._watcher().hang(False, 0.0, done).ranks
        except Exception:  # noqa: BLE001 - a report that cannot be read must not keep the ranks running
            pass
        finally:  # (a second Ctrl-C while busy ranks are asked for their line: they stop all the same)
            self._abort(done)
        end = time.monotonic() + wait_s
        group = self.group
        while time.monotonic() < end and _atomics.load(group.addr(group.layout.finished)) < self.target:
            if group.reap():
                break
            _atomics.wait(group.addr(group.layout.finished), group.driver_sleepers, 1, self.target, 0.0, 0.0,
                          max(min(POLL_S, end - time.monotonic()), 0.0))
        return where

    def _done(self) -> set[int]:
        done = self.group.words("done")
        return {r for r in range(self.group.world) if done[r] == self.index + 1}

    def _check(self) -> None:
        group = self.group
        dead = group.reap()
        if dead:
            for f in dead:
                self.failures.setdefault(f.rank, f)
            self._break(f"rank {dead[0].rank} (device {dead[0].device_id}) died during a dispatch "
                        f"({group.death_notes[dead[0].rank]})")
            return
        now = time.monotonic()
        done = self._done()
        results = group.words("result")
        for r in done:
            if results[r] == CMD_FAILED and r not in self.failures:
                self.failures[r] = group.failure(r)
                self.first_failure = self.first_failure or now
        if self.aborted_at is not None:
            if now - self.aborted_at >= STOP_S:
                stuck = [r for r in range(group.world) if r not in done]
                self._break(f"rank(s) {stuck} did not stop within {STOP_S:g} s after the dispatch was aborted "
                            "and were killed")
            return
        if self.failures:
            if now - self.first_failure >= GRACE_S:
                self._abort(done)
            return
        try:
            self._watcher().check(done)
        except HangError as e:
            self.hang = e
            self._abort(done)

    def _watcher(self) -> _Monitor:
        """The command's hang watch (made at its first use: most commands end before one)."""
        if self.monitor is None:
            group = self.group
            heap = self.heap if self.heap is not None else WindowHeap(group.arena, 0, 0, [], [])
            memory = ShmMemory(group.arena, group.layout, -1, group.world, heap, group.status)
            self.monitor = _Monitor(memory, self.plan, group.pids, self.hang_timeout)
        return self.monitor

    def _abort(self, done: set[int]) -> None:
        group = self.group
        self.aborted_at = time.monotonic()
        # Ranks blocked in a wait see the abort word; ranks busy elsewhere get a signal.
        _atomics.exchange(group.addr(group.layout.abort), group.addr(group.layout.sleepers), self.index + 1)
        for r, pid in group.pids.items():
            if r not in done:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass

    def _finish(self) -> None:
        results = self.group.words("result")
        if any(results.tolist()):  # OK is 0: look rank by rank only when one did not succeed
            for r in range(self.group.world):
                if results[r] == CMD_FAILED and r not in self.failures:
                    self.failures[r] = self.group.failure(r)
        self.over = True
        if self.failures:
            self.error = RankError([self.failures[r] for r in sorted(self.failures)])
        elif self.hang is not None:
            self.error = self.hang

    def _break(self, why: str) -> None:
        self.group.kill()
        self.broken = why
        self.over = True
        if self.failures:
            self.error = RankError([self.failures[r] for r in sorted(self.failures)])
        elif self.hang is not None:
            self.error = self.hang
        else:
            self.error = UsageError(f"the worker's rank processes stopped: {why}. Close the worker and prepare a new "
                                    "one.")
