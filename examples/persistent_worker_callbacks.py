"""A persistent DistributedWorker: several steps, a host callback between two segments of each step.

The ranks start once (``compiled.prepare(persistent=True, ...)``) and run
STEPS dispatches of one program. Each dispatch (step ``s``) is:

1. **produce** on every rank: ``mid[r] = x[r] * w[r]``. ``x`` is a resident
   tensor (``rt.alloc_tensor``), ``w`` a stacked one
   (``rt.alloc_stacked_tensor``: shard r lives on rank r); ``mid`` is a host
   tensor.
2. **inspect**, a sub-worker function (``role=pl.Role.SubWorker``, body
   ``...``): the host callback bound by ``prepare(callbacks={"inspect": fn})``.
   It runs in the driver once every rank has finished segment 1, gets one
   ``args`` object (PyPTO's convention: ``args.tensor(0)`` is ``mid``,
   ``args.scalar(0)`` the step), records ``mid``'s largest magnitude and
   adds the step to ``mid`` in place: a host-side correction the ranks see
   in segment 2.
3. **publish** on every rank: stage ``mid[r]`` in the ``data`` window and
   notify the right neighbour; then ``pld.system.defer_wait`` on the left
   neighbour's token: the task does not *complete* until the left neighbour
   has published, so the rank's next task may read it (deferred completion:
   the kernel body itself does not block).
4. **gather** on every rank: ``acc += data[me] + data[left]`` (``acc`` a
   window) and ``y[r] = acc``.

``persistent=True, reset_persistent_windows=False`` keeps the windows across
the dispatches: ``acc`` is a running sum over the steps, and the signal
counters keep counting, so step ``s`` waits for a count of ``s + 1``.

The driver keeps two dispatches in flight (``rt.submit``), each with its own
``mid`` / ``y`` host tensors (shared memory: ``ptodist.shared_array``), and
checks each step's ``y`` (``handle.result()``) against numpy.
"""

from __future__ import annotations

import argparse

import numpy as np

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

SIZE = 16
STEPS = 5


