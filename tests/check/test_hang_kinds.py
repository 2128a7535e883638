"""Hangs and deadlocks: no false hang from the order of a rank's pending deferred waits, and every deadlock
reported as a hang-kind finding that names the line causing it and a fix that ends it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import on_every_rank, source_line

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir, shared_array
from ptodist.check import explore, hang

SIZE = 8
SEEDS = range(20)


def cfg(nr: int, backend: str, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend, **kw)


def on_every_seed(run, backend: str, monkeypatch) -> None:
    """``run()`` on ``backend``: once on shm, under every sim seed of SEEDS on sim."""
    for seed in (SEEDS if backend == "sim" else [None]):
        if seed is not None:
            monkeypatch.setenv("PTODIST_SIM_SEED", str(seed))
        run()


def clean_under_check(run) -> None:
    """``run()`` under ``ptodist check``'s 20 schedules: no finding in any of them."""
    for seed in SEEDS:
        with explore.checking(seed) as session:
            run()
        assert session.findings == [], (seed, [f.render() for f in session.findings])


# ---------------------------------------------------------------------------
# A wait the rank blocks in while its tasks' deferred waits are pending
# ---------------------------------------------------------------------------
# Rank 0 submits `hello` (deferred waits on the peer's hello: Eq on buffer `sig`; in a `pl.spmd(2)` region, one
# per block) and its dependant, which asks the peer for its answer; then it waits, in the orchestration or inside
# a later task, for that answer (Ge on buffer `answer`).  The answer comes only after the dependant ran, which
# needs `hello` complete: a rank that blocks in its own wait alone, not completing its tasks' deferred waits
# meanwhile, hangs here; a device does not.  KERNEL: the orchestration calls a kernel whose deferred wait (outside
# the task graph: waited for at the kernel's end) is the one on the answer; COMM: the orchestration waits with
# pl.system.comm_wait(..., cmp="ne").
ORCHESTRATION, TASK, SPMD, KERNEL, COMM = 0, 1, 2, 3, 4


@pl.jit.incore
def answered(answer: pl.InOut[pld.DistributedTensor[[1], pl.INT32]], got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    pld.system.defer_wait(answer, [0], 1, cmp=pld.WaitCmp.Ge)
    return pl.store(pl.full([1, SIZE], 3.0, pl.FP32), [0, 0], got)


@pl.jit
def ask_after_hello(sig: pl.InOut[pld.DistributedTensor[[3], pl.INT32]],
                    answer: pl.InOut[pld.DistributedTensor[[1], pl.INT32]],
                    got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], mode: pl.Scalar[pl.INT32]):
    with pl.manual_scope():
        if mode == SPMD:
            with pl.spmd(2) as hello:
                pld.system.defer_wait(sig, [pl.get_block_idx()], 1, cmp=pld.WaitCmp.Eq)
        else:
            with pl.at(level=pl.Level.CORE_GROUP) as hello:
                pld.system.defer_wait(sig, [0], 1, cmp=pld.WaitCmp.Eq)
        with pl.at(level=pl.Level.CORE_GROUP, deps=[hello]):
            pld.system.notify(sig, 1, [2], 1, op=pld.NotifyOp.AtomicAdd)  # now send the answer
        if mode == TASK:
            with pl.at(level=pl.Level.CORE_GROUP):
                pld.system.wait(answer, [0], 1, cmp=pld.WaitCmp.Ge)
                got[:] = pl.full([1, SIZE], 3.0, pl.FP32)
        if mode == KERNEL:
            got = answered(answer, got)
    if mode == COMM:
        pl.system.comm_wait(answer, 0, cmp="ne")
        got[:] = pl.full([1, SIZE], 3.0, pl.FP32)
    if mode in (ORCHESTRATION, SPMD):
        pld.system.wait(answer, [0], 1, cmp=pld.WaitCmp.Ge)
        got[:] = pl.full([1, SIZE], 3.0, pl.FP32)
    return got


