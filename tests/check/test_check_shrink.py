"""The smallest failing schedule: ``ptodist check`` shrinks a failing schedule and tells it as a numbered story.

The sim scheduler records every decision it takes and can replay a list of
them; a schedule with a finding is replayed with fewer and fewer of its
decisions (the rest taken by the plain schedule: the running rank goes on
while it can, else the lowest rank) while the same finding shows, and the
smallest run is told step by step in the user's lines.
"""

from __future__ import annotations

import io
import json
import sys
import textwrap

import numpy as np
import pytest
from conftest import marker_line, on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
import ptodist.testing
from ptodist import DistributedConfig, cli, commands
from ptodist.backends.sim import Decisions, Scheduler
from ptodist.check import explore, story

HEAD = '''
import sys

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

P = int(sys.argv[1])
NR = pl.dynamic("NR")
Win = pld.DistributedTensor[[1, 8], pl.FP32]
Sig = pld.DistributedTensor[[NR, 1], pl.INT32]
'''

# docs/check.md's racy.py: each rank stages its row, then pulls the next rank's with no barrier between.
RACY = HEAD + '''

@pl.program
class Shift:
    @pl.function(type=pl.FunctionType.InCore)
    def shift(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], data: pl.InOut[Win]):
        ctx = pld.get_comm_ctx(data)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        data = pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)
        nxt = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, 8])  # no barrier since the store
        return pl.store(nxt, [0, 0], y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], data: pl.InOut[Win]):
        return self.shift(x, y, data)

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
        data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
        for r in pl.range(pld.world_size()):
            self.per_rank(x[r], y[r], pld.window(data_buf, [1, 8], dtype=pl.FP32), device=r)
        return y


compiled = ir.compile(Shift, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
x = np.arange(1, P * 8 + 1, dtype=np.float32).reshape(P, 1, 8)
assert np.array_equal(compiled(x), np.roll(x, -1, axis=0)), "mismatch"
'''


def _signals(body: str) -> str:
    """A program whose kernel runs ``body`` (ctx, me, n and the signal window ``sig`` are there)."""
    return HEAD + '''

@pl.program
class Signals:
    @pl.function(type=pl.FunctionType.InCore)
    def step(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], sig: pl.InOut[Sig]):
        ctx = pld.get_comm_ctx(sig)
        me, n = pld.rank(ctx), pld.nranks(ctx)
''' + textwrap.indent(textwrap.dedent(body), " " * 8) + '''        return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], sig: pl.InOut[Sig]):
        return self.step(x, y, sig)

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
        sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
        for r in pl.range(pld.world_size()):
            self.per_rank(x[r], y[r], pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
        return y


compiled = ir.compile(Signals, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
x = np.arange(1, P * 8 + 1, dtype=np.float32).reshape(P, 1, 8)
assert np.array_equal(compiled(x), x), "mismatch"
'''


# Every rank waits for its right neighbour's token before it passes its own on: a deadlock on every schedule.
RING_HANG = _signals('''
    pld.system.wait(sig, [(me + 1) % n, 0], 1, cmp=pld.WaitCmp.Ge)  # waits before it notifies
    pld.system.notify(sig, (me - 1 + n) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
''')

# Ranks 1 and 2 Set one cell of rank 0, which waits for rank 1's value: it hangs only when rank 2's Set lands
# after rank 1's and before rank 0 looks, so the failing schedule needs decisions the plain one does not take.
CLOBBER = _signals('''
    if me == 0:
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Eq)
    else:
        pld.system.notify(sig, 0, [0, 0], me, op=pld.NotifyOp.Set)
''')


