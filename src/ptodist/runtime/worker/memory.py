"""Shared memory a worker's rank processes can map: shared files (memfds) and ``shared_array``.

``shared_array`` registers each array's mapping by address, process-wide: the worker that later
gets a view of it finds the file to send to its ranks, whenever and wherever the array was made.
"""

from __future__ import annotations

import bisect
import itertools
import math
import mmap
import os
import threading
import weakref

import numpy as np

from ...errors import DispatchValueError
from ...language import dtypes as dt

ALIGN = 64
_serials = itertools.count(1)



def _memfd(name: str, size: int) -> int:
    """Return a descriptor of a new anonymous shared file of ``size`` bytes (never in /dev/shm)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:  # no memfd: an unlinked file in /dev/shm, gone as soon as nothing maps it
        import tempfile

        fd, path = tempfile.mkstemp(prefix="ptodist-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class SharedFile:
    """A shared file the driver maps and the ranks map too (resident tensors, window heaps)."""

    def __init__(self, size: int, name: str):
        self.size = max(int(size), ALIGN)  # a mapping cannot be empty
        self.serial = next(_serials)
        self.fd = _memfd(name, self.size)
        self.mm = mmap.mmap(self.fd, self.size)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> None:
        self.bytes = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still referenced; the GC unmaps it
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedMapping(mmap.mmap):
    """The memory of a :func:`shared_array`: its array's ``base``; the file closes with it."""


_SHARED: list[tuple[int, int, int, weakref.ref]] = []  # (start, end, serial, mapping) of shared arrays, sorted
_SHARED_LOCK = threading.Lock()


def shared_array(shape, dtype=np.float32) -> np.ndarray:
    """Return a zero-filled numpy array in shared memory, usable as a host tensor of a DistributedWorker.

    Args:
        shape: the array's shape (an int or a sequence of ints).
        dtype: a numpy dtype or a pl dtype (``pl.BF16`` gives an ``ml_dtypes.bfloat16`` array).

    The memory is an anonymous shared file: the worker's rank processes map it in place
    (no copy per dispatch; a small one new to them is copied for its first dispatch), whether it
    was made before or after ``prepare()``.  It is
    freed when the array and every view of it are gone.
    """
    np_dtype = dtype.np_dtype if isinstance(dtype, dt.DataType) else np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise DispatchValueError(f"shared_array(shape={list(shape)}): dimensions must be >= 0")
    nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
    size = max(nbytes, ALIGN)
    fd = _memfd("ptodist-array", size)
    try:
        mm = SharedMapping(fd, size)
    except BaseException:
        os.close(fd)
        raise
    mm.fd, mm.size, mm.serial = fd, size, next(_serials)
    start = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    mm.address = start
    with _SHARED_LOCK:
        bisect.insort(_SHARED, (start, start + size, mm.serial, weakref.ref(mm)))
    weakref.finalize(mm, _shared_gone, mm.serial, fd)
    return np.ndarray(shape, dtype=np_dtype, buffer=mm)


def _shared_gone(serial: int, fd: int) -> None:
    with _SHARED_LOCK:
        _SHARED[:] = [e for e in _SHARED if e[2] != serial]
    os.close(fd)


def shared_mapping(lo: int, hi: int) -> SharedMapping | None:
    """Return the live shared_array memory that holds bytes ``[lo, hi)``, if any."""
    with _SHARED_LOCK:
        i = bisect.bisect_right(_SHARED, (lo, math.inf)) - 1
        if i >= 0:
            start, end, _, ref = _SHARED[i]
            mm = ref()
            if mm is not None and start <= lo and hi <= end:
                return mm
    return None

