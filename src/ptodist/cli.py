"""``ptodist run SCRIPT [ARGS...]``: run a ptodist or PyPTO script on the local backend;
``ptodist check SCRIPT [ARGS...]``: run it under simulated schedules and report races, stale signals, ...;
``ptodist trace DIR``: summarise a run's diagnostic outputs."""

from __future__ import annotations

import argparse
import io
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

from . import __version__, commands, compat
from .check import findings
from .config import parse_dfx, started_by_mpi_launcher
from .errors import CheckError, HangError, PtodistError, PtodistInternalError, RankError, RankInternalError
from .rank_output import report_pointer, write_report
from .runtime import program as programs
from .source import format_script_error, is_tool_frame


class Terminated(BaseException):
    """Raised in the main thread of ``ptodist run`` when SIGTERM or SIGHUP asks it to stop.

    A BaseException, like KeyboardInterrupt, so that it passes through the script's ``except Exception``
    and the runtime's clean-up (ranks killed and reaped, shared memory unmapped) runs on its way out.
    """

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"terminated by {self.name}")


# What `timeout`, CI runners, batch schedulers and a closed terminal send: handled as Ctrl-C is.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class _StopSignals:
    """While ``ptodist run`` runs a script: SIGTERM and SIGHUP raise :class:`Terminated` in the main thread.

    Only the first signal raises; later ones are ignored until the previous handlers are back, so a second
    SIGTERM (``timeout`` sends one to the process and one to its process group) cannot cut the clean-up or
    the report short. Processes forked meanwhile (the ranks) get the previous handlers back at once.

    With ``at_once`` (a process an MPI launcher started, which is itself a rank, and which the launcher
    terminates when another process of the job ended) the first signal calls ``at_once(signum)`` and the
    process dies of the signal there: unwinding would make MPI calls that wait for the peers, maybe for ever.
    """

    _active: _StopSignals | None = None
    _hooked = False

    def __init__(self, at_once=None):
        self.pid = os.getpid()
        self.at_once = at_once
        self.previous: dict[int, object] = {}
        self.armed = False

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread; leave the signals as they are
        if not _StopSignals._hooked:
            os.register_at_fork(after_in_child=_StopSignals._after_fork)
            _StopSignals._hooked = True
        for signum in STOP_SIGNALS:
            self.previous[signum] = signal.signal(signum, self._handle)
        self.armed = True
        _StopSignals._active = self
        return self

    def disarm(self) -> None:
        """From now on the signals are ignored (until ``__exit__`` puts the previous handlers back)."""
        self.armed = False

    def __exit__(self, *exc) -> None:
        self.armed = False
        if _StopSignals._active is self:
            _StopSignals._active = None
        self._restore()

    def _restore(self) -> None:
        for signum, previous in self.previous.items():
            if signal.getsignal(signum) == self._handle:  # the script may have set its own: keep it
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self.previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if os.getpid() != self.pid:  # a process forked by other means than os.fork: behave as before
            self._restore()
            os.kill(os.getpid(), signum)
            return
        if not self.armed:
            return
        self.armed = False
        if self.at_once is None:
            raise Terminated(signum)
        try:
            self.at_once(signum)
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    @staticmethod
    def _after_fork() -> None:
        active = _StopSignals._active
        if active is not None:
            _StopSignals._active = None
            try:
                active._restore()
            except ValueError:  # not the main thread (an embedding that forks from elsewhere): as it is
                pass


def _bare_dfx(argv: list[str]) -> list[str]:
    """``ptodist run --dfx SCRIPT``: a ``--dfx`` followed by the script (a file, or a name ending in .py) or by
    nothing means all outputs; the script is not its value."""
    if argv[:1] != ["run"]:
        return argv
    argv, i = list(argv), 1
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--dfx" and (i + 1 == len(argv) or os.path.isfile(argv[i + 1]) or argv[i + 1].endswith(".py")):
            argv[i] = "--dfx=all"
        elif argv[i] in ("--dfx", "--report-json"):
            i += 1  # the option's value
        i += 1
    return argv


