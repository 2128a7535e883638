"""Tensor-parallel GEMM: every rank multiplies its shards, then an allreduce sums the partial products.

``C = A @ B`` with ``A`` ``[M, K]`` and ``B`` ``[K, N]``, the contraction
dimension ``K`` split over the P ranks (``K = P * KS``):

* rank r holds column shard r of ``A`` (``A[:, r*KS:(r+1)*KS]``, ``[M, KS]``)
  and row shard r of ``B`` (``B[r*KS:(r+1)*KS, :]``, ``[KS, N]``); the host
  passes them as ``a[r]`` and ``b[r]`` of ``[P, M, KS]`` / ``[P, KS, N]``
  tensors;
* each rank computes its partial product ``A_r @ B_r`` (``pl.matmul`` on two
  tiles, FP32 accumulation) into its ``part`` window;
* ``pld.tensor.allreduce(part, ...)`` sums the P partial products, so every
  rank's window holds ``sum_r A_r @ B_r = A @ B``; each rank copies it to its
  ``c[r]``.

``--mode`` picks the allreduce schedule (``ring``: a ``[2(P-1), P]`` signal,
one row per round; ``mesh``: ``[P, 1]``), ``--where`` where it is called:
inside the kernel, right after the matmul (``kernel``), or in the host
orchestrator between the matmul dispatches and the copy-out dispatches
(``host``, a builtin task on every rank).

The output is ``[M, N] = [5, 7]``: 35 elements, divisible by no P > 1, so the
ring's P segments of the flat result are uneven (and for P = 4 the mesh's
chunks too); the allreduce must still cover every element exactly once.
"""

from __future__ import annotations

import argparse

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

M, N = 5, 7  # the output: M * N = 35 elements, odd
KS = 8       # each rank's share of the contraction dimension K = P * KS


def signal_shape(nr: int, mode: str) -> list[int]:
    """The signal the allreduce needs: ``[2(nr-1), nr]`` for the ring, ``[nr, 1]`` for the mesh."""
    return [2 * (nr - 1), nr] if mode == "ring" else [nr, 1]


