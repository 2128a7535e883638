"""The critical path of ``ptodist trace``: it crosses to a notify only when the wait was blocked until it, and its
time is charged to what the ranks did (waiting only inside wait records)."""

from __future__ import annotations

import json
import os

import numpy as np
from conftest import on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, dfx
from ptodist.dfx import summary, swimlane

US = 1000  # ns


def task(i: int, name: str, start: int, end: int, line: int) -> dict:
    return {"id": i, "kind": "task", "name": name, "task_id": 0, "lane": 0, "start": start * US, "end": end * US,
            "where": f"prog.py:{line}"}


def signal(i: int, kind: str, start: int, end: int, line: int, **args) -> dict:
    name = "pld.system.notify" if kind == "notify" else "pld.system.wait"
    cell = {"buffer": "sig", "buffer_id": 0, "cell": [0, 0], "offset": 0}
    if kind == "notify":
        more = {"owner": 1, "op": "AtomicAdd", "value": 1, "old": args["new"] - 1, "new": args["new"]}
    else:
        more = {"owner": 1, "cmp": "Ge", "expected": args["seen"], "seen": args["seen"], "iteration": None,
                "loops": []}
    return {"id": i, "kind": kind, "name": name, "task_id": 0, "lane": 0, "start": start * US, "end": end * US,
            "where": f"prog.py:{line}", "args": {**cell, **more}}


def rank(r: int, records: list[dict]) -> dict:
    return {"rank": r, "device_id": r, "dispatch": 0, "clock": "CLOCK_MONOTONIC, nanoseconds", "start": 0,
            "end": 100 * US, "device_markers": True, "records": records}


# Rank 0 notifies rank 1's cell twice (value 1 at 20-22 us, value 2 at 45-47 us) inside its task (10-90 us).
# Rank 1, in its task (5-95 us), waits for 2 from 30 us: blocked until the second notify, released at 50 us;
# then it computes and waits for 1 at 60 us, a value that was there since 22 us: that wait takes 1 us.
RANKS = [rank(0, [task(0, "producer", 10, 90, 5), signal(1, "notify", 20, 22, 6, new=1),
                  signal(2, "notify", 45, 47, 7, new=2)]),
         rank(1, [task(0, "consumer", 5, 95, 9), signal(1, "wait", 30, 50, 10, seen=2),
                  signal(2, "wait", 60, 61, 11, seen=1)])]


