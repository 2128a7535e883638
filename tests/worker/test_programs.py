"""End-to-end programs on the real ``shm`` backend: both program forms, every way to call them, and
the errors a rank reports.

Each run is small (P = 2 or 3, a few dozen elements) so the file stays fast.
"""

from __future__ import annotations

import json
import re
import warnings

import ml_dtypes
import numpy as np
import pytest
from conftest import on_every_rank, source_line

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir
from ptodist.errors import (
    DispatchTypeError,
    DispatchValueError,
    KernelIndexError,
    PitfallWarning,
    ProgramTypeError,
    RankError,
)

SIZE = 16
NR = pl.dynamic("NR")


def cfg(*device_ids: int, **kw) -> RunConfig:
    return RunConfig(platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(device_ids)), **kw)


# ---------------------------------------------------------------------------
# Decorator form: y[r] = x[r] + r
# ---------------------------------------------------------------------------


@pl.jit.incore
def add_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
             rank: pl.Scalar[pl.INT32]):
    tile = pl.load(x, [0, 0], [1, SIZE])
    tile = pl.add(tile, pl.cast(rank, target_type=pl.FP32))
    return pl.store(tile, [0, 0], y)


@pl.jit
def hello_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
               rank: pl.Scalar[pl.INT32]):
    return add_rank(x, y, rank)


