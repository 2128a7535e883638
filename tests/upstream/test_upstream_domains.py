"""Comm domains, as PyPTO infers them: a window buffer lives on the ranks the host dispatched it to.

Upstream (hw-native-sys/pypto, ``MaterializeCommDomainScopes``) clusters window buffers by the set of
devices their windows are dispatched to (``device=r``); inside a kernel ``pld.rank`` / ``pld.nranks`` of
``pld.get_comm_ctx(window)`` and the peers of RMA and signal operations on it are ranks of that group, and
a collective on the window runs over the group.  These programs run at P=4 with two disjoint domains
({0, 1} and {2, 3}) and two overlapping ones ({0, 1, 2} and {1, 2, 3}).
"""

from __future__ import annotations

import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.compiler import planner
from ptodist.errors import PeerRangeError, ProgramValueError

P, R, C = 4, 2, 8
NR = pl.dynamic("NR")
Add, Ge = pld.NotifyOp.AtomicAdd, pld.WaitCmp.Ge
BACKENDS = ["sim", None]  # None: the default backend (shm)


def compiled_for(prog, backend):
    return ir.compile(prog, config=RunConfig(distributed_config=DistributedConfig(device_ids=list(range(P))),
                                             backend=backend))


def shift_and_reduce_program(a: tuple[int, int], b: tuple[int, int]):
    """Two domains, ranks [a0, a1) and [b0, b1): in each, a ring shift by one and a kernel allreduce.

    Rank r of domain d writes ``y[r, d]`` (the input of its right neighbour in the domain) and ``z[r, d]``
    (the sum of the domain's inputs).
    """

    @pl.program
    class Domains:
        @pl.function(type=pl.FunctionType.InCore)
        def step(self, x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]],
                 z: pl.Out[pl.Tensor[[R, C], pl.FP32]],
                 win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]],
                 acc: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
                 asig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(win)
            me, n = pld.rank(ctx), pld.nranks(ctx)
            t = pl.load(x, [0, 0], [R, C])
            pl.store(t, [0, 0], win)
            pl.store(t, [0, 0], acc)
            for p in pl.range(n):
                pld.system.notify(sig, p, [me, 0], 1, op=Add)
            for p in pl.range(n):
                pld.system.wait(sig, [p, 0], 1, cmp=Ge)
            right = pld.tile.remote_load(win, (me + 1) % n, [0, 0], [R, C])
            pl.store(right, [0, 0], y)
            total = pld.tensor.allreduce(acc, asig)
            pl.store(pl.load(total, [0, 0], [R, C]), [0, 0], z)
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]],
                 z: pl.Out[pl.Tensor[[R, C], pl.FP32]],
                 win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]],
                 acc: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
                 asig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            return self.step(x, y, z, win, sig, acc, asig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[P, R, C], pl.FP32], y: pl.Out[pl.Tensor[[P, 2, R, C], pl.FP32]],
                 z: pl.Out[pl.Tensor[[P, 2, R, C], pl.FP32]]):
            na, nb = a[1] - a[0], b[1] - b[0]
            win_a = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            sig_a = pld.alloc_window_buffer([na, 1], dtype=pl.INT32)
            acc_a = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            asig_a = pld.alloc_window_buffer([na, 1], dtype=pl.INT32)
            win_b = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            sig_b = pld.alloc_window_buffer([nb, 1], dtype=pl.INT32)
            acc_b = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            asig_b = pld.alloc_window_buffer([nb, 1], dtype=pl.INT32)
            for r in pl.range(a[0], a[1]):
                self.chip(x[r], y[r, 0], z[r, 0], pld.window(win_a, [R, C], dtype=pl.FP32),
                          pld.window(sig_a, [na, 1], dtype=pl.INT32), pld.window(acc_a, [R, C], dtype=pl.FP32),
                          pld.window(asig_a, [na, 1], dtype=pl.INT32), device=r)
            for r in pl.range(b[0], b[1]):
                self.chip(x[r], y[r, 1], z[r, 1], pld.window(win_b, [R, C], dtype=pl.FP32),
                          pld.window(sig_b, [nb, 1], dtype=pl.INT32), pld.window(acc_b, [R, C], dtype=pl.FP32),
                          pld.window(asig_b, [nb, 1], dtype=pl.INT32), device=r)
            return y

    return Domains


