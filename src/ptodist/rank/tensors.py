"""Tensors as a rank sees them: host tensor slices, private tensors, and windows.

A :class:`RankTensor` is a typed numpy view plus a name for messages.  A
:class:`WindowTensor` is a view of a symmetric window buffer: its ``array`` is
the local rank's copy, ``peer_array(r)`` any other rank's.
"""

from __future__ import annotations

import numpy as np

from ..language.dtypes import DataType
from ..language.types import DynDim, DynExpr


def unit_dims_reshape(declared: tuple, actual: tuple) -> tuple | None:
    """The shape ``actual`` takes under ``declared`` when they differ only by dimensions of size 1, else None.

    ``[SIZE]`` under ``[1, SIZE]`` is ``(1, SIZE)``; ``[1, SIZE]`` under ``[SIZE]`` is ``(SIZE,)``. A dynamic
    dimension of ``declared`` (``pl.dynamic``, or arithmetic on it) takes the matching size of ``actual``; it never
    stands for an inserted or dropped 1.
    """
    fixed = [None if isinstance(d, (DynDim, DynExpr)) else d.__index__() for d in declared]
    core = [a for a in actual if a != 1]
    slots = [i for i, d in enumerate(fixed) if d != 1]
    if len(core) != len(slots):
        return None
    shape = [1] * len(declared)
    for i, a in zip(slots, core):
        if fixed[i] is not None and fixed[i] != a:
            return None
        shape[i] = a
    return tuple(shape)


class RankTensor:
    """A tensor inside a rank (``.shape``, ``.dtype``; index it to drop leading dims)."""

    def __init__(self, name: str, array: np.ndarray, dtype: DataType, writable: bool = True,
                 readonly_why: str = ""):
        self.name = name
        self.array = array
        self.dtype = dtype
        self.writable = writable
        self.readonly_why = readonly_why  # for messages: which declaration made it read-only

    def read_only(self, why: str) -> RankTensor:
        """Return a read-only view of this tensor; ``why`` names the declaration that makes it so."""
        return RankTensor(self.name, self.array, self.dtype, False, why)

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)

    def describe(self) -> str:
        return f"tensor '{self.name}' {self.shape} {self.dtype.name}"

    def __getitem__(self, idx) -> RankTensor:
        idx = idx if isinstance(idx, tuple) else (idx,)
        idx = tuple(i.__index__() if hasattr(i, "__index__") else i for i in idx)
        return RankTensor(f"{self.name}[{', '.join(map(str, idx))}]", self.array[idx], self.dtype, self.writable,
                          self.readonly_why)

    def reshaped(self, shape) -> RankTensor:
        """This tensor viewed with ``shape`` (same elements, same order; writes go through)."""
        view = self.array.view()
        view.shape = tuple(shape)  # raises rather than copy: a copy would lose the writes
        return RankTensor(self.name, view, self.dtype, self.writable, self.readonly_why)

    def bind_dynamic(self, dim, dyn) -> None:
        """Accepted for compatibility: dims bind from the actual shapes anyway."""

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class WindowTensor(RankTensor):
    """A window-bound tensor (``pld.DistributedTensor``) inside a rank."""

    def __init__(self, name: str, buffer, shape: tuple, dtype: DataType, rank: int, world: int, peer_bytes):
        self.buffer = buffer
        self.rank = rank
        self.world = world
        self._peer_bytes = peer_bytes  # peer rank -> the buffer's raw bytes on that rank
        self._peers: dict[int, np.ndarray] = {}
        self._group: tuple | None = None  # the buffer's comm domain, once asked for
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

    @property
    def group(self) -> tuple:
        """The world ranks of this window's comm domain, sorted: group rank ``g`` is ``group[g]``."""
        group = self._group
        if group is None:
            ranks = getattr(self.buffer, "ranks", None)
            group = self._group = tuple(ranks) if ranks is not None else tuple(range(self.world))
        return group

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
