"""MoE dispatch and combine: two all_to_all_v calls around an expert, one expert per rank.

Every rank holds TOKENS tokens of width HIDDEN and routes each to one expert
(top-1); expert e lives on rank e and scales what it receives by (e + 1).

* Permute (host, numpy): rank r's tokens for expert p go to block p of its
  ``[P * CAP, HIDDEN]`` dispatch buffer, ``counts[r][p]`` rows of it; CAP is
  the block capacity (the most tokens one rank may send one expert).
* Dispatch, in the kernel: ``pld.tensor.all_to_all_v(x, recv, sig, counts,
  got)``. ``x`` and ``counts`` are the kernel's plain ``pl.Tensor``
  parameters (``counts`` laid out ``[P, 1]``); ``got`` is an INT32 ``[P, 1]``
  window, and after the call ``got[p, 0]`` holds the rows rank p sent here.
* Expert: scale the received rows.
* Combine: ``pld.tensor.all_to_all_v(h, back, sig, got, counts)`` sends every
  row back to the rank it came from. The send counts are what dispatch
  received; the recv counts are what this rank dispatched, and ptodist checks
  them against what the experts send back (a mismatch is an error naming
  both ranks and counts). One signal window serves both calls: collective
  signals are self-clearing.
* Un-permute (host, numpy): token t's row comes back where it left.
"""

from __future__ import annotations

import argparse

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

TOKENS = 6
HIDDEN = 16
CAP = TOKENS  # a block may hold every token of a rank


def build(nr: int):
    total = nr * CAP

    @pl.program
    class Moe:
        @pl.function(type=pl.FunctionType.InCore)
        def moe(self, x: pl.Tensor[[total, HIDDEN], pl.FP32], counts: pl.Tensor[[nr, 1], pl.INT32],
                y: pl.Out[pl.Tensor[[total, HIDDEN], pl.FP32]],
                recv: pl.InOut[pld.DistributedTensor[[total, HIDDEN], pl.FP32]],
                back: pl.InOut[pld.DistributedTensor[[total, HIDDEN], pl.FP32]],
                got: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            me = pld.rank(pld.get_comm_ctx(recv))

            # Dispatch: block p of x (counts[p] rows) goes to expert p; got[src] = rows src sent me.
            recv = pld.tensor.all_to_all_v(x, recv, sig, counts, got)

            # Expert `me`: scale every received row by (me + 1), into a private tensor.
            h = pl.create_tensor([total, HIDDEN], pl.FP32)
            tile = pl.load(recv, [0, 0], [total, HIDDEN])
            h = pl.store(pl.mul(tile, pl.cast(me + 1, target_type=pl.FP32)), [0, 0], h)

            # Combine: send got[src] rows of block src back to src; expect counts[p] rows from expert p.
            back = pld.tensor.all_to_all_v(h, back, sig, got, counts)
            return pl.store(pl.load(back, [0, 0], [total, HIDDEN]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def per_rank(self, x: pl.Tensor[[total, HIDDEN], pl.FP32], counts: pl.Tensor[[nr, 1], pl.INT32],
                     y: pl.Out[pl.Tensor[[total, HIDDEN], pl.FP32]],
                     recv: pl.InOut[pld.DistributedTensor[[total, HIDDEN], pl.FP32]],
                     back: pl.InOut[pld.DistributedTensor[[total, HIDDEN], pl.FP32]],
                     got: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                     sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.moe(x, counts, y, recv, back, got, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def dispatch_combine(self, x: pl.Tensor[[nr, total, HIDDEN], pl.FP32],
                             counts: pl.Tensor[[nr, nr, 1], pl.INT32],
                             y: pl.Out[pl.Tensor[[nr, total, HIDDEN], pl.FP32]]):
            recv_buf = pld.alloc_window_buffer([total, HIDDEN], dtype=pl.FP32)
            back_buf = pld.alloc_window_buffer([total, HIDDEN], dtype=pl.FP32)
            got_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            recv = pld.window(recv_buf, [total, HIDDEN], dtype=pl.FP32)
            back = pld.window(back_buf, [total, HIDDEN], dtype=pl.FP32)
            got = pld.window(got_buf, [nr, 1], dtype=pl.INT32)
            sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.per_rank(x[r], counts[r], y[r], recv, back, got, sig, device=r)
            return y

    return Moe


def permute(tokens: np.ndarray, experts: np.ndarray, nr: int):
    """Return rank r's dispatch buffer [P*CAP, HIDDEN], its counts [P, 1] and each token's (block, row)."""
    buf = np.zeros((nr * CAP, HIDDEN), np.float32)
    counts = np.zeros((nr, 1), np.int32)
    where = []
    for t, e in enumerate(experts):
        row = e * CAP + counts[e, 0]
        buf[row] = tokens[t]
        where.append(row)
        counts[e, 0] += 1
    return buf, counts, where


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)

    rng = np.random.default_rng(args.seed)
    tokens = rng.standard_normal((nr, TOKENS, HIDDEN)).astype(np.float32)
    experts = rng.integers(0, nr, (nr, TOKENS))  # experts[r, t]: the expert token t of rank r goes to
    packed = [permute(tokens[r], experts[r], nr) for r in range(nr)]
    x = np.stack([p[0] for p in packed])
    counts = np.stack([p[1] for p in packed])
    y = np.zeros_like(x)

    compiled = ir.compile(build(nr), platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    compiled(x, counts, y)

    for r in range(nr):
        out = y[r][packed[r][2]]  # un-permute: token t's row came back where it left
        expected = tokens[r] * (experts[r][:, None] + 1).astype(np.float32)
        assert np.array_equal(out, expected), f"P={nr} rank {r}: max error {np.abs(out - expected).max()}"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
