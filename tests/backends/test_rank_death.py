"""Where a rank was when it died without reporting, and where every rank was when the user pressed Ctrl-C.

A rank that calls ``os._exit`` or dies of a native crash cannot report; the report names the rank's own last
Python line (its faulthandler record), not the host's call.  Ctrl-C prints each rank's state as a hang report
does.  Each test runs a complete program in a subprocess (``ptodist run``, ``python``, ``mpirun``) and compares
the exact lines a user sees; nothing waits on time: a blocked program says so on its output first.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import child_env, on_every_rank
from test_mpi import _leftovers, _mpirun, needs_mpi

import ptodist.language as pl
from ptodist import DistributedConfig, RankError, RunConfig
from ptodist.check import findings

SAFETY_S = 60

# The end of each program below: kernel k on every rank of a 2-rank dispatch, with a signal window.
DISPATCH = '''

@pl.jit
def per_rank(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    k(sig)  # @kernel


@pl.jit.host
def host(x: pl.Tensor[[NR, 1], pl.FP32]):
    buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        per_rank(pld.window(buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


host(np.zeros((2, 1), np.float32), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
print("UNREACHED")
'''

DYING = '''
import ctypes
import os
import signal
import sys

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

NR = pl.dynamic("NR")
MODE = sys.argv[1]


def crash():
    ctypes.string_at(0)  # @null


@pl.jit.incore
def k(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(sig))
    pld.system.notify(sig, 0, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @notify
    if me == 0:
        pld.system.wait(sig, [1, 0], 2, cmp=pld.WaitCmp.Ge)  # a second notify rank 1 never sends
    elif MODE == "exit":
        os._exit(3)  # @exit
    elif MODE == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)  # @segv
    elif MODE == "null":
        crash()  # @crash
''' + DISPATCH



def _at(script: Path, marker: str) -> str:
    """``FILE:LINE`` of the line of ``script`` that holds ``# @marker``."""
    lines = script.read_text().splitlines()
    return f"{script}:{next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f'# @{marker}'))}"


def _report(err: str, first: str, last: str) -> list[str]:
    """The lines of ``err`` from the one starting with ``first`` to the one starting with ``last``."""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith(last))
    return lines[start:end + 1]


def _dying_script(tmp_path: Path) -> Path:
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    return script


def _expected(script: Path, mode: str, how: str, communication: str) -> list[str]:
    """The report of rank 1's death in ``mode`` (``how``: the death as the backend tells it)."""
    s = str(script)
    line = _at(script, {"exit": "exit", "segv": "segv", "null": "null"}[mode])
    where = "crash" if mode == "null" else "kernel 'k'"
    head = (f"ptodist: RankError: rank 1 (device 1) failed in task 'k': RankDied: the rank process {how} at {line} "
            f"in {where} (its last Python line)")
    if mode == "exit":
        head += ", which ends a process at once"
    stack = [f'  File "{s}", line {_at(script, "kernel").rsplit(":", 1)[1]}, in per_rank',
             f'  File "{s}", line {line.rsplit(":", 1)[1]}, in k']
    if mode == "null":
        stack[-1] = f'  File "{s}", line {_at(script, "crash").rsplit(":", 1)[1]}, in k'
        stack.append(f'  File "{s}", line {line.rsplit(":", 1)[1]}, in crash')
        stack.append(f'  File "{ctypes.__file__}", line {_string_at_line()}, in string_at')
    died = "called os._exit(3)" if mode == "exit" else "died (Segmentation fault)"
    if mode == "exit":
        fix = (f"  fix: Remove the os._exit call at {line}: it ends the rank's process before the rank can report, so "
               "the dispatch fails without a result or a traceback. Return from the kernel instead, or raise an "
               "exception (the dispatch then fails with its traceback).")
    else:
        fix = (f"  fix: A native crash (Segmentation fault) in the call at {line}: check what that line hands to "
               "native code (an address or a buffer given to ctypes, a C extension's arguments, an array's size or "
               "lifetime); the Python stack shows how the rank got there.")
    return [f"{head}, without reporting a result{communication}",
            "--- traceback of rank 1 ---",
            f"Python stack when the rank {died} (faulthandler's dump, most recent call last):",
            *stack, fix]


