"""``pypto.runtime.log_config``: the threshold of ptodist's runtime notices (``configure_log``, ``log_level``).

ptodist's notices are the lines it prints on stderr, ``ptodist: ...``: which backend an upstream platform runs on
(info), a DFX folder in use and written beside, a build-time switch set in the environment (warn).  Errors are
raised, never logged, so no threshold hides one.  ``PYPTO_RUNTIME_LOG`` sets the threshold when
``configure_log`` has not been called.
"""

from __future__ import annotations

from ..config import log_threshold, parse_log_level, set_log_threshold


def configure_log(level: int | str, *, sync_pypto: bool = False) -> None:
    """Set the threshold of ptodist's runtime notices.

    Args:
        level: ``"debug"``, ``"info"``, ``"timing"``, ``"warn"``, ``"error"`` or ``"null"`` (any case), or a
            ``logging`` level number; a notice is printed when its level reaches it (``"error"`` and above
            silence every notice).
        sync_pypto: PyPTO's switch for its C++ compiler's logger; ptodist has none, so it changes nothing.
    """
    del sync_pypto
    set_log_threshold(parse_log_level(level, f"configure_log({level!r})"))


def current_level() -> int:
    """The threshold in effect, as a ``logging`` level number (20: info, the default)."""
    return log_threshold()


log_level = current_level

__all__ = ["configure_log", "current_level", "log_level"]
