"""A hang's likely cause follows the evidence the ranks hold on the status board: the notifies they sent and where
they landed, the cells the blocked ranks wait on, the ranks that finished.

* Notifies on cells nobody waits on point at the wrong peer (the same cell on another rank) or the wrong index
  (another cell of the waiting rank): the report says where the missing notifies went, and asks about the rank
  or cell that waits.
* A cell every other rank already notified, still short: the wait counts more than the program sends.
* A cycle of waits with no misdirected notify is still a rank that waits before it notifies.

The report is the same on sim (``ptodist check``) and shm (``ptodist run``) but for its first line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import marker_line, signal_program
from test_mpi import _mpirun, needs_mpi

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, RunConfig, cli
from ptodist.check import findings, hang

NR = pl.dynamic("NR")
SIZE = 4


def _line(marker: str) -> str:
    return f"{__file__}:{marker_line(__file__, marker)}"


def _hang(body, backend: str = "sim", world: int = 3, cols: int = 1) -> HangError:
    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(world))), backend=backend,
                       hang_timeout_s=30)
    with pytest.raises(HangError) as info:
        signal_program(body, cols, SIZE)(np.zeros((world, 1, SIZE), np.float32), config=config)
    return info.value


def _below_head(error: HangError) -> str:
    """The report without its first line (how the stall was detected) and with its times as N."""
    return re.sub(r"\(waiting \d+\.\d+ s\)", "(waiting N s)", str(error).split("\n", 1)[1])


# -- a notify to the wrong peer ------------------------------------------------------------------------------------

def _to_the_next(sig, me, n) -> None:
    """Every rank reports to the root, rank 0, which waits for n - 1 reports; the reports go to (me + 1) % n."""
    if me == 0:
        pld.system.wait(sig, [0, 0], n - 1, cmp=pld.WaitCmp.Ge)  # @root wait
    else:
        pld.system.notify(sig, (me + 1) % n, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @wrong peer


def test_a_notify_to_the_wrong_peer_is_named_with_where_it_went(backend):
    error = _hang(_to_the_next, backend)
    notify, wait = _line("wrong peer"), _line("root wait")
    assert _below_head(error) == (
        f"  rank 0 (device 0): blocked at {wait} in kernel 'kernel': pld.system.wait on 'sig' (buffer 'sig_buf') cell "
        "[0, 0] holds 1, needs >= 2 (waiting N s)\n"
        f"      received 1 notify(s): +1 from rank 2 at {notify}\n"
        "  rank 1 (device 1): finished\n"
        "  rank 2 (device 2): finished\n"
        f"Likely cause: a notify went to the wrong peer: rank 1 notified rank 2's 'sig' cell [0, 0] at {notify}, "
        "where nobody waits on it (rank 2 finished); rank 0 waits on 'sig' cell [0, 0] at "
        f"{wait} for >= 2 and holds 1. Did you mean to notify rank 0?")
    (f,) = findings.from_exception(error)
    assert f.kind == "hang" and f.ranks == [0] and f.docs == "docs/pitfalls.md#all-ranks-hang"
    assert f.locations == [notify, wait] and f.fix == hang.FIX_WRONG_PEER


def test_every_notify_that_went_astray_is_listed():
    notify, wait = _line("wrong peer"), _line("root wait")
    cause = _hang(_to_the_next, world=4).diagnosis["cause"]
    assert cause == (
        "notifies went to the wrong peer: rank 1 notified rank 2's 'sig' cell [0, 0] and rank 2 notified rank 3's "
        f"'sig' cell [0, 0] at {notify}, where nobody waits on them (ranks 2 and 3 finished); rank 0 waits on 'sig' "
        f"cell [0, 0] at {wait} for >= 3 and holds 1. Did you mean to notify rank 0?")
    many = _hang(_to_the_next, world=6).diagnosis["cause"]  # the first three, then how many more
    assert many.startswith(
        "notifies went to the wrong peer: rank 1 notified rank 2's 'sig' cell [0, 0], rank 2 notified rank 3's 'sig' "
        f"cell [0, 0], rank 3 notified rank 4's 'sig' cell [0, 0] and 1 more like them at {notify}, where nobody "
        "waits on them (ranks 2, 3, 4 and 5 finished); ")


SCRIPT = '''\
import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

NR = pl.dynamic("NR")


@pl.jit.incore
def report(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(sig))
    n = pld.nranks(pld.get_comm_ctx(sig))
    if me == 0:
        pld.system.wait(sig, [0], n - 1, cmp=pld.WaitCmp.Ge)
    else:
        pld.system.notify(sig, (me + 1) % n, [0], 1, op=pld.NotifyOp.AtomicAdd)
    return y


@pl.jit
def per_rank(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[1], pl.INT32]]):
    return report(y, sig)


@pl.jit.host
def host(y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
    buf = pld.alloc_window_buffer([1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        per_rank(y[r], pld.window(buf, [1], dtype=pl.INT32), device=r)


host(np.zeros((3, 1, 4), np.float32), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1, 2])))
'''


def _script(tmp_path: Path) -> tuple[Path, str, str, str]:
    """SCRIPT in a file: its path, its notify's and its wait's lines, and the cause its hang report names."""
    script = tmp_path / "gather.py"
    script.write_text(SCRIPT)
    wait, notify = f"{script}:15", f"{script}:17"
    cause = (f"Likely cause: a notify went to the wrong peer: rank 1 notified rank 2's 'sig' cell [0] at {notify}, "
             f"where nobody waits on it (rank 2 finished); rank 0 waits on 'sig' cell [0] at {wait} for >= 2 and "
             "holds 1. Did you mean to notify rank 0?")
    return script, notify, wait, cause


@pytest.mark.parametrize("command", ["check", "run"])
def test_ptodist_check_and_run_report_the_wrong_peer_in_their_findings_and_json(command, tmp_path, capsys,
                                                                                monkeypatch):
    script, notify, wait, cause = _script(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main([command, "--report-json", str(tmp_path / "r.json"), str(script)]) == 1
    err = capsys.readouterr().err
    assert f"{cause}\n" in err and f"  at {notify}, {wait}\n  fix: {hang.FIX_WRONG_PEER}\n" in err
    (f,) = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert f["kind"] == "hang" and f["fix"] == hang.FIX_WRONG_PEER and f["locations"] == [notify, wait]
    assert cause in f["message"]


@needs_mpi
def test_under_mpirun_the_report_names_the_wrong_peer(tmp_path):
    script, notify, wait, cause = _script(tmp_path)
    proc = _mpirun(3, [sys.executable, "-m", "ptodist", "run", str(script)])
    assert proc.returncode != 0
    assert f"{cause}\n" in proc.stderr and f"  fix: {hang.FIX_WRONG_PEER}\n" in proc.stderr, proc.stderr[-4000:]


def _next_only(sig, me, n) -> None:
    """A barrier on one counter cell per rank, for n - 1 arrivals; each rank notifies only its next rank."""
    pld.system.notify(sig, (me + 1) % n, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @next only
    pld.system.wait(sig, [0, 0], n - 1, cmp=pld.WaitCmp.Ge)  # @barrier wait


def test_a_notify_that_reaches_one_of_the_ranks_waiting_for_it_names_the_others(backend):
    error = _hang(_next_only, backend)
    notify, wait = _line("next only"), _line("barrier wait")
    assert error.diagnosis["cause"] == (
        f"rank 1 notified 'sig' cell [0, 0] on rank 2 at {notify} but never on rank 0, which waits on it at {wait} "
        "for >= 2 and holds 1 (from rank 2): a notify changes the cell on its peer only, so every rank that waits "
        "needs its own. Did you mean to notify rank 0 as well? The waits of ranks 1 and 2 miss notifies the same "
        "way.")
    assert "waits before it notifies" not in str(error)
    (f,) = findings.from_exception(error)
    assert f.kind == "hang" and f.locations == [notify, wait] and f.fix == hang.FIX_WRONG_PEER


# -- a notify to the right rank, on the wrong cell -----------------------------------------------------------------

def _to_cell_zero(sig, me, n) -> None:
    """The root waits for each rank's report on that rank's row; the reports all go to row 0."""
    if me == 0:
        for src in range(1, n):
            pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)  # @row wait
    else:
        pld.system.notify(sig, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @wrong row


def test_a_notify_to_the_wrong_cell_names_the_cell_the_rank_waits_on():
    error = _hang(_to_cell_zero)
    notify, wait = _line("wrong row"), _line("row wait")
    assert error.diagnosis["cause"] == (
        f"notifies went to the wrong cell: ranks 1 and 2 notified rank 0's 'sig' cell [0, 0] at {notify}, where "
        f"nobody waits on it; rank 0 waits on 'sig' cell [1, 0] at {wait} for >= 1 and holds 0. Did you mean to "
        "notify 'sig' cell [1, 0]?")
    (f,) = findings.from_exception(error)
    assert f.kind == "hang" and f.locations == [notify, wait] and f.fix == hang.FIX_WRONG_INDEX


def _two_phases(sig, me, n) -> None:
    """A barrier on column 0 that completes, then one on column 1 whose waits come before its notifies."""
    for peer in range(n):
        pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for src in range(n):
        pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)
    for src in range(n):
        pld.system.wait(sig, [src, 1], 1, cmp=pld.WaitCmp.Ge)
    for peer in range(n):
        pld.system.notify(sig, peer, [me, 1], 1, op=pld.NotifyOp.AtomicAdd)


def test_an_earlier_phase_of_ranks_still_running_is_not_taken_for_a_wrong_cell():
    # The first barrier's notifies sit on column 0, which nobody waits on any more; the ranks that sent them are
    # blocked, and may yet send what the waits need: no notify of theirs is named as one that went astray.
    error = _hang(_two_phases, cols=2)
    assert "Did you mean" not in str(error) and "wrong cell" not in str(error)


# -- a wait for more notifies than the program sends ---------------------------------------------------------------

def _one_too_many(sig, me, n) -> None:
    """Every other rank reports to the root, which waits for n reports instead of n - 1."""
    if me == 0:
        pld.system.wait(sig, [0, 0], n, cmp=pld.WaitCmp.Ge)  # @count wait
    else:
        pld.system.notify(sig, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @report


def test_a_count_short_by_one_says_it_waits_for_more_than_will_come(backend):
    error = _hang(_one_too_many, backend)
    notify, wait = _line("report"), _line("count wait")
    assert error.diagnosis["cause"] == (
        f"rank 0 waits on 'sig' cell [0, 0] at {wait} for >= 3 and holds 2, but every other rank already notified "
        f"it (ranks 1 and 2, at {notify}) and finished, and no notify on 'sig_buf' went to a cell nobody waits on: it "
        "waits for 1 more than the program sends. Wait for 2 (n - 1 when a rank does not notify itself), or add "
        "the missing notify.")
    assert "waits before it notifies" not in str(error)
    (f,) = findings.from_exception(error)
    assert f.kind == "hang" and f.locations == [wait, notify] and f.fix == hang.FIX_SHORT_COUNT


# -- a rank waiting alone, for ranks that finished without notifying ----------------------------------------------

def _guarded(sig, me, n) -> None:
    """The root waits for n - 1 reports; a guard meant as ``me > 0`` skips every report."""
    if me == 0:
        pld.system.wait(sig, [0, 0], n - 1, cmp=pld.WaitCmp.Ge)  # @alone wait
    elif me > n:
        pld.system.notify(sig, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)


def test_a_rank_left_waiting_alone_names_the_ranks_that_never_notified_it(backend):
    error = _hang(_guarded, backend)
    wait = _line("alone wait")
    assert error.diagnosis["cause"] == (
        f"ranks 1 and 2 finished without notifying the cell rank 0 waits on ('sig' cell [0, 0] at {wait}, for >= 2, "
        "holding 0); no notify reached it, and no rank is left to send more. Check the notify in the code those "
        "ranks ran: a condition that skipped it, or a peer or index of another comm domain; or, if they are not "
        "meant to notify it, wait for what the others send.")
    assert "waits before it notifies" not in str(error)
    (f,) = findings.from_exception(error)
    assert f.kind == "hang" and f.locations == [wait] and f.fix == hang.FIX_PEER_SKIPPED


# -- a genuine wait-for cycle stays "waits before it notifies" -----------------------------------------------------

def _wait_then_notify(sig, me, n) -> None:
    """A ring in which every rank waits for its right neighbour before it notifies its left one."""
    pld.system.wait(sig, [(me + 1) % n, 0], 1, cmp=pld.WaitCmp.Ge)  # @cycle wait
    pld.system.notify(sig, (me - 1 + n) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)


def test_a_cycle_of_waits_with_no_misdirected_notify_waits_before_it_notifies():
    error = _hang(_wait_then_notify)
    assert "Wait-for cycle: rank 0 -> rank 1 -> rank 2 -> rank 0" in str(error)
    assert error.diagnosis["cause"].startswith("no blocked rank had notified anyone before it began to wait: every "
                                               "rank waits before it notifies.")
    (f,) = findings.from_exception(error)
    assert f.kind == "hang" and f.fix == hang.FIX_WAIT_FIRST and f.locations == [_line("cycle wait")]