def build(nr: int):
    """Return the program for ``nr`` ranks."""

    @pl.program
    class PersistentSteps:
        @pl.function(type=pl.FunctionType.InCore)
        def produce(self, x: pl.Tensor[[1, SIZE], pl.FP32], w: pl.Tensor[[1, SIZE], pl.FP32],
                    mid: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
            return pl.store(pl.mul(pl.load(x, [0, 0], [1, SIZE]), pl.load(w, [0, 0], [1, SIZE])), [0, 0], mid)

        @pl.function(type=pl.FunctionType.InCore)
        def publish(self, mid: pl.Tensor[[1, SIZE], pl.FP32],
                    data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                    sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                    step: pl.Scalar[pl.INT32]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            data = pl.store(pl.load(mid, [0, 0], [1, SIZE]), [0, 0], data)
            # Tell the right neighbour my row is staged; complete only once the left one's is.
            pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            pld.system.defer_wait(sig, [(me + n - 1) % n, 0], step + 1, cmp=pld.WaitCmp.Ge)
            return data

        @pl.function(type=pl.FunctionType.InCore)
        def gather(self, y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                   data: pld.DistributedTensor[[1, SIZE], pl.FP32],
                   acc: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            left = pld.tile.remote_load(data, (me + n - 1) % n, [0, 0], [1, SIZE])
            total = pl.add(pl.load(acc, [0, 0], [1, SIZE]), pl.add(pl.load(data, [0, 0], [1, SIZE]), left))
            acc = pl.store(total, [0, 0], acc)
            return pl.store(total, [0, 0], y)

        @pl.function(level=pl.Level.CHIP)
        def produce_rank(self, x: pl.Tensor[[1, SIZE], pl.FP32], w: pl.Tensor[[1, SIZE], pl.FP32],
                         mid: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
            return self.produce(x, w, mid)

        @pl.function(level=pl.Level.CHIP)
        def combine_rank(self, mid: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                         data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                         acc: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                         sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                         step: pl.Scalar[pl.INT32]):
            self.publish(mid, data, sig, step)  # completes once the left neighbour has published
            return self.gather(y, data, acc)

        @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
        def inspect(self, mid: pl.Tensor[[nr, 1, SIZE], pl.FP32], step: pl.Scalar[pl.INT32]):
            ...

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def step_fn(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], w: pl.Tensor[[nr, 1, SIZE], pl.FP32],
                    mid: pl.InOut[pl.Tensor[[nr, 1, SIZE], pl.FP32]],
                    y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]], step: pl.Scalar[pl.INT32]):
            data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            acc_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
            acc = pld.window(acc_buf, [1, SIZE], dtype=pl.FP32)
            sig = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.produce_rank(x[r], w[r], mid[r], device=r)
            self.inspect(mid, step)  # the driver's callback, between the two segments
            for r in pl.range(pld.world_size()):
                self.combine_rank(mid[r], y[r], data, acc, sig, step, device=r)
            return y

    return PersistentSteps


class Inspector:
    """The ``inspect`` callback: records each step's largest |mid| and adds the step to ``mid``."""

    def __init__(self):
        self.peaks: dict[int, float] = {}

    def __call__(self, args) -> None:
        mid, step = args.tensor(0), int(args.scalar(0))
        self.peaks[step] = float(np.abs(mid).max())
        mid += np.float32(step)  # in place: segment 2 of this dispatch reads the corrected values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-d", "--device", default="0,1,2,3", help="comma-separated device ids, one rank each")
    ap.add_argument("-p", "--platform", default="a2a3sim", choices=["a2a3sim", "a2a3", "a5sim", "a5"])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ids = [int(d) for d in args.device.split(",")]
    nr = len(ids)
    if nr < 2:
        ap.error("the ring exchange needs at least 2 ranks")

    rng = np.random.default_rng(args.seed)
    x_host = rng.standard_normal((nr, 1, SIZE)).astype(np.float32)
    w_host = rng.standard_normal((nr, 1, SIZE)).astype(np.float32)
    # Two sets of host tensors, one per dispatch in flight; shared memory, so the ranks see them in place.
    mids = [ptodist.shared_array((nr, 1, SIZE), np.float32) for _ in range(2)]
    ys = [ptodist.shared_array((nr, 1, SIZE), np.float32) for _ in range(2)]

    compiled = ir.compile(build(nr), platform=args.platform, distributed_config=DistributedConfig(device_ids=ids))
    inspector = Inspector()

    # The golden, step by step: acc[r] += mid[r] + mid[left]; mid = x * w + step.
    left = [(r + nr - 1) % nr for r in range(nr)]
    acc = np.zeros((nr, 1, SIZE), np.float32)
    expected = []
    for step in range(args.steps):
        m = x_host * w_host + np.float32(step)
        acc = acc + (m + m[left])
        expected.append(acc.copy())

    with compiled.prepare(persistent=True, reset_persistent_windows=False,
                          callbacks={"inspect": inspector}) as rt:
        x = rt.alloc_tensor((nr, 1, SIZE), pl.FP32, init=x_host)  # resident: no copy at dispatch
        w = rt.alloc_stacked_tensor(w_host)                           # shard r lives on rank r
        handles = []
        for step in range(args.steps):
            if len(handles) == 2:  # two in flight: finish the oldest before reusing its buffers
                done_step, h = handles.pop(0)
                check(h.result(), expected[done_step], done_step, nr)
            handles.append((step, rt.submit(compiled, x, w, mids[step % 2], ys[step % 2], step)))
        for done_step, h in handles:
            check(h.result(), expected[done_step], done_step, nr)
        rt.free_stacked_tensor(w)
        rt.free_tensor(x)

    assert sorted(inspector.peaks) == list(range(args.steps)), inspector.peaks
    peak = float(np.abs(x_host * w_host).max())
    assert all(np.isclose(p, peak, rtol=1e-6) for p in inspector.peaks.values()), (inspector.peaks, peak)
    print("OK")
    return 0


def check(outputs, expected: np.ndarray, step: int, nr: int) -> None:
    """``outputs`` is what ``handle.result()`` returned: (mid, y), the InOut and Out host tensors."""
    _, y = outputs
    assert np.allclose(y, expected, rtol=1e-5, atol=1e-5), \
        f"P={nr} step {step}: max error {np.abs(y - expected).max()}"


if __name__ == "__main__":
    raise SystemExit(main())
