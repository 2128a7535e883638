"""Testing one's own distributed programs: :func:`check` runs ``ptodist check``'s checker in-process.

:func:`check` runs one call of a program on the ``sim`` backend under several
seeded schedules, with the happens-before checker on, and returns a
:class:`CheckReport`; ``report.assert_clean()`` fails a test with every
finding (kind, ranks, source lines, fix) and the command that replays the
failing schedule.

Installed with ptodist, the pytest plugin :mod:`ptodist.testing.plugin` adds
the ``@pytest.mark.ranks(2, 3, 4)`` marker, the ``device_ids`` fixture it
parametrises, and points every test's ptodist outputs (``PTODIST_OUTPUT_ROOT``)
at the test's ``tmp_path``.  See ``docs/testing.md``.

This module imports nothing from pytest: :func:`check` works in a plain script too.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .. import commands
from ..check.findings import Finding
from ..errors import ApiTypeError, ConfigError

__all__ = ["CheckReport", "REPLAY_ENV", "check"]

# When set, every check() runs this one schedule only: the replay of a failing test.
REPLAY_ENV = "PTODIST_CHECK_SEED"


@dataclass
class CheckReport:
    """What :func:`check` found: the findings of the first failing schedule, or none.

    ``findings``: the :class:`~ptodist.check.findings.Finding` objects of the failing schedule
    (empty when every schedule was clean); ``seeds``: the seeds tried, in order; ``seed`` and
    ``policy``: the failing schedule's seed and scheduling policy (``seed`` is None when clean;
    ``policy`` is then the last schedule's); ``replay``: what to run to replay the failing schedule
    exactly; ``world``: the rank count; ``dispatches``: the dispatches the last schedule made;
    ``result``: what the last schedule's call returned (None when it failed); ``schedule``: the failing
    schedule told as numbered steps, shrunk to the smallest one found that fails the same way
    (:class:`ptodist.check.explore.Shrunk`; None when clean, or when the failure came before any rank ran).
    """

    findings: list[Finding] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    seed: int | None = None
    policy: str = ""
    replay: str = ""
    world: int = 0
    dispatches: int = 0
    result: object = None
    program: str = ""
    schedules: int = 0
    schedule: object = None

    @property
    def clean(self) -> bool:
        """True when no schedule had a finding."""
        return not self.findings

    def render(self) -> str:
        """The report as a person reads it: a head line, each finding, and the replay line."""
        where = f" of {self.program}" if self.program else ""
        if self.clean:
            seeds = f"seed {self.seeds[0]}" if len(self.seeds) == 1 else f"seeds {self.seeds[0]}..{self.seeds[-1]}"
            return (f"ptodist check{where}: no findings in {len(self.seeds)} schedule(s) ({seeds}; "
                    f"{self.world} ranks)")
        k = self.seeds.index(self.seed) + 1 if self.seed in self.seeds else len(self.seeds)
        head = (f"ptodist check{where}: schedule {k}/{self.schedules} (seed {self.seed}"
                + (f", {self.policy}" if self.policy else "")
                + f"): {len(self.findings)} finding(s)" + (f" ({self.world} ranks)" if self.world else ""))
        story = [self.schedule.render()] if self.schedule is not None else []
        return "\n".join([head, *(f.render() for f in self.findings), *story, f"Replay exactly: {self.replay}"])

    __str__ = render

    def assert_clean(self) -> None:
        """Raise AssertionError listing every finding (kind, ranks, lines, fix) and the replay, unless clean."""
        __tracebackhide__ = True  # pytest shows the test's line and the message, not this frame
        if not self.clean:
            raise AssertionError(self.render())


# -- the test running now, as the pytest plugin tells it --------------------------------------------------

@dataclass
class _Test:
    """The pytest test running now: its request (for the device_ids fixture) and how to run it again."""

    request: object
    nodeid: str
    rootdir: Path


_current: _Test | None = None


def _set_current_test(test: _Test | None) -> None:
    global _current
    _current = test


def _test_device_ids() -> list[int] | None:
    """The running test's ``device_ids`` fixture value, when it uses that fixture."""
    if _current is None or "device_ids" not in getattr(_current.request, "fixturenames", ()):
        return None
    return list(_current.request.getfixturevalue("device_ids"))


def _replay(seed: int, program: str) -> str:
    if _current is not None:
        # The interpreter that runs the tests, by its path: the command works pasted where no venv is active.
        cmd = f"{REPLAY_ENV}={seed} {commands.python('-m', 'pytest', _current.nodeid)}"
        if Path.cwd().resolve() != _current.rootdir.resolve():
            cmd = f"cd {shlex.quote(str(_current.rootdir))} && {cmd}"
        return cmd
    return f"ptodist.testing.check({program}, ..., seed={seed}, schedules=1)"


# -- check ------------------------------------------------------------------------------------------------

