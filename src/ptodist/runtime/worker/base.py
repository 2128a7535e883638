"""``Worker``: the base class of the runtime handles (PyPTO's ``pypto.runtime.Worker``).

A ``ChipWorker`` (one chip) and a ``DistributedWorker`` (several chips, L3) are both Workers: code that does not
care about the level types its argument as a ``Worker`` and calls the dispatch surface (``run``, ``register``)
and the resident-tensor surface (``alloc_tensor``, ``free_tensor``, ``copy_to``, ``copy_from``, ``close``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Worker(ABC):
    """A runtime handle: dispatch compiled programs, keep tensors resident between dispatches."""

    __slots__ = ()

    @abstractmethod
    def run(self, compiled: Any, *args: Any, config: Any = None) -> Any:
        """Dispatch ``compiled`` with ``args`` on this worker; return what ``compiled(*args)`` returns."""

    @abstractmethod
    def register(self, compiled: Any) -> Any:
        """Register ``compiled`` on this worker; return a handle that dispatches it when called."""

    @abstractmethod
    def alloc_tensor(self, shape, dtype, *, init=None) -> Any:
        """A tensor resident on the worker (``init``: host values to start with; default zeros)."""

    @abstractmethod
    def free_tensor(self, tensor: Any) -> None:
        """Release a tensor :meth:`alloc_tensor` made."""

    @abstractmethod
    def copy_to(self, dst: Any, src: Any) -> None:
        """Copy host values ``src`` into the resident tensor ``dst``."""

    @abstractmethod
    def copy_from(self, dst: Any, src: Any) -> None:
        """Copy the resident tensor ``src`` into the host tensor ``dst``."""

    @abstractmethod
    def close(self) -> None:
        """Stop the worker and free what it holds; later calls raise RuntimeError."""
