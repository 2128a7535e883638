"""Swimlanes: per-rank timing records, and one merged Chrome trace that Perfetto opens.

The merged trace has one process per rank (``rank r (device d)``), one thread
per lane, a complete slice for every task and communication operation, a
flow arrow from each notify to the wait it released: the latest notify on that
cell (same window buffer, owner rank and cell) whose resulting value is the
value the wait saw, and a counter track per signal cell that received notifies
(its value over time, from the notifies' ``old`` and ``new`` values).
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
            if rec["kind"] != "wait" or rec["args"].get("pending"):
                continue  # a wait still blocked when the run was stopped was released by nothing
            a = rec["args"]
            found = index.get((a["buffer_id"], a["owner"], a["offset"], a["seen"]))
            if found is None:
                continue
            i = bisect.bisect_right(found[0], rec["end"]) - 1
            if i >= 0:
                _, _, n, src = found[1][i]
                pairs.append((n, rec, src, data["rank"]))
    return pairs


def arrow_inset(rec: dict) -> float:
    """How far into a notify's slice its arrow starts and its counter changes (its write lies inside)."""
    return min(max(rec["end"] - rec["start"], 0) / 2, FLOW_INSET_NS)


def cell_name(args: dict) -> str:
    """A signal cell as counter tracks name it: ``sig_buf[1,0] on rank 0``."""
    return f"{args['buffer']}[{','.join(str(int(i)) for i in args['cell'])}] on rank {args['owner']}"


def counter_series(ranks: list[dict]) -> list[dict]:
    """Per signal cell that received notifies: its value over time, from the notify records.

    Returns ``[{"name", "buffer", "buffer_id", "owner", "offset", "cell", "points": [(t_ns, value)]}]``
    sorted by (buffer, owner, offset).  The first point is the value before the first notify (its
    ``old``), at that notify's start; then each notify's ``new`` value, just inside its slice.
    """
    cells: dict[tuple, list[dict]] = {}
    for data in ranks:
        for rec in data["records"]:
            if rec["kind"] == "notify":
                a = rec["args"]
                cells.setdefault((a["buffer_id"], a["owner"], a["offset"]), []).append(rec)
    out = []
    for (buffer_id, owner, offset), recs in sorted(cells.items()):
        recs.sort(key=lambda n: n["start"])
        a0 = recs[0]["args"]
        points = [(recs[0]["start"], a0["old"])]
        points += [(n["start"] + arrow_inset(n), n["args"]["new"]) for n in recs]
        out.append({"name": cell_name(a0), "buffer": a0["buffer"], "buffer_id": buffer_id, "owner": owner,
                    "offset": offset, "cell": a0["cell"], "points": points})
    return out


def chrome_trace(ranks: list[dict], device_ids: list[int], dispatch: int | None = None) -> dict:
    """Build the Chrome-trace JSON object (timestamps in microseconds from the earliest record)."""
    t0 = min((data["start"] for data in ranks), default=0)

    def us(ns: float) -> float:
        return round((ns - t0) / 1000.0, 3)  # nanosecond resolution, without float noise in the file

    events: list[dict] = []
    present = {data["rank"] for data in ranks}
    for r in range(len(device_ids)):
        if r not in present:  # killed before it could write its records: the process is named all the same
            events.append({"ph": "M", "name": "process_name", "pid": r,
                           "args": {"name": f"rank {r} (device {device_ids[r]})"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
            events.append({"ph": "M", "name": "process_labels", "pid": r, "args": {"labels": "no records"}})
    for data in ranks:
        r = data["rank"]
        events.append({"ph": "M", "name": "process_name", "pid": r,
                       "args": {"name": f"rank {r} (device {device_ids[r]})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        if data.get("stopped"):
            events.append({"ph": "M", "name": "process_labels", "pid": r, "args": {"labels": "stopped"}})
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
                       "ts": us(n["start"] + arrow_inset(n))})
        events.append({"ph": "f", "bp": "e", "id": i, "name": "notify→wait", "cat": "signal", "pid": dst,
                       "tid": w["lane"], "ts": us(w["end"] - arrow_inset(w))})
    for series in counter_series(ranks):  # one counter track per signal cell, on the rank that owns it
        for t, value in series["points"]:
            events.append({"ph": "C", "name": series["name"], "cat": "signal", "pid": series["owner"], "ts": us(t),
                           "args": {"value": value}})
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
