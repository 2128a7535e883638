"""``pypto.backend``: the NPU generation a program targets, recorded process-wide.

PyPTO selects its pass pipeline and code generator by ``BackendType``.  ptodist generates no
NPU code, so the setting only records the choice: programs that configure it (test fixtures,
scripts) run unchanged, and ``get_backend_type()`` answers what they set.
"""

from __future__ import annotations

import enum
import threading

from .errors import ApiTypeError, ConfigError


class BackendType(enum.Enum):
    """The NPU generation PyPTO compiles for (recorded only: ptodist runs every program on the CPU)."""

    Ascend910B = 0
    Ascend950 = 1


# The simulator and device platform names of each generation, as RunConfig.platform spells them.
PLATFORMS = {BackendType.Ascend910B: ("a2a3sim", "a2a3"), BackendType.Ascend950: ("a5sim", "a5")}

_lock = threading.Lock()
_configured: list[BackendType] = []  # empty until set_backend_type()


def backend_type_for_platform(platform: str) -> BackendType:
    """Return the BackendType of a platform name (``"a2a3sim"`` -> Ascend910B, ``"a5"`` -> Ascend950)."""
    for bt, names in PLATFORMS.items():
        if platform in names:
            return bt
    known = ", ".join(repr(n) for names in PLATFORMS.values() for n in names)
    raise ConfigError(f"unknown platform {platform!r}: expected one of {known}")


def _check(backend_type, call: str) -> BackendType:
    if not isinstance(backend_type, BackendType):
        raise ApiTypeError(f"{call}: expected a BackendType (BackendType.Ascend910B or BackendType.Ascend950), got "
                           f"{backend_type!r}")
    return backend_type


def set_backend_type(backend_type: BackendType) -> None:
    """Record the process-wide backend type; setting the same one again is allowed, another one is refused."""
    bt = _check(backend_type, "set_backend_type()")
    with _lock:
        if _configured and _configured[0] is not bt:
            raise ConfigError(f"set_backend_type({bt}): the backend type is already {_configured[0]} in this "
                              "process and cannot change; call reset_for_testing() first (tests only)")
        _configured[:] = [bt]


def get_backend_type() -> BackendType:
    """Return the backend type set with set_backend_type(); raise ConfigError when none was set."""
    with _lock:
        if not _configured:
            raise ConfigError("get_backend_type(): no backend type is configured; call "
                              "set_backend_type(BackendType.Ascend910B) (or Ascend950) first")
        return _configured[0]


def is_backend_configured() -> bool:
    """Return whether set_backend_type() was called (and not undone by reset_for_testing())."""
    with _lock:
        return bool(_configured)


def reset_for_testing() -> None:
    """Forget the configured backend type, so a test can set another one."""
    with _lock:
        _configured.clear()


__all__ = ["BackendType", "get_backend_type", "is_backend_configured", "reset_for_testing", "set_backend_type"]