@pl.jit.host
def hello(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        hello_rank(x[r], y[r], r, device=r)
    return y


def hello_expected(x):
    nr = x.shape[0]
    if isinstance(x, np.ndarray):
        return x + np.arange(nr, dtype=x.dtype).reshape(nr, 1, 1)
    import torch  # a torch tensor: torch is installed

    return x + torch.arange(nr, dtype=x.dtype).view(nr, 1, 1)


def test_decorator_form_compile_then_call_in_place(torch):
    x = torch.randn(2, 1, SIZE)
    y = torch.zeros(2, 1, SIZE)
    compiled = hello.compile(x, y, config=cfg(0, 1))
    assert isinstance(compiled, ptodist.CompiledProgram)
    out = compiled(x, y)
    assert torch.equal(y, hello_expected(x))
    assert out is y  # in-place form returns the caller's output tensor
    # The compiled program runs again with new data.
    x2 = torch.randn(2, 1, SIZE)
    compiled(x2, y)
    assert torch.equal(y, hello_expected(x2))


def test_calling_the_host_directly_with_config_compiles_and_runs(torch):
    x = torch.randn(3, 1, SIZE)
    y = torch.zeros(3, 1, SIZE)
    hello(x, y, config=cfg(0, 1, 2))
    assert torch.equal(y, hello_expected(x))


def test_inputs_only_form_creates_and_returns_torch_outputs(torch):
    x = torch.randn(2, 1, SIZE)
    y = hello(x, config=cfg(0, 1))
    assert isinstance(y, torch.Tensor)
    assert y.dtype == torch.float32 and tuple(y.shape) == (2, 1, SIZE)
    assert torch.equal(y, hello_expected(x))


def test_numpy_in_numpy_out():
    x = np.random.default_rng(0).standard_normal((2, 1, SIZE)).astype(np.float32)
    compiled = hello.compile(x, config=cfg(0, 1))
    y = compiled(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_array_equal(y, hello_expected(x))
    y2 = np.zeros_like(x)
    compiled(x, y2)
    np.testing.assert_array_equal(y2, hello_expected(x))


def test_non_contiguous_host_output_is_written_back(torch):
    x = torch.randn(2, 1, SIZE)
    backing = torch.zeros(2, 1, SIZE * 2)
    y = backing[:, :, ::2]
    assert not y.is_contiguous()
    hello(x, y, config=cfg(0, 1))
    assert torch.equal(backing[:, :, ::2], hello_expected(x))
    assert (backing[:, :, 1::2] == 0).all()


def test_non_contiguous_output_that_requires_grad_is_written_back(torch):
    # A leaf that requires grad refuses copy_ under autograd: it failed only after the whole run.
    x = torch.randn(2, 1, SIZE)
    y = torch.zeros(SIZE, 1, 2).permute(2, 1, 0).requires_grad_()
    assert y.is_leaf and not y.is_contiguous()
    hello(x, y, config=cfg(0, 1))
    assert torch.equal(y.detach(), hello_expected(x))


def count_runs(monkeypatch) -> list:
    """Count the backend runs (a run starts the ranks) from now on."""
    from ptodist.backends.shm import ShmBackend

    runs = []
    real = ShmBackend.run

    def counted(self, *args, **kwargs):
        runs.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ShmBackend, "run", counted)
    return runs


def test_one_slice_per_rank_runs_and_more_slices_than_ranks_runs_as_upstream_with_a_warning(torch, monkeypatch):
    runs = count_runs(monkeypatch)
    x, y = torch.randn(2, 1, SIZE), torch.zeros(2, 1, SIZE)
    hello(x, y, config=cfg(0, 1))  # P = 2, 2 slices: fine
    assert torch.equal(y, hello_expected(x))
    compiled = hello.compile(x, y, config=cfg(0, 1))
    compiled(x, y)
    assert torch.equal(y, hello_expected(x)) and len(runs) == 2
    # P = 2, 3 slices: NR binds to 3, 2 ranks run and slice 2 of y is left as it was, as upstream runs it.
    x3 = torch.randn(3, 1, SIZE)
    for i, call in enumerate((lambda y3: hello(x3, y3, config=cfg(0, 1)), lambda y3: compiled(x3, y3))):
        y3 = torch.full((3, 1, SIZE), -1.0)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            call(y3)
        assert torch.equal(y3[:2], hello_expected(x3)[:2]) and (y3[2] == -1).all()
        assert len(runs) == 3 + i
        if i:  # the same program and shapes: its plan is made once, and warns once
            continue
        msg = str(record[0].message)
        assert record[0].category is PitfallWarning
        assert msg.startswith(f"hello() parameter 'x' (declared pl.Tensor[[NR, 1, {SIZE}], pl.FP32] at "
                              f"{__file__}:{hello.line}): dimension 0 is pl.dynamic('NR') = 3, bound from the "
                              f"argument's shape [3, 1, {SIZE}], but the world has 2 ranks (len(device_ids) = 2, "
                              "device_ids [0, 1]).")
        assert f"(at {__file__}:{source_line(hello, 'hello_rank(x[r]')} for rank 0), so slice 2 of x is never " \
               "read or written (as upstream PyPTO runs it)" in msg
        assert msg.endswith("Pass one slice per rank (a leading dimension of 2), or run on 3 devices "
                            "(DistributedConfig(device_ids=[...]) with one device id per slice).")
    y3 = hello(x3, config=cfg(0, 1, 2))  # 3 slices on 3 ranks
    assert torch.equal(y3, hello_expected(x3))


def test_read_only_output_is_refused_before_the_run_and_read_only_input_is_fine(monkeypatch):
    runs = count_runs(monkeypatch)
    x = np.random.default_rng(1).standard_normal((2, 1, SIZE)).astype(np.float32)
    x.flags.writeable = False  # inputs are only read
    y = np.zeros((2, 1, SIZE), np.float32)
    hello(x, y, config=cfg(0, 1))
    np.testing.assert_array_equal(y, hello_expected(x))
    y.flags.writeable = False
    compiled = hello.compile(config=cfg(0, 1))
    for call in (lambda: hello(x, y, config=cfg(0, 1)), lambda: compiled(x, y)):
        with pytest.raises(DispatchTypeError) as info:  # it was numpy's ValueError, raised after the run
            call()
        assert str(info.value) == (
            f"hello() parameter 'y' (declared pl.Out[pl.Tensor[[NR, 1, {SIZE}], pl.FP32]] at {__file__}:"
            f"{hello.line}): the numpy array is read-only (its flags.writeable is False), but 'y' is an output "
            "(pl.Out) that the run writes its results into. Nothing was run. Pass a writable array, e.g. y.copy().")
    assert len(runs) == 1
    y2 = compiled(x, y.copy())
    np.testing.assert_array_equal(y2, hello_expected(x))


def test_one_source_runs_at_p2_and_p3_with_pl_dynamic(torch):
    for p in (2, 3):
        x = torch.randn(p, 1, SIZE)
        y = hello(x, config=cfg(*range(p)))
        assert torch.equal(y, hello_expected(x)), p


def test_device_ids_need_not_start_at_zero(torch):
    x = torch.randn(2, 1, SIZE)
    y = hello(x, config=cfg(6, 3))
    assert torch.equal(y, hello_expected(x))  # rank r is index r, whatever its device id


def test_output_dir_holds_a_dispatch_plan(torch):
    x = torch.randn(2, 1, SIZE)
    compiled = hello.compile(x, config=cfg(4, 7))
    compiled(x)
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert plan["program"] == "hello"
    assert plan["world_size"] == 2 and plan["device_ids"] == [4, 7]
    assert plan["windows"] == []
    assert [t["name"] for t in plan["host_tensors"]] == ["x", "y"]
    assert plan["host_tensors"][1] == {"name": "y", "shape": [2, 1, SIZE], "dtype": "FP32", "direction": "out"}
    assert [r["rank"] for r in plan["ranks"]] == [0, 1]
    assert [r["device_id"] for r in plan["ranks"]] == [4, 7]
    for r, rank in enumerate(plan["ranks"]):
        (task,) = rank["tasks"]
        assert task["function"] == "hello_rank"
        assert re.search(rf"test_programs.py:{source_line(hello, 'hello_rank(x[r]')}$", task["dispatched_at"])
        x_arg, y_arg, r_arg = task["args"]
        assert x_arg == {"kind": "host_tensor", "tensor": "x", "index": [r], "shape": [1, SIZE], "dtype": "FP32"}
        assert y_arg["tensor"] == "y" and y_arg["index"] == [r]
        assert r_arg == {"kind": "scalar", "value": r, "dtype": "INDEX"}


def test_wrong_argument_count_names_the_parameters(torch):
    compiled = hello.compile(config=cfg(0, 1))
    with pytest.raises(DispatchTypeError, match=r"hello: got 3 arguments; pass all 2 \(x, y\) or the 1 inputs"):
        compiled(torch.zeros(2, 1, SIZE), torch.zeros(2, 1, SIZE), torch.zeros(1))


def test_calling_with_other_device_ids_is_refused(torch):
    compiled = hello.compile(config=cfg(0, 1))
    with pytest.raises(DispatchValueError, match=r"called with device_ids \[0, 1, 2\] but compiled for \[0, 1\]"):
        compiled(torch.zeros(3, 1, SIZE), config=cfg(0, 1, 2))


def test_host_dtype_mismatch_names_parameter_and_both_dtypes(torch):
    with pytest.raises(DispatchTypeError, match=r"hello\(\) parameter 'x' \(declared pl.Tensor\[\[NR, 1, 16\], "
                                                r"pl.FP32\] at .*test_programs.py:\d+\): the host tensor is FP16, "
                                                r"the annotation says FP32"):
        hello(torch.zeros(2, 1, SIZE, dtype=torch.float16), config=cfg(0, 1))


# ---------------------------------------------------------------------------
# Class form, from a program factory (closure constants in annotations)
# ---------------------------------------------------------------------------


@pytest.fixture
def ring(torch):
    """programs/pypto_ring.py, the PyPTO script the cli tests run unmodified (it imports torch)."""
    import pypto_ring

    return pypto_ring


@pytest.mark.parametrize("nr", [2, 3])
def test_class_form_factory_with_ir_compile(torch, ring, nr):
    compiled = ir.compile(ring.make(nr), platform="a2a3sim",
                          distributed_config=DistributedConfig(device_ids=list(range(nr))))
    x = torch.randn(nr, 1, ring.SIZE)
    y = compiled(x)
    assert torch.equal(y, torch.roll(x, 1, 0))


def test_class_form_plan_lists_windows_ranks_and_tasks(torch, ring):
    compiled = ir.compile(ring.make(2), platform="a2a3", distributed_config=DistributedConfig(device_ids=[0, 1]))
    x = torch.randn(2, 1, ring.SIZE)
    y = torch.zeros(2, 1, ring.SIZE)
    compiled(x, y)
    assert torch.equal(y, torch.roll(x, 1, 0))
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert plan["program"] == "Ring"
    assert [(w["name"], w["nbytes"]) for w in plan["windows"]] == [("dbuf", ring.SIZE * 4), ("sbuf", 2 * 4)]
    assert plan["windows"][1]["offset"] >= plan["windows"][0]["offset"] + ring.SIZE * 4
    assert all("pypto_ring.py:" in w["defined_at"] for w in plan["windows"])
    for rank in plan["ranks"]:
        (task,) = rank["tasks"]
        assert task["function"] == "chip"
        kinds = [a["kind"] for a in task["args"]]
        assert kinds == ["host_tensor", "host_tensor", "window", "window"]
        assert task["args"][3] == {"kind": "window", "buffer": "sbuf", "shape": [2, 1], "dtype": "INT32"}


def test_compiled_output_dir_option(torch, ring):
    compiled = ir.compile(ring.make(2), distributed_config=DistributedConfig(device_ids=[0, 1]),
                          output_dir=None)
    compiled(torch.randn(2, 1, ring.SIZE))
    assert (compiled.output_dir / "dispatch_plan.json").is_file()


def test_run_config_output_dir_is_used(torch, tmp_path):
    out = tmp_path / "my_out"
    x = torch.randn(2, 1, SIZE)
    compiled = hello.compile(x, config=cfg(0, 1, output_dir=str(out)))
    compiled(x)
    assert compiled.output_dir == out
    assert json.loads((out / "dispatch_plan.json").read_text())["world_size"] == 2


# ---------------------------------------------------------------------------
# Element types: BF16, FP16, INT32 tensors in and out
# ---------------------------------------------------------------------------


def make_affine(dtype):
    """y[r] = x[r] * 2 + r, in ``dtype`` throughout."""

    @pl.jit.incore
    def affine(x: pl.Tensor[[2, 8], dtype], y: pl.Out[pl.Tensor[[2, 8], dtype]], r: pl.Scalar[pl.INT32]):
        t = pl.load(x, [0, 0], [2, 8])
        t = pl.add(pl.mul(t, 2), pl.cast(r, target_type=dtype))
        return pl.store(t, [0, 0], y)

    return on_every_rank(affine)


@pytest.mark.parametrize("dtype, torch_dtype_name", [
    (pl.BF16, "bfloat16"), (pl.FP16, "float16"), (pl.INT32, "int32"),
])
def test_torch_tensors_of_each_dtype(torch, dtype, torch_dtype_name):
    torch_dtype = getattr(torch, torch_dtype_name)
    host = make_affine(dtype)
    x = torch.arange(-16, 16).reshape(2, 2, 8).to(torch_dtype)
    expected = x * 2 + torch.arange(2).view(2, 1, 1).to(torch_dtype)
    y = host(x, config=cfg(0, 1))  # inputs only: the output is created in x's dtype
    assert y.dtype == torch_dtype
    assert torch.equal(y, expected)
    y2 = torch.zeros_like(x)
    host(x, y2, config=cfg(0, 1))  # in place
    assert torch.equal(y2, expected)


@pytest.mark.parametrize("dtype, np_dtype", [
    (pl.BF16, ml_dtypes.bfloat16), (pl.FP16, np.float16), (pl.INT32, np.int32),
])
def test_numpy_arrays_of_each_dtype(dtype, np_dtype):
    host = make_affine(dtype)
    x = np.arange(-16, 16).reshape(2, 2, 8).astype(np_dtype)
    y = host(x, config=cfg(0, 1))
    assert isinstance(y, np.ndarray) and y.dtype == np_dtype
    np.testing.assert_array_equal(y.astype(np.float32),
                                  x.astype(np.float32) * 2 + np.arange(2).reshape(2, 1, 1))


# ---------------------------------------------------------------------------
# Errors raised inside a rank
# ---------------------------------------------------------------------------


@pl.jit.incore
def store_into_input(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Tensor[[1, SIZE], pl.FP32]):
    t = pl.load(x, [0, 0], [1, SIZE])
    pl.store(t, [0, 0], y)


@pl.jit
def store_into_input_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    store_into_input(x, y)


@pl.jit.host
def store_into_input_host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        store_into_input_rank(x[r], y[r], device=r)


def test_kernel_writing_its_input_parameter_is_an_error(torch):
    x = torch.ones(2, 1, SIZE)
    y = torch.zeros(2, 1, SIZE)
    with pytest.raises(RankError) as info:
        store_into_input_host(x, y, config=cfg(0, 1))
    e = info.value
    assert e.task == "store_into_input"
    assert isinstance(e.original, ProgramTypeError)
    msg = str(e)
    store_line = source_line(store_into_input, "pl.store(")
    decl_line = store_into_input.line
    assert f"pl.store at {__file__}:{store_line}" in msg
    assert (f"tensor 'y[0]' [1, {SIZE}] FP32 is read-only: it is parameter 'y' of kernel 'store_into_input' "
            f"({__file__}:{decl_line}), declared pl.Tensor[[1, {SIZE}], pl.FP32], an input") in msg
    assert "pl.Out[...] or pl.InOut[...]" in msg
    assert (y == 0).all()  # nothing was written


@pl.jit.incore
def store_into_host_input(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], y)