def _run(args) -> int:
    script = args.script
    if not os.path.isfile(script):
        print(f"ptodist run: no such script: {script}", file=sys.stderr)
        return 2
    try:  # before the script runs: a bad value would stop it only at its first call
        if args.dfx is not None:
            parse_dfx(args.dfx, "--dfx")
            os.environ["PTODIST_DFX"] = args.dfx  # the switch every run of the script reads
        else:
            parse_dfx(os.environ.get("PTODIST_DFX", ""))
    except PtodistError as e:  # ConfigError: the value names no diagnostic output
        print(f"ptodist run: {e}", file=sys.stderr)
        return 2
    compat.install()
    sys.argv = [script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    found: list = []
    code = 1
    ended_by = None  # the signal that stopped the run, for the report
    started = time.monotonic()
    programs.forget_dispatches()

    def report_and_die(signum: int) -> None:  # under an MPI launcher; no MPI call, no unwinding
        name = signal.Signals(signum).name
        os.write(2, f"ptodist: terminated by {name}\n".encode())
        if args.report_json:
            _write_report(args.report_json, 128 + signum, found, name, started)

    with _StopSignals(report_and_die if started_by_mpi_launcher() else None) as stop:
        try:
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except RankInternalError as e:
                # A rank hit a bug in ptodist: the message holds the rank's whole traceback, ptodist's frames too.
                print(f"ptodist: {type(e).__name__}: {e}", file=sys.stderr)
                print("ptodist: this is a bug in ptodist, not in your program; please report it.", file=sys.stderr)
                found = findings.from_exception(e)
                code = 3
            except PtodistError as e:
                found = findings.from_exception(e)  # one naming no line is located at the user's call
                # Under mpirun every process raised it: one prints the report, the others a pointer to it.
                write_report(report_pointer(e) or _error_report(e, found))
            except PtodistInternalError as e:
                traceback.print_exc()
                found = findings.from_exception(e)
                print("ptodist: this is a bug in ptodist, not in your program; please report it.", file=sys.stderr)
                code = 3
            except KeyboardInterrupt as e:
                code = _interrupted(e)
                ended_by = "SIGINT"
            except Exception as e:
                # The script's own error: show it as `python SCRIPT` would, without the frames of `ptodist run`.
                print(format_script_error(e), end="", file=sys.stderr)
                # What a dispatch did that a device runs otherwise (a chip call on another rank's slice): the cause.
                suspects = programs.suspects()
                found = suspects + _error_findings(e, _script_error_fix(programs.dispatched()[1] is not None,
                                                                        [script, *args.args]))
                for item in found:
                    if item.kind == "script_error" or item in suspects or item.fix:
                        print(item.summary(), file=sys.stderr)
        except Terminated as e:
            # SIGTERM / SIGHUP, while the script ran (the runtime stopped its ranks on the way out) or while
            # another ending was being reported: the shell's convention, 128 + the signal number.
            _print_notes(e)
            print(f"ptodist: {e}", file=sys.stderr)
            code = 128 + e.signum
            ended_by = e.name
        finally:
            stop.disarm()
            if args.report_json:
                _write_report(args.report_json, code, found, ended_by, started)
    return code


def _print_notes(e: BaseException) -> None:
    """What the runtime added to an interrupt that cut a run short: where each rank was."""
    for note in getattr(e, "__notes__", ()):
        print(f"ptodist: {note}", file=sys.stderr)


def _error_report(e: PtodistError, found: list) -> str:
    """A user-facing error as ``ptodist run`` reports it: the message (it names rank, function and line; our
    frames would be noise), the script's line that raised it, and the findings."""
    lines = [f"ptodist: {type(e).__name__}: {e}"]
    user = [f for f in traceback.extract_tb(e.__traceback__)
            if not is_tool_frame(f.filename) and not f.filename.startswith("<")]
    if user:
        f = user[-1]
        lines.append(f"  raised by {f.filename}:{f.lineno} in {f.name}: {f.line}")
    return "\n".join([*lines, *(item.summary() for item in found)])


def _interrupted(e: BaseException | None = None) -> int:
    """Report Ctrl-C (``e``: its KeyboardInterrupt, with where each rank was when a run was cut short) and return
    its exit status; a later Ctrl-C is ignored while the command ends.

    The ranks were stopped on the way out (the runtime's clean-up); another KeyboardInterrupt now would
    only cut the report short with a traceback of whatever Python was doing (joining threads, exiting).
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if e is not None:
        _print_notes(e)
    print("ptodist: interrupted", file=sys.stderr)
    return 130


def _error_findings(e: Exception, fix: str) -> list:
    """The findings of an exception that is not ptodist's own error.

    One the script's own code raised (its innermost frame is the script's, as an ``assert`` comparing
    results) is a ``script_error`` with ``fix``; one raised inside ptodist (a misused call) stays what
    :func:`findings.from_exception` makes of it.
    """
    frames = traceback.extract_tb(e.__traceback__)
    called = isinstance(e, TypeError) and findings.signature_fix(str(e), "".join(traceback.format_tb(e.__traceback__)))
    if not frames or is_tool_frame(frames[-1].filename) or called:  # a pl/pld call whose arguments do not fit
        return findings.from_exception(e)
    where: list[str] = []
    for f in reversed(frames):
        loc = f"{f.filename}:{f.lineno}"
        if not is_tool_frame(f.filename) and not f.filename.startswith("<") and loc not in where:
            where.append(loc)
    return [findings.Finding("script_error", f"{type(e).__name__}: {e}", [], where, None, fix)]


def _script_error_fix(dispatched: bool, command: list[str]) -> str:
    """The fix of a ``script_error`` under ``ptodist run``: after a dispatch, wrong numbers may be a race."""
    if not dispatched:
        return "The script's own code raised this before it dispatched anything: see its traceback."
    return ("The script's own code raised this, not ptodist. If it checks a dispatch's results, wrong numbers "
            "often come from a race, a stale signal or an uninitialised read, which `ptodist run` does not look "
            f"for: `{commands.ptodist('check', *command)}` runs the script under many schedules and "
            "names them.")


def _check_script_error_fix(dispatched: bool) -> str:
    """The fix of a ``script_error`` under ``ptodist check``."""
    if not dispatched:
        return "The script's own code raised this before it dispatched anything: see its traceback."
    return ("The script's own code raised this, not ptodist, and the dispatches before it had no findings in "
            "this schedule. If it checks their results, look at the kernels' arithmetic and offsets, or try more "
            "schedules (--schedules N).")


def _run_facts(code: int, started: float | None) -> dict:
    """What ran, for the report: the last program dispatched (and every one), the exit status, time, version."""
    every, last = programs.dispatched()
    facts = {"exit_status": code}
    facts.update(last or {"program": None, "backend": None, "device_ids": None, "world_size": None,
                          "output_dir": None})
    facts["programs"] = every
    facts["wall_time_s"] = round(time.monotonic() - started, 3) if started is not None else None
    facts["ptodist_version"] = __version__
    return facts


def _check(args) -> int:
    script = args.script
    if not os.path.isfile(script):
        print(f"ptodist check: no such script: {script}", file=sys.stderr)
        return 2
    if args.schedules < 1:
        print(f"ptodist check: --schedules must be at least 1, got {args.schedules}", file=sys.stderr)
        return 2
    compat.install()
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    def replay(seed: int) -> str:  # the command that runs schedule `seed` alone, as a shell runs it pasted
        return commands.ptodist("check", "--seed", seed, "--schedules", "1", script, *args.args)

    outcome, seed = None, args.seed
    with _StopSignals() as stop:
        try:
            for k in range(args.schedules):
                seed = args.seed + k
                outcome = _check_schedule(args, k, seed, replay)
                if outcome.failed or not outcome.session.dispatches:
                    break
            else:
                print(f"ptodist check: no findings in {args.schedules} schedule(s) "
                      f"(seeds {args.seed}..{args.seed + args.schedules - 1}).", file=sys.stderr)
        except KeyboardInterrupt as e:  # the schedule's ranks were stopped on the way out; no later one runs
            return _check_stopped(args, _interrupted(e), "SIGINT", seed)
        except Terminated as e:
            _print_notes(e)
            print(f"ptodist: {e}", file=sys.stderr)
            return _check_stopped(args, 128 + e.signum, e.name, seed)
        finally:
            stop.disarm()
    failed = outcome.failed
    if args.report_json:
        doc = findings.report("findings" if outcome.findings else ("error" if failed else "ok"), outcome.findings)
        doc.update(seed=outcome.session.seed, policy=outcome.session.policy,
                   replay=None if failed and _schedule_independent(outcome) else
                   replay(outcome.session.seed))
        shrunk = getattr(outcome, "shrunk", None)
        doc["schedule"] = shrunk.to_json() if shrunk is not None else None
        _write_json(args.report_json, doc)
    return 1 if failed else 0


def _check_stopped(args, code: int, signal_name: str, seed: int) -> int:
    """``ptodist check`` was stopped by a signal while schedule ``seed`` ran: write the report; return ``code``."""
    if args.report_json:
        _write_json(args.report_json, {"status": "error", "signal": signal_name, "findings": [], "seed": seed,
                                       "policy": None, "replay": None, "schedule": None})
    return code


def _write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def _check_schedule(args, k: int, seed: int, replay):
    """Run schedule ``k`` of ``ptodist check`` (seed ``seed``); print its line, and its findings when it failed."""
    from .check import explore

    outcome = explore.run_schedule(args.script, list(args.args), seed)
    outcome.shrunk = None
    s = outcome.session
    error = getattr(outcome, "error", None)
    if error is not None and not isinstance(error, PtodistError) and outcome.findings:
        # the script's own exception: its finding comes last
        outcome.findings[-1:] = _error_findings(error, _check_script_error_fix(bool(s.dispatches)))
    head = f"ptodist check: schedule {k + 1}/{args.schedules} (seed {seed}"
    head += f", {s.policy}): " if s.policy else "): "
    if not outcome.failed:
        print(head + f"no findings ({s.world} ranks, {s.dispatches} dispatch(es), {s.events} events)",
              file=sys.stderr)
        if not s.dispatches:
            print("ptodist check: the script made no dispatch; nothing was checked.", file=sys.stderr)
        return outcome
    n = len(outcome.findings)
    print(head + (f"{n} finding(s)" if n else f"the script exited with status {outcome.exit_code}"),
          file=sys.stderr)
    if outcome.stdout:
        print("--- the script's output ---\n" + outcome.stdout.rstrip(), file=sys.stderr)
    if outcome.traceback:
        print(outcome.traceback.rstrip(), file=sys.stderr)
    for f in outcome.findings:
        print(f.render(), file=sys.stderr)
    static = _schedule_independent(outcome)
    if static:
        print(f"ptodist check: {static}; it does not depend on the schedule, so there is no seed to replay.",
              file=sys.stderr)
    else:
        # The smallest schedule that fails the same way, told step by step (each re-run's output is dropped).
        outcome.shrunk = explore.shrink(explore.script_target(args.script, list(args.args), io.StringIO()),
                                        outcome, enabled=not args.no_shrink)
        if outcome.shrunk is not None:
            print(outcome.shrunk.render(), file=sys.stderr)
        print("Replay exactly: " + replay(seed), file=sys.stderr)
    return outcome


def _schedule_independent(outcome) -> str:
    """Why a failed schedule's outcome does not depend on the schedule ("": it may)."""
    s = outcome.session
    if s.findings:
        return ""  # the checker's findings: from this schedule's interleaving
    error = getattr(outcome, "error", None)
    if error is not None:
        static = isinstance(error, PtodistError) and not isinstance(error, (RankError, HangError, CheckError))
    else:  # no exception object: ptodist's static errors are the findings that name no rank
        static = bool(outcome.findings) and not outcome.traceback and all(not f.ranks for f in outcome.findings)
    if static:
        return "this error was found before the ranks of its dispatch ran (a static check)"
    return "the script failed before any rank ran" if not s.dispatches else ""


