"""Swimlanes: per-rank timing records, and one merged Chrome trace that Perfetto opens.

The merged trace has one process per rank (``rank r (device d)``), one thread
per lane, a complete slice for every task and communication operation, and a
flow arrow from each notify to the wait it released: the latest notify on that
cell (same window buffer, owner rank and cell) whose resulting value is the
value the wait saw.
"""

from __future__ import annotations

import bisect
import datetime
import json
import os
from pathlib import Path

RECORDS = "chip_swimlane_records.json"
FLOW_INSET_NS = 10  # how far inside its slice a flow arrow's end lies


def write_records(log, out: Path, device_markers: bool = True) -> Path:
    """Write one rank's records for one dispatch (tasks only when device markers are off)."""
    data = log.to_json()
    data["device_markers"] = device_markers
    if not device_markers:
        data["records"] = [r for r in data["records"] if r["kind"] in ("task", "collective")]
    path = out / RECORDS
    _write_atomically(path, json.dumps(data, indent=1) + "\n")
    return path


def _write_atomically(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a rank killed while writing leaves no half file for the merge."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_records(root: Path, dispatch: int, world: int) -> list[dict]:
    """Read every rank's records of one dispatch (ranks whose file is missing are skipped)."""
    out = []
    for r in range(world):
        path = root / f"rank{r}" / f"d{dispatch}" / RECORDS
        if path.exists():
            out.append(json.loads(path.read_text()))
    return out


def release_pairs(ranks: list[dict]) -> list[tuple[dict, dict, int, int]]:
    """Return (notify, wait, notifying rank, waiting rank) for every wait whose releasing notify is known.

    The releasing notify is the latest one on the wait's cell, started before the wait ended, whose
    resulting value is the value the wait saw.  Notifies are indexed by (cell, resulting value) and
    sorted by start, so each wait is one binary search (a ping-pong of many rounds on one cell stays
    linear-logarithmic, not quadratic).
    """
    groups: dict[tuple, list[tuple[int, int, dict, int]]] = {}
    order = 0
    for data in ranks:
        for rec in data["records"]:
            if rec["kind"] == "notify":
                a = rec["args"]
                # -order: among equal starts the first recorded sorts last, so it is the one picked
                groups.setdefault((a["buffer_id"], a["owner"], a["offset"], a["new"]), []).append(
                    (rec["start"], -order, rec, data["rank"]))
                order += 1
    index = {}
    for key, found in groups.items():
        found.sort(key=lambda n: (n[0], n[1]))
        index[key] = ([n[0] for n in found], found)
    pairs = []
    for data in ranks:
        for rec in data["records"]:
            if rec["kind"] != "wait":
                continue
            a = rec["args"]
            found = index.get((a["buffer_id"], a["owner"], a["offset"], a["seen"]))
            if found is None:
                continue
            i = bisect.bisect_right(found[0], rec["end"]) - 1
            if i >= 0:
                _, _, n, src = found[1][i]
                pairs.append((n, rec, src, data["rank"]))
    return pairs


def chrome_trace(ranks: list[dict], device_ids: list[int], dispatch: int | None = None) -> dict:
    """Build the Chrome-trace JSON object (timestamps in microseconds from the earliest record)."""
    t0 = min((data["start"] for data in ranks), default=0)

    def us(ns: float) -> float:
        return round((ns - t0) / 1000.0, 3)  # nanosecond resolution, without float noise in the file

    events: list[dict] = []
    for data in ranks:
        r = data["rank"]
        events.append({"ph": "M", "name": "process_name", "pid": r,
                       "args": {"name": f"rank {r} (device {device_ids[r]})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        for lane in sorted({rec["lane"] for rec in data["records"]} or {0}):
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": lane,
                           "args": {"name": f"lane {lane}"}})
        for rec in data["records"]:
            end = rec["end"] if rec["end"] is not None else data["end"]
            args = {"task_id": rec["task_id"], "where": rec["where"], **rec.get("args", {})}
            events.append({"ph": "X", "name": rec["name"], "cat": rec["kind"], "pid": r, "tid": rec["lane"],
                           "ts": us(rec["start"]), "dur": max((end - rec["start"]) / 1000.0, 0.001), "args": args})
    for i, (n, w, src, dst) in enumerate(release_pairs(ranks)):
        # Each arrow starts just inside the start of the notify's slice and ends just inside the end of the
        # wait's slice it released: the notify's write lies between those two instants, so the arrow never
        # points back in time (slice midpoints would, for a long wait released near its end).
        events.append({"ph": "s", "id": i, "name": "notify→wait", "cat": "signal", "pid": src, "tid": n["lane"],
                       "ts": us(n["start"] + min(max(n["end"] - n["start"], 0) / 2, FLOW_INSET_NS))})
        events.append({"ph": "f", "bp": "e", "id": i, "name": "notify→wait", "cat": "signal", "pid": dst,
                       "tid": w["lane"],
                       "ts": us(w["end"] - min(max(w["end"] - w["start"], 0) / 2, FLOW_INSET_NS))})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "ptodist", "clock": "CLOCK_MONOTONIC", "dispatch": dispatch}}


def merge(request, world: int, device_ids: list[int]) -> Path:
    """Write ``merged_swimlane_<timestamp>.json`` for one dispatch in the run's folder."""
    ranks = load_records(request.root, request.dispatch, world)
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S_%f")
    path = request.root / f"merged_swimlane_{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, json.dumps(chrome_trace(ranks, device_ids, request.dispatch)) + "\n")
    return path
