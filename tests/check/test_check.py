"""``ptodist check``: the sim backend's schedules and the happens-before checker.

For every race-like row of SPEC §8.3 (steps 05, 06, 08, 09, 13, 16) a buggy
program — a tutorial example with the pitfall put in — passes its golden on
some schedules, yet ``check`` flags it on the first, naming the line marked
``# BUG``.  The correct examples give no findings under many schedules; a
deadlock is reported exactly and at once; a seed replays its schedule.
"""

from __future__ import annotations

import json
import runpy
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import marker_line, on_every_rank, signal_program, window_program

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, RunConfig, cli, commands, ir
from ptodist.check import explore
from ptodist.errors import CheckError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BUG = "# BUG"


def _edit(stem: str, *edits: tuple[str, str]) -> str:
    """Example ``stem``'s source with each (old, new) edit made once (old must be there)."""
    src = (EXAMPLES / f"{stem}.py").read_text()
    for old, new in edits:
        assert src.count(old) >= 1, f"{stem}: the text to edit is gone:\n{old}"
        src = src.replace(old, new, 1)
    return src


def _barrier(sig: str, indent: str, cell_me: str = "[me, 0]", cell_src: str = "[src, 0]") -> str:
    return textwrap.indent(textwrap.dedent(f"""\
        for peer in pl.range(n):
            if peer != me:
                pld.system.notify({sig}, peer, {cell_me}, 1, op=pld.NotifyOp.AtomicAdd)
        for src in pl.range(n):
            if src != me:
                pld.system.wait({sig}, {cell_src}, 1, cmp=pld.WaitCmp.Ge)
        """), indent)


