"""``scope_stats/scope_stats.jsonl``: high-water marks, then one line per scope begin/end.

Scopes are the dispatch and every task.  High-water marks: tasks in flight
(nesting depth; tasks on a rank run one at a time), bytes of tensors the
orchestration allocated with ``pl.create_tensor``, and tensormap entries (the
distinct tensor regions the dependency tracking holds).
"""

from __future__ import annotations

import json
from pathlib import Path


def lines(log) -> list[dict]:
    regions = {(a["tensor_id"], a["offset"], a["nbytes"]) for t in log.tasks for a in t["args"]}
    meta = {"type": "metadata", "rank": log.rank, "device_id": log.device_id, "dispatch": log.dispatch,
            "clock": "CLOCK_MONOTONIC, nanoseconds",
            "high_water": {"tasks_in_flight": log.max_depth, "heap_bytes": log.max_local_bytes,
                           "tensormap_entries": len(regions)},
            "scopes": sum(1 for s in log.scopes if s["event"] == "begin")}
    return [meta] + [{"type": "scope", **s} for s in log.scopes]


def write(log, out: Path) -> Path:
    path = out / "scope_stats" / "scope_stats.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines(log)))
    return path
