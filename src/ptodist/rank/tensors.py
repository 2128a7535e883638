"""Tensors as a rank sees them: host tensor slices, private tensors, and windows.

A :class:`RankTensor` is a typed numpy view plus a name for messages.  A
:class:`WindowTensor` is a view of a symmetric window buffer: its ``array`` is
the local rank's copy, ``peer_array(r)`` any other rank's.
"""

from __future__ import annotations

import numpy as np

from ..errors import KernelIndexError, KernelValueError
from ..language.dtypes import DataType
from ..language.memory_ops import load, store
from ..language.tile_ops import Tile
from ..language.types import TensorValue, WindowValue
from ..source import user_location


def _text(i) -> str:
    if isinstance(i, slice):
        return f"{'' if i.start is None else i.start}:{'' if i.stop is None else i.stop}"
    return str(i)


def _where(t) -> str:
    """The start of a subscript's message: the tensor, and the user's line."""
    return f"{t.describe()} at {user_location(3)}"


def _bound(t, v, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise KernelIndexError(f"{_where(t)}: subscript {what} must be an integer, got {v!r}")
    return v.__index__()


def _subscript(t, idx) -> tuple:
    """``idx`` with Scalars made ints, checked against ``t``'s shape: slices stay inside it, steps are 1."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    shape = t.array.shape if t.full_shape is None else t.full_shape
    if idx.count(Ellipsis) == 1:  # `...` stands for every dimension the other subscripts leave out
        at = idx.index(Ellipsis)
        idx = idx[:at] + (slice(None),) * (len(shape) - len(idx) + 1) + idx[at + 1:]
    if len(idx) > len(shape):
        raise KernelIndexError(f"{_where(t)}: {len(idx)} subscripts for {len(shape)} dimensions")
    out = []
    for i, (s, d) in enumerate(zip(idx, shape)):
        if isinstance(s, slice):
            start, stop, step = _bound(t, s.start, "start"), _bound(t, s.stop, "stop"), _bound(t, s.step, "step")
            if step not in (None, 1):
                raise KernelIndexError(f"{_where(t)}: subscript {_text(s)}:{step} in dimension {i} has step "
                                       f"{step}; regions are contiguous (step 1); copy strided data with pl.load")
            lo = 0 if start is None else start + d if start < 0 else start
            hi = d if stop is None else stop + d if stop < 0 else stop
            if not 0 <= lo <= hi <= d:
                raise KernelIndexError(f"{_where(t)}: subscript [{_text(s)}] in dimension {i} is outside [0, {d}]; "
                                       f"a region must lie inside the tensor (0 <= start <= stop <= {d})")
            out.append(slice(lo, hi))
        else:
            j = _bound(t, s, "index")
            if not -d <= j < d:
                raise KernelIndexError(f"{_where(t)}: index {j} in dimension {i} is outside [0, {d}); give an "
                                       f"index in that range")
            out.append(j % d)
    return tuple(out)


class RankTensor(TensorValue):
    """A tensor inside a rank (``.shape``, ``.dtype``; index it to drop leading dims).

    A view made with a ``valid_shape`` smaller than its shape (``pl.slice(t, [16, 128], [16, 0],
    valid_shape=[0, 128])``, a tail tile) has ``full_shape``: its shape, which may run past the memory it views.
    ``array`` is then only the valid region, so nothing outside it is ever read or written.
    """

    full_shape: tuple | None = None  # set only on a view whose valid region is smaller than its shape

    def __init__(self, name: str, array: np.ndarray, dtype: DataType, writable: bool = True,
                 readonly_why: str = "", full_shape: tuple | None = None):
        self.name = name
        self.array = array
        self.dtype = dtype
        self.writable = writable
        self.readonly_why = readonly_why  # for messages: which declaration made it read-only
        if full_shape is not None and tuple(full_shape) != array.shape:
            self.full_shape = tuple(full_shape)

    def read_only(self, why: str) -> RankTensor:
        """Return a read-only view of this tensor; ``why`` names the declaration that makes it so."""
        return RankTensor(self.name, self.array, self.dtype, False, why, self.full_shape)

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape if self.full_shape is None else self.full_shape)

    @property
    def valid_shape(self) -> list[int]:
        """The extent of the region that holds data (the shape, unless the view was made with a valid_shape)."""
        return list(self.array.shape)

    def describe(self) -> str:
        valid = "" if self.full_shape is None else f" (valid {list(self.array.shape)})"
        return f"tensor '{self.name}' {self.shape} {self.dtype.name}{valid}"

    def __getitem__(self, idx) -> RankTensor:
        """A view of a region: integers drop their dimension, ``a:b`` slices keep it (``A[0:16, :]``)."""
        idx = _subscript(self, idx)
        name = f"{self.name}[{', '.join(map(_text, idx))}]"
        if self.full_shape is None:
            return RankTensor(name, self.array[idx], self.dtype, self.writable, self.readonly_why)
        # A partly valid view: the region's valid part is what of it lies in the valid region.
        shape = [i.stop - i.start for i in idx if isinstance(i, slice)] + list(self.full_shape[len(idx):])
        valid = tuple(slice(min(i.start, a), min(i.stop, a)) if isinstance(i, slice) else
                      (i if i < a else slice(a, a)) for i, a in zip(idx, self.array.shape))
        array = self.array[valid]
        if array.ndim != len(shape):  # an index past the valid region: a region with no valid element
            array = array.reshape([0] * len(shape))
        return RankTensor(name, array, self.dtype, self.writable, self.readonly_why, tuple(shape))

    def __setitem__(self, idx, value) -> None:
        """Copy a tile or a tensor into a region (``out[0:H, 0:W] = src``), through the running context.

        The source is read whole with ``pl.load`` (a tensor) and written with ``pl.store`` at the region, so the
        checker and the traces see both accesses and a read-only destination is refused as a store would be.
        """
        region = self[idx]
        if isinstance(value, RankTensor):
            value = load(value, [0] * len(value.shape), list(value.shape))
        if not isinstance(value, Tile):
            raise KernelValueError(
                f"{self.describe()}[{', '.join(map(_text, _subscript(self, idx)))}] = ...: the value must be a tile "
                f"or a tensor, got {type(value).__name__}; build a tile first (pl.full(shape, value, dtype))")
        shape = list(region.shape)
        if value.shape != shape:
            core = [d for d in value.shape if d != 1]
            if core != [d for d in shape if d != 1]:
                raise KernelValueError(
                    f"{region.describe()} = a {value.shape} {value.dtype.name} value: the shapes differ; the value "
                    f"must have the region's shape {shape} (dimensions of size 1 aside)")
            valid = value.valid_shape if tuple(value.valid_shape) == tuple(value.shape) else None
            if valid is None:
                value = Tile(value.data.reshape(shape), value.dtype)
            else:
                vcore = [v for v, d in zip(valid, value.shape) if d != 1]
                full = iter(vcore)
                value = Tile(value.data.reshape(shape), value.dtype, [next(full) if d != 1 else 1 for d in shape])
        store(value, [0] * len(shape), region)

    def reshaped(self, shape) -> RankTensor:
        """This tensor viewed with ``shape`` (same elements, same order; writes go through)."""
        self._whole("reshape")
        view = self.array.view()
        view.shape = tuple(shape)  # raises rather than copy: a copy would lose the writes
        return RankTensor(self.name, view, self.dtype, self.writable, self.readonly_why)

    def reinterpreted(self, dtype: DataType, shape) -> RankTensor:
        """This tensor's bytes viewed as ``dtype`` with ``shape`` (writes go through); the tensor is contiguous."""
        self._whole("reinterpret")
        view = self.array.view(dtype.np_dtype)
        view.shape = tuple(shape)
        return RankTensor(self.name, view, dtype, self.writable, self.readonly_why)

    def _whole(self, what: str) -> None:
        """Refuse to view a partly valid view as another shape: its invalid part is no memory to view."""
        if self.full_shape is not None:
            raise KernelValueError(
                f"{self.describe()} at {user_location(3)}: cannot {what} a view whose valid region "
                f"{list(self.array.shape)} is smaller than its shape {list(self.full_shape)}: only the valid region "
                "is memory. Slice the valid region alone (valid_shape equal to the shape), then "
                f"{what} that.")

    def bind_dynamic(self, dim, dyn) -> None:
        """Accepted for compatibility: dims bind from the actual shapes anyway."""

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class WindowTensor(RankTensor, WindowValue):
    """A window-bound tensor (``pld.DistributedTensor``) inside a rank."""

    def __init__(self, name: str, buffer, shape: tuple, dtype: DataType, rank: int, world: int, peer_bytes):
        self.buffer = buffer
        self.rank = rank
        self.world = world
        self._peer_bytes = peer_bytes  # peer rank -> the buffer's raw bytes on that rank
        self._peers: dict[int, np.ndarray] = {}
        ranks = getattr(buffer, "ranks", None)
        # The world ranks of the buffer's comm domain, sorted: group rank g is group[g].
        self.group: tuple = tuple(ranks) if ranks is not None else tuple(range(world))
        self._shape = tuple(shape)
        self._nbytes = int(np.prod(self._shape, dtype=np.int64)) * dtype.get_byte()
        super().__init__(name, self._typed(peer_bytes(rank), dtype), dtype, True)

    def _typed(self, raw: np.ndarray, dtype: DataType) -> np.ndarray:
        return raw[:self._nbytes].view(dtype.np_dtype).reshape(self._shape)

    def reshaped(self, shape) -> WindowTensor:
        """This window viewed with ``shape`` (the same elements of the same buffer, on every rank)."""
        w = WindowTensor(self.name, self.buffer, tuple(shape), self.dtype, self.rank, self.world, self._peer_bytes)
        w.writable, w.readonly_why = self.writable, self.readonly_why
        return w

    def reinterpreted(self, dtype: DataType, shape) -> WindowTensor:
        """This window's bytes viewed as ``dtype`` with ``shape`` (the same buffer, on every rank)."""
        w = WindowTensor(self.name, self.buffer, tuple(shape), dtype, self.rank, self.world, self._peer_bytes)
        w.writable, w.readonly_why = self.writable, self.readonly_why
        return w

    def group_text(self) -> str:
        return "{" + ", ".join(map(str, self.group)) + "}"

    def peer_array(self, peer: int) -> np.ndarray:
        """Return this view's typed array on (world) rank ``peer``."""
        view = self._peers.get(peer)
        if view is None:
            view = self._peers[peer] = self._typed(self._peer_bytes(peer), self.dtype)
        return view

    def describe(self) -> str:
        return f"window '{self.name}' {self.shape} {self.dtype.name} (buffer '{self.buffer.name}')"
