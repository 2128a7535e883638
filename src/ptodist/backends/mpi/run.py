"""One command in this process: its windows, this rank's tasks, the end of the run, the error every process
raises."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time

import numpy as np

from ...check import findings
from ...check.hang import hang_from_states, rank_state
from ...compiler.plan import DispatchPlan
from ...errors import ConfigError, HangError, PtodistError, PtodistInternalError, RankError, RankFailure
from ...language.types import Direction
from ...rank import death
from ...rank.body import run_rank
from ...rank.context import RankContext
from ...rank.events import EventLog
from ...rank.failures import rank_failure
from ...rank.status import DONE, FAILED, RUNNING, STATE_NAMES, StatusBoard
from ..base import rank_died
from .agree import _say
from .layout import (
    ALIGN,
    BUSY_AFTER_S,
    CHECK_S,
    CTL_ARRIVED,
    CTL_BOARD,
    CTL_BYTES,
    CTL_PEEK_END,
    CTL_RESULT,
    CTL_RESULT_LEN,
    FINISH_SPIN_S,
    RESULT_BYTES,
    STOP_WAIT_MAX_S,
    STOP_WAIT_MIN_S,
)
from .memory import MpiMemory, _allocate, _Arena
from .session import _Session
from .watch import _Control, _Peek, _Pulse, _Serialized
from .wire import merge_outputs, share_dfx, write_dfx

_CPUS = os.cpu_count() or 1


class _MpiRun:
    """One dispatch in this process: windows, this rank's tasks, the end of the run, the exchange."""

    def __init__(self, session: _Session, plan: DispatchPlan, host_arrays: list, hang_timeout: float, dfx,
                 arena: _Arena | None = None, kept: dict | None = None, last: bool = True, what: str = "",
                 scalars: tuple = (), control=None):
        self.session = session
        self.scalars = scalars  # the dispatch's scalar arguments (what its plan's ScalarArgs take)
        self.MPI = session.MPI
        self.plan = plan
        self.rank = session.rank
        self.world = session.size
        self.host_arrays = host_arrays
        self.dfx = dfx
        self.hang_timeout = hang_timeout
        self.arena = arena  # a worker's window heap (kept, zeroed by the worker); None: one for this run
        self.ctl_win = control  # a worker's control window (kept, zeroed by each run); None: one for this run
        self.kept = kept if kept is not None else {}
        self.last = last
        self.what = what or f"this call of '{plan.program}'"  # what a failure of this run fails, in its notes
        self.stop_wait = min(max(self.hang_timeout, STOP_WAIT_MIN_S), STOP_WAIT_MAX_S)
        self.result: dict = {"rank": self.rank, "failure": None, "stopped": False, "hang": None}
        self._abandoned: list = []  # buffers of reads from dead peers that did not complete

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> BaseException | None:
        """Run this rank's part; return the error every process of the job raises (None: it succeeded)."""
        MPI, comm = self.MPI, self.session.comm
        if self.arena is not None:
            heap, heap_bytes = self.arena.win, self.arena.stride
        else:
            heap_bytes = max(-(-self.plan.window_heap_bytes // ALIGN) * ALIGN, ALIGN)
            try:
                heap = _allocate(self.session, heap_bytes, self.plan.program)
            except ConfigError as e:
                return e
        try:
            ctl = self.ctl_win if self.ctl_win is not None else MPI.Win.Allocate(CTL_BYTES, 1, comm=comm)
        except MPI.Exception as e:
            if self.arena is None:
                heap.Free()
            return ConfigError(f"{self.plan.program}: MPI could not allocate its control window: {e}")
        # While the rank runs, every MPI call of this process goes through one lock (see _Pulse).
        self.lock = lock = threading.Lock()
        self.heap, self.ctl, self.comm = _Serialized(heap, lock), _Serialized(ctl, lock), _Serialized(comm, lock)
        self.control = None  # made once the windows are locked; a failure before that has no watch to release
        try:
            self.heap_mem = np.frombuffer(heap.tomemory(), np.uint8)[:heap_bytes]
            self.ctl_mem = np.frombuffer(ctl.tomemory(), np.uint8)[:CTL_BYTES]
            if self.arena is None:
                self.heap_mem[:] = 0
            self.ctl_mem[:] = 0
            comm.Barrier()  # every window is zero before any rank reaches into a peer's
            heap.Lock_all(MPI.MODE_NOCHECK)
            ctl.Lock_all(MPI.MODE_NOCHECK)
            self.control = _Control(self)
            self.control.catch_termination()
            # The host's order of chip tasks passes host-tensor bytes on a communicator of this run's own.
            self.host_comm = _Serialized(comm.Dup(), lock) if self.plan.edges else None
            self.tag_end = int(comm.Get_attr(MPI.TAG_UB)) + 1
            self.memory = MpiMemory(self)
            views = self._host_views()
            pulse = _Pulse(self.memory.status.board, comm if self.session.threaded_progress else None, lock, MPI,
                           min(BUSY_AFTER_S, self.hang_timeout / 2), self.control.scan)
            pulse.start()
            try:
                self._rank_body(views)
                self._finish()
            finally:
                pulse.stop()
            heap.Unlock_all()
            ctl.Unlock_all()
            self.memory.free_types()
            results = comm.allgather(self.result)
            if self.host_comm is not None:
                self.memory.settle_sends(outcome(results) is None)
                self.host_comm.Free()
        finally:
            if self.control is not None:
                self.control.release_termination()
            self.heap_mem = self.ctl_mem = None
            self.memory = None
            if self.arena is None:
                heap.Free()
            if self.ctl_win is None:
                ctl.Free()
        error = outcome(results)
        # A worker's dispatch writes its DFX files once, after its last segment (or its failure).
        shared = None
        if self.dfx is not None and (self.last or error is not None):
            failed, shared = share_dfx(self)
            error = error or failed
        if error is None:
            error = merge_outputs(self, views)
        if shared is not None:
            error = write_dfx(self, *shared) or error
        return error

    def _host_views(self) -> list:
        """Private copies of the host tensors the ranks write; inputs read-only, as on ``shm``."""
        views: list = [None] * len(self.host_arrays)
        for i, a in enumerate(self.host_arrays):
            if a is not None:
                views[i] = a.copy()
        for spec in self.plan.host_tensors:
            if spec.direction is Direction.IN:
                v = self.host_arrays[spec.index].view()
                v.flags.writeable = False
                views[spec.index] = v
        return views

    # -- processes that vanish, a launcher that ends the job --------------------------------------
    def _vanished_report(self, dead: list[int]) -> list[str]:
        """The RankError lines for the ranks whose process vanished, as every surviving process prints them."""
        failures = []
        for r in dead:
            seen = self.control.seen[r]
            task = (seen.row["task"].decode(errors="replace") or None) if seen is not None else None
            finished = seen is not None and seen.arrived
            fd = self.session.peer_records.get(r)
            record = death.read(fd) if fd is not None else None
            if record is not None:  # it called os._exit, or died of a fatal signal: its record says where
                note = f"vanished{' after it finished its tasks' if finished else ''} ({record.cause})"
                failures.append(rank_died(r, self.plan.device_ids[r], task, note, record))
                continue
            when = "after it finished its tasks" if finished else "without reporting a result"
            failures.append(RankFailure(r, self.plan.device_ids[r], task, "RankDied",
                                        f"the rank process vanished {when} (os._exit, a signal or the OOM killer)", ""))
        error = RankError(failures)
        return [f"ptodist: RankError: {error}", *(f.summary() for f in findings.from_exception(error))]

    def who(self, rank: int) -> str:
        return f"rank {rank} (device {self.plan.device_ids[rank]})"

    def report_vanished(self, dead: list[int], then: str) -> None:
        """Print which ranks vanished (the caller claimed the report), and what happens ``then``."""
        gone = ", ".join(self.who(r) for r in dead)
        _say([*self._vanished_report(dead), f"ptodist: the process of {gone} ended during the run; {then}"])

    def report_from_pulse(self, dead: list[int]) -> None:
        """From the pulse thread: the rank thread did not report a vanished peer (it computes, or waits in an
        MPI call to the dead peer that may never return): report it, and end the job where this thread may
        call MPI."""
        if not self.control.claim_report():
            return
        if self.session.threaded_progress:
            self.report_vanished(dead, f"{self.who(self.rank)} ends the MPI job with MPI_Abort.")
            self.control.end_job(dead)
        else:
            self.report_vanished(dead, "the MPI launcher is left to end the job.")

    def peek_dead(self, rank: int, wait_s: float) -> _Peek | None:
        """Read a dead rank's status row if that completes within ``wait_s`` (None otherwise): where the
        one-sided operations need the target's progress, a read from a dead process never completes."""
        raw = np.zeros(CTL_PEEK_END, np.uint8)
        piece = raw[CTL_ARRIVED:]
        try:
            req = self.ctl.Rget([piece, piece.size, self.MPI.BYTE], rank, (CTL_ARRIVED, piece.size, self.MPI.BYTE))
            deadline = time.monotonic() + wait_s
            while True:
                with self.lock:
                    done = req.Test()
                if done:
                    return _Peek(raw)
                if time.monotonic() >= deadline:
                    self._abandoned.append(raw)  # MPI may still write into it
                    return None
                time.sleep(1e-4)
        except self.MPI.Exception:
            return None

    # -- this rank --------------------------------------------------------------------------------
    def _rank_body(self, views: list) -> None:
        plan, rank, memory = self.plan, self.rank, self.memory
        ctx, log = self.kept.get("ctx"), self.kept.get("log")
        try:
            if ctx is None:
                log = EventLog(rank, plan.device_ids[rank], self.dfx.dispatch, dump_args=self.dfx.dump_args) \
                    if self.dfx is not None else None
                ctx = RankContext(plan, rank, memory, views, events=log)
            else:
                ctx.next_segment(plan, memory, views)
            ctx.scalars = self.scalars
        except BaseException as e:  # noqa: BLE001 - reported to every process like a failure of the tasks
            self.result["failure"] = rank_failure(plan, rank, None, e)
        else:
            self.kept["ctx"], self.kept["log"] = ctx, log
            outcome = run_rank(ctx, log, self.dfx, last=self.last, settle=memory.flush_all)
            self.result["failure"], self.result["stopped"] = outcome.failure, outcome.stopped
        ok = self.result["failure"] is None and not self.result["stopped"]
        memory.status.finish(rank, DONE if ok else FAILED)
        if self.result["failure"] is not None and not self.control.aborted():
            self.control.signal_abort()
        self.result["hang"] = self.control.hang
        self.publish_result()
        self.ctl_mem[CTL_ARRIVED:CTL_ARRIVED + 4].view(np.int32)[0] = 1
        self.ctl.Sync()

    def publish_result(self) -> None:
        """Keep this rank's result in its control window, where an aborting process can read it."""
        data = pickle.dumps(self.result)
        if len(data) > RESULT_BYTES:
            slim = dict(self.result)
            f = slim.get("failure")
            if f is not None:
                slim["failure"] = type(f)(f.rank, f.device_id, f.task, f.error_type, f.message[:8192],
                                          f.traceback[-16384:])
            data = pickle.dumps(slim)
        data = data[:RESULT_BYTES]
        self.ctl_mem[CTL_RESULT:CTL_RESULT + len(data)] = np.frombuffer(data, np.uint8)
        self.ctl_mem[CTL_RESULT_LEN:CTL_RESULT_LEN + 8].view(np.int64)[0] = len(data)
        self.ctl.Sync()

    def _read_result(self, rank: int) -> dict | None:
        head = np.zeros(8, np.uint8)
        self.ctl.Get([head, 8, self.MPI.BYTE], rank, (CTL_RESULT_LEN, 8, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        n = int(head.view(np.int64)[0])
        if not 0 < n <= RESULT_BYTES:
            return None
        data = np.zeros(n, np.uint8)
        self.ctl.Get([data, n, self.MPI.BYTE], rank, (CTL_RESULT, n, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        try:
            return pickle.loads(data.tobytes())
        except Exception:  # noqa: BLE001 - a result cut short: this rank's report is lost, not the others'
            return None

    # -- reading the other ranks ------------------------------------------------------------------
    def peek(self, rank: int) -> _Peek:
        if rank == self.rank:
            self.ctl.Sync()
            return _Peek(self.ctl_mem[:CTL_PEEK_END].copy())
        raw = np.zeros(CTL_PEEK_END, np.uint8)
        piece = raw[CTL_ARRIVED:]
        self.ctl.Get([piece, piece.size, self.MPI.BYTE], rank, (CTL_ARRIVED, piece.size, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        return _Peek(raw)

    def _board(self, rank: int) -> tuple[StatusBoard, bool, np.ndarray]:
        """Rank ``rank``'s whole status board (a copy, and the bytes it lives in) and whether it has finished."""
        n = StatusBoard.nbytes(1)
        raw = np.zeros(CTL_BOARD + n, np.uint8)
        piece = raw[CTL_ARRIVED:]
        self.ctl.Get([piece, piece.size, self.MPI.BYTE], rank, (CTL_ARRIVED, piece.size, self.MPI.BYTE))
        self.ctl.Flush_local(rank)
        board = raw[CTL_BOARD:]
        return StatusBoard(board, 1), bool(raw[CTL_ARRIVED:CTL_ARRIVED + 4].view(np.int32)[0]), board

    def hang_fields(self, certain: bool, idle: float) -> dict:
        """Describe the hang as the ``shm`` driver does (``check.hang``), as fields every process can take."""
        states, sent = [], []
        for r in range(self.world):
            board, arrived, _raw = self._board(r)
            row = board.rows[0]
            # A running rank's line is where its pulse thread found it, running without progress.
            states.append(rank_state(self.plan, r, row, arrived, self.memory.cell_load, self._busy_line(row),
                                     others=board.others[0]))
            for e in board.sent(0):
                e["rank"] = r
                sent.append(e)
        e = hang_from_states(states, sent, certain, idle, self.hang_timeout)
        return {"message": str(e), "states": e.ranks, "certain": e.certain, "diagnosis": e.diagnosis}

    @staticmethod
    def _busy_line(row) -> str | None:
        """The line a running rank was sampled at after it stopped making progress (None: not sampled)."""
        if int(row["samples"]) > 0:
            return row["busy"].decode(errors="replace") or None
        return None

    # -- the end of the run -----------------------------------------------------------------------
    def _finish(self) -> None:
        """Wait for every rank to end, watching for hangs; abort the job if a rank cannot be stopped."""
        req = self.comm.Ibarrier()
        delay = 1e-4
        next_check = 0.0
        control = self.control
        spin_end = time.monotonic() + (FINISH_SPIN_S if self.world <= _CPUS else 0.0)
        while True:
            with self.lock:  # the pulse thread calls MPI too
                if req.Test():
                    break
            now = time.monotonic()
            if now < spin_end:
                os.sched_yield()
                continue
            if now >= next_check:
                next_check = now + CHECK_S
                control.check_peers()
                if control.aborted(now):
                    if now - control.abort_seen >= self.stop_wait:
                        self._abort_job(now)
                elif control.hang is None:
                    hang = control.step(now)
                    if hang is not None:
                        control.found_hang(hang)
            time.sleep(delay)
            delay = min(delay * 2, 5e-3)

    def _abort_job(self, now: float) -> None:
        """Some rank did not stop after a failure: print what is known, then end the job (MPI_Abort)."""
        peeks = [self.peek(r) for r in range(self.world)]
        arrived = [r for r, p in enumerate(peeks) if p.arrived]
        # One process reports: the lowest that has finished (the others wait for the abort, or for longer).
        if arrived and arrived[0] != self.rank and now - self.control.abort_seen < 2 * self.stop_wait + 5:
            return
        results = [self._read_result(r) if r in arrived and r != self.rank else None for r in range(self.world)]
        results[self.rank] = self.result
        error = outcome(results)
        missing = [r for r in range(self.world) if r not in arrived]
        lines = []
        if error is not None:
            lines.append(f"ptodist: {type(error).__name__}: {error}")
            if isinstance(error, PtodistError):
                lines += [f.summary() for f in findings.from_exception(error)]
        for r in missing:
            row = peeks[r].row
            state = STATE_NAMES.get(int(row["state"]), "unknown")
            task = row["task"].decode(errors="replace")
            line = self._busy_line(row) if int(row["state"]) == RUNNING else None
            where = (f" in task '{task}'" if task else "") + (f" at {line}" if line else "")
            lines.append(f"ptodist: rank {r} (device {self.plan.device_ids[r]}) did not stop within "
                         f"{self.stop_wait:g} s after the run failed: it was {state}{where}. A kernel that does not "
                         "return to ptodist (sleeping, blocked in a call, looping without communicating) cannot be "
                         "stopped by another process, so the MPI job is ended with MPI_Abort.")
        print("\n".join(lines), file=sys.stderr)
        self.control.end_job()


def outcome(results: list) -> BaseException | None:
    """The error every process raises, from every rank's result (None: the run succeeded)."""
    results = [r for r in results if r]
    failures = sorted((r["failure"] for r in results if r.get("failure") is not None), key=lambda f: f.rank)
    if failures:
        return RankError(failures)
    hangs = [r["hang"] for r in results if r.get("hang")]
    if hangs:
        h = hangs[0]
        return HangError(h["message"], h["states"], h["certain"], h["diagnosis"])
    stopped = [r["rank"] for r in results if r.get("stopped")]
    if stopped:
        return PtodistInternalError(f"ranks {stopped} were stopped, but no rank reported a failure or a hang")
    return None