def expected(x: np.ndarray, domains):
    y = np.zeros((P, 2, R, C), np.float32)
    z = np.zeros((P, 2, R, C), np.float32)
    for d, (lo, hi) in enumerate(domains):
        group = list(range(lo, hi))
        for g, r in enumerate(group):
            y[r, d] = x[group[(g + 1) % len(group)]]
            z[r, d] = x[group].sum(axis=0)
    return y, z


@pytest.mark.parametrize("backend", BACKENDS, ids=["sim", "shm"])
@pytest.mark.parametrize("domains", [((0, 2), (2, 4)), ((0, 3), (1, 4))], ids=["disjoint", "overlapping"])
def test_ring_shift_and_allreduce_run_inside_each_domain(domains, backend):
    compiled = compiled_for(shift_and_reduce_program(*domains), backend)
    x = np.random.default_rng(7).integers(-50, 50, (P, R, C)).astype(np.float32)
    y = np.zeros((P, 2, R, C), np.float32)
    z = np.zeros((P, 2, R, C), np.float32)
    compiled(x, y, z)
    want_y, want_z = expected(x, domains)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_allclose(z, want_z, rtol=1e-6)


def test_the_plan_records_each_window_buffers_ranks():
    compiled = compiled_for(shift_and_reduce_program((0, 3), (1, 4)), "sim")
    x = np.ones((P, R, C), np.float32)
    y = np.zeros((P, 2, R, C), np.float32)
    plan = compiled._plan_for((x, y, y.copy()))[0]
    ranks = {w.name: w.ranks for w in plan.windows}
    assert ranks == {"win_a": (0, 1, 2), "sig_a": (0, 1, 2), "acc_a": (0, 1, 2), "asig_a": (0, 1, 2),
                     "win_b": (1, 2, 3), "sig_b": (1, 2, 3), "acc_b": (1, 2, 3), "asig_b": (1, 2, 3)}
    assert [w["ranks"] for w in plan.to_json()["windows"]] == [[0, 1, 2]] * 4 + [[1, 2, 3]] * 4


