"""The commands ptodist prints for a person to paste (replays, fixes): as shell text that runs as printed.

They name the interpreter that runs now, by its full path, so that a command pasted into a shell without the
virtual environment activated (another terminal, a CI log, a bug report) runs the same ptodist on the same
Python. Every word is quoted for a POSIX shell: paths may hold spaces.
"""

from __future__ import annotations

import os
import shlex
import sys


def python_argv() -> list[str]:
    """The interpreter running now, as the first words of a command."""
    return [sys.executable or "python3"]  # empty where Python cannot tell (embedded): the usual name then


def ptodist_argv() -> list[str]:
    """The ``ptodist`` command of the interpreter running now: its console script, else ``python -m ptodist``.

    The console script installed beside the interpreter is what ``ptodist`` means in its environment, and
    its first line names that interpreter; without one (a source checkout on ``PYTHONPATH``) the module runs.
    """
    if sys.executable:
        script = os.path.join(os.path.dirname(sys.executable), "ptodist")
        if os.path.isfile(script) and os.access(script, os.X_OK):
            return [script]
    return [*python_argv(), "-m", "ptodist"]


def python(*args: str) -> str:
    """Shell text that runs this interpreter with ``args``."""
    return shlex.join([*python_argv(), *map(str, args)])


def ptodist(*args: str) -> str:
    """Shell text that runs this interpreter's ``ptodist`` with ``args`` (``ptodist("check", "x.py")``)."""
    return shlex.join([*ptodist_argv(), *map(str, args)])
