"""The registered backends: a name, a factory that makes the backend, and what the backend declares it does.

After torch.distributed's ``Backend.register_backend(name, func, extended_api, devices)``: the built-in backends
register through the same call a new one uses (``backends/__init__.py``), the factory runs only when the backend
is used (so an unused backend's imports, mpi4py's, never run), and the runtime asks a backend's
:class:`Capabilities`, never its name.  ``RunConfig`` checks a name against this table: ``config`` lies below the
backends, so the table hands its names down (:func:`ptodist.config.use_backend_names`) instead of being imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import config
from ..errors import ApiTypeError, ConfigError


def _alone() -> None:
    return None


@dataclass(frozen=True)
class Capabilities:
    """What a backend does, as the runtime asks it (the backend's name is for people).

    ``in_process``: the ranks run in the calling process (its threads, or the process itself is a rank), so
    they use the driver's arrays in place.  ``shared_host_memory``: the ranks see a host tensor only in shared
    memory (forked processes), so a worker's arguments travel as shared copies.  ``multi_node``: the ranks may
    run on other machines.  ``deterministic``: a seeded schedule decides the ranks' interleaving, so a run
    replays exactly.  ``keeps_groups``: a one-shot call keeps its rank group for the calling program's next call
    (``run`` takes ``owner=`` and ``stamp=``).  ``job``: a callable giving the communicator of the processes that
    each run every dispatch (mpi4py's ``Get_rank``, ``bcast``) when there are several, else None; they agree on
    one DFX run folder through it.
    """

    in_process: bool
    shared_host_memory: bool
    multi_node: bool
    deterministic: bool
    keeps_groups: bool = False
    job: Callable[[], Any] = _alone


@dataclass(frozen=True)
class _Entry:
    factory: Callable[[], Any]
    capabilities: Capabilities


_entries: dict[str, _Entry] = {}  # name -> its registration, in the order registered


def register(name: str, factory: Callable[[], Any], capabilities: Capabilities) -> None:
    """Make ``name`` a backend: ``RunConfig(backend=name)`` and ``PTODIST_BACKEND=name`` select it.

    Args:
        name: what users select it by; also the ``name`` attribute of what ``factory`` makes.
        factory: called with no argument each time a dispatch or a worker needs the backend.
        capabilities: what the backend does (:class:`Capabilities`).

    Raises:
        ConfigError: ``name`` is empty or already registered.
        ApiTypeError: ``factory`` is not callable or ``capabilities`` is not a Capabilities.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"backends.register(name={name!r}): a backend's name must be a non-empty string")
    if name in _entries:
        raise ConfigError(f"backends.register({name!r}, ...): a backend named {name!r} is already registered "
                          f"(registered: {', '.join(_entries)}); register it under another name")
    if not callable(factory):
        raise ApiTypeError(f"backends.register({name!r}, factory={factory!r}, ...): the factory must be callable "
                           "with no argument and return the backend")
    if not isinstance(capabilities, Capabilities):
        raise ApiTypeError(f"backends.register({name!r}, ..., capabilities={capabilities!r}): expects a "
                           "ptodist.backends.Capabilities(in_process=..., shared_host_memory=..., multi_node=..., "
                           "deterministic=...)")
    _entries[name] = _Entry(factory, capabilities)


def unregister(name: str) -> None:
    """Forget the backend ``name`` (a plug-in's or a test's; nothing else selects it afterwards)."""
    _entries.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered backends' names, in the order they were registered."""
    return tuple(_entries)


def get_backend(name: str):
    """A new backend of the kind registered as ``name``."""
    return _entry(name).factory()


def capabilities(name: str) -> Capabilities:
    """What the backend registered as ``name`` declares it does."""
    return _entry(name).capabilities


def _entry(name: str) -> _Entry:
    try:
        return _entries[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; available: {', '.join(_entries)}") from None


config.use_backend_names(names)
