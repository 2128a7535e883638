"""A program's answer does not depend on timing, the backend or the path: the Python state its code reads.

Each dispatch's ranks see the driver's state as it is when the dispatch starts (module globals,
closure cells, module attributes, tensors changed in place, sys.path), and what a rank's code changes
there is refused on every backend.  The shm backend keeps a program's ranks between one-shot calls
and closes them after ``KEPT_IDLE_S`` idle: a call made while they are kept must give what a call
made after they were closed gives.  The test that passes the idle limit shortens it and waits for the
event (the timer closed the group), polling with a deadline: nothing sleeps to let things settle.
"""

from __future__ import annotations

import sys
import time
import types

import numpy as np
import pytest
from conftest import on_every_rank
from test_mpi import MPIRUN, _mpirun

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig
from ptodist.backends import shm
from ptodist.errors import DispatchStateError, KernelStateError, UsageError

NR = pl.dynamic("NR")
SCALE = 1.0
TABLE = None  # a module-level tensor (torch) set by a test
calls = 0
settings = types.SimpleNamespace(offset=0.0)  # a module-level object whose attribute a test changes


def cfg(backend: str, nr: int = 2) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend)


@pl.jit.incore
def scale_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), SCALE), [0, 0], y)


scale_all = on_every_rank(scale_kernel, name="scale_all")


def ones(nr: int = 2) -> np.ndarray:
    return np.ones((nr, 1, 4), np.float32)


@pytest.fixture
def restore(monkeypatch):
    """Module state the tests change goes back afterwards."""
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 1.0)
    monkeypatch.setattr(sys.modules[__name__], "calls", 0)
    monkeypatch.setattr(settings, "offset", 0.0)
    return monkeypatch


# -- the driver's state, read when the dispatch starts ----------------------------------------------

@pytest.mark.parametrize("pause", [False, True], ids=["kept", "after-idle"])
@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_constant_changed_between_calls_gives_the_same_answer_kept_or_after_the_idle_limit(backend, pause,
                                                                                            restore):
    compiled = scale_all.compile(config=cfg(backend))
    if pause:
        restore.setattr(shm.kept, "KEPT_IDLE_S", 0.01)  # the idle limit, shortened: the pause is waited for, not slept
    first = compiled(ones())
    restore.setattr(sys.modules[__name__], "SCALE", 3.0)
    if pause:
        deadline = time.monotonic() + 30
        while shm.kept._KEPT.groups:  # the kept ranks are closed by the idle timer
            assert time.monotonic() < deadline, "the idle kept group was not closed"
            time.sleep(0.01)
    second = compiled(ones())
    assert (first == 1).all() and (second == 3).all(), (first.ravel(), second.ravel())


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_direct_kernel_call_reads_the_constant_of_its_call(backend, restore):
    x, config = np.ones((1, 4), np.float32), RunConfig(backend=backend)
    assert (scale_kernel(x, np.zeros((1, 4), np.float32), config=config) == 1).all()
    restore.setattr(sys.modules[__name__], "SCALE", -2.0)
    assert (scale_kernel(x, np.zeros((1, 4), np.float32), config=config) == -2).all()


@pl.jit.incore
def table_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.add(pl.load(x, [0, 0], [1, 4]), float(TABLE[0]) + settings.offset), [0, 0], y)


def test_a_tensor_changed_in_place_and_an_attribute_set_reach_kept_ranks(restore, torch):
    restore.setattr(sys.modules[__name__], "TABLE", torch.zeros(4))
    x, config = np.ones((1, 4), np.float32), RunConfig(backend="shm")
    compiled = table_kernel.compile(x, np.zeros((1, 4), np.float32), config=config)
    assert (compiled(x) == 1).all()
    TABLE.add_(5.0)  # in place: the same object, its version counter moved
    assert (compiled(x) == 6).all()
    settings.offset = 10.0  # an attribute of a module-level object of the program's own
    assert (compiled(x) == 16).all()


def make_program(factor: float):
    """A program factory: the kernel closes over ``factor``, which ``set_factor`` rebinds."""

    @pl.jit.incore
    def kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), factor), [0, 0], y)

    def set_factor(value: float) -> None:
        nonlocal factor
        factor = value

    return kernel, set_factor


