"""``ptodist run SCRIPT [ARGS...]``: run a ptodist or PyPTO script on the local backend;
``ptodist trace DIR``: summarise a run's diagnostic outputs."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback

from . import compat
from .check import findings
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
    found: list = []
    code = 1
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except PtodistError as e:
        # A user-facing error: the message names rank, function and line; our frames would be noise.
        print(f"ptodist: {type(e).__name__}: {e}", file=sys.stderr)
        user = [f for f in traceback.extract_tb(e.__traceback__)
                if not _is_tool_frame(f.filename) and not f.filename.startswith("<")]
        if user:
            f = user[-1]
            print(f"  raised by {f.filename}:{f.lineno} in {f.name}: {f.line}", file=sys.stderr)
        found = findings.from_exception(e)
        for item in found:
            if not item.locations and user:
                item.locations.append(f"{user[-1].filename}:{user[-1].lineno}")
            print(_summary_line(item), file=sys.stderr)
    except PtodistInternalError:
        traceback.print_exc()
        print("ptodist: this is a bug in ptodist, not in your program; please report it.", file=sys.stderr)
        code = 3
    except KeyboardInterrupt:
        print("ptodist: interrupted", file=sys.stderr)
        code = 130
    except Exception as e:
        # The script's own error: show it as `python SCRIPT` would, without the frames of `ptodist run`.
        print("Traceback (most recent call last):\n" + "".join(_script_frames(e).format())
              + "".join(traceback.format_exception_only(type(e), e)), end="", file=sys.stderr)
        found = findings.from_exception(e)
    finally:
        if args.report_json:
            _write_report(args.report_json, code, found)
    return code


def _summary_line(item) -> str:
    """One finding as a short block under the error: kind, SPEC row, ranks, locations, fix."""
    parts = [f"ptodist: finding {item.kind}"]
    if item.pitfall:
        parts.append(f"(SPEC §{item.pitfall})")
    if item.ranks:
        parts.append(f"on ranks {', '.join(map(str, item.ranks))}")
    text = " ".join(parts)
    if item.locations:
        text += "\n  at " + ", ".join(item.locations)
    if item.fix:
        text += f"\n  fix: {item.fix}"
    return text


def _write_report(path: str, code: int, found: list) -> None:
    """Write the --report-json document, whatever ended the run."""
    doc = findings.report("ok" if code == 0 else "error", found)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def _trace(args) -> int:
    from .dfx import summary

    try:
        text = summary.report(args.dir, dispatch=args.dispatch, top=max(args.top, 0), open_trace=args.open)
    except summary.TraceError as e:
        print(f"ptodist trace: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
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
    run.add_argument("--report-json", metavar="PATH", default=None,
                     help='write {"status": "ok" | "error", "findings": [...]} to PATH, whatever happens')
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    trace = sub.add_parser("trace", help="summarise a run's diagnostic outputs (swimlane records)",
                           description="Summarise one dispatch's swimlane records: per-rank busy, waiting and "
                                       "communicating time, the longest waits and what released them, and the "
                                       "critical path across ranks.")
    trace.add_argument("dir", help="the run's output_dir, or its dfx_outputs folder")
    trace.add_argument("--dispatch", type=int, default=None, metavar="K",
                       help="which dispatch (d{K}); default: the last one")
    trace.add_argument("--top", type=int, default=10, metavar="N", help="how many of the longest waits to list")
    trace.add_argument("--open", action="store_true", help="also print the merged trace's path and how to open it")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "trace":
        return _trace(args)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    raise SystemExit(main())
