"""DistributedWorker: ranks started once, dispatched many times.

Covers dispatch (sync and submitted), the shared-memory rule for host tensors,
resident tensors, persistent windows, several programs on one worker, sub-worker
callbacks, failures and hangs on long-lived ranks, start-up, and hygiene: no
rank process, file or shared-memory segment outlives the worker, even when
close() is forgotten.  Tests that need a rank to block use pipes, never sleeps.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import children, on_every_rank, source_line

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, DistributedWorker, HangError, RankError, RunConfig, ir, shared_array
from ptodist.backends import shm
from ptodist.errors import ConfigError, DispatchTypeError, DispatchValueError

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[torch]'): the worker's tests "
                            "pass torch tensors, as its users do")

NR = pl.dynamic("NR")
M = pl.dynamic("M")


def cfg(nr: int = 2, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), **kw)


def own_shm() -> set[str]:
    """Entries of /dev/shm that belong to this process (torch names them torch_<pid>_...)."""
    tag = f"_{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if tag in n} if os.path.isdir("/dev/shm") else set()


@pytest.fixture
def no_leaks():
    before = own_shm()
    yield
    gc.collect()
    assert children() == [], "rank processes were left running"
    assert own_shm() <= before, "shared-memory segments were left behind"


def shared(t: torch.Tensor) -> torch.Tensor:
    return t.share_memory_()


# -- programs --------------------------------------------------------------------------------

@pl.jit.incore
def scale(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], r: pl.Scalar[pl.INT32]):
    tile = pl.load(x, [0, 0], [1, 4])
    if pl.read(x, [0, 0]).value < 0:
        raise ValueError(f"negative input on rank {r.value}")
    return pl.store(pl.add(pl.mul(tile, 2.0), pl.cast(r, target_type=pl.FP32)), [0, 0], y)


@pl.jit
def scale_rank(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], r: pl.Scalar[pl.INT32]):
    return scale(x, y, r)


@pl.jit.host
def double(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        scale_rank(x[r], y[r], r, device=r)


def expected(x):
    nr = x.shape[0]
    ranks = np.arange(nr, dtype=np.float32).reshape(nr, 1, 1)
    return np.asarray(x) * 2 + ranks


@pl.jit.incore
def shift_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    # Accumulate into the window: the result is right only if the window starts zeroed.
    pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], data, atomic=pld.AtomicType.Add)
    pld.tensor.barrier(sig)
    tile = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, 4])
    return pl.store(tile, [0, 0], y)


shift = on_every_rank(shift_kernel, name="shift")


@pl.jit.incore
def count_kernel(out: pl.Out[pl.Tensor[[M, 1], pl.INT32]], counter: pl.InOut[pld.DistributedTensor[[M, 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(counter))
    pld.system.notify(counter, me, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
    pl.write(out, [0, 0], pl.read(counter, [0, 0]))
    return out


@pl.jit
def count_rank(out: pl.Out[pl.Tensor[[M, 1], pl.INT32]], counter: pl.InOut[pld.DistributedTensor[[M, 1], pl.INT32]]):
    return count_kernel(out, counter)


@pl.jit.host
def count(out: pl.Out[pl.Tensor[[NR, M, 1], pl.INT32]]):
    """Each rank adds 1 to its own counter cell (a window) and reports the cell's value."""
    buf = pld.alloc_window_buffer([out.shape[1], 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        count_rank(out[r], pld.window(buf, [out.shape[1], 1], dtype=pl.INT32), device=r)


# -- dispatch ------------------------------------------------------------------------------------

def test_a_prepared_worker_dispatches_many_times(no_leaks):
    compiled = double.compile(config=cfg())
    x = shared(torch.ones(2, 1, 4))
    y = shared(torch.zeros(2, 1, 4))
    with compiled.prepare() as rt:
        pids = sorted(rt._core.group.pids.values())
        for i in range(5):
            x.fill_(i)
            assert rt(x, y) is y
            assert torch.equal(y, torch.from_numpy(expected(x.numpy())))
        assert sorted(rt._core.group.pids.values()) == pids, "dispatches must reuse the rank processes"
        out = rt(x)  # inputs only: the output is created in shared memory and returned
        assert out.is_shared() and torch.equal(out, y)
        assert rt.run(compiled, x, y) is y
    assert rt.closed


def test_numpy_shared_arrays_and_tensors_shared_after_prepare(no_leaks):
    compiled = double.compile(config=cfg())
    with compiled.prepare() as rt:
        x = shared_array((2, 1, 4), np.float32)
        x[...] = 3
        y = shared_array((2, 1, 4), pl.FP32)
        assert rt(x, y) is y and (y == expected(x)).all()
        assert (rt(x) == expected(x)).all()
        t = torch.full((2, 1, 4), 5.0).share_memory_()  # made after prepare()
        assert torch.equal(rt(t), torch.from_numpy(expected(t.numpy())))
        view = torch.from_numpy(shared_array((4, 1, 4), np.float32))[1:3]  # a view into shared memory
        view.fill_(1)
        assert torch.equal(rt(view), torch.from_numpy(expected(view.numpy())))


FILE_SYSTEM = textwrap.dedent("""
    import sys
    import torch
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")  # starts torch's manager: run apart
    sys.path.insert(0, sys.argv[1])
    from test_worker import cfg, double, expected

    with double.compile(config=cfg()).prepare() as rt:
        x = torch.ones(2, 1, 4).share_memory_()
        for i in range(3):
            x.fill_(i)
            assert torch.equal(rt(x), torch.from_numpy(expected(x.numpy())))
    print("ok")
""")


def test_tensors_shared_with_torchs_file_system_strategy(tmp_path):
    script = tmp_path / "file_system.py"
    script.write_text(FILE_SYSTEM)
    done = subprocess.run([sys.executable, str(script), os.path.dirname(__file__)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_private_host_tensors_are_a_type_error_naming_the_parameter_and_both_fixes(no_leaks):
    compiled = double.compile(config=cfg())
    with compiled.prepare() as rt:
        with pytest.raises(DispatchTypeError) as info:
            rt(torch.ones(2, 1, 4), shared(torch.zeros(2, 1, 4)))
        assert isinstance(info.value, TypeError)
        assert str(info.value) == (
            "double() parameter 'x': the torch tensor is not in shared memory, so the worker's rank processes "
            "cannot see it. Call x.share_memory_() on it (before or after prepare()), or copy it to the worker: "
            "rt.alloc_tensor(shape, dtype, init=x) (or rt.copy_to) and pass the DeviceTensor.")
        with pytest.raises(DispatchTypeError) as info:
            rt(shared_array((2, 1, 4)), np.zeros((2, 1, 4), np.float32))
        assert str(info.value) == (
            "double() parameter 'y': the numpy array is not in shared memory, so the worker's rank processes "
            "cannot see it. Allocate it with ptodist.shared_array(shape, dtype) and fill it in place, or copy it "
            "to the worker: rt.alloc_tensor(shape, dtype, init=array) (or rt.copy_to) and pass the DeviceTensor.")
        # The worker is still fine.
        x = shared(torch.ones(2, 1, 4))
        assert torch.equal(rt(x), torch.from_numpy(expected(x.numpy())))


def test_windows_start_zeroed_in_every_dispatch(no_leaks):
    compiled = shift.compile(config=cfg(3))
    x = shared(torch.arange(12, dtype=torch.float32).reshape(3, 1, 4))
    y = shared(torch.zeros(3, 1, 4))
    with compiled.prepare() as rt:
        for i in range(4):
            x.add_(1)
            rt(x, y)
            assert torch.equal(y, torch.roll(x, -1, 0)), f"dispatch {i}"


@pl.jit.incore
def sized(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], n: pl.Scalar[pl.INT64]):
    return pl.store(pl.add(pl.load(x, [0, 0], [1, 4]), pl.cast(n, target_type=pl.FP32)), [0, 0], y)


@pl.jit
def with_table(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], table):
    return sized(x, y, len(table))


@pl.jit.host
def big_plan(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    table = list(range(300_000))  # pickled, the plan outgrows the command frame
    for r in pl.range(pld.world_size()):
        with_table(x[r], y[r], table, device=r)


def test_a_plan_larger_than_the_command_frame(no_leaks):
    compiled = big_plan.compile(config=cfg())
    with compiled.prepare() as rt:
        assert len(rt._core.group.encode_plan(([list(range(300_000))], []))) > shm.wire.FRAME_BYTES
        for _ in range(2):
            out = rt(shared(torch.zeros(2, 1, 4)))
            assert torch.equal(out, torch.full((2, 1, 4), 300_000.0))


def test_window_heap_grows_for_larger_plans(no_leaks):
    compiled = count.compile(config=cfg())
    with compiled.prepare() as rt:
        for m in (1, 64, 2):
            out = shared(torch.zeros(2, m, 1, dtype=torch.int32))
            rt(out)
            assert out[:, 0, 0].tolist() == [1, 1]


# -- persistent windows ------------------------------------------------------------------------------

@pytest.mark.parametrize("persistent, reset, counts", [
    (False, None, [1, 1, 1]),
    (True, None, [1, 1, 1]),
    (True, True, [1, 1, 1]),
    (True, False, [1, 2, 3]),
])
def test_persistent_windows(no_leaks, persistent, reset, counts):
    compiled = count.compile(config=cfg())
    out = shared(torch.zeros(2, 4, 1, dtype=torch.int32))
    seen = []
    with compiled.prepare(persistent=persistent, reset_persistent_windows=reset) as rt:
        assert rt.persistent is persistent
        for _ in counts:
            rt(out)
            seen.append(out[:, 0, 0].tolist())
    assert seen == [[c, c] for c in counts]


def test_reset_without_persistent_is_a_value_error(no_leaks):
    compiled = count.compile(config=cfg())
    with pytest.raises(ConfigError) as info:
        compiled.prepare(reset_persistent_windows=True)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "prepare(reset_persistent_windows=True) needs persistent=True: without it windows live for one dispatch "
        "and always start zeroed. Pass persistent=True, or drop reset_persistent_windows.")


def test_a_changed_window_layout_on_a_persistent_worker_is_a_value_error(no_leaks):
    compiled = count.compile(config=cfg())
    with compiled.prepare(persistent=True) as rt:
        rt(shared(torch.zeros(2, 4, 1, dtype=torch.int32)))
        with pytest.raises(DispatchValueError) as info:
            rt(shared(torch.zeros(2, 8, 1, dtype=torch.int32)))
        assert isinstance(info.value, ValueError)
        assert str(info.value) == (
            "count: this dispatch allocates windows ['buf' 32 bytes at 0], but the worker's persistent windows "
            "were laid out as ['buf' 16 bytes at 0] by the program's first dispatch. Persistent windows keep one "
            "layout for the worker's lifetime: allocate the same window buffers (names and sizes, in the same "
            "order) on every dispatch, or prepare the worker without persistent=True.")
        out = shared(torch.zeros(2, 4, 1, dtype=torch.int32))
        rt(out)  # the first layout still works
        assert out[:, 0, 0].tolist() == [1, 1]


# -- submit ----------------------------------------------------------------------------------------

@pl.jit.incore
def gate_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], r: pl.Scalar[pl.INT32]):
    fd = int(pl.read(x, [0, 1]).value)
    if r.value == 0 and fd >= 0:
        os.read(fd, 1)  # blocks until the test writes a byte
    return pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], y)