def test_a_closure_cell_changed_between_calls_reaches_kept_ranks():
    kernel, set_factor = make_program(2.0)
    x, config = np.ones((1, 4), np.float32), RunConfig(backend="shm")
    compiled = kernel.compile(x, np.zeros((1, 4), np.float32), config=config)
    assert (compiled(x) == 2).all()
    set_factor(7.0)
    assert (compiled(x) == 7).all()


helpers = types.ModuleType("program_state_helpers")  # a module whose attribute is monkeypatched
helpers.bias = lambda: 0.0


@pl.jit.incore
def patched_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.add(pl.load(x, [0, 0], [1, 4]), helpers.bias()), [0, 0], y)


def test_a_monkeypatched_module_attribute_reaches_kept_ranks(monkeypatch):
    x, config = np.ones((1, 4), np.float32), RunConfig(backend="shm")
    compiled = patched_kernel.compile(x, np.zeros((1, 4), np.float32), config=config)
    assert (compiled(x) == 1).all()
    monkeypatch.setattr(helpers, "bias", lambda: 4.0)
    assert (compiled(x) == 5).all()


ROWS = 2


@pl.jit.incore
def fill_kernel(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], rows: pl.Scalar[pl.INT32]):
    pl.store(pl.full([1, 4], float(rows), pl.FP32), [0, 0], y)


@pl.jit
def fill_rank(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], rows: pl.Scalar[pl.INT32]):
    fill_kernel(y, rows)


@pl.jit.host
def fill_all(y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        fill_rank(y[r], ROWS, device=r)  # the host orchestrator reads the global: the plan holds its value


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_plan_made_from_a_global_is_made_again_when_it_changes(backend, monkeypatch):
    compiled = fill_all.compile(config=cfg(backend))
    y = np.zeros((2, 1, 4), np.float32)
    compiled(y)
    assert (y == 2).all()
    monkeypatch.setattr(sys.modules[__name__], "ROWS", 3)
    compiled(y)
    assert (y == 3).all()


# -- what a rank's code changes is refused, the same on every backend -------------------------------------

@pl.jit.incore
def counting_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    global calls
    calls += 1
    pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), float(calls)), [0, 0], y)


@pl.jit.incore
def drawing_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.add(pl.load(x, [0, 0], [1, 4]), float(np.random.rand())), [0, 0], y)


@pytest.mark.parametrize("backend", ["shm", "sim"])
@pytest.mark.parametrize("kernel, changed", [(counting_kernel, "calls"), (drawing_kernel, "np")],
                         ids=["counter", "numpy-random"])
def test_state_a_rank_changes_is_refused_on_every_call_and_backend(backend, kernel, changed, restore):
    x, config = np.ones((1, 4), np.float32), RunConfig(backend=backend)
    compiled = kernel.compile(x, np.zeros((1, 4), np.float32), config=config)
    for _ in range(2):  # kept ranks or fresh ones: refused alike
        with pytest.raises(RankError) as info:
            compiled(x)
        error = info.value.original
        assert isinstance(error, KernelStateError), info.value
        assert f"the rank's code changed Python state the program reads: '{__name__}.{changed}' (read by " \
               f"{kernel.name} ({__file__}:" in str(error)
        assert "Pass what a kernel needs as arguments" in str(error)
    assert shm.kept._KEPT.groups == {}, "ranks whose state changed must not be kept"


# -- a DistributedWorker keeps the state it was started with ---------------------------------------

@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_worker_refuses_a_dispatch_after_the_state_changed_and_runs_again_once_restored(backend, restore):
    x = ptodist.shared_array((2, 1, 4))
    x[...] = 1
    compiled = scale_all.compile(x, config=cfg(backend))
    with compiled.prepare() as rt:
        assert (rt(x) == 1).all()
        restore.setattr(sys.modules[__name__], "SCALE", 5.0)
        with pytest.raises(DispatchStateError) as info:
            rt(x)
        assert str(info.value).startswith(
            f"scale_all: dispatch refused: Python state the program reads changed since prepare() started the "
            f"worker's ranks: '{__name__}.SCALE' (read by scale_kernel ({__file__}:")
        assert "restoring the old value makes this worker usable again" in str(info.value)
        restore.setattr(sys.modules[__name__], "SCALE", 1.0)
        assert (rt(x) == 1).all()