TWO_LAYOUTS = '''
"""Step 16's pitfall by hand: one signal buffer viewed in a mesh layout and then in a ring layout."""
import argparse

import torch

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

SIZE = 64


def build(nr):
    @pl.program
    class TwoLayouts:
        @pl.function(type=pl.FunctionType.InCore)
        def step(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 mesh: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                 ring: pl.InOut[pld.DistributedTensor[[2 * (nr - 1), nr], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            me = pld.rank(ctx)
            n = pld.nranks(ctx)
            left = (me - 1 + n) % n
            # Phase 1, mesh layout: every rank has arrived.
            for peer in pl.range(n):
                if peer != me:
                    pld.system.notify(mesh, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            for src in pl.range(n):
                if src != me:
                    pld.system.wait(mesh, [src, 0], 1, cmp=pld.WaitCmp.Ge)
            # Phase 2, ring layout: stage, tell the right neighbour, wait for the left one, pull from it.
            data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)
            pld.system.notify(ring, (me + 1) % n, [0, me], 1, op=pld.NotifyOp.AtomicAdd)
            pld.system.wait(ring, [0, left], 1, cmp=pld.WaitCmp.Ge)  # BUG: ring [0, left] is mesh [left, 0]
            return pl.store(pld.tile.remote_load(data, left, [0, 0], [1, SIZE]), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
                 mesh: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]],
                 ring: pl.InOut[pld.DistributedTensor[[2 * (nr - 1), nr], pl.INT32]]):
            return self.step(x, y, data, mesh, ring)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, SIZE], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([1, SIZE], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([2 * (nr - 1), nr], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                data = pld.window(data_buf, [1, SIZE], dtype=pl.FP32)
                mesh = pld.window(sig_buf, [nr, 1], dtype=pl.INT32)
                ring = pld.window(sig_buf, [2 * (nr - 1), nr], dtype=pl.INT32)
                self.chip(x[r], y[r], data, mesh, ring, device=r)
            return y

    return TwoLayouts


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("-d", "--device", default="0,1,2,3")
    ids = [int(d) for d in ap.parse_args(argv).device.split(",")]
    x = torch.randn(len(ids), 1, SIZE)
    y = torch.zeros_like(x)
    ir.compile(build(len(ids)), distributed_config=DistributedConfig(device_ids=ids))(x, y)
    assert torch.equal(y, torch.roll(x, 1, 0)), "mismatch"
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

# step -> (program source, argv, the finding kind that must name the # BUG line)
PITFALLS = {
    "05": (_edit("05_remote_load_store", (
        _barrier("sig", "    ") + "\n    got = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, SIZE])",
        f"    got = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, SIZE])  {BUG}: no barrier before the pull",
    )), ["--mode", "load"], "race"),
    "06": (_edit("06_put_get", (
        "    pld.system.notify(sig, nxt, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)   # 2. then tell it so\n"
        "    pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)                 # 3. the previous rank's data is here\n"
        "    return pl.store(pl.load(inbox, [0, 0], [1, SIZE]), [0, 0], y)",
        f"    return pl.store(pl.load(inbox, [0, 0], [1, SIZE]), [0, 0], y)  {BUG}: no notify/wait for the put",
    )), ["--mode", "put", "-d", "0,1"], "race"),  # at P=4 a random schedule rarely orders all four puts
    "08": (_edit("08_allreduce_mesh", (
        "            # 2. Barrier: arrive at every peer, then wait for every peer to arrive here.\n"
        + _barrier("sig", " " * 12),
        "",
    ), (
        "acc = pl.add(acc, pld.tile.remote_load(data, src, [0, 0], [1, SIZE]))",
        f"acc = pl.add(acc, pld.tile.remote_load(data, src, [0, 0], [1, SIZE]))  {BUG}: no barrier",
    )), [], "race"),
    "09": (_edit("09_allreduce_two_phase", (
        "pld.system.notify(sig, peer, [PHASE_AG, me], 1, op=pld.NotifyOp.AtomicAdd)",
        "pld.system.notify(sig, peer, [PHASE_RS, me], 1, op=pld.NotifyOp.AtomicAdd)",
    ), (
        "pld.system.wait(sig, [PHASE_AG, src], 1, cmp=pld.WaitCmp.Ge)",
        f"pld.system.wait(sig, [PHASE_RS, src], 1, cmp=pld.WaitCmp.Ge)  {BUG}: barrier A's row again",
    )), [], "stale_signal"),
    "13": (_edit("13_allgather", (
        "            block = pl.load(x, [0, 0], [ROWS, COLS])\n"
        "            for dst in pl.range(n):\n",
        f"            gathered = pl.store(pl.load(x, [0, 0], [ROWS, COLS]), [0, 0], gathered)  {BUG}: slot 0\n"
        "            for dst in pl.range(n):\n"
        "                block = pl.load(gathered, [0, 0], [ROWS, COLS])\n",
    )), [], "race"),
    "16": (TWO_LAYOUTS, ["-d", "0,1"], "stale_signal"),
}


def write_program(tmp_path: Path, step: str) -> tuple[Path, list[str], str, int]:
    src, argv, kind = PITFALLS[step]
    path = tmp_path / f"step{step}.py"
    path.write_text(src)
    line = next(i for i, text in enumerate(src.splitlines(), 1) if BUG in text)
    return path, argv if "-d" in argv else ["-d", "0,1,2,3", *argv], kind, line


def check(capsys, monkeypatch, tmp_path: Path, *args: str) -> tuple[int, str, dict]:
    """Run ``ptodist check --report-json`` in this process; return (exit status, stderr, report)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    report = tmp_path / "report.json"
    rc = cli.main(["check", "--report-json", str(report), *args])
    err = capsys.readouterr().err
    return rc, err, json.loads(report.read_text())


def run_on_sim(monkeypatch, script: Path, argv: list[str], seed: int) -> bool:
    """Run the script as ``python SCRIPT`` would, on the sim backend under ``seed``; True if its golden held."""
    monkeypatch.setenv("PTODIST_BACKEND", "sim")
    monkeypatch.setenv("PTODIST_SIM_SEED", str(seed))
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return not e.code
    except AssertionError:
        return False
    return True


# -- every race-like pitfall: flagged on the first schedule, though the golden sometimes passes --------

@pytest.mark.parametrize("step", sorted(PITFALLS))
def test_pitfall_is_flagged_on_the_first_schedule(step, capsys, monkeypatch, tmp_path):
    script, argv, kind, line = write_program(tmp_path, step)
    rc, err, report = check(capsys, monkeypatch, tmp_path, "--schedules", "1", str(script), *argv)
    assert rc == 1, err
    assert report["status"] == "findings" and report["seed"] == 0, report
    assert "schedule 1/1 (seed 0" in err and \
        f"Replay exactly: {commands.ptodist('check', '--seed', 0, '--schedules', 1)}" in err, err
    hits = [f for f in report["findings"] if f["kind"] == kind and f"{script}:{line}" in f["locations"]]
    assert hits, f"no {kind} finding at {script}:{line}:\n{err}"
    f = hits[0]
    assert f["pitfall"] and f["fix"], f
    assert len(f["ranks"]) >= (2 if kind == "race" else 1), f


@pytest.mark.parametrize("step", sorted(PITFALLS))
def test_pitfall_passes_its_golden_on_some_schedule_and_fails_on_another(step, monkeypatch, tmp_path, capsys):
    script, argv, _, _ = write_program(tmp_path, step)
    results = {seed: run_on_sim(monkeypatch, script, argv, seed) for seed in range(12)}
    capsys.readouterr()
    assert any(results.values()), f"the golden failed on every schedule: {results}"
    assert not all(results.values()), f"the golden passed on every schedule: {results}"


def test_a_race_names_both_ranks_both_lines_and_the_region(capsys, monkeypatch, tmp_path):
    script, argv, _, line = write_program(tmp_path, "05")
    _, err, report = check(capsys, monkeypatch, tmp_path, "--schedules", "1", str(script), *argv)
    race = next(f for f in report["findings"] if f["kind"] == "race")
    store_line = next(i for i, t in enumerate(script.read_text().splitlines(), 1)
                      if "data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)  # stage locally" in t)
    assert sorted(race["locations"]) == sorted([f"{script}:{line}", f"{script}:{store_line}"])
    msg = race["message"]
    assert "data race on bytes [0, 256) of window buffer 'data_buf' on rank" in msg, msg
    assert "pld.tile.remote_load (read of 'data')" in msg and "pl.store (write of 'data')" in msg, msg
    assert race["pitfall"] == "8.3 steps 05, 06, 08 (data race)"


def test_a_stale_signal_names_the_previous_wait(capsys, monkeypatch, tmp_path):
    script, argv, _, line = write_program(tmp_path, "09")
    _, _, report = check(capsys, monkeypatch, tmp_path, "--schedules", "1", str(script), *argv)
    stale = next(f for f in report["findings"] if f["kind"] == "stale_signal")
    first_wait = next(i for i, t in enumerate(script.read_text().splitlines(), 1)
                      if "pld.system.wait(sig, [PHASE_RS, src], 1, cmp=pld.WaitCmp.Ge)" in t and BUG not in t)
    assert stale["locations"] == [f"{script}:{line}", f"{script}:{first_wait}"]
    assert stale["ranks"] == [0, 1, 2, 3]
    assert f"its previous wait on this cell, at {script}:{first_wait}, already consumed" in stale["message"]
    assert stale["pitfall"] == "8.3 step 09 (stale signal)"


def test_a_seed_replays_its_schedule_exactly(capsys, monkeypatch, tmp_path):
    script, argv, _, _ = write_program(tmp_path, "13")
    runs = [check(capsys, monkeypatch, tmp_path, "--seed", "3", "--schedules", "1", str(script), *argv)[2]
            for _ in range(2)]
    assert runs[0] == runs[1]
    sessions = [explore.run_schedule(str(script), argv, 3).session for _ in range(2)]
    assert sessions[0].events == sessions[1].events and sessions[0].policy == sessions[1].policy


# -- correct programs: no findings ----------------------------------------------------------------------

CORRECT = [
    ("04_barrier", []), ("05_remote_load_store", ["--mode", "load"]), ("05_remote_load_store", ["--mode", "store"]),
    ("06_put_get", ["--mode", "put"]), ("06_put_get", ["--mode", "get"]), ("07_dynamic_rank_count", []),
    ("08_allreduce_mesh", []), ("09_allreduce_two_phase", []), ("10_allreduce_ring", []),
    ("11_allreduce_builtin", ["--mode", "ring", "--where", "host"]),
    ("11_allreduce_builtin", ["--mode", "mesh", "--where", "kernel"]),
    ("12_broadcast", []), ("12_broadcast", ["--use-builtin"]), ("13_allgather", []),
    ("13_allgather", ["--use-builtin"]), ("14_reduce_scatter", []), ("14_reduce_scatter", ["--use-builtin"]),
    ("15_all_to_all", []), ("15_all_to_all", ["--use-builtin"]), ("16_putting_it_together", ["--mode", "mesh"]),
    ("16_putting_it_together", ["--mode", "ring"]),
]


@pytest.mark.parametrize("stem, extra", CORRECT, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
@pytest.mark.parametrize("nranks", [2, 4])
def test_correct_examples_have_no_findings_under_many_schedules(stem, extra, nranks, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    argv = [*extra, "-d", ",".join(map(str, range(nranks)))]
    for seed in range(10):
        out = explore.run_schedule(str(EXAMPLES / f"{stem}.py"), argv, seed)
        assert out.exit_code == 0 and not out.findings, (seed, out.traceback, [f.render() for f in out.findings])
        assert out.session.dispatches >= 1 and "OK" in out.stdout.split()


def test_a_clean_check_exits_zero_and_says_what_it_ran(capsys, monkeypatch, tmp_path):
    rc, err, report = check(capsys, monkeypatch, tmp_path, "--schedules", "3", "--seed", "5",
                            str(EXAMPLES / "05_remote_load_store.py"), "-d", "0,1,2")
    assert rc == 0, err
    assert report["status"] == "ok" and report["findings"] == []
    assert "schedule 1/3 (seed 5, delay rank 0): no findings (3 ranks, 1 dispatch(es)," in err
    assert "schedule 2/3 (seed 6, delay rank 1)" in err and "schedule 3/3 (seed 7, delay rank 2)" in err
    assert "no findings in 3 schedule(s) (seeds 5..7)." in err


def test_check_refuses_bad_arguments(capsys, tmp_path):
    assert cli.main(["check", str(tmp_path / "missing.py")]) == 2
    assert "ptodist check: no such script:" in capsys.readouterr().err
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    assert cli.main(["check", "--schedules", "0", str(script)]) == 2
    assert "ptodist check: --schedules must be at least 1, got 0" in capsys.readouterr().err
    assert cli.main(["check", str(script)]) == 0
    assert "the script made no dispatch; nothing was checked." in capsys.readouterr().err


# -- the sim backend ----------------------------------------------------------------------------------------

SIZE = 8


def _wait_first(sig, me, n) -> None:
    for src in range(n):
        if src != me:
            pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)  # @wait
    for peer in range(n):
        if peer != me:
            pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)


def _spin_on_rank_0(sig, me, n) -> None:
    while me == 0:  # rank 0 computes forever and never reaches an operation
        pass
    pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)


def test_sim_reports_a_deadlock_exactly_with_the_hang_findings():
    # A long hang timeout: only exact detection can end this run.
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1, 2]), backend="sim", hang_timeout_s=600)
    with pytest.raises(HangError) as info:
        ir.compile(signal_program(_wait_first, size=SIZE), config=cfg)(np.zeros((3, 1, SIZE), np.float32))
    e = info.value
    assert e.certain
    text = str(e)
    assert text.startswith("deadlock: every unfinished rank is blocked in a wait that no running rank can satisfy "
                           "(the sim scheduler had no rank left to run).")
    assert "no blocked rank had notified anyone before it began to wait" in text
    wait_line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.endswith("# @wait"))
    assert all(s["state"] == "waiting" and s["where"] == f"{__file__}:{wait_line}" for s in e.ranks), e.ranks


def test_sim_gives_the_same_results_whatever_the_seed_and_recording_changes_nothing(monkeypatch):
    stem = "10_allreduce_ring"
    argv = ["-d", "0,1,2,3"]
    outs = [explore.run_schedule(str(EXAMPLES / f"{stem}.py"), argv, seed) for seed in (0, 1, 4)]
    assert all(o.exit_code == 0 and not o.findings for o in outs)
    monkeypatch.setenv("PTODIST_SIM_SEED", "4")
    assert run_on_sim(monkeypatch, EXAMPLES / f"{stem}.py", argv, 4)


def test_sim_seed_must_be_an_integer(monkeypatch):
    monkeypatch.setenv("PTODIST_SIM_SEED", "fast")
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend="sim")
    with pytest.raises(Exception, match=r"PTODIST_SIM_SEED='fast': the sim backend's schedule seed must be an "
                                        r"integer"):
        ir.compile(signal_program(_wait_first, size=SIZE), config=cfg)(np.zeros((2, 1, SIZE), np.float32))


def test_check_error_carries_the_findings(monkeypatch, tmp_path):
    script, argv, _, _ = write_program(tmp_path, "06")
    out = explore.run_schedule(str(script), argv, 0)
    assert out.exit_code == 1 and out.findings
    assert all(f.kind == "race" for f in out.findings)
    assert isinstance(CheckError("x", out.findings).findings[0], type(out.findings[0]))


def test_sim_stops_a_rank_that_never_reaches_an_operation_after_the_hang_timeout():
    import threading

    before = threading.active_count()
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend="sim", hang_timeout_s=0.5)
    with pytest.raises(HangError) as info:
        ir.compile(signal_program(_spin_on_rank_0, size=SIZE), config=cfg)(np.zeros((2, 1, SIZE), np.float32))
    assert not info.value.certain
    assert str(info.value).startswith("no progress for ")
    assert "raise RunConfig(hang_timeout_s=...)" in str(info.value)
    assert threading.active_count() == before  # the spinning rank thread was stopped, not left behind


# -- more findings: uninitialised reads, clobbered Sets, races inside collectives ------------------------------

def _checked(nr: int, body, seed: int = 0) -> list:
    """Run the program on ``nr`` ranks under ``ptodist check``'s session for ``seed``; return its findings."""
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE)
    compiled = ir.compile(window_program(nr, body), distributed_config=DistributedConfig(device_ids=list(range(nr))))
    with explore.checking(seed) as session:
        try:
            compiled(x, np.zeros_like(x))
        except CheckError as e:
            assert e.findings == session.findings
    return session.findings


def _line(marker: str) -> str:
    return f"{__file__}:{marker_line(__file__, marker)}"


def _barrier_body(w) -> None:
    for peer in range(w.n):
        if peer != w.me:
            pld.system.notify(w.sig, peer, [w.me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for src in range(w.n):
        if src != w.me:
            pld.system.wait(w.sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)


def test_a_read_of_bytes_nobody_wrote_names_the_nearest_write():
    half = SIZE // 2

    def body(w):
        pl.store(pl.load(w.x, [0, 0], [1, half]), [0, 0], w.data)  # @half_store
        _barrier_body(w)
        got = pld.tile.remote_load(w.data, (w.me + 1) % w.n, [0, half], [1, half])  # @wrong_half
        pl.store(got, [0, 0], w.y)

    found = _checked(2, body)
    assert [f.kind for f in found] == ["uninitialized_read"], [f.render() for f in found]
    f = found[0]
    assert f.ranks == [0, 1] and f.locations == [_line("wrong_half"), _line("half_store")]
    reader = int(f.message.split()[1])
    owner = (reader + 1) % 2
    assert f.message.startswith(f"rank {reader} reads bytes [16, 32) of window buffer 'data_buf' on rank {owner} "
                                "(elements [4, 8) of its flat view) with pld.tile.remote_load ('data') at "
                                f"{_line('wrong_half')}, but no rank wrote those bytes in this dispatch"), f.message
    assert f"Nearest writes to the buffer:\n  rank {owner} wrote bytes [0, 16) of window buffer 'data_buf' on rank " \
           f"{owner} (elements [0, 4) of its flat view) with pl.store at {_line('half_store')}" in f.message


def test_unordered_set_notifies_to_one_cell_are_a_set_clobber():
    def body(w):
        if w.me != 0:
            pld.system.notify(w.sig, 0, [0, 0], w.me, op=pld.NotifyOp.Set)  # @set
        else:
            pld.system.wait(w.sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)

    # Seed 1 at P=4 delays rank 0: every Set lands before its wait consumes any.
    found = _checked(4, body, seed=1)
    clobbers = [f for f in found if f.kind == "set_clobber"]
    assert clobbers, [f.render() for f in found]
    assert clobbers[0].locations == [_line("set")]
    assert "are not ordered, and no wait consumed the first before the second overwrote it" in clobbers[0].message


def test_a_race_inside_a_collective_is_reported_at_the_users_call():
    def body(w):
        pl.store(pl.load(w.x, [0, 0], [1, SIZE]), [0, 0], w.data)
        pld.tensor.allreduce(w.data, w.sig)  # @allreduce
        # The allreduce's last write into each window comes after its last barrier: a peer may still be in it.
        pld.tile.remote_store(pl.load(w.x, [0, 0], [1, SIZE]), w.data, (w.me + 1) % w.n, [0, 0])  # @push

    found = _checked(3, body)
    races = [f for f in found if f.kind == "race"]
    assert races and all(set(f.locations) <= {_line("push"), _line("allreduce")} for f in races), \
        [f.render() for f in found]
    assert any(_line("push") in f.locations and _line("allreduce") in f.locations for f in races)


def test_recording_for_the_checker_does_not_change_a_schedule(monkeypatch):
    # A racy program whose result depends on the schedule: the same seed must give the same bits.
    def body(w):
        pl.store(pl.load(w.x, [0, 0], [1, SIZE]), [0, 0], w.data)
        pl.store(pld.tile.remote_load(w.data, (w.me + 1) % w.n, [0, 0], [1, SIZE]), [0, 0], w.y)

    nr = 4
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE) + 1
    compiled = ir.compile(window_program(nr, body), distributed_config=DistributedConfig(device_ids=list(range(nr))))
    results = set()
    for seed in range(6):
        plain = np.zeros_like(x)
        monkeypatch.setenv("PTODIST_SIM_SEED", str(seed))
        compiled(x, plain, config=RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))),
                                            backend="sim"))
        checked = np.zeros_like(x)
        with explore.checking(seed), pytest.raises(CheckError):
            compiled(x, checked)
        np.testing.assert_array_equal(plain, checked)
        results.add(plain.tobytes())
    assert len(results) > 1  # the schedules differ, so the comparison means something


def _pull_without_barrier(w) -> None:
    pl.store(pl.load(w.x, [0, 0], [1, SIZE]), [0, 0], w.data)
    pl.store(pld.tile.remote_load(w.data, (w.me + 1) % w.n, [0, 0], [1, SIZE]), [0, 0], w.y)  # @worker_pull


def _pull_after_barrier(w) -> None:
    pl.store(pl.load(w.x, [0, 0], [1, SIZE]), [0, 0], w.data)
    _barrier_body(w)
    pl.store(pld.tile.remote_load(w.data, (w.me + 1) % w.n, [0, 0], [1, SIZE]), [0, 0], w.y)


@pytest.mark.parametrize("persistent", [False, True])
def test_check_explores_a_prepared_worker_like_one_shot_calls(persistent):
    x = np.arange(2 * SIZE, dtype=np.float32).reshape(2, 1, SIZE)
    for body, racy in ((_pull_without_barrier, True), (_pull_after_barrier, False)):
        compiled = ir.compile(window_program(2, body), distributed_config=DistributedConfig(device_ids=[0, 1]))
        outcomes = []
        with explore.checking(0) as session:
            with compiled.prepare(persistent=persistent) as rt:
                for _ in range(3):
                    y = np.zeros_like(x)
                    try:
                        rt(x, y)
                        outcomes.append(y)
                    except CheckError as e:
                        outcomes.append(e)
        assert session.dispatches == 3
        if racy:
            assert all(isinstance(o, CheckError) for o in outcomes)
            races = [f for f in session.findings if f.kind == "race"]
            assert races and all(_line("worker_pull") in f.locations for f in races), \
                [f.render() for f in session.findings]
        else:
            assert session.findings == []
            for y in outcomes:
                np.testing.assert_array_equal(y, x[[1, 0]])  # rank r pulled its right neighbour's x


def _stage_and_tell(w) -> None:
    pl.store(pl.load(w.x, [0, 0], [1, SIZE]), [0, 0], w.data)
    for peer in range(w.n):
        if peer != w.me:
            pld.system.notify(w.sig, peer, [w.me, 0], 1, op=pld.NotifyOp.AtomicAdd)


def test_a_deferred_wait_orders_nothing_inside_its_own_task():
    def body(w):
        _stage_and_tell(w)
        nxt = (w.me + 1) % w.n
        pld.system.defer_wait(w.sig, [nxt, 0], 1, cmp=pld.WaitCmp.Ge)  # runs when the task ends
        pl.store(pld.tile.remote_load(w.data, nxt, [0, 0], [1, SIZE]), [0, 0], w.y)  # @early_pull

    found = _checked(2, body)
    assert [f.kind for f in found] == ["race"] and _line("early_pull") in found[0].locations, \
        [f.render() for f in found]


def test_a_plain_wait_before_the_pull_is_clean_under_every_schedule():
    def body(w):
        _stage_and_tell(w)
        nxt = (w.me + 1) % w.n
        pld.system.wait(w.sig, [nxt, 0], 1, cmp=pld.WaitCmp.Ge)
        pl.store(pld.tile.remote_load(w.data, nxt, [0, 0], [1, SIZE]), [0, 0], w.y)

    for seed in range(8):
        assert _checked(3, body, seed) == []


# -- a 1-D signal addressed with integer offsets (documented as valid) -------------------------------------------

def _one_d_signal_program(nr: int):
    """Every rank notifies every peer's cell ``me`` of a ``[NR]`` signal and waits on cells ``0..n-1``, with
    integer offsets (``notify(sig, peer, me, ...)``, ``wait(sig, src, ...)``), then pulls the next rank's row."""
    @pl.jit.incore
    def ring(x: pl.Tensor[[1, SIZE], pl.FP32], y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]],
             data: pl.InOut[pld.DistributedTensor[[1, SIZE], pl.FP32]],
             sig: pl.InOut[pld.DistributedTensor[[nr], pl.INT32]]):
        ctx = pld.get_comm_ctx(data)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        data = pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], data)
        for peer in pl.range(n):
            pld.system.notify(sig, peer, me, 1, op=pld.NotifyOp.AtomicAdd)  # @int_notify
        for src in pl.range(n):
            pld.system.wait(sig, src, 1, cmp=pld.WaitCmp.Ge)  # @int_wait
        return pl.store(pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, SIZE]), [0, 0], y)

    return on_every_rank(ring)


def test_a_1d_signal_with_integer_offsets_is_checked_like_any_other():
    # It crashed under the checker: the event recording iterated over the int offset.
    nr = 3
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE)
    host = _one_d_signal_program(nr)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))))
    for seed in range(4):
        y = np.zeros_like(x)
        with explore.checking(seed) as session:
            host(x, y, config=cfg)
        assert session.findings == [] and session.dispatches == 1 and session.events > 0
        np.testing.assert_array_equal(y, np.roll(x, -1, axis=0))


def test_a_1d_signal_with_integer_offsets_records_its_cells_in_the_swimlane(tmp_path):
    import json

    from ptodist import dfx

    nr = 2
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend="shm",
                    output_dir=str(tmp_path / "out"), enable_chip_swimlane=True)
    y = _one_d_signal_program(nr)(x, config=cfg)
    np.testing.assert_array_equal(y, np.roll(x, -1, axis=0))
    run = dfx.latest_run(tmp_path / "out")
    recs = json.loads((run / "rank1" / "d0" / "chip_swimlane_records.json").read_text())
    text = json.dumps(recs)
    assert _line("int_notify") in text and _line("int_wait") in text
    assert sorted(run.glob("merged_swimlane_*.json")), "no merged trace"


def test_the_put_get_example_of_the_language_page_passes_ptodist_check(capsys, monkeypatch, tmp_path):
    import re

    page = (REPO / "docs" / "language.md").read_text()
    block = next(b for b in re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
                 if b.startswith("# runnable") and "pld.tensor.put(inbox, nxt, x)" in b)
    assert "pld.system.notify(sig, nxt, 0, 1" in block  # the integer offset this is about
    script = tmp_path / "put_get.py"
    script.write_text(block)
    rc, err, report = check(capsys, monkeypatch, tmp_path, "--schedules", "3", str(script))
    assert rc == 0, err
    assert report["status"] == "ok" and report["findings"] == []
    assert "no findings in 3 schedule(s) (seeds 0..2)." in err
