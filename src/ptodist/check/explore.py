"""``ptodist check``: run a script under several sim schedules; stop at the first with findings.

While one schedule runs, a :class:`Session` is active: every dispatch of the
script goes to the ``sim`` backend (whatever its RunConfig says), which takes
the session's seed, records each rank's accesses, notifies and waits, runs the
happens-before checker when the dispatch ends and hands its findings here.
Schedule ``k`` of a run uses seed ``S + k``; a seed fixes everything, so
``--seed S --schedules 1`` replays one exactly.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from dataclasses import dataclass, field

from ..errors import CheckError, PtodistError
from . import findings as findings_mod

_active: Session | None = None


@dataclass
class Session:
    """One schedule of a script: its seed and what its dispatches found."""

    seed: int
    dispatches: int = 0
    events: int = 0
    world: int = 0
    policy: str = ""
    findings: list = field(default_factory=list)

    def record(self, plan, run) -> None:
        """Called by the sim backend when a dispatch ends (however it ends)."""
        from ..backends.sim import describe_policy

        self.dispatches += 1
        self.world = plan.world
        self.policy = describe_policy(run.sched.policy)
        self.events += sum(len(log.records) + len(log.accesses) for log in run.logs if log is not None)
        self.findings.extend(run.findings)


def active() -> Session | None:
    """The session of the schedule running now, or None outside ``ptodist check``."""
    return _active


@dataclass
class Outcome:
    """How one schedule of the script ended."""

    session: Session
    findings: list
    exit_code: int          # the script's own exit status (0: it returned normally)
    traceback: str = ""     # the script's error, when it raised one the checker did not explain
    stdout: str = ""


@contextlib.contextmanager
def checking(seed: int):
    """Within this block every dispatch runs on the sim backend under ``seed`` and is checked; yields the Session."""
    global _active
    if _active is not None:
        raise RuntimeError("ptodist check: a check session is already active in this process")
    _active = Session(seed)
    try:
        yield _active
    finally:
        _active = None


def run_schedule(script: str, argv: list[str], seed: int) -> Outcome:
    """Run ``script`` once, every dispatch on the sim backend under ``seed``; collect its findings."""
    out = io.StringIO()
    code, found, tb = 0, [], ""
    with checking(seed) as session:
        saved_argv = sys.argv
        sys.argv = [script, *argv]
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                tb = str(e.code)
        except CheckError:
            code = 1  # its findings are the session's already
        except Exception as e:  # noqa: BLE001 - whatever the script raised is part of this schedule's outcome
            from ..cli import format_script_error

            code = 1
            found = findings_mod.from_exception(e)
            if not isinstance(e, PtodistError):  # ptodist's own errors are whole in their findings
                tb = format_script_error(e)
        finally:
            sys.argv = saved_argv
    return Outcome(session, session.findings + found, code, tb, out.getvalue())