def test_the_path_crosses_only_to_a_notify_the_wait_was_blocked_on():
    steps = [(s["rank"], s["step"], s["rec"]["name"] if s["rec"] else None, s["t"] // US, how)
             for s, how in summary.critical_path(RANKS)]
    assert steps == [(0, "start", None, 0, "first"), (0, "begin", "producer", 10, "then"),
                     (0, "op", "pld.system.notify", 22, "then"), (0, "op", "pld.system.notify", 47, "then"),
                     (1, "op", "pld.system.wait", 50, "released"),
                     # the wait for 1 found its value there: no crossing back to the notify at 20-22 us
                     (1, "op", "pld.system.wait", 61, "then"), (1, "end", "consumer", 95, "then")]


def test_only_time_in_wait_records_counts_as_waiting():
    p = summary.path_summary(summary.critical_path(RANKS), {0: 0, 1: 1}, 0)
    assert [{k: v // US for k, v in row["parts"].items()} for row in p["rows"]] == [
        {}, {"outside tasks": 10}, {"busy": 10, "notify": 2}, {"busy": 23, "notify": 2}, {"waiting": 3},
        {"busy": 10, "waiting": 1}, {"busy": 34}]
    assert {k: v // US for k, v in p["by_kind"].items()} == {"busy": 77, "outside tasks": 10, "notify": 4,
                                                             "waiting": 4}
    assert sum(p["by_kind"].values()) == p["length"] == 95 * US


def test_the_summary_shows_what_each_step_s_time_was(tmp_path):
    for data in RANKS:
        d = tmp_path / dfx.DFX_DIR / f"rank{data['rank']}" / "d0"
        d.mkdir(parents=True)
        (d / swimlane.RECORDS).write_text(json.dumps(data))
    text = summary.report(tmp_path)
    path = text[text.index("Critical path:"):]
    assert path.splitlines() == [
        "Critical path: 0.095 ms over rank(s) 0, 1, 7 steps, 1 cross-rank release(s); earliest first. 'at': when "
        "the step ended; 'on path': time since the step before (0 where a wait ended before its notify's record "
        "did); 'as': what the step's rank did in it (waiting: only inside a wait record).",
        "  on path by rank: rank 0 (device 0) 0.047, rank 1 (device 1) 0.048",
        "  on path by step: busy 0.077, outside tasks 0.010, notify 0.004, waiting 0.004",
        "     at    dur  on path  as                          rank               step         name                   "
        "where",
        "  0.000           0.000                              rank 0 (device 0)  start        (rank process starts)",
        "  0.010           0.010  outside tasks               rank 0 (device 0)  task begins  producer               "
        "prog.py:5",
        "  0.022  0.002    0.012  busy 0.010 + notify 0.002   rank 0 (device 0)  notify       pld.system.notify      "
        "prog.py:6   sig on rank 1 cell [0, 0] AtomicAdd 1 (0 -> 1)",
        "  0.047  0.002    0.025  busy 0.023 + notify 0.002   rank 0 (device 0)  notify       pld.system.notify      "
        "prog.py:7   sig on rank 1 cell [0, 0] AtomicAdd 1 (1 -> 2)",
        "  0.050  0.020    0.003  waiting                     rank 1 (device 1)  wait         pld.system.wait        "
        "prog.py:10  sig cell [0, 0] Ge 2, saw 2 <- released by the notify above",
        "  0.061  0.001    0.011  busy 0.010 + waiting 0.001  rank 1 (device 1)  wait         pld.system.wait        "
        "prog.py:11  sig cell [0, 0] Ge 1, saw 1",
        "  0.095  0.090    0.034  busy                        rank 1 (device 1)  task ends    consumer               "
        "prog.py:9"]


# -- a real run: a wait whose value is long there ------------------------------------------------------------------

def rank_state(r: int) -> int:
    """In a rank: rank ``r``'s state on the status board (RUNNING, WAITING, DONE, ...)."""
    from ptodist import context

    return int(context.current().status.rows[r]["state"])


@pl.jit.incore
def early_notify(sig: pl.InOut[pld.DistributedTensor[[pl.dynamic("NR"), 1], pl.INT32]]):
    from ptodist.rank.status import DONE, FAILED

    if pld.rank(pld.get_comm_ctx(sig)) == 0:
        pld.system.notify(sig, 1, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)
    else:
        while rank_state(0) not in (DONE, FAILED):  # computes until rank 0 has ended: its notify is long there
            os.sched_yield()
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)
    return sig


early = on_every_rank(early_notify)


def test_a_wait_satisfied_at_once_is_not_the_time_rank_1_spent_computing(tmp_path):
    out = tmp_path / "out"
    x = np.zeros((2, 1), np.float32)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), output_dir=str(out),
                    enable_chip_swimlane=True)
    early.compile(x, config=cfg)(x)
    ranks = swimlane.load_records(dfx.latest_run(out), 0, 2)
    (notify,) = [rec for rec in ranks[0]["records"] if rec["kind"] == "notify"]
    (wait,) = [rec for rec in ranks[1]["records"] if rec["kind"] == "wait"]
    assert notify["end"] < wait["start"]  # one clock for every rank: the value was there before the wait began
    path = summary.critical_path(ranks)
    assert [(s["rank"], s["step"], how) for s, how in path] == [(1, "start", "first"), (1, "begin", "then"),
                                                                (1, "op", "then"), (1, "end", "then")]
    p = summary.path_summary(path, {0: 0, 1: 1}, 0)
    assert p["by_kind"]["waiting"] == wait["end"] - wait["start"]  # the wait record only, not the computing
    assert p["by_kind"]["busy"] >= wait["start"] - ranks[1]["records"][0]["start"]
    assert sum(p["by_kind"].values()) == p["length"]
