"""Outputs the shm worker makes (the inputs-only form ``y = rt(x)``) come from memory it reuses
(runtime/worker/outputs.py).

What a user relies on: every output it gets is shared memory, zeroed, and its own for as long as anything of
the caller's refers to it (the tensor, a view, a numpy array over it, its storage object); memory is handed
out again only after that, and an output outlives the worker that made it.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from test_staging import plus_one

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, shared_array
from ptodist.runtime.worker import outputs
from ptodist.runtime.worker.outputs import OutputPool

NR = pl.dynamic("NR")


@pl.jit.incore
def untouched(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pass  # the output keeps what the worker made it with


@pl.jit
def untouched_rank(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    untouched(x, y)


@pl.jit.host
def leave(x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        untouched_rank(x[r], y[r], device=r)


def prepared(program, x):
    cfg = RunConfig(backend="shm", distributed_config=DistributedConfig(device_ids=[0, 1]))
    return program.compile(x, x.clone() if isinstance(x, torch.Tensor) else x.copy(), config=cfg).prepare()


def test_a_reused_output_is_zeroed_again_whatever_the_caller_wrote_into_it():
    x = torch.ones(2, 1, 4).share_memory_()
    with prepared(leave, x) as rt:
        seen = set()
        for i in range(6):
            y = rt(x)
            assert y.is_shared() and torch.equal(y, torch.zeros(2, 1, 4)), f"dispatch {i}: {y.ravel().tolist()}"
            seen.add(y.data_ptr())
            y.fill_(7.0)  # the caller's writes must not reach the next output
            del y
        assert len(seen) == 1, "a dropped output's memory is made the next output (nothing else holds it)"


def holding(y, hold: str):
    """What of output ``y`` the caller keeps."""
    return {"tensor": y, "view": y[1], "numpy": y.numpy(), "storage": y.untyped_storage(), "nothing": None}[hold]


@pytest.mark.parametrize("hold", ["tensor", "view", "numpy", "storage", "nothing"])
def test_memory_the_caller_still_refers_to_is_never_handed_out_again(hold):
    x = torch.ones(2, 1, 4).share_memory_()
    with prepared(plus_one, x) as rt:
        y = rt(x)
        y.fill_(5.0)
        ptr = y.data_ptr()
        kept = holding(y, hold)
        del y
        gc.collect()
        others = [rt(x) for _ in range(5)]  # every one of them new memory while ``kept`` holds y's
        for z in others:
            assert torch.equal(z, torch.full((2, 1, 4), 2.0))
        ptrs = {z.data_ptr() for z in others}
        assert len(ptrs) == len(others), "two live outputs share memory"
        if hold == "nothing":
            assert ptr in ptrs, "memory nothing refers to any more is reused"
            return
        assert ptr not in ptrs, f"an output's memory was handed out again while the caller held its {hold}"
        if hold == "storage":
            kept = torch.empty(0).set_(kept).view(2, 1, 4)
        assert (np.asarray(kept) == 5.0).all(), f"the held {hold} was overwritten"


def test_numpy_outputs_are_shared_arrays_reused_once_dropped():
    x = shared_array((2, 1, 4), np.float32)
    x[...] = 3.0
    with prepared(plus_one, x) as rt:
        y = rt(x)
        assert isinstance(y, np.ndarray) and (y == 4.0).all()
        row = y[1]  # a view keeps the memory the caller's
        address = row.__array_interface__["data"][0]
        del y
        z = rt(x)
        assert (z == 4.0).all() and (row == 4.0).all()
        assert not (z.__array_interface__["data"][0] <= address < z.__array_interface__["data"][0] + z.nbytes)
        row[...] = -1.0
        assert (z == 4.0).all()
        del row
        w = rt(x)
        assert (w == 4.0).all() and (z == 4.0).all()


def test_an_output_outlives_the_worker_that_made_it():
    x = torch.ones(2, 1, 4).share_memory_()
    with prepared(plus_one, x) as rt:
        y = rt(x)
    gc.collect()
    assert torch.equal(y, torch.full((2, 1, 4), 2.0))
    y.add_(1.0)
    assert torch.equal(y, torch.full((2, 1, 4), 3.0))


def test_the_pool_keeps_at_most_its_bounds(monkeypatch):
    pool = OutputPool()
    held = [pool.torch_zeros((4,), pl.FP32) for _ in range(outputs.KEPT_PER_SHAPE + 3)]
    assert len(pool.kept[("torch", (4,), torch.float32)]) == outputs.KEPT_PER_SHAPE
    assert pool.nbytes == outputs.KEPT_PER_SHAPE * 16
    del held
    monkeypatch.setattr(outputs, "KEPT_BYTES", 3 * 4096)
    for n in (1024, 1024, 2048, 2048):  # FP32 elements: 4 KiB and 8 KiB
        pool.torch_zeros((n,), pl.FP32)
    assert pool.nbytes <= 3 * 4096
    assert ("torch", (4,), torch.float32) not in pool.kept, "the least recently used shape goes first"
    pool.clear()
    assert pool.nbytes == 0 and not pool.kept