def check(fn_or_compiled, *args, config=None, schedules: int = 8, seed: int = 0, shrink: bool = True) -> CheckReport:
    """Run ``fn_or_compiled(*args)`` on the sim backend under ``schedules`` seeded schedules, checked.

    ``fn_or_compiled`` is a ``@pl.jit.host`` function, a ``@pl.program`` class, or a compiled
    program (``host.compile(...)``, ``ptodist.ir.compile(...)``).  ``config`` (a ``RunConfig``, or
    a ``DistributedConfig`` for short) says on which devices a host function or program runs; in a
    test that uses the ``device_ids`` fixture it defaults to those devices.  A compiled program
    runs as compiled (``config``, if given, is passed to its call).

    Schedule ``k`` uses seed ``seed + k`` (the environment variable ``PTODIST_CHECK_SEED=S``
    replaces them with the single seed ``S``); ``check`` stops at the first schedule with
    findings: the checker's (races, unwritten reads, stale signals, clobbered Set cells), a
    deadlock or hang, a rank's error, or a ptodist error found before the ranks started.  Each
    schedule runs on fresh copies of the array and tensor arguments, so ``check`` modifies none
    of them and a replayed schedule sees exactly the inputs it saw.  An exception that is not
    ptodist's (a mistake in the call itself) is raised as is.

    The failing schedule is told as numbered steps (``report.schedule``), shrunk first to the smallest
    schedule found that shows the same finding, unless ``shrink`` is False.

    Outputs (dispatch plans) go where ``PTODIST_OUTPUT_ROOT`` says; under pytest, with the
    plugin, that is the test's ``tmp_path``.
    """
    from ..check import explore

    if isinstance(schedules, bool) or not isinstance(schedules, int) or schedules < 1:
        raise ConfigError(f"ptodist.testing.check(schedules={schedules!r}): must be an integer of at least 1")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"ptodist.testing.check(seed={seed!r}): must be an integer")
    env = os.environ.get(REPLAY_ENV)
    if env is not None and env.strip():
        try:
            seed, schedules = int(env), 1
        except ValueError:
            raise ConfigError(f"{REPLAY_ENV}={env!r}: the schedule seed to replay must be an integer") from None

    name, call = _prepare(fn_or_compiled, config)

    def target():
        return call(*(_fresh(a) for a in args))

    report = CheckReport(program=name, schedules=schedules)
    outcome = None
    for outcome in explore.explore(target, seed, schedules):
        report.seeds.append(outcome.session.seed)
        if outcome.error is not None and not _is_ptodist_error(outcome.error):
            raise outcome.error  # the call itself is wrong (not the distributed program): show it as is
    s = outcome.session
    report.world, report.dispatches, report.policy = s.world, s.dispatches, s.policy
    if outcome.failed:
        report.findings, report.seed = list(outcome.findings), s.seed
        report.replay = _replay(s.seed, name)
        report.schedule = explore.shrink(target, outcome, enabled=shrink)
    else:
        report.result = outcome.value
    return report


def _is_ptodist_error(e: BaseException) -> bool:
    from ..errors import PtodistError

    return isinstance(e, PtodistError)


def _prepare(target, config):
    """Return (name, call): ``call(*args)`` runs one dispatch of ``target`` (compiling it on first use)."""
    from ..language.functions import Function, Kind, Program
    from ..runtime.program import CompiledProgram

    if isinstance(target, CompiledProgram):
        cfg = _run_config(config) if config is not None else None
        return target.name, (lambda *a: target(*a, config=cfg)) if cfg is not None else target
    if isinstance(target, Program) or (isinstance(target, Function) and target.kind is Kind.HOST):
        if config is None:
            ids = _test_device_ids()
            if ids is None:
                raise ApiTypeError(
                    f"ptodist.testing.check({target.name}, ...): pass config=RunConfig(distributed_config="
                    "DistributedConfig(device_ids=[...])) (or config=DistributedConfig(...)) to say on which "
                    "devices it runs, or call check() in a test that uses the device_ids fixture")
            from ..config import DistributedConfig

            config = DistributedConfig(device_ids=ids)
        cfg = _run_config(config)
        compiled: list = []

        def call(*args):
            if not compiled:  # compiled inside the first schedule: errors found before the ranks start are findings
                compiled.append(CompiledProgram.build(target, config=cfg, example_args=args))
            return compiled[0](*args)

        return target.name, call
    raise ApiTypeError("ptodist.testing.check() takes a @pl.jit.host function, a @pl.program class or a compiled "
                       f"program (host.compile(...), ptodist.ir.compile(...)), got {target!r}")


def _run_config(config):
    from ..config import DistributedConfig, RunConfig

    if isinstance(config, DistributedConfig):
        return RunConfig(distributed_config=config)
    if isinstance(config, RunConfig):
        return config
    raise ApiTypeError(f"ptodist.testing.check(config=...): expects a RunConfig or a DistributedConfig, "
                       f"got {type(config).__name__}")


def _fresh(value):
    """A copy of an array or tensor argument (anything else as is): every schedule starts from the same inputs."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__.startswith("torch") and hasattr(value, "clone") and hasattr(value, "detach"):
        return value.detach().clone()
    return value
