"""Step 12 — broadcast: every rank ends with the root rank's data, by hand or with ``pld.tensor.broadcast``.

Every rank starts with its own ``x[r]``; afterwards ``y[r] == x[root]`` on
every rank. ``--root`` picks the root (default 0); it reaches the program as
a closure constant of the factory, a plain Python int, which is what the
builtin's ``root=`` requires.

* By hand (default): one-to-many needs no barrier. Only the root stages its
  data; then it bumps cell ``[root, 0]`` of every other rank's ``[P, 1]``
  signal. Each other rank waits for that one cell, then reads the root's
  window with ``remote_load``. Nobody writes the root's window afterwards,
  so the readers need not acknowledge; a root that went on to reuse its
  window would first have to wait for every reader to say it is done.
* ``--use-builtin``: the root stages its data in ``data``, then every rank
  calls ``pld.tensor.broadcast(data, sig, root=root)``, which leaves the
  root's data in every rank's ``data`` window (a barrier, the copies, and a
  second barrier so the root's window outlives the reads). The signal is
  self-clearing.

Pitfall (SPEC §8.3, step 12): broadcasting from your own slice instead of
the root's — staging ``x[r]`` on every rank and loading it back, or reading
``remote_load(data, me, ...)`` rather than ``remote_load(data, root, ...)``.
Nothing hangs and nothing races: every rank simply keeps its own data. The
golden below catches it (SPEC §8.3 also asks ptodist to note differing
broadcast outputs in its report).
"""

from __future__ import annotations

import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

ROWS = 4
COLS = 64


def build(nr: int, root: int, use_builtin: bool):
    """Return the broadcast program for ``nr`` ranks and root rank ``root``, by hand or with the builtin."""
    if not 0 <= root < nr:
        raise ValueError(f"root={root} is not a rank of a world of {nr}")

    @pl.program
    class Broadcast:
        @pl.function(type=pl.FunctionType.InCore)
        def broadcast_by_hand(self, x: pl.Tensor[[ROWS, COLS], pl.FP32],
                              y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                              data: pl.InOut[pld.DistributedTensor[[ROWS, COLS], pl.FP32]],
                              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            if me == root:
                own = pl.load(x, [0, 0], [ROWS, COLS])
                data = pl.store(own, [0, 0], data)           # stage, then announce
                for peer in pl.range(n):
                    if peer != me:
                        pld.system.notify(sig, peer, [root, 0], 1, op=pld.NotifyOp.AtomicAdd)
                return pl.store(own, [0, 0], y)
            pld.system.wait(sig, [root, 0], 1, cmp=pld.WaitCmp.Ge)  # the root's data is staged
            return pl.store(pld.tile.remote_load(data, root, [0, 0], [ROWS, COLS]), [0, 0], y)

        @pl.function(type=pl.FunctionType.InCore)
        def broadcast_builtin(self, x: pl.Tensor[[ROWS, COLS], pl.FP32],
                              y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                              data: pl.InOut[pld.DistributedTensor[[ROWS, COLS], pl.FP32]],
                              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            if pld.rank(ctx) == root:
                data = pl.store(pl.load(x, [0, 0], [ROWS, COLS]), [0, 0], data)
            data = pld.tensor.broadcast(data, sig, root=root)
            return pl.store(pl.load(data, [0, 0], [ROWS, COLS]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
                     data: pl.InOut[pld.DistributedTensor[[ROWS, COLS], pl.FP32]],
                     sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            if use_builtin:
                return self.broadcast_builtin(x, y, data, sig)
            return self.broadcast_by_hand(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def broadcast(self, x: pl.Tensor[[nr, ROWS, COLS], pl.FP32],
                      y: pl.Out[pl.Tensor[[nr, ROWS, COLS], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([ROWS, COLS], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                data = pld.window(data_buf, [ROWS, COLS], dtype=pl.FP32)
                sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
                self.per_rank(x[r], y[r], data, sig, device=r)
            return y

    return Broadcast


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--root", type=int, default=0, help="the rank whose data everyone receives")
    ap.add_argument("--use-builtin", action="store_true",
                    help="use pld.tensor.broadcast instead of the hand-rolled version")
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)
    if not 0 <= args.root < nr:
        ap.error(f"--root {args.root} is not a rank index in [0, {nr})")

    x = torch.randn(nr, ROWS, COLS)
    y = torch.zeros(nr, ROWS, COLS)
    compiled = ir.compile(build(nr, args.root, args.use_builtin), platform=args.platform,
                          distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, y)

    expected = x[args.root].expand_as(y)  # a pure copy: exact
    assert torch.equal(y, expected), \
        f"root {args.root}, P={nr}: ranks {[r for r in range(nr) if not torch.equal(y[r], x[args.root])]} differ"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
