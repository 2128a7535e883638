"""A host orchestrator's collective called again and again: recorded on its first run, replayed natively after
(rank/replay.py) where the record is the whole truth, and every call gives the same numbers and diagnosis as the
primitives do on every backend.

Each program runs K rounds; in round i every rank stages new data, the host calls one collective, and every rank
copies the result out, so a replay that moved stale or wrong regions shows in a later round's numbers.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from conftest import LOCAL_BACKENDS, marker_line

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, RankError, RunConfig, shared_array
from ptodist.backends.shm.memory import CompiledSteps, _row_runs
from ptodist.errors import SignalLayoutError

N, K = 6, 3

CASES = {  # name -> (dtype, host call (a, b, c, sig, n) -> the window read back, expected (x, n) per round)
    "allreduce": (pl.FP32, lambda a, b, c, s, n: pld.tensor.allreduce(a, s),
                  lambda x, n: np.broadcast_to(x.sum(0), x.shape)),
    "allreduce_int32": (pl.INT32, lambda a, b, c, s, n: pld.tensor.allreduce(a, s),
                        lambda x, n: np.broadcast_to(x.sum(0), x.shape)),
    "allreduce_fp16": (pl.FP16, lambda a, b, c, s, n: pld.tensor.allreduce(a, s),
                       lambda x, n: np.broadcast_to(x.sum(0), x.shape)),
    "allreduce_max": (pl.FP32, lambda a, b, c, s, n: pld.tensor.allreduce(a, s, op=pld.ReduceOp.Max),
                      lambda x, n: np.broadcast_to(x.max(0), x.shape)),
    "broadcast": (pl.FP32, lambda a, b, c, s, n: pld.tensor.broadcast(a, s, root=1),
                  lambda x, n: np.broadcast_to(x[1], x.shape)),
    "reduce_scatter": (pl.FP32, lambda a, b, c, s, n: pld.tensor.reduce_scatter(a, s),
                       lambda x, n: np.stack([np.where(np.arange(n)[:, None] == r, x.sum(0), x[r]) for r in range(n)])),
    "all_to_all": (pl.FP32, lambda a, b, c, s, n: pld.tensor.all_to_all(a, b, s),
                   lambda x, n: x.transpose(1, 0, 2)),
    "allgather": (pl.FP32, lambda a, b, c, s, n: pld.tensor.allgather(c, b, s),
                  lambda x, n: np.broadcast_to(x[:, 0], x.shape)),
}


def rounds_program(name: str, n: int):
    """K rounds of collective ``name`` on ``n`` ranks; rank r's data ``x[i, r]`` is ``[n, N]``."""
    dtype, call, _ = CASES[name]

    @pl.jit.incore
    def stage(x: pl.Tensor[[n, N], dtype], a: pl.InOut[pld.DistributedTensor[[n, N], dtype]],
              c: pl.InOut[pld.DistributedTensor[[1, N], dtype]]):
        pl.store(pl.load(x, [0, 0], [n, N]), [0, 0], a)
        pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], c)
        return a

    @pl.jit
    def stage_on(x: pl.Tensor[[n, N], dtype], a: pl.InOut[pld.DistributedTensor[[n, N], dtype]],
                 c: pl.InOut[pld.DistributedTensor[[1, N], dtype]]):
        return stage(x, a, c)

    @pl.jit.incore
    def keep(y: pl.Out[pl.Tensor[[n, N], dtype]], res: pl.InOut[pld.DistributedTensor[[n, N], dtype]]):
        pl.store(pl.load(res, [0, 0], [n, N]), [0, 0], y)
        return y

    @pl.jit
    def keep_on(y: pl.Out[pl.Tensor[[n, N], dtype]], res: pl.InOut[pld.DistributedTensor[[n, N], dtype]]):
        return keep(y, res)

    @pl.jit.host
    def host(x: pl.Tensor[[K, n, n, N], dtype], y: pl.Out[pl.Tensor[[K, n, n, N], dtype]]):
        a = pld.window(pld.alloc_window_buffer([n, N], dtype=dtype), [n, N], dtype=dtype)
        b = pld.window(pld.alloc_window_buffer([n, N], dtype=dtype), [n, N], dtype=dtype)
        c = pld.window(pld.alloc_window_buffer([1, N], dtype=dtype), [1, N], dtype=dtype)
        sig = pld.window(pld.alloc_window_buffer([n, 1], dtype=pl.INT32), [n, 1], dtype=pl.INT32)
        for i in pl.range(K):
            for r in pl.range(pld.world_size()):
                stage_on(x[i, r], a, c, device=r)
            res = call(a, b, c, sig, n)
            for r in pl.range(pld.world_size()):
                keep_on(y[i, r], res, device=r)
        return y

    return host


