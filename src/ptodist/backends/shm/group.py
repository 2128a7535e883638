"""``RankGroup``: rank processes forked once, each serving one command after another.

The driver writes a command into a frame of the group's control mapping and rings a doorbell word
(``wire``); the ranks (``server``) run it and count themselves into a ``finished`` word; the command's
``CommandWatch`` (``watch``) sees how it ended.  Ranks are forked from a thread that lasts as long as
the process, and killed and reaped with the group.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import weakref

import numpy as np

from ... import _atomics
from ...errors import RankError, RankFailure
from ...rank import death
from ...rank.status import StatusBoard
from .. import resources
from ..base import Command, last_activity, rank_died
from .memory import _CPUS, WindowHeap
from .server import _serve
from .watch import POLL_S, CommandWatch
from .wire import (
    CTL_SPIN_S,
    FDS_PER_MESSAGE,
    FRAME_BYTES,
    FRAME_HEAD,
    RESULT_BYTES,
    GroupLayout,
    PlanPickler,
    _SharedBytes,
)

_LIVE_GROUPS: weakref.WeakSet = weakref.WeakSet()


def _close_group_fds(keep: int) -> None:
    """In a freshly forked rank: close the driver ends of every live group's sockets, and every rank's death
    record file but ``keep`` (its own)."""
    for group in list(_LIVE_GROUPS):
        for s in group.socks:
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        for fd in group.fault_fds:
            if fd != keep:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _kill_and_reap(pids: dict[int, int]) -> None:
    """SIGKILL every process in ``pids`` (rank -> pid), wait for each, and empty the dict."""
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids.values():
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    pids.clear()


class RankGroup:
    """Rank processes forked once, each serving one command after another (a DistributedWorker's ranks).

    ``objects`` maps ``id()`` to the program functions (and program instances, or a whole plan)
    plans refer to; it must hold them before ``start()`` so the forked ranks have them too.  A
    one-shot call is a group used once: it is started with its command already published, over
    memory the ranks inherit (``inherited``), and closed after it.
    """

    in_process = False  # the ranks are other processes: host tensors reach them as shared files
    finishes_dfx = False  # the worker merges the ranks' DFX files when a dispatch ends

    def __init__(self, device_ids: list[int], objects: dict, startup_timeout_s: float, *,
                 owner: str = "DistributedWorker", inherited: dict | None = None, once: bool = False):
        self.device_ids = list(device_ids)
        self.world = len(device_ids)
        self.objects = objects
        self.startup_timeout_s = startup_timeout_s
        self.inherited = inherited or {}  # token -> memory mapped before the fork, which the ranks inherit
        self.once = once                  # a one-shot call's group: its ranks end after their one command
        self.layout = GroupLayout(self.world)
        resources.ensure_descriptors(owner, 2 * self.world)
        self.oom_kills = resources.oom_kills()
        self.death_notes: dict[int, str] = {}  # rank -> how its process ended, once reaped
        # rank -> the file where its process writes its stack if it dies without reporting (rank.death)
        self.fault_fds = [death.new_file(f"rank{r}") for r in range(self.world)]
        self._mm = mmap.mmap(-1, self.layout.total)
        self.arena = np.frombuffer(self._mm, dtype=np.uint8)
        self.base = self.arena.ctypes.data
        self.rank_sleepers = self.base + self.layout.rank_sleepers
        self.driver_sleepers = self.base + self.layout.driver_sleepers
        self.status = StatusBoard(self.arena[self.layout.status:self.layout.status + StatusBoard.nbytes(self.world)],
                                  self.world)
        self.ctl_spin_s = CTL_SPIN_S if self.world + 1 <= _CPUS else 0.0
        self.pids: dict[int, int] = {}
        self.socks: list[socket.socket | None] = []
        self.sent = 0  # commands published
        self.dead = False
        self._words: dict[str, np.ndarray] = {}
        # The frame's words and payload, made once: publishing a command is on every dispatch's path.
        frame = self.layout.frame
        self.frame_length = ctypes.c_int64.from_address(self.base + frame)
        self.frame_number = ctypes.c_int64.from_address(self.base + frame + 8)
        self.doorbell_addr = self.base + self.layout.doorbell
        self.finished_addr = self.base + self.layout.finished
        self._framed: tuple | None = None  # the command whose payload the frame holds
        _LIVE_GROUPS.add(self)

    def addr(self, offset: int) -> int:
        return self.base + offset

    def words(self, name: str) -> np.ndarray:
        w = self._words.get(name)
        if w is None:
            off = getattr(self.layout, name)
            w = self._words[name] = self.arena[off:off + 4 * self.world].view(np.int32)
        return w

    # -- start and stop -------------------------------------------------------------------
    def start(self, first: Command | None = None) -> CommandWatch | None:
        """Fork the ranks.

        Without ``first``, wait until every rank is up (RankError if one dies or is late).  With it,
        publish ``first`` before the fork (a one-shot call): the ranks run it as soon as they are set
        up, and its watch is returned.
        """
        parent = os.getpid()
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(self.world)]
        self.socks = [a for a, _ in pairs]
        watch = self.submit(first) if first is not None else None
        sys.stdout.flush()
        sys.stderr.flush()

        def fork_all() -> None:
            for r in range(self.world):
                pid = os.fork()
                if pid == 0:
                    own = pairs[r][1]
                    for _, b in pairs:
                        if b is not own:
                            b.close()
                    _close_group_fds(self.fault_fds[r])
                    _serve(self, r, own, parent)
                self.pids[r] = pid

        try:
            _in_lasting_thread(fork_all)
        finally:
            for _, b in pairs:  # the ranks' ends: each rank keeps its own copy
                b.close()
        if watch is None:
            self._await_start()
        return watch

    def _await_start(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        started = self.addr(self.layout.started)
        while True:
            n = _atomics.load(started)
            if n >= self.world:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ok, _ = _atomics.wait(started, self.driver_sleepers, 1, n + 1, 0.0, 0.0, min(POLL_S, left))
            if ok:
                continue
            dead = self.reap()
            if dead:
                self.kill()
                raise RankError(dead)
        up = self.words("up")
        late = [r for r in range(self.world) if not up[r]]
        self.kill()
        raise RankError([RankFailure(
            r, self.device_ids[r], None, "StartupTimeout",
            f"the rank process did not come up within startup_timeout_s={self.startup_timeout_s:g} s of "
            "prepare(); nothing was dispatched. If starting is legitimately this slow, pass a larger "
            "startup_timeout_s to prepare()", "") for r in late])

    def reap(self) -> list[RankFailure]:
        """Return a failure for every rank process that has exited (and reap it)."""
        if self.pids:
            try:  # one system call (the worker asks before every dispatch): has any child of ours ended?
                if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    return []
            except ChildProcessError:
                pass  # no child at all: the ranks were reaped elsewhere; the loop below says so
        out = []
        for r, pid in list(self.pids.items()):
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got, status = pid, None
            if got == 0 or self.pids.pop(r, None) is None:
                continue
            if self.once and status == 0 and self.words("done")[r] == self.sent:
                continue  # a one-shot call's rank that reported and ended
            why = resources.death_note(status, self.oom_kills) if status is not None else "ended (reaped elsewhere)"
            self.death_notes[r] = why
            task = self.status.rows[r]["task"].decode() or None
            record = death.read(self.fault_fds[r]) if self.fault_fds else None
            out.append(rank_died(r, self.device_ids[r], task, why, record,
                                 last_activity(self.status, r, named=record is not None)))
        return out

    def kill(self) -> None:
        """Kill and reap every rank; close the sockets.  Safe to call again."""
        _kill_and_reap(self.pids)
        for s in self.socks:
            if s is not None:
                s.close()
        self.socks = [None] * len(self.socks)
        for fd in self.fault_fds:
            os.close(fd)
        self.fault_fds = []
        self.dead = True
        _LIVE_GROUPS.discard(self)

    def close(self) -> None:
        """Stop the ranks and release the control mapping."""
        self.kill()
        self._words = {}
        arena, self.arena = self.arena, None
        del arena
        try:
            self._mm.close()
        except BufferError:
            pass  # a status view is still referenced; the GC unmaps it

    # -- commands -------------------------------------------------------------------------
    def encode_plan(self, payload) -> bytes:
        """Pickle a plan (and what goes with it) for the ranks."""
        buf = io.BytesIO()
        PlanPickler(buf, self.objects).dump(payload)
        return buf.getvalue()

    def submit(self, command: Command) -> CommandWatch:
        """Publish ``command`` to the ranks; return its watch.  The previous command must have finished."""
        heap, heap_ref = None, None
        if command.heap is not None:
            h = command.heap
            heap_ref = (h.token, h.stride, h.base)
            heap = WindowHeap.for_plan(h.data, h.base, h.stride, command.plan)
        wire = (command.plan_id, command.blob, command.segment,
                [None if v is None else v.key for v in command.hosts], heap_ref,
                [(m.token, m.size) for m in command.maps], command.drops, command.dfx, command.forget_plans,
                pickle.dumps(command.scalars) if command.scalars else b"")
        # Everything but the doorbell first: a woken rank should find the driver asleep, not busy.
        watch = CommandWatch(self, self.sent, command.plan, heap, command.hang_timeout)
        self.send(command.number, wire, command.fds)
        return watch

    def send(self, number: int, command: tuple, fds: list[int]) -> int:
        """Publish ``command`` (a ``_Wire``'s fields) of dispatch ``number`` to every rank, with ``fds``.

        ``fds`` are the files named in the command's ``maps``.  Returns the command's index.  The
        previous command must have finished.
        """
        index = self.sent
        if fds or command != self._framed:  # the same command again: the frame holds its payload already
            self._frame(command, fds)
        self.frame_number.value = number
        self.sent += 1
        _atomics.fetch_add(self.doorbell_addr, self.rank_sleepers, 1)
        return index

    def _frame(self, command: tuple, fds: list[int]) -> None:
        """Write ``command``'s payload into the frame (or, when too large, into a file sent to every rank), and
        send ``fds``."""
        payload = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
        blob = None
        self._framed = None
        if len(payload) > FRAME_BYTES:
            blob = _SharedBytes(payload)
            length = -len(payload)
        else:
            length = len(payload)
            start = self.layout.frame + FRAME_HEAD
            self._mm[start:start + length] = payload
        if blob is not None or fds:
            try:
                for s in self.socks:
                    if blob is not None:
                        socket.send_fds(s, [b"b"], [blob.fd])
                    for i in range(0, len(fds), FDS_PER_MESSAGE):
                        socket.send_fds(s, [b"m"], fds[i:i + FDS_PER_MESSAGE])
            finally:
                if blob is not None:
                    blob.close()
        self.frame_length.value = length
        if blob is None and not fds:
            self._framed = command

    def failure(self, rank: int) -> RankFailure:
        off = self.layout.results + rank * RESULT_BYTES
        n = int(ctypes.c_int64.from_address(self.base + off).value)
        return pickle.loads(bytes(self.arena[off + 8:off + 8 + n]))


_forker_lock = threading.Lock()
_forker_requests: queue.SimpleQueue = queue.SimpleQueue()
_forker: threading.Thread | None = None


def _in_lasting_thread(fn) -> None:
    """Run ``fn`` (which forks long-lived ranks) in a thread that lasts as long as this process.

    A rank asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), and to the kernel
    the parent is the *thread* that forked it: ranks forked by a thread that ends (a worker
    prepared in a short-lived thread) would die with that thread.  The main thread lasts as long
    as the process; any other caller hands the fork to one daemon thread kept for the purpose.
    """
    global _forker
    if threading.current_thread() is threading.main_thread():
        fn()
        return
    with _forker_lock:
        if _forker is None or not _forker.is_alive():
            _forker = threading.Thread(target=_serve_forks, name="ptodist-forker", daemon=True)
            _forker.start()
    done = threading.Event()
    box: list = []
    _forker_requests.put((fn, box, done))
    done.wait()
    if box:
        raise box[0]


def _serve_forks() -> None:
    while True:
        fn, box, done = _forker_requests.get()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the thread that asked
            box.append(e)
        finally:
            del fn
            done.set()
