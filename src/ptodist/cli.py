"""``ptodist run SCRIPT [ARGS...]``: run a ptodist or PyPTO script on the local backend;
``ptodist check SCRIPT [ARGS...]``: run it under simulated schedules and report races, stale signals, ...;
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
            print(item.summary(), file=sys.stderr)
    except PtodistInternalError:
        traceback.print_exc()
        print("ptodist: this is a bug in ptodist, not in your program; please report it.", file=sys.stderr)
        code = 3
    except KeyboardInterrupt:
        print("ptodist: interrupted", file=sys.stderr)
        code = 130
    except Exception as e:
        # The script's own error: show it as `python SCRIPT` would, without the frames of `ptodist run`.
        print(format_script_error(e), end="", file=sys.stderr)
        found = findings.from_exception(e)
    finally:
        if args.report_json:
            _write_report(args.report_json, code, found)
    return code


def format_script_error(e: BaseException) -> str:
    """The script's own error as ``python SCRIPT`` would print it, without the frames of this tool."""
    return ("Traceback (most recent call last):\n" + "".join(_script_frames(e).format())
            + "".join(traceback.format_exception_only(type(e), e)))


def _check(args) -> int:
    from .check import explore

    script = args.script
    if not os.path.isfile(script):
        print(f"ptodist check: no such script: {script}", file=sys.stderr)
        return 2
    if args.schedules < 1:
        print(f"ptodist check: --schedules must be at least 1, got {args.schedules}", file=sys.stderr)
        return 2
    compat.install()
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    replay = " ".join(["ptodist check --seed {seed} --schedules 1", script, *args.args])
    outcome = None
    for k in range(args.schedules):
        seed = args.seed + k
        outcome = explore.run_schedule(script, list(args.args), seed)
        s = outcome.session
        head = f"ptodist check: schedule {k + 1}/{args.schedules} (seed {seed}"
        head += f", {s.policy}): " if s.policy else "): "
        if outcome.findings or outcome.exit_code:
            n = len(outcome.findings)
            print(head + (f"{n} finding(s)" if n else f"the script exited with status {outcome.exit_code}"),
                  file=sys.stderr)
            if outcome.stdout:
                print("--- the script's output ---\n" + outcome.stdout.rstrip(), file=sys.stderr)
            if outcome.traceback:
                print(outcome.traceback.rstrip(), file=sys.stderr)
            for f in outcome.findings:
                print(f.render(), file=sys.stderr)
            print("Replay exactly: " + replay.format(seed=seed), file=sys.stderr)
            break
        print(head + f"no findings ({s.world} ranks, {s.dispatches} dispatch(es), {s.events} events)",
              file=sys.stderr)
        if not s.dispatches:
            print("ptodist check: the script made no dispatch; nothing was checked.", file=sys.stderr)
            break
    else:
        print(f"ptodist check: no findings in {args.schedules} schedule(s) "
              f"(seeds {args.seed}..{args.seed + args.schedules - 1}).", file=sys.stderr)
    failed = bool(outcome.findings or outcome.exit_code)
    if args.report_json:
        doc = findings.report("findings" if outcome.findings else ("error" if failed else "ok"), outcome.findings)
        doc.update(seed=outcome.session.seed, policy=outcome.session.policy,
                   replay=replay.format(seed=outcome.session.seed))
        with open(args.report_json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    return 1 if failed else 0


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
    check = sub.add_parser("check", help="run a script under several simulated schedules and report races, "
                                         "stale signals, clobbered cells, uninitialised reads and hangs",
                           description="Run every dispatch of SCRIPT on the sim backend (one rank at a time, "
                                       "switching at every communication operation under a seeded schedule) and "
                                       "check each with the happens-before checker. Stops at the first schedule "
                                       "with findings, prints them and the seed that replays it, and exits 1.")
    check.add_argument("--schedules", type=int, default=8, metavar="N",
                       help="how many schedules to try (default 8): seeds S, S+1, ..., S+N-1")
    check.add_argument("--seed", type=int, default=0, metavar="S", help="the first schedule's seed (default 0)")
    check.add_argument("--report-json", metavar="PATH", default=None,
                       help='write {"status": "ok" | "findings" | "error", "seed": S, "findings": [...]} to PATH')
    check.add_argument("script", help="the Python script to check")
    check.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
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
    if args.command == "check":
        return _check(args)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    raise SystemExit(main())