def run_rounds(name: str, n: int, backend: str) -> tuple[np.ndarray, np.ndarray]:
    """Run the rounds; return (what every rank read back, what numpy says)."""
    dtype = CASES[name][0]
    rng = np.random.default_rng(7)
    x = rng.integers(-50, 50, (K, n, n, N)).astype(dtype.np_dtype)
    y = np.zeros_like(x)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(n))), backend=backend)
    rounds_program(name, n)(x, y, config=cfg)
    return y, np.stack([CASES[name][2](x[i], n) for i in range(K)])


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_every_round_of_a_host_collective_gives_numpys_numbers(name, n, backend):
    y, expected = run_rounds(name, n, backend)
    np.testing.assert_array_equal(y, expected)


@pytest.fixture
def replays(monkeypatch, tmp_path):
    """Count the replayed collectives of shm ranks (forked after the patch): a file line per replay, naming the
    rank's process; returns the number of replays of each process."""
    log = tmp_path / "replays"
    run = CompiledSteps.run

    def counted(self, ledger, start):
        if start == 0:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        return run(self, ledger, start)

    monkeypatch.setattr(CompiledSteps, "run", counted)
    return lambda: sorted(Counter(log.read_text().split()).values()) if log.exists() else []


@pytest.mark.parametrize(("name", "replayed"), [
    ("allreduce", True), ("allreduce_int32", True), ("broadcast", True), ("reduce_scatter", True),
    ("all_to_all", True), ("allgather", True),
    ("allreduce_fp16", False),  # no native add for FP16: every call through the primitives
    ("allreduce_max", False),   # a remote_load and a tile store: the record does not hold them
])
def test_a_collective_is_replayed_after_its_first_run_where_the_record_holds_it(name, replayed, replays):
    y, expected = run_rounds(name, 2, "shm")
    np.testing.assert_array_equal(y, expected)
    assert replays() == ([K - 1, K - 1] if replayed else [])  # each of the 2 ranks, every call but the first


@pytest.mark.parametrize("name", ["allreduce", "all_to_all"])
@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_a_prepared_program_gives_numpys_numbers_at_every_dispatch(name, backend):
    # A worker's dispatch runs in a new rank context; the same command again replays what the first one recorded.
    n, dtype = 2, CASES[name][0]
    x, y = shared_array((K, n, n, N), dtype.np_dtype), shared_array((K, n, n, N), dtype.np_dtype)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(n))), backend=backend)
    rng = np.random.default_rng(11)
    with rounds_program(name, n).compile(x, y, config=cfg).prepare() as rt:
        for dispatch in range(3):
            x[...] = rng.integers(-50, 50, x.shape)
            y[...] = 0
            rt(x, y)
            expected = np.stack([CASES[name][2](x[i], n) for i in range(K)])
            np.testing.assert_array_equal(y, expected, err_msg=f"dispatch {dispatch}")


