"""``deps.json``: one rank's task dependency graph for one dispatch.

Tasks run in program order on a rank; the graph says which of them depend on
each other: ``explicit`` edges come from ``pl.submit(..., deps=[...])``,
``tensormap`` edges from two tasks touching overlapping bytes of one tensor
where at least one writes (read-after-write, write-after-read, write-after-write),
as a tensor map would find them: an access is matched against the accesses
not yet superseded by a later write covering them.
"""

from __future__ import annotations

import json
from pathlib import Path

WRITES = ("out", "inout")


def graph(log) -> dict:
    """Build the deps.json object from an event log."""
    tasks, tensors, edges, seen = [], {}, [], set()
    accesses: dict[str, list[tuple[int, int, int, bool]]] = {}  # tensor id -> (lo, hi, task, writes)
    for t in log.tasks:
        tid = t["task_id"]
        tasks.append({"id": tid, "kernel": t["name"], "kind": t["kind"], "where": t["where"], "args": t["args"]})
        for d in t["deps"]:
            if (d, tid, "explicit") not in seen:
                seen.add((d, tid, "explicit"))
                edges.append({"pred": d, "succ": tid, "source": "explicit"})
        for a in t["args"]:
            lo, hi, writes = a["offset"], a["offset"] + a["nbytes"], a["direction"] in WRITES
            info = tensors.setdefault(a["tensor_id"], {"id": a["tensor_id"], "name": a["tensor"], "dtype": a["dtype"],
                                                       "regions": []})
            if [lo, hi] not in info["regions"]:
                info["regions"].append([lo, hi])
            live = accesses.setdefault(a["tensor_id"], [])
            for plo, phi, pred, pwrites in live:
                if pred != tid and (writes or pwrites) and plo < hi and lo < phi and (pred, tid, "tm") not in seen:
                    seen.add((pred, tid, "tm"))
                    edges.append({"pred": pred, "succ": tid, "source": "tensormap", "tensor": a["tensor_id"],
                                  "region": [max(lo, plo), min(hi, phi)]})
            if writes:
                # A write supersedes the accesses it covers: a later access that conflicts with one of them
                # conflicts with this write too, so it is ordered after them through this task.  Without
                # this, n tasks updating one buffer would give n*(n-1)/2 edges instead of a chain.
                live[:] = [e for e in live if not (lo <= e[0] and e[1] <= hi and e[2] != tid)]
            live.append((lo, hi, tid, writes))
    return {"rank": log.rank, "device_id": log.device_id, "dispatch": log.dispatch, "tasks": tasks,
            "tensors": list(tensors.values()), "edges": edges}


def write(log, out: Path) -> Path:
    path = out / "deps.json"
    path.write_text(json.dumps(graph(log), indent=1) + "\n")
    return path
