"""The ``shm`` backend: one forked process per rank over one shared anonymous mapping.

Layout of the mapping (every region 64-byte aligned)::

    control   sleepers word | one accumulate lock per rank | status board
    host      each host tensor, copied in before the fork, out after the run
    windows   world x window heap (rank r's heap holds every window buffer)

An anonymous ``MAP_SHARED`` mapping is inherited by the forked ranks and
vanishes with the last process, so no shared-memory segment can leak.  Ranks
ask the kernel to kill them if the driver dies, and the driver kills and reaps
every rank on any ending: success, error, hang or Ctrl-C.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import signal
import sys
import time
import traceback
from contextlib import contextmanager

import numpy as np

from .. import _atomics
from ..check.hang import diagnose_hang, hang_report, received
from ..compiler.plan import DispatchPlan
from ..dfx import finish_run, write_rank_outputs
from ..errors import HangError, PtodistError, RankError, RankFailure
from ..language.types import Direction
from ..runtime.events import EventLog
from ..runtime.rank import RankContext
from ..source import is_internal
from .base import DONE, FAILED, RUNNING, STATE_NAMES, WAITING, StatusBoard

ALIGN = 64
# A hang is certain when every unfinished rank has been blocked, with nothing changing, this long.
CERTAIN_HANG_S = 0.5
POLL_S = 0.02
# After the first failure, wait this long for the other ranks' reports before stopping them.
GRACE_S = 0.2


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Layout:
    """Byte offsets of every region of the shared mapping."""

    def __init__(self, plan: DispatchPlan, host_arrays: list):
        world = plan.world
        self.sleepers = 0
        self.locks = ALIGN
        self.status = _align(self.locks + 4 * world)
        off = _align(self.status + StatusBoard.nbytes(world))
        self.host: dict[int, int] = {}
        for i, a in enumerate(host_arrays):
            if a is not None:
                self.host[i] = off
                off = _align(off + a.nbytes)
        self.heap = _align(max(plan.window_heap_bytes, ALIGN))
        self.windows = off
        self.total = off + self.heap * world
        self.offsets = [w.offset for w in plan.windows]
        self.sizes = [w.nbytes for w in plan.windows]


class ShmMemory:
    """RankMemory over the shared mapping (used by the ranks, and by the driver to read cells)."""

    def __init__(self, arena: np.ndarray, layout: Layout, rank: int, world: int):
        self.arena = arena
        self.layout = layout
        self.rank = rank
        self.world = world
        self.base = arena.ctypes.data
        self.sleepers_addr = self.base + layout.sleepers
        self.status = StatusBoard(arena[layout.status:layout.status + StatusBoard.nbytes(world)], world)
        # Waiting ranks spin briefly when cores are free; when ranks outnumber cores they yield the core
        # for a while (the notifier may be waiting for it), then sleep.
        if world <= (os.cpu_count() or 1):
            self.spin_s, self.yield_s = 50e-6, 0.0
        else:
            self.spin_s, self.yield_s = 2e-6, 200e-6

    def _buffer_off(self, buffer_id: int, rank: int) -> int:
        return self.layout.windows + rank * self.layout.heap + self.layout.offsets[buffer_id]

    def window_bytes(self, buffer_id: int, rank: int) -> np.ndarray:
        off = self._buffer_off(buffer_id, rank)
        return self.arena[off:off + self.layout.sizes[buffer_id]]

    def _addr(self, buffer_id: int, rank: int, offset: int) -> int:
        return self.base + self._buffer_off(buffer_id, rank) + offset

    def cell_add(self, buffer_id, rank, offset, value):
        return _atomics.fetch_add(self._addr(buffer_id, rank, offset), self.sleepers_addr, value)

    def cell_set(self, buffer_id, rank, offset, value):
        return _atomics.exchange(self._addr(buffer_id, rank, offset), self.sleepers_addr, value)

    def cell_load(self, buffer_id, rank, offset):
        return _atomics.load(self._addr(buffer_id, rank, offset))

    def cell_wait(self, buffer_id, offset, ge, expected, timeout_s):
        return _atomics.wait(self._addr(buffer_id, self.rank, offset), self.sleepers_addr, int(ge), expected,
                             self.spin_s, self.yield_s, timeout_s)

    @contextmanager
    def locked(self, rank: int):
        addr = self.base + self.layout.locks + 4 * rank
        _atomics.lock(addr)
        try:
            yield
        finally:
            _atomics.unlock(addr)


class ShmBackend:
    """Runs a plan with one forked process per rank."""

    name = "shm"

    def run(self, plan: DispatchPlan, host_arrays: list, config, dfx=None) -> None:
        layout = Layout(plan, host_arrays)
        mm = mmap.mmap(-1, layout.total)
        arena = np.frombuffer(mm, dtype=np.uint8)
        try:
            views = self._host_views(arena, layout, plan, host_arrays)
            try:
                _Driver(plan, arena, layout, views, config, dfx).run()
            finally:
                if dfx is not None:
                    finish_run(dfx, plan.world, plan.device_ids)
            for spec in plan.host_tensors:
                if spec.direction is not Direction.IN:
                    host_arrays[spec.index][...] = views[spec.index]
        finally:
            del arena
            views = None
            try:
                mm.close()
            except BufferError:
                pass  # a view is still referenced (e.g. by a traceback); the GC unmaps it later

    @staticmethod
    def _host_views(arena, layout: Layout, plan: DispatchPlan, host_arrays: list) -> list:
        views: list = [None] * len(host_arrays)
        for i, a in enumerate(host_arrays):
            if a is not None:
                off = layout.host[i]
                views[i] = arena[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
                views[i][...] = a
        # Inputs are read-only in the ranks, so a store into one is reported, not silently lost.
        for spec in plan.host_tensors:
            if spec.direction is Direction.IN:
                views[spec.index].flags.writeable = False
        return views


class _Driver:
    """Forks the ranks, watches them, and turns failures and stalls into exceptions."""

    def __init__(self, plan, arena, layout, host_views, config, dfx=None):
        self.plan = plan
        self.dfx = dfx
        self.world = plan.world
        self.arena = arena
        self.layout = layout
        self.host_views = host_views
        self.hang_timeout = config.resolved_hang_timeout()
        self.memory = ShmMemory(arena, layout, -1, plan.world)
        self.pids: dict[int, int] = {}
        self.fds: dict[int, int] = {}
        self.buffers: dict[int, bytearray] = {}
        self.done: set[int] = set()
        self.failures: list[RankFailure] = []

    def run(self) -> None:
        try:
            self._start()
            self._watch()
        finally:
            self._stop_all()

    # -- start ------------------------------------------------------------------
    def _start(self) -> None:
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        for r in range(self.world):
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the rank
                os.close(rfd)
                for fd in self.fds:
                    os.close(fd)
                _rank_main(self.plan, r, self.arena, self.layout, self.host_views, wfd, parent, self.dfx)
            os.close(wfd)
            self.pids[r] = pid
            self.fds[rfd] = r
            self.buffers[r] = bytearray()

    # -- watch ------------------------------------------------------------------
    def _watch(self) -> None:
        board = self.memory.status.rows
        last = board["progress"].copy()
        last_cpu = self._running_cpu()
        last_board_change = last_change = time.monotonic()
        first_failure = None
        while len(self.done) < self.world:
            ready, _, _ = select.select(list(self.fds), [], [], POLL_S)
            for fd in ready:
                self._read(fd)
            now = time.monotonic()
            if self.failures:
                first_failure = first_failure or now
                if now - first_failure >= GRACE_S:
                    break
                continue
            progress = board["progress"]
            if not np.array_equal(progress, last):
                last = progress.copy()
                last_board_change = last_change = now
                continue
            # A running rank that uses CPU (long tile math, Python loops) is making progress too.
            cpu = self._running_cpu()
            if cpu != last_cpu:
                last_cpu = cpu
                last_change = now
            if now - last_board_change >= CERTAIN_HANG_S and self._all_blocked():
                self._hang(True, now - last_board_change)
            if now - last_change >= self.hang_timeout:
                self._hang(False, now - last_change)
        if self.failures:
            raise RankError(sorted(self.failures, key=lambda f: f.rank))

    def _running_cpu(self) -> dict:
        """CPU time (clock ticks) used so far by each live rank in the RUNNING state; empty where unknown."""
        rows = self.memory.status.rows
        out = {}
        for r, pid in self.pids.items():
            if rows[r]["state"] != RUNNING:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                out[r] = int(fields[11]) + int(fields[12])  # utime + stime
            except (OSError, IndexError, ValueError):
                pass  # no /proc (or the rank just exited): board progress alone decides
        return out

    def _read(self, fd: int) -> None:
        r = self.fds[fd]
        chunk = os.read(fd, 1 << 16)
        if chunk:
            self.buffers[r] += chunk
            return
        os.close(fd)
        del self.fds[fd]
        self.done.add(r)
        _, status = os.waitpid(self.pids.pop(r), 0)
        message = bytes(self.buffers[r])
        if message:
            result = pickle.loads(message)
            if result is not None:
                self.failures.append(result)
            return
        why = f"killed by signal {-os.waitstatus_to_exitcode(status)}" if os.WIFSIGNALED(status) else \
            f"exited with status {os.waitstatus_to_exitcode(status)}"
        row = self.memory.status.rows[r]
        task = row["task"].decode() or None
        self.failures.append(RankFailure(r, self.plan.device_ids[r], task, "RankDied",
                                         f"the rank process {why} without reporting a result", ""))

    def _all_blocked(self) -> bool:
        rows = self.memory.status.rows
        pending = [r for r in range(self.world) if r not in self.done]
        if not pending:
            return False
        for r in pending:
            row = rows[r]
            if row["state"] != WAITING:
                return False
            value = self.memory.cell_load(int(row["wait_buffer"]), r, int(row["wait_offset"]))
            expected = int(row["wait_expected"])
            if (value >= expected) if row["wait_cmp"] else (value == expected):
                return False
        return True

    def _hang(self, certain: bool, idle: float) -> None:
        rows = self.memory.status.rows
        states = []
        for r in range(self.world):
            row = rows[r]
            st = {"rank": r, "device_id": self.plan.device_ids[r], "state": STATE_NAMES[int(row["state"])],
                  "task": row["task"].decode() or None}
            if r in self.done:
                st["state"] = STATE_NAMES[DONE]
            if row["state"] == WAITING and r not in self.done:
                st.update(
                    wait=row["what"].decode(), where=row["where"].decode(),
                    buffer=self.plan.windows[int(row["wait_buffer"])].name,
                    buffer_id=int(row["wait_buffer"]), offset=int(row["wait_offset"]), cell0=int(row["wait_cell0"]),
                    expected=int(row["wait_expected"]), cmp="Ge" if row["wait_cmp"] else "Eq",
                    current=self.memory.cell_load(int(row["wait_buffer"]), r, int(row["wait_offset"])),
                    waiting_s=round(time.time() - float(row["since"]), 3))
            states.append(st)
        sent = [e for r in range(self.world) for e in self.memory.status.sent(r)]
        for st in states:
            if "buffer_id" in st:
                st["received"] = received(st, sent)
        diagnosis = diagnose_hang(states, sent)
        raise HangError(hang_report(states, certain, idle, self.hang_timeout, diagnosis), states, certain,
                        diagnosis)

    # -- stop -------------------------------------------------------------------
    def _stop_all(self) -> None:
        for pid in self.pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.pids.values():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.pids.clear()
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def _rank_main(plan, rank, arena, layout, host_views, wfd, parent, dfx=None) -> None:
    """Body of a rank process; never returns."""
    code = 0
    try:
        _atomics.die_with_parent()
        if os.getppid() != parent:
            os._exit(1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
        memory = ShmMemory(arena, layout, rank, plan.world)
        log = EventLog(rank, plan.device_ids[rank], dfx.dispatch) if dfx is not None else None
        ctx = RankContext(plan, rank, memory, host_views, events=log)
        result = None
        try:
            ctx.run_all()
        except BaseException as e:  # noqa: BLE001 - everything a rank raises is reported to the driver
            result = _failure(plan, rank, ctx.failed_task or ctx.task, e)
        if log is not None:
            # Written before the rank reports, so the driver finds every rank's files when it merges.
            try:
                write_rank_outputs(log, dfx)
            except Exception as e:  # noqa: BLE001 - a failed write is this rank's failure
                result = result or _failure(plan, rank, None, e)
        memory.status.finish(rank, DONE if result is None else FAILED)
        payload = pickle.dumps(result)
        view = memoryview(payload)
        while view:
            n = os.write(wfd, view)
            view = view[n:]
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _user_traceback(e: BaseException) -> str:
    """Format the rank's traceback; for errors ptodist raised on purpose, without ptodist's own frames."""
    frames = traceback.extract_tb(e.__traceback__)
    innermost_is_user = bool(frames) and not is_internal(frames[-1].filename)
    if isinstance(e, PtodistError) or innermost_is_user:
        frames = traceback.StackSummary.from_list([f for f in frames if not is_internal(f.filename)])
    lines = ["Traceback (most recent call last):\n", *frames.format(),
             *traceback.format_exception_only(type(e), e)]
    return "".join(lines)


def _failure(plan, rank, task, e: BaseException) -> RankFailure:
    tb = _user_traceback(e)
    exc = e if isinstance(e, PtodistError) or type(e).__module__ == "builtins" else None
    try:
        exc = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - exceptions that do not survive pickling travel as text only
        exc = None
    return RankFailure(rank, plan.device_ids[rank], task, type(e).__name__, str(e), tb, exc)