def test_a_prepared_worker_replays_from_its_second_dispatch_of_the_same_command(replays):
    n = 2
    x, y = shared_array((K, n, n, N), np.float32), shared_array((K, n, n, N), np.float32)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(n))), backend="shm")
    with rounds_program("allreduce", n).compile(x, y, config=cfg).prepare() as rt:
        for dispatch in range(6):
            x[...] = dispatch + np.arange(N)
            rt(x, y)
            np.testing.assert_array_equal(y, np.broadcast_to(n * x[:, :1], y.shape), err_msg=f"dispatch {dispatch}")
        y2 = shared_array(y.shape, np.float32)  # another command (other host memory): recorded again
        rt(x, y2)
        np.testing.assert_array_equal(y2, y)
    counts = replays()
    # The first dispatches send new memory (each a new command); from the third on the command repeats, and the
    # dispatches after it replay every call, their first included.
    assert len(counts) == n and counts[0] == counts[1] and counts[0] >= 6 * (K - 1) + 3 + (K - 1), counts


def rooted_program(n: int):
    """Broadcast from the root a scalar argument names, then read every rank's window back."""

    @pl.jit.incore
    def stage(x: pl.Tensor[[1, N], pl.FP32], a: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
        pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], a)
        return a

    @pl.jit
    def stage_on(x: pl.Tensor[[1, N], pl.FP32], a: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
        return stage(x, a)

    @pl.jit.incore
    def keep(y: pl.Out[pl.Tensor[[1, N], pl.FP32]], a: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
        pl.store(pl.load(a, [0, 0], [1, N]), [0, 0], y)
        return y

    @pl.jit
    def keep_on(y: pl.Out[pl.Tensor[[1, N], pl.FP32]], a: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
        return keep(y, a)

    @pl.jit.host
    def host(x: pl.Tensor[[n, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[n, 1, N], pl.FP32]], root: pl.Scalar[pl.INT32]):
        a = pld.window(pld.alloc_window_buffer([1, N], dtype=pl.FP32), [1, N], dtype=pl.FP32)
        sig = pld.window(pld.alloc_window_buffer([n, 1], dtype=pl.INT32), [n, 1], dtype=pl.INT32)
        for r in pl.range(pld.world_size()):
            stage_on(x[r], a, device=r)
        pld.tensor.broadcast(a, sig, root=root)
        for r in pl.range(pld.world_size()):
            keep_on(y[r], a, device=r)
        return y

    return host


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_a_replay_kept_for_the_next_dispatch_is_one_of_its_scalar_arguments(backend):
    n = 2
    x, y = shared_array((n, 1, N), np.float32), shared_array((n, 1, N), np.float32)
    x[...] = np.arange(n)[:, None, None] * 10 + np.arange(N)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(n))), backend=backend)
    with rooted_program(n).compile(x, y, 0, config=cfg).prepare() as rt:
        for root in [0, 1, 1] * 8:  # the same command but its root: each root's own record
            y[...] = -1
            rt(x, y, root)
            np.testing.assert_array_equal(y, np.broadcast_to(x[root], y.shape), err_msg=f"root {root}")


def test_a_host_collective_kept_across_dispatches_still_claims_its_signal_layout_in_each():
    n = 2

    @pl.jit.incore
    def reduce(a: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]], h: pl.InOut[pld.DistributedTensor[[n, 2], pl.INT32]]):
        return pld.tensor.allreduce(a, h)  # @second_layout

    @pl.jit
    def reduce_on(a: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                  h: pl.InOut[pld.DistributedTensor[[n, 2], pl.INT32]]):
        return reduce(a, h)

    @pl.jit.host
    def host(x: pl.Tensor[[n, 1, N], pl.FP32]):
        buf = pld.alloc_window_buffer([2 * n], dtype=pl.INT32)
        a = pld.window(pld.alloc_window_buffer([1, N], dtype=pl.FP32), [1, N], dtype=pl.FP32)
        pld.tensor.barrier(pld.window(buf, [n, 1], dtype=pl.INT32))
        h = pld.window(buf, [n, 2], dtype=pl.INT32)
        for r in pl.range(pld.world_size()):
            reduce_on(a, h, device=r)

    x = shared_array((n, 1, N), np.float32)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(n))), backend="shm")
    with host.compile(x, config=cfg).prepare() as rt:
        for dispatch in range(5):  # the barrier's checks are kept from the third dispatch on (the same command)
            with pytest.raises(RankError) as info:
                rt(x)
            assert isinstance(info.value.original, SignalLayoutError), f"dispatch {dispatch}"
            assert (f"pld.tensor.allreduce at {__file__}:{marker_line(__file__, 'second_layout')}: signal window buffer" in
                    str(info.value.original)), str(info.value.original)


