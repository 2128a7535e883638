"""The collectives by name: each module of this package declares one, with ``@collective`` on its entry point.

A declaration is all ptodist knows of a collective: its ``pld.tensor`` entry (the signature and docstring
programs see), which arguments share its comm domain, how its arguments become a checked ``spec.Call``,
the options that call must satisfy, and the algorithm a rank runs.  The dispatch (``collectives.run``), the
plan's comm domains, the checks, the status board's operation names and the build tree's variants all read
it here, so a new collective is one new module and nothing else.

The language cannot import this layer: registering an entry installs it as ``pld.tensor.<name>``, where it
forwards the call to the current context (which checks and runs it through this registry).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from ..language.distributed import tensor as _pld_tensor


@dataclass(frozen=True)
class Collective:
    """One collective, as its module declares it."""

    name: str
    entry: Callable  # pld.tensor.<name>
    domain: tuple[int, ...]  # positional arguments in the comm domain, the defining one first
    domain_kwargs: tuple[str, ...]  # keyword arguments that follow it (all_to_all_v's recv_counts)
    build: Callable  # (call, args, kwargs, w, host): fill a spec.Call from the arguments, checking their kinds
    options: Callable | None  # (call, w, world, host): the checks of its options, once the signal is checked
    run: Callable  # (call, me, n, host): the algorithm, on group rank ``me`` of ``n``
    modes: tuple[str, ...]  # the algorithms mode= selects (a signal's message names the mode)
    algorithm: Callable  # (mode) -> the name of the function a host builtin runs, for the build tree
    source_role: str  # how messages name the source tensor (allgather's local data, all_to_all's input)
    # (n, kwargs) -> the shape of the signal the host orchestrator synthesises for a call without one (the signal
    # is the last of the domain arguments); None: the signal is required
    host_signal: Callable | None
    host_window_source: bool  # the host orchestrator's call takes its source as a window only (allgather)
    # What a rank does in it depends on its arguments and options alone, never on data (all_to_all_v's counts are
    # data): a host call may be recorded once and replayed (rank/replay.py)
    fixed_schedule: bool

    @property
    def op_name(self) -> str:
        """The name programs call it by, and the status board shows."""
        return f"pld.tensor.{self.name}"

    @property
    def reducing(self) -> bool:
        """Whether it takes ``op=`` (its build-tree variant is named by the op)."""
        return "op" in inspect.signature(self.entry).parameters


REGISTRY: dict[str, Collective] = {}


def collective(*, domain: tuple[int, ...], build: Callable, run: Callable, options: Callable | None = None,
               domain_kwargs: tuple[str, ...] = (), modes: tuple[str, ...] = (),
               algorithm: Callable | None = None, source_role: str = "local data", host_signal: Callable | None = None,
               host_window_source: bool = False, fixed_schedule: bool = False) -> Callable:
    """Register the decorated entry point (named as the collective) with the rest of its declaration."""
    def register(entry: Callable) -> Callable:
        name = entry.__name__
        REGISTRY[name] = Collective(name, entry, tuple(domain), tuple(domain_kwargs), build, options, run,
                                    tuple(modes), algorithm or (lambda mode: run.__name__), source_role, host_signal,
                                    host_window_source, fixed_schedule)
        setattr(_pld_tensor, name, entry)
        return entry
    return register


def domain_args(name: str, args, kwargs=None) -> list:
    """The arguments of collective ``name`` that must share its comm domain, the defining one first."""
    # PyPTO: the data or target window defines it; the signal, and all_to_all_v's recv_counts, follow it.  The
    # input of the push-based collectives and all_to_all_v's send_counts are read on the calling rank only.
    c = REGISTRY.get(name)
    out = [args[i] for i in (c.domain if c is not None else (0,)) if i < len(args)]
    if c is not None and c.domain_kwargs and kwargs:
        out += [kwargs.get(k) for k in c.domain_kwargs]
    return out