gate = on_every_rank(gate_kernel, name="gate")


def gate_input(fd: int, tag: float) -> torch.Tensor:
    x = shared(torch.full((2, 1, 4), float(tag)))
    x[:, 0, 1] = fd
    return x


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def test_submit_runs_in_order_and_a_third_submit_waits_for_the_oldest(no_leaks, pipe):
    rfd, wfd = pipe
    compiled = gate.compile(config=cfg())
    with compiled.prepare() as rt:
        x1, x2, x3 = gate_input(rfd, 1), gate_input(-1, 2), gate_input(-1, 3)
        y1, y2, y3 = (shared(torch.zeros(2, 1, 4)) for _ in range(3))
        h1 = rt.submit(compiled, x1, y1)  # rank 0 blocks on the pipe
        h2 = rt.submit(compiled, x2, y2)
        assert not h1.done and not h2.done
        with pytest.raises(TimeoutError, match=r"dispatch 0 of 'gate' did not finish within 0.05 s; it is still "
                                               r"running: call result\(\) again to keep waiting"):
            h1.result(timeout=0.05)
        seen = {}

        def third():
            seen["h3"] = rt.submit(compiled, x3, y3)
            seen["h1 done when the third submit returned"] = h1._finished

        t = threading.Thread(target=third)
        t.start()
        os.write(wfd, b"x")  # releases the first dispatch
        t.join()
        assert seen["h1 done when the third submit returned"]
        assert h1.result() is y1 and h2.wait() is y2 and seen["h3"].result() is y3
        assert [float(y[0, 0, 0]) for y in (y1, y2, y3)] == [1, 2, 3]
        assert h1.done and h2.done


