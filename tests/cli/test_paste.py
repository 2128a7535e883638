"""What a user pastes works: printed commands run as printed, ``pypto`` imports under pytest, reports read whole.

* The commands ptodist prints to replay or fix something (``ptodist check``'s replay, ``ptodist run``'s fix for a
  wrong golden, ``ptodist.testing``'s pytest replay) name the interpreter that ran by its path and quote every
  word: pasted into a bare shell (``env -i``, no virtual environment, a folder with a space) they reproduce the
  same finding.
* Regions outlined from ``pl.at`` blocks are named by their line in tracebacks.
* Under ``mpirun``, an error every process raises is reported by one process; the others print one line that
  points at it, and no line of one process is glued to another's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ptodist.language as pl
from ptodist import RunConfig, commands
from ptodist.errors import RankError

# Two ranks; each pulls the other's row with no barrier after staging its own: a race on every schedule.
RACY = '''\
import sys
import numpy as np
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

N = 8


@pl.jit.incore
def shift(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
          data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
    ctx = pld.get_comm_ctx(data)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    data = pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)
    got = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, N])  # PULL: no barrier before it
    return pl.store(got, [0, 0], y)


@pl.jit
def chip(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
         data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
    return shift(x, y, data)


@pl.jit.host
def host(x: pl.Tensor[[2, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[2, 1, N], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        chip(x[r], y[r], pld.window(buf, [1, N], dtype=pl.FP32), device=r)


assert sys.argv[1:] == ["an arg", "it's"], sys.argv  # arguments with a space and a quote survive the paste
x = np.arange(2 * N, dtype=np.float32).reshape(2, 1, N)
y = host(x, np.zeros_like(x), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
assert (y == x[::-1]).all(), "golden mismatch"
'''

ARGS = ["an arg", "it's"]


def _bare_shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``command`` as a person pastes it into a fresh shell: no virtual environment, no ptodist variables."""
    return subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", command], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PTODIST_", "PYTEST_"))}
    env["PTODIST_OUTPUT_ROOT"] = str(tmp_path / "build_output")
    return env


@pytest.fixture
def racy(tmp_path) -> Path:
    where = tmp_path / "my project"  # a folder with a space, as a user's may be
    where.mkdir()
    (where / "racy.py").write_text(RACY)
    return where


def _findings(report: Path) -> list:
    return [(f["kind"], f["ranks"], f["locations"]) for f in json.loads(report.read_text())["findings"]]


def test_check_prints_a_replay_that_runs_pasted_into_a_bare_shell(racy, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ptodist", "check", "--schedules", "2", "--report-json",
                           str(tmp_path / "first.json"), "racy.py", *ARGS], cwd=racy, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    replay = proc.stderr.splitlines()[-1].removeprefix("Replay exactly: ")
    # The interpreter's own ptodist, by its path; every word quoted for the shell.
    assert replay == shlex.join([*commands.ptodist_argv(), "check", "--seed", "0", "--schedules", "1", "racy.py",
                                 *ARGS]), proc.stderr
    assert Path(shlex.split(replay)[0]).is_absolute()
    assert json.loads((tmp_path / "first.json").read_text())["replay"] == replay
    report = f" check --report-json {shlex.quote(str(tmp_path / 'again.json'))} "
    again = _bare_shell(replay.replace(" check ", report, 1), racy)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "ptodist check: schedule 1/1 (seed 0" in again.stderr, again.stderr
    assert _findings(tmp_path / "again.json") == _findings(tmp_path / "first.json")
    assert _findings(tmp_path / "again.json")[0][0] == "race"


