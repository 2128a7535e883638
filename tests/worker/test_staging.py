"""Small host tensors the shm ranks have not mapped go through the worker's staging area (runtime/worker/staging.py).

What a user relies on: the results are those of the same dispatch in place (and on sim), whether the tensors are
new at every dispatch, made by the worker (the inputs-only form), reused, written between dispatches, or views
of one another's memory; nothing the staging area holds outlives the worker.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_mpi import _mpirun, needs_mpi

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, shared_array
from ptodist.backends.base import HostView
from ptodist.language import dtypes as dt
from ptodist.runtime.worker.binding import _staged
from ptodist.runtime.worker.staging import STAGE_MAX, Staging, stageable

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds

NR = pl.dynamic("NR")
BIG = STAGE_MAX // 4 + 1024  # FP32 elements: a row over the staging limit


@pl.jit.incore
def add_one(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.add(pl.load(x, [0, 0], [1, 4]), 1.0), [0, 0], y)


@pl.jit
def add_one_rank(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    add_one(x, y)


@pl.jit.host
def plus_one(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        add_one_rank(x[r], y[r], device=r)


def config(backend: str = "shm", ranks: int = 2) -> RunConfig:
    return RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=list(range(ranks))))


def new_tensors_at_every_dispatch(backend: str | None) -> list[str]:
    """Dispatch new tensors (and outputs the worker makes) again and again; return what came out wrong."""
    wrong = []
    x0 = torch.zeros(2, 1, 4).share_memory_()
    cfg = config(backend) if backend else RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]))
    with plus_one.compile(x0, x0.clone(), config=cfg).prepare() as rt:
        for i in range(6):
            x = torch.full((2, 1, 4), float(i)).share_memory_()
            y = torch.full((2, 1, 4), -1.0).share_memory_()
            rt(x, y)
            made = rt(x)  # the inputs-only form: the worker makes the output
            a = shared_array((2, 1, 4))
            a[...] = 10.0 * i
            out = rt(a)
            for what, got, want in (("rt(x, y)", y, i + 1.0), ("rt(x)", made, i + 1.0), ("rt(a)", out, 10.0 * i + 1)):
                if not (np.asarray(got) == want).all():
                    wrong.append(f"dispatch {i}: {what} gave {np.asarray(got).ravel().tolist()}, not {want}")
    return wrong


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_new_tensors_at_every_dispatch_give_every_result(backend):
    assert new_tensors_at_every_dispatch(backend) == []


@needs_mpi
def test_new_tensors_at_every_dispatch_give_every_result_on_mpi(tmp_path):
    proc = _mpirun(2, [sys.executable, __file__, str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    for process in (0, 1):
        assert json.loads((tmp_path / f"process{process}.json").read_text()) == [], process


def test_a_tensor_written_between_dispatches_is_read_anew():
    x, y = torch.zeros(2, 1, 4).share_memory_(), torch.zeros(2, 1, 4).share_memory_()
    with plus_one.compile(x, y, config=config()).prepare() as rt:
        for i in range(5):  # the first dispatch stages x and y, the next ones map them
            x.fill_(float(i))
            rt(x, y)
            assert torch.equal(y, torch.full((2, 1, 4), i + 1.0)), i


def test_a_strided_output_gets_its_elements_and_nothing_between_them():
    base = torch.full((2, 1, 8), 5.0).share_memory_()
    y = base[:, :, ::2]  # every other element: the ones between belong to the caller
    x = torch.full((2, 1, 4), 2.0).share_memory_()
    with plus_one.compile(x, torch.zeros(2, 1, 4).share_memory_(), config=config()).prepare() as rt:
        rt(x, y)
    assert torch.equal(base[:, :, ::2], torch.full((2, 1, 4), 3.0))
    assert torch.equal(base[:, :, 1::2], torch.full((2, 1, 4), 5.0))


@pl.jit.incore
def through_alias(big: pl.InOut[pl.Tensor[[1, BIG], pl.FP32]], small: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.full([1, 4], dtype=pl.FP32, value=7.0), [0, 0], small)
    pl.store(pl.add(pl.load(big, [0, 0], [1, 4]), 1.0), [0, 4], big)  # reads what small's store wrote


@pl.jit
def through_alias_rank(big: pl.InOut[pl.Tensor[[1, BIG], pl.FP32]], small: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    through_alias(big, small)


@pl.jit.host
def alias_host(big: pl.InOut[pl.Tensor[[NR, 1, BIG], pl.FP32]], small: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        through_alias_rank(big[r], small[r], device=r)


def test_a_small_view_of_a_mapped_tensor_sees_its_writes():
    big = torch.zeros(1, 1, BIG).share_memory_()  # over the staging limit: mapped
    small = big.view(-1)[:4].view(1, 1, 4)  # small enough to stage, but the same memory as big's first elements
    with alias_host.compile(big, small, config=config(ranks=1)).prepare() as rt:
        rt(big, small)
    assert torch.equal(big[0, 0, :8], torch.tensor([7.0] * 4 + [8.0] * 4))


# -- the staging area itself ------------------------------------------------------------------------------------
class _Map:
    def __init__(self, token):
        self.token, self.sent = token, False


class _Binding:
    """What the staging area asks of its binding: a token for a file the ranks map, and forgetting one."""

    def __init__(self):
        self.tokens, self.forgotten = 0, []

    def file_map(self, file):
        self.tokens += 1
        return _Map(self.tokens)

    def forget_file(self, file):
        self.forgotten.append(file)
        file.close()


def _arg(a: np.ndarray):
    lo, hi = byte_bounds(a)
    return _staged(a, dt.from_numpy(a.dtype), False, a.strides, lo, hi, a.__array_interface__["data"][0])


def _area(staging: Staging, view: HostView, shape, strides) -> np.ndarray:
    return np.ndarray(shape, np.float32, staging.file.bytes, view.offset, strides)


def test_overlapping_arguments_are_staged_as_one_span():
    base = np.arange(16, dtype=np.float32)
    staging = Staging(_Binding())
    a, b = _arg(base[0:8]), _arg(base[4:12])
    va, vb = staging.views([(a, True), (b, True)])
    assert (va.token, vb.token) == (1, 1) and vb.offset - va.offset == 16  # b starts 4 floats after a
    _area(staging, vb, (8,), (4,))[0] = -1.0  # a rank writes through b ...
    assert _area(staging, va, (8,), (4,))[4] == -1.0  # ... and a sees it, as in place
    staging.copy_back()
    assert base[4] == -1.0 and base[12:].tolist() == [12.0, 13.0, 14.0, 15.0]
    staging.close()


def test_the_area_grows_and_the_old_one_is_forgotten():
    binding = _Binding()
    staging = Staging(binding)
    small = np.zeros(4, np.float32)
    (v1,) = staging.views([(_arg(small), False)])
    first = staging.file
    big = np.ones(STAGE_MAX // 4, np.float32)
    (v2,) = staging.views([(_arg(big), False)])
    assert v2.token == 2 and binding.forgotten == [first]
    assert _area(staging, v2, big.shape, (4,)).tolist() == big.tolist()
    staging.close()
    assert staging.file is None and len(binding.forgotten) == 2


def test_what_may_be_staged():
    assert stageable(0, STAGE_MAX, (4,))
    assert not stageable(0, STAGE_MAX + 1, (4,))  # too large: mapped once instead
    assert not stageable(0, 64, (-4,))  # a negative stride


def test_a_copy_back_writes_only_the_elements_of_a_strided_argument():
    user = np.arange(8, dtype=np.float32)
    view = user[::2]
    staging = Staging(_Binding())
    (v,) = staging.views([(_arg(view), True)])
    area = np.ndarray((4,), np.float32, staging.file.bytes, v.offset, (8,))
    area[...] = -1.0
    user[1::2] = 100.0  # the caller's own elements between the argument's: not the ranks'
    staging.copy_back()
    assert user.tolist() == [-1.0, 100.0, -1.0, 100.0, -1.0, 100.0, -1.0, 100.0]
    staging.close()


if __name__ == "__main__":  # one process of the mpirun job of the mpi test: its wrong results, to a file
    from mpi4py import MPI

    out = Path(sys.argv[1]) / f"process{MPI.COMM_WORLD.Get_rank()}.json"
    out.write_text(json.dumps(new_tensors_at_every_dispatch(None)))
