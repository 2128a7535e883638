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

A failing schedule is then shrunk (:func:`shrink`): its decisions are
replayed with fewer and fewer of them kept, the others taken as the plain
schedule takes them, as long as the same finding shows; the smallest run is
told as a numbered story (:mod:`ptodist.check.story`).
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..errors import CheckError, ConfigError, PtodistError
from ..source import format_script_error
from . import findings as findings_mod
from . import story as story_mod

# Shrinking re-runs the target at most this many times and starts no re-run after this many seconds: a
# tutorial-sized program runs a schedule in tens of milliseconds, so ~100 re-runs (what delta debugging needs
# for a few dozen decisions) fit in a few seconds, while a script that takes seconds per run keeps its report
# within a coffee-free wait.  The trial bound makes the result a function of the seed; the time bound only
# stops a slow script early (the report says so).
SHRINK_TRIALS = 100
SHRINK_SECONDS = 10.0


@dataclass
class Session:
    """One schedule of a script: its seed and what its dispatches found."""

    seed: int
    dispatches: int = 0
    events: int = 0
    world: int = 0
    policy: str = ""
    findings: list = field(default_factory=list)
    # What the program did that a failure of the script is blamed on (a worker output read before result(), a chip
    # call placed on another rank's slice): findings only if the script then fails.
    suspects: list = field(default_factory=list)
    decisions: object = None   # the schedule's Decisions (backends.sim): forced ones, and every one taken
    runs: list = field(default_factory=list)  # per scheduler run: a story.RunRecord
    _dispatch_objects: list = field(default_factory=list, repr=False)  # each dispatch's sim state, in order

    def record(self, plan, run) -> None:
        """Called by the sim backend when a dispatch ends (however it ends)."""
        from ..backends.sim import describe_policy

        self.dispatches += 1
        self.world = plan.world
        self.policy = describe_policy(run.sched.policy)
        self.events += sum(len(log.records) + len(log.accesses) for log in run.logs if log is not None)
        self.findings.extend(run.findings)
        for message, locations in getattr(plan, "misplaced", ()):  # chip calls placed on another rank's slice
            if all(f.message != message for f in self.suspects):
                self.suspects.append(findings_mod.misplaced(message, locations))
        if run.sched.decisions is not None:
            dispatch = next((i for i, r in enumerate(self._dispatch_objects) if r is run.dispatch), None)
            if dispatch is None:
                dispatch = len(self._dispatch_objects)
                self._dispatch_objects.append(run.dispatch)
            until = run.dispatch.clock.now if run.dispatch.clock is not None else 0
            self.runs.append(story_mod.RunRecord(run.sched.number, dispatch, list(run.logs), run.since, until,
                                                 list(run.findings), run.sched.deadlock, run.stalled))


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
def checking(seed: int, decisions=None):
    """Within this block every dispatch runs on the sim backend under ``seed`` and is checked; yields the Session.

    The block forces a :class:`~ptodist.backends.sim.SimBackend` that holds the session
    (:func:`ptodist.backends.forcing`): one-shot calls and DistributedWorkers prepared inside it run there.
    ``decisions`` (a :class:`~ptodist.backends.sim.Decisions`) forces scheduling decisions (a replay);
    by default every decision follows the seed's policy.
    """
    from ..backends import forcing
    from ..backends.sim import Decisions, SimBackend

    session = Session(seed, decisions=decisions if decisions is not None else Decisions())
    with forcing(SimBackend(session)):
        yield session


def run_checked(target: Callable[[], object], seed: int, decisions=None) -> Outcome:
    """Call ``target()`` once, every dispatch on the sim backend under ``seed``; collect its findings.

    A dispatch's checker findings, a ``HangError``, a ``RankError`` or any other exception ``target``
    raises become the outcome's findings (:func:`ptodist.check.findings.from_exception`); a
    ``SystemExit`` gives the exit status.  Nothing ``target`` raises escapes, except ``BaseException``s
    other than ``SystemExit`` (``KeyboardInterrupt``).  ``decisions``: as for :func:`checking`.
    """
    code, found, tb, error, value = 0, [], "", None, None
    with checking(seed, decisions) as session:
        try:
            value = target()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                tb = str(e.code)
        except CheckError:
            code = 1  # its findings are the session's already
        except Exception as e:  # noqa: BLE001 - whatever the target raised is part of this schedule's outcome
            code, error = 1, e
            found = findings_mod.from_exception(e)
            if not isinstance(e, PtodistError):  # ptodist's own errors are whole in their findings
                tb = format_script_error(e)
    if code and session.suspects:  # the script failed after something a device runs differently: the cause first
        found = session.suspects + found
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


def script_target(script: str, argv: list[str], out: io.StringIO) -> Callable[[], None]:
    """A target that runs ``script`` as ``__main__`` with ``sys.argv`` ``[script, *argv]``, its output into ``out``."""

    def target() -> None:
        saved_argv = sys.argv
        sys.argv = [script, *argv]
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_path(script, run_name="__main__")
        finally:
            sys.argv = saved_argv

    return target


def run_schedule(script: str, argv: list[str], seed: int) -> Outcome:
    """Run ``script`` once, every dispatch on the sim backend under ``seed``; collect its findings."""
    out = io.StringIO()
    outcome = run_checked(script_target(script, argv, out), seed)
    outcome.stdout = out.getvalue()
    return outcome


# -- the smallest failing schedule ---------------------------------------------------------------------------

