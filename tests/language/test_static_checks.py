"""Static pitfalls (SPEC §8.2 and the static rows of §8.1/§8.3) are reported before any rank starts.

An autouse fixture replaces the backend's ``run`` with one that fails the
test, so every error asserted here provably comes from the compiler's checks,
never from a rank.  Messages are checked for what went wrong, where (function,
parameter, file:line), why, and the fix.
"""

from __future__ import annotations

import inspect
import json
import re
import warnings

import numpy as np
import pytest
from conftest import source_line

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir
from ptodist.backends.shm import ShmBackend
from ptodist.errors import (
    ConfigError,
    DispatchTypeError,
    PitfallWarning,
    ProgramError,
    ProgramIndexError,
    ProgramTypeError,
    ProgramValueError,
    ShapeError,
    TaskArgsError,
)

NR = pl.dynamic("NR")
FILE = __file__


@pytest.fixture(autouse=True)
def no_rank_may_start(monkeypatch):
    def refuse(self, plan, host_arrays, config, dfx=None, **kwargs):
        raise AssertionError("the backend was asked to start ranks: the check must fire before that")

    monkeypatch.setattr(ShmBackend, "run", refuse)


def cfg(*device_ids: int) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(device_ids)))


def zeros(*shape, dtype=np.float32):
    return np.zeros(shape, dtype=dtype)


# ---------------------------------------------------------------------------
# §8.2: a scalar parameter before a tensor parameter
# ---------------------------------------------------------------------------


@pl.jit.incore
def good_kernel(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], r: pl.Scalar[pl.INT32]):
    pass


@pl.jit
def scalar_first_rank(r: pl.Scalar[pl.INT32], x: pl.Tensor[[1, 8], pl.FP32],
                      y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
    good_kernel(x, y, r)


@pl.jit.host
def scalar_first_host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        scalar_first_rank(r, x[r], y[r], device=r)


def test_scalar_before_tensor_in_the_dispatched_function_decorator_form():
    with pytest.raises(TaskArgsError) as info:
        scalar_first_host.compile(config=cfg(0, 1))
    msg = str(info.value)
    assert isinstance(info.value, TypeError)
    assert msg.startswith("TaskArgs: cannot add tensor after scalar: ")
    assert f"in orchestration 'scalar_first_rank' ({FILE}:{scalar_first_rank.line})" in msg
    assert "tensor parameter 'x' comes after scalar parameter 'r'" in msg
    assert "the runtime packs a dispatched function's arguments tensors first, then scalars" in msg
    assert "move the scalar parameters ('r', ...) after the tensor parameters, and the arguments likewise" in msg


def test_scalar_before_tensor_is_found_when_calling_the_host_directly():
    with pytest.raises(TaskArgsError, match=r"^TaskArgs: cannot add tensor after scalar: in orchestration "
                                            r"'scalar_first_rank'"):
        scalar_first_host(zeros(2, 1, 8), config=cfg(0, 1))


def make_class_program():
    @pl.program
    class ScalarFirstChip:
        @pl.function(type=pl.FunctionType.InCore)
        def kernel(self, y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], r: pl.Scalar[pl.INT32]):
            pass

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, r: pl.Scalar[pl.INT32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
            self.kernel(y, r)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                self.chip(r, y[r], device=r)

    return ScalarFirstChip


def test_scalar_before_tensor_class_form():
    prog = make_class_program()
    with pytest.raises(TaskArgsError) as info:
        ir.compile(prog, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=[0, 1]))
    msg = str(info.value)
    assert msg.startswith("TaskArgs: cannot add tensor after scalar: ")
    assert re.search(rf"in orchestration 'chip' \({re.escape(FILE)}:\d+\), tensor parameter 'y' comes after scalar "
                     r"parameter 'r'", msg), msg


# ---------------------------------------------------------------------------
# §8.2: dispatch coverage and device= range
# ---------------------------------------------------------------------------


