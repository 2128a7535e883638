"""Backends start groups of ranks and run dispatch plans on them; see ``base.py`` for the protocol.

Which backend a dispatch runs on is its RunConfig's (``RunConfig.resolved_backend``: ``backend=``,
``PTODIST_BACKEND``, or ``mpi`` under an MPI launcher, else ``shm``), except inside a
:func:`forcing` block: ``ptodist check`` runs the script's every dispatch, one-shot calls and
DistributedWorkers alike, on the sim backend it made for the schedule (with the schedule's seed
and the session that collects the findings).  That block is the only override, and it is scoped.
"""

from __future__ import annotations

import contextlib

from ..errors import ConfigError, UsageError

_forced = None  # the backend every dispatch runs on inside forcing(); None outside


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


def for_config(config):
    """The backend a dispatch with ``config`` runs on (the forced one inside :func:`forcing`)."""
    return _forced if _forced is not None else get_backend(config.resolved_backend())


def name_for(config) -> str:
    """The name of the backend a dispatch with ``config`` runs on."""
    return _forced.name if _forced is not None else config.resolved_backend()


@contextlib.contextmanager
def forcing(backend):
    """Within this block every dispatch runs on ``backend``, whatever its RunConfig says."""
    global _forced
    if _forced is not None:
        raise UsageError("a backend is already forced in this process (one ptodist check session at a time); "
                         "end the running session before starting another")
    _forced = backend
    try:
        yield backend
    finally:
        _forced = None
