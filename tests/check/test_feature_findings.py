"""New-feature bugs reported with the right kind, the root line first and the fix.

Each bug is written as a PyPTO user writes it, run as a script through ``ptodist run`` / ``ptodist check``
with ``--report-json``, and compared with its fixed twin, which must be clean (under 20 schedules where the
report is a checker finding):

* a reduction over a tile's padding that nothing filled (upstream documents a reduction as reading the padding,
  undefined until ``pl.fillpad`` fills it) is an ``uninitialized_read`` under the checker, naming the reduction's
  line, then the load that made the tile; a plain run is unchanged;
* an error the driver raises (a ``prepare()`` option) carries under ``ptodist check`` the locations and text
  ``ptodist run --report-json`` gives it;
* a worker program that uses a submitted dispatch's output before its ``result()`` and then fails is a ``race``
  naming the host's lines, then the ``submit``;
* a chip call without ``device=`` that round-robin placement puts on another rank's slice (and that takes a
  window) warns at planning; when the script then fails, ``ptodist run`` and ``ptodist check`` report it first,
  as a ``dispatch_coverage`` finding at the call.
"""

from __future__ import annotations

import json
import textwrap
import warnings
from pathlib import Path

import pytest

from ptodist import cli
from ptodist.errors import PitfallWarning


