"""The shm backend: real processes, real shared memory, real atomics.

Covers what the driver promises: exact atomics across processes, a failing
rank stops the run with RankError, stalls end with HangError (at once when
certain), waiting ranks sleep in the kernel, and after any ending no rank
process and no shared-memory segment is left behind.  Synchronisation between
the test and the ranks uses pipes and shared words, never sleeps, and no
assertion depends on how long something took.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import children, on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, RankError, RunConfig
from ptodist.backends.shm import close_kept_groups
from ptodist.errors import ConfigError


def cfg(nr: int, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), **kw)


def shm_segments() -> set[str]:
    """/dev/shm's entries, but Open MPI's (an MPI job running beside the tests makes and removes those)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if not n.startswith(("vader_segment", "sm_segment"))}


@pytest.fixture
def no_leaks():
    before = shm_segments()
    yield
    close_kept_groups()  # a successful one-shot call keeps its ranks for the next call: closing must leave nothing
    assert children() == [], "rank processes were left running"
    assert shm_segments() == before, "shared-memory segments were left behind"


# -- atomics ----------------------------------------------------------------------

def make_counter(nr: int, adds: int):
    @pl.jit.incore
    def bump(out: pl.Out[pl.Tensor[[1, 9], pl.FP32]],
             sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]],
             acc: pl.InOut[pld.DistributedTensor[[1, 8], pl.FP32]]):
        me = pld.rank(pld.get_comm_ctx(sig))
        ones = pl.full([1, 8], dtype=pl.FP32, value=1.0)
        for _ in pl.range(adds):
            # Accumulate first: the notify that follows publishes it.
            pld.tile.remote_store(ones, acc, 0, [0, 0], atomic=pld.AtomicType.Add)
            pld.system.notify(sig, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
        if me == 0:
            pld.system.wait(sig, [0, 0], nr * adds, cmp=pld.WaitCmp.Eq)
            pl.write(out, [0, 0], pl.cast(pl.read(sig, [0, 0]), target_type=pl.FP32))
            out = pl.store(pl.load(acc, [0, 0], [1, 8]), [0, 1], out)
        return out

    return on_every_rank(bump)


def test_atomic_add_is_exact_across_processes(no_leaks):
    nr, adds = 8, 10_000
    out = pl_compile(make_counter(nr, adds), nr)(np.zeros((nr, 1, 9), np.float32))
    # Rank 0 saw every AtomicAdd on the signal cell and every atomic tile accumulation.
    assert out[0, 0, 0] == nr * adds
    assert (out[0, 0, 1:] == nr * adds).all()


def pl_compile(prog, nr, **kw):
    from ptodist import ir

    if "config" not in kw:  # ir.compile's keywords override config=: give the devices one way
        kw["distributed_config"] = DistributedConfig(device_ids=list(range(nr)))
    return ir.compile(prog, **kw)


# -- failures -----------------------------------------------------------------------

def make_failing(nr: int, failing_rank: int, read_fd: int | None = None, pid_fd: int | None = None):
    """Rank `failing_rank` raises (or, with read_fd, blocks outside ptodist); the others wait forever."""

    @pl.jit.incore
    def work(sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
        me = pld.rank(pld.get_comm_ctx(sig))
        if me == failing_rank:
            if pid_fd is not None:
                os.write(pid_fd, f"{os.getpid()}\n".encode())
            if read_fd is not None:
                os.read(read_fd, 1)  # blocks: a rank busy outside any ptodist operation
            raise ValueError(f"boom on rank {me}")
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)

    return on_every_rank(work)


def test_exception_in_one_rank_stops_the_others(no_leaks):
    # Ranks 0 and 2 wait for ever: the run ends with rank 1's RankError (not a HangError after the 60 s
    # timeout), and no_leaks checks that they were stopped.
    compiled = pl_compile(make_failing(3, 1), 3, config=cfg(3, hang_timeout_s=60))
    with pytest.raises(RankError) as info:
        compiled(np.zeros((3, 1), np.float32))
    err = info.value
    assert (err.rank, err.device_id, err.task) == (1, 1, "work")
    assert isinstance(err.original, ValueError)
    msg = str(err)
    assert "rank 1 (device 1) failed in task 'work': ValueError: boom on rank 1" in msg
    assert "test_shm_backend.py" in msg and 'raise ValueError(f"boom on rank {me}")' in msg
    assert "ptodist/runtime" not in msg, "ptodist-internal frames must not appear in a user error"


def test_device_ids_are_reported(no_leaks):
    compiled = pl_compile(make_failing(2, 1), 2, config=RunConfig(
        distributed_config=DistributedConfig(device_ids=[5, 9])))
    with pytest.raises(RankError, match=r"rank 1 \(device 9\) failed"):
        compiled(np.zeros((2, 1), np.float32))


def test_certain_deadlock_is_reported_without_waiting_for_the_timeout(no_leaks):
    # Every rank waits on a cell nobody notifies: certain, so no need to wait for the 60 s timeout
    # (err.certain: the deadlock rule ended the run, not the timeout, which would make it uncertain).
    compiled = pl_compile(make_failing(2, failing_rank=-1), 2, config=cfg(2, hang_timeout_s=60))
    with pytest.raises(HangError) as info:
        compiled(np.zeros((2, 1), np.float32))
    err = info.value
    assert err.certain
    assert [s["state"] for s in err.ranks] == ["waiting", "waiting"]
    assert all(s["current"] == 0 and s["expected"] == 1 and s["cmp"] == "Ge" for s in err.ranks)
    msg = str(err)
    assert "deadlock" in msg
    assert "rank 0 (device 0): blocked at" in msg and "test_shm_backend.py" in msg
    assert "pld.system.wait on 'sig' (buffer 'sig_buf') cell [0, 0] holds 0, needs >= 1" in msg
    assert "notify loop before the wait loop" in msg


def test_no_progress_ends_with_hang_after_the_timeout(no_leaks):
    rfd, wfd = os.pipe()
    try:
        compiled = pl_compile(make_failing(2, 1, read_fd=rfd), 2, config=cfg(2, hang_timeout_s=1.0))
        with pytest.raises(HangError) as info:
            compiled(np.zeros((2, 1), np.float32))
    finally:
        os.close(rfd)
        os.close(wfd)
    err = info.value
    assert not err.certain
    assert [s["state"] for s in err.ranks] == ["waiting", "running"]
    assert "no progress for" in str(err) and "hang_timeout_s" in str(err)


def test_hang_timeout_from_environment(no_leaks, monkeypatch):
    monkeypatch.setenv("PTODIST_HANG_TIMEOUT", "0.8")
    rfd, wfd = os.pipe()
    try:
        compiled = pl_compile(make_failing(2, 1, read_fd=rfd), 2)
        with pytest.raises(HangError, match=r"hang timeout 0.8 s"):
            compiled(np.zeros((2, 1), np.float32))
    finally:
        os.close(rfd)
        os.close(wfd)


def test_killed_rank_ends_the_run(no_leaks):
    block_r, block_w = os.pipe()
    pid_r, pid_w = os.pipe()
    killed = []

    def killer():
        pid = int(os.read(pid_r, 64).decode())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    t = threading.Thread(target=killer)
    t.start()
    try:
        # A RankError, not a HangError: the death itself ended the run.
        compiled = pl_compile(make_failing(3, 2, read_fd=block_r, pid_fd=pid_w), 3, config=cfg(3, hang_timeout_s=60))
        with pytest.raises(RankError) as info:
            compiled(np.zeros((3, 1), np.float32))
    finally:
        t.join()
        for fd in (block_r, block_w, pid_r, pid_w):
            os.close(fd)
    assert killed
    assert info.value.rank == 2
    assert "killed by signal 9" in str(info.value)


def test_unknown_backend_is_rejected(monkeypatch):
    monkeypatch.setenv("PTODIST_BACKEND", "nccl")
    with pytest.raises(ConfigError, match="PTODIST_BACKEND='nccl'"):
        pl_compile(make_failing(2, 0), 2)(np.zeros((2, 1), np.float32))


# -- waits --------------------------------------------------------------------------

def make_waiter(nr: int):
    """Ranks 1.. wait on a cell; rank 0 notifies them once every one of them sleeps in the kernel.

    Rank 0 writes the sleepers word it saw (how many waits are in their futex sleep), each waiter 1 once
    released.  A waiter that spun instead would never count itself a sleeper, and the run would end
    with a HangError (rank 0 makes no progress while it looks).
    """

    @pl.jit.incore
    def k(out: pl.Out[pl.Tensor[[1, 1], pl.INT32]],
          sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
        from ptodist import _atomics, context
        from ptodist.rank.status import WAITING

        me = pld.rank(pld.get_comm_ctx(sig))
        if me == 0:
            ctx = context.current()
            rows, sleepers = ctx.status.rows, ctx.memory.sleepers_addr
            while not (all(rows[p]["state"] == WAITING for p in range(1, nr))
                       and _atomics.load(sleepers) == nr - 1):
                os.sched_yield()
            pl.write(out, [0, 0], _atomics.load(sleepers))
            for p in pl.range(1, nr):
                pld.system.notify(sig, p, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
        else:
            pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)
            pl.write(out, [0, 0], 1)
        return out

    return on_every_rank(k)


def test_waiting_ranks_sleep_in_the_kernel(no_leaks):
    # Five ranks wait while rank 0 works, on a machine with fewer cores than ranks: each wait must end
    # up asleep in the kernel (futex; counted in the sleepers word), not spinning, and the notify must
    # wake every one of them.
    nr = 6
    out = pl_compile(make_waiter(nr), nr, config=cfg(nr, hang_timeout_s=30))(np.zeros((nr, 1, 1), np.int32))
    assert out[0, 0, 0] == nr - 1, "rank 0 saw every waiter asleep at once"
    assert (out[1:, 0, 0] == 1).all(), "every waiter was woken"


# -- where ranks run ------------------------------------------------------------------------

PLACEMENT = textwrap.dedent("""
    import json, os, sys
    cpus = [int(c) for c in sys.argv[1].split(",")]
    os.sched_setaffinity(0, cpus)  # before ptodist is imported: it reads the CPUs it may use once
    import numpy as np
    import ptodist.language as pl
    import ptodist.language.distributed as pld
    from ptodist import DistributedConfig, context, ir

    @pl.jit.incore
    def where(out: pl.Out[pl.Tensor[[1, 2], pl.INT32]]):
        allowed = sorted(os.sched_getaffinity(0))
        pl.write(out, [0, 0], sum(1 << cpus.index(c) for c in allowed))  # bit i: may run on cpus[i]
        pl.write(out, [0, 1], 1 if context.current().memory.yield_s == 0 else 0)  # waits by spinning
        return out

    @pl.jit
    def chip(out: pl.Out[pl.Tensor[[1, 2], pl.INT32]]):
        return where(out)

    @pl.jit.host
    def host(out: pl.Out[pl.Tensor[[pl.dynamic("NR"), 1, 2], pl.INT32]]):
        for r in pl.range(pld.world_size()):
            chip(out[r], device=r)
        return out

    result = {}
    for nr in (len(cpus), len(cpus) + 1):
        compiled = ir.compile(host, distributed_config=DistributedConfig(device_ids=list(range(nr))))
        result[nr] = compiled(np.zeros((nr, 1, 2), np.int32))[:, 0, :].tolist()
    print(json.dumps(result))
""")


@pytest.mark.parametrize("k", [1, 2])
def test_ranks_are_spread_over_the_cpus_only_when_they_outnumber_them(tmp_path, k):
    # k CPUs allowed (as under taskset or a container's cpuset, which os.cpu_count() does not see): k ranks
    # run where the scheduler puts them and spin while they wait; k + 1 are pinned round-robin, rank r to
    # CPU r mod k, and wait by yielding their CPU.
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < k:
        pytest.skip(f"needs CPU affinity and {k} CPUs")
    cpus = sorted(os.sched_getaffinity(0))[:k]
    script = tmp_path / "placement.py"
    script.write_text(PLACEMENT)
    proc = subprocess.run([sys.executable, str(script), ",".join(map(str, cpus))], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {str(k): [[(1 << k) - 1, 1]] * k,
                      str(k + 1): [[1 << (r % k), 0] for r in range(k + 1)]}


@pl.jit.incore
def threads_after_matmul(out: pl.Out[pl.Tensor[[1, 2], pl.FP32]]):
    a = np.arange(128 * 128, dtype=np.float64).reshape(128, 128) / 1e4
    pl.write(out, [0, 0], float(np.abs(a @ a - np.einsum("ij,jk->ik", a, a)).max()))  # BLAS against no BLAS
    pl.write(out, [0, 1], len(os.listdir("/proc/self/task")))  # threads of this rank process
    return out


def _openblas_mapped() -> bool:
    """Whether an OpenBLAS is loaded here (read apart from ptodist's own search, which the test checks)."""
    try:
        with open("/proc/self/maps") as f:
            return "openblas" in f.read().lower()
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or not _openblas_mapped(),
                    reason="needs /proc and an OpenBLAS in this process")
def test_a_rank_runs_blas_on_its_own_thread_and_keeps_no_blas_thread(no_leaks):
    # Setting OpenBLAS to one thread in a forked rank starts its thread pool, whose worker then spins for
    # work for about 0.1 s, taking the CPU from the ranks (every dispatch of a new group took 4 ms on 2 cores):
    # a rank shuts the pool down again, and its matrix products still run, on the rank's own thread.
    out = pl_compile(on_every_rank(threads_after_matmul), 2)(np.zeros((2, 1, 2), np.float32))
    assert (out[:, 0, 0] < 1e-9).all()
    assert (out[:, 0, 1] == 1).all(), out[:, 0, 1]


# -- process hygiene under signals ------------------------------------------------------

DRIVER = textwrap.dedent("""
    import os, sys
    import numpy as np
    import ptodist.language as pl
    import ptodist.language.distributed as pld
    from ptodist import DistributedConfig, RunConfig, ir

    NR = 3

    @pl.program
    class Stuck:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
            os.write(1, f"rank-pid {os.getpid()}\\n".encode())  # one write: lines of ranks never interleave
            os.read(int(sys.argv[1]), 1)  # block outside ptodist until the test is done

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
            self.k(sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[NR, 1], pl.FP32]):
            b = pld.alloc_window_buffer([1, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(pld.window(b, [1, 1], dtype=pl.INT32), device=r)

    ir.compile(Stuck, distributed_config=DistributedConfig(device_ids=[0, 1, 2]))(np.zeros((NR, 1), np.float32))
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run_driver_and(sig: int, tmp_path) -> tuple[int, list[int]]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    rfd, wfd = os.pipe()
    proc = subprocess.Popen([sys.executable, str(script), str(rfd)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(rfd,), text=True)
    os.close(rfd)
    pids = []
    try:
        while len(pids) < 3:
            line = proc.stdout.readline()
            assert line, f"driver ended early: {proc.stderr.read()}"
            if line.startswith("rank-pid"):
                pids.append(int(line.split()[1]))
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
    finally:
        os.close(wfd)
        proc.kill()
        proc.wait()
    for pid in pids:
        _wait_for_exit(pid)
    return rc, pids


def _wait_for_exit(pid: int, guard_s: float = 30) -> None:
    """Wait until process ``pid`` (not a child of ours) has ended: its pidfd becomes readable then.

    ``guard_s`` only keeps a rank that never ends from hanging the test; the caller asserts on ``_alive``.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone (and reaped) already
    try:
        select.select([fd], [], [], guard_s)
    finally:
        os.close(fd)


def test_ctrl_c_stops_every_rank(tmp_path):
    rc, pids = _run_driver_and(signal.SIGINT, tmp_path)
    assert rc != 0
    assert not [p for p in pids if _alive(p)]


def test_killing_the_driver_kills_the_ranks(tmp_path):
    rc, pids = _run_driver_and(signal.SIGKILL, tmp_path)
    assert rc == -signal.SIGKILL
    assert not [p for p in pids if _alive(p)]


# -- hang diagnosis -------------------------------------------------------------------

def make_set_barrier(nr: int):
    """Every rank Sets rank r's one shared cell to its own id + 1, then waits for the sum: Set clobbers."""

    @pl.jit.incore
    def k(sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]]):
        me = pld.rank(pld.get_comm_ctx(sig))
        for p in pl.range(nr):
            pld.system.notify(sig, p, [0, 0], me + 1, op=pld.NotifyOp.Set)  # SET-LINE
        pld.system.wait(sig, [0, 0], nr * (nr + 1) // 2, cmp=pld.WaitCmp.Eq)

    return on_every_rank(k)


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "def " not in line)


def test_set_on_a_shared_cell_is_named_as_the_cause(no_leaks):
    from ptodist.check.findings import from_exception

    with pytest.raises(HangError) as info:
        pl_compile(make_set_barrier(4), 4)(np.zeros((4, 1), np.float32))
    err = info.value
    assert err.diagnosis["kind"] == "set_clobber"
    msg = str(err)
    # What each blocked cell received: one Set from every rank, with its line.
    assert f"received 4 notify(s): =1 from rank 0 at {__file__}:{_line_of('# SET-LINE')}" in msg
    assert "Likely cause: NotifyOp.Set from ranks [0, 1, 2, 3] on one cell" in msg
    finding = from_exception(err)[0]
    assert finding.kind == "set_clobber" and finding.ranks == [0, 1, 2, 3]
    assert finding.locations[0] == f"{__file__}:{_line_of('# SET-LINE')}"


def make_wrong_neighbour(nr: int):
    """Each rank tells its left neighbour but waits for its left neighbour: a wait-for cycle."""

    @pl.jit.incore
    def k(sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
        me = pld.rank(pld.get_comm_ctx(sig))
        left = (me - 1 + nr) % nr
        pld.system.notify(sig, left, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
        pld.system.wait(sig, [left, 0], 1, cmp=pld.WaitCmp.Ge)

    return on_every_rank(k)


def test_wait_for_cycle_and_misdirected_notifies_are_reported(no_leaks):
    from ptodist.check import hang

    with pytest.raises(HangError) as info:
        pl_compile(make_wrong_neighbour(3), 3)(np.zeros((3, 1), np.float32))
    msg = str(info.value)
    assert "Wait-for cycle: rank 0 -> rank 2 -> rank 1 -> rank 0" in msg
    assert msg.count("received no notify") == 3
    # Each notify reached its left neighbour's copy of the cell its right neighbour waits on.
    assert ("Likely cause: a notify went to the wrong peer: rank 2 notified rank 1's 'sig' cell [2, 0] at "
            f"{__file__}:{_line_of('notify(sig, left')}, where nobody waits on it (rank 1 waits on another cell); "
            "rank 0 waits on 'sig' cell [2, 0]") in msg
    assert "Did you mean to notify rank 0? The same holds for the waits of ranks 1 and 2: 2 more notify(s)" in msg
    assert info.value.diagnosis["cycle"] == [0, 2, 1, 0]
    assert info.value.diagnosis["fix"] == hang.FIX_WRONG_PEER


def make_tagged(nr: int):
    """Each rank notifies the next with its rank as the tag: rank 0's tag is 0 and adds nothing."""

    @pl.jit.incore
    def k(sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
        me = pld.rank(pld.get_comm_ctx(sig))
        pld.system.notify(sig, (me + 1) % nr, [me, 0], me, op=pld.NotifyOp.AtomicAdd)  # TAG-LINE
        pld.system.wait(sig, [(me - 1 + nr) % nr, 0], 1, cmp=pld.WaitCmp.Ge)

    return on_every_rank(k)


def test_a_notify_of_value_zero_is_named_as_the_cause(no_leaks):
    with pytest.raises(HangError) as info:
        pl_compile(make_tagged(2), 2)(np.zeros((2, 1), np.float32))
    err = info.value
    assert [s["state"] for s in err.ranks] == ["finished", "waiting"]
    assert "received AtomicAdd notifies of value 0 (from ranks [0])" in str(err)
    assert err.diagnosis["culprits"] == [f"{__file__}:{_line_of('# TAG-LINE')}"]
