"""``ptodist.testing``: the checker in-process, and the pytest plugin (``ranks`` marker, ``device_ids``).

A wrong-peer bug that is right at two ranks is found at three by a test marked
``@pytest.mark.ranks(2, 3)``; ``check`` turns races, hangs and rank errors into
findings, stops at the first failing schedule and says how to replay it; the
example test file runs (and a buggy one fails) under pytest in a subprocess,
writing nothing outside pytest's temporary directories.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import on_every_rank, window_program

import ptodist.language as pl
import ptodist.language.distributed as pld
import ptodist.testing
from ptodist import DistributedConfig, RunConfig, ir
from ptodist.check.findings import Finding

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "examples" / "testing"
N = 8
NR = pl.dynamic("NR")


# -- a wrong-peer bug: right at two ranks, a race at three ----------------------------------------------------

@pl.jit.incore
def shift_kernel(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                 ready: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    left = (me + n - 1) % n
    right = (me + 1) % 2  # @bug: the right neighbour is (me + 1) % n; this is it at two ranks only
    data = pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)  # @stage
    pld.system.notify(ready, left, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # my row is ready: tell its reader
    pld.system.wait(ready, [0, 0], 1, cmp=pld.WaitCmp.Ge)  # my right neighbour's row is ready
    return pl.store(pld.tile.remote_load(data, right, [0, 0], [1, N]), [0, 0], y)  # @pull


shift = on_every_rank(shift_kernel, name="shift")


def _rows(nr: int) -> np.ndarray:
    return np.arange(nr * N, dtype=np.float32).reshape(nr, 1, N) + 1


def _cfg(device_ids) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(device_ids)))


def _line(marker: str) -> str:
    lines = Path(__file__).read_text().splitlines()
    hits = [i for i, t in enumerate(lines, 1) if f"# @{marker}" in t and not t.lstrip().startswith("#")]
    assert len(hits) == 1, marker
    return f"{__file__}:{hits[0]}"


@pytest.mark.ranks(2, 3)
def test_a_wrong_peer_bug_passes_at_two_ranks_and_is_found_at_three(device_ids):
    x = _rows(len(device_ids))
    report = ptodist.testing.check(shift, x, config=_cfg(device_ids))
    if len(device_ids) == 2:
        report.assert_clean()
        np.testing.assert_array_equal(report.result, np.roll(x, -1, axis=0))  # each rank got its right neighbour's
        return
    assert [f.kind for f in report.findings] == ["race"], report.render()
    f = report.findings[0]
    assert f.ranks == [0, 1, 2] and set(f.locations) == {_line("stage"), _line("pull")}, f.render()
    assert report.seeds == [0] and report.seed == 0 and report.world == 3 and report.result is None
    with pytest.raises(AssertionError) as info:
        report.assert_clean()
    assert str(info.value) == report.render()
    # Not luck of the first schedule: every schedule finds it.
    for seed in range(1, 8):
        again = ptodist.testing.check(shift, x, config=_cfg(device_ids), seed=seed, schedules=1)
        assert {f.kind for f in again.findings} <= {"race", "uninitialized_read"} and again.findings, seed


# -- the plugin: marker and fixture ------------------------------------------------------------------------

@pytest.mark.ranks(2, 3, 4)
def test_the_ranks_marker_runs_a_test_once_per_rank_count(device_ids, request):
    p = int(request.node.callspec.id.removeprefix("P"))
    assert device_ids == list(range(p)) and p in (2, 3, 4)
    assert request.node.name == f"test_the_ranks_marker_runs_a_test_once_per_rank_count[P{p}]"


@pytest.mark.ranks(3)
class TestTheMarkerOnAClass:
    def test_applies_to_the_tests_that_use_device_ids(self, device_ids):
        assert device_ids == [0, 1, 2]

    def test_leaves_the_others_alone(self, request):
        assert not hasattr(request.node, "callspec")

    @pytest.mark.ranks(2)
    def test_the_closest_marker_wins(self, device_ids):
        assert device_ids == [0, 1]


def test_device_ids_is_two_devices_without_the_marker(device_ids):
    assert device_ids == [0, 1]


@pytest.mark.ranks(3)
def test_check_takes_the_tests_devices_when_no_config_is_given(device_ids):
    report = ptodist.testing.check(shift, _rows(3))
    assert report.world == 3 and not report.clean


def test_a_host_function_needs_its_devices_outside_a_device_ids_test():
    with pytest.raises(TypeError, match=r"ptodist.testing.check\(shift, \.\.\.\): pass config=RunConfig\("):
        ptodist.testing.check(shift, _rows(2))
    with pytest.raises(TypeError, match=r"takes a @pl.jit.host function, a @pl.program class or a compiled"):
        ptodist.testing.check(shift_kernel, _rows(2), config=_cfg([0, 1]))
    with pytest.raises(TypeError, match=r"expects a RunConfig or a DistributedConfig, got list"):
        ptodist.testing.check(shift, _rows(2), config=[0, 1])
    with pytest.raises(ValueError, match=r"schedules=0\): must be an integer of at least 1"):
        ptodist.testing.check(shift, _rows(2), config=_cfg([0, 1]), schedules=0)


def test_the_plugin_points_ptodist_outputs_at_the_tests_tmp_path(tmp_path):
    assert os.environ["PTODIST_OUTPUT_ROOT"] == str(tmp_path / "build_output")


# -- the report ------------------------------------------------------------------------------------------

def test_the_report_lists_each_finding_and_a_replay_that_names_this_test(request):
    report = ptodist.testing.check(shift, _rows(3), config=DistributedConfig(device_ids=[0, 1, 2]), seed=5)
    assert report.seed == 5 and report.seeds == [5] and report.policy == "delay rank 0" and report.schedules == 8
    assert all(isinstance(f, Finding) for f in report.findings)
    assert report.replay == f"PTODIST_CHECK_SEED=5 {shlex.quote(sys.executable)} -m pytest {shlex.quote(request.node.nodeid)}"
    text = report.render()
    assert text.startswith("ptodist check of shift: schedule 1/8 (seed 5, delay rank 0): 1 finding(s) (3 ranks)\n")
    for f in report.findings:
        assert f.render() in text
        assert f"[{f.kind}] ranks {', '.join(map(str, f.ranks))}" in text
        assert "  at " + ", ".join(f.locations) in text and f"  fix: {f.fix}" in text
    assert text.endswith(f"\nReplay exactly: {report.replay}")


def test_the_replay_seed_replays_the_schedule(monkeypatch):
    x = _rows(3)
    first = ptodist.testing.check(shift, x, config=_cfg(range(3)), seed=2)
    in_code = ptodist.testing.check(shift, x, config=_cfg(range(3)), seed=first.seed, schedules=1)
    monkeypatch.setenv("PTODIST_CHECK_SEED", str(first.seed))
    by_env = ptodist.testing.check(shift, x, config=_cfg(range(3)))  # what the replay command does
    for again in (in_code, by_env):
        assert again.seeds == [first.seed] and again.policy == first.policy
        assert [f.to_json() for f in again.findings] == [f.to_json() for f in first.findings]
    monkeypatch.setenv("PTODIST_CHECK_SEED", "soon")
    with pytest.raises(ValueError, match=r"PTODIST_CHECK_SEED='soon': the schedule seed to replay must be an integer"):
        ptodist.testing.check(shift, x, config=_cfg(range(3)))


def test_the_replay_goes_to_pytests_root_directory_first(request, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = ptodist.testing.check(shift, _rows(3), config=_cfg(range(3)))
    assert report.replay == (f"cd {shlex.quote(str(request.config.rootpath))} && PTODIST_CHECK_SEED=0 "
                             f"{shlex.quote(sys.executable)} -m pytest {shlex.quote(request.node.nodeid)}")


def test_outside_pytest_the_replay_is_a_call():
    from ptodist import testing

    saved = testing._current
    testing._set_current_test(None)
    try:
        report = testing.check(shift, _rows(3), config=_cfg(range(3)), seed=1)
    finally:
        testing._set_current_test(saved)
    assert report.replay == "ptodist.testing.check(shift, ..., seed=1, schedules=1)"


# -- what check runs and what it reports ---------------------------------------------------------------------

def _gather_sum(w) -> None:
    """Correct: stage, a full barrier, then sum every rank's row."""
    pl.store(pl.load(w.x, [0, 0], [1, N]), [0, 0], w.data)
    for peer in range(w.n):
        pld.system.notify(w.sig, peer, [w.me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for src in range(w.n):
        pld.system.wait(w.sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)
    acc = pl.full([1, N], dtype=pl.FP32, value=0.0)
    for peer in range(w.n):
        acc = pl.add(acc, pld.tile.remote_load(w.data, peer, [0, 0], [1, N]))
    pl.store(acc, [0, 0], w.y)


def _wait_first(w) -> None:
    for src in range(w.n):
        if src != w.me:
            pld.system.wait(w.sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)  # @wait_first
    for peer in range(w.n):
        if peer != w.me:
            pld.system.notify(w.sig, peer, [w.me, 0], 1, op=pld.NotifyOp.AtomicAdd)


def _fails_on_rank_1(w) -> None:
    if w.me == 1:
        raise ValueError("rank 1 cannot go on")  # @raise


def test_a_clean_program_runs_every_schedule_and_returns_its_result():
    x = _rows(3)
    y = np.full_like(x, -1)
    compiled = ir.compile(window_program(3, _gather_sum), distributed_config=DistributedConfig(device_ids=[0, 1, 2]))
    report = ptodist.testing.check(compiled, x, y)
    assert report.clean and report.findings == [] and report.seed is None and report.replay == ""
    assert report.seeds == list(range(8)) and report.world == 3 and report.dispatches == 1
    report.assert_clean()
    assert report.render() == "ptodist check of P: no findings in 8 schedule(s) (seeds 0..7; 3 ranks)"
    np.testing.assert_array_equal(report.result, np.broadcast_to(x.sum(0, keepdims=True), x.shape))
    np.testing.assert_array_equal(y, -1)  # the arguments are left alone: every schedule ran on copies
    np.testing.assert_array_equal(x, _rows(3))


def test_check_takes_a_host_function_a_pl_program_and_a_compiled_program(device_ids):
    x = _rows(2)
    prog = window_program(2, _gather_sum)
    for target, config in ((prog, None), (prog, DistributedConfig(device_ids=[0, 1])),
                           (ir.compile(prog, distributed_config=DistributedConfig(device_ids=[0, 1])), None),
                           (shift.compile(x, config=_cfg([0, 1])), _cfg([0, 1])), (shift, None)):
        report = ptodist.testing.check(target, x, config=config, schedules=3)
        assert report.clean and report.seeds == [0, 1, 2] and report.world == 2, report.render()


def test_a_deadlock_is_a_hang_finding():
    compiled = ir.compile(window_program(3, _wait_first), distributed_config=DistributedConfig(device_ids=[0, 1, 2]))
    report = ptodist.testing.check(compiled, _rows(3), seed=5)
    assert [f.kind for f in report.findings] == ["hang"] and report.seeds == [5]
    f = report.findings[0]
    assert f.ranks == [0, 1, 2] and f.locations == [_line("wait_first")]
    assert f.message.startswith("deadlock: every unfinished rank is blocked in a wait")
    with pytest.raises(AssertionError, match=r"\[hang\] ranks 0, 1, 2"):
        report.assert_clean()


def test_a_kernel_error_is_a_rank_error_finding():
    compiled = ir.compile(window_program(2, _fails_on_rank_1), distributed_config=DistributedConfig(device_ids=[0, 1]))
    report = ptodist.testing.check(compiled, _rows(2))
    assert [f.kind for f in report.findings] == ["rank_error"] and report.seeds == [0]
    f = report.findings[0]
    assert f.ranks == [1] and _line("raise") in f.locations and "ValueError: rank 1 cannot go on" in f.message


def test_an_error_found_before_the_ranks_start_is_a_finding():
    report = ptodist.testing.check(shift, np.zeros((3, 1, N + 1), np.float32), config=_cfg([0, 1, 2]))
    assert [f.kind for f in report.findings] == ["shape_mismatch"], report.render()
    assert report.seeds == [0] and report.dispatches == 0


def test_check_writes_nothing_outside_the_tests_output_root(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    report = ptodist.testing.check(shift, _rows(2), config=_cfg([0, 1]), schedules=2)
    assert report.clean
    assert list(cwd.iterdir()) == []
    plans = list((tmp_path / "build_output").glob("shift_*/dispatch_plan.json"))
    assert len(plans) == 1


# -- under pytest, in a subprocess ---------------------------------------------------------------------------

def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PTODIST_", "PYTEST_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ beside the tests either
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_example_test_file_passes_under_pytest(tmp_path):
    cwd, base = tmp_path / "cwd", tmp_path / "basetemp"
    cwd.mkdir()
    before = _files(EXAMPLE_DIR)
    run = _pytest(["-q", "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning", f"--basetemp={base}",
                   str(EXAMPLE_DIR)], cwd)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 passed" in run.stdout and "warning" not in run.stdout.lower(), run.stdout
    assert list(cwd.iterdir()) == []  # nothing in the current directory (no build_output/) ...
    assert _files(EXAMPLE_DIR) == before  # ... nor beside the tests
    plans = sorted(base.rglob("dispatch_plan.json"))  # the plans went under each test's tmp_path
    assert len(plans) == 6 and all(p.parent.parent.name == "build_output" for p in plans), plans


BUGGY_TEST = '''
import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
import ptodist.testing
from ptodist import DistributedConfig, RunConfig

N = 8
NR = pl.dynamic("NR")


@pl.jit.incore
def shift_kernel(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                 ready: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    left, right = (me + n - 1) % n, (me + 1) % 2  # BUG: % 2, written and tried at two ranks
    data = pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)
    pld.system.notify(ready, left, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.wait(ready, [0, 0], 1, cmp=pld.WaitCmp.Ge)
    return pl.store(pld.tile.remote_load(data, right, [0, 0], [1, N]), [0, 0], y)  # PULL


@pl.jit
def shift_chip(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
               data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
               ready: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    return shift_kernel(x, y, data, ready)


@pl.jit.host
def shift(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
    ready_buf = pld.alloc_window_buffer([1, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        shift_chip(x[r], y[r], pld.window(data_buf, [1, N], dtype=pl.FP32),
                   pld.window(ready_buf, [1, 1], dtype=pl.INT32), device=r)
    return y


@pytest.mark.ranks(2, 3)
def test_shift_is_clean(device_ids):
    x = np.arange(len(device_ids) * N, dtype=np.float32).reshape(-1, 1, N)
    config = RunConfig(distributed_config=DistributedConfig(device_ids=device_ids))
    ptodist.testing.check(shift, x, config=config, schedules=3).assert_clean()
'''


def test_a_wrong_peer_bug_fails_its_test_at_three_ranks_with_the_findings_and_the_replay_replays_it(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    test = tmp_path / "test_shift.py"
    test.write_text(BUGGY_TEST)
    pull = next(i for i, t in enumerate(BUGGY_TEST.splitlines(), 1) if t.endswith("# PULL"))
    run = _pytest(["-q", f"--basetemp={tmp_path / 'basetemp'}", test.name], tmp_path)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "1 failed, 1 passed" in out and "FAILED test_shift.py::test_shift_is_clean[P3]" in out, out
    assert "AssertionError: ptodist check of shift: schedule 1/3 (seed 0, random): 1 finding(s) (3 ranks)" in out
    assert "[race] ranks 0, 1, 2" in out and f"test_shift.py:{pull}" in out and "fix: Order the two accesses" in out
    replay = f"PTODIST_CHECK_SEED=0 {shlex.quote(sys.executable)} -m pytest 'test_shift.py::test_shift_is_clean[P3]'"
    assert f"Replay exactly: {replay}" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basetemp", "pytest.ini", "test_shift.py"]
    # The replay line runs as printed (it names this interpreter), and fails the same way on one schedule.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PTODIST_", "PYTEST_"))}
    again = subprocess.run(["bash", "-c", f"{replay} -p no:cacheprovider --basetemp={tmp_path / 'basetemp2'}"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "1 failed in" in again.stdout, again.stdout + again.stderr
    assert "schedule 1/1 (seed 0, random): 1 finding(s) (3 ranks)" in again.stdout
    finding = re.search(r"E +(\[race\].*?)\nE +Replay exactly", out, re.S).group(1)
    assert finding in again.stdout


BAD_MARKERS = '''
import pytest


@pytest.mark.ranks(2, 3)
def test_without_the_fixture():
    pass
'''


def test_the_ranks_marker_says_what_is_wrong_with_it(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_no_fixture.py").write_text(BAD_MARKERS)
    (tmp_path / "test_bad_counts.py").write_text(BAD_MARKERS.replace("ranks(2, 3)", "ranks(0, 'x')")
                                                 .replace("()", "(device_ids)"))
    run = _pytest(["-q", f"--basetemp={tmp_path / 'basetemp'}"], tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert ("@pytest.mark.ranks on test_no_fixture.py::test_without_the_fixture: the test does not use the "
            "device_ids fixture the marker sets; add a device_ids parameter") in run.stdout, run.stdout
    assert ("@pytest.mark.ranks on test_bad_counts.py::test_without_the_fixture: takes rank counts, positive "
            "integers (e.g. @pytest.mark.ranks(2, 3, 4)), got ranks(0, 'x')") in run.stdout, run.stdout


def test_docs_testing_md_shows_the_example_file_as_it_is():
    doc = (REPO / "docs" / "testing.md").read_text()
    example = (EXAMPLE_DIR / "test_my_kernels.py").read_text()
    assert f"```python\n{example}```" in doc