@pl.jit
def store_into_host_input_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    store_into_host_input(y, x)  # arguments swapped: the kernel's output is the host's input


@pl.jit.host
def store_into_host_input_host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32],
                               y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        store_into_host_input_rank(x[r], y[r], device=r)


def test_writing_a_host_input_through_an_out_parameter_is_an_error(torch):
    x = torch.ones(2, 1, SIZE)
    with pytest.raises(RankError) as info:
        store_into_host_input_host(x, torch.zeros(2, 1, SIZE), config=cfg(0, 1))
    msg = str(info.value)
    assert f"pl.store at {__file__}:{source_line(store_into_host_input, 'pl.store(')}" in msg
    decl = source_line(store_into_host_input_host, "def store_into_host_input_host(")
    assert (f"tensor 'x[0]' [1, {SIZE}] FP32 is read-only: it is parameter 'x' of host orchestrator "
            f"'store_into_host_input_host' ({__file__}:{decl}), declared pl.Tensor[[NR, 1, {SIZE}], pl.FP32], an "
            "input") in msg
    assert "annotate it pl.Out[...] or pl.InOut[...] where it is declared" in msg
    assert (x == 1).all()


@pl.jit.incore
def load_out_of_bounds(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    t = pl.load(x, [0, 4], [1, SIZE])
    return pl.store(t, [0, 0], y)


load_out_of_bounds_host = on_every_rank(load_out_of_bounds)


def test_out_of_bounds_load_names_tensor_offsets_shape_and_bounds(torch):
    with pytest.raises(RankError) as info:
        load_out_of_bounds_host(torch.ones(2, 1, SIZE), config=cfg(3, 5))
    e = info.value
    assert isinstance(e.original, KernelIndexError) and isinstance(e.original, IndexError)
    first = str(e).splitlines()[0]
    line = source_line(load_out_of_bounds, "pl.load(")
    assert first.startswith("rank 0 (device 3) failed in task 'load_out_of_bounds': KernelIndexError: ")
    assert f"pl.load at {__file__}:{line}" in first
    assert "tensor 'x[0]' [1, 16] FP32" in first
    assert "offsets [0, 4] with shape [1, 16]" in first
    assert "reach [4, 20) in dimension 1, whose bounds are [0, 16)" in first


@pl.jit.incore
def fail_on_rank_one(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                     r: pl.Scalar[pl.INT32]):
    if r == 1:
        raise RuntimeError("user bug on rank one")
    return pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], y)


