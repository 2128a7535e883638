"""A rank's memory operations: ``pl.load`` / ``store`` / ``read`` / ``write`` / ``slice`` / ``create_tensor``, their
checks (regions, peers, dtypes, read-only tensors), and, under ``ptodist check``, the record of every access.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from .. import _atomics
from ..check.findings import padding_read
from ..compiler import checks
from ..errors import (
    WINDOW_KIND_PITFALL,
    KernelIndexError,
    KernelValueError,
    PeerRangeError,
    ProgramTypeError,
    ProgramValueError,
    classified,
)
from ..language import dtypes as dt
from ..language.distributed.types import AtomicType
from ..language.scalar import Scalar, as_int
from ..language.tile_ops import Tile
from ..source import user_frame, user_location
from .tensors import RankTensor, WindowTensor

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds

_plain_region = _atomics.region
ATOMIC_ADD_DTYPES = (dt.FP32, dt.FP16, dt.BF16, dt.INT32, dt.INT16, dt.INT8)


@dataclass
class AccessState:
    """What a rank keeps of the memory its operations touch."""

    polled: dict = field(default_factory=dict)  # (array address, index) -> the value pl.read saw there last
    spans: tuple[list, list] | None = None  # window copies by address, for _touch
    locals: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, id) of pl.create_tensor memory
    # (low, high) -> (root buffer, "host" or "local") of memory outside windows accessed
    kept: dict = field(default_factory=dict)
    padding_reads: set = field(default_factory=set)  # the lines whose padding read the checker was told of


def _index(v, op: str, what: str) -> int:
    """``v`` as a plain int: an integer Scalar's value, else :func:`as_int`'s conversion (and its error).

    The hot paths test ``type(v) is int`` inline and call this only otherwise, so that the message's
    f-string is built only for what is not already an int.
    """
    if type(v) is Scalar and not v.dtype.is_float:
        return v.value
    return as_int(v, f"{op} {what}")


class MemoryCalls:
    """The memory operations of :class:`~ptodist.rank.context.RankContext` (a part of it, with what it keeps
    of the memory touched in ``self._access``, an :class:`AccessState`)."""

    def _touch(self, op: str, t: RankTensor, view: np.ndarray, write: bool, atomic: bool = False) -> None:
        """Record an access to window memory for the checker; ``view`` holds exactly the elements touched.

        Whatever tensor the op was given (a window, a pl.slice of one, a host tensor), the address
        decides: only bytes inside some rank's copy of a window buffer are recorded.
        """
        if view.size == 0:
            return
        if self._access.spans is None:
            spans = sorted((byte_bounds(self.memory.window_bytes(b.id, r)), r, b.id)
                           for b in self.plan.windows if b.nbytes for r in range(self.world))
            self._access.spans = ([lo for (lo, _), _, _ in spans], spans)
        starts, spans = self._access.spans
        addr = view.__array_interface__["data"][0]
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr >= spans[i][0][1]:
            if len(self.events.actors) > 1:  # before the first task the orchestration alone touches this rank's memory
                self._touch_private(op, t, view, write, atomic, addr)
            return
        (lo, _), owner, buffer_id = spans[i]
        site = user_frame(2)
        self.events.access(op, write, atomic, owner, buffer_id, addr - lo, view.shape, view.strides, view.itemsize,
                           t.dtype.name, t.name, f"{site[0]}:{site[1]}" if site else "")

    def _touch_private(self, op: str, t: RankTensor, view: np.ndarray, write: bool, atomic: bool, addr: int) -> None:
        """Record an access to this rank's memory outside windows (a host tensor, a ``pl.create_tensor``
        tensor), by its root buffer's address range: the checker looks for races between the rank's tasks there."""
        root = view
        while isinstance(root.base, np.ndarray):
            root = root.base
        lo, hi = byte_bounds(root)
        kept = self._access.kept.get((lo, hi))
        if kept is None:  # kept alive until the dispatch ends: no later tensor takes these addresses
            kind = "local" if any(llo <= addr < lhi for llo, lhi, _ in self._access.locals) else "host"
            kept = self._access.kept[(lo, hi)] = (root, kind)
        kind = kept[1]
        site = user_frame(3)
        self.events.access(op, write, atomic, self.rank, None, addr - lo, view.shape, view.strides, view.itemsize,
                           t.dtype.name, t.name, f"{site[0]}:{site[1]}" if site else "", (kind, lo, hi))

    def padding_read(self, op: str, tile, axis: int) -> None:
        """Under ``ptodist check``: tell the checker that ``op`` reads ``tile``'s undefined padding on a device."""
        if not self.checking:
            return
        site = user_frame(2)
        where = f"{site[0]}:{site[1]}" if site else op
        if where not in self._access.padding_reads:
            self._access.padding_reads.add(where)
            self.events.finding(padding_read(self.rank, op, where, tile.data.shape, tile.valid_shape, axis,
                                             getattr(tile, "pad_src", None)))

    def _tensor(self, op: str, t, what: str = "tensor") -> RankTensor:
        if isinstance(t, RankTensor):
            return t
        if isinstance(t, Tile):
            raise ProgramTypeError(f"{op} at {user_location(2)}: the {what} argument is a Tile (on-chip data); "
                                   "it needs a tensor in memory")
        raise ProgramTypeError(f"{op} at {user_location(2)}: the {what} argument must be a tensor, "
                               f"got {checks.value_kind(t)}")

    def _window(self, op: str, t, what: str) -> WindowTensor:
        if isinstance(t, WindowTensor):
            return t
        raise classified(ProgramTypeError(
            f"{op} at {user_location(2)}: '{what}' must be a pld.DistributedTensor (window) — remote memory "
            f"exists only in windows — got {checks.value_kind(t)}. Pass pld.window(buf, shape, dtype=...)."),
            pitfall=WINDOW_KIND_PITFALL)

    def _region(self, op: str, t: RankTensor, offsets, shape, valid_of=None, what: str = "tile") -> tuple:
        """The slices of ``t`` that the region at ``offsets`` of size ``shape`` covers, bounds-checked.

        ``valid_of``: ``shape`` is the valid extent of a ``what`` (a tile, a view) of that (larger) shape: only the
        valid region must lie inside ``t``, as upstream PyPTO checks a tail tile's load or slice (its
        ``pl.slice``/``pl.load`` docstrings: ``valid_shape`` bounds what is read, ``clamp`` cuts it to the edge).
        On a partly valid ``t`` the slices may reach past ``t.array``; numpy cuts them to the valid region.
        """
        # The hot path: plain ints inside the bounds, checked in C; anything else takes the checks below, and
        # their errors.
        sl = _plain_region(offsets, shape, t.array.shape)
        if sl is not None:
            return sl
        offsets = [o if type(o) is int else _index(o, op, "offset")
                   for o in (offsets if isinstance(offsets, (list, tuple)) else [offsets])]
        shape = [s if type(s) is int else _index(s, op, "shape") for s in shape]
        bounds = t.shape
        if len(offsets) != len(bounds) or len(shape) != len(bounds):
            raise KernelIndexError(f"{op} at {user_location(2)}: {t.describe()} has {len(bounds)} dimensions but "
                                   f"offsets {offsets} and shape {shape} have {len(offsets)} and {len(shape)}. "
                                   f"Give one offset and one size per dimension ({len(bounds)} each).")
        for i, (o, s, b) in enumerate(zip(offsets, shape, bounds)):
            if s < 0:
                raise KernelIndexError(
                    f"{op} at {user_location(2)}: out of bounds on {t.describe()}: offsets {offsets} with "
                    f"{'shape' if valid_of is None else 'valid_shape'} {shape} have a negative size in dimension "
                    f"{i}; sizes are 0 or more.")
            if o < 0 or o + s > b:  # Python ints: no overflow, whatever their size
                if valid_of is None:
                    raise KernelIndexError(
                        f"{op} at {user_location(2)}: out of bounds on {t.describe()}: offsets {offsets} with shape "
                        f"{shape} reach [{o}, {o + s}) in dimension {i}, whose bounds are [0, {b}).")
                left = [max(0, min(v, d - p)) for v, d, p in zip(shape, bounds, offsets)]
                raise KernelIndexError(
                    f"{op} at {user_location(2)}: out of bounds on {t.describe()}: offsets {offsets} with "
                    f"valid_shape {shape} (of a {list(valid_of)} {what}) reach [{o}, {o + s}) in dimension {i}, whose "
                    f"bounds are [0, {b}). Only the valid region is read, but all of it must lie inside the "
                    f"tensor. Shrink valid_shape to what is left of the tensor at these offsets ({left}), "
                    "or pass clamp=True to narrow it to the edge.")
        return tuple(slice(o, o + s) for o, s in zip(offsets, shape))

    def _peer(self, op: str, peer, w: WindowTensor) -> int:
        """The world rank of group rank ``peer`` of window ``w``'s comm domain (checked)."""
        p = peer if type(peer) is int else _index(peer, op, "peer")
        group = w.group
        if len(group) == self.world:
            return p if 0 <= p < self.world else self._world_peer(op, p)
        if self.rank not in group:
            raise ProgramValueError(self._outside_group_text(op, w.describe(), group))
        if not 0 <= p < len(group):
            n = len(group)
            hint = (" A negative neighbour index: integer % truncates toward zero on the device, so (r - 1) % n is "
                    "-1 for r = 0. Write (r - 1 + n) % n." if p < 0 else
                    " Peers are group ranks of the window's comm domain (0 .. nranks-1), not world ranks.")
            e = PeerRangeError(
                f"{op} at {user_location(2)}: peer {p} is outside [0, {n}) of the comm domain of {w.describe()}, "
                f"ranks {w.group_text()} (rank {self.rank} is group rank {group.index(self.rank)}, nranks {n}).{hint}")
            e.fix = (f"Keep peers in [0, nranks) of the window's domain: read nranks with "
                     f"pld.nranks(pld.get_comm_ctx({w.name})) and give group ranks, e.g. (r + 1) % n.")
            raise e
        return group[p]

    def _world_peer(self, op: str, peer) -> int:
        p = peer if type(peer) is int else _index(peer, op, "peer")
        if not 0 <= p < self.world:
            hint = ""
            if p < 0:
                hint = (" A negative neighbour index: integer % truncates toward zero on the device, so "
                        "(r - 1) % n is -1 for r = 0. Write (r - 1 + n) % n.")
                fix = "Keep peers in [0, world): write the left neighbour as (r - 1 + n) % n."
            else:
                hint = " peer is a rank index (0 .. world-1), not a device id."
                fix = ("Keep peers in [0, world): a peer is a rank index, not a device id; write the right neighbour "
                       "as (r + 1) % n.")
            e = PeerRangeError(f"{op} at {user_location(2)}: peer {p} is outside [0, {self.world}) "
                               f"(rank {self.rank}, world {self.world}).{hint}")
            e.fix = fix
            raise e
        return p

    @staticmethod
    def _valid_extent(op: str, shape, valid_shape, t: RankTensor, offsets, clamp: bool = False) -> tuple:
        """``(shape, valid)`` of a tile of ``shape`` loaded from ``t`` at ``offsets``: ``valid`` is ``valid_shape``
        (``shape`` when not given), checked to lie within the tile; ``clamp`` narrows it to ``t``'s edge."""
        shape = [as_int(d, f"{op} shape") for d in shape]
        if valid_shape is None:
            v = list(shape)
        else:
            v = [as_int(d, f"{op} valid_shape") for d in valid_shape]
            # A negative extent is left to the region check, which names it as an out-of-bounds region.
            if len(v) != len(shape) or any(a > b for a, b in zip(v, shape)):
                raise KernelValueError(
                    f"{op} at {user_location(2)}: valid_shape {v} must lie within the tile shape {shape}: the "
                    "valid region is the leading part of the tile that holds data, one extent per tile dimension, "
                    f"each between 0 and that dimension's size. Give {len(shape)} extents no larger than {shape}.")
        if clamp and isinstance(offsets, (list, tuple)) and len(offsets) == len(v) == len(t.shape):
            offs = [as_int(o, f"{op} offset") for o in offsets]
            v = [max(0, min(a, b - o)) if o >= 0 else a for a, b, o in zip(v, t.shape, offs)]
        return shape, v

    @staticmethod
    def _padded(data: np.ndarray, shape: list[int]) -> np.ndarray:
        """A tile of ``shape`` whose leading part is ``data`` and whose padding is zero."""
        if list(data.shape) == shape:
            return data.copy()
        out = np.zeros(shape, dtype=data.dtype)
        out[tuple(slice(0, a) for a in data.shape)] = data
        return out

    def _load(self, op, tensor, offsets, shapes, valid_shape, clamp=False):
        t = self._tensor(op, tensor)
        # A tile of lower rank than the tensor (one offset per tensor dimension) reads its trailing dimensions:
        # a [R, C] tile at [i, j, 0] of an [N, M, C] tensor is t[i, j:j+R, :C], as a store of it writes.
        lead = len(t.shape) - len(shapes) if isinstance(offsets, (list, tuple)) and \
            len(offsets) == len(t.shape) > len(shapes) else 0
        if lead:
            shapes = [1] * lead + list(shapes)
            valid_shape = None if valid_shape is None else [1] * lead + list(valid_shape)
        shape, valid = self._valid_extent(op, shapes, valid_shape, t, offsets, clamp)
        region = t.array[self._region(op, t, offsets, valid, shape if valid != shape else None)]
        if t.full_shape is not None and list(region.shape) != valid:
            valid = list(region.shape)  # a partly valid view: only what lies in its valid region is read
        if self.checking:
            self._touch(op, t, region, False)
        data = self._padded(region, shape)
        if lead:
            data, shape, valid = data.reshape(shape[lead:]), shape[lead:], valid[lead:]
        return Tile(data, t.dtype, valid if valid != shape else None)

    def _tile_data(self, op: str, tile, t: RankTensor) -> np.ndarray:
        if isinstance(tile, RankTensor):
            tile = Tile(tile.array, tile.dtype)
        if not isinstance(tile, Tile):
            raise ProgramTypeError(f"{op} at {user_location(2)}: expected a Tile, got {checks.value_kind(tile)}")
        data = tile.data
        if tile.dtype is t.dtype and tile.valid_shape == data.shape:  # the usual case: all of it, as it is
            return data
        if tile.dtype.np_dtype != t.dtype.np_dtype:
            raise ProgramTypeError(f"{op} at {user_location(2)}: the tile is {tile.dtype.name} but {t.describe()} "
                                   f"is {t.dtype.name}; convert with pl.cast(tile, target_type=pl.{t.dtype.name})")
        valid = tuple(slice(0, v) for v in tile.valid_shape)
        return tile.data[valid]

    def _store_region(self, op: str, t: RankTensor, offsets, data: np.ndarray) -> tuple:
        """Where a tile's valid part ``data`` goes in ``t`` at ``offsets``: ``(slices, data shaped to them)``.

        A tile of lower rank than ``t`` fills ``t``'s trailing dimensions; the leading ones it spans are of
        size 1 (a ``[R, C]`` tile stored at ``[i, j, 0]`` of an ``[N, M, C]`` tensor writes ``t[i, j:j+R, :C]``).
        """
        n = t.array.ndim
        if data.ndim < n and isinstance(offsets, (list, tuple)) and len(offsets) == n:
            data = data.reshape((1,) * (n - data.ndim) + data.shape)
        elif data.ndim != n:
            where = user_location(2)
            raise KernelIndexError(
                f"{op} at {where}: a {data.ndim}-D tile (valid part {list(data.shape)}) cannot be stored into "
                f"{t.describe()} at offsets {list(offsets) if isinstance(offsets, (list, tuple)) else offsets}: "
                f"the offsets need one entry per tensor dimension ({n}), and the tile at most {n} dimensions (a "
                "lower-rank tile fills the trailing dimensions). Give offsets with "
                f"{n} entries{', or reshape the tile' if data.ndim > n else ''}.")
        sl = self._region(op, t, offsets, data.shape)
        if t.full_shape is not None:  # a partly valid view: what falls outside its valid region is not written
            data = data[tuple(slice(0, n) for n in t.array[sl].shape)]
        return sl, data

    def _writable(self, op: str, t: RankTensor) -> None:
        if not t.writable:
            why = t.readonly_why or "it is an input (pl.Tensor)"
            raise classified(ProgramTypeError(
                f"{op} at {user_location(2)}: {t.describe()} is read-only: {why}. If it is written, annotate "
                "it pl.Out[...] or pl.InOut[...] where it is declared; otherwise write to an output instead."),
                kind="read_only")

    def _store(self, op, tile, offsets, tensor, atomic):
        if self._coll.recording is not None:  # a write a collective's record does not hold (rank/replay.py)
            self._coll.recording.unfit = op
        t = self._tensor(op, tensor, "output_tensor")
        data = self._tile_data(op, tile, t)
        self._writable(op, t)
        sl, data = self._store_region(op, t, offsets, data)
        if atomic is AtomicType.Add:
            self._accumulate(op, t, t.array, sl, data, t.rank if isinstance(t, WindowTensor) else None)
        else:
            if self.checking:
                self._touch(op, t, t.array[sl], True)
            t.array[sl] = data
        return tensor

    def _accumulate(self, op, t, dst: np.ndarray, sl, data, owner: int | None):
        if t.dtype not in ATOMIC_ADD_DTYPES:
            raise ProgramTypeError(f"{op} at {user_location(2)}: atomic add supports "
                                   f"{', '.join(d.name for d in ATOMIC_ADD_DTYPES)}; {t.describe()} is {t.dtype.name}")
        if self.checking:
            self._touch(op, t, dst[sl], True, atomic=True)
        if owner is None:
            dst[sl] += data
            return
        with self.memory.locked(owner):
            dst[sl] += data

    def _flat_index(self, op, t: RankTensor, offset) -> tuple:
        if isinstance(offset, (list, tuple)):
            idx = tuple(as_int(o, f"{op} offset") for o in offset)
            if len(idx) != len(t.shape) or any(not 0 <= i < b for i, b in zip(idx, t.shape)):
                hint = (" A negative index: integer % truncates toward zero on the device, so (r - 1) % n is -1 "
                        "for r = 0. Write (r - 1 + n) % n.") if any(i < 0 for i in idx) else ""
                raise KernelIndexError(f"{op} at {user_location(2)}: index {list(idx)} is outside "
                                       f"{t.describe()}.{hint}")
        else:
            flat = as_int(offset, f"{op} offset")
            size = int(np.prod(t.shape, dtype=np.int64))
            if not 0 <= flat < size:
                raise KernelIndexError(f"{op} at {user_location(2)}: flat index {flat} is outside {t.describe()} "
                                       f"({size} elements)")
            idx = tuple(int(i) for i in np.unravel_index(flat, t.shape))
        if t.full_shape is not None and any(i >= a for i, a in zip(idx, t.array.shape)):
            raise KernelIndexError(
                f"{op} at {user_location(2)}: index {list(idx)} is outside the valid region "
                f"{list(t.array.shape)} of {t.describe()}: only the valid region is memory, nothing is there to "
                "read or write. Keep the index inside the valid region, or slice with a larger valid_shape.")
        return idx

    def _read(self, op, tensor, offset):
        t = self._tensor(op, tensor)
        idx = self._flat_index(op, t, offset)
        if self.checking:
            self._touch(op, t, t.array[tuple(slice(i, i + 1) for i in idx)], False)
        value = t.array[idx].item()
        # A polling read that sees a new value is progress; one that keeps seeing the same is not.
        key = (t.array.__array_interface__["data"][0], idx)
        polled = self._access.polled
        if polled.get(key, value) != value:
            self._progressed()
        if len(polled) > 4096:
            polled.clear()
        polled[key] = value
        return Scalar(value, t.dtype)

    def _write(self, op, tensor, offset, value):
        if self._coll.recording is not None:
            self._coll.recording.unfit = op
        t = self._tensor(op, tensor)
        self._writable(op, t)
        if t.dtype in dt.RAW_BITS:
            raise ProgramTypeError(f"{op} at {user_location(2)}: cannot write {value!r} into {t.describe()}: "
                                   + dt.raw_bits_why(t.dtype))
        idx = self._flat_index(op, t, offset)
        if self.checking:
            self._touch(op, t, t.array[tuple(slice(i, i + 1) for i in idx)], True)
        t.array[idx] = value.value if isinstance(value, Scalar) else value

    def _slice(self, op, tensor, shape, offset, valid_shape=None, clamp=False):
        """A view of ``tensor``'s region of ``shape`` at ``offset``; with ``valid_shape`` (or ``clamp``) only its
        valid region must lie inside ``tensor``, and only that region is memory (a tail tile's slice)."""
        t = self._tensor(op, tensor)
        if valid_shape is None and not clamp and t.full_shape is None:
            sl = self._region(op, t, offset, shape)
            return RankTensor(f"{t.name}[slice]", t.array[sl], t.dtype, t.writable, t.readonly_why)
        shape, valid = self._valid_extent(op, shape, valid_shape, t, offset, clamp)
        sl = self._region(op, t, offset, valid, shape if valid != shape else None, "view")
        # The slice is never valid where its source is not: numpy cuts the region to the source's valid region.
        return RankTensor(f"{t.name}[slice]", t.array[sl], t.dtype, t.writable, t.readonly_why, tuple(shape))

    def _create_tensor(self, op, shape, dtype):
        t = RankTensor("pl.create_tensor", np.zeros(shape, dtype=dtype.np_dtype), dtype)
        if self.events is not None:
            lo, hi = byte_bounds(t.array)
            self._access.locals.append((lo, hi, f"local:{len(self._access.locals)}"))
            self.events.allocated(hi - lo)
        return t


def _window_bytes(memory, buffer_id: int, rank: int):
    return memory.window_bytes(buffer_id, rank)
