"""Reliability: ranks that run without communicating are hangs, with their line; workers stay fast and
whole under fresh tensors and threads; values, memory and descriptors beyond what the machine allows
are refused with an error that names them.

Hangs use a small hang timeout and assert on the report; nothing sleeps to let things settle.
"""

from __future__ import annotations

import gc
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import children, gone, on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, RankError, RunConfig
from ptodist.backends import resources, shm
from ptodist.check import findings
from ptodist.errors import KernelValueError, ResourceError
from ptodist.rank.status import current_line

NR = pl.dynamic("NR")
HERE = os.path.abspath(__file__)


def cfg(nr: int = 2, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), **kw)


def line_of(marker: str) -> int:
    """The line of this file that carries ``marker`` in a comment."""
    with open(HERE) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}"))


def stuck_program(mode: str):
    """Rank 0 waits for a notify from rank 1; rank 1 never sends it, because it ``mode``s instead."""

    @pl.jit.incore
    def stuck(x: pl.Tensor[[1, 4], pl.FP32], sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
        if pld.rank(pld.get_comm_ctx(sig)) == 0:
            pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)
        elif mode == "spin":
            while pl.read(sig, [0, 0]) < 1:  # spin here
                pass
        elif mode == "loop":
            while True:  # loop here
                pass
        else:
            time.sleep(3600)  # sleep here

    return on_every_rank(stuck, name="host")


def assert_busy_hang(e: HangError, mode: str) -> None:
    text = str(e)
    where = f"{HERE}:{line_of(mode + ' here')}"
    assert text.startswith("no progress for "), text
    assert f"rank 1 (device 1): running task 'stuck' at {where} in stuck (busy, not in a wait)" in text, text
    assert "rank 0 (device 0): blocked at" in text, text
    assert (f"Likely cause: rank 1 at {where} (kernel 'stuck') is running, not waiting, and made no communication "
            "progress, so the ranks that wait for it never get its notifies: the signalling is not at fault.") \
        in text, text
    # The guesses about signalling a rank stuck outside ptodist used to get: none of them.
    assert "waits before it notifies" not in text and "does not match" not in text
    assert e.diagnosis["culprits"] == [where]
    assert not e.certain


@pytest.mark.parametrize("mode", ["spin", "loop", "sleep"])
def test_a_rank_that_runs_without_communicating_is_a_hang_named_with_its_line(mode):
    # spin and loop used to run forever (CPU time and every pl.read counted as progress); a rank stuck
    # in a sleep was blamed on the signalling ("every rank waits before it notifies").
    host = stuck_program(mode)
    with pytest.raises(HangError) as info:
        host(np.zeros((2, 1, 4), np.float32), config=cfg(hang_timeout_s=1))
    assert_busy_hang(info.value, mode)
    assert children() == []


def test_a_spinning_rank_on_a_worker_is_a_hang_and_the_worker_closes(torch):
    x = torch.zeros(2, 1, 4).share_memory_()
    compiled = stuck_program("spin").compile(x, config=cfg(hang_timeout_s=1))
    with compiled.prepare() as rt:
        handle = rt.submit(compiled, x)
        with pytest.raises(HangError) as info:
            handle.result(timeout=120)  # before: still running when the timeout passed
        assert_busy_hang(info.value, "spin")
    assert children() == []  # leaving the block stopped the ranks (it used to block forever)


def test_a_spinning_rank_on_sim_is_a_hang_named_with_its_line():
    with pytest.raises(HangError) as info:
        stuck_program("spin")(np.zeros((2, 1, 4), np.float32), config=cfg(hang_timeout_s=1, backend="sim"))
    assert_busy_hang(info.value, "spin")


def test_a_busy_rank_sampled_inside_a_library_is_named_by_its_program_line():
    # A spin loop's pl.read runs numpy: a sample can land in numpy's frame (it did, now and then, in the test
    # above). The line a busy rank is reported at is the program's, whatever library it is inside.
    samples = []

    def called_back(v):
        inner = sys._getframe(1)  # the frame that called back: numpy's own Python code, as a sample can find
        samples.append((inner.f_code.co_filename, current_line(inner)))
        return v

    np.vectorize(called_back)(np.zeros(1))  # program line
    assert "numpy" in samples[0][0]
    assert samples[0][1] == f"{HERE}:{line_of('program line')} in " \
                            "test_a_busy_rank_sampled_inside_a_library_is_named_by_its_program_line"