fail_on_rank_one_host = on_every_rank(fail_on_rank_one)


def test_rank_error_carries_rank_device_task_and_user_line(torch):
    with pytest.raises(RankError) as info:
        fail_on_rank_one_host(torch.ones(3, 1, SIZE), config=cfg(10, 20, 30))
    e = info.value
    assert (e.rank, e.device_id, e.task) == (1, 20, "fail_on_rank_one")
    assert len(e.failures) == 1
    assert isinstance(e.original, RuntimeError) and str(e.original) == "user bug on rank one"
    msg = str(e)
    assert msg.startswith("rank 1 (device 20) failed in task 'fail_on_rank_one': RuntimeError: user bug on rank one")
    raise_line = source_line(fail_on_rank_one, "raise RuntimeError")
    assert f'File "{__file__}", line {raise_line}, in fail_on_rank_one' in msg
    assert 'raise RuntimeError("user bug on rank one")' in msg
    assert "ptodist/runtime" not in msg and "ptodist/backends" not in msg  # only the user's frames
    assert isinstance(e, ptodist.PtodistError)


@pl.jit.incore
def wants_window_kernel(x: pl.Tensor[[1, SIZE], pl.FP32],
                        data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]]):
    pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)


@pl.jit
def passes_plain_to_window(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
    wants_window_kernel(x, y)


@pl.jit.host
def passes_plain_to_window_host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32],
                                y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        passes_plain_to_window(x[r], y[r], device=r)


