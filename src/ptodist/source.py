"""Locate the user's source line for an error or a status report.

ptodist's own frames are skipped so that every message points at the line of
the program that made the call, not at the library.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import runpy
import sys
import sysconfig
import threading
import traceback
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


@functools.lru_cache(maxsize=4096)
def is_ptodist(filename: str) -> bool:
    """Return True for a file of the ptodist package itself (unlike :func:`is_internal`, not the stdlib's)."""
    return os.path.abspath(filename).startswith(_PKG_DIR)


_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                              if (p := sysconfig.get_paths().get(key))}))


_TEXTS: set[str] = set()  # the names of program texts (pl.parse): code without a file that is the program's


def register_text(filename: str) -> None:
    """Count ``filename`` (a ``pl.parse`` text's name, often ``<...>``) as the program's own code."""
    _TEXTS.add(filename)
    is_library.cache_clear()


@functools.lru_cache(maxsize=4096)
def is_library(filename: str) -> bool:
    """Return True for code that is neither ptodist's nor the program's: the standard library, an installed
    package (numpy, torch, ...), or code without a file (``<frozen ...>``, ``<string>``)."""
    if is_ptodist(filename) or filename in _TEXTS:
        return False
    return filename.startswith("<") or os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def raise_lines(filename: str) -> frozenset:
    """The lines of ``filename`` that hold a ``raise`` statement (its first line, as tracebacks name it)."""
    return _statements(_source_text(filename))[0]


def _source_text(filename: str) -> str:
    linecache.checkcache(filename)  # the file may have changed since it was last read (one name, many files)
    return "".join(linecache.getlines(filename))


@functools.lru_cache(maxsize=64)
def _statements(text: str) -> tuple[frozenset, tuple]:
    """The lines of ``raise`` statements and the line spans of loops in a module's source text."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return frozenset(), ()
    nodes = list(ast.walk(tree))
    return (frozenset(n.lineno for n in nodes if isinstance(n, ast.Raise)),
            tuple((n.lineno, n.end_lineno or n.lineno) for n in nodes if isinstance(n, (ast.For, ast.While))))


@functools.lru_cache(maxsize=1024)
def param_lines(fn) -> dict:
    """Map each parameter of the Python function ``fn`` to the line it is declared on (``{}`` without source).

    A parameter annotated on a line of its own (``def host(x: ...,\n         y: pl.Out[...])``) is named by
    that line, not by the ``def``'s.
    """
    import inspect
    import textwrap

    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return {}
    node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        return {}
    a = node.args
    params = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
              *([a.kwarg] if a.kwarg else [])]
    return {p.arg: start + p.lineno - 1 for p in params}


def enclosing_loop_line(filename: str, line: int) -> int | None:
    """The first line of the innermost ``for``/``while`` loop of ``filename`` that holds ``line`` (None: none)."""
    loops = _statements(_source_text(filename))[1]
    found = None
    for first, last in loops:
        if first <= line <= last and (found is None or first > found):
            found = first
    return found



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

    Code inside a :func:`call_site` block (a builtin collective task that the host orchestrator
    dispatched) reports that call site: the only user frames on its stack, if any, are those a forked
    rank process inherited from the driver (the line that called the program), not the collective's.
    """
    loc = getattr(_fallback, "loc", None)
    if loc is not None:
        return loc
    frame = sys._getframe(skip)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not is_internal(fname):
            return Location(fname, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


class call_site:  # noqa: N801 - used as a function: ``with call_site(loc):``
    """Attribute the operations run in this block to ``loc`` when no user frame is on the stack.

    A class rather than a generator context manager: every host collective runs in one, on every rank."""

    __slots__ = ("loc", "prev")

    def __init__(self, loc: Location | None):
        self.loc = loc

    def __enter__(self) -> None:
        self.prev = getattr(_fallback, "loc", None)
        _fallback.loc = self.loc

    def __exit__(self, *exc) -> None:
        _fallback.loc = self.prev


def where(loc: Location | None) -> str:
    return f" at {loc}" if loc else ""


def format_script_error(e: BaseException) -> str:
    """The script's own error as ``python SCRIPT`` would print it, without the frames of this tool."""
    return ("Traceback (most recent call last):\n" + "".join(_script_frames(e).format())
            + "".join(traceback.format_exception_only(type(e), e)))


def _script_frames(e: BaseException) -> traceback.StackSummary:
    """Return the frames of ``e``'s traceback that belong to the script.

    An error raised in the script's own code loses every ptodist and runpy frame; one raised inside
    ptodist keeps ptodist's frames below the script's call (they may show a bug), losing only the
    frames of ``ptodist run`` above the script.
    """
    frames = traceback.extract_tb(e.__traceback__)
    if frames and not is_tool_frame(frames[-1].filename):
        return traceback.StackSummary.from_list([f for f in frames if not is_tool_frame(f.filename)])
    first = next((i for i, f in enumerate(frames) if not is_tool_frame(f.filename)), 0)
    return traceback.StackSummary.from_list(frames[first:])


def is_tool_frame(filename: str) -> bool:
    """Whether ``filename`` belongs to the tool running a script (ptodist, runpy) rather than to the script."""
    return is_internal(filename) or filename == runpy.__file__