@pl.jit.incore
def poll_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]],
                data: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]],
                sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(sig))
    if me == 1:
        pld.tile.remote_store(pl.load(x, [0, 0], [1, 4]), data, 0, [0, 0])
        pld.system.notify(sig, 0, [1, 0], 1, op=pld.NotifyOp.AtomicAdd)
    else:
        while pl.read(sig, [1, 0]) < 1:  # a polling read, not a wait: legal, and slow only in CPU
            pass
        pl.store(pl.load(data, [0, 0], [1, 4]), [0, 0], y)


poll = on_every_rank(poll_kernel, name="poll")


@pytest.mark.parametrize("seed", [0, 1, 2])  # random, delay rank 0, delay rank 1 (the notifier)
def test_a_polling_read_finishes_on_every_sim_schedule(seed, monkeypatch):
    monkeypatch.setenv("PTODIST_SIM_SEED", str(seed))
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    y = np.zeros_like(x)
    poll(x, y, config=cfg(backend="sim", hang_timeout_s=30))
    np.testing.assert_array_equal(y[0], x[1])


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_polling_read_that_sees_new_values_is_progress(backend):
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    y = np.zeros_like(x)
    poll(x, y, config=cfg(backend=backend))
    np.testing.assert_array_equal(y[0], x[1])


# -- workers: fresh tensors, threads ----------------------------------------------------------------

@pl.jit.incore
def copy_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], y)


copy = on_every_rank(copy_kernel, name="copy")


def _no_full_collections(rank: int) -> None:
    """In a rank: make a full garbage collection an error (it costs a torch-sized process ~0.3 s)."""
    gc.disable()

    def refuse(*args, **kwargs):
        raise AssertionError(f"rank {rank} ran a full garbage collection")

    gc.collect = refuse


