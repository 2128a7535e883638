"""Step 11 — the builtin: ``pld.tensor.allreduce`` replaces steps 08-10 with one call, mesh or ring.

``pld.tensor.allreduce(data, signal, op=pld.ReduceOp.Sum, mode=...)`` leaves
on every rank the reduction of all ranks' ``data`` window, in place, and
returns the rebound window. It is built from the same primitives you used by
hand (notify/wait, remote_load/remote_store); ``op`` may be ``Sum``, ``Max``,
``Min`` or ``Prod`` (the host orchestrator's ring: ``Sum`` on FP32 only).
Staging in and out of the window stays yours.

``--mode`` picks the schedule, and the signal's shape follows the mode:

* ``mesh`` (step 08's shape): a ``[P, 1]`` INT32 signal;
* ``ring`` (step 10's shape): a ``[2(P-1), P]`` INT32 signal, one row per
  round. The data is cut into P chunks along a dimension that divides by P.

``--where`` shows the two places the builtin can be called:

* ``kernel``: inside the kernel, between the stage-in and the stage-out,
  with an explicit signal window;
* ``host``: in the host orchestrator, between two dispatch loops (stage-in
  on every rank, then the collective, then stage-out on every rank). There
  it runs as a builtin task on every rank, after the rank's earlier tasks.
  In mesh mode the signal may be omitted: ptodist synthesises one for that
  call site (so not inside a loop, where one signal would serve every
  iteration). The ring mode passes its ``[2(P-1), P]`` signal explicitly.

Collective signals are self-clearing: each call leaves every cell at zero,
so one signal window serves any number of calls with the same layout.

Pitfall (SPEC §8.3, step 11): a signal whose shape does not match the mode
(a ``[P, 1]`` signal with ``mode="ring"``, or a ring signal in mesh mode) is
rejected before any cell is touched, with the shape the mode needs: a host
call when the program is compiled, a kernel call on every rank at the call.
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

SIZE = 256


def signal_shape(nr: int, mode: str) -> list[int]:
    """Return the signal shape ``mode`` needs: ``[nr, 1]`` (mesh) or ``[2(nr-1), nr]`` (ring)."""
    return [2 * (nr - 1), nr] if mode == "ring" else [nr, 1]


def build_kernel_form(nr: int, mode: str):
    """Return the program that calls the builtin inside its kernel (mode is a closure constant)."""
    sig_shape = signal_shape(nr, mode)

    @pl.program
    class KernelAllreduce:
        @pl.function(type=pl.FunctionType.InCore)
        def allreduce_step(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                           data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                           sig: pl.InOut[pld.DistributedTensor[sig_shape, pl.INT32]]):
            data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)                  # stage in
            data = pld.tensor.allreduce(data, sig, op=pld.ReduceOp.Sum, mode=mode)         # the builtin
            return pl.store(pl.load(data, [0, 0], [1, SIZE]), [0, 0], y)                   # stage out

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[sig_shape, pl.INT32]]):
            return self.allreduce_step(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def allreduce(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer(sig_shape, dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
                sig = pld.window(sig_buf, sig_shape, dtype=pl.INT32)
                self.per_rank(x[r], y[r], data, sig, device=r)
            return y

    return KernelAllreduce


def build_host_form(nr: int, mode: str):
    """Return the program whose host orchestrator calls the builtin between two dispatch loops."""

    @pl.program
    class HostAllreduce:
        @pl.function(type=pl.FunctionType.InCore)
        def stage_in(self, x: pl.Tensor[[1, SIZE], pl.FP32],
                     data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]]):
            return pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)

        @pl.function(type=pl.FunctionType.InCore)
        def stage_out(self, y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                      data: pld.DistributedTensor[[1, SIZE], pl.FP32]):
            return pl.store(pl.load(data, [0, 0], [1, SIZE]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def load_rank(self, x: pl.Tensor[[1, SIZE], pl.FP32],
                      data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]]):
            return self.stage_in(x, data)

        @pl.function(type=pl.FunctionType.Orchestration)
        def unload_rank(self, y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                        data: pld.DistributedTensor[[1, SIZE], pl.FP32]):
            return self.stage_out(y, data)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def allreduce(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            for r in pl.range(pld.world_size()):
                self.load_rank(x[r], pld.window(data_buf, [1, SIZE], dtype=pl.FP32), device=r)

            data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
            if mode == "mesh":
                data = pld.tensor.allreduce(data)  # no signal: synthesised for this call site
            else:
                ring_buf = pld.alloc_window_buffer(signal_shape(nr, "ring"), dtype=pl.INT32)
                ring_sig = pld.window(ring_buf, signal_shape(nr, "ring"), dtype=pl.INT32)
                data = pld.tensor.allreduce(data, ring_sig, mode="ring")

            for r in pl.range(pld.world_size()):
                self.unload_rank(y[r], data, device=r)
            return y

    return HostAllreduce


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3",
                    help=f"comma-separated device ids, one rank each (ring: at least 2, dividing {SIZE})")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--mode", default="mesh", choices=["mesh", "ring"], help="the builtin's schedule")
    ap.add_argument("--where", default="kernel", choices=["kernel", "host"],
                    help="call the builtin inside the kernel or in the host orchestrator")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)
    if args.mode == "ring" and (nr < 2 or SIZE % nr):
        ap.error(f"ring mode needs at least 2 ranks whose count divides SIZE={SIZE}, got {nr}")

    x = torch.randn(nr, 1, SIZE)
    y = torch.zeros(nr, 1, SIZE)
    build = build_kernel_form if args.where == "kernel" else build_host_form
    compiled = ir.compile(build(nr, args.mode), platform=args.platform,
                          distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    expected = x.sum(dim=0, keepdim=True).expand_as(y)
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5), \
        f"{args.mode}/{args.where} P={nr} mismatch: max error {(y - expected).abs().max().item()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