# Stage a tensor into a window, and read a window back: the chip functions of the host-collective programs.
@pl.jit.incore
def stage(x: pl.Tensor[[R, C], pl.FP32], win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
    pl.store(pl.load(x, [0, 0], [R, C]), [0, 0], win)


@pl.jit
def pub(x: pl.Tensor[[R, C], pl.FP32], win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
    stage(x, win)


@pl.jit.incore
def read(y: pl.Out[pl.Tensor[[R, C], pl.FP32]], win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
    pl.store(pl.load(win, [0, 0], [R, C]), [0, 0], y)


@pl.jit
def con(y: pl.Out[pl.Tensor[[R, C], pl.FP32]], win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
    read(y, win)


def host_allreduce_program(explicit_signal: bool):
    """Domains {0, 1} and {2, 3}: stage x into each domain's window, a host allreduce per domain, read back."""

    @pl.program
    class HostDomains:
        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[P, R, C], pl.FP32], y: pl.Out[pl.Tensor[[P, R, C], pl.FP32]]):
            win_a = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            win_b = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            a = pld.window(win_a, [R, C], dtype=pl.FP32)
            b = pld.window(win_b, [R, C], dtype=pl.FP32)
            for r in pl.range(0, 2):
                pub(x[r], a, device=r)
            for r in pl.range(2, 4):
                pub(x[r], b, device=r)
            if explicit_signal:
                sig_a = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
                sig_b = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
                a = pld.tensor.allreduce(a, pld.window(sig_a, [2, 1], dtype=pl.INT32))
                b = pld.tensor.allreduce(b, pld.window(sig_b, [2, 1], dtype=pl.INT32))
            else:
                a = pld.tensor.allreduce(a)
                b = pld.tensor.allreduce(b)
            for r in pl.range(0, 2):
                con(y[r], a, device=r)
            for r in pl.range(2, 4):
                con(y[r], b, device=r)
            return y

    return HostDomains


@pytest.mark.parametrize("backend", BACKENDS, ids=["sim", "shm"])
@pytest.mark.parametrize("explicit_signal", [True, False], ids=["signal", "synthesised-signal"])
def test_host_allreduce_runs_over_its_windows_domain(explicit_signal, backend):
    compiled = compiled_for(host_allreduce_program(explicit_signal), backend)
    x = np.arange(P * R * C, dtype=np.float32).reshape(P, R, C)
    y = np.zeros_like(x)
    compiled(x, y)
    np.testing.assert_array_equal(y[:2], np.broadcast_to(x[:2].sum(axis=0), (2, R, C)))
    np.testing.assert_array_equal(y[2:], np.broadcast_to(x[2:].sum(axis=0), (2, R, C)))
    # The builtin runs only on its domain's ranks: rank 0's plan holds domain {0, 1}'s allreduce alone.
    plan = compiled._plan_for((x, y))[0]
    builtins = [[t.function.describe() for t in ts if not hasattr(t.function, "params")] for ts in plan.tasks]
    assert builtins == [["pld.tensor.allreduce"]] * P


# -- errors ----------------------------------------------------------------------------------------------

def domain_kernel_program(body, lo: int = 0, hi: int = 2):
    """Domain [lo, hi) of P=4 gets windows win [R, C] and sig [NR, 1]; the other ranks run an empty task."""

    @pl.program
    class Prog:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, y: pl.Out[pl.Tensor[[R, C], pl.FP32]], win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
              sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(win)
            body(y, win, sig, pld.rank(ctx), pld.nranks(ctx))
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, y: pl.Out[pl.Tensor[[R, C], pl.FP32]], win: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            return self.k(y, win, sig)

        @pl.function(type=pl.FunctionType.InCore)
        def idle(self, y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def rest(self, y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
            return self.idle(y)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, y: pl.Out[pl.Tensor[[P, R, C], pl.FP32]]):
            win = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            sig = pld.alloc_window_buffer([hi - lo, 1], dtype=pl.INT32)
            for r in pl.range(lo, hi):
                self.chip(y[r], pld.window(win, [R, C], dtype=pl.FP32),
                          pld.window(sig, [hi - lo, 1], dtype=pl.INT32), device=r)
            for r in pl.range(P):
                if not lo <= r < hi:
                    self.rest(y[r], device=r)
            return y

    return Prog


@pytest.mark.parametrize("backend", BACKENDS, ids=["sim", "shm"])
def test_rank_and_nranks_are_group_relative(backend):
    def body(y, win, sig, me, n):
        pl.write(y, [0, 0], me)
        pl.write(y, [0, 1], n)

    y = np.full((P, R, C), -1, np.float32)
    compiled_for(domain_kernel_program(body, 1, 4), backend)(y)
    assert y[:, 0, :2].tolist() == [[-1, -1], [0, 3], [1, 3], [2, 3]]


@pytest.mark.parametrize("backend", BACKENDS, ids=["sim", "shm"])
def test_a_peer_outside_the_group_is_an_error(backend):
    # Domain {2, 3}: group rank 0 (world rank 2) addresses peer 2, a world rank but not a group rank.
    def body(y, win, sig, me, n):
        if me == 0:
            pld.tile.remote_load(win, 2, [0, 0], [R, C])

    with pytest.raises(RankError) as info:
        compiled_for(domain_kernel_program(body, 2, 4), backend)(np.zeros((P, R, C), np.float32))
    assert info.value.rank == 2
    assert isinstance(info.value.original, PeerRangeError)
    msg = str(info.value)
    assert ("pld.tile.remote_load at " in msg and "test_upstream_domains.py" in msg)
    assert ("peer 2 is outside [0, 2) of the comm domain of window 'win' [2, 8] FP32 (buffer 'win'), ranks {2, 3} "
            "(rank 2 is group rank 0, nranks 2). Peers are group ranks of the window's comm domain "
            "(0 .. nranks-1), not world ranks.") in msg


@pytest.mark.parametrize("backend", BACKENDS, ids=["sim", "shm"])
def test_a_negative_peer_in_a_group_gets_the_modulo_hint(backend):
    def body(y, win, sig, me, n):
        pld.system.notify(sig, me - 1, [0, 0], 1, op=Add)

    with pytest.raises(RankError) as info:
        compiled_for(domain_kernel_program(body, 1, 3), backend)(np.zeros((P, R, C), np.float32))
    assert info.value.rank == 1
    assert ("pld.system.notify at " in str(info.value))
    assert ("peer -1 is outside [0, 2) of the comm domain of window 'sig' [2, 1] INT32 (buffer 'sig'), ranks {1, 2} "
            "(rank 1 is group rank 0, nranks 2). A negative neighbour index") in str(info.value)


def test_a_window_used_by_a_rank_outside_its_group_is_an_error(monkeypatch):
    # Every path to a window goes through a dispatch, which puts the rank in the window's group; a plan that
    # says otherwise (here: rank 1 taken out of 'win''s group after planning) is refused by the rank.
    real = planner.resolve_groups

    def narrowed(plan):
        real(plan)
        for w in plan.windows:
            if w.name == "win":
                w.ranks = (0,)

    monkeypatch.setattr(planner, "resolve_groups", narrowed)
    with pytest.raises(RankError) as info:
        compiled_for(domain_kernel_program(lambda *a: None, 0, 2), "sim")(np.zeros((P, R, C), np.float32))
    assert info.value.rank == 1
    assert isinstance(info.value.original, ProgramValueError)
    msg = str(info.value)
    assert "chip(..., device=1) at " in msg and "test_upstream_domains.py" in msg
    assert (": window 'win' (buffer 'win') belongs to the comm domain of ranks {0}, but rank 1 is not in it. A "
            "window buffer lives on the ranks the host dispatched its windows to (device=r); dispatch it to this "
            "rank too, or use a window of this rank's domain.") in msg


def mixed_domain_kernel_collective_program():
    """Rank 1 and 2 hold data window 'acc' of domain {0, 1, 2} and signal 'asig' of domain {1, 2, 3}."""

    @pl.program
    class Mixed:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, acc: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
              asig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            pld.tensor.allreduce(acc, asig)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, acc: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]],
                 asig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            self.k(acc, asig)

        @pl.function(type=pl.FunctionType.InCore)
        def touch(self, w: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
            pass

        @pl.function(type=pl.FunctionType.Orchestration)
        def only(self, w: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
            self.touch(w)

        @pl.function(type=pl.FunctionType.InCore)
        def touch_sig(self, s: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            pass

        @pl.function(type=pl.FunctionType.Orchestration)
        def only_sig(self, s: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
            self.touch_sig(s)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[P, R, C], pl.FP32]):
            acc = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            asig = pld.alloc_window_buffer([3, 1], dtype=pl.INT32)
            a = pld.window(acc, [R, C], dtype=pl.FP32)
            s = pld.window(asig, [3, 1], dtype=pl.INT32)
            self.only(a, device=0)
            self.only_sig(s, device=3)
            for r in pl.range(1, 3):
                self.chip(a, s, device=r)

    return Mixed


def test_a_kernel_collective_over_windows_of_two_domains_is_an_error():
    with pytest.raises(RankError) as info:
        compiled_for(mixed_domain_kernel_collective_program(), "sim")(np.zeros((P, R, C), np.float32))
    assert isinstance(info.value.original, ProgramValueError)
    assert ("window 'asig' [3, 1] INT32 (buffer 'asig') lives on ranks {1, 2, 3} but window 'acc' [2, 8] FP32 "
            "(buffer 'acc') on ranks {0, 1, 2}: a collective runs over one comm domain, so its target and signal "
            "windows must be dispatched to the same ranks.") in str(info.value)


def test_a_host_collective_whose_signal_lives_elsewhere_is_an_error():
    @pl.program
    class HostMixed:
        @pl.function(type=pl.FunctionType.InCore)
        def touch(self, w: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
            pass

        @pl.function(type=pl.FunctionType.Orchestration)
        def only(self, w: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
            self.touch(w)

        @pl.function(type=pl.FunctionType.InCore)
        def touch_sig(self, s: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
            pass

        @pl.function(type=pl.FunctionType.Orchestration)
        def only_sig(self, s: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
            self.touch_sig(s)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[P, R, C], pl.FP32]):
            data = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            sig = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
            a = pld.window(data, [R, C], dtype=pl.FP32)
            s = pld.window(sig, [2, 1], dtype=pl.INT32)
            for r in pl.range(0, 2):
                self.only(a, device=r)
            for r in pl.range(2, 4):
                self.only_sig(s, device=r)
            pld.tensor.allreduce(a, s)

    with pytest.raises(ProgramValueError) as info:
        compiled_for(HostMixed, "sim")(np.zeros((P, R, C), np.float32))
    msg = str(info.value)
    assert msg.startswith("pld.tensor.allreduce at ") and "test_upstream_domains.py" in msg
    assert ("window buffer 'sig' lives on ranks {0, 1, 2, 3} but the collective runs over the comm domain of its "
            "data window buffer 'data', ranks {0, 1}: a collective's target and signal must be dispatched to the "
            "same ranks. Allocate a separate signal buffer for each domain.") in msg


# -- upstream's own overlapping-domain program, and the worker path ---------------------------------------

SIZE = 64


def swap_program():
    """Upstream's 3-device swap: domain A = devices {0, 1}, domain B = {1, 2}; device 1 is in both.

    Each rank stages its input into its domain's window, notifies its one peer (a group rank, passed as a
    scalar), waits, and reads the peer's window into the domain's output.
    """

    @pl.program
    class TwoGroupSwap:
        @pl.function(type=pl.FunctionType.InCore)
        def swap_step(self, inp: pl.Tensor[[1, SIZE], pl.FP32], out: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                      scratch: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                      signal: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]], peer: pl.Scalar[pl.INT32]):
            pl.store(pl.load(inp, [0, 0], [1, SIZE]), [0, 0], scratch)
            pld.system.notify(signal, peer=peer, offsets=[0, 0], value=1, op=Add)
            pld.system.wait(signal=signal, offsets=[0, 0], expected=1, cmp=Ge)
            got = pld.tile.remote_load(scratch, peer=peer, offsets=[0, 0], shape=[1, SIZE])
            return pl.store(got, [0, 0], out)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip_orch(self, inp: pl.Tensor[[1, SIZE], pl.FP32], out: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                      scratch: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                      signal: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]], peer: pl.Scalar[pl.INT32]):
            return self.swap_step(inp, out, scratch, signal, peer)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host_orch(self, inputs: pl.Tensor[[3, 1, SIZE], pl.FP32],
                      outputs_a: pl.Out[pl.Tensor[[3, 1, SIZE], pl.FP32]],
                      outputs_b: pl.Out[pl.Tensor[[3, 1, SIZE], pl.FP32]]):
            scratch_a_buf = pld.alloc_window_buffer(SIZE * 4)
            signal_a_buf = pld.alloc_window_buffer(4)
            scratch_b_buf = pld.alloc_window_buffer(SIZE * 4)
            signal_b_buf = pld.alloc_window_buffer(4)
            for r in pl.range(2):  # group ranks 0, 1 = devices 0, 1
                self.chip_orch(inputs[r], outputs_a[r], pld.window(scratch_a_buf, [SIZE], dtype=pl.FP32),
                               pld.window(signal_a_buf, [1], dtype=pl.INT32), 1 - r, device=r)
            for r in pl.range(1, 3):  # group ranks 0, 1 = devices 1, 2
                self.chip_orch(inputs[r], outputs_b[r], pld.window(scratch_b_buf, [SIZE], dtype=pl.FP32),
                               pld.window(signal_b_buf, [1], dtype=pl.INT32), 2 - r, device=r)
            return outputs_a

    return TwoGroupSwap


@pytest.mark.parametrize("backend", BACKENDS, ids=["sim", "shm"])
def test_upstream_overlapping_two_group_swap(backend):
    compiled = ir.compile(swap_program(), config=RunConfig(
        distributed_config=DistributedConfig(device_ids=[0, 1, 2]), backend=backend))
    inputs = np.stack([np.full((1, SIZE), 10.0 + d, np.float32) for d in range(3)])
    outputs_a = np.zeros((3, 1, SIZE), np.float32)
    outputs_b = np.zeros((3, 1, SIZE), np.float32)
    compiled(inputs, outputs_a, outputs_b)
    zero = np.zeros((1, SIZE), np.float32)
    np.testing.assert_array_equal(outputs_a, np.stack([inputs[1], inputs[0], zero]))
    np.testing.assert_array_equal(outputs_b, np.stack([zero, inputs[2], inputs[1]]))


def test_domains_on_a_distributed_worker():
    compiled = compiled_for(shift_and_reduce_program((0, 2), (2, 4)), "sim")
    x = np.random.default_rng(3).integers(-9, 9, (P, R, C)).astype(np.float32)
    want_y, want_z = expected(x, ((0, 2), (2, 4)))
    with compiled.prepare() as rt:
        for _ in range(2):
            y = np.zeros((P, 2, R, C), np.float32)
            z = np.zeros((P, 2, R, C), np.float32)
            rt(x, y, z)
            np.testing.assert_array_equal(y, want_y)
            np.testing.assert_array_equal(z, want_z)


def test_a_host_collective_before_its_domain_is_complete_is_an_error():
    @pl.program
    class Grows:
        @pl.function(type=pl.FunctionType.InCore)
        def touch(self, w: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
            pass

        @pl.function(type=pl.FunctionType.Orchestration)
        def only(self, w: pl.InOut[pld.DistributedTensor[[R, C], pl.FP32]]):
            self.touch(w)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[P, R, C], pl.FP32]):
            data = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            sig = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
            a = pld.window(data, [R, C], dtype=pl.FP32)
            for r in pl.range(0, 2):
                self.only(a, device=r)
            pld.tensor.allreduce(a, pld.window(sig, [2, 1], dtype=pl.INT32))
            for r in pl.range(2, 4):
                self.only(a, device=r)

    with pytest.raises(ProgramValueError) as info:
        compiled_for(Grows, "sim")(np.zeros((P, R, C), np.float32))
    assert ("when it was called, window buffer 'data' had been dispatched to 2 rank(s), but its comm domain is "
            "{0, 1, 2, 3} (4 ranks): dispatch its windows to every rank of the domain before the collective."
            ) in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS, ids=["sim", "shm"])
