"""Watching the job from inside a rank: the abort word, hangs, peer processes that vanish, the launcher's
SIGTERM, and the pulse thread that keeps MPI progressing while the rank computes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ...rank.body import RankStopped
from ...rank.status import (
    DONE,
    FAILED,
    OTHER_DTYPE,
    RUNNING,
    STATUS_DTYPE,
    WAITING,
    StatusBoard,
    cell_holds,
    current_line,
    waited_cells,
)
from ..base import GRACE_S, StallRule
from .agree import _say
from .layout import (
    CHECK_S,
    CTL_ABORT,
    CTL_ARRIVED,
    CTL_BOARD,
    CTL_ENDER,
    CTL_HANG,
    CTL_PEEK_END,
    END_WAIT_S,
    ENDER_RANKS,
    ENDER_WORDS,
    PEEK_DEAD_S,
    PULSE_REPORT_S,
    PULSE_S,
    RESAMPLE_S,
)
from .session import _process_gone

if TYPE_CHECKING:
    from .run import _MpiRun

# The signals with which a launcher (or a user) ends a job.
_STOP_SIGNALS = frozenset(int(getattr(signal, n)) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n))


class _Peek:
    """What a watcher reads of one rank: has it finished, its status row."""

    __slots__ = ("arrived", "row", "others")

    def __init__(self, raw: np.ndarray):
        self.arrived = bool(raw[CTL_ARRIVED:CTL_ARRIVED + 4].view(np.int32)[0])
        row_end = CTL_BOARD + STATUS_DTYPE.itemsize
        self.row = raw[CTL_BOARD:row_end].view(STATUS_DTYPE)[0]
        self.others = raw[row_end:CTL_PEEK_END].view(OTHER_DTYPE)


class _Control:
    """Per process: the abort word, the hang watcher (the ``shm`` driver's job, done by the ranks), the
    watch on the peer processes of this machine, and the launcher's SIGTERM."""

    def __init__(self, run: _MpiRun):
        self.run = run
        self.abort_seen: float | None = None
        self.hang: dict | None = None  # the hang this process found, as HangError's fields
        self.hang_timeout = run.hang_timeout
        self.rule = StallRule(run.hang_timeout)
        self.seen: list[_Peek | None] = [None] * run.world  # each rank as this process last read it
        self.reported = False  # this process printed a report of vanished ranks (or is printing it)
        self._report_lock = threading.Lock()
        # Peers on this machine the pulse thread saw gone before this process was told to stop (rank -> when).
        self.gone: dict[int, float] = {}
        self.stop_fd: int | None = None  # the read end of the signal wakeup pipe, while there is one
        self.told_to_stop = False        # a SIGTERM (SIGINT, SIGHUP) reached this process
        self._next_scan = 0.0
        self._abort_word = run.ctl_mem[CTL_ABORT:CTL_ABORT + 4].view(np.int32)
        self._ender_words = run.ctl_mem[CTL_ENDER:CTL_ENDER + 4 * ENDER_WORDS].view(np.uint32)

    # -- abort ------------------------------------------------------------------------------------
    def aborted(self, now: float | None = None) -> bool:
        """Whether some rank has asked every rank to stop (remembering when this process first saw it)."""
        if self.abort_seen is not None:
            return True
        self.run.ctl.Sync()
        if self._abort_word[0] == 0:
            return False
        self.abort_seen = time.monotonic() if now is None else now
        return True

    def check_abort(self, now: float | None = None) -> None:
        """Stop this rank (raise RankStopped) once another rank's failure is older than the grace period."""
        if self.aborted(now) and (time.monotonic() if now is None else now) - self.abort_seen >= GRACE_S:
            raise RankStopped

    def signal_abort(self) -> None:
        """Set every rank's abort word."""
        run = self.run
        one, res = np.ones(1, np.int32), np.zeros(1, np.int32)
        for r in range(run.world):
            run.ctl.Fetch_and_op(one, res, r, CTL_ABORT, run.MPI.REPLACE)
        run.ctl.Flush_all()
        self.aborted()

    def poll(self, now: float, watching: bool) -> None:
        """From a wait or a lock spin: end the job if a peer vanished; stop after an abort; look for a hang
        when ``watching``."""
        self.check_peers()
        self.check_abort(now)
        if watching and self.abort_seen is None and self.hang is None:
            hang = self.step(now)
            if hang is not None and self.found_hang(hang):
                raise RankStopped

    def found_hang(self, hang: dict) -> bool:
        """Report ``hang`` if no other rank reported one first; return whether this rank did.

        Ranks that watch find a hang at about the same time; the first to claim rank 0's hang word
        reports it, from a snapshot taken before any rank stopped.  A later snapshot could show the
        first reporter as finished.
        """
        run = self.run
        claim, free, res = np.array([run.rank + 1], np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
        run.ctl.Compare_and_swap(claim, free, res, 0, CTL_HANG)
        run.ctl.Flush(0)
        if res[0] != 0:
            return False
        self.hang = hang
        run.result["hang"] = hang
        run.publish_result()
        self.signal_abort()
        return True

    # -- hangs ------------------------------------------------------------------------------------
    def step(self, now: float) -> dict | None:
        """Look at every rank once; return a hang (HangError's fields) when the ranks are stuck."""
        run = self.run
        peeks = [run.peek(r) for r in range(run.world)]
        self.seen = peeks
        pending = [r for r, p in enumerate(peeks) if not p.arrived and int(p.row["state"]) not in (DONE, FAILED)]
        if not pending:
            return None
        found = self.rule.observe([p.row["progress"] for p in peeks], now, lambda: self._all_blocked(peeks, pending))
        return None if found is None else run.hang_fields(*found)

    def _all_blocked(self, peeks: list[_Peek], pending: list[int]) -> bool:
        memory = self.run.memory
        windows = len(self.run.plan.windows)
        for r in pending:
            row = peeks[r].row
            if int(row["state"]) != WAITING:
                return False
            for buffer_id, offset, cmp, expected in waited_cells(row, peeks[r].others):
                if not 0 <= buffer_id < windows:
                    return False
                if cell_holds(cmp, memory.cell_load(buffer_id, r, offset), expected):
                    return False
        return True

    # -- peer processes ---------------------------------------------------------------------------
    def ender(self) -> int | None:
        """The rank that reported and ended the job with MPI_Abort, if one did (read locally, no MPI call)."""
        e = int(self._ender_words[0])
        return e - 1 if e > 0 else None

    def ender_found(self) -> set[int]:
        """The ranks that the process ending the job found vanished (read locally, no MPI call)."""
        words = [int(w) for w in self._ender_words[1:]]
        return {32 * i + b for i, w in enumerate(words) for b in range(32) if w >> b & 1}

    def vanished(self) -> list[int]:
        """The ranks whose process, on this machine, ended during the run without ending the job on purpose
        (no MPI call: /proc only)."""
        processes, ender = self.run.session.processes, self.ender()
        return [r for r in self.run.session.same_machine if r != ender and _process_gone(*processes[r][:2])]

    def scan(self) -> None:
        """From the pulse thread: note the peers on this machine that are gone, until a stop signal arrives.

        After the launcher's SIGTERM the peers die of the same order, not by vanishing: the signal wakeup
        pipe, read before and after each look, keeps them out.  (The rank thread needs no such care: it runs
        the signal's handler before it could look.)
        """
        now = time.monotonic()
        if self.stop_fd is None or self.told_to_stop or now < self._next_scan:
            return
        self._next_scan = now + CHECK_S
        if self._stop_signalled():
            return
        found = [r for r in self.vanished() if r not in self.gone]
        if found and not self._stop_signalled():
            for r in found:
                self.gone[r] = now
        if self.gone and not self.reported and now - min(self.gone.values()) >= PULSE_REPORT_S:
            self.run.report_from_pulse(sorted(self.gone))

    def claim_report(self, timeout: float = -1) -> bool:
        """Whether this thread is the one of this process that prints the report of vanished ranks."""
        got = self._report_lock.acquire(timeout=timeout)
        try:
            if self.reported:
                return False
            self.reported = True
            return True
        finally:
            if got:
                self._report_lock.release()

    def _stop_signalled(self) -> bool:
        try:
            data = os.read(self.stop_fd, 512)
        except OSError:  # nothing there (or the pipe is closed)
            data = b""
        if any(b in _STOP_SIGNALS for b in data):
            self.told_to_stop = True
        return self.told_to_stop

    def check_peers(self) -> None:
        """End the job when a peer process on this machine vanished: it can neither report nor take part."""
        run = self.run
        run.ctl.Sync()
        dead = self.vanished()
        if not dead:
            return
        if self.claim_report():
            for r in dead:
                # Its last status row (the task it ran), where its window outlives it (shared memory);
                # else what this process read of it last.
                if run.session.dead_peers_readable:
                    self.seen[r] = run.peek_dead(r, PEEK_DEAD_S) or self.seen[r]
            run.report_vanished(dead, f"{run.who(run.rank)} ends the MPI job with MPI_Abort.")
        self.end_job(dead)

    def end_job(self, dead: tuple | list = ()) -> None:
        """After this process reported: tell the live peers who ends the job and which ranks vanished, then
        end it (MPI_Abort).

        A peer that the launcher then terminates, or that sees this process gone, knows it did not vanish,
        and which ranks did.
        The word is sent without waiting for the peers (emulated one-sided operations complete only while
        the target runs MPI's progress engine, and a peer that never returns to ptodist may not).
        """
        run = self.run
        words = np.zeros(ENDER_WORDS, np.uint32)
        words[0] = run.rank + 1
        for r in dead:
            if r < ENDER_RANKS:
                words[1 + r // 32] |= np.uint32(1 << (r % 32))
        words = words.view(np.int32)
        sent = [run.ctl.Raccumulate(words, r, (CTL_ENDER, ENDER_WORDS, run.MPI.INT), run.MPI.REPLACE)
                for r in range(run.world) if r != run.rank and r not in dead]
        deadline = time.monotonic() + END_WAIT_S
        while sent and time.monotonic() < deadline:
            with run.lock:  # the pulse thread may call MPI too
                sent = [q for q in sent if not q.Test()]
            if sent:
                time.sleep(1e-4)
        sys.stdout.flush()
        sys.stderr.flush()
        run.comm.Abort(1)

    # -- the launcher's SIGTERM ----------------------------------------------------------------------
    def catch_termination(self) -> None:
        """During the run, say why before dying of SIGTERM (the launcher ending the job, mostly).

        A wakeup pipe tells the pulse thread when a stop signal arrived (Python runs handlers in the main
        thread only, maybe later): a peer seen gone after that was ended by the launcher, not vanished.
        """
        self._old_term = self._wakeup = None
        if threading.current_thread() is not threading.main_thread():
            return
        old = signal.getsignal(signal.SIGTERM)
        if old == signal.SIG_IGN:
            return
        self._old_term = signal.SIG_DFL if old is None else old
        signal.signal(signal.SIGTERM, self._terminated)
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        theirs = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if theirs != -1:
            signal.set_wakeup_fd(theirs)  # the program's own (asyncio's): leave it
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, w)
        self.stop_fd = r

    def release_termination(self, close: bool = True) -> None:
        """Put SIGTERM's handler and the wakeup fd back; ``close``: also close the pipe (not while the pulse
        thread may read it)."""
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None
        if self._wakeup is not None:
            current = signal.set_wakeup_fd(-1)
            if current not in (-1, self._wakeup[1]):
                signal.set_wakeup_fd(current)  # the program set its own meanwhile: keep it
        if self._wakeup is not None and close:
            self.stop_fd = None
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def _terminated(self, signum, frame) -> None:
        """SIGTERM during the run: print the best report this process can (no MPI call), then die of it."""
        run = self.run
        me = run.who(run.rank)
        # Seen gone before the signal came, or named by the process that ended the job; not the latter itself.
        dead = sorted((set(self.gone) | self.ender_found()) - {self.ender(), run.rank})
        if self.reported:
            pass  # this process reported the vanished ranks
        elif dead:
            # (The lock may be held by the code this handler interrupted: then only a short wait for it.)
            if self.claim_report(timeout=0.1):
                run.report_vanished(dead, f"the MPI launcher then ended {me} (SIGTERM).")
        elif self.ender() is None:  # else the process that ended the job reported why
            _say([f"ptodist: the MPI launcher ended {me} (SIGTERM) during the run: another process of the job "
                  "ended or failed (see the launcher's message; a process on another machine cannot be named "
                  "from here), or the job was cancelled."])
        self.release_termination(close=False)
        os.kill(os.getpid(), signum)


class _Serialized:
    """An MPI object whose calls take one lock: the rank thread and the pulse thread never call MPI at once."""

    def __init__(self, obj, lock: threading.Lock):
        self._obj, self._lock = obj, lock

    def __getattr__(self, name: str):
        attr = getattr(self._obj, name)
        if not callable(attr):
            return attr
        lock = self._lock

        def call(*args, **kwargs):
            with lock:
                return attr(*args, **kwargs)

        setattr(self, name, call)  # looked up once per name
        return call


class _Pulse(threading.Thread):
    """While the rank runs: run MPI's progress engine, publish the line the rank is at when it stalls, and
    watch the peer processes of this machine (``_Control.scan``).

    Progress matters where one-sided operations are emulated (TCP, UCX without hardware atomics): a
    peer's get from, or notify to, a rank that is computing completes only while that rank's process runs
    MPI's progress engine.  A rank that runs without communication progress for ``stall_s`` (a long
    computation, or a loop that never ends) has its current line sampled into its status row
    (``record_busy``), where the watching ranks read it for a hang report.
    """

    def __init__(self, board: StatusBoard, comm, lock: threading.Lock, MPI, stall_s: float, scan):
        super().__init__(name="ptodist-mpi-pulse", daemon=True)
        self.board, self.row = board, board.rows[0]
        self.scan = scan  # looks at the peer processes of this machine (``_Control.scan``)
        self.comm, self.lock = comm, lock  # comm None: no MPI calls from this thread
        self.any_source, self.any_tag = MPI.ANY_SOURCE, MPI.ANY_TAG
        self.target = threading.get_ident()  # the rank's thread: made by it
        self.stall_s = stall_s
        self.stopping = threading.Event()

    def run(self) -> None:
        row = self.row
        last, since, next_sample, sampled = None, time.monotonic(), 0.0, False
        while not self.stopping.wait(PULSE_S):
            now = time.monotonic()
            try:
                progress = int(row["progress"])
                if progress != last:
                    last, since = progress, now
                    if sampled:
                        row["busy"] = b""  # the line of an earlier stall
                        sampled = False
                elif int(row["state"]) == RUNNING and now - since >= self.stall_s and now >= next_sample:
                    next_sample = now + RESAMPLE_S
                    frame = sys._current_frames().get(self.target)
                    if frame is not None:
                        self.board.record_busy(0, current_line(frame))
                        sampled = True
                    del frame
                self.scan()
            except Exception:  # noqa: BLE001 - a diagnostic that fails must not stop MPI progress
                pass
            if self.comm is not None and self.lock.acquire(blocking=False):  # else the rank thread is in MPI
                try:
                    self.comm.Iprobe(self.any_source, self.any_tag)
                finally:
                    self.lock.release()

    def stop(self) -> None:
        self.stopping.set()
        self.join()


