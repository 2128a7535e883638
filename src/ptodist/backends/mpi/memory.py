"""RankMemory over MPI-3 RMA windows: this rank's heap, its peers' windows, signal cells, the accumulate lock;
a worker's window heap, kept across its commands."""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ConfigError
from ...rank.status import WAITING, StatusBoard
from ..base import notify_cell
from .layout import CHECK_S, CTL_BOARD, CTL_LOCK, MAX_CHUNK, TYPE_CACHE
from .remote import _RemoteBytes
from .session import _Session
from .wire import _byte_view

if TYPE_CHECKING:
    from .run import _MpiRun

# numpy dtypes an MPI Accumulate can add natively; the others (FP16, BF16) add under the lock.
_ACCUMULATE_TYPES = {np.dtype(np.float32): "FLOAT", np.dtype(np.float64): "DOUBLE", np.dtype(np.int8): "INT8_T",
                     np.dtype(np.int16): "INT16_T", np.dtype(np.int32): "INT32_T", np.dtype(np.int64): "INT64_T",
                     np.dtype(np.uint8): "UINT8_T"}


def _allocate(session: _Session, nbytes: int, program: str):
    MPI = session.MPI
    try:
        return MPI.Win.Allocate(nbytes, 1, comm=session.comm)
    except MPI.Exception as e:
        raise ConfigError(
            f"{program}: MPI could not allocate the RMA windows ({nbytes} bytes of window heap per rank): {e}. "
            "One-sided communication needs MPI_Win_allocate with passive target; with Open MPI over TCP, run "
            "with `--mca osc pt2pt` (or `--mca osc ucx` where UCX is installed); see docs/multi-node.md.") from None


class _Arena:
    """A worker's window heap on mpi: one MPI window, kept across commands; ``rows`` this rank's heap."""

    def __init__(self, session: _Session, stride: int):
        self.session = session
        self.stride = stride
        self.win = _allocate(session, stride, "DistributedWorker")
        self.rows = np.frombuffer(self.win.tomemory(), np.uint8)[:stride].reshape(1, stride)
        self.rows[:] = 0

    def close(self) -> None:
        """Free the window: collective, every process of the job closes its worker alike."""
        if self.win is not None:
            self.rows = None
            self.win.Free()
            self.win = None


class _OwnBoard:
    """This rank's status board: a one-rank StatusBoard in its control window, addressed by its rank."""

    def __init__(self, raw: np.ndarray):
        self.board = StatusBoard(raw, 1)
        self.row = self.board.rows[0]

    def set_running(self, rank: int, task: str) -> None:
        self.board.set_running(0, task)

    def set_waiting(self, rank: int, *args, **kwargs) -> None:
        self.board.set_waiting(0, *args, **kwargs)

    def finish(self, rank: int, state: int) -> None:
        self.board.finish(0, state)

    def ledger(self, rank: int):
        return self.board.ledger(0, last_op=False)  # the driver finds what a lost rank last did by itself

    def site_slot(self, rank: int, site) -> int:
        return self.board.site_slot(0, site)