def _write_report(path: str, code: int, found: list, ended_by: str | None = None,
                  started: float | None = None) -> None:
    """Write the --report-json document, whatever ended the run (``ended_by``: the signal that stopped it)."""
    doc = findings.report("ok" if code == 0 else "error", found)
    head = {"status": doc.pop("status")}
    if ended_by is not None:
        head["signal"] = ended_by
    doc = {**head, **_run_facts(code, started), **doc}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def _trace(args) -> int:
    from .dfx import html, summary

    try:
        text = summary.report(args.dir, dispatch=args.dispatch, top=max(args.top, 0), open_trace=args.open)
        written = html.write(args.dir, args.html, dispatch=args.dispatch, top=max(args.top, 0)) if args.html else None
    except summary.TraceError as e:
        print(f"ptodist trace: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ptodist trace: cannot write the HTML report {args.html}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    if written is not None:
        sys.stdout.write(f"\nHTML report: {written} (one self-contained file: open it in any browser, offline)\n")
    return 0


def main(argv=None) -> int:
    """Entry point of the ``ptodist`` command."""
    parser = argparse.ArgumentParser(prog="ptodist", description="Run PyPTO distributed programs without NPUs.")
    parser.add_argument("--version", action="version", version=f"ptodist {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script (pypto.* imports resolve to ptodist)")
    run.add_argument("--report-json", metavar="PATH", default=None,
                     help='write {"status": "ok" | "error", "exit_status", "program", "backend", "device_ids", '
                          '"world_size", "output_dir", "wall_time_s", "ptodist_version", "findings": [...]} to PATH, '
                          'whatever happens')
    run.add_argument("--dfx", metavar="KINDS", default=None,
                     help="turn on diagnostic outputs without editing the script: all (a bare --dfx), or a "
                          "comma-separated list of swimlane (or trace), deps, scope_stats, dump; sets PTODIST_DFX "
                          "for the script (docs/dfx.md)")
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
                       help='write {"status": "ok" | "findings" | "error", "seed": S, "findings": [...], '
                            '"schedule": {...}} to PATH')
    check.add_argument("--no-shrink", action="store_true",
                       help="tell the failing schedule as it ran, without looking for a smaller one that fails "
                            "the same way")
    check.add_argument("script", help="the Python script to check")
    check.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    trace = sub.add_parser("trace", help="summarise a run's diagnostic outputs (swimlane records)",
                           description="Summarise one dispatch's swimlane records: per-rank busy, waiting and "
                                       "communicating time, the longest waits and what released them, and the "
                                       "critical path across ranks.")
    trace.add_argument("dir", help="the program's output_dir (the newest run in it is summarised), or one run's "
                                   "folder (its dfx_outputs, a dfx_outputs.<n> beside it, or an older "
                                   "dfx_outputs/run_<timestamp>_<pid>)")
    trace.add_argument("--dispatch", type=int, default=None, metavar="K",
                       help="which dispatch (d{K}); default: the last one")
    trace.add_argument("--top", type=int, default=10, metavar="N", help="how many of the longest waits to list")
    trace.add_argument("--open", action="store_true", help="also print the merged trace's path and how to open it")
    trace.add_argument("--html", metavar="FILE", default=None,
                       help="also write one self-contained HTML report (timeline, who waited on whom, critical path, "
                            "findings) to FILE")
    args = parser.parse_args(_bare_dfx(sys.argv[1:] if argv is None else list(map(str, argv))))
    if args.command == "run":
        return _run(args)
    if args.command == "trace":
        return _trace(args)
    if args.command == "check":
        return _check(args)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    raise SystemExit(main())
