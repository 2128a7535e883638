"""One-shot calls on shm reuse their program's rank group: forking a torch-sized driver per call costs tens of ms.

What reuse must not change: every call's result; a failure, a hang or an interrupt in one call does not
reach the next (the group is closed, the next call forks afresh); and no rank process, shared-memory
segment or mapping outlives the program, its idle time, a failed call, or the driver process.
Nothing sleeps to let things settle; waits for an event have a deadline and assert on the event.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import children, gone, on_every_rank

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, RankError, RunConfig, ir
from ptodist.backends import shm

NR = pl.dynamic("NR")
OK, FAIL, HANG, INTERRUPT = 0.0, 1.0, 2.0, 3.0


def cfg(nr: int = 2, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend="shm", **kw)


@pl.jit.incore
def step_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]],
                sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    """y = 2 x + 1, unless x[0, 0] asks this rank to fail, hang or interrupt the driver."""
    me = pld.rank(pld.get_comm_ctx(sig))
    mode = float(pl.read(x, [0, 0]))
    if mode == FAIL and me == 1:
        raise ValueError("asked to fail")
    if mode == HANG and me == 0:
        pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)  # nobody notifies: a certain hang
    if mode == INTERRUPT and me == 0:
        os.kill(os.getppid(), signal.SIGINT)  # Ctrl-C in the driver while this rank still runs
        pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)
    t = pl.load(x, [0, 0], [1, 4])
    pl.store(pl.add(pl.add(t, t), pl.full([1, 4], 1.0, pl.FP32)), [0, 0], y)


step = on_every_rank(step_kernel, name="step")


def inputs(mode: float, nr: int = 2, base: float = 0.0) -> np.ndarray:
    x = np.arange(nr * 4, dtype=np.float32).reshape(nr, 1, 4) + base
    x[:, 0, 0] = mode
    return x


def shm_segments() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def wait_for(condition, what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def open_files() -> set[str]:
    """What this process's descriptors name (sockets and memfds included)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


@pytest.fixture
def clean():
    shm.kept._KEPT.close_all()
    before, files = shm_segments(), open_files()
    yield
    shm.kept._KEPT.close_all()
    assert children() == [], "rank processes were left running"
    assert shm_segments() == before, "shared-memory segments were left behind"
    left = {f for f in open_files() - files if f.startswith(("socket:", "/memfd:"))}
    assert not left, f"descriptors were left open: {left}"


def test_repeated_calls_reuse_the_ranks_and_give_every_result(clean):
    compiled = step.compile(config=cfg())
    pids = None
    for i in range(5):
        x = inputs(OK, base=10.0 * i)
        y = compiled(x)
        np.testing.assert_array_equal(y, 2 * x + 1)
        if pids is None:
            pids = sorted(children())
            assert len(pids) == 2
        assert sorted(children()) == pids, "a call forked new ranks instead of reusing its program's"
    y = np.full((2, 1, 4), -1.0, np.float32)  # all parameters, outputs in place
    x = inputs(OK, base=5.0)
    compiled(x, y)
    np.testing.assert_array_equal(y, 2 * x + 1)
    assert sorted(children()) == pids


def test_a_failure_closes_the_group_and_the_next_call_runs_afresh(clean):
    compiled = step.compile(config=cfg())
    compiled(inputs(OK))
    first = sorted(children())
    with pytest.raises(RankError, match="asked to fail"):
        compiled(inputs(FAIL))
    assert children() == []
    x = inputs(OK, base=3.0)
    np.testing.assert_array_equal(compiled(x), 2 * x + 1)
    assert len(children()) == 2 and sorted(children()) != first


def test_a_hang_closes_the_group_and_the_next_call_runs_afresh(clean):
    compiled = step.compile(config=cfg(hang_timeout_s=30))
    compiled(inputs(OK))
    with pytest.raises(HangError) as info:
        compiled(inputs(HANG))
    assert info.value.certain
    assert children() == []
    x = inputs(OK, base=7.0)
    np.testing.assert_array_equal(compiled(x), 2 * x + 1)


def test_ctrl_c_during_a_reused_call_leaves_no_rank(clean):
    compiled = step.compile(config=cfg(hang_timeout_s=60))
    compiled(inputs(OK))
    assert len(children()) == 2
    y = np.full((2, 1, 4), -1.0, np.float32)
    with pytest.raises(KeyboardInterrupt):
        compiled(inputs(INTERRUPT), y)
    assert children() == []
    assert (y == -1).all(), "an interrupted call must not write its outputs"
    x = inputs(OK, base=1.0)
    np.testing.assert_array_equal(compiled(x), 2 * x + 1)


def test_the_group_goes_with_its_program_and_after_its_idle_time(clean, monkeypatch):
    compiled = ir.compile(step, config=cfg())  # a program of its own (step.compile keeps what it compiles)
    compiled(inputs(OK))
    assert len(children()) == 2
    del compiled  # collected: its ranks are stopped at once
    assert children() == []
    monkeypatch.setattr(shm.kept, "KEPT_IDLE_S", 0.05)
    kept = ir.compile(step, config=cfg())
    kept(inputs(OK))
    wait_for(lambda: children() == [], "an idle group was not closed after its idle time")
    x = inputs(OK, base=2.0)
    np.testing.assert_array_equal(kept(x), 2 * x + 1)  # and the program still runs


def test_other_world_sizes_and_programs_get_their_own_ranks(clean):
    two, three = step.compile(config=cfg(2)), step.compile(config=cfg(3))
    x2, x3 = inputs(OK, 2), inputs(OK, 3)
    np.testing.assert_array_equal(two(x2), 2 * x2 + 1)
    np.testing.assert_array_equal(three(x3), 2 * x3 + 1)
    assert len(children()) == 5
    x2 = inputs(OK, 2, base=1.0)
    np.testing.assert_array_equal(two(x2), 2 * x2 + 1)
    assert len(children()) == 5


@pl.jit.incore
def double(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    t = pl.load(x, [0, 0], [1, 4])
    pl.store(pl.add(t, t), [0, 0], y)


def test_a_kernel_called_directly_reuses_its_rank_and_its_compiled_form_prepares(clean):
    config = RunConfig(backend="shm")
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_array_equal(double(x, np.zeros((1, 4), np.float32), config=config), 2 * x)
    pids = children()
    assert len(pids) == 1
    np.testing.assert_array_equal(double(x + 1, np.zeros((1, 4), np.float32), config=config), 2 * x + 2)
    assert children() == pids, "a direct kernel call forked a new rank instead of reusing its program's"
    shared = ptodist.shared_array((1, 4))
    shared[...] = x
    with double.compile(shared, np.zeros((1, 4), np.float32), config=config).prepare() as rt:
        np.testing.assert_array_equal(rt(shared), 2 * x)


SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    from conftest import children
    from test_oneshot_reuse import step, cfg, inputs, OK
    compiled = step.compile(config=cfg())
    for _ in range(3):
        compiled(inputs(OK))
    print(*children(), flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), 9)
""")


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_kept_ranks_end_with_the_driver_process(tmp_path, how):
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120)
    assert done.returncode == (0 if how == "exit" else -signal.SIGKILL), done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stdout + done.stderr
    # At a normal exit the kept group is closed; a killed driver's ranks get the parent-death signal.
    wait_for(lambda: all(gone(p) for p in pids), "a kept rank outlived its driver process")
