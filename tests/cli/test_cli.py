"""``ptodist run SCRIPT ARGS``: PyPTO scripts run unmodified, errors are reported without ptodist's frames.

Each test starts ``python -m ptodist run`` in a subprocess on a script written
into ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import PACKAGE_DIR, PROGRAMS, child_env, on_every_rank

import ptodist
import ptodist.language as pl
from ptodist import ConfigError, DistributedConfig, RunConfig, cli, commands, ir
from ptodist.errors import DispatchTypeError

FAILING_RANK = '''
import numpy as np

import pypto.language as pl
import pypto.language.distributed as pld
from pypto.ir.distributed_compiled_program import DistributedConfig
from pypto.runtime import RunConfig

NR = pl.dynamic("NR")


@pl.jit.incore
def shift(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], r: pl.Scalar[pl.INT32]):
    t = pl.load(x, [0, r], [1, 8])  # MARK-LOAD
    return pl.store(t, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], r: pl.Scalar[pl.INT32]):
    return shift(x, y, r)


@pl.jit.host
def host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        per_rank(x[r], y[r], r, device=r)


host(np.zeros((2, 1, 8), np.float32), config=RunConfig(distributed_config=DistributedConfig(device_ids=[4, 9])))  # MARK-CALL
print("UNREACHED")
'''

STATIC_ERROR = '''
import numpy as np

import pypto.language as pl
import pypto.language.distributed as pld
from pypto.runtime import RunConfig
from pypto.ir import DistributedConfig

NR = pl.dynamic("NR")


@pl.jit
def per_rank(r: pl.Scalar[pl.INT32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
    pass


@pl.jit.host
def host(y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        per_rank(r, y[r], device=r)


host(np.zeros((2, 1, 8), np.float32), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
'''


BLOCKED = '''
import os
import sys

import numpy as np

import pypto.language as pl
import pypto.language.distributed as pld
from pypto.ir import DistributedConfig
from pypto.runtime import RunConfig

NR = pl.dynamic("NR")
never_r, never_w = os.pipe()  # nothing is ever written: a read of never_r blocks for good


@pl.jit.incore
def stuck(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    os.write(1, f"rank-pid {os.getpid()}\\n".encode())  # one write: the ranks' lines never interleave
    if pld.rank(pld.get_comm_ctx(sig)) == 0:
        os.read(never_r, 1)                                # rank 0 blocks outside ptodist ...
    else:
        pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)  # ... rank 1 on a signal no one sends


@pl.jit
def per_rank(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    stuck(sig)


@pl.jit.host
def host(x: pl.Tensor[[NR, 1], pl.FP32]):
    buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        per_rank(pld.window(buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]))
if sys.argv[1:] == ["worker"]:
    from ptodist import shared_array

    x = shared_array((2, 1))
    with host.compile(x, config=cfg).prepare() as rt:
        rt(x)
else:
    host(np.zeros((2, 1), np.float32), config=cfg)
print("UNREACHED")
'''


def ptodist_run(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ptodist", "run", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=child_env(), timeout=timeout)


def write(tmp_path, name: str, source: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def line_with(path, marker: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(marker)


def text_lines(text: str) -> list[str]:
    """The lines of ``text`` less the lines of carets under a traceback's source lines (Python 3.11 on)."""
    return [line for line in text.splitlines() if not re.fullmatch(r"\s+[\^~]+\s*", line)]


def assert_no_internal_frames(text: str) -> None:
    frames = re.findall(r'File "([^"]+)"', text)
    internal = [f for f in frames if f.startswith(PACKAGE_DIR) or "runpy" in f]
    assert not internal, f"ptodist-internal frames in the output: {internal}\n{text}"