def test_host_broadcast_root_is_a_group_rank(backend):
    # Domain {1, 2, 3}: root=1 is group rank 1, world rank 2; rank 0 is not in the domain.
    @pl.program
    class Bcast:
        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[P, R, C], pl.FP32], y: pl.Out[pl.Tensor[[P, R, C], pl.FP32]]):
            data = pld.alloc_window_buffer([R, C], dtype=pl.FP32)
            sig = pld.alloc_window_buffer([3, 1], dtype=pl.INT32)
            w = pld.window(data, [R, C], dtype=pl.FP32)
            for r in pl.range(1, 4):
                pub(x[r], w, device=r)
            pub(x[0], pld.window(pld.alloc_window_buffer([R, C], dtype=pl.FP32), [R, C], dtype=pl.FP32),
                     device=0)
            w = pld.tensor.broadcast(w, pld.window(sig, [3, 1], dtype=pl.INT32), root=1)
            pld.tensor.barrier(pld.window(sig, [3, 1], dtype=pl.INT32))
            for r in pl.range(1, 4):
                con(y[r], w, device=r)
            return y

    x = np.arange(P * R * C, dtype=np.float32).reshape(P, R, C)
    y = np.zeros_like(x)
    compiled_for(Bcast, backend)(x, y)
    np.testing.assert_array_equal(y[0], 0)
    np.testing.assert_array_equal(y[1:], np.broadcast_to(x[2], (3, R, C)))
