"""A rank's remote memory access: ``pld.tile.remote_load`` / ``remote_store``, ``pld.tensor.put`` / ``get`` (and
``pld.tile.put`` / ``get``), and ``pld.tensor.put_async`` with its session and event.
"""

from __future__ import annotations

import numpy as np

from .. import _atomics
from ..compiler import checks
from ..errors import KernelStateError, KernelValueError, ProgramError, ProgramTypeError, ProgramValueError
from ..language import dtypes as dt
from ..language.distributed.types import AsyncEvent, AsyncSession, AtomicType
from ..language.scalar import Scalar, as_int
from ..language.tile_ops import Tile
from ..source import user_location
from .events import now_ns
from .status import LAST_OP_CODES
from .tensors import RankTensor, WindowTensor

_REMOTE_LOAD, _PUT, _GET = (LAST_OP_CODES[n] for n in ("pld.tile.remote_load", "pld.tensor.put", "pld.tensor.get"))
_plain_region = _atomics.region


def _tile(data: np.ndarray, dtype, valid) -> Tile:
    """``Tile(data, dtype, valid)`` for ``data`` already of ``dtype``'s numpy type (a copy of window memory):
    what the constructor would convert or check is already so, and the per-op cost is what matters here."""
    t = Tile.__new__(Tile)
    t.data, t.dtype, t.space = data, dtype, None
    t.valid_shape = tuple(valid) if valid is not None else data.shape
    return t