def test_runs_fix_for_a_wrong_golden_is_a_check_command_that_runs_pasted(racy, tmp_path):
    # On shm the race usually gives the right numbers; make the golden wrong so that the script fails for sure.
    (racy / "racy.py").write_text(RACY.replace("(y == x[::-1])", "(y == -1)"))
    proc = subprocess.run([sys.executable, "-m", "ptodist", "run", "racy.py", *ARGS], cwd=racy,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    command = re.search(r"does not look for: `(.*)` runs the script under many schedules", proc.stderr).group(1)
    assert command == shlex.join([*commands.ptodist_argv(), "check", "racy.py", *ARGS])
    report = tmp_path / "check.json"
    pasted = _bare_shell(command.replace(" check ", f" check --report-json {shlex.quote(str(report))} ", 1), racy)
    assert pasted.returncode == 1, pasted.stderr
    assert _findings(report)[0][0] == "race", pasted.stderr


RACY_TEST = RACY.split("\n\nassert sys.argv")[0] + '''


def test_shift():
    import ptodist.testing
    x = np.arange(2 * N, dtype=np.float32).reshape(2, 1, N)
    ptodist.testing.check(host, x, config=DistributedConfig(device_ids=[0, 1]), schedules=2).assert_clean()
'''


def test_a_failing_tests_replay_runs_pasted_into_a_bare_shell(racy, tmp_path):
    (racy / "pytest.ini").write_text("[pytest]\n")
    (racy / "test_racy.py").write_text(RACY_TEST)
    base = ["-p", "no:cacheprovider", "-q"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *base, f"--basetemp={tmp_path / 'b1'}", "test_racy.py"],
                          cwd=racy, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    replay = re.search(r"Replay exactly: (.*)", proc.stdout).group(1)
    assert replay == f"PTODIST_CHECK_SEED=0 {shlex.quote(sys.executable)} -m pytest test_racy.py::test_shift"
    again = _bare_shell(f"{replay} {shlex.join([*base, '--basetemp=' + str(tmp_path / 'b2')])}", racy)
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout + again.stderr
    assert "schedule 1/1 (seed 0, random): 1 finding(s) (2 ranks)" in again.stdout, again.stdout
    assert re.search(r"E +\[race\] ranks 0, 1", again.stdout), again.stdout


# -- regions named by their line ---------------------------------------------------------------------------

@pl.jit
def _region_with_a_subscript_assignment(x: pl.Tensor, y: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):  # REGION
        y[0:2] = pl.load(x, [0, 0], [5, 8])  # out of bounds: x has 2 rows
    return y


def test_a_region_is_named_by_its_line_in_the_traceback():
    lines = Path(__file__).read_text().splitlines()
    region = next(i for i, text in enumerate(lines, 1) if text.endswith("# REGION"))
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(RankError) as info:
        _region_with_a_subscript_assignment(x, np.zeros_like(x), config=RunConfig(backend="sim"))
    assert f'File "{__file__}", line {region + 1}, in __pl_region_L{region}\n' in str(info.value), str(info.value)


# -- pypto imports ------------------------------------------------------------------------------------------

PYPTO_TEST = '''\
import numpy as np
import pypto.language as pl
from pypto.runtime import RunConfig
from conftest import TWICE


@pl.jit
def double(x: pl.Tensor[[2, 8], pl.FP32], y: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        pl.store(pl.mul(pl.load(x, [0, 0], [2, 8]), TWICE), [0, 0], y)
    return y


def test_double():
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    y = double(x, np.zeros_like(x), config=RunConfig(backend="sim"))
    np.testing.assert_array_equal(y, 2 * x)
'''


def _pytest_in(where: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=where, env=env,
                          capture_output=True, text=True, timeout=300)


def test_pypto_imports_work_in_tests_and_conftests_under_plain_pytest(tmp_path):
    where = tmp_path / "my tests"
    where.mkdir()
    (where / "pytest.ini").write_text("[pytest]\n")
    (where / "conftest.py").write_text("import pypto.language.distributed as pld\n\nTWICE = 2.0\n")
    (where / "test_pypto.py").write_text(PYPTO_TEST)
    run = _pytest_in(where, env=_env(tmp_path))
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
    off = _pytest_in(where, "-p", "no:ptodist", env=_env(tmp_path))  # the plugin off: no alias
    assert off.returncode != 0 and "No module named 'pypto'" in off.stdout + off.stderr, off.stdout + off.stderr


def test_a_real_pypto_is_never_shadowed_by_the_plugin(tmp_path):
    real = tmp_path / "site" / "pypto"
    (real / "language").mkdir(parents=True)
    (real / "__init__.py").write_text("")
    (real / "language" / "__init__.py").write_text("WHOSE = 'the real PyPTO'\n")
    where = tmp_path / "tests"
    where.mkdir()
    (where / "test_real.py").write_text("import pypto.language as pl\n\n\ndef test_real():\n"
                                        "    assert pl.WHOSE == 'the real PyPTO'\n")
    run = _pytest_in(where, env={**_env(tmp_path), "PYTHONPATH": str(real.parent)})
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr


def test_a_plain_script_importing_pypto_fails_with_pythons_error_and_runs_under_ptodist_run(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import pypto.language as pl\nprint('FP32 is', pl.FP32)\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1
    assert plain.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'pypto'"
    for how in (commands.ptodist_argv(), [sys.executable, "-m", "ptodist"]):  # as the README says
        run = subprocess.run([*how, "run", str(script)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout == "FP32 is pl.FP32\n", run.stdout + run.stderr
    installed = tmp_path / "installed.py"
    installed.write_text("import ptodist.compat\nptodist.compat.install()\n" + script.read_text())
    run = subprocess.run([sys.executable, str(installed)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == "FP32 is pl.FP32\n", run.stdout + run.stderr


# -- one report under mpirun --------------------------------------------------------------------------------

def _mpi():
    """test_mpi's launcher helpers, imported only where a test needs them."""
    import test_mpi

    if test_mpi.MPIRUN is None or not test_mpi.HAVE_MPI4PY:
        pytest.skip("needs an MPI launcher and mpi4py (see tests/backends/test_mpi.py)")
    return test_mpi


@pytest.mark.parametrize("how, n", [("python", 3), ("ptodist run", 2)])
def test_under_mpirun_one_process_prints_the_report_and_the_others_point_at_it(how, n, tmp_path):
    mpi = _mpi()
    script = tmp_path / "faulty.py"
    script.write_text(mpi.FAULTY)
    launch = [sys.executable] if how == "python" else [sys.executable, "-m", "ptodist", "run"]
    proc = mpi._mpirun(n, [*launch, str(script), "error", str(n), str(tmp_path)])
    assert proc.returncode != 0
    err = proc.stderr
    lines = err.splitlines()
    head = "RankError: rank 1 (device 1) failed in task 'k': KernelIndexError: pl.load at"
    # One report: the error's message and its rank's traceback, once.
    assert sum(head in line for line in lines) == 1, err
    assert err.count("--- traceback of rank 1 ---") == 1, err
    if how == "python":
        assert sum(line == "Traceback (most recent call last):" for line in lines) == 2, err  # the job's, the rank's
        assert next(i for i, line in enumerate(lines) if head in line) > 0
    else:
        assert any(line.startswith(f"ptodist: {head}") for line in lines), err
        assert sum(line == "ptodist: finding out_of_bounds on ranks 1" for line in lines) == 1, err
    # Every other process: one whole line that points at it.
    for r in range(n):
        pointer = (f"ptodist: rank {r}: RankError, raised alike in every process of the MPI job: see the report "
                   "printed by rank 0")
        want = 0 if r == 0 else 1
        assert lines.count(pointer) == want and err.count(pointer) == want, err
    # Every process did raise it (each wrote what it raised).
    assert all((tmp_path / f"report-{r}.txt").read_text().startswith(head) for r in range(n))


# -- a kernel called from plain Python, as docs/language.md says ------------------------------------------------

@pl.jit.incore
def _triple(x: pl.Tensor[[2, 8], pl.FP32], y: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    return pl.store(pl.mul(pl.load(x, [0, 0], [2, 8]), 3.0), [0, 0], y)


@pl.jit
def _double(x: pl.Tensor, y: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        pl.store(pl.mul(pl.load(x, [0, 0], [2, 8]), 2.0), [0, 0], y)
    return y


def test_a_kernel_or_per_device_function_called_from_plain_python_runs_as_the_language_table_says(backend):
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_array_equal(_triple(x, np.zeros_like(x), config=RunConfig(backend=backend)), 3 * x)
    np.testing.assert_array_equal(_double(x, np.zeros_like(x), config=RunConfig(backend=backend)), 2 * x)
    # The call table and the single-device section of docs/language.md say the same.
    text = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text()
    table = text[text.index("| Called function ↓ / caller →"):].split("\n\n")[0].splitlines()[2:]
    plain = {cells[0]: cells[3] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in table)}
    for row in ("kernel", "per-device (`@pl.jit`)"):
        assert plain[row].startswith("compile (for `config=`, else the default `RunConfig()`) and run once as a "
                                     "one-device program"), plain[row]
    assert "A `@pl.jit` function (or a `@pl.jit.incore` kernel) called from plain Python\nruns as a program of one " \
           "device" in text