def _string_at_line() -> int:
    """The line of ctypes.string_at that reads the memory (where a null address faults)."""
    lines, first = inspect.getsourcelines(ctypes.string_at)
    return first + next(i for i, text in enumerate(lines) if "return _string_at(" in text)


def _shm_lines(err: str) -> list[str]:
    """The report of ``ptodist run`` on shm, without the lines that depend on nothing this file tests."""
    lines = _report(err, "ptodist: RankError", "  fix:")
    return [line for line in lines if not line.startswith(("  raised by ", "ptodist: finding ", "  at "))]


@pytest.mark.parametrize("mode, how", [("exit", "called os._exit(3)"),
                                       ("segv", "was killed by signal 11 (SIGSEGV)"),
                                       ("null", "was killed by signal 11 (SIGSEGV)")])
def test_a_rank_that_dies_without_reporting_is_named_at_its_own_line_on_shm(mode, how, tmp_path):
    script = _dying_script(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ptodist", "run", str(script), mode], cwd=tmp_path,
                          env=child_env(PTODIST_BACKEND="shm"), capture_output=True, text=True, timeout=SAFETY_S)
    assert proc.returncode == 1 and "UNREACHED" not in proc.stdout, proc.stderr
    assert _shm_lines(proc.stderr) == _expected(
        script, mode, how, f"; its last communication was pld.system.notify at {_at(script, 'notify')}")
    line = _at(script, "null" if mode == "null" else mode)
    assert f"ptodist: finding rank_died on ranks 1\n  at {line}, {_at(script, 'notify')}" in proc.stderr
    # The finding's lines are the program's: ctypes' own line, where the null address faults, is not one.
    (at,) = [text for text in proc.stderr.splitlines() if text.startswith("  at ")]
    assert all(loc.startswith(str(script)) for loc in at[len("  at "):].split(", ")), at


@needs_mpi
@pytest.mark.parametrize("mode", ["exit", "segv"])
def test_a_rank_process_that_dies_without_reporting_is_named_at_its_own_line_on_mpi(mode, tmp_path):
    # Rank 0 waits for a notify rank 1 never sends; rank 1's process ends without Python. Rank 0 reads the
    # record rank 1's process left (both hold it open) and names rank 1's line.
    script = _dying_script(tmp_path)
    proc = _mpirun(2, [sys.executable, "-m", "ptodist", "run", str(script), mode], timeout=120)
    assert proc.returncode != 0 and "UNREACHED" not in proc.stdout
    how = "called os._exit(3)" if mode == "exit" else "vanished (Segmentation fault)"
    lines = _report(proc.stderr, "ptodist: RankError", "  fix:")
    assert [line for line in lines if not line.startswith(("ptodist: finding ", "  at "))] == \
        _expected(script, mode, how, "")
    assert "ptodist: the process of rank 1 (device 1) ended during the run; rank 0 (device 0) ends the MPI job " \
           "with MPI_Abort." in proc.stderr
    assert not _leftovers(str(script)), _leftovers(str(script))


# -- in-process: the worker's path, and nothing left behind ----------------------------------------------------------

NR = pl.dynamic("NR")


def _exit_on_rank_one(x: pl.Tensor[[1, 4], pl.FP32], r: pl.Scalar[pl.INT32]):
    if r.value == 1:
        os._exit(5)  # @worker_exit


exit_kernel = pl.jit.incore(_exit_on_rank_one)


exit_host = on_every_rank(exit_kernel, name="exit_host")


