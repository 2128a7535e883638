"""Backends start groups of ranks and run dispatch plans on them; see ``base.py`` for the protocol.

Each backend is registered by name with a factory and its capabilities (``registry.py``); the three built-in
ones are registered below, each by the one line a new backend also needs.

Which backend a dispatch runs on is its RunConfig's (``RunConfig.resolved_backend``: ``backend=``,
``PTODIST_BACKEND``, or ``mpi`` under an MPI launcher, else ``shm``), except inside a
:func:`forcing` block: ``ptodist check`` runs the script's every dispatch, one-shot calls and
DistributedWorkers alike, on the sim backend it made for the schedule (with the schedule's seed
and the session that collects the findings).  That block is the only override, and it is scoped.
"""

from __future__ import annotations

import contextlib
import importlib

from ..errors import UsageError
from .registry import Capabilities, capabilities, get_backend, names, register, unregister

__all__ = ["Capabilities", "capabilities", "capabilities_for", "for_config", "forcing",
           "get_backend", "name_for", "names", "register", "unregister"]

_forced = None  # the backend every dispatch runs on inside forcing(); None outside


def _made(module: str, cls: str):
    """A factory that imports ``backends.<module>`` when first called (an unused backend's imports never run)."""
    return lambda: getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


def _mpi_job():
    """The mpi job's communicator when more than one process runs each dispatch, else None."""
    from .mpi import job_communicator

    comm = job_communicator()
    return comm if comm is not None and comm.Get_size() > 1 else None


register("shm", _made("shm", "ShmBackend"), Capabilities(
    in_process=False, shared_host_memory=True, multi_node=False, deterministic=False, keeps_groups=True))
register("sim", _made("sim", "SimBackend"), Capabilities(
    in_process=True, shared_host_memory=False, multi_node=False, deterministic=True))
register("mpi", _made("mpi", "MpiBackend"), Capabilities(
    in_process=True, shared_host_memory=False, multi_node=True, deterministic=False, job=_mpi_job))


def for_config(config):
    """The backend a dispatch with ``config`` runs on (the forced one inside :func:`forcing`)."""
    return _forced if _forced is not None else get_backend(config.resolved_backend())


def name_for(config) -> str:
    """The name of the backend a dispatch with ``config`` runs on."""
    return _forced.name if _forced is not None else config.resolved_backend()


def capabilities_for(config) -> Capabilities:
    """What the backend a dispatch with ``config`` runs on does."""
    return capabilities(name_for(config))


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