def stalling_program(stall_round: int):
    """Rank 1 waits for ever before round ``stall_round``'s allreduce, which rank 0 enters."""

    @pl.jit.incore
    def stall(h: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]], when: pl.Tensor[[1], pl.INT32]):
        if pld.rank(pld.get_comm_ctx(h)) == 1 and pl.read(when, [0]) == 1:
            pld.system.wait(h, [0, 0], 1, cmp=pld.WaitCmp.Ge)  # never notified
        return h

    @pl.jit
    def stall_on(h: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]], when: pl.Tensor[[1], pl.INT32]):
        return stall(h, when)

    @pl.jit.host
    def host(when: pl.Tensor[[K, 1], pl.INT32]):
        a = pld.window(pld.alloc_window_buffer([1, N], dtype=pl.FP32), [1, N], dtype=pl.FP32)
        sig = pld.window(pld.alloc_window_buffer([2, 1], dtype=pl.INT32), [2, 1], dtype=pl.INT32)
        h = pld.window(pld.alloc_window_buffer([2, 1], dtype=pl.INT32), [2, 1], dtype=pl.INT32)
        for i in pl.range(K):
            for r in pl.range(pld.world_size()):
                stall_on(h, when[i], device=r)
            pld.tensor.allreduce(a, sig)  # @the_allreduce
        return when

    when = np.zeros((K, 1), np.int32)
    when[stall_round] = 1
    return host, when


@pytest.mark.parametrize("stall_round", [0, K - 1])  # the recorded run, a replayed one
@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_a_hang_inside_a_host_collective_names_its_line_and_cell_on_every_backend(stall_round, backend):
    host, when = stalling_program(stall_round)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=backend, hang_timeout_s=2.0)
    with pytest.raises(HangError) as e:
        host(when, config=cfg)
    assert (f"rank 0 (device 0): blocked at {__file__}:{marker_line(__file__, 'the_allreduce')} in kernel "
            "'pld.tensor.allreduce': pld.system.wait on 'sig' (buffer 'sig') cell [1, 0] holds 0, needs >= 1") \
        in str(e.value)
    # what rank 0 received in the rounds before: rank 1's tokens, from the allreduce's line
    assert f"+1 from rank 1 at {__file__}:{marker_line(__file__, 'the_allreduce')}" in str(e.value) or stall_round == 0


@pytest.mark.parametrize(("dst", "src", "runs"), [
    (np.zeros((4, 8), np.float32), np.ones((4, 8), np.float32), (32, 1, 0, 0)),  # contiguous: one row
    (np.zeros((4, 8), np.float32)[:, 2:6], np.ones((4, 4), np.float32), (4, 4, 32, 16)),  # a column block
    (np.zeros((1, 8), np.float32), np.ones((1, 8), np.float32), (8, 1, 0, 0)),
    (np.zeros((0, 8), np.float32), np.ones((0, 8), np.float32), (0, 0, 0, 0)),  # nothing moves
])
def test_a_region_moves_as_rows_of_contiguous_elements(dst, src, runs):
    assert _row_runs(dst, src) == runs


def test_a_region_numpy_would_move_through_a_temporary_has_no_native_form():
    a = np.zeros((4, 8), np.float32)
    assert _row_runs(a[:, 1:], a[:, :-1]) is None  # overlapping
    assert _row_runs(np.zeros((2, 4, 4), np.float32)[:, :, :2], np.ones((2, 4, 2), np.float32)) is None  # 2 strided
    assert _row_runs(np.zeros(4, np.float32), np.ones(4, np.float64)) is None  # dtypes differ
