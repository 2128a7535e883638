"""``ptodist run SCRIPT [ARGS...]``: run a ptodist or PyPTO script on the local backend."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from . import compat
from .errors import PtodistError, PtodistInternalError
from .source import is_internal


def _run(args) -> int:
    script = args.script
    if not os.path.isfile(script):
        print(f"ptodist run: no such script: {script}", file=sys.stderr)
        return 2
    compat.install()
    sys.argv = [script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except PtodistError as e:
        # A user-facing error: the message names rank, function and line; our frames would be noise.
        print(f"ptodist: {type(e).__name__}: {e}", file=sys.stderr)
        user = [f for f in traceback.extract_tb(e.__traceback__)
                if not _is_tool_frame(f.filename) and not f.filename.startswith("<")]
        if user:
            f = user[-1]
            print(f"  raised by {f.filename}:{f.lineno} in {f.name}: {f.line}", file=sys.stderr)
        return 1
    except PtodistInternalError:
        traceback.print_exc()
        print("ptodist: this is a bug in ptodist, not in your program; please report it.", file=sys.stderr)
        return 3
    except Exception as e:
        # The script's own error: show it as `python SCRIPT` would, without the frames of `ptodist run`.
        print("Traceback (most recent call last):\n" + "".join(_script_frames(e).format())
              + "".join(traceback.format_exception_only(type(e), e)), end="", file=sys.stderr)
        return 1
    return 0


def _script_frames(e: BaseException) -> traceback.StackSummary:
    """Return the frames of ``e``'s traceback that belong to the script.

    An error raised in the script's own code loses every ptodist and runpy frame; one raised inside
    ptodist keeps ptodist's frames below the script's call (they may show a bug), losing only the
    frames of ``ptodist run`` above the script.
    """
    frames = traceback.extract_tb(e.__traceback__)
    if frames and not _is_tool_frame(frames[-1].filename):
        return traceback.StackSummary.from_list([f for f in frames if not _is_tool_frame(f.filename)])
    first = next((i for i, f in enumerate(frames) if not _is_tool_frame(f.filename)), 0)
    return traceback.StackSummary.from_list(frames[first:])


def _is_tool_frame(filename: str) -> bool:
    return is_internal(filename) or filename == runpy.__file__


def main(argv=None) -> int:
    """Entry point of the ``ptodist`` command."""
    parser = argparse.ArgumentParser(prog="ptodist", description="Run PyPTO distributed programs without NPUs.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script (pypto.* imports resolve to ptodist)")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    raise SystemExit(main())
