"""Ctrl-C on the sim backend: a rank that spins, polls or sleeps stops, on every path, as on shm.

Each test runs a real ``ptodist run`` / ``ptodist check`` in a subprocess, waits until rank 0's kernel
has started (it writes a line the test reads), sends SIGINT and asserts how the command ended. The
timeouts are safety nets only: a command that does not end fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys

import pytest
from conftest import child_env

SAFETY_S = 30

SCRIPT = '''
import os
import sys
import time

import numpy as np

import pypto.language as pl
import pypto.language.distributed as pld
from pypto.ir import DistributedConfig
from pypto.runtime import RunConfig

NR = pl.dynamic("NR")
MODE = sys.argv[1]
never_r, never_w = os.pipe()  # nothing is ever written: a read of never_r blocks for good


@pl.jit.incore
def stuck(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    if pld.rank(pld.get_comm_ctx(sig)) != 0:
        pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)  # a signal no one sends
        return
    os.write(1, b"started\\n")  # one write, past ptodist's [rank r] prefixes and ptodist check's capture
    if MODE == "spin":
        while True:
            pass
    elif MODE == "poll":
        while pl.read(sig, [1, 0]) == 0:
            pass
    elif MODE == "sleep":
        time.sleep(600)
    elif MODE == "swallow":  # catches ptodist's stop and blocks in a C call: the driver cannot wait for it
        try:
            while True:
                pass
        except BaseException:
            os.write(1, b"stopping\\n")
            os.read(never_r, 1)


@pl.jit
def per_rank(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    stuck(sig)


@pl.jit.host
def host(x: pl.Tensor[[NR, 1], pl.FP32]):
    buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        per_rank(pld.window(buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


cfg = RunConfig(backend="sim", distributed_config=DistributedConfig(device_ids=[0, 1]))
if sys.argv[2] == "worker":
    from ptodist import shared_array

    x = shared_array((2, 1))
    with host.compile(x, config=cfg).prepare() as rt:
        rt(x)
else:
    host(np.zeros((2, 1), np.float32), config=cfg)
print("UNREACHED")
'''


class _Command:
    """``python -m ptodist ARGS`` in a subprocess, its stdout read line by line with a safety timeout."""

    def __init__(self, *args: str, cwd):
        self.proc = subprocess.Popen([sys.executable, "-m", "ptodist", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=cwd, env=child_env(PTODIST_HANG_TIMEOUT=600))
        self.out = b""

    def wait_for(self, line: str) -> None:
        """Read stdout until ``line`` (the kernel wrote it: it runs now)."""
        fd = self.proc.stdout.fileno()
        want = line.encode() + b"\n"
        while want not in self.out:
            ready, _, _ = select.select([fd], [], [], SAFETY_S)
            chunk = os.read(fd, 4096) if ready else b""
            assert chunk, f"the command ended, or wrote nothing for {SAFETY_S} s, before {line!r}: {self.out!r}"
            self.out += chunk

    def wait_for_or_end(self, line: str) -> bool:
        """Read stdout until ``line`` (True) or until the command ends without it (False)."""
        fd = self.proc.stdout.fileno()
        want = line.encode() + b"\n"
        while want not in self.out:
            ready, _, _ = select.select([fd], [], [], SAFETY_S)
            assert ready, f"the command wrote nothing for {SAFETY_S} s before {line!r}: {self.out!r}"
            chunk = os.read(fd, 4096)
            if not chunk:
                return False
            self.out += chunk
        return True

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def end(self) -> tuple[int, str, str]:
        """Wait for the command to end (a safety timeout kills it): its exit status, stdout and stderr."""
        try:
            out, err = self.proc.communicate(timeout=SAFETY_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"still running {SAFETY_S} s after Ctrl-C; stderr: {err.decode()}")
        return self.proc.returncode, (self.out + out).decode(), err.decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def command(tmp_path):
    """Start ``ptodist CMD [--flags] script.py MODE PATH`` (``CMD`` first); kill it if a test leaves it running."""
    script = tmp_path / "stuck.py"
    script.write_text(SCRIPT)
    started = []

    def start(cmd: str, mode: str, path: str = "one-shot") -> _Command:
        c = _Command(cmd, str(script), mode, path, cwd=tmp_path)
        started.append(c)
        return c

    yield start
    for c in started:
        c.close()


def _assert_interrupted(rc: int, out: str, err: str) -> None:
    assert rc == 130, err
    assert err.splitlines()[-1] == "ptodist: interrupted", err
    assert err.count("ptodist: interrupted") == 1, err
    # Where each rank was, as a hang report says it: rank 1 blocked in its wait, above the last line.
    assert "ptodist: where each rank was when the run was interrupted:" in err, err
    assert re.search(r"\n  rank 1 \(device 1\): blocked at .*stuck\.py:\d+ in kernel 'stuck': pld\.system\.wait on 'sig' "
                     r"\(buffer 'buf'\) cell \[1, 0\] holds 0, needs >= 1 \(waiting \d+\.\d+ s\)\n", err), err
    assert "Traceback" not in err and "UNREACHED" not in out, err


@pytest.mark.parametrize("cmd, mode, path", [
    ("run", "spin", "one-shot"), ("run", "poll", "one-shot"), ("run", "sleep", "one-shot"),
    ("run", "spin", "worker"), ("run", "sleep", "worker"),
    ("check", "spin", "one-shot"), ("check", "sleep", "one-shot"), ("check", "spin", "worker"),
])
def test_ctrl_c_stops_a_sim_rank_that_never_reaches_an_operation(command, cmd, mode, path):
    c = command(cmd, mode, path)
    c.wait_for("started")
    c.interrupt()
    _assert_interrupted(*c.end())


@pytest.mark.parametrize("cmd", ["run", "check"])
def test_a_second_ctrl_c_while_a_rank_does_not_stop_ends_the_command_with_the_same_message(command, cmd):
    c = command(cmd, "swallow")
    c.wait_for("started")
    c.interrupt()
    # The kernel catches the stop and blocks: the driver waits a moment for it, then leaves it. The second
    # Ctrl-C lands in that moment when the kernel got to say so first; on a loaded machine the driver may
    # already have left (the kernel's thread never ran). Either way the command ends as one Ctrl-C ends it.
    if c.wait_for_or_end("stopping"):
        c.interrupt()
    _assert_interrupted(*c.end())


def test_check_stopped_by_ctrl_c_runs_no_further_schedule_and_reports_the_signal(tmp_path):
    report = tmp_path / "report.json"
    script = tmp_path / "stuck.py"
    script.write_text(SCRIPT)
    c = _Command("check", "--schedules", "50", "--report-json", str(report), str(script), "spin", "one-shot",
                 cwd=tmp_path)
    try:
        c.wait_for("started")
        c.interrupt()
        rc, out, err = c.end()
    finally:
        c.close()
    _assert_interrupted(rc, out, err)
    assert out.count("started") == 1
    assert "schedule" not in err  # no schedule ended: none has a line
    assert json.loads(report.read_text()) == {"status": "error", "signal": "SIGINT", "findings": [], "seed": 0,
                                              "policy": None, "replay": None, "schedule": None}