def test_plain_tensor_given_to_a_kernel_window_parameter(torch):
    with pytest.raises(RankError) as info:
        passes_plain_to_window_host(torch.ones(2, 1, SIZE), config=cfg(0, 1))
    e = info.value
    assert isinstance(e.original, ProgramTypeError)
    assert e.task == "passes_plain_to_window"  # the kernel call was refused: the orchestration was running
    msg = str(e).splitlines()[0]
    call_line = source_line(passes_plain_to_window, "wants_window_kernel(x, y)")
    assert (f"wants_window_kernel() parameter 'data' (declared pl.InOut[pld.DistributedTensor[[1, {SIZE}], "
            f"pl.FP32]] at {__file__}:{wants_window_kernel.line + 1}), called at {__file__}:{call_line}") in msg
    assert f"expected pld.DistributedTensor (a window-bound tensor) but got a tensor (pl.Tensor[1, {SIZE}] FP32)" \
        in msg


def make_left_neighbour(fixed: bool):
    @pl.jit.incore
    def left(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]]):
        ctx = pld.get_comm_ctx(data)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        peer = (me - 1 + n) % n if fixed else (me - 1) % n
        return pl.store(pld.tile.remote_load(data, peer, [0, 0], [1, SIZE]), [0, 0], y)

    return left, on_every_rank(left)


def test_negative_neighbour_under_truncated_modulo_names_value_and_fix():
    left, host = make_left_neighbour(fixed=False)
    with pytest.raises(RankError) as info:
        host(np.zeros((3, 1, SIZE), np.float32), config=cfg(0, 1, 2))
    e = info.value
    assert (e.rank, e.task) == (0, "left")  # only rank 0 computes (0 - 1) % 3 == -1
    msg = str(e).splitlines()[0]
    assert f"pld.tile.remote_load at {__file__}:{source_line(left, 'pld.tile.remote_load')}" in msg
    assert "peer -1 is outside [0, 3) (rank 0, world 3)" in msg
    assert "integer % truncates toward zero on the device, so (r - 1) % n is -1 for r = 0. Write (r - 1 + n) % n." \
        in msg
    _, fixed_host = make_left_neighbour(fixed=True)
    fixed_host(np.zeros((3, 1, SIZE), np.float32), config=cfg(0, 1, 2))  # the fix runs cleanly