def _shared_maps(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as f:
        return sum(1 for line in f if "memfd:" in line or "/dev/shm/" in line)


def test_fresh_tensors_every_dispatch_are_released_without_a_garbage_collection(monkeypatch, torch):
    monkeypatch.setattr(shm.server, "_rank_started", _no_full_collections)
    x0 = torch.zeros(2, 1, 4).share_memory_()
    compiled = copy.compile(x0, config=cfg())
    with compiled.prepare() as rt:
        pids = list(rt._core.group.pids.values())
        counts = []
        for i in range(60):
            x = torch.full((2, 1, 4), float(i)).share_memory_()
            if i % 2:
                y = rt(x)  # inputs only: the output is made for this dispatch and dropped after it
            else:
                y = torch.zeros(2, 1, 4).share_memory_()
                rt(x, y)
            assert (y == i).all()
            if i in (19, 59):
                counts.append([_shared_maps(p) for p in pids])
        assert counts[0] == counts[1], f"the ranks kept mappings of dropped tensors: {counts}"
    assert children() == []


THREADED = textwrap.dedent("""
    import os, sys, threading
    import torch
    sys.path.insert(0, {tests!r})
    from test_reliability import copy, cfg
    x = torch.ones(2, 1, 4).share_memory_()
    compiled = copy.compile(x, config=cfg())
    box = []
    t = threading.Thread(target=lambda: box.append(compiled.prepare()))
    t.start()
    t.join()                       # the thread that prepared the worker is gone
    rt = box[0]
    assert (rt(x) == 1).all()      # its ranks are not
    assert (rt(torch.full((2, 1, 4), 2.0).share_memory_()) == 2).all()
    print(*rt._core.group.pids.values(), flush=True)
    os.kill(os.getpid(), 9)        # and they still die with the process
""")


def test_a_worker_prepared_in_a_thread_keeps_its_ranks_which_die_with_the_process(tmp_path):
    script = tmp_path / "threaded.py"
    script.write_text(THREADED.format(tests=os.path.dirname(HERE)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stdout + done.stderr
    deadline = time.monotonic() + 30  # the kernel delivers the parent-death signal asynchronously
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(gone(p) for p in pids), "a rank outlived the process that prepared its worker"


TORCH_AFTER_FORK = textwrap.dedent("""
    import torch
    import ptodist.language as pl
    from ptodist import RunConfig

    torch.mm(torch.randn(256, 256), torch.randn(256, 256))   # the driver's OpenMP pool is up before any fork

    @pl.jit.incore
    def kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        m = torch.mm(torch.ones(256, 256), torch.ones(256, 256))  # a parallel op in the rank
        return pl.store(pl.add(pl.load(x, [0, 0], [1, 4]), float(m[0, 0])), [0, 0], y)

    x = torch.ones(1, 4).share_memory_()
    print(kernel(x, torch.zeros(1, 4))[0, 0].item(), flush=True)          # a one-shot call
    compiled = kernel.compile(x, torch.zeros(1, 4), config=RunConfig(backend="shm"))
    with compiled.prepare() as rt:                                       # a worker
        print(rt(x)[0, 0].item(), flush=True)
""")


def test_a_torch_op_in_a_rank_runs_after_the_driver_used_torch_threads(tmp_path):
    # A fork inherits the driver's OpenMP pool without its threads: the rank must run torch on one thread.
    script = tmp_path / "torch_after_fork.py"
    script.write_text(TORCH_AFTER_FORK)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PTODIST_BACKEND": "shm", "PTODIST_HANG_TIMEOUT": "60"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["257.0", "257.0"], done.stdout + done.stderr


# -- values and resources beyond the limits -----------------------------------------------------------

def notify_program(value: int, expected: int = 1):
    @pl.jit.incore
    def signal_kernel(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
        me = pld.rank(pld.get_comm_ctx(sig))
        pld.system.notify(sig, me, [me, 0], value, op=pld.NotifyOp.AtomicAdd)  # notify here
        pld.system.wait(sig, [me, 0], expected, cmp=pld.WaitCmp.Ge)  # wait here

    return on_every_rank(signal_kernel, name="host")


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_notify_value_outside_int32_is_refused_not_truncated(backend):
    with pytest.raises(RankError) as info:
        notify_program(2**40 + 5)(np.zeros((2, 1), np.float32), config=cfg(backend=backend))
    e = info.value.original
    assert isinstance(e, KernelValueError)
    assert str(e) == (
        f"pld.system.notify at {HERE}:{line_of('notify here')}: value 1099511627781 does not fit "
        "the signal cell: window 'sig' [2, 1] INT32 (buffer 'sig_buf') holds INT32 values, [-2147483648, 2147483647]; "
        "the device would keep only the low 32 bits (5). Notify a count or tag that fits in INT32.")


def test_a_wait_threshold_outside_int32_is_refused():
    with pytest.raises(RankError) as info:
        notify_program(1, expected=2**31)(np.zeros((2, 1), np.float32), config=cfg())
    assert str(info.value.original) == (
        f"pld.system.wait at {HERE}:{line_of('wait here')}: expected 2147483648 does not fit the signal cell: window "
        "'sig' [2, 1] INT32 (buffer 'sig_buf') holds INT32 values, [-2147483648, 2147483647]; the device would keep only "
        "the low 32 bits (-2147483648). Wait for a count that fits in INT32.")


def window_program(nbytes: int):
    @pl.jit.incore
    def touch(w: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
        pl.store(pl.full([1, 4], dtype=pl.FP32, value=1.0), [0, 0], w)

    @pl.jit
    def per_rank(w: pl.InOut[pld.DistributedTensor[[1, 4], pl.FP32]]):
        touch(w)

    @pl.jit.host
    def huge(x: pl.Tensor[[NR, 1, 4], pl.FP32]):
        buf = pld.alloc_window_buffer(nbytes)
        for r in pl.range(pld.world_size()):
            per_rank(pld.window(buf, [1, 4], dtype=pl.FP32), device=r)

    return huge


def test_windows_larger_than_memory_are_refused_before_any_rank_starts():
    limit, what = resources.memory_limit()
    with pytest.raises(ResourceError) as info:
        window_program(limit)(np.zeros((2, 1, 4), np.float32), config=cfg())
    text = str(info.value)
    assert isinstance(info.value, OSError)
    assert text.startswith(f"huge: the run needs {resources._size(2 * limit + 32)} of shared memory (2 rank(s) x "
                           f"its window buffers, the largest 'buf' {resources._size(limit)}; and its host tensors), "
                           f"but {what} allows {resources._size(limit)}."), text
    assert children() == []


def test_a_refused_allocation_names_the_windows(monkeypatch):
    # The kernel may refuse less than the machine's whole memory (overcommit rules, other processes).
    monkeypatch.setattr(resources, "check_windows", lambda *a: None)
    with pytest.raises(ResourceError) as info:
        window_program(1 << 60)(np.zeros((2, 1, 4), np.float32), config=cfg())
    text = str(info.value)
    assert text.startswith("huge: the kernel refused the "), text
    assert "of shared memory the run needs (Cannot allocate memory)" in text, text
    assert "the largest 'buf' 1073741824.0 GiB" in text and "Shrink the windows" in text, text


def test_a_worker_refuses_windows_larger_than_memory(torch):
    limit, _ = resources.memory_limit()
    x = torch.zeros(2, 1, 4).share_memory_()
    compiled = window_program(limit).compile(x, config=cfg())
    with compiled.prepare() as rt:
        with pytest.raises(ResourceError, match=r"^huge: the run needs .* 'buf'"):
            rt(x)
    assert children() == []


def test_ranks_beyond_the_descriptor_limit_are_refused_up_front(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (64, 64))
    monkeypatch.setattr(resource, "setrlimit", lambda *a: pytest.fail("the limit cannot be raised"))
    with pytest.raises(ResourceError) as info:
        copy(np.zeros((100, 1, 4), np.float32), np.zeros((100, 1, 4), np.float32), config=cfg(100))
    assert ("copy: the run needs 200 more open files (two per rank: its channel and the file where it leaves its "
            "stack if it dies) but this process has") in str(info.value)
    assert "may have at most 64 (RLIMIT_NOFILE). Raise the limit (`ulimit -n" in str(info.value)
    assert children() == []


def test_ranks_whose_channels_are_numbered_past_1024_are_watched():
    # select() cannot watch descriptor numbers of 1024 and more; a thousand ranks get there.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard RLIMIT_NOFILE ({hard}) is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
        while fd < 1100:
            fillers.append(fd)
            fd = os.dup(fd)
        fillers.append(fd)
        x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
        y = np.zeros_like(x)
        copy(x, y, config=cfg())
        np.testing.assert_array_equal(x, y)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_rank_killed_by_the_oom_killer_is_said_to_have_run_out_of_memory(monkeypatch):
    kills = iter([3, 4])
    monkeypatch.setattr(resources, "oom_kills", lambda: next(kills))
    before = resources.oom_kills()
    status = 9  # waitpid's status for a process killed by SIGKILL
    assert resources.death_note(status, before) == (
        "was killed by signal 9 (SIGKILL): the kernel's OOM killer killed 1 process(es) of this cgroup during the "
        "run, so it most likely ran out of memory")
    assert resources.death_note(15, None) == "was killed by signal 15 (SIGTERM)"
    assert resources.death_note(3 << 8, None) == "exited with status 3"


def test_a_rank_that_died_without_a_traceback_is_not_promised_one():
    def die(x: pl.Tensor[[1, 4], pl.FP32]):
        os.kill(os.getpid(), signal.SIGKILL)  # from outside, as it were: the process leaves no record

    host = on_every_rank(pl.jit.incore(die), name="host")
    with pytest.raises(RankError) as info:
        host(np.zeros((2, 1, 4), np.float32), config=cfg())
    assert "RankDied: the rank process was killed by signal 9 (SIGKILL): by the kernel's OOM killer if memory ran " \
           "out (see `dmesg`), or by a `kill -9`, without reporting a result (so there is no traceback)" in str(info.value)
    found = findings.from_exception(info.value)
    assert [f.kind for f in found] == ["rank_died"]
    assert "see its traceback" not in found[0].fix and "no traceback" in found[0].fix
    assert children() == []
