"""Testing your own distributed kernels with pytest and ptodist.testing: a complete test file to copy.

The kernel is a small allreduce: each rank stages its vector in a window,
passes a barrier made of AtomicAdd notifies, then sums every rank's window.
Two tests, each run at 2, 3 and 4 ranks (``@pytest.mark.ranks``):

* the results are right, on the default backend (every rank a process);
* ``ptodist.testing.check`` finds no race, unwritten read, stale signal,
  clobbered cell or hang under 8 seeded schedules of the ``sim`` backend.

Run it with ``python -m pytest examples/testing`` (ptodist's pytest plugin is
registered when ptodist is installed; docs/testing.md says what it provides).
"""

import pytest
import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
import ptodist.testing
from ptodist import DistributedConfig, RunConfig

N = 64
NR = pl.dynamic("NR")  # the rank count, bound from the arguments' shapes


@pl.jit.incore
def allreduce_kernel(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(data)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    data = pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)
    for peer in pl.range(n):  # notify everyone first ...
        pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for peer in pl.range(n):  # ... then wait for everyone
        pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
    acc = pl.full([1, N], dtype=pl.FP32, value=0.0)
    for peer in pl.range(n):
        acc = pl.add(acc, pld.tile.remote_load(data, peer, [0, 0], [1, N]))
    return pl.store(acc, [0, 0], y)


@pl.jit
def per_rank(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
             data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]],
             sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    return allreduce_kernel(x, y, data, sig)


@pl.jit.host
def allreduce(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]]):
    data_buf = pld.alloc_window_buffer([1, N], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        data = pld.window(data_buf, [1, N], dtype=pl.FP32)
        sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
        per_rank(x[r], y[r], data, sig, device=r)
    return y


def config(device_ids):
    return RunConfig(distributed_config=DistributedConfig(device_ids=device_ids))


def inputs(device_ids):
    """One vector per rank, the same on every run."""
    return torch.randn(len(device_ids), 1, N, generator=torch.Generator().manual_seed(len(device_ids)))


def expected(x):
    return x.sum(0, keepdim=True).expand_as(x)


@pytest.mark.ranks(2, 3, 4)
def test_allreduce_sums_every_ranks_vector(device_ids):
    x = inputs(device_ids)
    y = allreduce(x, config=config(device_ids))
    torch.testing.assert_close(y, expected(x))


@pytest.mark.ranks(2, 3, 4)
def test_allreduce_has_no_races_or_hangs(device_ids):
    x = inputs(device_ids)
    report = ptodist.testing.check(allreduce, x, config=config(device_ids))
    report.assert_clean()  # on failure: every finding (kind, ranks, lines, fix) and the command that replays it
    torch.testing.assert_close(report.result, expected(x))  # the last checked schedule's outputs
