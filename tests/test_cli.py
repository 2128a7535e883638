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

import pytest
from conftest import child_env

PYPTO_RING = '''
import sys

import torch

import pypto.language as pl
import pypto.language.distributed as pld
from pypto import ir
from pypto.ir import DistributedConfig as IrDistributedConfig
from pypto.ir.distributed_compiled_program import DistributedConfig
from pypto.runtime import RunConfig

SIZE = 8


def make(nr):
    @pl.program
    class Ring:
        @pl.function(type=pl.FunctionType.InCore)
        def step(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)
            for p in pl.range(n):
                pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for p in pl.range(n):
                pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)
            got = pld.tile.remote_load(data, (me - 1 + n) % n, [0, 0], [1, SIZE])
            return pl.store(got, [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.step(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            dbuf = pld.alloc_window_buffer(SIZE * pl.FP32.get_byte())
            sbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                d = pld.window(dbuf, [1, SIZE], dtype=pl.FP32)
                s = pld.window(sbuf, [nr, 1], dtype=pl.INT32)
                self.chip(x[r], y[r], d, s, device=r)
            return y

    return Ring


def main():
    assert IrDistributedConfig is DistributedConfig
    print("argv", sys.argv[1:])
    nr = int(sys.argv[1])
    cfg = RunConfig(platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(nr))))
    compiled = ir.compile(make(nr), platform=cfg.platform, distributed_config=cfg.distributed_config)
    x = torch.arange(nr * SIZE, dtype=torch.float32).reshape(nr, 1, SIZE)
    y = compiled(x)
    assert torch.equal(y, torch.roll(x, 1, 0)), (x, y)
    print("rows", [int(v) for v in y[:, 0, 0]])
    print("OK")


if __name__ == "__main__":
    main()
'''

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


def assert_no_internal_frames(text: str) -> None:
    frames = re.findall(r'File "([^"]+)"', text)
    internal = [f for f in frames if "/ptodist/" in f or "runpy" in f]
    assert not internal, f"ptodist-internal frames in the output: {internal}\n{text}"


def test_pypto_script_runs_unmodified_and_gets_its_argv(tmp_path):
    script = write(tmp_path, "ring.py", PYPTO_RING)
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
    assert err.startswith("Traceback (most recent call last):\n")
    assert f'File "{script}", line 5, in <module>' in err
    assert f'File "{script}", line 3, in check' in err
    assert err.rstrip().endswith("AssertionError: golden mismatch")
    assert_no_internal_frames(err)


def test_error_raised_inside_ptodist_keeps_its_frames_below_the_script(tmp_path):
    script = write(tmp_path, "misuse.py", """
        import numpy as np
        import pypto.language as pl

        pl.add(pl.full([2], 1.0, pl.FP32), np.zeros(2))
    """)
    proc = ptodist_run(script, cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    frames = re.findall(r'File "([^"]+)"', err)
    assert frames[0] == str(script)  # nothing of `ptodist run` above the script
    assert any(f.endswith("tile_ops.py") for f in frames)  # where it was raised, in case it is a bug
    assert not any(f.endswith("cli.py") or "runpy" in f for f in frames)
    assert err.rstrip().endswith("TypeError: tile operand must be a Tile or a scalar, got ndarray")


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
    assert json.loads(report.read_text()) == {"status": "error", "signal": name, "findings": []}
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
    assert json.loads(report.read_text()) == {"status": "error", "findings": []}


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
