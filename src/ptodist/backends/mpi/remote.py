"""A peer's window memory: arrays that read with MPI Get, write with MPI Put and add with MPI Accumulate."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import numpy as np

from ...errors import KernelValueError, PtodistInternalError

if TYPE_CHECKING:
    from .memory import MpiMemory


class _RemoteBytes:
    """A peer's bytes of one window buffer: what ``window_bytes`` returns for another rank.

    Supports what ``WindowTensor`` does with raw bytes: ``[:n]`` and ``.view(dtype)``.
    """

    def __init__(self, memory: MpiMemory, rank: int, disp: int, nbytes: int):
        self._memory, self._rank, self._disp, self.nbytes = memory, rank, disp, nbytes

    @property
    def shape(self) -> tuple:
        return (self.nbytes,)

    def __len__(self) -> int:
        return self.nbytes

    def __getitem__(self, key) -> _RemoteBytes:
        if not isinstance(key, slice):
            raise PtodistInternalError(f"a peer's window bytes support [a:b] only, got [{key!r}]")
        start, stop, step = key.indices(self.nbytes)
        if step != 1:
            raise PtodistInternalError(f"a peer's window bytes support [a:b] only, got step {step}")
        return _RemoteBytes(self._memory, self._rank, self._disp + start, max(stop - start, 0))

    def view(self, dtype) -> RemoteArray:
        dtype = np.dtype(dtype)
        return RemoteArray(self._memory, self._rank, self._disp, dtype, (self.nbytes // dtype.itemsize,))


class _Shaped:
    """``ndim``, ``size`` and ``nbytes`` from ``shape`` and ``dtype``, as numpy arrays have them."""

    shape: tuple
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


class RemoteArray(_Shaped):
    """A typed, C-ordered array in a peer's window: indexing reads (MPI Get), assigning writes (MPI Put).

    ``a[key]`` returns a :class:`RemoteRegion` (read when converted, ``+=`` accumulates);
    ``a[key] = value`` puts ``value`` there.  Keys are ints and step-1 slices.
    """

    def __init__(self, memory: MpiMemory, rank: int, disp: int, dtype: np.dtype, shape: tuple):
        self._memory, self.rank, self.disp, self.dtype, self.shape = memory, rank, disp, dtype, tuple(shape)

    def reshape(self, *shape) -> RemoteArray:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise KernelValueError(f"cannot reshape a remote array of size {self.size} into shape {shape}")
        return RemoteArray(self._memory, self.rank, self.disp, self.dtype, shape)

    def view(self, dtype) -> RemoteArray:
        dtype = np.dtype(dtype)
        return RemoteArray(self._memory, self.rank, self.disp, dtype, (self.nbytes // dtype.itemsize,))

    def _box(self, key) -> tuple[tuple, tuple, tuple]:
        """Return (starts, sizes, result shape) of the rectangular region ``key`` selects."""
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > self.ndim:
            raise IndexError(f"too many indices ({len(key)}) for a remote array of shape {self.shape}")
        key = key + (slice(None),) * (self.ndim - len(key))
        starts, sizes, out = [], [], []
        for k, n in zip(key, self.shape):
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step != 1:
                    raise PtodistInternalError(f"a peer's window supports step-1 slices only, got {k!r}")
                size = max(stop - start, 0)
                starts.append(start)
                sizes.append(size)
                out.append(size)
            else:
                i = operator.index(k)
                if i < 0:
                    i += n
                if not 0 <= i < n:
                    raise IndexError(f"index {k} is out of bounds for a dimension of size {n}")
                starts.append(i)
                sizes.append(1)
        return tuple(starts), tuple(sizes), tuple(out)

    def __getitem__(self, key) -> RemoteRegion:
        starts, sizes, out = self._box(key)
        return RemoteRegion(self, starts, sizes, out)

    def __setitem__(self, key, value) -> None:
        starts, sizes, out = self._box(key)
        if isinstance(value, RemoteRegion) and value._added and value._array is self and value._starts == starts \
                and value._sizes == sizes:
            value._added = False  # `a[k] += x` ends by assigning the region back; the add already happened
            return
        data = np.ascontiguousarray(np.broadcast_to(np.asarray(value, dtype=self.dtype), out))
        self._memory.put(self.rank, self.disp, self.shape, starts, sizes, data)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self[()].__array__(dtype)

    def copy(self) -> np.ndarray:
        return self[()].copy()

    def __repr__(self) -> str:
        return f"<remote array {list(self.shape)} {self.dtype} on rank {self.rank}>"


class RemoteRegion(_Shaped):
    """A region of a :class:`RemoteArray`; nothing moves until it is read (``copy``, ``np.asarray``) or added to."""

    def __init__(self, array: RemoteArray, starts: tuple, sizes: tuple, shape: tuple):
        self._array, self._starts, self._sizes, self.shape = array, starts, sizes, shape
        self.dtype = array.dtype
        self._added = False

    def copy(self) -> np.ndarray:
        """Read the region from the peer (MPI Get)."""
        a = self._array
        return a._memory.get(a.rank, a.disp, a.shape, self._starts, self._sizes, a.dtype).reshape(self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        data = self.copy()
        return data if dtype is None else data.astype(dtype, copy=False)

    def __iadd__(self, other) -> RemoteRegion:
        a = self._array
        data = np.ascontiguousarray(np.broadcast_to(np.asarray(other, dtype=a.dtype), self.shape))
        a._memory.accumulate(a.rank, a.disp, a.shape, self._starts, self._sizes, data)
        self._added = True
        return self

    def __repr__(self) -> str:
        return f"<remote region {list(self.shape)} {self.dtype} on rank {self._array.rank}>"


