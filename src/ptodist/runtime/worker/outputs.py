"""The outputs and host intermediates an shm worker makes: shared memory reused once the caller lets go of it.

``y = rt(x)`` makes a new shared output every dispatch, and a host ``pl.create_tensor`` a new zeroed
intermediate.  Making shared memory costs a new file, its mapping and, once the tensor is dropped, an
unmapping (30-60 µs a tensor on a small machine, more than the rest of a small dispatch); the ranks
then see new memory every time.  So the worker keeps the memory it made and hands it out again, zeroed,
once nothing of the caller's refers to it any more: no tensor, view, numpy array or storage object.

Whether memory is free is read from reference counts, never guessed: a torch output's storage counts
every tensor and view over it (``torch._C._storage_Use_Count``) and its storage object counts the
Python references to it; a numpy output's array counts every view of it (each view's ``base`` chain
ends there) and its mapping the rest.  The pool holds one reference of each kind and compares with the
counts it saw when nothing else held the memory.  The caller gets a new tensor object over the memory,
never the one the pool holds, so that a kept output is always counted.

The memory is ordinary shared memory (``tensor.is_shared()``; a ``shared_array`` mapping for numpy),
usable anywhere a tensor the caller shared is.  What the pool keeps is bounded (:data:`KEPT_PER_SHAPE`
per shape and dtype, :data:`KEPT_BYTES` in all, the least recently used shape going first); memory
beyond that is the caller's alone, freed with its last reference as before.
"""

from __future__ import annotations

import functools
import sys
from collections import OrderedDict

from ...language import dtypes as dt
from .memory import shared_array

KEPT_PER_SHAPE = 4       # outputs of one shape and dtype kept for reuse: two in flight, the caller's last ones
KEPT_BYTES = 64 << 20    # bytes kept in all


@functools.cache
def _use_count():
    """torch's count of the references to a storage (None when this torch lacks it: nothing is reused)."""
    import torch

    return getattr(torch._C, "_storage_Use_Count", None)


class _Kept:
    """Memory the pool made: the pool's own tensor (or array) over it and the counts it has when idle."""

    __slots__ = ("held", "probe", "counts", "nbytes")

    def __init__(self, make, is_torch: bool):
        # No local name refers to the memory while the counts are first read: they read as idle() reads them.
        self.held = make()    # the pool's own tensor / array over the memory (never handed out)
        self.probe = None     # a torch output's (storage object, its cdata): torch keeps that object from now on
        if is_torch:
            self.probe = (self.held.untyped_storage(), self.held.untyped_storage()._cdata)
            self.nbytes = self.held.numel() * self.held.element_size()
        else:
            self.nbytes = self.held.nbytes
        self.counts = self._counts()

    def _counts(self) -> tuple:
        if self.probe is not None:
            storage, cdata = self.probe
            return _use_count()(cdata), sys.getrefcount(storage)
        return sys.getrefcount(self.held), sys.getrefcount(self.held.base)  # the arrays over it, its mapping

    def idle(self) -> bool:
        """Whether nothing but the pool refers to the memory."""
        return self._counts() == self.counts


class OutputPool:
    """One worker's reusable outputs and intermediates, by (kind, shape, dtype)."""

    def __init__(self):
        self.kept: OrderedDict = OrderedDict()  # key -> [_Kept], least recently used key first
        self.nbytes = 0

    def torch_zeros(self, shape: tuple, dtype):
        """A zeroed shared torch tensor of ``shape`` and pl ``dtype`` (a new tensor object: the caller's)."""
        import torch

        tdtype = dt.to_torch(dtype)
        if _use_count() is None or 0 in shape:
            return torch.zeros(shape, dtype=tdtype).share_memory_()
        key = ("torch", shape, tdtype)
        k = self._idle(key)
        if k is not None:
            return k.held.detach().zero_()
        k = _Kept(lambda: torch.zeros(shape, dtype=tdtype).share_memory_(), True)
        self._keep(key, k)
        return k.held.detach()

    def array_zeros(self, shape: tuple, dtype):
        """A zeroed ``shared_array`` of ``shape`` and pl ``dtype`` (a new array object: the caller's)."""
        if 0 in shape:
            return shared_array(shape, dtype)
        key = ("array", shape, dtype)
        k = self._idle(key)
        if k is not None:
            view = k.held.view()
            view.fill(0)
            return view
        k = _Kept(lambda: shared_array(shape, dtype), False)
        self._keep(key, k)
        return k.held.view()

    def _idle(self, key) -> _Kept | None:
        kept = self.kept.get(key)
        if kept:
            self.kept.move_to_end(key)
            for k in kept:
                if k.idle():
                    return k
        return None

    def _keep(self, key, k: _Kept) -> None:
        kept = self.kept.setdefault(key, [])
        self.kept.move_to_end(key)
        if len(kept) >= KEPT_PER_SHAPE or k.nbytes > KEPT_BYTES:
            return  # the caller's alone
        kept.append(k)
        self.nbytes += k.nbytes
        while self.nbytes > KEPT_BYTES:  # the least recently used shapes go (their memory lives while used)
            old_key, old = next(iter(self.kept.items()))
            gone = old.pop(0)
            self.nbytes -= gone.nbytes
            if not old:
                del self.kept[old_key]

    def clear(self) -> None:
        """Let go of everything (the worker closes): memory still used lives on, as the caller's."""
        self.kept.clear()
        self.nbytes = 0