def test_close_drains_accepted_dispatches_in_order(no_leaks, pipe):
    rfd, wfd = pipe
    compiled = gate.compile(config=cfg())
    rt = compiled.prepare()
    order = []
    y1, y2 = shared(torch.zeros(2, 1, 4)), shared(torch.zeros(2, 1, 4))
    h1 = rt.submit(compiled, gate_input(rfd, 1), y1)
    h2 = rt.submit(compiled, gate_input(-1, 2), y2)
    os.write(wfd, b"x")
    rt.close()
    for h in (h1, h2):
        assert h._finished
        order.append(h.result())
    assert order == [y1, y2] and float(y2[0, 0, 0]) == 2
    rt.close()  # again: nothing happens


def test_every_call_after_close_is_a_runtime_error_naming_it(no_leaks):
    compiled = double.compile(config=cfg())
    rt = compiled.prepare()
    t = rt.alloc_tensor([2, 1, 4], torch.float32)
    rt.close()
    x = shared(torch.ones(2, 1, 4))
    calls = {
        "__call__() (rt(...))": lambda: rt(x),
        "run()": lambda: rt.run(compiled, x),
        "submit()": lambda: rt.submit(compiled, x),
        "alloc_tensor()": lambda: rt.alloc_tensor([1], torch.float32),
        "free_tensor()": lambda: rt.free_tensor(t),
        "alloc_stacked_tensor()": lambda: rt.alloc_stacked_tensor(torch.ones(2, 1)),
        "copy_to()": lambda: rt.copy_to(t, torch.ones(2, 1, 4)),
        "copy_from()": lambda: rt.copy_from(torch.ones(2, 1, 4), t),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError) as info:
            call()
        assert str(info.value) == (f"DistributedWorker.{name}: called after close(): the worker is closed. Prepare "
                                   "a new one with compiled.prepare().")
    assert t.freed