def test_a_worker_runs_on_when_a_global_is_rebound_to_an_equal_value(restore):
    x = ptodist.shared_array((2, 1, 4))
    x[...] = 1
    with scale_all.compile(x, config=cfg("shm")).prepare() as rt:
        assert (rt(x) == 1).all()
        restore.setattr(sys.modules[__name__], "SCALE", float("1.0"))  # another object, the same value
        assert (rt(x) == 1).all()
        assert (rt(x) == 1).all()


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_worker_whose_rank_changed_the_state_runs_nothing_more(backend, restore):
    x = ptodist.shared_array((1, 4))
    compiled = counting_kernel.compile(x, np.zeros((1, 4), np.float32), config=RunConfig(backend=backend))
    with compiled.prepare() as rt:
        with pytest.raises(RankError) as info:
            rt(x)
        assert isinstance(info.value.original, KernelStateError)
        with pytest.raises(UsageError, match="the code of dispatch 0 changed Python state the program reads"):
            rt(x)


@pl.jit.incore
def count_then_fail(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    global calls
    calls += 1
    raise ValueError("failed after counting")


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_a_rank_that_changed_the_state_then_failed_says_so_and_its_worker_runs_nothing_more(backend, restore):
    x = ptodist.shared_array((1, 4))
    compiled = count_then_fail.compile(x, np.zeros((1, 4), np.float32), config=RunConfig(backend=backend))
    with compiled.prepare() as rt:
        with pytest.raises(RankError) as info:
            rt(x)
        assert "failed after counting (before it failed, the rank's code also changed Python state the program " \
               f"reads: '{__name__}.calls')" in str(info.value)
        with pytest.raises(UsageError, match="the code of dispatch 0 changed Python state the program reads"):
            rt(x)


def test_a_chip_worker_starts_fresh_ranks_when_the_state_changed(restore):
    from ptodist.runtime.chip_worker import ChipWorker

    x = np.ones((1, 4), np.float32)
    compiled = scale_kernel.compile(x, np.zeros((1, 4), np.float32), config=RunConfig(backend="shm"))
    with ChipWorker(RunConfig(backend="shm")) as w:
        assert (w.run(compiled, x) == 1).all()
        restore.setattr(sys.modules[__name__], "SCALE", 6.0)
        assert (w.run(compiled, x) == 6).all()


# -- the same under mpirun -------------------------------------------------------------------------------

MPI_SCRIPT = """
import sys
import numpy as np
import ptodist.language as pl
from ptodist import RankError, RunConfig

SCALE = 1.0
calls = 0

@pl.jit.incore
def kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), SCALE), [0, 0], y)

@pl.jit.incore
def counting(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    global calls
    calls += 1
    pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], y)

x = np.ones((1, 4), np.float32)
first = kernel(x, np.zeros((1, 4), np.float32), config=RunConfig())
SCALE = 3.0
second = kernel(x, np.zeros((1, 4), np.float32), config=RunConfig())
try:
    counting(x, np.zeros((1, 4), np.float32), config=RunConfig())
    refused = "no"
except RankError as e:
    refused = type(e.original).__name__
print("RESULT", first[0, 0], second[0, 0], refused, flush=True)
"""


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun on this machine")
def test_under_mpirun_a_call_reads_the_state_of_its_call_and_a_rank_change_is_refused(tmp_path):
    script = tmp_path / "program_state.py"
    script.write_text(MPI_SCRIPT)
    proc = _mpirun(1, [sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "RESULT 1.0 3.0 KernelStateError" in proc.stdout, proc.stdout + proc.stderr[-4000:]


@pl.jit.incore
def tile_random_kernel(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.random(1, 2, 0, 0, 0, 0, [1, 4], dtype=pl.INT32)  # pl.random: not numpy's generator
    pl.store(pl.add(pl.load(x, [0, 0], [1, 4]), float(np.float32(0))), [0, 0], y)


def test_drawing_from_numpy_in_the_driver_does_not_stale_a_worker_whose_kernel_uses_pl_random():
    # The kernel names np and random, but never np.random: the attribute chains decide what it reads.
    x = ptodist.shared_array((1, 4))
    compiled = tile_random_kernel.compile(x, np.zeros((1, 4), np.float32), config=RunConfig(backend="shm"))
    with compiled.prepare() as rt:
        rt(x)
        np.random.rand(3)
        rt(x)
