"""Locate the user's source line for an error or a status report.

ptodist's own frames are skipped so that every message points at the line of
the program that made the call, not at the library.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def short(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def text(self) -> str:
        """Return the stripped source text of the line, or '' when unavailable."""
        import linecache

        linecache.checkcache(self.file)  # the file may have changed since it was last read
        return linecache.getline(self.file, self.line).strip()


@functools.lru_cache(maxsize=4096)
def is_internal(filename: str) -> bool:
    """Return True for a file of ptodist itself.

    The standard library's ``threading.py`` counts too: on the sim backend it starts every rank's
    thread, so a rank's stack ends there, never in the user's program.
    """
    return os.path.abspath(filename).startswith(_PKG_DIR) or filename.startswith("<frozen") \
        or filename == threading.__file__


def user_frame(skip: int = 1) -> tuple[str, int] | None:
    """Return ``(file, line)`` of the innermost calling frame outside ptodist, cheaply (no Location)."""
    frame = sys._getframe(skip)
    while frame is not None:
        if not is_internal(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    loc = getattr(_fallback, "loc", None)
    return (loc.file, loc.line) if loc else None


_fallback = threading.local()


def user_location(skip: int = 1) -> Location | None:
    """Return the innermost calling frame that is not inside ptodist.

    Code with no user frame on its stack (a builtin collective task that the host
    orchestrator dispatched) reports the call site set by :func:`call_site`.
    """
    frame = sys._getframe(skip)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not is_internal(fname):
            return Location(fname, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return getattr(_fallback, "loc", None)


@contextmanager
def call_site(loc: Location | None):
    """Attribute the operations run in this block to ``loc`` when no user frame is on the stack."""
    prev = getattr(_fallback, "loc", None)
    _fallback.loc = loc
    try:
        yield
    finally:
        _fallback.loc = prev


def where(loc: Location | None) -> str:
    return f" at {loc}" if loc else ""