class RmaCalls:
    """The RMA operations of :class:`~ptodist.rank.context.RankContext` (a part of it)."""

    def remote_load(self, target, peer, offsets, shape, valid_shape=None):
        """``pld.tile.remote_load``."""
        op = "pld.tile.remote_load"
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((target,))
        if type(offsets) is not list:
            offsets = list(offsets)
        if type(shape) is not list:
            shape = list(shape)
        w = target if isinstance(target, WindowTensor) else self._window(op, target, "target")
        p = self._peer(op, peer, w)
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, _REMOTE_LOAD)
        if missed is not None:
            self._step_missed(missed, _REMOTE_LOAD, 1)
        start = now_ns() if self.events is not None else 0
        if valid_shape is None:  # the whole tile is valid: the region is the tile (plain ints checked in C)
            sl = _plain_region(offsets, shape, w._shape) or self._region(op, w, offsets, shape)
            region = w.peer_array(p)[sl]
            data, valid = region.copy(), None
        else:
            shape, valid = self._valid_extent(op, shape, valid_shape, w, offsets)
            region = w.peer_array(p)[self._region(op, w, offsets, valid, shape if valid != shape else None)]
            data = self._padded(region, shape)
            if valid == shape:
                valid = None
        if self.checking:
            self._touch(op, w, region, False)
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=region.nbytes, direction="read")
        return _tile(data, w.dtype, valid)

    def remote_store(self, tile, target, peer, offsets, atomic, op="pld.tile.remote_store"):
        """``pld.tile.remote_store`` (and ``pld.tensor.remote_store``, named by ``op``)."""
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((tile, target))
        if type(offsets) is not list:
            offsets = list(offsets)
        w = target if isinstance(target, WindowTensor) else self._window(op, target, "target")
        p = self._peer(op, peer, w)
        if type(tile) is Tile and tile.dtype is w.dtype and tile.valid_shape == tile.data.shape:
            # The usual case, checked inline: a whole tile of the window's dtype and rank, at plain ints.
            data = tile.data
            sl = _plain_region(offsets, data.shape, w._shape)
            if sl is None:
                sl, data = self._store_region(op, w, offsets, data)
        else:
            sl, data = self._store_region(op, w, offsets, self._tile_data(op, tile, w))
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        code = LAST_OP_CODES[op]
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, code)
        if missed is not None:
            self._step_missed(missed, code, 1)
        start = now_ns() if self.events is not None else 0
        dst = w.peer_array(p)
        if atomic is AtomicType.Add:
            self._accumulate(op, w, dst, sl, data, p)
        else:
            if self.checking:
                self._touch(op, w, dst[sl], True)
            dst[sl] = data
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=data.nbytes, direction="write",
                      atomic=atomic.name if isinstance(atomic, AtomicType) else "None_")

    def _transfer_regions(self, op, dst: RankTensor, src: RankTensor, dst_offsets, src_offsets, shape, chunk_rows,
                          chunk_cols, pipeline):
        if pipeline and (as_int(chunk_rows, "chunk_rows") <= 0 or as_int(chunk_cols, "chunk_cols") <= 0):
            raise KernelValueError(f"{op} at {user_location(2)}: pipeline=True needs chunk_rows > 0 and "
                                   f"chunk_cols > 0 (got chunk_rows={chunk_rows}, chunk_cols={chunk_cols})")
        given = {"dst_offsets": dst_offsets, "src_offsets": src_offsets, "shape": shape}
        missing = [k for k, v in given.items() if v is None]
        if missing and len(missing) < 3:
            raise KernelValueError(f"{op} at {user_location(2)}: dst_offsets, src_offsets and shape go together; "
                                   f"{', '.join(missing)} missing")
        if missing:
            if dst.shape != src.shape:
                raise KernelValueError(f"{op} at {user_location(2)}: without a region, src and dst must have the "
                                       f"same shape; {src.describe()} vs {dst.describe()}. Give dst_offsets, "
                                       "src_offsets and shape.")
            whole = tuple(slice(None) for _ in dst.shape)
            return whole, whole
        return self._region(op, dst, dst_offsets, shape), self._region(op, src, src_offsets, shape)

    def put(self, dst, peer, src, dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline,
            op="pld.tensor.put"):
        """``pld.tensor.put`` (and ``pld.tile.put``, named by ``op``)."""
        transfer = (dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline)
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((dst, src))
        w = dst if isinstance(dst, WindowTensor) else self._window(op, dst, "dst")
        p = self._peer(op, peer, w)
        s = src if isinstance(src, RankTensor) else self._tensor(op, src, "src")
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, _PUT)
        if missed is not None:
            self._step_missed(missed, _PUT, 1)
        start = now_ns() if self.events is not None else 0
        dst_array = w.peer_array(p)
        nbytes = self._plain_copy(dst_array, w, s.array, s, transfer)
        if nbytes < 0:
            nbytes = self._copy(op, w, dst_array, p, s, s.array, *transfer)
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=nbytes, direction="write",
                      atomic=transfer[3].name if isinstance(transfer[3], AtomicType) else "None_")

    def get(self, dst, peer, src, dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline,
            op="pld.tensor.get"):
        """``pld.tensor.get`` (and ``pld.tile.get``, named by ``op``)."""
        transfer = (dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline)
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_overlapping((dst, src))
        w = src if isinstance(src, WindowTensor) else self._window(op, src, "src")
        p = self._peer(op, peer, w)
        d = dst if isinstance(dst, RankTensor) else self._tensor(op, dst, "dst")
        if not d.writable:
            self._writable(op, d)
        # Count the operation and make it the rank's last, at the program's line (a collective's only count).
        missed = self._ledger.step(0) if self._in_collective else self._ledger.step_at(self._call_sites, 1, _GET)
        if missed is not None:
            self._step_missed(missed, _GET, 1)
        start = now_ns() if self.events is not None else 0
        src_array = w.peer_array(p)
        nbytes = self._plain_copy(d.array, d, src_array, w, transfer)
        if nbytes < 0:
            nbytes = self._copy(op, d, d.array, d.rank if isinstance(d, WindowTensor) else None, w, src_array,
                                *transfer)
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=nbytes, direction="read",
                      atomic=transfer[3].name if isinstance(transfer[3], AtomicType) else "None_")

    def _plain_copy(self, dst_array, dst, src_array, src, transfer) -> int:
        """The usual put / get, checked inline: plain-int regions of one dtype, no atomic, no pipeline, no trace.
        Returns the bytes moved, or -1 for anything else (then :meth:`_copy` checks, explains and moves)."""
        dst_offsets, src_offsets, shape, atomic, _, _, pipeline = transfer
        if pipeline or atomic is AtomicType.Add or src.dtype is not dst.dtype or self.checking or shape is None:
            return -1
        dsl = _plain_region(dst_offsets, shape, dst_array.shape)
        ssl = _plain_region(src_offsets, shape, src_array.shape) if dsl is not None else None
        if ssl is None:
            return -1
        data = src_array[ssl]
        dst_array[dsl] = data
        if self._coll.recording is not None:
            self._coll.recording.moved(dst_array[dsl], data, False, None)
        return data.nbytes

    def _copy(self, op, dst, dst_array, owner, src, src_array, dst_offsets, src_offsets, shape, atomic, chunk_rows,
              chunk_cols, pipeline) -> int:
        """Move a region from ``src_array`` into ``dst_array`` (``owner``: the rank whose window is written).

        Returns the number of bytes moved."""
        if src.dtype is not dst.dtype and src.dtype.np_dtype != dst.dtype.np_dtype:
            raise ProgramTypeError(f"{op} at {user_location(2)}: src {src.describe()} and dst {dst.describe()} "
                                   "have different dtypes")
        if not pipeline and dst_offsets is not None and src_offsets is not None and shape is not None:
            # The usual case: plain ints inside the bounds (checked in C), else _region's checks and errors.
            dsl = _plain_region(dst_offsets, shape, dst_array.shape) or self._region(op, dst, dst_offsets, shape)
            ssl = _plain_region(src_offsets, shape, src_array.shape) or self._region(op, src, src_offsets, shape)
        else:
            dsl, ssl = self._transfer_regions(op, dst, src, dst_offsets, src_offsets, shape, chunk_rows, chunk_cols,
                                              pipeline)
        data = src_array[ssl]
        if src.full_shape is not None or dst.full_shape is not None:
            # A partly valid view on either side: only what is valid on both sides moves (numpy has cut each
            # region to its view's valid region).
            room = dst_array[dsl].shape
            if data.shape != room:
                data = data[tuple(slice(0, min(a, b)) for a, b in zip(data.shape, room))]
                dsl = tuple(slice(s.indices(n)[0], s.indices(n)[0] + c) for s, n, c in zip(dsl, dst_array.shape,
                                                                                          data.shape))
        if self.checking:
            self._touch(op, src, data, False)
        if atomic is AtomicType.Add:
            self._accumulate(op, dst, dst_array, dsl, data, owner)
        else:
            if self.checking:
                self._touch(op, dst, dst_array[dsl], True)
            dst_array[dsl] = data
        if self._coll.recording is not None:
            self._coll.recording.moved(dst_array[dsl], data, atomic is AtomicType.Add, owner)
        return data.nbytes

    # -- pld.tensor.put_async, its session and its event -------------------------------------------------------
    # The data lands when put_async is called (as the device's CPU simulation does), but the transfer counts as
    # complete only at its wait: that is where the checker sees the write (a notify between the two races with
    # it), and a source changed before the wait is an error (the device may read it until then).
    def _async_session(self, op, sync_id, block_bytes):
        loc = user_location(2)
        if not self._kernel_depth:
            raise ProgramError(f"{op} at {loc}: is called outside a kernel; an SDMA session belongs to a kernel "
                               "(@pl.jit.incore): build it there, before the kernel's first pld.tensor.put_async.")
        if isinstance(sync_id, bool) or not isinstance(sync_id, int) or not 0 <= sync_id <= 7:
            raise ProgramValueError(f"{op} at {loc}: sync_id must be an int in [0, 7] (the device has 8 SDMA sync "
                                    f"flags), got {sync_id!r}")
        if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 0:
            raise ProgramValueError(f"{op} at {loc}: block_bytes must be an int >= 0 (the SDMA chunk size in bytes; "
                                    f"0 for the 1 MiB default), got {block_bytes!r}")
        return AsyncSession(sync_id, block_bytes or 1 << 20, self._run.task_id, str(loc))

    def _put_async(self, op, dst, peer, src, session, dst_offsets, src_offsets, shape):
        loc = user_location(2)
        if not isinstance(session, AsyncSession):
            raise ProgramTypeError(f"{op} at {loc}: session must be the pl.AsyncSession of "
                                   f"pld.system.async_session(), got {checks.value_kind(session)}")
        if session.task != self._run.task_id:
            raise ProgramValueError(f"{op} at {loc}: the session was built by another task (at {session.where}); "
                                    "build one in this kernel with pld.system.async_session()")
        w = dst if isinstance(dst, WindowTensor) else self._window(op, dst, "dst")
        p = self._peer(op, peer, w)
        s = self._tensor(op, src, "src")
        if s.dtype is not w.dtype:
            raise ProgramTypeError(f"{op} at {loc}: dst {w.describe()} and src {s.describe()} must have the same "
                                   "dtype")
        if len(w.shape) != len(s.shape):
            raise ProgramValueError(f"{op} at {loc}: dst rank ({len(w.shape)}) must match src rank "
                                    f"({len(s.shape)}); {w.describe()} and {s.describe()}")
        dsl, ssl = self._transfer_regions(op, w, s, dst_offsets, src_offsets, shape, 0, 0, False)
        sent = s.array[ssl].copy()
        if sum(d != 1 for d in sent.shape) > 1:
            raise ProgramValueError(f"{op} at {loc}: what moves must be logically 1-D (every dimension but one of "
                                    f"size 1: the SDMA engine moves one flat run), got shape {list(sent.shape)}. "
                                    "Move it with pld.tensor.put, or one row per put_async.")
        self._progressed()
        start = now_ns() if self.events is not None else 0
        w.peer_array(p)[dsl] = sent  # a peer's window on mpi is a RemoteArray: an assignment is its MPI Put
        if self.events is not None:
            self._log("rma", op, start, buffer=w.buffer.name, peer=p, bytes=sent.nbytes, direction="write",
                      atomic="None_")
        event = AsyncEvent(session, str(loc), (w, p, dsl, s, ssl, sent))
        self._run.async_open.append(event)
        return event

    def _wait_async_event(self, op, event, session):
        loc = user_location(2)
        if not isinstance(event, AsyncEvent):
            raise ProgramTypeError(f"{op} at {loc}: event must be the pl.AsyncEvent pld.tensor.put_async returned, "
                                   f"got {checks.value_kind(event)}")
        if not isinstance(session, AsyncSession):
            raise ProgramTypeError(f"{op} at {loc}: session must be the pl.AsyncSession of "
                                   f"pld.system.async_session(), got {checks.value_kind(session)}")
        if event.session is not session:
            raise ProgramValueError(f"{op} at {loc}: the event was issued on another session (by the put_async at "
                                    f"{event.where}); wait with the session it was issued on")
        if event.transfer is None:  # drained by an earlier wait
            return Scalar(True, dt.BOOL)
        w, p, dsl, s, ssl, sent = event.transfer
        event.transfer = None
        self._run.async_open.remove(event)
        src_view = s.array[ssl]
        if src_view.tobytes() != sent.tobytes():
            raise KernelStateError(
                f"{op} at {loc}: the source {s.describe()} of the pld.tensor.put_async at {event.where} changed "
                "before this wait; the device may read the source until the wait returns, so the peer could "
                "receive either version. Write the source only after the wait (or put_async a copy).")
        if self.checking:  # the transfer's accesses, complete here
            self._touch("pld.tensor.put_async", s, src_view, False)
            self._touch("pld.tensor.put_async", w, w.peer_array(p)[dsl], True)
        self._progressed()
        return Scalar(True, dt.BOOL)

    def _undrained(self) -> None:
        """Refuse a task that returns with put_async transfers of its own not waited."""
        left = [e for e in self._run.async_open if e.session.task == self._run.task_id]
        if left:
            for e in left:
                self._run.async_open.remove(e)
            raise KernelStateError(
                f"pld.tensor.put_async at {left[0].where}: the kernel returned before waiting for its event "
                f"({len(left)} transfer{'s' if len(left) > 1 else ''} not waited); the data may still be in "
                "flight. Call pld.system.wait_async_event(event, session) before the kernel returns.")
