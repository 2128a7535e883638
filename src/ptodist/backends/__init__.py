"""Backends run a dispatch plan on ranks; see ``base.py`` for the protocol."""

from __future__ import annotations

from ..errors import ConfigError


def get_backend(name: str):
    """Return the backend called ``name``."""
    if name == "shm":
        from .shm import ShmBackend

        return ShmBackend()
    if name == "sim":
        from .sim import SimBackend

        return SimBackend()
    if name == "mpi":
        from .mpi import MpiBackend

        return MpiBackend()
    raise ConfigError(f"unknown backend {name!r}; available: shm, sim, mpi")
