"""``ptodist trace DIR``: a terminal summary of one dispatch's swimlane records.

``DIR`` is an output_dir (the newest run in it is summarised) or one run's folder (its ``dfx_outputs``,
a ``dfx_outputs.<n>`` beside it, or a ``dfx_outputs/run_<timestamp>_<pid>`` of the older layout).  Reads every rank's ``chip_swimlane_records.json`` of one dispatch of that run and prints:

* per rank: the time from the rank's start to writing its records (*total*),
  time inside tasks that is neither waiting nor communicating (*busy*), time in
  ``wait`` records (*waiting*), time in ``notify`` and RMA records
  (*communicating*), and the rest (*outside tasks*: process start, the
  per-device orchestration between its kernel calls);
* the longest waits, each with its cell and the notify (rank, line) that
  released it (:func:`swimlane.release_pairs`);
* the critical path: from the record that ends last, backwards, within a rank
  to the record before, across ranks from a wait to the notify that released it
  when the wait was blocked until then; its time by what the ranks did (waiting
  only inside wait records).

Times are milliseconds from the earliest rank's start.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .. import dfx
from . import swimlane

ENABLE_HINT = ("RunConfig(enable_chip_swimlane=True) (or, without editing the script, ptodist run --dfx SCRIPT "
               "or PTODIST_DFX=swimlane)")
_RANK_DIR = re.compile(r"rank(\d+)$")
_DISPATCH_DIR = re.compile(r"d(\d+)$")
CONTAINERS = ("task", "collective")
PATH_HEAD, PATH_TAIL = 10, 30  # a longer critical path shows its first and last steps


class TraceError(Exception):
    """A directory ``ptodist trace`` cannot summarise; the message says why and what to enable."""


# -- finding the files ----------------------------------------------------------------------------

def find_root(path) -> Path:
    """Return the run folder to summarise for ``path``.

    ``path`` is a run's own folder (``dfx_outputs``, ``dfx_outputs.<n>``, or ``dfx_outputs/run_<timestamp>_<pid>``
    of the older layout), or an output_dir: then the newest run in it.
    """
    return locate(path)[0]


def locate(path) -> tuple[Path, list[Path]]:
    """Return (the run folder to summarise for ``path``, every run beside it, oldest first)."""
    p = Path(path)
    if not p.is_dir():
        raise TraceError(f"no such directory: {path}")
    found = dfx.runs(p)
    if p in found:
        return p, found
    if dfx.RUN_DIR.match(p.name):
        return p, dfx.runs(p.parent)
    if dfx.has_rank_dirs(p):  # a run's folder copied somewhere else
        return p, [p]
    if found:
        return found[-1], found
    base = p / dfx.DFX_DIR
    if dfx.OUTPUTS_DIR.match(p.name) or base.is_dir():
        where = p if dfx.OUTPUTS_DIR.match(p.name) else base
        raise TraceError(f"{where} holds no runs (no rank*/d*/ folders): run the program with "
                         f"{ENABLE_HINT}, then run ptodist trace on compiled.output_dir.")
    raise TraceError(f"{path} holds no DFX outputs (no {dfx.DFX_DIR}/ folder in it). Run the program with "
                     f"{ENABLE_HINT} (and its output_dir, or PTODIST_OUTPUT_ROOT, pointing here), then "
                     f"run ptodist trace on compiled.output_dir.")


def _out_dir(root: Path) -> Path:
    """The output_dir a run folder belongs to."""
    return root.parent.parent if dfx.RUN_DIR.match(root.name) else root.parent


def dispatches(root: Path) -> dict[int, list[int]]:
    """Return {dispatch index: ranks} for which swimlane records exist."""
    found: dict[int, list[int]] = {}
    for rank_dir in root.iterdir():
        m = _RANK_DIR.match(rank_dir.name)
        if not (m and rank_dir.is_dir()):
            continue
        for d in rank_dir.iterdir():
            k = _DISPATCH_DIR.match(d.name)
            if k and (d / swimlane.RECORDS).is_file():
                found.setdefault(int(k.group(1)), []).append(int(m.group(1)))
    return {k: sorted(v) for k, v in sorted(found.items())}


def merged_trace(root: Path, dispatch: int) -> Path | None:
    """Return the newest merged trace of ``dispatch`` (traces without a dispatch field count as any)."""
    best = None
    for path in sorted(root.glob("merged_swimlane_*.json")):
        try:
            other = json.loads(path.read_text()).get("otherData", {})
        except (OSError, ValueError):
            continue
        if other.get("dispatch", dispatch) == dispatch:
            best = path
    return best


def _other_outputs(root: Path) -> list[str]:
    names = set()
    for p in root.glob("rank*/d*/*"):
        if p.name == "deps.json":
            names.add("deps.json")
        elif p.name == "scope_stats":
            names.add("scope_stats/scope_stats.jsonl")
    return sorted(names)


def load(root: Path, dispatch: int | None) -> tuple[int, list[dict], dict[int, list[int]]]:
    """Return (dispatch index, every rank's records of it, all dispatches found)."""
    found = dispatches(root)
    if not found:
        others = _other_outputs(root)
        has = f" (it has {' and '.join(others)})" if others else ""
        raise TraceError(f"{root} has no swimlane records{has}: ptodist trace reads "
                         f"rank*/d*/{swimlane.RECORDS}, which {ENABLE_HINT} writes.")
    if dispatch is None:
        dispatch = max(found)
    elif dispatch not in found:
        raise TraceError(f"{root} has no swimlane records of dispatch {dispatch}; dispatches with records: "
                         f"{', '.join(map(str, found))}")
    world = max(found[dispatch]) + 1
    try:
        return dispatch, swimlane.load_records(root, dispatch, world), found
    except (OSError, ValueError) as e:  # a file cut short or edited by hand
        raise TraceError(f"cannot read the swimlane records of dispatch {dispatch} under {root}: {e}") from e


# -- numbers ---------------------------------------------------------------------------------------

def _union(intervals) -> int:
    total, cur_lo, cur_hi = 0, None, None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def _end(rec: dict, data: dict) -> int:
    return rec["end"] if rec["end"] is not None else data["end"]


def rank_times(data: dict) -> dict:
    """Nanoseconds: total, busy, waiting, communicating, outside tasks (and record counts)."""
    recs = data["records"]
    in_tasks = _union((r["start"], _end(r, data)) for r in recs if r["kind"] in CONTAINERS)
    waiting = sum(_end(r, data) - r["start"] for r in recs if r["kind"] == "wait")
    comm = sum(_end(r, data) - r["start"] for r in recs if r["kind"] in ("notify", "rma"))
    total = data["end"] - data["start"]
    return {"total": total, "busy": max(in_tasks - waiting - comm, 0), "waiting": waiting, "communicating": comm,
            "outside": max(total - in_tasks, 0),
            "tasks": sum(1 for r in recs if r["kind"] in CONTAINERS and "args" not in r),
            "waits": sum(1 for r in recs if r["kind"] == "wait"),
            "notifies": sum(1 for r in recs if r["kind"] == "notify"),
            "rma": sum(1 for r in recs if r["kind"] == "rma")}


def timeline(data: dict) -> list[dict]:
    """The rank's steps in time order: its start, each task's begin and end, and every operation.

    A step is ``{"step": "start" | "begin" | "end" | "op", "rec": record or None, "t": its instant}``;
    an operation's instant is its end.  A task or collective appears as its begin and its end (the
    operations it is made of lie between them); a notify, wait or RMA as one op step.
    Each step also says whether the rank is inside a task or collective right after it (``"inside"``): between
    two steps that state does not change, as every begin and end is a step.
    """
    steps = [{"step": "start", "rec": None, "t": data["start"], "rank": data["rank"]}]
    for r in data["records"]:
        if r["kind"] in CONTAINERS:
            steps.append({"step": "begin", "rec": r, "t": r["start"], "rank": data["rank"]})
            steps.append({"step": "end", "rec": r, "t": _end(r, data), "rank": data["rank"]})
        else:
            steps.append({"step": "op", "rec": r, "t": _end(r, data), "rank": data["rank"]})
    order = {"start": 0, "begin": 1, "op": 2, "end": 3}
    steps.sort(key=lambda s: (s["t"], order[s["step"]]))
    depth = 0
    for s in steps:
        depth += {"begin": 1, "end": -1}.get(s["step"], 0)
        s["inside"] = depth > 0
    return steps


def critical_path(ranks: list[dict]) -> list[tuple[dict, str]]:
    """Return [(step, how it links to the step before)] earliest first (steps as in :func:`timeline`).

    Starts at the step that happens last on any rank and walks backwards: within a rank to the step
    before, and from a wait that was blocked until the notify that released it to that notify (on any
    rank).  A wait whose notify had ended before the wait began found its value there and did not wait
    for it: the walk stays on the wait's rank, whose own work made it late.  ``how`` is ``"first"``,
    ``"then"`` (same rank) or ``"released"`` (a wait released by the notify of the step before).
    """
    lines = {data["rank"]: timeline(data) for data in ranks}
    pos = {id(s["rec"]): (r, i) for r, lst in lines.items() for i, s in enumerate(lst) if s["step"] == "op"}
    released = {id(w): n for n, w, _src, _dst in swimlane.release_pairs(ranks)}
    candidates = [lst[-1] for lst in lines.values() if lst]
    if not candidates:
        return []
    cur = max(candidates, key=lambda s: (s["t"], -s["rank"]))
    r, i = cur["rank"], len(lines[cur["rank"]]) - 1
    chain, links, seen = [cur], [], {(r, i)}
    while True:
        rec = cur["rec"]
        notify = released.get(id(rec)) if cur["step"] == "op" and rec["kind"] == "wait" else None
        if notify is not None and id(notify) in pos and notify["end"] > rec["start"]:
            r, i = pos[id(notify)]
            how = "released"
        elif i > 0:
            i, how = i - 1, "then"
        else:
            break
        if (r, i) in seen:  # never in a consistent log; guards the walk against a malformed one
            break
        seen.add((r, i))
        cur = lines[r][i]
        chain.append(cur)
        links.append(how)
    chain.reverse()
    links.reverse()
    return list(zip(chain, ["first", *links]))


# -- text ------------------------------------------------------------------------------------------

def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _ns(ms: str) -> float:
    return float(ms) * 1e6


def _where(where: str) -> str:
    """``file:line`` relative to the working directory when the file lies under it."""
    path, sep, line = where.rpartition(":")
    if not sep or not path:
        return where
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return where
    return f"{rel if not rel.startswith('..') else path}:{line}"


def _table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

    def fmt(cells):
        return "  " + "  ".join(c.ljust(w) if a == "<" else c.rjust(w) for c, w, a in zip(cells, widths, align))

    return [fmt(header), *(fmt(row) for row in rows)]


def _label(rank: int, devices: dict[int, int]) -> str:
    return f"rank {rank} (device {devices.get(rank, '?')})"


def _describe(rec: dict) -> str:
    """One operation in a few words: what it touched and how."""
    a = rec.get("args", {})
    kind = rec["kind"]
    if kind == "notify":
        return f"{a['buffer']} on rank {a['owner']} cell {a['cell']} {a['op']} {a['value']} ({a['old']} -> {a['new']})"
    if kind == "wait":
        return f"{a['buffer']} cell {a['cell']} {a['cmp']} {a['expected']}, saw {a['seen']}"
    if kind == "rma":
        return f"{a['buffer']} {a['direction']} rank {a['peer']}, {a['bytes']} B"
    if kind == "collective" and a:
        return f"target {a.get('target')}, {a.get('bytes')} B"
    return ""


def findings_for(root: Path, dispatch: int) -> dict | None:
    """The ``findings_d{k}.json`` the driver wrote when dispatch ``k`` ended with an error, or None."""
    path = root / dfx.FINDINGS.format(dispatch=dispatch)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_list(ranks: list[dict]) -> list[tuple[int, int, dict, tuple[dict, int] | None]]:
    """Every wait record, longest first: ``(duration ns, rank, record, (releasing notify, its rank) or None)``."""
    pairs = {id(w): (n, src) for n, w, src, _dst in swimlane.release_pairs(ranks)}
    waits = sorted(((rec["end"] - rec["start"], data["rank"], rec) for data in ranks for rec in data["records"]
                    if rec["kind"] == "wait"), key=lambda w: (-w[0], w[1]))
    return [(dur, r, rec, pairs.get(id(rec))) for dur, r, rec in waits]


def wait_matrix(ranks: list[dict]) -> dict:
    """Who waited on whom: nanoseconds each rank spent in waits, by the rank whose notify released them.

    Returns ``{"by_pair": {(waiter, notifier): ns}, "unreleased": {waiter: ns}, "pending": {waiter: ns}}``:
    ``unreleased`` are the waits no recorded notify released (a cell written by RMA, or left over),
    ``pending`` those still blocked when the run was stopped.
    """
    by_pair: dict[tuple[int, int], int] = {}
    unreleased: dict[int, int] = {}
    pending: dict[int, int] = {}
    for dur, r, rec, released in wait_list(ranks):
        if rec["args"].get("pending"):
            pending[r] = pending.get(r, 0) + dur
        elif released is None:
            unreleased[r] = unreleased.get(r, 0) + dur
        else:
            key = (r, released[1])
            by_pair[key] = by_pair.get(key, 0) + dur
    return {"by_pair": by_pair, "unreleased": unreleased, "pending": pending}


# What a rank did in its time on the critical path: in a record of an operation, else by where it was.
OP_TIME = {"wait": "waiting", "notify": "notify", "rma": "rma"}
BUSY, OUTSIDE = "busy", "outside tasks"  # in a task, not in an operation; start-up and orchestration


def on_path_parts(before: dict, step: dict, how: str) -> dict[str, int]:
    """What the step's rank did between the step ``before`` it on the path and ``step``: ``{kind: ns}``.

    After a release the rank was inside its wait record (the walk crosses only to a notify that ended after the
    wait began): all of it is waiting.  On one rank, the part inside the step's own operation record is that
    operation's (``waiting`` only there); the rest is ``busy`` inside a task, else ``outside tasks``.
    """
    a, b = before["t"], step["t"]
    if b <= a:
        return {}
    if how == "released":
        return {"waiting": b - a}
    parts: dict[str, int] = {}
    rec = step["rec"]
    if step["step"] == "op" and rec["start"] > a:
        parts[BUSY if before["inside"] else OUTSIDE] = min(rec["start"], b) - a
    if step["step"] == "op":
        parts[OP_TIME.get(rec["kind"], rec["kind"])] = b - max(rec["start"], a)
    else:
        parts[BUSY if before["inside"] else OUTSIDE] = b - a
    return {k: v for k, v in parts.items() if v > 0}


def path_summary(path_steps: list[tuple[dict, str]], devices: dict[int, int], t0: int) -> dict:
    """The critical path as rows and totals, for the text summary and the HTML report.

    Returns ``{"length", "crossings", "ranks", "by_rank", "by_kind", "rows"}``; each row is a dict:
    ``at``, ``dur`` (None for a begin or start), ``on_path`` (ns), ``parts`` (:func:`on_path_parts`), ``rank``,
    ``label``, ``step``, ``name``, ``where``, ``what`` (the operation in a few words), ``released`` (a wait
    released by the step before).  ``by_kind`` sums the parts: only time in wait records counts as waiting.
    """
    length = path_steps[-1][0]["t"] - path_steps[0][0]["t"] if path_steps else 0
    crossings = sum(1 for (s, how), (before, _) in zip(path_steps[1:], path_steps)
                    if how == "released" and s["rank"] != before["rank"])
    rows, prev, by_rank, by_kind = [], None, {}, {}
    for s, how in path_steps:
        rec = s["rec"]
        on_path = 0 if prev is None else max(s["t"] - prev["t"], 0)
        parts = {} if prev is None else on_path_parts(prev, s, how)
        prev = s
        label = _label(s["rank"], devices)
        by_rank[label] = by_rank.get(label, 0) + on_path
        for kind, ns in parts.items():
            by_kind[kind] = by_kind.get(kind, 0) + ns
        row = {"at": s["t"] - t0, "dur": None, "on_path": on_path, "parts": parts, "rank": s["rank"],
               "label": label, "step": "start", "name": "(rank process starts)", "where": "", "what": "",
               "released": False}
        if s["step"] != "start":
            row.update(dur=_end(rec, {"end": rec["start"]}) - rec["start"] if s["step"] != "begin" else None,
                       step={"begin": f"{rec['kind']} begins", "end": f"{rec['kind']} ends"}.get(s["step"],
                                                                                               rec["kind"]),
                       name=rec["name"], where=_where(rec["where"]), what=_describe(rec) if s["step"] == "op" else "",
                       released=how == "released")
        rows.append(row)
    return {"length": length, "crossings": crossings, "ranks": sorted({s["rank"] for s, _ in path_steps}),
            "by_rank": by_rank, "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])), "rows": rows}


def parts_text(parts: dict[str, int]) -> str:
    """A row's on-path time by what the rank did: ``busy`` alone, or ``busy 0.287 + notify 0.140``."""
    if len(parts) <= 1:
        return next(iter(parts), "")
    return " + ".join(f"{kind} {_ms(ns)}" for kind, ns in parts.items())


def report(path, dispatch: int | None = None, top: int = 10, open_trace: bool = False) -> str:
    """Return the summary text for the DFX outputs under ``path``; raise TraceError if there are none."""
    root, runs, dispatch, ranks, found = read(path, dispatch)
    devices = {data["rank"]: data["device_id"] for data in ranks}
    t0 = min(data["start"] for data in ranks)
    markers = all(data.get("device_markers", True) for data in ranks)
    merged = merged_trace(root, dispatch)
    out = [f"ptodist trace: {root}"]
    if len(runs) > 1 and root in runs:
        which = "the newest" if root == runs[-1] else f"number {runs.index(root) + 1} (oldest first)"
        out.append(f"run {root.name}: {which} of {len(runs)} runs in {_out_dir(root)}; give a run's folder to "
                   "summarise another")
    out += [f"dispatch {dispatch} ({', '.join(f'd{k}' for k in found)} found; --dispatch K picks one), "
            f"{len(ranks)} rank(s); times in ms from the first rank's start",
            f"merged trace: {merged if merged else 'none for this dispatch'}"]
    ending = findings_for(root, dispatch)
    if ending is not None:
        kinds = ", ".join(sorted({f["kind"] for f in ending.get("findings", [])})) or "no findings"
        out.append(f"the dispatch ended with {ending['error']} ({ending['status']}; {kinds}): "
                   f"{root / dfx.FINDINGS.format(dispatch=dispatch)}")
    stopped = [data["rank"] for data in ranks if data.get("stopped")]
    if stopped:
        out.append(f"stopped before the dispatch ended: {', '.join(_label(r, devices) for r in stopped)} "
                   "(their records end where the driver stopped them)")
    missing = missing_ranks(ranks)
    if missing:
        out.append(f"no records from rank(s) {', '.join(map(str, missing))} (killed before writing them)")
    if not markers:
        out.append("per-operation records are off (SIMPLER_DEVICE_STRACE_ENABLE=0): only tasks and collectives "
                   "were recorded, so waiting and communicating read 0 and the path stays on one rank")

    out += ["", "Per rank (ms):"]
    rows = []
    for data in ranks:
        t = rank_times(data)
        rows.append([_label(data["rank"], devices), _ms(t["total"]), _ms(t["busy"]), _ms(t["waiting"]),
                     _ms(t["communicating"]), _ms(t["outside"]),
                     f"{100.0 * t['waiting'] / t['total']:.0f}%" if t["total"] else "-",
                     f"{t['tasks']}/{t['waits']}/{t['notifies']}/{t['rma']}"])
    out += _table(["rank", "total", "busy", "waiting", "communicating", "outside tasks", "waiting %",
                   "tasks/waits/notifies/rma"], rows, "<rrrrrrr")

    waits = wait_list(ranks)
    out += ["", f"Longest waits ({min(top, len(waits))} of {len(waits)}):"]
    if not waits:
        out.append("  none recorded")
    for dur, r, rec, released in waits[:top]:
        a = rec["args"]
        out.append(f"  {_ms(dur):>9} ms  {_label(r, devices)} at {_where(rec['where'])}: {a['buffer']} cell "
                   f"{a['cell']} {a['cmp']} {a['expected']}, saw {a['seen']}{_iteration(a)}")
        if a.get("pending"):
            out.append(f"  {'':>12} still waiting when the run was stopped (the cell held {a['seen']})")
        elif released is not None:
            n, src = released
            out.append(f"  {'':>12} released by {_label(src, devices)} notify at {_where(n['where'])} "
                       f"({n['args']['op']} {n['args']['value']}: {n['args']['old']} -> {n['args']['new']}, "
                       f"at {_ms(n['start'] - t0)} ms)")
        else:
            out.append(f"  {'':>12} released by: no recorded notify on this cell produced the value seen")

    path_steps = critical_path(ranks)
    out.append("")
    if not path_steps:
        out.append("Critical path: no records")
    else:
        p = path_summary(path_steps, devices, t0)
        out.append(f"Critical path: {_ms(p['length'])} ms over rank(s) {', '.join(map(str, p['ranks']))}, "
                   f"{len(path_steps)} steps, {p['crossings']} cross-rank release(s); earliest first. 'at': when the "
                   f"step ended; 'on path': time since the step before (0 where a wait ended before its notify's "
                   f"record did); 'as': what the step's rank did in it (waiting: only inside a wait record).")
        rows = [[_ms(row["at"]), _ms(row["dur"]) if row["dur"] is not None else "", _ms(row["on_path"]),
                 parts_text(row["parts"]), row["label"], row["step"], row["name"], row["where"],
                 " ".join(filter(None, [row["what"], "<- released by the notify above" if row["released"] else ""]))]
                for row in p["rows"]]
        out.append("  on path by rank: " + ", ".join(f"{k} {_ms(v)}" for k, v in p["by_rank"].items()))
        out.append("  on path by step: " + ", ".join(f"{k} {_ms(v)}" for k, v in p["by_kind"].items()))
        skipped = rows[PATH_HEAD:-PATH_TAIL] if len(rows) > PATH_HEAD + PATH_TAIL else []
        if skipped:
            rows = rows[:PATH_HEAD] + rows[-PATH_TAIL:]
        table = _table(["at", "dur", "on path", "as", "rank", "step", "name", "where", ""], rows, "rrr<<<<<<")
        if skipped:
            table.insert(1 + PATH_HEAD, f"  ... {len(skipped)} steps left out "
                                        f"({_ms(sum(_ns(r[2]) for r in skipped))} ms on path) ...")
        out += table

    if open_trace:
        out += ["", *open_instructions(merged)]
    return "\n".join(line.rstrip() for line in out) + "\n"


def read(path, dispatch: int | None = None) -> tuple[Path, list[Path], int, list[dict], dict[int, list[int]]]:
    """Find and load one dispatch: ``(run folder, runs beside it, dispatch, every rank's records, dispatches)``."""
    root, runs = locate(path)
    try:
        dispatch, ranks, found = load(root, dispatch)
    except TraceError as e:
        others = [r for r in runs if r != root]
        if not others:
            raise
        text = str(e) if str(e).endswith(".") else f"{e}."
        raise TraceError(f"{text} {len(others)} other run(s) beside it (the newest: {others[-1]}); "
                         "give a run's folder to summarise it.") from None
    return root, runs, dispatch, ranks, found


def missing_ranks(ranks: list[dict]) -> list[int]:
    """Ranks below the highest rank with records that have none (killed before they could write them)."""
    present = {data["rank"] for data in ranks}
    return [r for r in range(max(present, default=-1) + 1) if r not in present]


def _iteration(args: dict) -> str:
    loops = args.get("loops")
    if not loops:
        return ""
    return f" (iteration {loops[-1]})" if len(loops) == 1 else f" (iterations {loops})"


def open_instructions(merged: Path | None) -> list[str]:
    if merged is None:
        return ["No merged trace for this dispatch (the run wrote none: did it end before the driver merged?)."]
    return [f"Merged trace: {merged.resolve()}",
            "To view it:",
            "  - Perfetto: open https://ui.perfetto.dev, click 'Open trace file' and choose the file above",
            "    (the file stays on your machine: the UI runs in the browser).",
            "  - Chrome: open chrome://tracing, click 'Load' and choose the file above.",
            "One process per rank ('rank r (device d)'), one thread per lane; arrows go from each notify to the "
            "wait it released."]