@pl.jit
def hello_then_answer(sig: pl.InOut[pld.DistributedTensor[[3], pl.INT32]],
                      answer: pl.InOut[pld.DistributedTensor[[1], pl.INT32]],
                      got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], mode: pl.Scalar[pl.INT32]):
    pld.system.notify(sig, 0, [0], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.notify(sig, 0, [1], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.wait(sig, [2], 1, cmp=pld.WaitCmp.Ge)
    pld.system.notify(answer, 0, [0], 1, op=pld.NotifyOp.AtomicAdd)
    got[:] = pl.full([1, SIZE], 5.0, pl.FP32)
    return got


@pl.jit.host
def ask_host(got: pl.Out[pl.Tensor[[2, 1, SIZE], pl.FP32]], mode: pl.Scalar[pl.INT32]):
    sig_buf = pld.alloc_window_buffer([3], dtype=pl.INT32)
    answer_buf = pld.alloc_window_buffer([1], dtype=pl.INT32)
    windows = (pld.window(sig_buf, [3], dtype=pl.INT32), pld.window(answer_buf, [1], dtype=pl.INT32))
    ask_after_hello(*windows, got[0], mode, device=0)
    hello_then_answer(*windows, got[1], mode, device=1)


MODES = pytest.mark.parametrize("mode", [ORCHESTRATION, TASK, SPMD, KERNEL, COMM],
                                ids=["orchestration", "task", "spmd", "kernel", "comm_wait"])


def _ask(backend: str, mode: int) -> None:
    got = np.zeros((2, 1, SIZE), np.float32)
    ask_host.compile(got, mode, config=cfg(2, backend, hang_timeout_s=30.0))(got, mode)
    np.testing.assert_array_equal(got[:, 0, 0], [3.0, 5.0])


@MODES
def test_a_wait_that_needs_a_pending_deferred_wait_completed_first_completes(backend, monkeypatch, mode):
    on_every_seed(lambda: _ask(backend, mode), backend, monkeypatch)


@MODES
def test_a_wait_that_needs_a_pending_deferred_wait_completed_first_is_clean_under_check(mode):
    clean_under_check(lambda: _ask("sim", mode))


def test_a_wait_that_needs_a_pending_deferred_wait_completed_first_completes_in_worker_dispatches(backend,
                                                                                              monkeypatch):
    got = shared_array((2, 1, SIZE), np.float32)
    monkeypatch.setenv("PTODIST_SIM_SEED", "3")
    compiled = ask_host.compile(got, ORCHESTRATION, config=cfg(2, backend, hang_timeout_s=30.0))
    with compiled.prepare() as rt:
        for mode in (ORCHESTRATION, TASK, SPMD, KERNEL, COMM, ORCHESTRATION):
            got[:] = 0
            rt(got, mode)
            np.testing.assert_array_equal(got[:, 0, 0], [3.0, 5.0])


@pl.jit
def wait_beside_a_pending_deferred_wait(sig: pl.InOut[pld.DistributedTensor[[3], pl.INT32]],
                                        answer: pl.InOut[pld.DistributedTensor[[1], pl.INT32]],
                                        got: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    with pl.manual_scope():
        with pl.at(level=pl.Level.CORE_GROUP):
            pld.system.defer_wait(sig, [0], 1, cmp=pld.WaitCmp.Eq)  # @never notified
    pld.system.wait(answer, [0], 1, cmp=pld.WaitCmp.Ge)  # @never answered
    return got


@pl.jit.host
def never_answered_host(got: pl.Out[pl.Tensor[[2, 1, SIZE], pl.FP32]]):
    sig_buf = pld.alloc_window_buffer([3], dtype=pl.INT32)
    answer_buf = pld.alloc_window_buffer([1], dtype=pl.INT32)
    for r in pl.range(2):
        wait_beside_a_pending_deferred_wait(pld.window(sig_buf, [3], dtype=pl.INT32),
                                            pld.window(answer_buf, [1], dtype=pl.INT32), got[r], device=r)


def test_a_hang_in_a_wait_beside_pending_deferred_waits_names_both(backend):
    from ptodist.check import findings
    from ptodist.errors import HangError

    got = np.zeros((2, 1, SIZE), np.float32)
    wait_line = f"test_hang_kinds.py:{source_line(wait_beside_a_pending_deferred_wait, '@never answered')}"
    deferred_line = f"test_hang_kinds.py:{source_line(wait_beside_a_pending_deferred_wait, '@never notified')}"
    with pytest.raises(HangError) as info:
        never_answered_host.compile(got, config=cfg(2, backend, hang_timeout_s=30.0))(got)
    msg = str(info.value)
    lines = msg.splitlines()
    for r in range(2):
        i = next(i for i, t in enumerate(lines) if t.startswith(f"  rank {r} (device {r}): blocked at "))
        assert f"{wait_line} in kernel 'wait_beside_a_pending_deferred_wait': pld.system.wait on 'answer' (buffer " \
            "'answer_buf') cell [0] holds 0, needs >= 1 (waiting " in lines[i], msg
        assert lines[i + 2] == ("      beside it, its tasks' 1 pending deferred wait(s), each completing its task "
                                "when it holds:"), msg
        assert deferred_line in lines[i + 3] and lines[i + 3].endswith(
            "pld.system.defer_wait on 'sig' (buffer 'sig_buf') cell [0] holds 0, needs == 1"), msg
    (finding,) = findings.from_exception(info.value)
    assert finding.kind == "hang"
    assert [loc.rsplit("/", 1)[-1] for loc in finding.locations][:2] == [wait_line, deferred_line]


# ---------------------------------------------------------------------------
# A deadlock between a mixed kernel's halves is a hang, named at the line that causes it
# ---------------------------------------------------------------------------
MM, KK, NN = 8, 32, 8
Mat = pl.Tensor[[MM, NN], pl.FP32]


@pl.program
class NoFree:
    """The vector lanes pop the cube's 4 tiles from a 2-slot pipe and free none: the cube's third push waits."""

    @pl.function(type=pl.FunctionType.AIC)
    def producer(self, x: Mat, out: pl.Out[Mat]):
        pl.aic_initialize_pipe(dir_mask=1, slot_size=MM * NN * 4, slot_num=2)
        for k in pl.range(4):
            pl.tile.tpush_to_aiv(pl.tile.add(pl.load(x, [0, 0], [MM, NN]), float(k)), split=1)  # @push

    @pl.function(type=pl.FunctionType.AIV)
    def consumer(self, x: Mat, out: pl.Out[Mat]):
        pl.aiv_initialize_pipe(dir_mask=1, slot_size=MM * NN * 4, slot_num=2)
        acc = pl.full([MM // 2, NN], dtype=pl.FP32, value=0.0)
        for _ in pl.range(4):
            t = pl.tile.tpop_from_aic(shape=[MM // 2, NN], dtype=pl.FP32, split=1)  # @pop, never freed
            acc = pl.tile.add(acc, t)
        return pl.store(acc, [int(pl.get_subblock_idx()) * (MM // 2), 0], out)

    @pl.function(type=pl.FunctionType.Group)
    def fused(self, x: Mat, out: pl.Out[Mat]):
        self.producer(x, out)
        return self.consumer(x, out)

    @pl.function(type=pl.FunctionType.Orchestration)
    def per_rank(self, x: Mat, out: pl.Out[Mat]):
        return self.fused(x, out)

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, x: pl.Tensor[[2, MM, NN], pl.FP32], out: pl.Out[pl.Tensor[[2, MM, NN], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            self.per_rank(x[r], out[r], device=r)
        return out


@pl.program
class PushInLoop:
    """The cube pushes its running sum at every K step; the vector lanes pop once: the cube's push waits."""

    @pl.function(type=pl.FunctionType.AIC)
    def mm(self, a: pl.Tensor[[MM, KK], pl.FP32], b: pl.Tensor[[KK, NN], pl.FP32], out: pl.Out[Mat]):
        pl.aic_initialize_pipe(dir_mask=1, slot_size=MM * NN * 4, slot_num=2)
        acc = pl.full([MM, NN], dtype=pl.FP32, value=0.0)
        for k in pl.range(0, KK, 8):
            acc = pl.add(acc, pl.matmul(pl.load(a, [0, k], [MM, 8]), pl.load(b, [k, 0], [8, NN])))
            pl.tile.tpush_to_aiv(acc, split=1)  # @push in the K loop

    @pl.function(type=pl.FunctionType.AIV)
    def relu(self, a: pl.Tensor[[MM, KK], pl.FP32], b: pl.Tensor[[KK, NN], pl.FP32], out: pl.Out[Mat]):
        pl.aiv_initialize_pipe(dir_mask=1, slot_size=MM * NN * 4, slot_num=2)
        t = pl.tile.tpop_from_aic(shape=[MM // 2, NN], dtype=pl.FP32, split=1)
        r = pl.maximum(t, pl.full([MM // 2, NN], dtype=pl.FP32, value=0.0))
        pl.system.tfree_to_aic(t)
        return pl.store(r, [int(pl.get_subblock_idx()) * (MM // 2), 0], out)

    @pl.function(type=pl.FunctionType.Group)
    def fused(self, a: pl.Tensor[[MM, KK], pl.FP32], b: pl.Tensor[[KK, NN], pl.FP32], out: pl.Out[Mat]):
        self.mm(a, b, out)
        return self.relu(a, b, out)

    @pl.function(type=pl.FunctionType.Orchestration)
    def per_rank(self, a: pl.Tensor[[MM, KK], pl.FP32], b: pl.Tensor[[KK, NN], pl.FP32], out: pl.Out[Mat]):
        return self.fused(a, b, out)

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, a: pl.Tensor[[2, MM, KK], pl.FP32], b: pl.Tensor[[2, KK, NN], pl.FP32],
             out: pl.Out[pl.Tensor[[2, MM, NN], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            self.per_rank(a[r], b[r], out[r], device=r)
        return out


def _no_free(backend: str):
    x = np.arange(2 * MM * NN, dtype=np.float32).reshape(2, MM, NN)
    return ir.compile(NoFree, config=cfg(2, backend))(x, np.zeros_like(x))


def _push_in_loop(backend: str):
    a, b = np.ones((2, MM, KK), np.float32), np.ones((2, KK, NN), np.float32)
    return ir.compile(PushInLoop, config=cfg(2, backend))(a, b, np.zeros((2, MM, NN), np.float32))


def _here(fn, text: str) -> str:
    return f"{__file__}:{source_line(fn, text)}"


def _pipe_findings(run, backend: str) -> list:
    from ptodist.check import findings
    from ptodist.errors import KernelDeadlockError, KernelValueError, RankError

    with pytest.raises(RankError) as info:
        run(backend)
    for f in info.value.failures:
        assert isinstance(f.exception, KernelDeadlockError) and isinstance(f.exception, KernelValueError), f
    return findings.from_exception(info.value)


def test_a_pop_never_freed_on_a_full_pipe_is_a_hang_at_the_pop(backend):
    pop, push = _here(NoFree.consumer, "@pop"), _here(NoFree.producer, "@push")
    (f,) = _pipe_findings(_no_free, backend)
    assert f.kind == "hang" and f.ranks == [0, 1] and f.docs == "docs/pitfalls.md#all-ranks-hang"
    assert f.locations[:2] == [pop, push]
    assert f.message.startswith(
        f"rank 0 (device 0) in task 'fused': KernelDeadlockError: mixed kernel 'fused' deadlocked: no half can go "
        f"on. AIC (cube) 'producer' waits in pl.tpush_to_aiv at {push} (pipe 0 (cube->vector), lane 0: all 2 slots "
        "are taken (0 pushed and not popped, 2 popped and not released)); "), f.message
    assert f.fix == (f"Free each popped tile once it is consumed: call pl.tfree_to_aic(tile) after the "
                     f"pl.tpop_from_aic at {pop}, in the same loop iteration, so that the pl.tpush_to_aiv at {push} "
                     "finds a free slot (pipe 0 (cube->vector) has 2 slots: a producer runs at most 2 tiles ahead of "
                     "its consumer).")


def test_a_push_inside_the_k_loop_is_a_hang_at_the_push(backend):
    push = _here(PushInLoop.mm, "@push in the K loop")
    (f,) = _pipe_findings(_push_in_loop, backend)
    assert f.kind == "hang" and f.ranks == [0, 1]
    assert f.locations[0] == push
    assert f.message.startswith(
        f"rank 0 (device 0) in task 'fused': KernelDeadlockError: mixed kernel 'fused' deadlocked: no half can go "
        f"on. AIC (cube) 'mm' waits in pl.tpush_to_aiv at {push} (pipe 0 (cube->vector), lane 0: all 2 slots are "
        "taken (2 pushed and not popped, 0 popped and not released)); AIV lane 0 (vector) 'relu' has ended"), f.message
    assert f.fix == (f"Match the pushes to the pops: the pl.tpush_to_aiv at {push} runs more often than AIV lane 0 "
                     "(vector) 'relu' pops (ended after 1 pop(s), 2 pushed tile(s) unpopped). Push once per tile the "
                     "consumer pops: a push inside a loop whose pop is outside it pushes every iteration (move it "
                     "after the loop), or pop in a loop of the same trip count.")


@pytest.mark.parametrize("run", [_no_free, _push_in_loop], ids=["no_free", "push_in_loop"])
def test_a_pipe_deadlock_is_a_hang_under_check(run):
    outcome = explore.run_checked(lambda: run("sim"), 0)
    assert [f.kind for f in outcome.findings] == ["hang"], [f.render() for f in outcome.findings]
    assert outcome.findings[0].fix.startswith(("Free each popped tile", "Match the pushes to the pops"))


# ---------------------------------------------------------------------------
# A deferred wait hung behind an implicit overlap edge on its signal: the report names the edge
# ---------------------------------------------------------------------------
Row = pl.Tensor[[1, SIZE], pl.FP32]
RingWin = pld.DistributedTensor[[2, SIZE], pl.FP32]
RingSig = pld.DistributedTensor[[2, 1], pl.INT32]


def ring_program(no_dep: bool):
    """Each rank sends its row to its right neighbour and takes its left neighbour's once it arrived.  The task that
    waits for the arrival (a deferred wait on `sig`) is submitted before the task that sends, which takes `sig` too:
    unless `sig` is passed as pl.no_dep, the send is queued behind the waiting task, on every rank."""

    @pl.program
    class Ring:
        @pl.function(type=pl.FunctionType.InCore)
        def arrive(self, sig: pl.InOut[RingSig]):
            ctx = pld.get_comm_ctx(sig)
            left = (pld.rank(ctx) + pld.nranks(ctx) - 1) % pld.nranks(ctx)
            pld.system.defer_wait(sig, [left, 0], 1, cmp=pld.WaitCmp.Ge)  # @arrival

        @pl.function(type=pl.FunctionType.InCore)
        def send(self, x: Row, data: pl.InOut[RingWin], sig: pl.InOut[RingSig]):
            ctx = pld.get_comm_ctx(sig)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            pld.tile.remote_store(pl.load(x, [0, 0], [1, SIZE]), data, (me + 1) % n, [me, 0])
            pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)

        @pl.function(type=pl.FunctionType.InCore)
        def take(self, data: pl.InOut[RingWin], y: pl.Out[Row]):
            ctx = pld.get_comm_ctx(data)
            left = (pld.rank(ctx) + pld.nranks(ctx) - 1) % pld.nranks(ctx)
            return pl.store(pl.load(data, [left, 0], [1, SIZE]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: Row, y: pl.Out[Row], data: pl.InOut[RingWin], sig: pl.InOut[RingSig]):
            _, arrived = pl.submit(self.arrive, sig)  # @submit arrive
            pl.submit(self.send, x, data, pl.no_dep(sig) if no_dep else sig)  # @submit send
            pl.submit(self.take, data, y, deps=[arrived])
            return y

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[2, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[2, 1, SIZE], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([2, SIZE], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.per_rank(x[r], y[r], pld.window(data_buf, [2, SIZE], dtype=pl.FP32),
                              pld.window(sig_buf, [2, 1], dtype=pl.INT32), device=r)
            return y

    return Ring


RING, RING_FIXED = ring_program(False), ring_program(True)


def _ring(program, backend: str) -> None:
    x = np.arange(2 * SIZE, dtype=np.float32).reshape(2, 1, SIZE)
    y = ir.compile(program, config=cfg(2, backend, hang_timeout_s=30.0))(x)
    np.testing.assert_array_equal(y, np.roll(x, 1, axis=0))


def test_a_deferred_wait_hung_behind_an_implicit_edge_on_its_signal_names_the_edge(backend):
    from ptodist.check import findings
    from ptodist.errors import HangError

    per_rank = RING.per_rank
    send, arrive = _here(per_rank, "@submit send"), _here(per_rank, "@submit arrive")
    arrival = _here(RING.arrive, "@arrival")
    with pytest.raises(HangError) as info:
        _ring(RING, backend)
    msg = str(info.value)
    cause = next(line for line in msg.splitlines() if line.startswith("Likely cause: "))
    assert cause == (
        f"Likely cause: on rank 0, task 'send' (submitted at {send}) takes 'sig' (buffer 'sig_buf'), as does task "
        f"'arrive' (submitted at {arrive}), whose pld.system.defer_wait at {arrival} watches it; outside a "
        "pl.manual_scope a task shares a tensor with an earlier unfinished one only after it completes, so 'send' is "
        "queued until that deferred wait holds. If that task is what satisfies the wait (its notify, or a peer's "
        "that answers it), the two wait for each other: the queued task for the deferred wait, the deferred wait "
        "for the queued task. Pass the signal to the queued task as pl.no_dep(sig), or submit both in a "
        "pl.manual_scope()."), msg
    (f,) = findings.from_exception(info.value)
    assert f.kind == "hang" and f.ranks == [0, 1]
    assert f.locations == [send, arrival]
    assert f.fix == ("Keep the task that would satisfy the deferred wait out of the waiting task's implicit edge: "
                     "pass the signal to it as pl.no_dep(sig) (a signal is not data the tasks exchange), or submit "
                     "the tasks in a pl.manual_scope() with deps= only where one needs another's results.")


def test_the_implicit_edge_is_named_under_check():
    outcome = explore.run_checked(lambda: _ring(RING, "sim"), 0)
    (f,) = outcome.findings
    assert f.kind == "hang" and f.locations[0] == _here(RING.per_rank, "@submit send"), f.render()


def test_the_signal_passed_as_no_dep_completes(backend, monkeypatch):
    on_every_seed(lambda: _ring(RING_FIXED, backend), backend, monkeypatch)


def test_the_signal_passed_as_no_dep_is_clean_under_check():
    clean_under_check(lambda: _ring(RING_FIXED, "sim"))


# ---------------------------------------------------------------------------
# A persistent worker whose windows keep the last dispatch's counters
# ---------------------------------------------------------------------------


@pl.jit.incore
def barrier_kernel(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(sig)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    for peer in pl.range(n):
        pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for peer in pl.range(n):
        pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Eq)  # one arrival per dispatch
    y[:] = pl.full([1, SIZE], 1.0, pl.FP32)
    return y


barrier_host = on_every_rank(barrier_kernel, name="barrier_host")


def _two_dispatches(backend: str, reset: bool) -> None:
    y = shared_array((2, 1, SIZE), np.float32)
    compiled = barrier_host.compile(y, config=cfg(2, backend, hang_timeout_s=30.0))
    with compiled.prepare(persistent=True, reset_persistent_windows=reset) as rt:  # @prepare
        for _ in range(2):
            y[:] = 0
            rt(y)
            np.testing.assert_array_equal(y, 1.0)


def test_a_persistent_worker_hung_on_carried_counters_names_reset_persistent_windows(backend):
    from ptodist.check import findings
    from ptodist.errors import HangError

    prepare = _here(_two_dispatches, "@prepare")
    with pytest.raises(HangError) as info:
        _two_dispatches(backend, False)
    msg = str(info.value)
    assert msg.startswith("deadlock: every unfinished rank is blocked in a wait that no running rank can satisfy"), msg
    cause = next(line for line in msg.splitlines() if line.startswith("Likely cause: "))
    assert cause == (
        f"Likely cause: the worker prepared at {prepare} keeps its windows across dispatches (persistent=True) and "
        "reset_persistent_windows=False leaves them as the last dispatch left them instead of zeroing them: in "
        "dispatch 1, the cell rank 0 waits on (pld.system.wait on 'sig' (buffer 'sig_buf') cell [0, 0]) holds 2, of "
        "which this dispatch's notifies added 1; the other 1 carried over from dispatch 0, so the wait for == 1 "
        "never holds. Prepare the worker with reset_persistent_windows=True (or wait for a per-dispatch count)."), msg
    (f,) = findings.from_exception(info.value)
    assert f.kind == "hang" and f.locations[0] == prepare
    assert f.fix.startswith("Start every dispatch from zeroed windows: prepare the worker with "
                            "reset_persistent_windows=True"), f.fix


def test_a_persistent_worker_that_zeroes_its_windows_completes(backend):
    _two_dispatches(backend, True)


def test_a_persistent_worker_hung_on_carried_counters_under_check():
    outcome = explore.run_checked(lambda: _two_dispatches("sim", False), 0)
    hangs = [f for f in outcome.findings if f.kind == "hang"]
    assert len(hangs) == 1 and hangs[0].locations[0] == _here(_two_dispatches, "@prepare"), \
        [f.render() for f in outcome.findings]


# ---------------------------------------------------------------------------
# A rank waits on a cell a finished rank never notified: not "every rank waits before it notifies"
# ---------------------------------------------------------------------------


@pl.jit
def wait_for_one(sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)  # @wait for rank 1
    return y


@pl.jit
def notify_wrong_cell(sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]],
                      y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    pld.system.notify(sig, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @wrong cell: rank 0 waits on [1, 0]
    return y


@pl.jit.host
def wrong_cell_host(y: pl.Out[pl.Tensor[[2, 1, SIZE], pl.FP32]]):
    sig_buf = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
    wait_for_one(pld.window(sig_buf, [2, 1], dtype=pl.INT32), y[0], device=0)
    notify_wrong_cell(pld.window(sig_buf, [2, 1], dtype=pl.INT32), y[1], device=1)


def test_a_wait_on_a_cell_a_finished_rank_never_notified_names_where_its_notifies_went(backend):
    from ptodist.check import findings
    from ptodist.errors import HangError

    y = np.zeros((2, 1, SIZE), np.float32)
    wrong, wait = _here(notify_wrong_cell, "@wrong cell"), _here(wait_for_one, "@wait for rank 1")
    with pytest.raises(HangError) as info:
        wrong_cell_host.compile(y, config=cfg(2, backend, hang_timeout_s=30.0))(y)
    cause = next(line for line in str(info.value).splitlines() if line.startswith("Likely cause: "))
    assert cause == (f"Likely cause: a notify went to the wrong cell: rank 1 notified rank 0's 'sig' cell [0, 0] at "
                     f"{wrong}, where nobody waits on it; rank 0 waits on 'sig' cell [1, 0] at {wait} for >= 1 and "
                     "holds 0. Did you mean to notify 'sig' cell [1, 0]?")
    (f,) = findings.from_exception(info.value)
    assert f.kind == "hang" and f.locations == [wrong, wait] and f.fix == hang.FIX_WRONG_INDEX
