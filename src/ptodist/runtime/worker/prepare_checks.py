"""The checks of ``prepare()``'s arguments, made before any rank starts: the programs and their devices,
the window options, the start-up timeout, the callbacks, the inherited host tensors.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np

from ...compiler import checks
from ...config import RunConfig
from ...errors import ConfigError, DispatchTypeError, DispatchValueError
from ...language.functions import Function, Kind
from .callbacks import arity_error, calling_form
from .plans import is_abstract

DEFAULT_STARTUP_TIMEOUT_S = 60.0


def check_programs(compiled, extra_compiled, config: RunConfig | None) -> tuple[list, RunConfig]:
    """The worker's programs (the primary one first, each once) and its config; raise unless they agree on
    the devices."""
    from ..program import CompiledProgram

    primary = list(compiled) if isinstance(compiled, (list, tuple)) else [compiled]
    programs: list = []
    for c in [*primary, *extra_compiled]:
        if not isinstance(c, CompiledProgram):
            raise DispatchTypeError(f"DistributedWorker: expected compiled programs (from compile()), got "
                                    f"{type(c).__name__}")
        if not any(c is p for p in programs):
            programs.append(c)
    if not programs:
        raise ConfigError("DistributedWorker: at least one compiled program is needed")
    head = programs[0]
    for c in programs[1:]:
        if c.device_ids != head.device_ids:
            raise ConfigError(f"DistributedWorker: programs must run on the same devices; '{head.name}' is "
                              f"compiled for device_ids {head.device_ids}, '{c.name}' for {c.device_ids}. "
                              "Compile them with one DistributedConfig.")
    cfg = config or head.config
    if config is not None and config.distributed_config is not None and \
            list(config.distributed_config.device_ids) != head.device_ids:
        raise ConfigError(f"DistributedWorker: config has device_ids {config.distributed_config.device_ids} but "
                          f"'{head.name}' is compiled for {head.device_ids}; compile again for other devices")
    return programs, cfg


def check_options(persistent, reset_persistent_windows, startup_timeout_s) -> float:
    """Check prepare()'s window options and start-up timeout; return the timeout in seconds."""
    if not isinstance(persistent, bool):
        raise ConfigError(f"prepare(persistent={persistent!r}): must be True or False")
    if reset_persistent_windows is not None and not isinstance(reset_persistent_windows, bool):
        raise ConfigError(f"prepare(reset_persistent_windows={reset_persistent_windows!r}): must be True, False "
                          "or None")
    if reset_persistent_windows and not persistent:
        raise ConfigError("prepare(reset_persistent_windows=True) needs persistent=True: without it windows "
                          "live for one dispatch and always start zeroed. Pass persistent=True, or drop "
                          "reset_persistent_windows.")
    timeout = DEFAULT_STARTUP_TIMEOUT_S if startup_timeout_s is None else startup_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ConfigError(f"prepare(startup_timeout_s={startup_timeout_s!r}): must be a positive finite number "
                          "of seconds")
    return timeout


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside ptodist (the user's prepare() call), for warnings."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("ptodist."):
        frame, level = frame.f_back, level + 1
    return level


def coalesce_callbacks(callbacks, overrides):
    """Merge the deprecated ``sub_worker_overrides`` into ``callbacks`` (``callbacks`` wins a name both give)."""
    if overrides is None:
        return callbacks
    warnings.warn("sub_worker_overrides is deprecated; use callbacks= instead.", DeprecationWarning,
                  stacklevel=_caller_stacklevel())
    if not isinstance(overrides, dict):
        raise DispatchTypeError(f"prepare(sub_worker_overrides=...): expects a dict {{name: function}}, got "
                                f"{type(overrides).__name__}. It is the deprecated name of callbacks=: pass "
                                "callbacks={name: function} instead.")
    if callbacks is not None and not isinstance(callbacks, dict):
        return callbacks  # check_callbacks reports it
    return {**overrides, **(callbacks or {})}


def check_inherited(tensors) -> tuple:
    """Check prepare(inherited_host_tensors=...): contiguous CPU host tensors (torch or numpy)."""
    if tensors is None:
        return ()
    if isinstance(tensors, np.ndarray) or type(tensors).__module__.startswith("torch"):
        tensors = [tensors]
    try:
        items = tuple(tensors)
    except TypeError:
        raise DispatchTypeError(f"prepare(inherited_host_tensors=...): expects a list of host tensors, got "
                                f"{type(tensors).__name__}") from None
    for i, t in enumerate(items):
        if isinstance(t, np.ndarray):
            if not t.flags.c_contiguous:
                raise DispatchValueError(f"prepare(inherited_host_tensors=...): entry {i} (numpy {list(t.shape)} "
                                         f"{t.dtype}) is not contiguous; list contiguous arrays (np.ascontiguousarray "
                                         "makes a copy that you then keep and use)")
            continue
        if type(t).__module__.startswith("torch") and hasattr(t, "is_contiguous"):
            if t.device.type != "cpu" or not t.is_contiguous():
                raise DispatchValueError(f"prepare(inherited_host_tensors=...): entry {i} must be a contiguous CPU "
                                         f"tensor; got device={t.device} shape={list(t.shape)} "
                                         f"contiguous={t.is_contiguous()}. List a contiguous CPU tensor "
                                         "(.contiguous().cpu() makes one that you then keep and use)")
            continue
        raise DispatchTypeError(f"prepare(inherited_host_tensors=...): entry {i} is a {type(t).__name__}; entries "
                                "must be host tensors (torch tensors or numpy arrays)")
    return items


def check_callbacks(programs: list, callbacks) -> dict:
    """Check prepare(callbacks=...): each names a sub-worker of the programs and takes its arguments;
    every sub-worker without a body has one."""
    if callbacks is None:
        callbacks = {}
    if not isinstance(callbacks, dict):
        raise DispatchTypeError(f"prepare(callbacks=...): expects a dict {{name: function}}, got "
                                f"{type(callbacks).__name__}")
    subs: dict[str, Function] = {}
    for c in programs:
        for f in checks.reachable_functions(c.host, c.extra_functions):
            if f.kind is Kind.SUBWORKER:
                subs.setdefault(f.name, f)
    unknown = [name for name in callbacks if name not in subs]
    if unknown:
        progs = ", ".join(f"'{c.name}'" for c in programs)
        raise ConfigError(f"prepare(callbacks=...): {unknown} are not sub-workers of the worker's programs "
                          f"({progs}): no @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker) has that name. "
                          f"Available sub-workers: {sorted(subs)}. Name one of those, or drop the entry.")
    for name, fn in callbacks.items():
        if not callable(fn):
            raise DispatchTypeError(f"prepare(callbacks=...): the callback for '{name}' must be callable, got "
                                    f"{type(fn).__name__}")
        f = subs[name]
        if calling_form(fn, len(f.params)) is None:
            raise arity_error(name, f.location, fn, [p.name for p in f.params], "prepare(callbacks=...)")
    for name, f in subs.items():
        if name not in callbacks and is_abstract(f):
            raise ConfigError(f"prepare(): sub-worker function '{name}' ({f.location}) has no body ('...'): it is "
                              "one of the program's runtime-bound callbacks, which prepare() must be given. "
                              f"Bind it with prepare(callbacks={{'{name}': fn}}).")
    return dict(callbacks)