def test_pypto_script_runs_unmodified_and_gets_its_argv(tmp_path):
    script = write(tmp_path, "ring.py", (PROGRAMS / "pypto_ring.py").read_text())
    proc = ptodist_run(script, 3, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "argv ['3']"
    assert "rows [16, 0, 8]" in lines
    assert lines[-1] == "OK"
    assert "ptodist: platform 'a2a3sim' runs on the local 'shm' backend (no NPU needed)" in proc.stderr
    assert proc.stderr.count("runs on the local") == 1  # said once


def test_argv_is_passed_through_including_options(tmp_path):
    script = write(tmp_path, "args.py", """
        import sys
        print(repr(sys.argv))
        print(__name__)
    """)
    proc = ptodist_run(script, "-d", "0,1", "--flag", "x y", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    argv_line, name_line = proc.stdout.splitlines()
    assert eval(argv_line) == [str(script), "-d", "0,1", "--flag", "x y"]
    assert name_line == "__main__"


def test_script_directory_is_importable(tmp_path):
    write(tmp_path, "helper_mod.py", "VALUE = 41\n")
    script = write(tmp_path, "uses_helper.py", "import helper_mod\nprint(helper_mod.VALUE + 1)\n")
    proc = ptodist_run(script, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"


def test_failing_rank_exits_nonzero_with_rank_and_line(tmp_path):
    script = write(tmp_path, "fails.py", FAILING_RANK)
    proc = ptodist_run(script, cwd=tmp_path)
    assert proc.returncode == 1
    assert "UNREACHED" not in proc.stdout
    err = proc.stderr
    line = line_with(script, "MARK-LOAD")
    # Rank 0 loads [0, 8) and succeeds; rank 1 (device 9) reads past the end.
    assert "ptodist: RankError: rank 1 (device 9) failed in task 'shift': KernelIndexError: " in err
    assert f"pl.load at {script}:{line}: out of bounds on tensor 'x[1]' [1, 8] FP32: offsets [0, 1] with shape " \
           "[1, 8] reach [1, 9) in dimension 1, whose bounds are [0, 8)." in err
    assert f'File "{script}", line {line}, in shift' in err  # the user's own frame is shown
    assert "rank 0" not in err
    # The driver-side line of the script that started the run is named last.
    call = line_with(script, "MARK-CALL")
    lines = err.rstrip().splitlines()
    assert any(x.startswith(f"  raised by {script}:{call} in <module>: host(np.zeros(") for x in lines)
    # Then the finding: its kind, the rank, the root-cause line first.
    assert "ptodist: finding out_of_bounds on ranks 1" in lines
    assert lines[lines.index("ptodist: finding out_of_bounds on ranks 1") + 1].startswith(f"  at {script}:{line}")
    assert_no_internal_frames(err)


def test_static_error_exits_nonzero_with_function_and_parameter(tmp_path):
    script = write(tmp_path, "static.py", STATIC_ERROR)
    proc = ptodist_run(script, cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert re.search(rf"^ptodist: TaskArgsError: TaskArgs: cannot add tensor after scalar: in orchestration "
                     rf"'per_rank' \({re.escape(str(script))}:\d+\), tensor parameter 'y' comes after scalar "
                     r"parameter 'r'\.", err, re.M), err
    assert "Traceback" not in err
    assert_no_internal_frames(err)


def test_config_error_names_the_script_line(tmp_path):
    script = write(tmp_path, "config.py", """
        from pypto.ir import DistributedConfig

        def main():
            return DistributedConfig(device_ids=[0, 0])

        main()
    """)
    proc = ptodist_run(script, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "ptodist: ConfigError: DistributedConfig(device_ids=[0, 0]): device ids must be distinct; [0] appear more "
        "than once",
        f"  raised by {script}:5 in main: return DistributedConfig(device_ids=[0, 0])",
        "ptodist: finding invalid_argument",
        f"  at {script}:5",
        "  fix: Correct the argument named in the message.",
    ]


def test_script_exception_shows_only_the_scripts_frames(tmp_path):
    script = write(tmp_path, "golden.py", """
        def check():
            assert 1 == 2, "golden mismatch"

        check()
    """)
    proc = ptodist_run(script, cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert text_lines(err) == [
        "Traceback (most recent call last):",
        f'  File "{script}", line 5, in <module>',
        "    check()",
        f'  File "{script}", line 3, in check',
        '    assert 1 == 2, "golden mismatch"',
        "AssertionError: golden mismatch",
        # the script's own error, not an invalid argument; nothing was dispatched, so no word about races
        "ptodist: finding script_error",
        f"  at {script}:3, {script}:5",
        "  fix: The script's own code raised this before it dispatched anything: see its traceback.",
    ]
    assert_no_internal_frames(err)


def test_a_language_error_names_the_script_line_without_ptodist_frames(tmp_path):
    script = write(tmp_path, "misuse.py", """
        import numpy as np
        import pypto.language as pl

        pl.add(pl.full([2], 1.0, pl.FP32), np.zeros(2))
    """)
    proc = ptodist_run(script, cwd=tmp_path)
    assert proc.returncode == 1
    assert text_lines(proc.stderr) == [
        "ptodist: TileTypeError: pl.add: tile operand must be a Tile or a scalar, got ndarray; load tensors into "
        "tiles with pl.load first",
        f"  raised by {script}:5 in <module>: pl.add(pl.full([2], 1.0, pl.FP32), np.zeros(2))",
        "ptodist: finding invalid_argument",
        f"  at {script}:5",
        "  fix: Load tensors into tiles with pl.load first.",  # the message's own fix, not a generic one
    ]
    assert_no_internal_frames(proc.stderr)


def test_missing_script_exits_2(tmp_path):
    missing = tmp_path / "nope.py"
    proc = ptodist_run(missing)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ptodist run: no such script: {missing}"
    assert proc.stdout == ""


@pytest.mark.parametrize("body, code, stderr", [
    ("import sys; sys.exit(3)", 3, ""),
    ("import sys; sys.exit(0)", 0, ""),
    ("import sys; sys.exit()", 0, ""),
    ("import sys; sys.exit('fatal: bad input')", 1, "fatal: bad input\n"),
])
def test_script_exit_status_is_kept(tmp_path, body, code, stderr):
    script = write(tmp_path, "exits.py", body + "\n")
    proc = ptodist_run(script, cwd=tmp_path)
    assert proc.returncode == code
    assert proc.stderr == stderr


def test_no_command_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "ptodist"], capture_output=True, text=True, env=child_env(),
                          timeout=60)
    assert proc.returncode == 2
    assert "usage: ptodist" in proc.stderr


# -- SIGTERM / SIGHUP --------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    """Whether ``pid`` exists at all (a zombie counts: its parent has not reaped it)."""
    return os.path.exists(f"/proc/{pid}")


def _shm_of(pids: list[int]) -> set[str]:
    """Entries of /dev/shm named after one of ``pids`` (torch names them torch_<pid>_...)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {n for n in os.listdir("/dev/shm") if any(f"_{pid}_" in n for pid in pids)}


@pytest.mark.parametrize("sig, mode", [(signal.SIGTERM, "one-shot"), (signal.SIGHUP, "one-shot"),
                                       (signal.SIGTERM, "worker")])
def test_termination_signal_stops_the_ranks_and_writes_the_report(tmp_path, sig, mode):
    script = write(tmp_path, "blocked.py", BLOCKED)
    report = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "ptodist", "run", "--report-json", str(report), str(script),
                             *(["worker"] if mode == "worker" else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=child_env(PTODIST_HANG_TIMEOUT=600))
    pids = []
    try:
        while len(pids) < 2:  # both ranks are running their kernel: rank 0 blocked, rank 1 waiting
            line = proc.stdout.readline()
            assert line, f"ptodist run ended early: {proc.stderr.read()}"
            if line.startswith("rank-pid "):
                pids.append(int(line.split()[1]))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err
    assert f"ptodist: terminated by {name}" in err.splitlines(), err
    assert "Traceback" not in err and "UNREACHED" not in out
    doc = json.loads(report.read_text())
    assert list(doc) == REPORT_KEYS[:1] + ["signal"] + REPORT_KEYS[1:]
    assert _run_facts(doc, tmp_path, "host") == {
        "status": "error", "signal": name, "exit_status": 128 + sig, "program": "host", "backend": "shm",
        "device_ids": [0, 1], "world_size": 2, "ptodist_version": ptodist.__version__, "findings": []}
    # ptodist killed and reaped its ranks before it exited: no orphan, not even a zombie, and nothing
    # in /dev/shm is left by it or them (the one-shot arena is an anonymous mapping, gone with them).
    assert not [p for p in pids if _alive(p)]
    assert not _shm_of([proc.pid, *pids])


def test_a_script_that_handles_sigterm_keeps_its_handler(tmp_path):
    script = write(tmp_path, "own_handler.py", """
        import signal
        import sys

        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
        print("ready", flush=True)
        while True:
            signal.pause()  # until the signal (one sent before it got here is handled before it, too)
    """)
    report = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "ptodist", "run", "--report-json", str(report), str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=child_env())
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 7 and err == ""
    doc = json.loads(report.read_text())
    assert isinstance(doc.pop("wall_time_s"), float)
    assert doc == {"status": "error", "exit_status": 7, "program": None, "backend": None, "device_ids": None,
                   "world_size": None, "output_dir": None, "programs": [], "ptodist_version": ptodist.__version__,
                   "findings": []}


def test_stop_signal_handlers_are_set_only_while_the_script_runs_and_not_in_the_ranks(tmp_path):
    script = write(tmp_path, "dispositions.py", """
        import os
        import signal

        import numpy as np

        import pypto.language as pl
        import pypto.language.distributed as pld
        from pypto.ir import DistributedConfig
        from pypto.runtime import RunConfig

        NR = pl.dynamic("NR")


        def dispositions():
            names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored"}
            return " ".join(names.get(signal.getsignal(s), "handled") for s in (signal.SIGTERM, signal.SIGHUP))


        @pl.jit.incore
        def k(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            os.write(1, f"rank {dispositions()}\\n".encode())


        @pl.jit
        def per_rank(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            k(sig)


        @pl.jit.host
        def host(x: pl.Tensor[[NR, 1], pl.FP32]):
            buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                per_rank(pld.window(buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


        print("script", dispositions(), flush=True)
        host(np.zeros((2, 1), np.float32), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
    """)
    driver = ("import signal, sys\n"
              "from ptodist import cli\n"
              "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
              "before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]\n"
              f"code = cli.main(['run', {str(script)!r}])\n"
              "print('after', [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == before)\n"
              "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, cwd=tmp_path,
                          env=child_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "script handled handled"            # the script runs under ptodist's handlers
    assert lines[1:3] == ["rank default ignored"] * 2       # the ranks get back what was there before
    assert lines[3:] == ["after True"]


# -- the --report-json document: what ran, on success too ---------------------------------------------------

REPORT_KEYS = ["status", "exit_status", "program", "backend", "device_ids", "world_size", "output_dir", "programs",
               "wall_time_s", "ptodist_version", "findings"]


def _run_facts(doc: dict, tmp_path, program: str | None) -> dict:
    """``doc`` less what varies (wall time; the output_dir's time stamp), each checked first."""
    doc = dict(doc)
    assert isinstance(doc.pop("wall_time_s"), float)
    out = doc.pop("output_dir")
    assert re.fullmatch(re.escape(str(tmp_path / "build_output" / program)) + r"_\d{8}_\d{6}_\d{6}", out), out
    assert os.path.isfile(os.path.join(out, "dispatch_plan.json"))
    every = doc.pop("programs")
    assert every == [{k: doc[k] for k in ("program", "backend")} | {"device_ids": doc["device_ids"],
                                                                   "world_size": doc["world_size"],
                                                                   "output_dir": out}]
    return doc


SUCCEEDS = '''
import numpy as np

import pypto.language as pl
import pypto.language.distributed as pld
from pypto.ir import DistributedConfig
from pypto.runtime import RunConfig

NR = pl.dynamic("NR")


@pl.jit.incore
def double(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    return pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), 2.0), [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    return double(x, y)


@pl.jit.host
def doubled(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        per_rank(x[r], y[r], device=r)


y = doubled(np.ones((2, 1, 4), np.float32), config=RunConfig(distributed_config=DistributedConfig(device_ids=[4, 7])))
assert (y == EXPECTED).all(), "golden mismatch"
print("OK")
'''


def test_report_json_names_what_ran_on_success(tmp_path):
    script = write(tmp_path, "ok.py", SUCCEEDS.replace("EXPECTED", "2"))
    report = tmp_path / "report.json"
    proc = ptodist_run("--report-json", report, script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(report.read_text())
    assert list(doc) == REPORT_KEYS
    assert _run_facts(doc, tmp_path, "doubled") == {
        "status": "ok", "exit_status": 0, "program": "doubled", "backend": "shm", "device_ids": [4, 7],
        "world_size": 2, "ptodist_version": ptodist.__version__, "findings": []}


def test_an_assertion_after_a_dispatch_is_a_script_error_that_points_at_ptodist_check(tmp_path):
    script = write(tmp_path, "wrong.py", SUCCEEDS.replace("EXPECTED", "3"))
    report = tmp_path / "report.json"
    proc = ptodist_run("--report-json", report, script, "--flag", cwd=tmp_path)
    assert proc.returncode == 1
    line = len(SUCCEEDS.splitlines()) - 1
    fix = ("The script's own code raised this, not ptodist. If it checks a dispatch's results, wrong numbers often "
           "come from a race, a stale signal or an uninitialised read, which `ptodist run` does not look for: "
           f"`{commands.ptodist('check', script, '--flag')}` runs the script under many schedules and names them.")
    assert text_lines(proc.stderr) == [
        "ptodist: platform 'a2a3sim' runs on the local 'shm' backend (no NPU needed)",
        "Traceback (most recent call last):",
        f'  File "{script}", line {line}, in <module>',
        '    assert (y == 3).all(), "golden mismatch"',
        "AssertionError: golden mismatch",
        "ptodist: finding script_error",
        f"  at {script}:{line}",
        f"  fix: {fix}",
    ]
    doc = json.loads(report.read_text())
    found = [{k: f[k] for k in ("kind", "message", "ranks", "locations", "pitfall", "fix")} for f in doc["findings"]]
    assert found == [{"kind": "script_error", "message": "AssertionError: golden mismatch", "ranks": [],
                      "locations": [f"{script}:{line}"], "pitfall": None, "fix": fix}]
    assert _run_facts(doc, tmp_path, "doubled") == {
        "status": "error", "exit_status": 1, "program": "doubled", "backend": "shm", "device_ids": [4, 7],
        "world_size": 2, "ptodist_version": ptodist.__version__, "findings": doc["findings"]}


def test_version():
    proc = subprocess.run([sys.executable, "-m", "ptodist", "--version"], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"ptodist {ptodist.__version__}\n", "")
    from importlib.metadata import version

    assert ptodist.__version__ == version("ptodist")


# -- host tensors of a dtype ptodist lacks ------------------------------------------------------------------

NR = pl.dynamic("NR")


@pl.jit.incore
def _double(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    return pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), 2.0), [0, 0], y)


_doubled = on_every_rank(_double, name="_doubled")


TORCH_DTYPES = ("torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32, torch.int64, "
                "torch.uint8, torch.bool, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, "
                "torch.float8_e5m2 and torch.float8_e8m0fnu")
NUMPY_DTYPES = ("float32, float16, bfloat16, int8, int16, int32, int64, uint8, bool, float8_e4m3fn, float8_e8m0fnu, "
                "float8_e5m2, uint16, uint32, uint64, int4, uint4 and float4_e2m1fn")


@pytest.mark.parametrize("value, message", [
    (lambda torch: torch.ones(2, 1, 4, dtype=torch.float64),
     f"host tensor 'x' has torch dtype torch.float64, which ptodist does not support (it supports {TORCH_DTYPES}). "
     "Convert it first: x.float() (float64 -> FP32; the same as x.to(torch.float32))."),
    (lambda torch: np.ones((2, 1, 4)),
     f"host tensor 'x' has numpy dtype float64, which ptodist does not support (it supports {NUMPY_DTYPES}). "
     "Convert it first: x.astype(np.float32) (float64 -> FP32)."),
    (lambda torch: torch.ones(2, 1, 4, dtype=torch.complex64),
     f"host tensor 'x' has torch dtype torch.complex64, which ptodist does not support (it supports "
     f"{TORCH_DTYPES}). Convert it first to a supported dtype, e.g. x.to(torch.float32)."),
], ids=["torch-float64", "numpy-float64", "torch-complex64"])
def test_an_unsupported_dtype_names_the_supported_ones_and_the_conversion(value, message, torch):
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]))
    with pytest.raises(DispatchTypeError) as info:
        _doubled(value(torch), config=cfg)
    assert str(info.value) == message


# -- ptodist check: a static error has no seed to replay ------------------------------------------------------

def _check_in_process(capsys, monkeypatch, tmp_path, script) -> tuple[int, list[str], dict]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    report = tmp_path / "check.json"
    capsys.readouterr()
    rc = cli.main(["check", "--report-json", str(report), str(script)])
    return rc, text_lines(capsys.readouterr().err), json.loads(report.read_text())


def test_check_prints_no_replay_seed_for_a_static_error(capsys, monkeypatch, tmp_path):
    script = write(tmp_path, "static.py", STATIC_ERROR)
    rc, err, doc = _check_in_process(capsys, monkeypatch, tmp_path, script)
    assert rc == 1
    assert err[0] == "ptodist check: schedule 1/8 (seed 0): 1 finding(s)"
    assert err[1].startswith("[task_args_order]")
    assert err[-1] == ("ptodist check: this error was found before the ranks of its dispatch ran (a static "
                       "check); it does not depend on the schedule, so there is no seed to replay.")
    assert not any(line.startswith("Replay exactly") for line in err)
    assert doc["replay"] is None and doc["status"] == "findings"


def test_check_a_script_that_fails_before_any_dispatch_has_no_seed_to_replay(capsys, monkeypatch, tmp_path):
    script = write(tmp_path, "early.py", "assert False, 'bad input'\n")
    rc, err, doc = _check_in_process(capsys, monkeypatch, tmp_path, script)
    assert rc == 1
    assert err == [
        "ptodist check: schedule 1/8 (seed 0): 1 finding(s)",
        "Traceback (most recent call last):",
        f'  File "{script}", line 1, in <module>',
        "    assert False, 'bad input'",
        "AssertionError: bad input",
        "[script_error]",
        "  AssertionError: bad input",
        f"  at {script}:1",
        "  fix: The script's own code raised this before it dispatched anything: see its traceback.",
        "ptodist check: the script failed before any rank ran; it does not depend on the schedule, so there is no "
        "seed to replay.",
    ]
    assert doc["replay"] is None and doc["findings"][0]["kind"] == "script_error"


def test_check_a_wrong_golden_after_clean_dispatches_keeps_its_replay_seed(capsys, monkeypatch, tmp_path):
    script = write(tmp_path, "wrong.py", SUCCEEDS.replace("EXPECTED", "3"))
    rc, err, doc = _check_in_process(capsys, monkeypatch, tmp_path, script)
    assert rc == 1
    assert err[-1] == f"Replay exactly: {commands.ptodist('check', '--seed', 0, '--schedules', 1, script)}"
    assert doc["replay"] == commands.ptodist("check", "--seed", 0, "--schedules", 1, script)
    assert err[-5:-1] == [
        "[script_error]", "  AssertionError: golden mismatch", f"  at {script}:{len(SUCCEEDS.splitlines()) - 1}",
        "  fix: The script's own code raised this, not ptodist, and the dispatches before it had no findings in "
        "this schedule. If it checks their results, look at the kernels' arithmetic and offsets, or try more "
        "schedules (--schedules N)."]


# -- build_output: the newest runs of each program, nothing else touched ----------------------------------------

def _stamped(root, name: str, n: int) -> list[str]:
    """Make ``n`` output directories of program ``name`` as ptodist names them, oldest first."""
    names = [f"{name}_20240101_0000{i // 60:02d}_{i % 60:06d}" for i in range(n)]
    for d in names:
        (root / d).mkdir(parents=True)
    return names


def _compile_and_touch(config=None):
    # ir.compile makes a new program (and directory) each time; _doubled.compile gives back the one it keeps
    compiled = ir.compile(_doubled, config=config or RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
    return compiled.output_dir


def test_default_output_dirs_keep_the_newest_twenty_per_program(tmp_path):
    root = tmp_path / "build_output"
    old = _stamped(root, "_doubled", 25)
    others = _stamped(root, "other", 3) + ["_doubled_notes", "_doubled_20240101_000000_000000_extra",
                                            "x_doubled_20240101_000000_000001"]
    for d in others[3:]:
        (root / d).mkdir()
    (root / "_doubled_20230101_000000_000000").write_text("a file, not ptodist's directory")
    current = _compile_and_touch()
    assert current.parent == root
    kept = sorted(p.name for p in root.iterdir())
    assert kept == sorted([*old[-19:], current.name, *others, "_doubled_20230101_000000_000000"])


def test_keep_outputs_setting(tmp_path, monkeypatch):
    root = tmp_path / "build_output"
    old = _stamped(root, "_doubled", 5)
    monkeypatch.setenv("PTODIST_KEEP_OUTPUTS", "2")
    current = _compile_and_touch()
    assert sorted(p.name for p in root.iterdir()) == [old[-1], current.name]
    monkeypatch.setenv("PTODIST_KEEP_OUTPUTS", "0")  # 0: keep every one
    _stamped(root, "_doubled", 3)
    before = sorted(p.name for p in root.iterdir())
    again = _compile_and_touch()
    assert sorted(p.name for p in root.iterdir()) == sorted([*before, again.name])
    monkeypatch.setenv("PTODIST_KEEP_OUTPUTS", "-1")
    with pytest.raises(ConfigError) as info:
        _compile_and_touch()
    assert str(info.value) == ("PTODIST_KEEP_OUTPUTS='-1': must be a whole number >= 0: how many of a program's "
                               "newest output directories to keep (default 20; 0 keeps them all)")


def test_a_given_output_dir_is_never_pruned(tmp_path, monkeypatch):
    root = tmp_path / "build_output"
    old = _stamped(root, "_doubled", 4)
    monkeypatch.setenv("PTODIST_KEEP_OUTPUTS", "1")
    mine = root / "_doubled_20250101_000000_000000"
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), output_dir=str(mine))
    assert _compile_and_touch(cfg) == mine
    assert sorted(p.name for p in root.iterdir()) == sorted([*old, mine.name])