def check_cli(capsys, monkeypatch, tmp_path, source: str, *args: str) -> tuple[int, str, dict]:
    """``ptodist check --report-json r.json [args] prog.py`` in this process, in ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "prog.py").write_text(source)
    rc = cli.main(["check", "--report-json", "r.json", *args])
    err = capsys.readouterr().err
    return rc, err, json.loads((tmp_path / "r.json").read_text())


def story_block(err: str) -> str:
    """The story ``ptodist check`` printed: from its head line to the replay line, both included (the replay's
    ``ptodist`` written as the word: the command names this interpreter's, by its path)."""
    start = max(err.rfind("\nThe smallest"), err.rfind("\nThe failing schedule")) + 1
    return err[start:].strip().replace(f"Replay exactly: {commands.ptodist()} ", "Replay exactly: ptodist ")


RACE_STORY = {
    2: """\
The smallest failing schedule found (seed 0, random; shrunk from 4 to 2 steps, 2 to 0 preemptions):
  1. rank 0 runs lines 28, 22–23 (to prog.py:23, pld.tile.remote_load)
  2. rank 1 runs lines 28, 22 (to prog.py:22, pl.store)
  3. race: rank 0 reads at line 23 (prog.py:23, pld.tile.remote_load) before rank 1 writes at line 22 \
(prog.py:22, pl.store); nothing orders the two
Replay exactly: ptodist check --seed 0 --schedules 1 prog.py 2""",
    3: """\
The smallest failing schedule found (seed 0, random; shrunk from 6 to 2 steps, 4 to 0 preemptions):
  1. rank 0 runs lines 28, 22–23 (to prog.py:23, pld.tile.remote_load)
  2. rank 1 runs lines 28, 22 (to prog.py:22, pl.store)
  3. race: rank 0 reads at line 23 (prog.py:23, pld.tile.remote_load) before rank 1 writes at line 22 \
(prog.py:22, pl.store); nothing orders the two
Replay exactly: ptodist check --seed 0 --schedules 1 prog.py 3""",
}


@pytest.mark.parametrize("P", [2, 3])
def test_a_race_is_told_as_the_smallest_schedule(capsys, monkeypatch, tmp_path, P):
    rc, err, doc = check_cli(capsys, monkeypatch, tmp_path, RACY, "prog.py", str(P))
    assert rc == 1
    assert story_block(err) == RACE_STORY[P]
    schedule = doc["schedule"]
    assert schedule["seed"] == 0 and schedule["policy"] == "random" and schedule["shrunk"] is True
    assert schedule["story"] == [line.strip() for line in RACE_STORY[P].splitlines()[1:-1]]
    assert schedule["steps"] == 2 and schedule["preemptions"] == 0
    assert schedule["original_steps"] >= schedule["steps"] and schedule["original_preemptions"] >= 1
    assert schedule["bounded"] is None and schedule["trials"] >= 1


HANG_STORY = {
    2: """\
The smallest failing schedule found (seed 0, random; shrunk from 2 to 2 steps, 0 to 0 preemptions):
  1. rank 0 runs line 29 (prog.py:29, step), then waits at line 23 (prog.py:23) and blocks
  2. rank 1 runs line 29 (prog.py:29, step), then waits at line 23 (prog.py:23) and blocks
  3. deadlock (hang): rank 0 waits at line 23 (prog.py:23), rank 1 waits at line 23 (prog.py:23); no rank can run
Replay exactly: ptodist check --seed 0 --schedules 1 prog.py 2""",
    3: """\
The smallest failing schedule found (seed 0, random; shrunk from 4 to 3 steps, 1 to 0 preemptions):
  1. rank 0 runs line 29 (prog.py:29, step), then waits at line 23 (prog.py:23) and blocks
  2. rank 1 runs line 29 (prog.py:29, step), then waits at line 23 (prog.py:23) and blocks
  3. rank 2 runs line 29 (prog.py:29, step), then waits at line 23 (prog.py:23) and blocks
  4. deadlock (hang): rank 0 waits at line 23 (prog.py:23), rank 1 waits at line 23 (prog.py:23), rank 2 waits \
at line 23 (prog.py:23); no rank can run
Replay exactly: ptodist check --seed 0 --schedules 1 prog.py 3""",
}


@pytest.mark.parametrize("P", [2, 3])
def test_a_deadlock_is_told_up_to_the_wait_each_rank_is_blocked_in(capsys, monkeypatch, tmp_path, P):
    rc, err, doc = check_cli(capsys, monkeypatch, tmp_path, RING_HANG, "prog.py", str(P))
    assert rc == 1 and doc["findings"][0]["kind"] == "hang"
    assert story_block(err) == HANG_STORY[P]
    assert doc["schedule"]["story"][-1].startswith(f"{P + 1}. deadlock (hang): rank 0 waits at line 23")


CLOBBER_STORY = """\
The smallest failing schedule found (seed 0, random; shrunk from 3 to 3 steps, 4 to 0 preemptions):
  1. rank 0 runs line 31 (prog.py:31, step), then waits at line 24 (prog.py:24) and blocks
  2. rank 1 runs lines 31, 26 (to prog.py:26, pld.system.notify)
  3. rank 2 runs lines 31, 26 (to prog.py:26, pld.system.notify)
  4. set_clobber: rank 1 notifies at line 26 (prog.py:26, pld.system.notify) before rank 2 notifies at line 26 \
(prog.py:26, pld.system.notify); the second Set overwrote the first before a wait saw it
Replay exactly: ptodist check --seed 0 --schedules 1 prog.py 3"""


def test_shrinking_drops_the_preemptions_a_schedule_dependent_hang_does_not_need(capsys, monkeypatch, tmp_path):
    rc, err, doc = check_cli(capsys, monkeypatch, tmp_path, CLOBBER, "prog.py", "3")
    assert rc == 1 and doc["findings"][0]["kind"] == "set_clobber"
    assert story_block(err) == CLOBBER_STORY
    s = doc["schedule"]
    assert (s["original_steps"], s["original_preemptions"], s["steps"], s["preemptions"]) == (3, 4, 3, 0)


def _script_outcome(tmp_path, source: str, argv: list[str], seed: int):
    path = tmp_path / "prog.py"
    path.write_text(source)
    target = explore.script_target(str(path), argv, io.StringIO())
    return target, explore.run_checked(target, seed)


@pytest.mark.parametrize("source, P", [(RACY, 3), (RING_HANG, 3), (CLOBBER, 3), (RACY, 2), (RING_HANG, 2)])
def test_the_same_seed_gives_the_same_story_never_longer_and_it_replays(monkeypatch, tmp_path, source, P):
    monkeypatch.setattr(sys, "path", list(sys.path))
    texts = []
    for seed in (0, 0, 1):
        target, outcome = _script_outcome(tmp_path, source, [str(P)], seed)
        assert outcome.failed
        shrunk = explore.shrink(target, outcome)
        texts.append(shrunk.render())
        assert shrunk.story.steps <= shrunk.original.steps
        assert shrunk.story.preemptions <= shrunk.original.preemptions
        assert len(shrunk.story.lines) <= len(shrunk.original.lines)
        # The decisions it keeps replay the smallest schedule: the same finding, the same story.
        again = explore.run_checked(target, seed, Decisions(shrunk.forced, plain=True))
        sig = story.signature(outcome.findings[0])
        match = next(f for f in again.findings if story.signature(f) == sig)
        assert story.tell(again.session.runs, again.session.decisions.taken, match).lines == shrunk.story.lines
    assert texts[0] == texts[1]


def test_no_shrink_tells_the_schedule_as_it_ran(capsys, monkeypatch, tmp_path):
    rc, err, doc = check_cli(capsys, monkeypatch, tmp_path, CLOBBER, "--no-shrink", "prog.py", "3")
    assert rc == 1
    assert story_block(err) == """\
The failing schedule (seed 0, random; 3 steps, 4 preemptions; not shrunk):
  1. rank 1 runs lines 31, 26 (to prog.py:26, pld.system.notify)
  2. rank 0 runs line 31 (prog.py:31, step)
  3. rank 2 runs lines 31, 26 (to prog.py:26, pld.system.notify)
  4. set_clobber: rank 1 notifies at line 26 (prog.py:26, pld.system.notify) before rank 2 notifies at line 26 \
(prog.py:26, pld.system.notify); the second Set overwrote the first before a wait saw it
Replay exactly: ptodist check --seed 0 --schedules 1 prog.py 3"""
    s = doc["schedule"]
    assert s["shrunk"] is False and s["trials"] == 0
    assert (s["steps"], s["preemptions"]) == (s["original_steps"], s["original_preemptions"]) == (3, 4)


def test_a_clean_run_and_a_static_error_have_no_schedule(capsys, monkeypatch, tmp_path):
    fixed = RACY.replace("np.roll(x, -1, axis=0)", "x").replace(
        "nxt = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, 8])  # no barrier since the store",
        "nxt = pld.tile.remote_load(data, me, [0, 0], [1, 8])")
    rc, err, doc = check_cli(capsys, monkeypatch, tmp_path, fixed, "--schedules", "2", "prog.py", "2")
    assert rc == 0 and doc["schedule"] is None and "schedule found" not in err
    static = RACY.replace("x[r], y[r], pld.window", "y[r], x[r], 3, pld.window")
    rc, err, doc = check_cli(capsys, monkeypatch, tmp_path, static, "prog.py", "2")
    assert rc == 1 and doc["schedule"] is None and "schedule found" not in err


def test_shrinking_is_bounded_in_re_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", list(sys.path))
    target, outcome = _script_outcome(tmp_path, CLOBBER, ["3"], 0)
    shrunk = explore.shrink(target, outcome, max_trials=1)
    assert shrunk.trials == 1 and shrunk.bounded == "stopped after 1 re-runs"
    assert "; stopped after 1 re-runs):" in shrunk.render().splitlines()[0]
    assert shrunk.story.steps <= shrunk.original.steps


# -- SimMemory.choose: a rank's choice among its ready tasks --------------------------------------------------

def test_task_choices_are_seeded_recorded_replayed_and_plain_is_program_order():
    def choices(seed, decisions):
        sched = Scheduler(2, seed, decisions)
        return [sched.choose(1, 4) for _ in range(6)]

    seeded = Decisions()
    first = choices(7, seeded)
    assert first == choices(7, Decisions()) and all(0 <= c < 4 for c in first)
    assert [d.chosen for d in seeded.taken] == first
    assert [d.key for d in seeded.taken] == [(0, "task", 1, k) for k in range(6)]
    assert [d.preempt for d in seeded.taken] == [c != 0 for c in first]
    assert choices(7, Decisions(plain=True)) == [0] * 6
    forced = Decisions({(0, "task", 1, 2): 3, (0, "task", 1, 4): 9}, plain=True)  # 9: not an option, so plain
    assert choices(7, forced) == [0, 0, 3, 0, 0, 0]
    assert Scheduler(2, 7).choose(0, 1) == 0


# -- ptodist.testing.check ------------------------------------------------------------------------------------

N = 8
NR = pl.dynamic("NR")


@pl.jit.incore
def shift_kernel(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, N], pl.FP32]]):
    ctx = pld.get_comm_ctx(data)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    data = pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], data)
    return pl.store(pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, N]), [0, 0], y)


