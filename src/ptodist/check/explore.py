"""``ptodist check``: run a script under several sim schedules; stop at the first with findings.

While one schedule runs, a :class:`Session` is active: every dispatch of the
script goes to a ``sim`` backend made for it (``backends.forcing``, whatever the
script's RunConfig says), which takes
the session's seed, records each rank's accesses, notifies and waits, runs the
happens-before checker when the dispatch ends and hands its findings here.
Schedule ``k`` of a run uses seed ``S + k``; a seed fixes everything, so
``--seed S --schedules 1`` replays one exactly.

One code path serves both front ends: :func:`run_checked` runs any callable
under one schedule and turns however it ended into an :class:`Outcome`, and
:func:`explore` tries seeds ``S, S+1, ...`` until a schedule has findings.
``ptodist check`` runs a script with :func:`run_schedule` (``run_checked`` on
``runpy``); :func:`ptodist.testing.check` runs one call of a program.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..errors import CheckError, ConfigError, PtodistError
from . import findings as findings_mod


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


@dataclass
class Outcome:
    """How one schedule of the script ended."""

    session: Session
    findings: list
    exit_code: int          # the script's own exit status (0: it returned normally)
    traceback: str = ""     # the script's error, when it raised one the checker did not explain
    stdout: str = ""
    error: BaseException | None = None  # the exception the target raised, other than a CheckError or SystemExit
    value: object = None    # what the target returned, when it returned

    @property
    def failed(self) -> bool:
        """Whether this schedule had findings or a non-zero exit status."""
        return bool(self.findings or self.exit_code)


@contextlib.contextmanager
def checking(seed: int):
    """Within this block every dispatch runs on the sim backend under ``seed`` and is checked; yields the Session.

    The block forces a :class:`~ptodist.backends.sim.SimBackend` that holds the session
    (:func:`ptodist.backends.forcing`): one-shot calls and DistributedWorkers prepared inside it run there.
    """
    from ..backends import forcing
    from ..backends.sim import SimBackend

    session = Session(seed)
    with forcing(SimBackend(session)):
        yield session


def run_checked(target: Callable[[], object], seed: int) -> Outcome:
    """Call ``target()`` once, every dispatch on the sim backend under ``seed``; collect its findings.

    A dispatch's checker findings, a ``HangError``, a ``RankError`` or any other exception ``target``
    raises become the outcome's findings (:func:`ptodist.check.findings.from_exception`); a
    ``SystemExit`` gives the exit status.  Nothing ``target`` raises escapes, except ``BaseException``s
    other than ``SystemExit`` (``KeyboardInterrupt``).
    """
    code, found, tb, error, value = 0, [], "", None, None
    with checking(seed) as session:
        try:
            value = target()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                tb = str(e.code)
        except CheckError:
            code = 1  # its findings are the session's already
        except Exception as e:  # noqa: BLE001 - whatever the target raised is part of this schedule's outcome
            from ..cli import format_script_error

            code, error = 1, e
            found = findings_mod.from_exception(e)
            if not isinstance(e, PtodistError):  # ptodist's own errors are whole in their findings
                tb = format_script_error(e)
    return Outcome(session, session.findings + found, code, tb, error=error, value=value)


def explore(target: Callable[[], object], seed: int = 0, schedules: int = 8) -> Iterator[Outcome]:
    """Run ``target`` under seeds ``seed``, ``seed + 1``, ... (``schedules`` of them), yielding each outcome.

    Stops after the first schedule that failed (findings, or a non-zero exit status) and after a
    schedule that made no dispatch (there is nothing to vary).
    """
    if schedules < 1:
        raise ConfigError(f"explore(schedules={schedules!r}): must be at least 1")
    for k in range(schedules):
        outcome = run_checked(target, seed + k)
        yield outcome
        if outcome.failed or not outcome.session.dispatches:
            return


def run_schedule(script: str, argv: list[str], seed: int) -> Outcome:
    """Run ``script`` once, every dispatch on the sim backend under ``seed``; collect its findings."""
    out = io.StringIO()

    def target() -> None:
        saved_argv = sys.argv
        sys.argv = [script, *argv]
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_path(script, run_name="__main__")
        finally:
            sys.argv = saved_argv

    outcome = run_checked(target, seed)
    outcome.stdout = out.getvalue()
    return outcome