@pl.jit
def copy_rank(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
    pass


@pl.jit.host
def dispatches_two(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(2):
        copy_rank(x[r], y[r], device=r)


def test_dispatch_loop_shorter_than_the_world_names_the_missing_ranks():
    with pytest.raises(ProgramError) as info:
        dispatches_two(zeros(4, 1, 8), config=cfg(0, 1, 4, 5))
    msg = str(info.value)
    assert f"host orchestrator 'dispatches_two' ({FILE}:{dispatches_two.line})" in msg
    assert "dispatched ranks [0, 1] but never ranks [2, 3] (devices [4, 5])" in msg
    assert "world = len(device_ids) = 4" in msg
    assert "write `for r in pl.range(pld.world_size()):`" in msg


@pl.jit.host
def dispatches_nothing(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    pass


def test_host_that_dispatches_nothing():
    with pytest.raises(ProgramError, match=r"host orchestrator 'dispatches_nothing' \(.*\) dispatched nothing: "
                                           r"call the per-device function with device=r for every rank"):
        dispatches_nothing(zeros(2, 1, 8), config=cfg(0, 1))


@pl.jit.host
def dispatches_past_the_end(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank(x[r], y[r], device=r + 1)


def test_device_out_of_range_names_value_range_and_line():
    with pytest.raises(ProgramValueError) as info:
        dispatches_past_the_end(zeros(2, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    line = source_line(dispatches_past_the_end, "device=r + 1")
    assert msg.startswith(f"copy_rank(..., device=2) at {FILE}:{line}: ")
    assert "device= is a logical rank index and must be in [0, 2) (world = len(device_ids) = 2)" in msg
    assert "Loop with `for r in pl.range(pld.world_size())`" in msg


@pl.jit.host
def dispatches_by_device_id(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r, dev in enumerate([4, 5]):
        copy_rank(x[r], y[r], device=dev)


def test_device_given_as_a_device_id_is_explained():
    with pytest.raises(ProgramValueError, match=r"device=4\) at .*must be in \[0, 2\).*device ids \[4, 5\] are "
                                                r"mapped from rank indices"):
        dispatches_by_device_id(zeros(2, 1, 8), config=cfg(4, 5))


@pl.jit.host
def dispatches_without_device(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank(x[r], y[r])


def test_dispatch_without_device_goes_round_robin_over_the_chips():
    # Upstream's chip resolution: the k-th call without device= lands on chip k % P; no static error, and the
    # plan gives each rank one task (the backend is refused here: planning is what is checked).
    with pytest.raises(AssertionError, match="the backend was asked to start ranks"):
        dispatches_without_device(zeros(2, 1, 8), config=cfg(0, 1))
    compiled = dispatches_without_device.compile(zeros(2, 1, 8), config=cfg(0, 1))
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert [[t["function"] for t in r["tasks"]] for r in plan["ranks"]] == [["copy_rank"], ["copy_rank"]]


# ---------------------------------------------------------------------------
# §8.3 step 03: DistributedTensor vs Tensor
# ---------------------------------------------------------------------------


@pl.jit
def wants_plain(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
    pass


@pl.jit.host
def gives_window_to_plain(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        w = pld.window(buf, [1, 8], dtype=pl.FP32)
        wants_plain(w, y[r], device=r)


def test_window_given_to_a_tensor_parameter():
    with pytest.raises(ProgramTypeError) as info:
        gives_window_to_plain(zeros(2, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    call_line = source_line(gives_window_to_plain, "wants_plain(w")
    assert msg.startswith(f"wants_plain() parameter 'x' (declared pl.Tensor[[1, 8], pl.FP32] at "
                          f"{FILE}:{wants_plain.line}), called at {FILE}:{call_line}: ")
    assert "expected pl.Tensor but got a window (pld.DistributedTensor[1, 8] FP32)" in msg
    assert "Annotate the parameter as pld.DistributedTensor[...]" in msg


@pl.jit
def wants_window(x: pl.Tensor[[1, 8], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, 8], pl.FP32]]):
    pass


@pl.jit.host
def gives_plain_to_window(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        wants_window(x[r], y[r], device=r)


def test_tensor_given_to_a_distributed_tensor_parameter():
    with pytest.raises(ProgramTypeError) as info:
        gives_plain_to_window(zeros(2, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    assert msg.startswith("wants_window() parameter 'data' (declared pl.InOut[pld.DistributedTensor[[1, 8], "
                          "pl.FP32]]")
    assert "expected pld.DistributedTensor (a window-bound tensor) but got a tensor (pl.Tensor[1, 8] FP32)" in msg
    assert "pass pld.window(buf, shape, dtype=...) here" in msg


@pl.jit.host
def gives_scalar_to_tensor(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        wants_plain(r, y[r], device=r)


def test_scalar_given_to_a_tensor_parameter():
    with pytest.raises(ProgramTypeError, match=r"wants_plain\(\) parameter 'x' .*: expected a tensor, got a scalar "
                                               r"\(Scalar\(0, INDEX\)\)"):
        gives_scalar_to_tensor(zeros(2, 1, 8), config=cfg(0, 1))


@pl.jit.host
def gives_wrong_dtype(x: pl.Tensor[[NR, 1, 8], pl.INT32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        wants_plain(x[r], y[r], device=r)


def test_dtype_mismatch_at_dispatch():
    with pytest.raises(ProgramTypeError, match=r"wants_plain\(\) parameter 'x' .*: dtype mismatch: the argument is "
                                               r"INT32, the annotation says FP32"):
        gives_wrong_dtype(zeros(2, 1, 8, dtype=np.int32), config=cfg(0, 1))


# ---------------------------------------------------------------------------
# §8.1 / §8.3 step 07: hard-coded rank counts and pl.dynamic binding
# ---------------------------------------------------------------------------


@pl.jit.host
def hard_coded_four(x: pl.Tensor[[4, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank(x[r], y[r], device=r)


def test_host_shape_hard_coding_the_rank_count_suggests_pl_dynamic():
    with pytest.raises(ShapeError) as info:
        hard_coded_four(zeros(2, 1, 8), config=cfg(0, 1))
    e = info.value
    assert isinstance(e, ValueError)
    msg = str(e)
    assert msg.startswith(f"hard_coded_four() parameter 'x' (declared pl.Tensor[[4, 1, 8], pl.FP32] at "
                          f"{FILE}:{hard_coded_four.line})")
    assert "shape mismatch in dimension 0: the annotation [4, 1, 8] fixes it at 4, the argument has 2 " \
           "(shape [2, 1, 8])" in msg
    assert "The argument's size 2 is the world size: the annotation hard-codes a rank count" in msg
    assert 'Use NR = pl.dynamic("NR") for dimension 0 so one program runs at any P' in msg


def test_shape_mismatch_not_at_the_world_size_has_no_rank_hint():
    with pytest.raises(ShapeError) as info:
        hard_coded_four(zeros(4, 1, 6), config=cfg(0, 1, 2, 3))
    msg = str(info.value)
    assert "shape mismatch in dimension 2: the annotation [4, 1, 8] fixes it at 8, the argument has 6" in msg
    assert "pl.dynamic" not in msg


def test_shape_rank_count_mismatch_names_dims():
    with pytest.raises(ShapeError, match=r"parameter 'x' .*: the argument has shape \[4, 8\] \(2 dims\) but the "
                                         r"annotation \[4, 1, 8\] has 3 dims"):
        hard_coded_four(zeros(4, 8), config=cfg(0, 1, 2, 3))


def test_dynamic_name_bound_inconsistently_on_the_host():
    with pytest.raises(ShapeError) as info:
        dispatches_two(zeros(2, 1, 8), zeros(3, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    assert msg.startswith("dispatches_two() parameter 'y' (declared pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]")
    assert "dimension 0 is pl.dynamic('NR') = 3 here, but 'NR' was bound to 2 by dispatches_two() parameter 'x'" \
        in msg
    assert "all uses of one name must agree" in msg


# ---------------------------------------------------------------------------
# §8.1 / §8.3 step 07: a host tensor split per rank with more slices than ranks is warned about (upstream runs it)
# ---------------------------------------------------------------------------


@pl.jit.host
def split_per_rank(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank(x[r], y[r], device=r)


def more_slices_than_ranks_message(host, declared: str, size: str, fix: str) -> str:
    return (f"{host.name}() parameter 'x' (declared {declared} at {FILE}:{host.line}): dimension 0 is {size}, "
            "but the world has 2 ranks (len(device_ids) = 2, device_ids [0, 1]). The dispatch loop gives rank r "
            f"the slice x[r] (at {FILE}:{source_line(host, 'x[r]')} for rank 0), so slice 2 of x is never read "
            f"or written (as upstream PyPTO runs it). {fix}")


def test_more_per_rank_slices_than_ranks_is_warned_about_when_planning(torch):
    # 3 slices on a 2-rank world: NR binds to 3 and slice 2 is left out, as upstream runs it: a warning, no error.
    x, y = torch.randn(3, 1, 8), torch.zeros(3, 1, 8)
    with pytest.warns(PitfallWarning) as record:
        split_per_rank.compile(x, y, config=cfg(0, 1))
    w, w_y = [w for w in record if issubclass(w.category, PitfallWarning)]  # x, then y
    assert str(w.message) == more_slices_than_ranks_message(
        split_per_rank, "pl.Tensor[[NR, 1, 8], pl.FP32]",
        "pl.dynamic('NR') = 3, bound from the argument's shape [3, 1, 8]",
        "Pass one slice per rank (a leading dimension of 2), or run on 3 devices "
        "(DistributedConfig(device_ids=[...]) with one device id per slice).")
    assert (w.filename, w.lineno) == (FILE, split_per_rank.line)
    assert "parameter 'y'" in str(w_y.message)


def test_one_per_rank_slice_per_rank_plans(torch):
    compiled = split_per_rank.compile(torch.randn(2, 1, 8), torch.zeros(2, 1, 8), config=cfg(0, 1))
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert [[a["index"] for a in rank["tasks"][0]["args"]] for rank in plan["ranks"]] == [[[0], [0]], [[1], [1]]]


@pl.jit.host
def split_per_rank_fixed(x: pl.Tensor[[3, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[3, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank(x[r], y[r], device=r)


def test_per_rank_slices_fixed_by_the_annotation_suggest_pl_dynamic():
    # The annotation agrees with the argument (3 == 3), but it hard-codes a rank count the world does not have.
    with pytest.warns(PitfallWarning) as record:
        split_per_rank_fixed.compile(zeros(3, 1, 8), zeros(3, 1, 8), config=cfg(0, 1))
    assert str(record[0].message) == more_slices_than_ranks_message(
        split_per_rank_fixed, "pl.Tensor[[3, 1, 8], pl.FP32]",
        "fixed at 3 by the annotation [3, 1, 8] and the argument has 3 slices (shape [3, 1, 8])",
        "The annotation hard-codes a rank count: use NR = pl.dynamic(\"NR\") for dimension 0 so one program runs "
        "at any P, and pass one slice per rank (2).")


B = pl.dynamic("B")


@pl.jit
def takes_whole(x: pl.Tensor[[B, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[B, 1, 8], pl.FP32]]):
    pass


@pl.jit.host
def whole_to_every_rank(x: pl.Tensor[[B, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[B, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        takes_whole(x, y, device=r)


@pl.jit.host
def every_slice_to_every_rank(x: pl.Tensor[[B, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[B, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        for b in range(x.shape[0]):
            copy_rank(x[b], y[b], device=r)


@pytest.mark.parametrize("host", [whole_to_every_rank, every_slice_to_every_rank])
def test_a_dynamic_leading_dim_not_split_per_rank_may_differ_from_the_world(host):
    # Every slice reaches a rank: B is not the rank count, and B = 3 on 2 ranks is fine.
    compiled = host.compile(zeros(3, 1, 8), zeros(3, 1, 8), config=cfg(0, 1))
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert plan["host_tensors"][0]["shape"] == [3, 1, 8] and plan["world_size"] == 2


def test_fewer_per_rank_slices_than_ranks_names_the_world():
    with pytest.raises(ProgramIndexError) as info:
        split_per_rank(zeros(1, 1, 8), config=cfg(0, 1))
    assert str(info.value) == (
        f"x[1] at {FILE}:{source_line(split_per_rank, 'x[r]')}: index 1 is out of range for dimension 0 of host "
        "tensor 'x' (size 1). The host tensor has 1 slice along its leading dimension but the world has 2 ranks "
        "(len(device_ids) = 2): pass one slice per rank (a leading dimension of 2), or run on 1 device.")


# ---------------------------------------------------------------------------
# Outputs the run cannot write are refused at dispatch, not after the run
# ---------------------------------------------------------------------------


@pl.jit
def copy_rank_inout(x: pl.Tensor[[1, 8], pl.FP32], y: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
    pass


@pl.jit.host
def writes_inout(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.InOut[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank_inout(x[r], y[r], device=r)


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("host, role", [(split_per_rank, "pl.Out"), (writes_inout, "pl.InOut")])
@pytest.mark.parametrize("how", ["call", "compile", "compile then call"])
def test_read_only_numpy_output_is_refused_at_dispatch(host, role, how):
    x, y = zeros(2, 1, 8), read_only(zeros(2, 1, 8))
    with pytest.raises(DispatchTypeError) as info:
        if how == "call":
            host(x, y, config=cfg(0, 1))
        elif how == "compile":
            host.compile(x, y, config=cfg(0, 1))
        else:
            host.compile(config=cfg(0, 1))(x, y)
    assert isinstance(info.value, TypeError)
    assert str(info.value) == (
        f"{host.name}() parameter 'y' (declared {role}[pl.Tensor[[NR, 1, 8], pl.FP32]] at {FILE}:{host.line}): "
        f"the numpy array is read-only (its flags.writeable is False), but 'y' is an output ({role}) that the run "
        "writes its results into. Nothing was run. Pass a writable array, e.g. y.copy().")


def test_read_only_numpy_input_is_accepted():
    split_per_rank.compile(read_only(zeros(2, 1, 8)), zeros(2, 1, 8), config=cfg(0, 1))


def test_broadcast_numpy_output_is_refused_at_dispatch():
    y = np.broadcast_to(zeros(1, 1, 8), (2, 1, 8))  # numpy makes it read-only
    with pytest.raises(DispatchTypeError, match=r"^split_per_rank\(\) parameter 'y' .*: the numpy array is "
                                                r"read-only .* Pass a writable array, e.g. y.copy\(\)\.$"):
        split_per_rank(zeros(2, 1, 8), y, config=cfg(0, 1))


def test_expanded_torch_output_is_refused_at_dispatch(torch):
    # torch has no read-only tensors, but an expanded one cannot take a result per element: copy_ refuses it.
    y = torch.zeros(1, 1, 8).expand(2, 1, 8)
    with pytest.raises(DispatchTypeError) as info:
        split_per_rank(torch.zeros(2, 1, 8), y, config=cfg(0, 1))
    assert str(info.value) == (
        f"split_per_rank() parameter 'y' (declared pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]] at "
        f"{FILE}:{split_per_rank.line}): the torch tensor repeats one element along dimension 0 (stride 0, as "
        "expand() makes), so its 2 entries there share memory and cannot hold different results, but 'y' is an "
        "output (pl.Out) that the run writes its results into. Nothing was run. Pass a tensor with memory of its "
        "own, e.g. y.clone().")
    # An expanded input is fine: it is only read.
    split_per_rank.compile(torch.zeros(1, 1, 8).expand(2, 1, 8), torch.zeros(2, 1, 8), config=cfg(0, 1))


M = pl.dynamic("M")


@pl.jit
def two_windows(a: pl.InOut[pld.DistributedTensor[[M, 1], pl.INT32]],
                b: pl.InOut[pld.DistributedTensor[[M, 1], pl.INT32]]):
    pass


@pl.jit.host
def binds_m_twice(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    buf = pld.alloc_window_buffer([8, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        two_windows(pld.window(buf, [2, 1], dtype=pl.INT32), pld.window(buf, [3, 1], dtype=pl.INT32), device=r)


def test_dynamic_name_bound_inconsistently_at_dispatch():
    with pytest.raises(ShapeError) as info:
        binds_m_twice(zeros(2, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    assert msg.startswith("two_windows() parameter 'b' (declared pl.InOut[pld.DistributedTensor[[M, 1], pl.INT32]]")
    assert "dimension 0 is pl.dynamic('M') = 3 here, but 'M' was bound to 2 by two_windows() parameter 'a'" in msg


# ---------------------------------------------------------------------------
# §5.2 / §8.2: window sizes
# ---------------------------------------------------------------------------


@pl.jit
def takes_signal(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    pass


@pl.jit.host
def view_too_large(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    buf = pld.alloc_window_buffer(16)
    for r in pl.range(pld.world_size()):
        big = pld.window(buf, [4, 8], dtype=pl.FP32)
        takes_signal(big, device=r)


def test_window_view_larger_than_its_buffer_names_both_sizes():
    with pytest.raises(ProgramValueError) as info:
        view_too_large(zeros(2, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    line = source_line(view_too_large, "big = pld.window")
    alloc_line = source_line(view_too_large, "alloc_window_buffer")
    assert msg.startswith(f"pld.window at {FILE}:{line}: ")
    assert "a view of shape [4, 8] FP32 needs 128 bytes but window buffer 'buf' " \
           f"(allocated at {FILE}:{alloc_line}) has only 16 bytes." in msg
    assert "world size" not in msg  # 16 bytes is not a rank count here


@pl.jit.host
def rank_count_as_bytes(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    sig_buf = pld.alloc_window_buffer(pld.world_size())
    for r in pl.range(pld.world_size()):
        sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
        takes_signal(sig, device=r)


def test_alloc_window_buffer_given_the_rank_count():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ProgramValueError) as info:
            rank_count_as_bytes(zeros(3, 1, 8), config=cfg(0, 1, 2))
    msg = str(info.value)
    assert "a view of shape [3, 1] INT32 needs 12 bytes but window buffer 'sig_buf'" in msg
    assert "has only 3 bytes." in msg
    assert "The buffer's size equals the world size (3): alloc_window_buffer takes bytes, not a rank count; use " \
           "pld.alloc_window_buffer(shape, dtype=...)." in msg

    # The allocation itself already deserved a warning, attributed to the user's line.
    (w,) = [w for w in caught if "alloc_window_buffer" in str(w.message)]
    alloc_line = source_line(rank_count_as_bytes, "alloc_window_buffer")
    assert issubclass(w.category, UserWarning)
    assert (w.filename, w.lineno) == (FILE, alloc_line)
    assert str(w.message) == (
        f"pld.alloc_window_buffer(3) at {FILE}:{alloc_line}: the size is in bytes and equals the world size (3); "
        "if you meant 3 elements, use the shape form pld.alloc_window_buffer([3, 1], dtype=pl.INT32)")


@pl.jit
def takes_bytes(data: pl.InOut[pld.DistributedTensor[[2], pl.INT8]]):
    pass


@pl.jit.host
def bytes_equal_to_world(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    buf = pld.alloc_window_buffer(2)
    for r in pl.range(pld.world_size()):
        takes_bytes(pld.window(buf, [2], dtype=pl.INT8), device=r)


def test_byte_size_equal_to_world_size_only_warns():
    # The view fits (2 INT8 = 2 bytes), so planning succeeds and only the warning is left; the run itself
    # is the fixture's refusal, proving planning finished first.
    with pytest.warns(UserWarning, match=r"pld.alloc_window_buffer\(2\) at .*: the size is in bytes and equals "
                                         r"the world size \(2\)"):
        with pytest.raises(AssertionError, match="the backend was asked to start ranks"):
            bytes_equal_to_world(zeros(2, 1, 8), config=cfg(0, 1))


@pl.jit.host
def shape_form_needs_dtype(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    pld.alloc_window_buffer([2, 1])


def test_alloc_window_buffer_shape_form_needs_dtype():
    with pytest.raises(ProgramTypeError, match=r"pld.alloc_window_buffer\(\[2, 1\]\) at .*test_static_checks.py:\d+: "
                                               r"the shape form needs dtype="):
        shape_form_needs_dtype(zeros(2, 1, 8), config=cfg(0, 1))


# ---------------------------------------------------------------------------
# §8.3 step 02 and the program structure rules
# ---------------------------------------------------------------------------


@pl.jit.host
def rank_on_host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
    me = pld.rank(pld.get_comm_ctx(pld.window(buf, [1, 8], dtype=pl.FP32)))
    for r in pl.range(pld.world_size()):
        copy_rank(x[me], y[r], device=r)


@pl.jit.host
def nranks_on_host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
    n = pld.nranks(pld.get_comm_ctx(pld.window(buf, [1, 8], dtype=pl.FP32)))
    for r in pl.range(n):
        copy_rank(x[r], y[r], device=r)


@pytest.mark.parametrize("host, op, text", [
    (rank_on_host, "pld.rank", "me = pld.rank"), (nranks_on_host, "pld.nranks", "n = pld.nranks"),
])
def test_rank_identity_in_the_host_orchestrator_is_an_error(host, op, text):
    with pytest.raises(ProgramError) as info:
        host(zeros(2, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    assert msg.startswith(f"{op}() at {FILE}:{source_line(host, text)} is called in the host orchestrator: ")
    assert "rank identity exists only inside a kernel running on a rank" in msg
    assert f"Read it in the kernel with {op}(pld.get_comm_ctx(window))" in msg
    assert "or pass the host loop variable r as a scalar argument" in msg


@pl.jit.host
def dispatches_a_kernel(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        good_kernel(x[r], y[r], r, device=r)


def test_dispatching_a_kernel_directly_from_the_host():
    with pytest.raises(ProgramError) as info:
        dispatches_a_kernel(zeros(2, 1, 8), config=cfg(0, 1))
    msg = str(info.value)
    line = source_line(dispatches_a_kernel, "good_kernel(")
    assert msg.startswith(f"good_kernel() at {FILE}:{line}: the host dispatches the per-device @pl.jit wrapper "
                          "with device=r, never a kernel directly.")
    assert "Add a @pl.jit function that calls good_kernel(...) and dispatch that." in msg


@pl.jit.host
def loads_on_host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    pl.load(x, [0, 0, 0], [1, 1, 8])


def test_memory_op_on_the_host_is_an_error():
    with pytest.raises(ProgramError, match=r"pl.load\(\) at .*test_static_checks.py:\d+ is called in the host "
                                           r"orchestrator; it belongs in a kernel \(@pl.jit.incore\)"):
        loads_on_host(zeros(2, 1, 8), config=cfg(0, 1))


def test_a_per_device_function_or_kernel_compiles_as_a_one_device_program():
    # Upstream's `fn.compile(*args)` of a @pl.jit function: a program whose entry is that function.
    compiled = copy_rank.compile(config=cfg(0))
    assert compiled.name == "copy_rank" and compiled.device_ids == [0]
    with pytest.raises(AssertionError, match="the backend was asked to start ranks"):
        good_kernel(zeros(1, 8), zeros(1, 8), 0, config=cfg(0))  # planned: only the run is refused


def test_compiling_an_inline_function_is_refused():
    @pl.jit.inline
    def helper(x: pl.Tensor[[1, 8], pl.FP32]):
        pass

    with pytest.raises(ProgramError) as info:
        helper.compile(config=cfg(0))
    assert str(info.value) == (
        f"'helper' ({FILE}:{helper.line}) is not a host orchestrator (its kind: inline); compile the "
        "host orchestrator (the @pl.jit.host function that dispatches it with device=r)")


def test_class_program_needs_exactly_one_host():
    with pytest.raises(ProgramError, match=r"@pl.program class NoHost needs exactly one host orchestrator "
                                           r"\(@pl.function\(level=pl.Level.HOST, role=pl.Role.Orchestrator\)\); "
                                           r"found none"):
        @pl.program
        class NoHost:
            @pl.function(type=pl.FunctionType.InCore)
            def kernel(self, x: pl.Tensor[[1, 8], pl.FP32]):
                pass


def test_language_ops_outside_a_program_say_where_they_belong():
    with pytest.raises(ProgramError, match=r"pld.world_size\(\) called outside a program at .*: it is only "
                                           r"available inside the host orchestrator"):
        pld.world_size()
    with pytest.raises(ProgramError, match=r"pl.load\(\) called outside a program .*inside a kernel"):
        pl.load(zeros(1, 8), [0, 0], [1, 8])


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ids, text", [
    ([], "DistributedConfig(device_ids=[]): at least one device id is needed"),
    ([0, 1, 1, 2, 2], "DistributedConfig(device_ids=[0, 1, 1, 2, 2]): device ids must be distinct; [1, 2] appear "
                      "more than once"),
    ([0, -1], "DistributedConfig(device_ids=[0, -1]): device ids must be non-negative, got -1"),
    ([0, 1.0], "DistributedConfig(device_ids=[0, 1.0]): 1.0 is not an int"),
    ([True], "DistributedConfig(device_ids=[True]): True is not an int"),
    ("0,1", "DistributedConfig(device_ids='0,1'): device_ids must be a list of ints, e.g. [0, 1]"),
    (3, "DistributedConfig(device_ids=3): device_ids must be a list of ints"),
])
def test_distributed_config_validation(ids, text):
    with pytest.raises(ConfigError) as info:
        DistributedConfig(device_ids=ids)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(text)


def test_distributed_config_accepts_any_distinct_ids():
    dc = DistributedConfig(device_ids=(7, 2, 5))
    assert dc.device_ids == [7, 2, 5] and dc.world_size == 3
    assert DistributedConfig().device_ids == [0]
    with pytest.raises(ConfigError, match=r"DistributedConfig\(num_sub_workers=-1\): must be an int >= 0"):
        DistributedConfig(device_ids=[0], num_sub_workers=-1)


@pytest.mark.parametrize("platform", ["a2a3sim", "a2a3", "a5sim", "a5"])
def test_run_config_accepts_the_upstream_platforms(platform):
    assert RunConfig(platform=platform).platform == platform


@pytest.mark.parametrize("kwargs, text", [
    ({"platform": "a3"}, "RunConfig(platform='a3'): must be one of a2a3sim, a2a3, a5sim, a5"),
    ({"backend": "nccl"}, "RunConfig(backend='nccl'): available backends are shm, sim, mpi"),
    ({"hang_timeout_s": 0}, "RunConfig(hang_timeout_s=0): must be a positive number of seconds"),
    ({"hang_timeout_s": -5.0}, "RunConfig(hang_timeout_s=-5.0): must be a positive number of seconds"),
    ({"hang_timeout_s": float("nan")}, "RunConfig(hang_timeout_s=nan): must be a positive number of seconds"),
    ({"hang_timeout_s": "10"}, "RunConfig(hang_timeout_s='10'): must be a positive number of seconds"),
    ({"distributed_config": [0, 1]}, "RunConfig(distributed_config=...): expects a DistributedConfig, got list"),
])
def test_run_config_validation(kwargs, text):
    with pytest.raises(ConfigError) as info:
        RunConfig(**kwargs)
    assert str(info.value) == text


@pytest.mark.parametrize("value, text", [
    ("soon", "PTODIST_HANG_TIMEOUT='soon': must be a number of seconds"),
    ("0", "PTODIST_HANG_TIMEOUT='0': must be a positive number of seconds"),
    ("-1", "PTODIST_HANG_TIMEOUT='-1': must be a positive number of seconds"),
    ("nan", "PTODIST_HANG_TIMEOUT='nan': must be a positive number of seconds"),
])
def test_bad_hang_timeout_env(monkeypatch, value, text):
    monkeypatch.setenv("PTODIST_HANG_TIMEOUT", value)
    with pytest.raises(ConfigError) as info:
        RunConfig().resolved_hang_timeout()
    assert str(info.value) == text
    # An explicit setting wins over the environment.
    assert RunConfig(hang_timeout_s=3).resolved_hang_timeout() == 3.0


def test_hang_timeout_env_and_default(monkeypatch):
    monkeypatch.setenv("PTODIST_HANG_TIMEOUT", "2.5")
    assert RunConfig().resolved_hang_timeout() == 2.5
    monkeypatch.delenv("PTODIST_HANG_TIMEOUT")
    assert RunConfig().resolved_hang_timeout() == 60.0


def test_bad_backend_env_is_refused_before_running(monkeypatch):
    monkeypatch.setenv("PTODIST_BACKEND", "nccl")
    with pytest.raises(ConfigError, match=r"^PTODIST_BACKEND='nccl': available backends are shm, sim, mpi$"):
        dispatches_two(zeros(2, 1, 8), config=cfg(0, 1))
    monkeypatch.setenv("PTODIST_BACKEND", "shm")
    assert RunConfig().resolved_backend() == "shm"


def test_host_index_past_the_rank_count_names_the_line():
    @pl.jit.incore
    def k(x: pl.Tensor[[1, 4], pl.FP32]):
        pl.load(x, [0, 0], [1, 4])

    @pl.jit
    def chip(x: pl.Tensor[[1, 4], pl.FP32]):
        k(x)

    @pl.jit.host
    def host(x: pl.Tensor[[NR, 1, 4], pl.FP32]):
        for r in pl.range(pld.world_size()):
            chip(x[r + 1], device=r)  # the bug: one past the end on the last rank

    from ptodist.errors import ProgramIndexError

    with pytest.raises(ProgramIndexError) as info:
        host.compile(zeros(2, 1, 4), config=cfg(0, 1))
    msg = str(info.value)
    assert isinstance(info.value, IndexError)
    assert f"x[2] at {FILE}:{source_line(host, 'x[r + 1]')}" in msg
    assert "index 2 is out of range for dimension 0 of host tensor 'x' (size 2)" in msg
    assert "for r in pl.range(pld.world_size())" in msg


# ---------------------------------------------------------------------------
# Reports point at the root line, with a fix for the cause found
# ---------------------------------------------------------------------------

from ptodist.check import findings  # noqa: E402
from ptodist.errors import DispatchCoverageError, WindowTooSmallError  # noqa: E402


@pl.jit
def annotated_on_lines(x: pl.Tensor[[1, 8], pl.FP32],
                       y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                       data: pl.InOut[pld.DistributedTensor[[1, 8], pl.FP32]]):  # @data_param
    pass


@pl.jit.host
def gives_tensor_for_data(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        annotated_on_lines(x[r], y[r], x[r], device=r)


def test_a_dispatch_mismatch_names_the_line_of_the_parameters_annotation():
    with pytest.raises(ProgramTypeError) as info:
        gives_tensor_for_data(zeros(2, 1, 8), config=cfg(0, 1))
    e = info.value
    param_line = source_line(annotated_on_lines, "# @data_param")
    call_line = source_line(gives_tensor_for_data, "annotated_on_lines(x[r]")
    assert param_line != annotated_on_lines.line
    assert str(e).startswith(
        "annotated_on_lines() parameter 'data' (declared pl.InOut[pld.DistributedTensor[[1, 8], pl.FP32]] at "
        f"{FILE}:{param_line}), called at {FILE}:{call_line}: expected pld.DistributedTensor")
    assert e.fix == ("Pass a window as 'data': pld.window(buf, [1, 8], dtype=pl.FP32) of a buffer from "
                     "pld.alloc_window_buffer; stage a host tensor's data into it inside the kernel.")
    (f,) = findings.from_exception(e)
    assert f.locations[0] == f"{FILE}:{param_line}" and f.fix == e.fix


@pl.jit.host
def split_on_lines(
        x: pl.Tensor[[NR, 1, 8], pl.FP32],  # @split_x
        y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        copy_rank(x[r], y[r], device=r)


def test_more_slices_than_ranks_names_the_parameters_line_first():
    with pytest.warns(PitfallWarning) as record:
        split_on_lines.compile(zeros(3, 1, 8), zeros(3, 1, 8), config=cfg(0, 1))
    w = record[0]
    x_line = source_line(split_on_lines, "# @split_x")
    assert str(w.message).startswith("split_on_lines() parameter 'x' (declared pl.Tensor[[NR, 1, 8], pl.FP32] at "
                                     f"{FILE}:{x_line}): dimension 0 is pl.dynamic('NR') = 3")
    assert (w.filename, w.lineno) == (FILE, x_line)


def _host_check_names_the_annotation_line() -> bool:
    from ptodist.runtime import host_args

    return "param_where" in inspect.getsource(host_args)


@pytest.mark.skipif(not _host_check_names_the_annotation_line(),
                    reason="runtime/host_args.py still names the host's def line (the change is in the report)")
def test_a_host_shape_mismatch_names_the_line_of_the_parameters_annotation():
    with pytest.raises(ShapeError) as info:
        split_on_lines(zeros(2, 1, 8), zeros(3, 1, 8), config=cfg(0, 1))
    y_line = source_line(split_on_lines, "y: pl.Out")
    assert str(info.value).startswith("split_on_lines() parameter 'y' (declared pl.Out[pl.Tensor[[NR, 1, 8], "
                                      f"pl.FP32]] at {FILE}:{y_line}): dimension 0 is pl.dynamic('NR') = 3 here")
    (f,) = findings.from_exception(info.value)
    assert f.locations[0] == f"{FILE}:{y_line}"


def test_a_short_dispatch_loop_is_named_first():
    with pytest.raises(DispatchCoverageError) as info:
        dispatches_two(zeros(4, 1, 8), config=cfg(0, 1, 4, 5))
    e = info.value
    loop = f"{FILE}:{source_line(dispatches_two, 'for r in pl.range(2)')}"
    assert str(e) == (
        f"host orchestrator 'dispatches_two' ({FILE}:{dispatches_two.line}) dispatched ranks [0, 1] but never ranks "
        f"[2, 3] (devices [4, 5]); world = len(device_ids) = 4. The dispatch loop at {loop}, "
        "`for r in pl.range(2):`, must cover [0, world): write `for r in pl.range(pld.world_size()):`.")
    assert e.locations == [loop, f"{FILE}:{dispatches_two.line}"]
    assert e.fix == f"Make the loop at {loop} run over every rank: `for r in pl.range(pld.world_size()):`."
    (f,) = findings.from_exception(e)
    assert f.kind == "dispatch_coverage" and f.locations == e.locations and f.fix == e.fix
    assert f.docs == "docs/pitfalls.md#dispatch-loop-does-not-cover-every-rank"


@pl.jit.host
def loop_that_never_runs(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    for r in pl.range(0):
        copy_rank(x[r], y[r], device=r)


def test_a_dispatch_loop_that_never_runs_is_named():
    with pytest.raises(DispatchCoverageError) as info:
        loop_that_never_runs(zeros(2, 1, 8), config=cfg(0, 1))
    loop = f"{FILE}:{source_line(loop_that_never_runs, 'for r in pl.range(0)')}"
    call = f"{FILE}:{source_line(loop_that_never_runs, 'copy_rank(')}"
    assert str(info.value) == (
        f"host orchestrator 'loop_that_never_runs' ({FILE}:{loop_that_never_runs.line}) dispatched nothing: call the "
        f"per-device function with device=r for every rank. The dispatch at {call} is in the loop at {loop} "
        "(`for r in pl.range(0):`), which ran no iteration.")
    assert info.value.locations[0] == loop


def test_device_ids_given_as_device_get_their_own_fix():
    with pytest.raises(DispatchCoverageError) as info:
        dispatches_by_device_id(zeros(2, 1, 8), config=cfg(4, 5))
    assert info.value.fix == ("device= takes the rank index, not the device id (device 4 is rank 0): dispatch with "
                              "device=r for r in pl.range(pld.world_size()); DistributedConfig(device_ids=...) maps "
                              "ranks to devices.")
    with pytest.raises(DispatchCoverageError) as info:
        dispatches_past_the_end(zeros(2, 1, 8), config=cfg(0, 1))
    assert info.value.fix == ("Dispatch with device=r exactly, r the variable of `for r in "
                              "pl.range(pld.world_size())` (no offset, no other range).")


@pl.jit
def takes_rank_rows(data: pl.InOut[pld.DistributedTensor[[NR, 8], pl.FP32]]):
    pass


@pl.jit.host
def sized_without_rank_dim(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    buf = pld.alloc_window_buffer([8], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        takes_rank_rows(pld.window(buf, [pld.world_size(), 8], dtype=pl.FP32), device=r)


@pl.jit.host
def sized_with_one_row(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        takes_rank_rows(pld.window(buf, [pld.world_size(), 8], dtype=pl.FP32), device=r)


@pl.jit.host
def sized_in_a_smaller_dtype(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    buf = pld.alloc_window_buffer([2, 8], dtype=pl.FP16)
    for r in pl.range(pld.world_size()):
        takes_rank_rows(pld.window(buf, [pld.world_size(), 8], dtype=pl.FP32), device=r)


@pytest.mark.parametrize("host, hint, fix", [
    (sized_without_rank_dim,
     " The buffer was allocated as [8], without the view's leading rank dimension (2 = the world size).",
     "Size the buffer with the rank dimension, as the view is: pld.alloc_window_buffer([pld.world_size(), 8], "
     "dtype=pl.FP32)."),
    (sized_with_one_row,
     " The buffer was allocated as [1, 8]: its dimension 0 is 1 where the view has the world size (2).",
     "Size the buffer's dimension 0 by the rank count, as the view is: "
     "pld.alloc_window_buffer([pld.world_size(), 8], dtype=pl.FP32)."),
    (sized_in_a_smaller_dtype,
     " The buffer was allocated as [2, 8] FP16 (2 bytes per element) and is viewed as FP32 (4 bytes per element).",
     "Allocate the buffer with the dtype of its views: pld.alloc_window_buffer([2, 8], dtype=pl.FP32)."),
    (rank_count_as_bytes,
     " The buffer's size equals the world size (2): alloc_window_buffer takes bytes, not a rank count; use "
     "pld.alloc_window_buffer(shape, dtype=...).",
     "alloc_window_buffer(n) takes bytes, not a rank count: allocate with the shape and dtype of the view, "
     "pld.alloc_window_buffer([2, 1], dtype=pl.INT32)."),
], ids=["no rank dim", "one row", "smaller dtype", "bytes"])
def test_a_window_too_small_gets_the_fix_for_its_cause(host, hint, fix):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the byte-size allocation warns too
        with pytest.raises(WindowTooSmallError) as info:
            host(zeros(2, 1, 8), config=cfg(0, 1))
    e = info.value
    assert str(e).endswith(hint), str(e)
    assert e.fix == fix
    alloc = f"{FILE}:{source_line(host, 'alloc_window_buffer')}"
    (f,) = findings.from_exception(e)
    assert f.locations[0] == alloc and f.fix == fix
    assert f.docs == "docs/pitfalls.md#a-rank-count-as-the-window-size"


def test_a_shape_mismatch_gets_the_fix_for_its_cause():
    with pytest.raises(ShapeError) as info:
        hard_coded_four(zeros(2, 1, 8), config=cfg(0, 1))
    assert info.value.fix == ('Declare dimension 0 as NR = pl.dynamic("NR") instead of 4: the rank count binds from '
                              "the arguments at each call.")
    with pytest.raises(ShapeError) as info:
        hard_coded_four(zeros(4, 1, 6), config=cfg(0, 1, 2, 3))
    assert info.value.fix == ("Pass an argument whose dimension 2 is 8, or change the annotation (a pl.dynamic name "
                              "for a size that varies).")
    with pytest.raises(ShapeError) as info:
        dispatches_two(zeros(2, 1, 8), zeros(3, 1, 8), config=cfg(0, 1))
    assert info.value.fix == ("Make every use of pl.dynamic('NR') the same size (2 or 3), or use separate "
                              "pl.dynamic names for sizes that differ.")
