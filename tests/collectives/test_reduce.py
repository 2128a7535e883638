"""``pld.tensor.reduce``: root's target against numpy for every op, the other ranks' targets kept, the errors
for a wrong root, the status board and the trace.

The programs are test_collectives' (``build``: a kernel site and a host site); every run reads each rank's
signal back, so each also checks that the signals were left at zero.  "check" runs sim under ``ptodist check``,
which must find nothing in the collective's notifies, waits and remote loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import test_collectives as tc
from conftest import LOCAL_BACKENDS

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, dfx, ir, shared_array
from ptodist.backends import base
from ptodist.dfx import swimlane
from ptodist.errors import ProgramTypeError, ProgramValueError

THIS = Path(__file__).resolve()
Sum, Max, Min, Prod = pld.ReduceOp.Sum, pld.ReduceOp.Max, pld.ReduceOp.Min, pld.ReduceOp.Prod

# (op, dtype, P, root): every op, P = 2, 3 and 4, the first, a middle and the last rank as root.
CASES = [(Sum, pl.FP32, 2, 1), (Max, pl.INT32, 3, 2), (Min, pl.BF16, 4, 0), (Prod, pl.FP16, 3, 1),
         (Sum, pl.INT32, 4, 3), (Prod, pl.FP32, 2, 0)]


@pytest.mark.parametrize("backend", [*LOCAL_BACKENDS, "check"])
@pytest.mark.parametrize("where", ["kernel", "host"])
@pytest.mark.parametrize("op, dtype, nr, root", CASES, ids=[f"{o.name}-{d.name}-P{n}-root{r}" for o, d, n, r in CASES])
def test_root_gets_the_reduction_and_the_others_keep_their_data(op, dtype, nr, root, where, backend):
    xs, sig = [3, 5], [nr, 1]
    x = tc.random_values(np.random.default_rng(nr * 10 + root), dtype, (nr, *xs), op)

    def call(w):
        return pld.tensor.reduce(w.a, w.g, root=root, op=op)

    y, s, _ = tc.run(tc.build(nr, dtype, xs, sig, **tc.at_site(where, call)), nr, x, xs, sig, backend=backend)
    tc.assert_reduced(y[root], x, op, dtype)
    for r in range(nr):
        if r != root:
            np.testing.assert_array_equal(y[r], x[r])  # its own contribution, as it was
    tc.assert_signals_clear(s)


def test_op_defaults_to_sum_and_a_signal_may_be_one_dimensional():
    nr, xs = 3, [2, 4]
    x = np.arange(nr * 8, dtype=np.float32).reshape(nr, *xs)

    def call(w):
        return pld.tensor.reduce(w.a, w.g, root=2)

    y, s, _ = tc.run(tc.build(nr, pl.FP32, xs, [nr], kernel=call), nr, x, xs, [nr])
    np.testing.assert_array_equal(y[2], x.sum(axis=0))
    tc.assert_signals_clear(s)


@pytest.mark.parametrize("where", ["kernel", "host"])
def test_a_prepared_worker_reduces_call_after_call_on_one_signal(where, local_backend):
    """Kept ranks run the plan again with new data: the signal the last call used is clear for the next."""
    nr, xs, sig = 3, [2, 4], [3, 1]

    def call(w):
        return pld.tensor.reduce(w.a, w.g, root=1, op=Max)

    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=local_backend)
    compiled = ir.compile(tc.build(nr, pl.FP32, xs, sig, **tc.at_site(where, call)), config=config)
    with compiled.prepare() as rt:
        for i in range(3):
            x = shared_array((nr, *xs), np.float32)
            x[...] = np.random.default_rng(i).standard_normal((nr, *xs))
            y, s = shared_array((nr, *xs), np.float32), shared_array((nr, *sig), np.int32)
            rt(x, y, s)
            np.testing.assert_array_equal(y[1], x.max(axis=0))
            np.testing.assert_array_equal(y[[0, 2]], x[[0, 2]])
            tc.assert_signals_clear(s)


def root_out_of_range(w):
    return pld.tensor.reduce(w.a, w.g, root=3)  # @root_out_of_range


def root_float(w):
    return pld.tensor.reduce(w.a, w.g, root=1.0)  # @root_float


def int64_target(w):
    return pld.tensor.reduce(w.a, w.g, root=0)  # @int64_target


def _site(marker: str) -> str:
    lines = THIS.read_text().splitlines()
    (line,) = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# @{marker}")]
    return f"{THIS}:{line}"


ERRORS = {
    "root_out_of_range": (root_out_of_range, pl.FP32, ProgramValueError,
                          "pld.tensor.reduce at {}: root=3 is outside [0, 3)"),
    "root_float": (root_float, pl.FP32, ProgramTypeError,
                   "pld.tensor.reduce at {}: root= must be a Python int (a rank index known when the program is "
                   "built), got 1.0 (float)"),
    "int64_target": (int64_target, pl.INT64, ProgramTypeError,
                     "pld.tensor.reduce at {}: reduce supports FP32, FP16, BF16, INT32; window 'abuf' [2, 4] INT64 "
                     "is INT64"),
}


@pytest.mark.parametrize("where", ["kernel", "host"])
@pytest.mark.parametrize("name", sorted(ERRORS))
def test_a_wrong_root_or_dtype_is_refused_at_the_call(name, where, monkeypatch):
    fn, dtype, exc, text = ERRORS[name]
    nr, xs, sig = 3, [2, 4], [3, 1]
    prog = tc.build(nr, dtype, xs, sig, **tc.at_site(where, fn))
    x = np.zeros((nr, *xs), dtype.np_dtype)
    if where == "host":
        tc.forbid_ranks(monkeypatch)  # refused while planning, before any rank starts
        with pytest.raises(exc) as info:
            tc.run(prog, nr, x, xs, sig)
        err = info.value
    else:
        with pytest.raises(RankError) as info:
            tc.run(prog, nr, x, xs, sig)
        assert {f.rank for f in info.value.failures} == set(range(nr))
        err = info.value.original
        assert isinstance(err, exc)
    assert str(err) == text.format(_site(name))  # the same words at both sites


def _last_operation(w):
    from ptodist import context

    out = pld.tensor.reduce(w.a, w.g, root=0)  # @status
    ctx = context.current()
    print(f"SEEN|{int(w.me)}|{base.last_activity(ctx.status, ctx.rank)}", flush=True)
    return out


def test_the_status_board_names_the_reduce_and_its_line(capsys):
    nr, xs, sig = 2, [1, 4], [2, 1]
    tc.run(tc.build(nr, pl.FP32, xs, sig, kernel=_last_operation), nr, np.ones((nr, *xs), np.float32), xs, sig,
           backend="sim")
    seen = dict(line.split("SEEN|", 1)[1].split("|", 1) for line in capsys.readouterr().out.splitlines()
                if "SEEN|" in line)
    want = f"its last operation was pld.tensor.reduce at {_site('status')}"
    assert set(seen) == {"0", "1"} and all(want in said for said in seen.values()), seen


@pytest.mark.parametrize("where", ["kernel", "host"])
def test_the_trace_shows_the_reduce_around_its_operations(where, tmp_path):
    nr, xs, sig = 3, [2, 4], [3, 1]
    x = np.arange(nr * 8, dtype=np.float32).reshape(nr, *xs)

    def call(w):
        return pld.tensor.reduce(w.a, w.g, root=1)

    out = tmp_path / "out"
    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), output_dir=str(out),
                       enable_chip_swimlane=True)
    compiled = ir.compile(tc.build(nr, pl.FP32, xs, sig, **tc.at_site(where, call)), config=config)
    y, s = np.zeros((nr, *xs), np.float32), np.zeros((nr, *sig), np.int32)
    compiled(x, y, s)
    np.testing.assert_array_equal(y[1], x.sum(axis=0))
    for r in range(nr):
        recs = json.loads((dfx.latest_run(out) / f"rank{r}" / "d0" / swimlane.RECORDS).read_text())["records"]
        (coll,) = [rec for rec in recs if rec["kind"] == "collective" and rec["name"] == "pld.tensor.reduce"]
        inside = [rec for rec in recs if rec["kind"] in ("notify", "wait", "rma")
                  and coll["start"] <= rec["start"] and rec["end"] <= coll["end"]]
        assert {rec["kind"] for rec in inside} >= ({"notify", "wait", "rma"} if r == 1 else {"notify", "wait"})
