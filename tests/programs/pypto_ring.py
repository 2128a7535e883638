"""A PyPTO script as its users write it: a ring shift in the class form, checked against torch.roll.

``python -m ptodist run pypto_ring.py NR`` runs it unmodified (tests/cli/test_cli.py); test_programs.py
compiles its ``make(nr)`` in-process.
"""

import sys

import pypto.language as pl
import pypto.language.distributed as pld
import torch
from pypto import ir
from pypto.ir import DistributedConfig as IrDistributedConfig
from pypto.ir.distributed_compiled_program import DistributedConfig
from pypto.runtime import RunConfig

SIZE = 8


def make(nr):
    @pl.program
    class Ring:
        @pl.function(type=pl.FunctionType.InCore)
        def step(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)
            for p in pl.range(n):
                pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for p in pl.range(n):
                pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)
            got = pld.tile.remote_load(data, (me - 1 + n) % n, [0, 0], [1, SIZE])
            return pl.store(got, [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.step(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            dbuf = pld.alloc_window_buffer(SIZE * pl.FP32.get_byte())
            sbuf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                d = pld.window(dbuf, [1, SIZE], dtype=pl.FP32)
                s = pld.window(sbuf, [nr, 1], dtype=pl.INT32)
                self.chip(x[r], y[r], d, s, device=r)
            return y

    return Ring


def main():
    assert IrDistributedConfig is DistributedConfig
    print("argv", sys.argv[1:])
    nr = int(sys.argv[1])
    cfg = RunConfig(platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(nr))))
    compiled = ir.compile(make(nr), platform=cfg.platform, distributed_config=cfg.distributed_config)
    x = torch.arange(nr * SIZE, dtype=torch.float32).reshape(nr, 1, SIZE)
    y = compiled(x)
    assert torch.equal(y, torch.roll(x, 1, 0)), (x, y)
    print("rows", [int(v) for v in y[:, 0, 0]])
    print("OK")


if __name__ == "__main__":
    main()