class MpiMemory:
    """RankMemory over MPI windows: the local rank's heap is a numpy array, a peer's a :class:`RemoteArray`."""

    def __init__(self, run: _MpiRun):
        s = run.session
        self.MPI = MPI = s.MPI
        self.run = run
        self.rank = s.rank
        self.world = s.size
        self.heap, self.ctl = run.heap, run.ctl
        self.heap_mem, self.ctl_mem = run.heap_mem, run.ctl_mem
        self.offsets = [w.offset for w in run.plan.windows]
        self.sizes = [w.nbytes for w in run.plan.windows]
        self.status = _OwnBoard(self.ctl_mem[CTL_BOARD:CTL_BOARD + StatusBoard.nbytes(1)])
        self._peers: dict = {}
        self._sends: list = []  # (request, buffer) of the host-tensor bytes sent to other ranks
        self._dirty: set[int] = set()  # ranks with puts not yet completed at the target
        self._types: OrderedDict = OrderedDict()
        self._acc_types = {dt: getattr(MPI, name) for dt, name in _ACCUMULATE_TYPES.items()}
        self._value = np.zeros(1, np.int32)
        self._snapshots: dict = {}  # buffer id -> the array cells() reads the buffer's cells into
        self._compare = np.zeros(1, np.int32)
        self._result = np.zeros(1, np.int32)
        self._sum, self._replace, self._no_op = MPI.SUM, MPI.REPLACE, MPI.NO_OP
        comm, any_source, any_tag = run.comm, MPI.ANY_SOURCE, MPI.ANY_TAG
        # A probe on ptodist's own communicator (no message is ever pending there) runs MPI's progress engine.
        self._progress = lambda: comm.Iprobe(any_source, any_tag)
        # Waits poll (MPI has no wake-up for a cell): spin, yield the core (the rank waited for may need it),
        # then sleep in short steps.  Ranks outnumbering their machine's cores spin only briefly.
        if s.oversubscribed:
            self.spin_s, self.yield_s, self.sleep_s = 2e-6, 1e-3, (50e-6, 250e-6)
        else:
            self.spin_s, self.yield_s, self.sleep_s = 300e-6, 2e-3, (50e-6, 250e-6)

    # -- windows ----------------------------------------------------------------------------------
    def window_bytes(self, buffer_id: int, rank: int):
        """Rank ``rank``'s bytes of buffer ``buffer_id``: a numpy array for this rank, else remote bytes."""
        off, n = self.offsets[buffer_id], self.sizes[buffer_id]
        if rank == self.rank:
            return self.heap_mem[off:off + n]
        key = (buffer_id, rank)
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = _RemoteBytes(self, rank, off, n)
        return peer

    def _datatype(self, shape: tuple, sizes: tuple, itemsize: int, base):
        """The target datatype of a region (None when it is contiguous), made of ``base`` elements.

        The region's trailing dimensions that it covers whole form one contiguous block; each outer
        dimension it spans adds an hvector of the block.  Its lower bound is the region's first byte.
        """
        d = len(shape)
        k = d - 1
        block = sizes[k] if d else 1
        while k > 0 and sizes[k] == shape[k]:
            k -= 1
            block *= sizes[k]
        if all(sizes[i] == 1 for i in range(k)):
            return None
        key = (shape, sizes, itemsize, base.py2f())
        t = self._types.get(key)
        if t is not None:
            self._types.move_to_end(key)
            return t
        elem = block * itemsize if base == self.MPI.BYTE else block
        made = [base.Create_contiguous(elem)]
        stride = itemsize * int(np.prod(shape[k:], dtype=np.int64))
        for i in range(k - 1, -1, -1):
            if sizes[i] > 1:
                made.append(made[-1].Create_hvector(sizes[i], 1, stride))
            stride *= shape[i]
        t = made.pop().Commit()
        for m in made:
            m.Free()
        self._types[key] = t
        if len(self._types) > TYPE_CACHE:
            self._types.popitem(last=False)[1].Free()
        return t

    @staticmethod
    def _offset(shape: tuple, starts: tuple, itemsize: int) -> int:
        off, stride = 0, itemsize
        for n, s in zip(reversed(shape), reversed(starts)):
            off += s * stride
            stride *= n
        return off

    def _settle(self, rank: int) -> None:
        """Complete earlier puts to ``rank`` at their target (MPI does not order a put and a later get)."""
        if rank in self._dirty:
            self.heap.Flush(rank)
            self._dirty.discard(rank)

    def get(self, rank: int, disp: int, shape: tuple, starts: tuple, sizes: tuple, dtype: np.dtype) -> np.ndarray:
        """Read a region of rank ``rank``'s array at heap byte ``disp`` into a new contiguous array."""
        out = np.empty(sizes, dtype)
        if out.size == 0:
            return out
        self._settle(rank)
        self._move(self.heap.Get, rank, _byte_view(out), disp + self._offset(shape, starts, dtype.itemsize),
                   self._datatype(shape, sizes, dtype.itemsize, self.MPI.BYTE))
        return out

    def put(self, rank: int, disp: int, shape: tuple, starts: tuple, sizes: tuple, data: np.ndarray) -> None:
        """Write contiguous ``data`` into a region of rank ``rank``'s array; complete at the next notify."""
        if data.size == 0:
            return
        self._move(self.heap.Put, rank, _byte_view(data), disp + self._offset(shape, starts, data.itemsize),
                   self._datatype(shape, sizes, data.itemsize, self.MPI.BYTE))
        self._dirty.add(rank)

    def _move(self, call, rank: int, raw: np.ndarray, at: int, target_type) -> None:
        """``call`` (Get or Put) the local bytes ``raw`` to/from rank ``rank``'s heap at byte ``at``.

        ``target_type`` is the derived datatype of a strided region, or None for a contiguous one (moved
        in pieces of at most MAX_CHUNK bytes).  Locally complete on return: ``raw`` may be read or reused.
        """
        BYTE = self.MPI.BYTE
        if target_type is None:
            for lo in range(0, raw.size, MAX_CHUNK):
                piece = raw[lo:lo + MAX_CHUNK]
                call([piece, piece.size, BYTE], rank, (at + lo, piece.size, BYTE))
        else:
            call([raw, raw.size, BYTE], rank, (at, 1, target_type))
        self.heap.Flush_local(rank)

    def accumulate(self, rank: int, disp: int, shape: tuple, starts: tuple, sizes: tuple, data: np.ndarray) -> None:
        """Add contiguous ``data`` into a region of rank ``rank``'s array (the caller holds its lock)."""
        if data.size == 0:
            return
        base = self._acc_types.get(data.dtype)
        if base is None:
            # No MPI type for FP16/BF16: read, add, write back; the lock makes it atomic.
            current = self.get(rank, disp, shape, starts, sizes, data.dtype)
            current += data.reshape(current.shape)
            self.put(rank, disp, shape, starts, sizes, current)
            return
        self._settle(rank)
        at = disp + self._offset(shape, starts, data.itemsize)
        t = self._datatype(shape, sizes, data.itemsize, base)
        flat = data.reshape(-1)
        if t is None:
            for lo in range(0, flat.size, MAX_CHUNK // data.itemsize):
                piece = flat[lo:lo + MAX_CHUNK // data.itemsize]
                self.heap.Accumulate([piece, piece.size, base], rank, (at + lo * data.itemsize, piece.size, base),
                                     self._sum)
        else:
            self.heap.Accumulate([flat, flat.size, base], rank, (at, 1, t), self._sum)
        self.heap.Flush_local(rank)
        self._dirty.add(rank)

    def flush_all(self) -> None:
        """Complete every outstanding put and accumulate at its target."""
        if self._dirty:
            self.heap.Flush_all()
            self._dirty.clear()
        self.heap.Sync()

    def free_types(self) -> None:
        for t in self._types.values():
            t.Free()
        self._types.clear()

    # -- host-tensor bytes between ranks (the host's order of chip tasks) -------------------------
    # Each process holds its own copy of the host tensors: a chip task that reads what a task of another rank
    # wrote receives those bytes, sent once the writer is complete (before the notify its edge waits for).
    def send_host(self, rank: int, tag: int, data: np.ndarray) -> None:
        """Send ``data`` (bytes of this rank's host tensors) to ``rank``'s task ``tag``; completes later."""
        comm = self.run.host_comm
        self._sends.append((comm.Isend([data, self.MPI.BYTE], rank, tag % self.run.tag_end), data))

    def recv_host(self, rank: int, tag: int, nbytes: int) -> np.ndarray:
        """The bytes ``rank`` sends this rank's task ``tag``; its edge's wait came first, so they are on their way."""
        out = np.empty(nbytes, np.uint8)
        req = self.run.host_comm.Irecv([out, self.MPI.BYTE], rank, tag % self.run.tag_end)
        delay, most = self.sleep_s
        control = self.run.control
        while True:
            with self.run.lock:
                if req.Test():
                    return out
            control.poll(time.monotonic(), watching=False)  # a vanished sender ends the job, an abort this rank
            time.sleep(delay)
            delay = min(delay * 2, most)

    def settle_sends(self, ok: bool) -> None:
        """After every rank ended: complete the sends (all were received when the run succeeded), or let them go."""
        if ok:
            self.MPI.Request.Waitall([req for req, _ in self._sends])
        else:
            for req, data in self._sends:
                req.Free()
                self.run._abandoned.append(data)  # MPI may still read it
        self._sends.clear()

    # -- signal cells -----------------------------------------------------------------------------
    def _atomic(self, win, rank: int, disp: int, value: int, op) -> int:
        self._value[0] = value
        win.Fetch_and_op(self._value, self._result, rank, disp, op)
        win.Flush(rank)
        return int(self._result[0])

    def _before_notify(self) -> None:
        # Data first: this rank's stores (Sync) and its puts (flush) are visible before the signal is.
        self.run.control.check_abort()
        if self._dirty:
            self.heap.Flush_all()
            self._dirty.clear()
        self.heap.Sync()

    def notify(self, ledger, buffer_id: int, rank: int, offset: int, value: int, is_set: int, word: int,
               slot: int) -> int:
        return notify_cell(self, ledger, buffer_id, rank, offset, value, is_set, word, slot)

    def cell_add(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        self._before_notify()
        return self._atomic(self.heap, rank, self.offsets[buffer_id] + offset, value, self._sum)

    def cell_set(self, buffer_id: int, rank: int, offset: int, value: int) -> int:
        self._before_notify()
        return self._atomic(self.heap, rank, self.offsets[buffer_id] + offset, value, self._replace)

    def cell_load(self, buffer_id: int, rank: int, offset: int) -> int:
        return self._atomic(self.heap, rank, self.offsets[buffer_id] + offset, 0, self._no_op)

    def cell_wait(self, buffer_id: int, offset: int, ge: bool, expected: int, timeout_s: float) -> tuple[bool, int]:
        """Poll the local cell with MPI atomics (which also drive MPI progress for the peers' RMA)."""
        disp = self.offsets[buffer_id] + offset
        seen = [0]

        def holds() -> bool:
            v = seen[0] = self._atomic(self.heap, self.rank, disp, 0, self._no_op)
            return (v >= expected) if ge else (v == expected)

        return self.wait_any(holds, timeout_s), seen[0]

    def cells(self, buffer_id: int) -> np.ndarray:
        """This rank's copy of buffer ``buffer_id`` as INT32 cells, read now: one atomic read of every cell
        (``MPI_Get_accumulate`` with ``MPI_NO_OP``, element-wise atomic with the peers' notifies, whatever the
        window's memory model)."""
        n = self.sizes[buffer_id] // 4
        out = self._snapshots.get(buffer_id)
        if out is None:
            out = self._snapshots[buffer_id] = np.zeros(n, np.int32)
        INT = self.MPI.INT32_T
        self.heap.Get_accumulate([out, n, INT], [out, n, INT], self.rank, (self.offsets[buffer_id], n, INT),
                                 self._no_op)
        self.heap.Flush(self.rank)
        return out

    def wait_any(self, check, timeout_s: float) -> bool:
        """Poll ``check()`` (a look at this rank's cells, with MPI atomics) until it holds, at most ``timeout_s``:
        spin, then yield, then sleep, as ranks may outnumber cores; MPI has no wake-up for a cell."""
        now = start = time.monotonic()
        deadline = start + timeout_s
        spin_end = start + self.spin_s
        yield_end = spin_end + self.yield_s
        delay, most = self.sleep_s
        next_check = start + CHECK_S
        control = self.run.control
        while True:
            if check():
                self.heap.Sync()  # the peers' puts that came before the notifies are now visible locally
                return True
            # Where one-sided operations are emulated (TCP, UCX without hardware atomics) the peers'
            # notifies and gets complete only while this process runs MPI's progress engine.
            self._progress()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_S
                control.poll(now, watching=int(self.status.row["state"]) == WAITING)
            if now >= deadline:
                return False
            if now < spin_end:
                continue
            if now < yield_end:
                os.sched_yield()
                continue
            time.sleep(delay)
            delay = min(delay * 2, most)

    def compile_steps(self, steps: list) -> None:
        return None  # a peer's memory is reached through MPI RMA calls, one per operation

    @contextmanager
    def locked(self, rank: int):
        """Hold rank ``rank``'s accumulate lock: a compare-and-swap word in its control window."""
        me = self.rank + 1
        delay, most = self.sleep_s
        next_check = time.monotonic() + CHECK_S
        while True:
            self._value[0], self._compare[0] = me, 0
            self.ctl.Compare_and_swap(self._value, self._compare, self._result, rank, CTL_LOCK)
            self.ctl.Flush(rank)
            if self._result[0] == 0:
                break
            self._progress()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_S
                self.run.control.poll(now, watching=False)
            time.sleep(delay)
            delay = min(delay * 2, most)
        try:
            yield
        finally:
            # The adds made under the lock are complete before the next holder reads.
            self._settle(rank)
            self.heap.Sync()
            self._value[0], self._compare[0] = 0, me
            self.ctl.Compare_and_swap(self._value, self._compare, self._result, rank, CTL_LOCK)
            self.ctl.Flush(rank)