shift = on_every_rank(shift_kernel, name="shift")


def test_testing_check_tells_the_smallest_schedule_on_failure():
    x = np.arange(3 * N, dtype=np.float32).reshape(3, 1, N)
    report = ptodist.testing.check(shift, x, config=DistributedConfig(device_ids=[0, 1, 2]))
    assert report.findings[0].kind == "race"
    assert report.schedule is not None and report.schedule.shrunk
    assert report.schedule.story.preemptions == 0 and report.schedule.story.steps == 2
    with pytest.raises(AssertionError) as info:
        report.assert_clean()
    text = str(info.value)
    assert "The smallest failing schedule found (seed 0, random; shrunk from" in text
    assert text.index("The smallest failing schedule") < text.index("Replay exactly:")
    assert report.schedule.story.lines[-1].startswith("3. race: rank 0 reads at line")
    plain = ptodist.testing.check(shift, x, config=DistributedConfig(device_ids=[0, 1, 2]),
                                  shrink=False)
    assert not plain.schedule.shrunk and plain.schedule.story.steps == plain.schedule.original.steps


# -- tasks of one rank: each task run is an actor, told apart in the story --------------------------------------

HERE = __file__


def _line(marker: str) -> int:
    return marker_line(HERE, marker)


@pl.jit.incore
def fill(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    return pl.store(pl.add(pl.load(x, [0, 0], [1, N]), 1.0), [0, 0], y)  # @fill_store


@pl.jit.incore
def double(y: pl.Tensor[[1, N], pl.FP32], z: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    return pl.store(pl.mul(pl.load(y, [0, 0], [1, N]), 2.0), [0, 0], z)  # @double_load


@pl.jit
def no_deps(x: pl.Tensor[[1, N], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]],
            z: pl.Out[pl.Tensor[[1, N], pl.FP32]]):
    with pl.manual_scope():
        y, t_fill = pl.submit(fill, x, y)  # @submit_fill
        z, _ = pl.submit(double, y, z)  # @submit_double
    return z


@pl.jit.host
def two_tasks(x: pl.Tensor[[NR, 1, N], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]],
              z: pl.Out[pl.Tensor[[NR, 1, N], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        no_deps(x[r], y[r], z[r], device=r)


def test_a_race_between_two_tasks_of_one_rank_is_told_task_by_task():
    x = np.arange(2 * N, dtype=np.float32).reshape(2, 1, N)
    report = ptodist.testing.check(two_tasks, x, np.zeros_like(x), np.zeros_like(x),
                                   config=DistributedConfig(device_ids=[0, 1]), schedules=1)
    assert report.findings[0].kind == "race"
    where = {m: f"{HERE}:{_line(m)}" for m in ("fill_store", "double_load", "submit_fill", "submit_double")}
    line = {m: _line(m) for m in where}
    assert report.schedule.story.lines == [
        f"1. rank 0 (task 'fill') runs lines {line['submit_fill']}, {line['fill_store']} "
        f"(to {where['fill_store']}, pl.store)",
        f"2. rank 0 (task 'double') runs lines {line['submit_double']}, {line['double_load']} "
        f"(to {where['double_load']}, pl.load)",
        f"3. race: rank 0 (task 'fill') writes at line {line['fill_store']} ({where['fill_store']}, pl.store) before "
        f"rank 0 (task 'double') reads at line {line['double_load']} ({where['double_load']}, pl.load); "
        "nothing orders the two",
    ]
    assert report.schedule.story.preemptions == 0 <= report.schedule.original.preemptions


# The blocks of one pl.spmd_submit task each read-modify-write the same row: blocks are concurrent actors.
SPMD_ROW = HEAD + '''

@pl.program
class RowSums:
    @pl.function(type=pl.FunctionType.InCore)
    def partial(self, x: pl.Tensor[[8, 8], pl.FP32], total: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
        b = pl.get_block_idx()
        part = pl.col_sum(pl.load(x, [b * 4, 0], [4, 8]))
        acc = pl.load(total, [0, 0], [1, 8])
        return pl.store(pl.add(acc, part), [0, 0], total)  # every block updates row 0

    @pl.function(type=pl.FunctionType.Orchestration)
    def per_rank(self, x: pl.Tensor[[8, 8], pl.FP32], total: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
        total, _ = pl.spmd_submit(self.partial, x, total, core_num=2)
        return total

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, x: pl.Tensor[[NR, 8, 8], pl.FP32], total: pl.InOut[pl.Tensor[[NR, 1, 8], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            self.per_rank(x[r], total[r], device=r)
        return total


compiled = ir.compile(RowSums, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
x = np.arange(P * 64, dtype=np.float32).reshape(P, 8, 8)
total = np.zeros((P, 1, 8), np.float32)
compiled(x, total)
assert np.array_equal(total, x.sum(axis=1, keepdims=True)), "mismatch"
'''


def test_a_race_between_the_blocks_of_one_task_is_told_block_by_block(capsys, monkeypatch, tmp_path):
    rc, err, doc = check_cli(capsys, monkeypatch, tmp_path, SPMD_ROW, "prog.py", "2")
    assert rc == 1 and doc["findings"][0]["kind"] == "race"
    assert doc["schedule"]["story"] == [
        "1. rank 0 (block 0 of 'partial') runs lines 27, 21\u201323 (to prog.py:23, pl.store)",
        "2. rank 0 (block 1 of 'partial') runs lines 27, 21\u201322 (to prog.py:22, pl.load)",
        "3. race: rank 0 (block 0 of 'partial') writes at line 23 (prog.py:23, pl.store) before rank 0 (block 1 of "
        "'partial') reads at line 22 (prog.py:22, pl.load); nothing orders the two",
    ]