@dataclass
class Shrunk:
    """A failing schedule told as a story: the original's, and the smallest one found that shows the same finding.

    ``story`` is the smallest schedule's (the original's when not shrunk); ``original`` the original's;
    ``trials``: the re-runs shrinking made; ``bounded``: why shrinking stopped before it was done ("" when
    it was done, or did not run); ``forced``: the decisions that replay the smallest schedule (every other
    one taken as the plain schedule takes it).
    """

    seed: int
    policy: str
    original: story_mod.Story
    story: story_mod.Story
    shrunk: bool = True
    trials: int = 0
    bounded: str = ""
    forced: dict = field(default_factory=dict)

    def render(self) -> str:
        """The story as ``ptodist check`` prints it, under the findings."""
        o, s = self.original, self.story
        if self.shrunk:
            head = (f"The smallest failing schedule found (seed {self.seed}, {self.policy}; shrunk from "
                    f"{o.steps} to {s.steps} steps, {o.preemptions} to {s.preemptions} preemptions"
                    + (f"; {self.bounded}" if self.bounded else "") + "):")
        else:
            head = (f"The failing schedule (seed {self.seed}, {self.policy}; {s.steps} steps, {s.preemptions} "
                    "preemptions; not shrunk):")
        return "\n".join([head, *("  " + line for line in s.lines)])

    def to_json(self) -> dict:
        """The ``schedule`` object of ``--report-json``."""
        return {"seed": self.seed, "policy": self.policy, "shrunk": self.shrunk, "steps": self.story.steps,
                "preemptions": self.story.preemptions, "original_steps": self.original.steps,
                "original_preemptions": self.original.preemptions, "trials": self.trials,
                "bounded": self.bounded or None, "story": list(self.story.lines)}


def _told(outcome: Outcome) -> tuple[story_mod.Story, object] | None:
    """The story of ``outcome`` up to its first finding; None when that finding is not the schedule's: not the
    checker's nor a deadlock (a rank's error, the script's own, one found before the ranks ran)."""
    s = outcome.session
    if not outcome.findings or not s.runs or s.decisions is None:
        return None
    sig = story_mod.signature(outcome.findings[0])
    if not s.runs[-1].deadlock and not any(story_mod.signature(f) == sig for r in s.runs for f in r.findings):
        return None
    return story_mod.tell(s.runs, s.decisions.taken, outcome.findings[0]), outcome.findings[0]


def shrink(target: Callable[[], object], outcome: Outcome, *, enabled: bool = True,
           max_trials: int = SHRINK_TRIALS, max_seconds: float = SHRINK_SECONDS) -> Shrunk | None:
    """The smallest schedule found that fails as ``outcome`` (a failing schedule of ``target``) did, as a story.

    Keeps the same first finding (the same kind and lines) while it drops the schedule's decisions that
    differ from the plain schedule's (the running rank goes on while it can, else the lowest rank; tasks in
    program order): first all of them, then, delta-debugging, chunks of them and one at a time.  A re-run is
    kept only when its story has no more steps and no more preemptions than the best so far, so the result
    is never longer than the original.  None when the outcome has no schedule to tell (an error found before
    any rank ran, a script that failed before it dispatched) or its finding is not one of the schedule's (a
    rank's error, the script's own).  ``enabled`` False, or a rank stopped by the wall clock (each re-run
    would wait the hang timeout again), tells the original schedule as it is.
    """
    told = _told(outcome)
    if told is None:
        return None
    s = outcome.session
    original, first = told
    result = Shrunk(s.seed, s.policy, original, original, shrunk=enabled)
    if not enabled:
        return result
    if any(r.stalled for r in s.runs):
        result.shrunk = False
        return result
    from ..backends.sim import Decisions

    sig = story_mod.signature(first)
    best = result.forced = _deviations(s.decisions.taken)  # with the plain schedule for the rest: the original
    started = time.monotonic()

    def quiet() -> object:
        with contextlib.redirect_stderr(io.StringIO()):  # what the script says was said by the original run
            return target()

    def attempt(forced: dict) -> bool:
        nonlocal best
        if result.trials >= max_trials:
            result.bounded = result.bounded or f"stopped after {max_trials} re-runs"
            return False
        if time.monotonic() - started > max_seconds:
            result.bounded = result.bounded or f"stopped after {max_seconds:g} s"
            return False
        result.trials += 1
        trial = run_checked(quiet, s.seed, Decisions(forced, plain=True))
        match = next((f for f in trial.findings if story_mod.signature(f) == sig), None)
        if match is None or not trial.session.runs or any(r.stalled for r in trial.session.runs):
            return False
        told = story_mod.tell(trial.session.runs, trial.session.decisions.taken, match)
        if told.steps > result.story.steps or told.preemptions > result.story.preemptions:
            return False
        result.story, result.forced = told, forced
        best = _deviations(trial.session.decisions.taken)
        return True

    if best and not attempt({}):
        n = 2
        while best and not result.bounded:
            keys = list(best)
            size = -(-len(keys) // n)
            chunks = [keys[i:i + size] for i in range(0, len(keys), size)]
            for chunk in chunks:
                drop = set(chunk)
                if attempt({k: v for k, v in best.items() if k not in drop}):
                    n = max(n - 1, 2)
                    break
            else:
                if size == 1:
                    break
                n = min(len(keys), 2 * n)
    return result


def _deviations(taken: list) -> dict:
    """The decisions of a schedule that the plain schedule would have taken otherwise: key -> choice."""
    return {d.key: d.chosen for d in taken if d.chosen != d.plain}