def _script(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def _line(script: Path, marker: str) -> str:
    """``script:line`` of the line ending with ``# <marker>``."""
    hits = [i for i, t in enumerate(script.read_text().splitlines(), 1) if t.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return f"{script}:{hits[0]}"


def _report(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    rc = cli.main([args[0], "--report-json", str(out), *args[1:]])
    return rc, json.loads(out.read_text())


# -- reading a tile's padding ------------------------------------------------------------------------------------

PADDED = '''
    """Row reductions of a [4, 16] block whose last 6 columns are padding."""
    import torch

    import pypto.language as pl
    from pypto.runtime import RunConfig

    VALID = 10


    @pl.jit
    def reduce_rows(a: pl.Tensor[[4, 16], pl.FP32], hi: pl.Out[pl.Tensor[[4, 1], pl.FP32]],
                    total: pl.Out[pl.Tensor[[4, 1], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP):
            t = pl.load(a, [0, 0], [4, 16], valid_shape=[4, VALID])  # load
            FILL_MAX
            m = pl.row_max(t)  # max
            e = pl.exp(pl.row_expand_sub(t, m))
            FILL_SUM
            s = pl.row_sum(e)  # sum
            pl.store(m, [0, 0], hi)
            pl.store(s, [0, 0], total)
        return hi, total


    a = -torch.rand(4, 16) - 1.0
    hi, total = torch.zeros(4, 1), torch.zeros(4, 1)
    reduce_rows(a, hi, total, config=RunConfig(platform="a2a3sim"))
    x = a[:, :VALID]
    assert torch.allclose(hi[:, 0], x.max(dim=1).values)
    assert torch.allclose(total[:, 0], torch.exp(x - x.max(dim=1, keepdim=True).values).sum(dim=1))
    print("OK")
'''


def _padded(tmp_path: Path, fixed: bool, inplace: bool = False) -> Path:
    if inplace:  # the padding filled in the tile's own memory: the reductions read it, and what exp made of it
        src = PADDED.replace("FILL_MAX", "pl.tile.fillpad_inplace(t, pl.PadValue.min)").replace("FILL_SUM", "pass")
    else:
        src = PADDED.replace("FILL_MAX", "t = pl.fillpad(t, pad_value=pl.PadValue.min)" if fixed else "pass")
        src = src.replace("FILL_SUM", "e = pl.fillpad(e, pad_value=0)" if fixed else "pass")
    return _script(tmp_path, "fixed.py" if fixed else "padded.py", src)


def test_a_reduction_over_unfilled_padding_is_an_uninitialized_read_at_its_line(tmp_path):
    script = _padded(tmp_path, fixed=False)
    rc, doc = _report(tmp_path, "check", "--schedules", "1", str(script))
    assert rc == 1 and doc["status"] == "findings"
    found = doc["findings"]
    assert [f["kind"] for f in found] == ["uninitialized_read", "uninitialized_read"]
    (hi, total) = found
    load, at_max, at_sum = _line(script, "load"), _line(script, "max"), _line(script, "sum")
    # The reduction's line first, then the load whose valid_shape left the padding (carried through exp).
    assert hi["locations"] == [at_max, load] and total["locations"] == [at_sum, load]
    assert hi["ranks"] == [0] and hi["docs"] == "docs/pitfalls.md#silent-data-corruption"
    assert hi["message"] == (
        f"rank 0: pl.row_max at {at_max} reads the padding of a [4, 16] tile whose valid shape is [4, 10] (made by "
        f"pl.load with valid_shape at {load}). On a device a reduction reads the whole row, padding included, and "
        "nothing filled the padding (it is undefined until pl.fillpad fills it), so the device's result depends on "
        "whatever the buffer held; this run reduced the valid part only, so its numbers can differ from the "
        "device's.")
    assert hi["fix"] == (
        f"Fill the padding with the reduction's identity before pl.row_max at {at_max}: tile = pl.fillpad(tile, "
        "pad_value=pl.PadValue.min) (pl.PadValue.zero for a sum, pl.PadValue.min for a max, pl.PadValue.max for "
        "a min).")
    assert "pad_value=pl.PadValue.zero) " in total["fix"]


def test_a_plain_run_of_the_padding_read_is_unchanged(tmp_path, capsys):
    # Outside the checker the reductions read the valid part, as before: the script's own checks pass.
    rc, doc = _report(tmp_path, "run", str(_padded(tmp_path, fixed=False)))
    assert (rc, doc["status"], doc["findings"]) == (0, "ok", [])
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("inplace", [False, True], ids=["fillpad", "fillpad_inplace"])
def test_the_padding_reads_fixed_twin_is_clean(tmp_path, inplace):
    rc, doc = _report(tmp_path, "check", "--schedules", "20", str(_padded(tmp_path, fixed=True, inplace=inplace)))
    assert (rc, doc["status"], doc["findings"]) == (0, "ok", [])


# -- driver-side errors under the checker ------------------------------------------------------------------------

DRIVER = '''
    import torch

    import pypto.language as pl
    import pypto.language.distributed as pld
    from pypto import DistributedConfig, RunConfig

    SIZE = 8
    NR = pl.dynamic("NR")


    @pl.jit.incore
    def copy(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
        return pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], y)


    @pl.jit
    def per_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
        return copy(x, y)


    @pl.jit.host
    def host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            per_rank(x[r], y[r], device=r)
        return y


    x = torch.randn(2, 1, SIZE).share_memory_()
    y = torch.zeros(2, 1, SIZE).share_memory_()
    compiled = host.compile(x, y, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
    with compiled.prepare(persistent=PERSISTENT) as rt:  # prepare
        rt(x, y)
    assert torch.equal(x, y)
    print("OK")
'''


def test_a_driver_side_error_under_check_names_the_line_ptodist_run_names(tmp_path):
    # prepare()'s option check names no line in its message: both commands report the user's call.
    script = _script(tmp_path, "options.py", DRIVER.replace("PERSISTENT", '"yes"'))
    rc_run, run = _report(tmp_path, "run", str(script))
    rc_check, check = _report(tmp_path, "check", "--schedules", "1", str(script))
    assert rc_run == rc_check == 1
    assert run["findings"] == check["findings"]
    (f,) = check["findings"]
    assert (f["kind"], f["message"], f["locations"]) == (
        "invalid_argument", "prepare(persistent='yes'): must be True or False", [_line(script, "prepare")])


def test_the_driver_side_errors_fixed_twin_is_clean(tmp_path):
    script = _script(tmp_path, "options_fixed.py", DRIVER.replace("PERSISTENT", "True"))
    rc, doc = _report(tmp_path, "check", "--schedules", "20", str(script))
    assert (rc, doc["status"], doc["findings"]) == (0, "ok", [])


# -- a worker's output read before result() ----------------------------------------------------------------------

WORKER = '''
    import torch

    import pypto.language as pl
    import pypto.language.distributed as pld
    from pypto import DistributedConfig, RunConfig

    SIZE = 8
    NR = pl.dynamic("NR")


    @pl.jit.incore
    def double(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
        t = pl.load(x, [0, 0], [1, SIZE])
        return pl.store(pl.add(t, t), [0, 0], y)


    @pl.jit
    def per_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]]):
        return double(x, y)


    @pl.jit.host
    def host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            per_rank(x[r], y[r], device=r)
        return y


    x = torch.randn(2, 1, SIZE).share_memory_()
    y = torch.zeros(2, 1, SIZE).share_memory_()
    z = torch.zeros(2, 1, SIZE).share_memory_()
    compiled = host.compile(x, y, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
    with compiled.prepare() as rt:
        first = rt.submit(compiled, x, y)  # submit
        BODY
    assert abs(total - float((2 * x).sum())) < 1e-3, total
    assert torch.allclose(z, 4 * x)
    print("OK")
'''
EARLY = '''row = y[1]  # view
        total = float(row.sum())  # read
        first.result()
        rt.run(compiled, y, z)'''
FIXED = '''rows = y.shape[0]  # metadata only
        second = rt.submit(compiled, y, z)  # hands y on: the ranks run dispatches in order
        first.result()
        second.result()
        total = float(y[1].sum())'''


def _worker(tmp_path: Path, body: str, name: str) -> Path:
    return _script(tmp_path, name, WORKER.replace("BODY", body.replace("x).sum", "x[1]).sum")).replace(
        "float((2 * x).sum())", "float((2 * x[1]).sum())"))


def test_reading_a_workers_output_before_result_is_a_race_naming_the_read_then_the_submit(tmp_path):
    script = _worker(tmp_path, EARLY, "early.py")
    rc, doc = _report(tmp_path, "check", "--schedules", "1", str(script))
    assert rc == 1
    race, error = doc["findings"]
    view, read, submit = _line(script, "view"), _line(script, "read"), _line(script, "submit")
    # Both host lines that named the output before result(), in order, then the dispatch's.
    assert (race["kind"], race["locations"]) == ("race", [view, read, submit])
    assert race["message"] == (
        f"the host uses output 'y' of dispatch 0 of 'host', submitted at {submit}, before its result(): 'y' at "
        f"{view}, 'row' at {read}. On a device a submitted dispatch runs while the host goes on, so such a line sees "
        "the old data, the new, or a mix. Here the dispatch ran at result(), after those lines, and changed what "
        "they named.")
    assert race["fix"] == (
        "Call result() (or wait()) on the dispatch's handle before the host reads or writes its outputs: move the "
        "host's line below result(), or give that code other tensors.")
    assert error["kind"] == "script_error"  # the symptom comes after the cause


def test_the_early_reads_fixed_twin_is_clean(tmp_path):
    # Reading an output's shape and handing it to the next dispatch before result() touch no data.
    rc, doc = _report(tmp_path, "check", "--schedules", "20", str(_worker(tmp_path, FIXED, "fixed.py")))
    assert (rc, doc["status"], doc["findings"]) == (0, "ok", [])


# -- a chip call placed round-robin on another rank's slice --------------------------------------------------------

PLACED = '''
    import torch

    import pypto.language as pl
    import pypto.language.distributed as pld
    from pypto import DistributedConfig, RunConfig

    SIZE = 8
    NR = pl.dynamic("NR")


    @pl.jit.incore
    def add_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]]):
        me = pld.rank(pld.get_comm_ctx(data))
        t = pl.load(x, [0, 0], [1, SIZE])
        return pl.store(pl.add(t, pl.cast(me, target_type=pl.FP32)), [0, 0], y)


    @pl.jit
    def per_rank(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]]):
        return add_rank(x, y, data)


    @pl.jit
    def prep(s: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
        return s


    @pl.jit.host
    def host(x: pl.Tensor[[NR, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, SIZE], pl.FP32]],
             s: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
        buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
        data = pld.window(buf, [1, SIZE], dtype=pl.FP32)
        prep(s)  # prep
        for r in pl.range(pld.world_size()):
            per_rank(x[r], y[r], data DEVICE)  # dispatch
        return y


    x, y, s = torch.randn(2, 1, SIZE), torch.zeros(2, 1, SIZE), torch.ones(1, SIZE)
    host(x, y, s, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
    assert torch.allclose(y, x + torch.arange(2.0).view(2, 1, 1))  # check
    print("OK")
'''


def test_a_round_robin_call_on_another_ranks_slice_warns_and_is_the_failures_cause_under_check(tmp_path):
    script = _script(tmp_path, "placed.py", PLACED.replace(" DEVICE", ""))
    call, prep = _line(script, "dispatch"), _line(script, "prep")
    message = (f"per_rank() at {call} has no device=, so it runs on chip 1: chip calls without device= go round-robin "
               f"over the chips in submit order, and 1 came before it (the first at {prep}). It is given x[0], rank "
               "0's slice of 'x', so rank 1 runs it on rank 0's data, with its own windows and pld.rank. Pass "
               "device=r, the dispatch loop's rank, to run it on rank 0.")
    with pytest.warns(PitfallWarning) as warned:  # ptodist run: the program runs, as upstream runs it
        rc, doc = _report(tmp_path, "run", str(script))
    assert [str(w.message) for w in warned if w.category is PitfallWarning] == [message]
    # Its assert fails: the placement is reported first, as the cause, then the script's error.
    assert rc == 1 and [(f["kind"], f["locations"]) for f in doc["findings"]] == [
        ("dispatch_coverage", [call, prep]), ("script_error", [_line(script, "check")])]
    with pytest.warns(PitfallWarning):
        rc, doc = _report(tmp_path, "check", "--schedules", "1", str(script))
    assert rc == 1
    placed, error = doc["findings"]
    assert (placed["kind"], placed["message"], placed["locations"]) == ("dispatch_coverage", message, [call, prep])
    assert placed["fix"] == "Dispatch every rank exactly as `for r in pl.range(pld.world_size()): f(..., device=r)`."
    assert error["kind"] == "script_error"


def test_the_round_robin_placements_fixed_twin_is_clean(tmp_path):
    script = _script(tmp_path, "placed_fixed.py", PLACED.replace(" DEVICE", ", device=r"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PitfallWarning)
        rc, doc = _report(tmp_path, "check", "--schedules", "20", str(script))
    assert (rc, doc["status"], doc["findings"]) == (0, "ok", [])