def build(nr: int, mode: str, where: str):
    """Return the tensor-parallel GEMM program for ``nr`` ranks (``mode``, ``where``: closure constants)."""
    sig_shape = signal_shape(nr, mode)

    @pl.program
    class TpGemm:
        @pl.function(type=pl.FunctionType.InCore)
        def partial_gemm(self, a: pl.Tensor[[M, KS], pl.FP32], b: pl.Tensor[[KS, N], pl.FP32],
                         part: pl.InOut[pld.DistributedTensor[[M, N], pl.FP32]]):
            tile_a = pl.load(a, [0, 0], [M, KS])
            tile_b = pl.load(b, [0, 0], [KS, N])
            return pl.store(pl.matmul(tile_a, tile_b), [0, 0], part)  # A_r @ B_r, FP32 accumulation

        @pl.function(type=pl.FunctionType.InCore)
        def gemm_allreduce(self, a: pl.Tensor[[M, KS], pl.FP32], b: pl.Tensor[[KS, N], pl.FP32],
                           c: pl.Out[pl.Tensor[[M, N], pl.FP32]],
                           part: pl.InOut[pld.DistributedTensor[[M, N], pl.FP32]],
                           sig: pl.InOut[pld.DistributedTensor[sig_shape, pl.INT32]]):
            tile_a = pl.load(a, [0, 0], [M, KS])
            tile_b = pl.load(b, [0, 0], [KS, N])
            part = pl.store(pl.matmul(tile_a, tile_b), [0, 0], part)
            part = pld.tensor.allreduce(part, sig, op=pld.ReduceOp.Sum, mode=mode)  # sum over the ranks
            return pl.store(pl.load(part, [0, 0], [M, N]), [0, 0], c)

        @pl.function(type=pl.FunctionType.InCore)
        def copy_out(self, c: pl.Out[pl.Tensor[[M, N], pl.FP32]],
                     part: pld.DistributedTensor[[M, N], pl.FP32]):
            return pl.store(pl.load(part, [0, 0], [M, N]), [0, 0], c)

        @pl.function(type=pl.FunctionType.Orchestration)
        def fused_rank(self, a: pl.Tensor[[M, KS], pl.FP32], b: pl.Tensor[[KS, N], pl.FP32],
                       c: pl.Out[pl.Tensor[[M, N], pl.FP32]],
                       part: pl.InOut[pld.DistributedTensor[[M, N], pl.FP32]],
                       sig: pl.InOut[pld.DistributedTensor[sig_shape, pl.INT32]]):
            return self.gemm_allreduce(a, b, c, part, sig)

        @pl.function(level=pl.Level.CHIP)
        def gemm_rank(self, a: pl.Tensor[[M, KS], pl.FP32], b: pl.Tensor[[KS, N], pl.FP32],
                      part: pl.InOut[pld.DistributedTensor[[M, N], pl.FP32]]):
            return self.partial_gemm(a, b, part)

        @pl.function(level=pl.Level.CHIP)
        def copy_rank(self, c: pl.Out[pl.Tensor[[M, N], pl.FP32]],
                      part: pld.DistributedTensor[[M, N], pl.FP32]):
            return self.copy_out(c, part)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def tp_gemm(self, a: pl.Tensor[[nr, M, KS], pl.FP32], b: pl.Tensor[[nr, KS, N], pl.FP32],
                    c: pl.Out[pl.Tensor[[nr, M, N], pl.FP32]]):
            part_buf = pld.alloc_window_buffer([M, N], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer(sig_shape, dtype=pl.INT32)
            part = pld.window(part_buf, [M, N], dtype=pl.FP32)
            sig = pld.window(sig_buf, sig_shape, dtype=pl.INT32)
            if where == "kernel":
                for r in pl.range(pld.world_size()):
                    self.fused_rank(a[r], b[r], c[r], part, sig, device=r)
            else:
                for r in pl.range(pld.world_size()):
                    self.gemm_rank(a[r], b[r], part, device=r)
                part = pld.tensor.allreduce(part, sig, mode=mode)  # a builtin task on every rank
                for r in pl.range(pld.world_size()):
                    self.copy_rank(c[r], part, device=r)
            return c

    return TpGemm


def shard(a: np.ndarray, b: np.ndarray, nr: int) -> tuple[np.ndarray, np.ndarray]:
    """Column shards of ``a`` ``[nr, M, KS]`` and row shards of ``b`` ``[nr, KS, N]``, contiguous."""
    a_shards = np.ascontiguousarray(a.reshape(M, nr, KS).transpose(1, 0, 2))
    b_shards = np.ascontiguousarray(b.reshape(nr, KS, N))
    return a_shards, b_shards


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--mode", default="ring", choices=["ring", "mesh"], help="the allreduce's schedule")
    ap.add_argument("--where", default="kernel", choices=["kernel", "host"],
                    help="call the allreduce inside the kernel or in the host orchestrator")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)
    if nr < 2:
        ap.error("tensor parallelism needs at least 2 ranks")

    rng = np.random.default_rng(args.seed)
    a = rng.standard_normal((M, nr * KS)).astype(np.float32)
    b = rng.standard_normal((nr * KS, N)).astype(np.float32)
    a_shards, b_shards = shard(a, b, nr)
    c = np.zeros((nr, M, N), np.float32)

    compiled = ir.compile(build(nr, args.mode, args.where), platform=args.platform,
                          distributed_config=DistributedConfig(device_ids=ids))
    compiled(a_shards, b_shards, c)

    expected = a.astype(np.float64) @ b.astype(np.float64)
    for r in range(nr):
        err = np.abs(c[r] - expected).max()
        assert np.allclose(c[r], expected, rtol=1e-4, atol=1e-4), \
            f"{args.mode}/{args.where} P={nr} rank {r}: max error {err}"
    # One owner reduces each element (mesh) or segment (ring), so the ranks' copies agree bit for bit.
    assert all(np.array_equal(c[r], c[0]) for r in range(nr)), "the ranks' results differ"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