def _records_open() -> list[str]:
    """This process's open descriptors that are rank death records."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "ptodist-rank" in target:
            found.append(target)
    return found


def test_a_worker_rank_that_calls_os_exit_is_named_at_its_line_and_leaves_no_record_open():
    cfg = RunConfig(backend="shm", distributed_config=DistributedConfig(device_ids=[0, 1]))
    here = Path(__file__)
    line = f"{here}:{_at(here, 'worker_exit').rsplit(':', 1)[1]}"
    compiled = exit_host.compile(config=cfg)
    from ptodist import shared_array

    with compiled.prepare() as rt:
        with pytest.raises(RankError) as info:
            rt(shared_array((2, 1, 4)))
    assert str(info.value).splitlines()[0] == (
        f"rank 1 (device 1) failed in task '_exit_on_rank_one': RankDied: the rank process called os._exit(5) at "
        f"{line} in kernel '_exit_on_rank_one' (its last Python line), which ends a process at once, without "
        "reporting a result")
    (f,) = findings.from_exception(info.value)
    assert f.kind == "rank_died" and f.locations[0] == line and f.fix.startswith(f"Remove the os._exit call at {line}")
    # A one-shot call too; then every record file is closed (they are anonymous: nothing on disk to delete).
    with pytest.raises(RankError):
        exit_host(np.zeros((2, 1, 4), np.float32), config=cfg)
    assert _records_open() == []


# -- Ctrl-C ---------------------------------------------------------------------------------------------------------

STUCK = '''
import os
import sys
import threading

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, context
from ptodist.rank.status import WAITING

NR = pl.dynamic("NR")
never_r, never_w = os.pipe()  # nothing is ever written: a read of never_r blocks for good


def say_when_waiting(row) -> None:
    """A thread of rank 0's process: write "waiting" once the rank's status row says it waits."""
    while row["state"] != WAITING:
        threading.Event().wait(0.001)
    os.write(1, b"waiting\\n")


@pl.jit.incore
def k(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(sig))
    if me == 0:
        ctx = context.current()
        threading.Thread(target=say_when_waiting, args=(ctx.memory.status.rows[ctx.rank],), daemon=True).start()
        pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)  # @wait
    else:
        os.write(1, b"reading\\n") and os.read(never_r, 1)  # @read
''' + DISPATCH



def _interrupt_when_blocked(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``argv``, send SIGINT once rank 0 waits and rank 1 reads a pipe nobody writes; its status, stderr."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env(PTODIST_BACKEND="shm", PTODIST_HANG_TIMEOUT=600))
    try:
        out, fd = b"", proc.stdout.fileno()
        while b"waiting\n" not in out or b"reading\n" not in out:
            ready, _, _ = select.select([fd], [], [], SAFETY_S)
            chunk = os.read(fd, 4096) if ready else b""
            assert chunk, f"the program ended, or wrote nothing for {SAFETY_S} s: {out!r}"
            out += chunk
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=SAFETY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert b"UNREACHED" not in out + rest
    return proc.returncode, re.sub(r"waiting \d+\.\d+ s", "waiting # s", err.decode())


def _where(script: Path) -> list[str]:
    return ["where each rank was when the run was interrupted:",
            f"  rank 0 (device 0): blocked at {_at(script, 'wait')} in kernel 'k': pld.system.wait on 'sig' "
            "(buffer 'buf') cell [1, 0] holds 0, needs >= 1 (waiting # s)",
            "      received no notify",
            f"  rank 1 (device 1): running task 'k' at {_at(script, 'read')} in k (busy, not in a wait)"]


def test_ctrl_c_during_ptodist_run_says_where_each_rank_was(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    code, err = _interrupt_when_blocked([sys.executable, "-m", "ptodist", "run", str(script)], tmp_path)
    assert code == 130, err
    assert err.splitlines()[-5:] == [f"ptodist: {line}" if i == 0 else line
                                     for i, line in enumerate(_where(script))] + ["ptodist: interrupted"]


def test_ctrl_c_during_a_plain_python_script_says_where_each_rank_was_under_its_traceback(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    code, err = _interrupt_when_blocked([sys.executable, str(script)], tmp_path)
    assert code == -signal.SIGINT, err
    lines = err.splitlines()
    assert lines[-5:] == ["KeyboardInterrupt", *_where(script)] if sys.version_info >= (3, 11) else \
        lines[-1] == "KeyboardInterrupt"
