"""The bug zoo: one program per SPEC §8 pitfall, run through ``ptodist run --report-json`` (or ``ptodist check``).

The programs live in ``docs/gen_debugging.py`` (``ZOO``), which also renders
``docs/debugging.md`` from their output. Each buggy program must end (within
60 s; hangs are certain deadlocks, reported in about a second), exit non-zero,
and report status ``"error"`` (``"findings"`` for the entries run under
``ptodist check``) with a finding of the expected kind, ranks and
SPEC §8 row whose locations hold the line marked ``# BUG``. The correct
programs must give status ``"ok"`` and no findings. Then the committed page must
hold exactly what the runs printed (regenerate it with
``python docs/gen_debugging.py``).

A zoo entry's ``issues`` names checks that fail because of a known ptodist
shortcoming: the test expects exactly those to fail (xfail), and fails once one
of them passes, so the entry is updated when ptodist is fixed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_debugging", REPO / "docs" / "gen_debugging.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
BUGGY = [bug for bug in gen.ZOO if bug.kinds]
CLEAN = [bug for bug in gen.ZOO if not bug.kinds]
REGENERATE = "docs/debugging.md is out of date: run `python docs/gen_debugging.py`"


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    """``zoo_run(name)``: the entry's run, made once per module."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = gen.run(gen.BY_NAME[name], tmp_path_factory.mktemp(name), timeout=60)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def page_blocks():
    return gen.parse(gen.PAGE.read_text()) if gen.PAGE.exists() else {}


def _failed_checks(bug, finding: dict, where: str) -> dict[str, str]:
    """The checks ``finding`` fails, with what was expected."""
    failed = {}
    if finding["ranks"] != list(bug.ranks):
        failed["ranks"] = f"ranks {list(bug.ranks)}, got {finding['ranks']}"
    if where not in finding["locations"]:
        failed["location"] = f"{where} among the locations, got {finding['locations']}"
    if bug.pitfall and bug.pitfall not in (finding["pitfall"] or ""):
        failed["pitfall"] = f"a pitfall naming {bug.pitfall!r}, got {finding['pitfall']!r}"
    return failed


@pytest.mark.parametrize("bug", BUGGY, ids=lambda b: b.name)
def test_buggy_program_is_reported(bug, zoo_run):
    r = zoo_run(bug.name)
    assert r.returncode != 0, r.stderr
    assert r.report.get("status") == ("findings" if bug.command == "check" else "error"), (r.report, r.stderr)
    assert bug.bug_line is not None, f"{bug.name}: no {gen.BUG_MARK} marker"
    where = f"{r.script}:{bug.bug_line}"
    candidates = [f for f in r.report["findings"] if f["kind"] in bug.kinds]
    assert candidates, f"no finding of kind {bug.kinds}: {r.report['findings']}\n{r.stderr}"
    if "hang" in bug.kinds:  # a certain deadlock, reported at once, not after the hang timeout
        assert any(f["message"].startswith("deadlock:") for f in candidates), r.stderr
    failed = min((_failed_checks(bug, f, where) for f in candidates), key=len)
    unexpected = {k: v for k, v in failed.items() if k not in bug.issues}
    assert not unexpected, f"expected {'; '.join(unexpected.values())}\n{r.stderr}"
    fixed = sorted(set(bug.issues) - set(failed))
    assert not fixed, f"known issue(s) {fixed} no longer happen: remove them from the zoo entry '{bug.name}'"
    if failed:
        pytest.xfail("; ".join(f"{k}: {bug.issues[k]} (expected {v})" for k, v in failed.items()))


@pytest.mark.parametrize("bug", CLEAN, ids=lambda b: b.name)
def test_correct_program_runs_clean(bug, zoo_run):
    r = zoo_run(bug.name)
    assert r.returncode == 0, r.stderr
    assert (r.report["status"], r.report["findings"], r.report["exit_status"]) == ("ok", [], 0)
    assert r.stdout.splitlines()[-1:] == ["OK"], r.stdout


def test_build_time_switches_are_named_once(zoo_run):
    r = zoo_run("build_flags")
    for name in ("SIMPLER_HOST_STRACE", "SIMPLER_DFX"):
        assert r.stderr.count(f"ptodist: {name} is a build-time switch") == 1, r.stderr


def test_zoo_covers_every_detected_kind():
    kinds = {k for bug in BUGGY for k in bug.kinds}
    assert kinds >= {"hang", "shape_mismatch", "task_args_order", "dispatch_coverage", "type_mismatch",
                     "window_too_small", "peer_out_of_range", "out_of_bounds", "signal_layout", "aliasing",
                     "collective_in_loop", "rank_error", "race", "uninitialized_read", "stale_signal"}
    names = [bug.name for bug in gen.ZOO]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("bug", gen.ZOO, ids=lambda b: b.name)
def test_page_shows_what_the_program_printed(bug, zoo_run, page_blocks):
    r = zoo_run(bug.name)
    assert bug.name in page_blocks, REGENERATE
    assert gen.output_block(r) == page_blocks[bug.name], REGENERATE
    if bug.name == "hang":
        assert gen.report_block(r) == page_blocks["hang.report"], REGENERATE


def test_page_text_is_generated(page_blocks):
    """Everything around the runs' output (prose, programs, links) is what the generator renders."""
    try:
        page = gen.render(page_blocks)
    except KeyError as e:
        pytest.fail(f"block {e} missing: {REGENERATE}")
    assert page == gen.PAGE.read_text(), REGENERATE


# -- the new execution model: one bug per feature, with its fixed twin ------------------------------------------


@pytest.fixture(scope="module")
def feature_runs(tmp_path_factory):
    """Every FEATURES entry's run and (for a checker bug) its fixed twin's, made two at a time once per module."""
    return gen.run_features(tmp_path_factory.mktemp("features"))


@pytest.mark.parametrize("bug", gen.FEATURES, ids=lambda b: b.name)
def test_new_feature_program(bug, feature_runs):
    """A buggy entry is found, with the right kind, naming its root line first; a checker bug's fixed twin is clean
    under ``ptodist check --schedules 20`` (every twin is, under ``python docs/gen_debugging.py --measure``); a
    correct entry runs clean."""
    r, twin = feature_runs[bug.name]
    if bug.kinds:
        assert bug.bug_line is not None, f"{bug.name}: no {gen.BUG_MARK} marker"
    assert set(bug.issues) <= set(gen.CHECKS), f"{bug.name}: unknown checks {set(bug.issues) - set(gen.CHECKS)}"
    failed = gen.judge(bug, r, twin)
    unexpected = {k: v for k, v in failed.items() if k not in bug.issues}
    assert not unexpected, f"expected {'; '.join(unexpected.values())}\n{r.stderr}\n{twin.stderr if twin else ''}"
    fixed = sorted(set(bug.issues) - set(failed))
    assert not fixed, f"known issue(s) {fixed} no longer happen: remove them from the entry '{bug.name}'"
    if failed:
        why = dict.fromkeys(bug.issues[k] for k in failed)
        pytest.xfail(f"{', '.join(failed)}: {'; '.join(why)}")


def test_new_feature_entries_are_well_formed():
    names = [bug.name for bug in gen.ZOO + gen.FEATURES]
    assert len(names) == len(set(names))
    for bug in gen.FEATURES:
        assert bug.feature, bug.name
        if bug.kinds:
            assert bug.twin and gen.BUG_MARK not in bug.fixed.program, bug.name
            assert bug.fixed.program != bug.program, bug.name