def test_every_waiter_sees_the_same_error(no_leaks):
    compiled = double.compile(config=cfg())
    with compiled.prepare() as rt:
        h = rt.submit(compiled, shared(torch.full((2, 1, 4), -1.0)), shared(torch.zeros(2, 1, 4)))
        errors = []

        def wait():
            try:
                h.result()
            except RankError as e:
                errors.append(e)

        threads = [threading.Thread(target=wait) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with pytest.raises(RankError) as info:
            h.wait()
        assert len(errors) == 3 and all(e is info.value for e in errors)
        assert h.done


# -- failures ----------------------------------------------------------------------------------------

def test_a_rank_error_is_reported_as_in_one_shot_and_the_worker_goes_on(no_leaks):
    compiled = double.compile(config=cfg())
    bad = shared(torch.full((2, 1, 4), -1.0))
    bad[0] = 1
    with pytest.raises(RankError) as one_shot:
        compiled(bad, torch.zeros(2, 1, 4))
    with compiled.prepare() as rt:
        with pytest.raises(RankError) as info:
            rt(bad, shared(torch.zeros(2, 1, 4)))
        assert str(info.value) == str(one_shot.value)
        assert (info.value.rank, info.value.device_id, info.value.task) == (1, 1, "scale")
        assert isinstance(info.value.original, ValueError)
        assert "rank 1 (device 1) failed in task 'scale': ValueError: negative input on rank 1" in str(info.value)
        assert "ptodist/runtime" not in str(info.value)
        x = shared(torch.ones(2, 1, 4))
        assert torch.equal(rt(x), torch.from_numpy(expected(x.numpy())))


@pl.jit.incore
def stuck_kernel(x: pl.Tensor[[1, 4], pl.FP32], sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
    if pl.read(x, [0, 0]).value < 0:
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)  # nobody notifies: a certain deadlock


stuck = on_every_rank(stuck_kernel, name="stuck")


def test_a_deadlock_is_a_hang_error_and_the_ranks_come_back(no_leaks):
    compiled = stuck.compile(config=cfg(hang_timeout_s=60))
    with compiled.prepare() as rt:
        with pytest.raises(HangError) as info:
            rt(shared(torch.full((2, 1, 4), -1.0)))
        assert info.value.certain
        assert [s["state"] for s in info.value.ranks] == ["waiting", "waiting"]
        assert "pld.system.wait on 'sig' (buffer 'sig_buf') cell [0, 0] holds 0, needs >= 1" in str(info.value)
        pids = sorted(rt._core.group.pids.values())
        rt(shared(torch.ones(2, 1, 4)))  # the same ranks run the next dispatch
        assert sorted(rt._core.group.pids.values()) == pids


def test_a_rank_busy_outside_ptodist_is_interrupted_after_a_hang(no_leaks, pipe):
    rfd, _ = pipe
    compiled = gate.compile(config=cfg(hang_timeout_s=0.5))
    with compiled.prepare() as rt:
        pids = sorted(rt._core.group.pids.values())
        with pytest.raises(HangError) as info:
            rt(gate_input(rfd, 1), shared(torch.zeros(2, 1, 4)))  # rank 0 reads a pipe nobody writes
        assert not info.value.certain
        assert [s["state"] for s in info.value.ranks] == ["running", "finished"]
        y = shared(torch.zeros(2, 1, 4))
        assert rt(gate_input(-1, 4), y) is y and float(y[1, 0, 0]) == 4
        assert sorted(rt._core.group.pids.values()) == pids


@pl.jit.incore
def deaf_kernel(x: pl.Tensor[[1, 4], pl.FP32], r: pl.Scalar[pl.INT32]):
    fd = int(pl.read(x, [0, 0]).value)
    if r.value == 1 and fd >= 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # deaf to the worker's interruption
        os.read(fd, 1)


deaf = on_every_rank(deaf_kernel, name="deaf")


def test_a_rank_that_does_not_stop_is_killed_and_the_caller_gets_an_answer(no_leaks, pipe):
    rfd, _ = pipe
    compiled = deaf.compile(config=cfg(hang_timeout_s=0.3))
    with compiled.prepare() as rt:
        x = shared(torch.full((2, 1, 4), float(rfd)))
        with pytest.raises(HangError):
            rt(x)
        with pytest.raises(RuntimeError) as info:
            rt(x)
        assert str(info.value) == (
            "DistributedWorker.__call__() (rt(...)): the worker cannot run more dispatches: rank(s) [1] did not stop "
            "within 2 s after the dispatch was aborted and were killed. Close it and prepare a new one.")
        assert rt._core.group.pids == {}


@pl.jit.incore
def victim_kernel(x: pl.Tensor[[1, 4], pl.FP32], r: pl.Scalar[pl.INT32]):
    pid_fd, block_fd = int(pl.read(x, [0, 0]).value), int(pl.read(x, [0, 1]).value)
    if r.value == 1 and pid_fd >= 0:
        os.write(pid_fd, f"{os.getpid()}\n".encode())
        os.read(block_fd, 1)


victim = on_every_rank(victim_kernel, name="victim")


def test_a_rank_killed_during_a_dispatch_stops_the_worker(no_leaks, pipe):
    block_r, block_w = pipe
    pid_r, pid_w = os.pipe()
    compiled = victim.compile(config=cfg())
    try:
        with compiled.prepare() as rt:
            x = shared(torch.full((2, 1, 4), -1.0))
            x[:, 0, 0], x[:, 0, 1] = pid_w, block_r
            h = rt.submit(compiled, x)
            os.kill(int(os.read(pid_r, 64).decode()), signal.SIGKILL)
            with pytest.raises(RankError) as info:
                h.result()
            assert info.value.rank == 1
            assert str(info.value) == (
                "rank 1 (device 1) failed in task 'victim_kernel': RankDied: the rank process was killed by "
                "signal 9 (SIGKILL): by the kernel's OOM killer if memory ran out (see `dmesg`), or by a `kill -9`, "
                "without reporting a result (so there is no traceback); it was running 'victim_kernel', and it "
                "had made no communication operation yet")
            with pytest.raises(RuntimeError) as info:
                rt(shared(torch.ones(2, 1, 4)))
            assert str(info.value) == (
                "DistributedWorker.__call__() (rt(...)): the worker cannot run more dispatches: rank 1 (device 1) "
                "died during a dispatch (was killed by signal 9 (SIGKILL): by the kernel's OOM killer if memory "
                "ran out (see `dmesg`), or by a `kill -9`). Close it and prepare a new one.")
    finally:
        os.close(pid_r)
        os.close(pid_w)


def test_a_rank_that_dies_while_idle_is_reported_at_the_next_dispatch(no_leaks):
    compiled = double.compile(config=cfg(3))
    x = shared(torch.ones(3, 1, 4))
    with compiled.prepare() as rt:
        rt(x)
        pid = rt._core.group.pids[2]
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
        with pytest.raises(RankError) as info:
            rt(x)
        assert str(info.value) == (
            "rank 2 (device 2) failed: RankDied: the rank process was killed by signal 9 (SIGKILL): by the kernel's "
            "OOM killer if memory ran out (see `dmesg`), or by a `kill -9`, without reporting a result (so there is "
            "no traceback), while the worker was idle between dispatches; the worker stopped its other ranks. "
            "Close it and prepare a new one.")
        with pytest.raises(RuntimeError, match=r"the worker cannot run more dispatches: rank 2 \(device 2\) died "
                                               r"while the worker was idle \(was killed by signal 9 \(SIGKILL\)"):
            rt(x)


def test_a_rank_that_does_not_come_up_in_time_ends_prepare(no_leaks, monkeypatch, pipe):
    rfd, wfd = pipe

    def slow_start(rank):
        if rank == 1:
            os.read(rfd, 1)  # never written: this rank never comes up

    monkeypatch.setattr(shm.server, "_rank_started", slow_start)
    compiled = double.compile(config=cfg())
    with pytest.raises(RankError) as info:
        compiled.prepare(startup_timeout_s=0.3)
    assert str(info.value) == (
        "rank 1 (device 1) failed: StartupTimeout: the rank process did not come up within startup_timeout_s=0.3 s "
        "of prepare(); nothing was dispatched. If starting is legitimately this slow, pass a larger "
        "startup_timeout_s to prepare()")


def test_startup_timeout_must_be_positive(no_leaks):
    compiled = double.compile(config=cfg())
    for bad in (0, -1, float("inf"), "5", True):
        with pytest.raises(ConfigError, match=r"prepare\(startup_timeout_s=.*\): must be a positive finite"):
            compiled.prepare(startup_timeout_s=bad)


# -- resident tensors -----------------------------------------------------------------------------

def test_resident_tensors_in_and_out(no_leaks):
    compiled = double.compile(config=cfg())
    with compiled.prepare() as rt:
        host_x = torch.arange(8, dtype=torch.float32).reshape(2, 1, 4)  # private memory is fine here
        x = rt.alloc_tensor((2, 1, 4), torch.float32, init=host_x)
        y = rt.alloc_tensor([2, 1, 4], pl.FP32)
        assert (x.shape, x.dtype, x.nbytes) == ((2, 1, 4), pl.FP32, 32)
        assert rt(x, y) is y
        back = torch.zeros(2, 1, 4)
        rt.copy_from(back, y)
        assert torch.equal(back, torch.from_numpy(expected(host_x.numpy())))
        rt.copy_to(x, np.full((2, 1, 4), 7, np.float32))
        out = shared(torch.zeros(2, 1, 4))
        rt(x, out)  # resident input, host output
        assert torch.equal(out, torch.from_numpy(expected(np.full((2, 1, 4), 7, np.float32))))
        rt.free_tensor(x)
        rt.free_tensor(x)  # a double free does nothing
        assert x.freed and repr(x) == "<DeviceTensor [2, 1, 4] FP32 (freed)>"
        with pytest.raises(DispatchValueError, match=r"double\(\) parameter 'x': DeviceTensor \[2, 1, 4\] FP32 was "
                                                     r"freed \(free_tensor / free_stacked_tensor\)"):
            rt(x, y)
        with pytest.raises(DispatchValueError, match=r"copy_to\(dst, src\): src has shape \[4\] but DeviceTensor "
                                                     r"\[2, 1, 4\] FP32 has \[2, 1, 4\]"):
            rt.copy_to(y, torch.zeros(4))
        with pytest.raises(DispatchTypeError, match=r"copy_from\(dst, src\): dst is FP16 but DeviceTensor"):
            rt.copy_from(torch.zeros(2, 1, 4, dtype=torch.float16), y)
        with pytest.raises(DispatchTypeError, match=r"did you mean copy_from\(dst, src\)\?"):
            rt.copy_to(torch.zeros(2, 1, 4), y)


def test_resident_tensors_of_another_worker_are_rejected(no_leaks):
    compiled = double.compile(config=cfg())
    with compiled.prepare() as a, compiled.prepare() as b:
        t = a.alloc_tensor((2, 1, 4), torch.float32)
        message = ("DeviceTensor [2, 1, 4] FP32 belongs to another DistributedWorker; a resident tensor lives in "
                   "the ranks of the worker that allocated it.")
        with pytest.raises(DispatchValueError) as info:
            b(t, shared(torch.zeros(2, 1, 4)))
        assert message in str(info.value) and isinstance(info.value, ValueError)
        with pytest.raises(DispatchValueError, match=r"free_tensor\(\): DeviceTensor \[2, 1, 4\] FP32 was "
                                                     r"allocated by another DistributedWorker"):
            b.free_tensor(t)
        with pytest.raises(DispatchValueError, match="belongs to another DistributedWorker"):
            b.copy_from(torch.zeros(2, 1, 4), t)
    with pytest.raises(DispatchTypeError, match="resident tensors live in the ranks of the DistributedWorker"):
        compiled(t, torch.zeros(2, 1, 4))  # one-shot calls take host tensors only


def test_stacked_tensors(no_leaks):
    compiled = double.compile(config=cfg(3))
    with compiled.prepare() as rt:
        host_w = torch.arange(12, dtype=torch.float32).reshape(3, 1, 4)
        w = rt.alloc_stacked_tensor(host_w)
        assert len(w) == 3 and w.shape == (3, 1, 4) and w[1].shape == (1, 4)
        out = rt.alloc_stacked_tensor(torch.zeros(3, 1, 4))
        rt(w, out)
        back = torch.zeros(3, 1, 4)
        rt.copy_stacked_from(out, back)
        assert torch.equal(back, torch.from_numpy(expected(host_w.numpy())))
        shard = np.zeros((1, 4), np.float32)
        rt.copy_from(shard, out[2])  # one shard is a DeviceTensor
        assert (shard == back[2].numpy()).all()
        with pytest.raises(DispatchValueError, match=r"free_tensor\(\): shard 0 of a StackedDeviceTensor \[1, 4\] "
                                                     r"FP32 is a shard"):
            rt.free_tensor(out[0])
        rt.free_stacked_tensor(out)
        rt.free_stacked_tensor(out)
        assert out.freed and out[0].freed
        with pytest.raises(DispatchValueError, match=r"alloc_stacked_tensor\(host\): host has shape \[2, 4\]; "
                                                     r"its first dimension must be the rank count \(3\)"):
            rt.alloc_stacked_tensor(torch.zeros(2, 4))


@pl.jit.host
def all_from_zero(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        scale_rank(x[0], y[r], r, device=r)


def test_a_stacked_tensor_gives_each_rank_its_own_shard_only(no_leaks):
    compiled = all_from_zero.compile(config=cfg())
    with compiled.prepare() as rt:
        w = rt.alloc_stacked_tensor(torch.ones(2, 1, 4))
        with pytest.raises(DispatchValueError) as info:
            rt(w, shared(torch.zeros(2, 1, 4)))
        assert str(info.value).startswith(
            "all_from_zero() parameter 'x' is a StackedDeviceTensor: shard i lives on rank i, but the dispatch to "
            "rank 1 at ")
        assert str(info.value).endswith("is given x[0]. Give each rank its own shard: x[r] in the dispatch loop.")
        # A host tensor can be read by every rank.
        assert torch.equal(rt(shared(torch.ones(2, 1, 4)))[1], torch.full((1, 4), 3.0))


def test_resident_tensor_use_waits_for_the_dispatches_that_use_it(no_leaks, pipe):
    rfd, wfd = pipe
    compiled = gate.compile(config=cfg())
    with compiled.prepare() as rt:
        y = rt.alloc_tensor((2, 1, 4), torch.float32)
        h = rt.submit(compiled, gate_input(rfd, 9), y)
        done = {}

        def read_back():
            back = torch.zeros(2, 1, 4)
            rt.copy_from(back, y)
            done["value"], done["dispatch done"] = float(back[0, 0, 0]), h._finished

        t = threading.Thread(target=read_back)
        t.start()
        os.write(wfd, b"x")
        t.join()
        assert done == {"value": 9.0, "dispatch done": True}
        rt.free_tensor(y)


# -- several programs --------------------------------------------------------------------------------

def test_several_programs_on_one_worker(no_leaks):
    a = double.compile(config=cfg())
    b = shift.compile(config=cfg())
    x = shared(torch.arange(8, dtype=torch.float32).reshape(2, 1, 4))
    with a.prepare(extra_compiled=[b]) as rt:
        assert rt.programs == [a, b]
        assert torch.equal(rt.run(a, x), torch.from_numpy(expected(x.numpy())))
        assert torch.equal(rt.run(b, x), torch.roll(x, -1, 0))
        with pytest.raises(DispatchTypeError) as info:
            rt(x)
        assert str(info.value) == ("rt(*args) is ambiguous: this worker runs 2 programs ('double', 'shift'). "
                                   "Dispatch with rt.run(compiled, *args).")
        other = stuck.compile(config=cfg())
        with pytest.raises(DispatchValueError) as info:
            rt.run(other, x)
        assert isinstance(info.value, ValueError)
        assert str(info.value) == ("DistributedWorker.run(): program 'stuck' was not registered when this worker "
                                   "was prepared (prepare() was not given it); this worker runs 'double', 'shift'. "
                                   "Register it with prepare(extra_compiled=[...]).")


def test_programs_on_one_worker_must_agree_on_devices(no_leaks):
    a = double.compile(config=cfg())
    b = shift.compile(config=RunConfig(distributed_config=DistributedConfig(device_ids=[4, 5])))
    with pytest.raises(ConfigError) as info:
        a.prepare(extra_compiled=[b])
    assert str(info.value) == ("DistributedWorker: programs must run on the same devices; 'double' is compiled for "
                               "device_ids [0, 1], 'shift' for [4, 5]. Compile them with one DistributedConfig.")


def test_worker_constructed_directly(no_leaks):
    compiled = double.compile(config=cfg())
    with DistributedWorker([compiled]) as rt:
        assert repr(rt) == "<DistributedWorker [double] (2 ranks)>"
        assert rt.world == 2 and rt.device_ids == [0, 1]
    assert repr(rt) == "<DistributedWorker [double] (closed)>"


# -- sub-worker callbacks --------------------------------------------------------------------------------

def make_inspecting():
    @pl.program
    class Inspecting:
        @pl.function(type=pl.FunctionType.InCore)
        def kernel(self, x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
            return pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), 2.0), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
            return self.kernel(x, y)

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def inspect(self, y: pl.Tensor[[NR, 1, 4], pl.FP32], step: pl.Scalar[pl.INT32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.InOut[pl.Tensor[[NR, 1, 4], pl.FP32]], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                self.chip(x[r], y[r], device=r)
            self.inspect(y, 1)
            for r in pl.range(pld.world_size()):
                self.chip(y[r], x[r], device=r)
            self.inspect(x, 2)

    return Inspecting


def test_sub_worker_callbacks_run_between_the_segments(no_leaks):
    compiled = ir.compile(make_inspecting(), distributed_config=DistributedConfig(device_ids=[0, 1]))
    seen = []

    def inspect(t, step):
        seen.append((step, t.clone()))

    x = shared(torch.ones(2, 1, 4))
    y = shared(torch.zeros(2, 1, 4))
    with compiled.prepare(callbacks={"inspect": inspect}) as rt:
        rt(x, y)
    assert [s for s, _ in seen] == [1, 2]
    assert torch.equal(seen[0][1], torch.full((2, 1, 4), 2.0))  # y after the first segment
    assert torch.equal(seen[1][1], torch.full((2, 1, 4), 4.0))  # x after the second
    plan = (compiled.output_dir / "dispatch_plan.json").read_text()
    assert '"sub_worker_calls"' in plan


def test_windows_keep_their_contents_across_the_segments_of_a_dispatch(no_leaks):
    @pl.program
    class Relay:
        @pl.function(type=pl.FunctionType.InCore)
        def put_in(self, x: pl.Tensor[[1, 4], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
            pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], data)

        @pl.function(type=pl.FunctionType.InCore)
        def take_out(self, y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], data: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
            return pl.store(pl.load(data, [0, 0], [1, 4]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def store(self, x: pl.Tensor[[1, 4], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
            self.put_in(x, data)

        @pl.function(type=pl.FunctionType.Orchestration)
        def load(self, y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], data: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
            return self.take_out(y, data)

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def between(self, x: pl.Tensor[[NR, 1, 4], pl.FP32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
            buf = pld.alloc_window_buffer([1, 4], dtype=pl.FP32)
            for r in pl.range(pld.world_size()):
                self.store(x[r], pld.window(buf, [1, 4], dtype=pl.FP32), device=r)
            self.between(x)
            for r in pl.range(pld.world_size()):
                self.load(y[r], pld.window(buf, [1, 4], dtype=pl.FP32), device=r)

    compiled = ir.compile(Relay, distributed_config=DistributedConfig(device_ids=[0, 1]))
    calls = []
    x = shared(torch.arange(8, dtype=torch.float32).reshape(2, 1, 4))
    with compiled.prepare(callbacks={"between": lambda a: calls.append(a.tensor(0) is x)}) as rt:
        for _ in range(2):
            y = rt(x)
            assert torch.equal(y, x)
    assert calls == [True, True]


def test_callback_errors_and_missing_callbacks(no_leaks):
    prog = make_inspecting()
    compiled = ir.compile(prog, distributed_config=DistributedConfig(device_ids=[0, 1]))
    with pytest.raises(ConfigError) as info:
        compiled.prepare()
    assert str(info.value) == (
        f"prepare(): sub-worker function 'inspect' ({prog.inspect.location}) has no body ('...'): it is one of the "
        "program's runtime-bound callbacks, which prepare() must be given. Bind it with "
        "prepare(callbacks={'inspect': fn}).")
    with pytest.raises(DispatchTypeError, match=r"prepare\(callbacks=...\): the callback for 'inspect' must be "
                                                r"callable, got int"):
        compiled.prepare(callbacks={"inspect": 3})
    with pytest.raises(ConfigError, match=r"prepare\(callbacks=...\): \['inspcet'\] are not sub-workers of the "
                                          r"worker's programs .*Available sub-workers: \['inspect'\]"):
        compiled.prepare(callbacks={"inspect": print, "inspcet": print})

    def failing(t, step):
        raise KeyError(f"step {step}")

    with compiled.prepare(callbacks={"inspect": failing}) as rt:
        with pytest.raises(KeyError) as err:
            rt(shared(torch.ones(2, 1, 4)), shared(torch.zeros(2, 1, 4)))
        assert err.value.__notes__ == ["raised by sub-worker callback 'inspect' (called at "
                                       f"{prog.host.file}:{source_line(prog.host, 'self.inspect(y, 1)')}) in dispatch 0 "
                                       "of 'Inspecting'"]

        def nested(t, step):
            rt(shared(torch.ones(2, 1, 4)), shared(torch.zeros(2, 1, 4)))

        rt._core.callbacks["inspect"] = nested
        with pytest.raises(RuntimeError, match=r"called from inside a sub-worker callback"):
            rt(shared(torch.ones(2, 1, 4)), shared(torch.zeros(2, 1, 4)))


def test_a_sub_worker_function_with_a_body_runs_its_body(no_leaks):
    seen = []

    @pl.program
    class Tally:
        @pl.function(type=pl.FunctionType.InCore)
        def kernel(self, x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
            return pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
            return self.kernel(x, y)

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def tally(self, y: pl.Tensor[[NR, 1, 4], pl.FP32]):
            seen.append(float(y.sum()))

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                self.chip(x[r], y[r], device=r)
            self.tally(y)

    compiled = ir.compile(Tally, distributed_config=DistributedConfig(device_ids=[0, 1]))
    with compiled.prepare() as rt:
        rt(shared(torch.ones(2, 1, 4)), shared(torch.zeros(2, 1, 4)))
        with compiled.prepare(callbacks={"tally": lambda y: seen.append(-1.0)}) as other:
            other(shared(torch.ones(2, 1, 4)), shared(torch.zeros(2, 1, 4)))
    assert seen == [8.0, -1.0]


# -- diagnostics ------------------------------------------------------------------------------------------

def test_dfx_outputs_per_dispatch(no_leaks, tmp_path):
    compiled = shift.compile(config=cfg(enable_chip_swimlane=True, output_dir=str(tmp_path / "out")))
    x = shared(torch.ones(2, 1, 4))
    with compiled.prepare() as rt:
        rt(x)
        rt(x)
    root = ptodist.dfx.latest_run(tmp_path / "out")
    for r in range(2):
        for k in range(2):
            assert (root / f"rank{r}" / f"d{k}" / "chip_swimlane_records.json").is_file()
    assert len(list(root.glob("merged_swimlane_*.json"))) >= 1


# -- hygiene ------------------------------------------------------------------------------------------

def test_a_forgotten_worker_stops_its_ranks(no_leaks):
    compiled = double.compile(config=cfg())
    rt = compiled.prepare()
    pids = list(rt._core.group.pids.values())
    rt(shared(torch.ones(2, 1, 4)))
    del rt
    gc.collect()
    assert not [p for p in pids if p in children()]


DRIVER = textwrap.dedent("""
    import sys, torch
    import ptodist.language as pl
    import ptodist.language.distributed as pld
    from ptodist import DistributedConfig, RunConfig

    @pl.jit.incore
    def k(x: pl.Tensor[[1, 4], pl.FP32]):
        pass

    @pl.jit
    def per_rank(x: pl.Tensor[[1, 4], pl.FP32]):
        k(x)

    @pl.jit.host
    def host(x: pl.Tensor[[2, 1, 4], pl.FP32]):
        for r in pl.range(pld.world_size()):
            per_rank(x[r], device=r)

    rt = host.compile(config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]))).prepare()
    rt(torch.zeros(2, 1, 4).share_memory_())
    print(*rt._core.group.pids.values(), flush=True)
    # exits without close()
""")


def test_exiting_without_close_leaves_no_rank_behind(tmp_path):
    script = tmp_path / "forgets.py"
    script.write_text(DRIVER)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _shared_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:" in line or "/dev/shm/" in line)


@pl.jit
def copy_rank(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    return pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], y)  # the per-device function itself does the work


@pl.jit.host
def copy(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank(x[r], y[r], device=r)


def test_soak_a_thousand_dispatches_leak_nothing(no_leaks):
    compiled = copy.compile(config=cfg())
    x = shared(torch.ones(2, 1, 4))
    y = shared_array((2, 1, 4))
    with compiled.prepare() as rt:
        rank_pids = list(rt._core.group.pids.values())

        def rank_fds():
            return [len(os.listdir(f"/proc/{p}/fd")) for p in rank_pids]

        def step(i):
            if i % 100 == 0:  # new memory every now and then: fresh tensors, resident alloc and free
                t = rt.alloc_tensor((2, 1, 4), torch.float32, init=torch.full((2, 1, 4), float(i)))
                assert rt(t, shared(torch.zeros(2, 1, 4)))[1, 0, 0] == i
                rt.free_tensor(t)
                rt(shared_array((2, 1, 4)), y)
            rt(x, y)

        for i in range(100):  # warm up: plans, caches, allocator pools
            step(i)
        gc.collect()
        before = (_fds(), len(children()), _shared_maps(), own_shm(), rank_fds(), _rss_kb())
        for i in range(1000):
            step(i)
        gc.collect()
        rt(x, y)  # lets the ranks drop what was freed last
        after = (_fds(), len(children()), _shared_maps(), own_shm(), rank_fds(), _rss_kb())
        assert (y == 1).all()
    assert after[:5] == before[:5], f"before {before}, after {after}"
    assert after[5] - before[5] < 4096, f"driver RSS grew by {after[5] - before[5]} kB"


