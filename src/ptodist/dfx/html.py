"""``ptodist trace DIR --html FILE``: one self-contained HTML report of a dispatch.

The page holds everything it shows (inline CSS, inline SVG, a few lines of inline script; no
network access, no external file): the findings of the run (``findings_d{k}.json``, when the
dispatch ended with an error), the per-rank times, a timeline of every rank (tasks, waits,
notifies, RMA, the notify→wait arrows, the critical path, and the value of each signal cell over
time), who waited on whom, the longest waits and the critical path.  The numbers are those of
``ptodist trace`` (:mod:`.summary`).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from . import summary, swimlane

LABEL_W = 190       # px: the row labels left of the plot
PLOT_W = 1100       # px: the plot at zoom 1
PLOT_PAD = 6        # px: left of the plot's time 0, in its scrolling box
ROW_H = 22          # px: one lane of a rank
RANK_GAP = 8        # px: between ranks
CELL_H = 36         # px: one signal cell's counter row
AXIS_H = 24         # px: the time axis on top
PATH_ROWS = 1000    # a longer critical path shows its first and last 500 steps
COLORS = {"task": "#cfd8e3", "collective": "#d5c6ee", "notify": "#2e9e44", "wait": "#e4572e", "rma": "#3f6fb5"}

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d2330; }
h1 { font-size: 1.35em; margin: 0 0 .3em; } h2 { font-size: 1.1em; margin: 1.6em 0 .5em; }
.muted { color: #5b6475; } code, pre { font: 12px/1.35 ui-monospace, monospace; }
pre { background: #f4f6f9; padding: .6em .8em; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; } td, th { border: 1px solid #d6dbe3; padding: 3px 8px; text-align: right; }
th { background: #eef1f5; } td.l, th.l { text-align: left; }
.status-ok { color: #2e7d32; } .status-error { color: #b3261e; font-weight: 600; }
.finding { border-left: 4px solid #b3261e; padding: .2em .8em; margin: .6em 0; background: #fff6f5; }
.finding h3 { font-size: 1em; margin: .3em 0; }
#timeline-frame { display: flex; border: 1px solid #d6dbe3; }
#timeline-labels { flex: none; border-right: 1px solid #d6dbe3; }
#timeline-box { flex: 1 1 auto; min-width: 0; overflow-x: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #1d2330; }
svg .grid { stroke: #e6e9ef; }
svg .flow { stroke: #1d2330; stroke-width: 1.4; } svg .flow-halo { stroke: #ffffff; stroke-width: 4; opacity: .9; }
svg .critical { fill: none; stroke: #f2b600; stroke-width: 3; opacity: .75; }
svg.hide-critical .critical, svg.hide-flows .flow, svg.hide-flows .flow-halo { display: none; }
svg .waited { fill: #e4572e; opacity: .18; } svg .expected { stroke: #e4572e; stroke-width: 1.2; stroke-dasharray: 4 3; }
svg .never { fill: #b3261e; font-style: italic; }
svg .pending { stroke: #7a0000; stroke-width: 1.5; stroke-dasharray: 3 2; }
svg .counter { fill: none; stroke: #6a3d9a; stroke-width: 1.5; }
svg .norecords { fill: #b3261e; font-style: italic; }
svg .vec { vector-effect: non-scaling-stroke; }
.legend span { display: inline-block; margin-right: 1em; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -2px; }
.controls { margin: .4em 0; } .controls button { margin-right: .3em; }
tr.selected td { background: #fff4c2; }
"""

SCRIPT = """
(function () {
  var svg = document.getElementById('timeline');
  var box = document.getElementById('timeline-box');
  var plot = document.getElementById('plot');
  var plotW = Number(svg.dataset.plot), pad = Number(svg.dataset.pad);
  var zoom = 1;
  // Zooming stretches x coordinates only: arrow heads, dots, strokes and text keep their size.
  var X = {rect: ['x', 'width'], line: ['x1', 'x2'], circle: ['cx'], text: ['x']};
  var items = [];
  var els = plot.querySelectorAll('rect, line, circle, text, polyline');
  for (var i = 0; i < els.length; i++) {
    var el = els[i], tag = el.tagName.toLowerCase(), base = {};
    if (tag === 'polyline') {
      base.points = el.getAttribute('points').trim().split(/\\s+/).map(function (p) { return p.split(',').map(Number); });
    } else {
      (X[tag] || []).forEach(function (a) { base[a] = Number(el.getAttribute(a)); });
    }
    items.push([el, base]);
  }
  function apply(oldZoom) {
    var centre = (box.scrollLeft + box.clientWidth / 2) / oldZoom;
    items.forEach(function (item) {
      var el = item[0], base = item[1];
      Object.keys(base).forEach(function (a) {
        if (a === 'points') {
          el.setAttribute('points', base.points.map(function (p) { return p[0] * zoom + ',' + p[1]; }).join(' '));
        } else {
          el.setAttribute(a, base[a] * zoom);
        }
      });
    });
    svg.setAttribute('width', pad + plotW * zoom + 20);
    box.scrollLeft = Math.max(centre * zoom - box.clientWidth / 2, 0);  // keep the middle of the view in view
    document.getElementById('zoom-level').textContent = zoom + 'x';
  }
  document.getElementById('zoom-in').addEventListener('click', function () {
    var old = zoom; zoom = Math.min(zoom * 2, 256); apply(old);
  });
  document.getElementById('zoom-out').addEventListener('click', function () {
    var old = zoom; zoom = Math.max(zoom / 2, 1); apply(old);
  });
  document.getElementById('show-critical').addEventListener('change', function (e) {
    svg.classList.toggle('hide-critical', !e.target.checked);
  });
  document.getElementById('show-flows').addEventListener('change', function (e) {
    svg.classList.toggle('hide-flows', !e.target.checked);
  });
  var rows = document.querySelectorAll('tr[data-rank]');
  for (var j = 0; j < rows.length; j++) {
    rows[j].addEventListener('click', function () {
      var r = this.dataset.rank;
      for (var k = 0; k < rows.length; k++) { rows[k].classList.toggle('selected', rows[k].dataset.rank === r); }
    });
  }
})();
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def render(path, dispatch: int | None = None, top: int = 10) -> str:
    """Return the HTML report of one dispatch under ``path`` (as ``ptodist trace`` finds it)."""
    root, runs, dispatch, ranks, found = summary.read(path, dispatch)
    ending = summary.findings_for(root, dispatch)
    devices = _trace_devices(summary.merged_trace(root, dispatch))  # names ranks that wrote no records too
    devices.update({data["rank"]: data["device_id"] for data in ranks})
    world = max(max(found[dispatch]) + 1, max(devices, default=-1) + 1, _world_from_findings(ending))
    t0 = min(data["start"] for data in ranks)
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
             f"<link rel=\"icon\" href=\"data:,\">\n"
             f"<title>ptodist trace: {_e(root.name)} dispatch {dispatch}</title>\n<style>{CSS}</style>\n"
             "</head>\n<body>",
             f"<h1>ptodist trace: dispatch {dispatch} of {_e(root.name)}</h1>",
             f"<p class=\"muted\">{_e(root)}<br>{len(ranks)} of {world} rank(s) wrote records; dispatches with "
             f"records: {_e(', '.join(f'd{k}' for k in found))}. Times in ms from the first rank's start. "
             f"Merged trace (Perfetto, chrome://tracing): {_e(summary.merged_trace(root, dispatch) or 'none')}</p>"]
    parts.append(_findings(ending))
    parts.append(_rank_table(ranks, devices, world))
    parts.append(_timeline(ranks, devices, world, t0))
    parts.append(_matrix(ranks, devices, world))
    parts.append(_waits(ranks, devices, t0, top))
    parts.append(_path(ranks, devices, t0))
    parts.append(f"<script>{SCRIPT}</script>\n</body>\n</html>\n")
    return "\n".join(parts)


def write(path, out, dispatch: int | None = None, top: int = 10) -> Path:
    """Write the report of one dispatch under ``path`` to the file ``out``; return its path."""
    text = render(path, dispatch, top)
    out = Path(out)
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def _trace_devices(merged: Path | None) -> dict[int, int]:
    """``{rank: device}`` from the merged trace's process names (it names every rank of the dispatch)."""
    out: dict[int, int] = {}
    try:
        events = json.loads(merged.read_text())["traceEvents"] if merged is not None else []
    except (OSError, ValueError, KeyError):
        return out
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            m = re.fullmatch(r"rank (\d+) \(device (-?\d+)\)", str(ev.get("args", {}).get("name", "")))
            if m:
                out[int(m.group(1))] = int(m.group(2))
    return out


def _world_from_findings(ending: dict | None) -> int:
    ranks = [r for f in (ending or {}).get("findings", []) for r in f.get("ranks", [])]
    return max(ranks, default=-1) + 1


def _label(r: int, devices: dict[int, int]) -> str:
    return f"rank {r} (device {devices[r]})" if r in devices else f"rank {r}"


# -- sections ----------------------------------------------------------------------------------

def _findings(ending: dict | None) -> str:
    out = ["<section id=\"findings\"><h2>Findings</h2>"]
    if ending is None:
        out.append("<p class=\"status-ok\">No error was recorded for this dispatch (the driver writes "
                   "findings_d{k}.json when a dispatch ends with one).</p></section>")
        return "\n".join(out)
    out.append(f"<p class=\"status-error\">The dispatch ended with {_e(ending.get('error'))} "
               f"({_e(ending.get('status'))}).</p>")
    items = ending.get("findings") or []
    for f in items:
        ranks = f", ranks {', '.join(map(str, f['ranks']))}" if f.get("ranks") else ""
        pitfall = f" (see {_e(f['docs'])})" if f.get("docs") else ""
        out.append(f"<div class=\"finding\" data-kind=\"{_e(f.get('kind'))}\"><h3>{_e(f.get('kind'))}{_e(ranks)}"
                   f"{pitfall}</h3><pre>{_e(f.get('message', ''))}</pre>")
        if f.get("locations"):
            out.append(f"<p>at <code>{'</code>, <code>'.join(_e(loc) for loc in f['locations'])}</code></p>")
        if f.get("fix"):
            out.append(f"<p><b>fix:</b> {_e(f['fix'])}</p>")
        out.append("</div>")
    if not items:
        out.append(f"<pre>{_e(ending.get('message') or ending.get('error'))}</pre>")
    out.append("</section>")
    return "\n".join(out)


def _rank_table(ranks: list[dict], devices: dict[int, int], world: int) -> str:
    by_rank = {data["rank"]: data for data in ranks}
    out = ["<section id=\"ranks\"><h2>Per rank (ms)</h2><table><tr><th class=\"l\">rank</th><th>total</th>"
           "<th>busy</th><th>waiting</th><th>communicating</th><th>outside tasks</th><th>waiting %</th>"
           "<th>tasks/waits/notifies/rma</th><th class=\"l\">state</th></tr>"]
    for r in range(world):
        data = by_rank.get(r)
        if data is None:
            out.append(f"<tr data-rank=\"{r}\"><td class=\"l\">{_e(_label(r, devices))}</td>"
                       f"<td colspan=\"7\" class=\"l\">no records: killed before it could write them</td>"
                       f"<td class=\"l\">no records</td></tr>")
            continue
        t = summary.rank_times(data)
        share = f"{100.0 * t['waiting'] / t['total']:.0f}%" if t["total"] else "-"
        state = "stopped" if data.get("stopped") else "ended"
        out.append(f"<tr data-rank=\"{r}\"><td class=\"l\">{_e(_label(r, devices))}</td><td>{_ms(t['total'])}</td>"
                   f"<td>{_ms(t['busy'])}</td><td>{_ms(t['waiting'])}</td><td>{_ms(t['communicating'])}</td>"
                   f"<td>{_ms(t['outside'])}</td><td>{share}</td>"
                   f"<td>{t['tasks']}/{t['waits']}/{t['notifies']}/{t['rma']}</td><td class=\"l\">{state}</td></tr>")
    out.append("</table><p class=\"muted\">busy: inside tasks, not in an operation; outside tasks: start-up and "
               "the per-device orchestration; stopped: the driver stopped the rank before its dispatch ended "
               "(a hang, an interrupt, another rank's failure).</p></section>")
    return "\n".join(out)


def _tooltip(rec: dict, data: dict, t0: int) -> str:
    end = rec["end"] if rec["end"] is not None else data["end"]
    lines = [f"{rec['name']} ({rec['kind']})", f"{_ms(rec['start'] - t0)} .. {_ms(end - t0)} ms "
             f"({_ms(end - rec['start'])} ms)", f"at {summary._where(rec['where'])}"]
    if rec.get("task_id") is not None:
        lines.append(f"task {rec['task_id']}, lane {rec['lane']}")
    what = summary._describe(rec)
    if what:
        lines.append(what)
    a = rec.get("args", {})
    if rec["kind"] == "wait" and a.get("loops"):
        lines.append(f"loop indices {a['loops']}")
    if a.get("pending"):
        lines.append("still waiting when the run was stopped")
    return "\n".join(lines)


def _cells(ranks: list[dict]) -> list[dict]:
    """Every signal cell that was notified or waited on: its counter series (``points``, empty for a cell no
    notify reached) and the waits on it (``waits``: ``(record, waiting rank's data)``), by (buffer, owner, offset)."""
    cells = {(c["buffer_id"], c["owner"], c["offset"]): {**c, "waits": []} for c in swimlane.counter_series(ranks)}
    for data in ranks:
        for rec in data["records"]:
            if rec["kind"] == "wait":
                a = rec["args"]
                key = (a["buffer_id"], a["owner"], a["offset"])
                if key not in cells:  # waited on, never notified: a wrong peer or cell, or a cell RMA writes
                    cells[key] = {"name": swimlane.cell_name(a), "owner": a["owner"], "points": [], "waits": []}
                cells[key]["waits"].append((rec, data))
    return [cells[k] for k in sorted(cells)]


def _timeline(ranks: list[dict], devices: dict[int, int], world: int, t0: int) -> str:
    """The timeline: row labels in an SVG of their own, beside a scrolling SVG of the plot, so that zooming and
    scrolling the plot never moves the labels out of view."""
    by_rank = {data["rank"]: data for data in ranks}
    t1 = max(max(data["end"] for data in ranks), t0 + 1)
    span = t1 - t0

    def x(t: float) -> float:
        return round((t - t0) / span * PLOT_W, 2)

    rows: dict[tuple[int, int], float] = {}  # (rank, lane) -> y of the row's top
    labels, bars, flows = [], [], []
    y = AXIS_H + 4
    for r in range(world):
        data = by_rank.get(r)
        lanes = sorted({rec["lane"] for rec in data["records"]} or {0}) if data else [0]
        top = y
        for lane in lanes:
            rows[(r, lane)] = y
            y += ROW_H
        if data is None:
            y += ROW_H  # room for the 'no records' line
        height = y - top
        fill = "#fafbfc" if r % 2 else "#ffffff"
        state = "" if data is None or not data.get("stopped") else " (stopped)"
        labels.append(f"<g class=\"rank-label\" data-rank=\"{r}\"><rect x=\"0\" y=\"{top}\" width=\"{LABEL_W}\" "
                      f"height=\"{height}\" fill=\"{fill}\"/><text x=\"6\" y=\"{top + 15}\">"
                      f"{_e(_label(r, devices))}{state}</text>"
                      + (f"<text x=\"6\" y=\"{top + 15 + ROW_H}\" class=\"norecords\">no records</text>"
                         if data is None else "")
                      + "</g>")
        bars.append(f"<g class=\"rank\" data-rank=\"{r}\"><rect x=\"0\" y=\"{top}\" width=\"{PLOT_W}\" "
                    f"height=\"{height}\" fill=\"{fill}\"/>")
        if data is not None:
            ordered = sorted(data["records"], key=lambda rec: rec["kind"] not in summary.CONTAINERS)
            for rec in ordered:  # tasks first, the operations over them
                end = rec["end"] if rec["end"] is not None else data["end"]
                ry = rows[(r, rec["lane"])]
                container = rec["kind"] in summary.CONTAINERS and "args" not in rec
                bx, bw = x(rec["start"]), max(x(end) - x(rec["start"]), 0.4)
                by, bh = (ry + 2, ROW_H - 4) if container else (ry + 5, ROW_H - 10)
                pending = " pending vec" if rec.get("args", {}).get("pending") else ""
                bars.append(f"<rect class=\"k-{rec['kind']}{pending}\" x=\"{bx}\" y=\"{by}\" width=\"{bw:.2f}\" "
                            f"height=\"{bh}\" fill=\"{COLORS.get(rec['kind'], '#999')}\"><title>"
                            f"{_e(_tooltip(rec, data, t0))}</title></rect>")
        bars.append("</g>")
        y += RANK_GAP
    for n, w, src, dst in swimlane.release_pairs(ranks):
        ys, yd = rows.get((src, n["lane"])), rows.get((dst, w["lane"]))
        if ys is None or yd is None:
            continue
        x1, x2 = x(n["start"] + swimlane.arrow_inset(n)), x(w["end"] - swimlane.arrow_inset(w))
        ends = f"x1=\"{x1}\" y1=\"{ys + ROW_H / 2}\" x2=\"{x2}\" y2=\"{yd + ROW_H / 2}\""
        # a white halo under a dark line: readable over any bar; drawn last, over the bars and the path
        flows.append(f"<line class=\"flow-halo vec\" {ends}/><line class=\"flow vec\" {ends} "
                     f"marker-end=\"url(#arrow)\"><title>{_e(n['name'])} at {_e(summary._where(n['where']))} "
                     f"released {_e(w['name'])} at {_e(summary._where(w['where']))}</title></line>")
    # the critical path, through each step's rank and lane
    critical = []
    for s, _how in summary.critical_path(ranks):
        lane = s["rec"]["lane"] if s["rec"] is not None else 0
        ry = rows.get((s["rank"], lane))
        if ry is not None:
            critical.append(f"{x(s['t'])},{ry + ROW_H / 2}")
    path = f"<polyline class=\"critical vec\" points=\"{' '.join(critical)}\"/>" if len(critical) > 1 else ""
    # signal cells: one row each, for every cell notified or waited on
    counters = []
    cells = _cells(ranks)
    if cells:
        y += 6
        labels.append(f"<text x=\"6\" y=\"{y + 10}\" class=\"muted\"><tspan font-weight=\"600\">signal cells</tspan>"
                      f"</text>")
        y += 16
    for cell in cells:
        waits = cell["waits"]
        values = [v for _, v in cell["points"]] + [w["args"][k] for w, _ in waits for k in ("expected", "seen")]
        lo, hi = min(0, *values), max(1, *values)

        def vy(v: int, base: float = y, lo: int = lo, hi: int = hi) -> float:
            return round(base + CELL_H - 4 - (v - lo) / (hi - lo) * (CELL_H - 10), 2)

        parts = [f"<g class=\"cell\" data-owner=\"{cell['owner']}\" data-cell=\"{_e(cell['name'])}\">"
                 f"<line class=\"grid vec\" x1=\"0\" x2=\"{PLOT_W}\" y1=\"{y + CELL_H - 4}\" y2=\"{y + CELL_H - 4}\"/>"]
        for rec, data in waits:  # when each waiter waited on this cell, and for which value
            end = rec["end"] if rec["end"] is not None else data["end"]
            a = rec["args"]
            wx, ww = x(rec["start"]), max(x(end) - x(rec["start"]), 0.4)
            parts.append(f"<rect class=\"waited\" x=\"{wx}\" y=\"{y + 2}\" width=\"{ww:.2f}\" height=\"{CELL_H - 6}\">"
                         f"<title>rank {data['rank']} waited here at {_e(summary._where(rec['where']))}: {a['cmp']} "
                         f"{a['expected']}, "
                         + (f"still waiting at the stop (the cell held {a['seen']})" if a.get("pending")
                            else f"saw {a['seen']}") + "</title></rect>"
                         f"<line class=\"expected vec\" x1=\"{wx}\" x2=\"{round(wx + ww, 2)}\" "
                         f"y1=\"{vy(a['expected'])}\" y2=\"{vy(a['expected'])}\"/>")
        points = cell["points"] or [(min(rec["start"] for rec, _ in waits), waits[0][0]["args"]["seen"])]
        pts, prev = [], None
        for t, v in points:
            if prev is not None:
                pts.append(f"{x(t)},{prev}")
            prev = vy(v)
            pts.append(f"{x(t)},{prev}")
        pts.append(f"{x(t1)},{prev}")
        parts.append(f"<polyline class=\"counter vec\" points=\"{' '.join(pts)}\"/>")
        parts.extend(f"<circle class=\"vec\" cx=\"{x(t)}\" cy=\"{vy(v)}\" r=\"2\" fill=\"#6a3d9a\"><title>"
                     f"{_e(cell['name'])} = {v} at {_ms(t - t0)} ms</title></circle>" for t, v in cell["points"][1:])
        counters.append("".join(parts) + "</g>")
        never = "" if cell["points"] else (f"<text x=\"6\" y=\"{y + CELL_H / 2 + 16}\" class=\"never\">"
                                           "waited on, never notified</text>")
        labels.append(f"<g class=\"cell-label\" data-cell=\"{_e(cell['name'])}\"><text x=\"6\" y=\"{y + CELL_H / 2 + 2}\">"
                      f"{_e(cell['name'])}</text><text x=\"{LABEL_W - 8}\" y=\"{y + CELL_H / 2 + 2}\" "
                      f"text-anchor=\"end\" class=\"muted\">{lo}..{hi}</text>{never}</g>")
        y += CELL_H
    height = y + 10
    # the time axis: about ten ticks at a round step
    step = _tick_step(span)
    ticks = []
    k = 0
    while k * step <= span:
        tx = x(t0 + k * step)
        ticks.append(f"<line class=\"grid vec\" x1=\"{tx}\" x2=\"{tx}\" y1=\"{AXIS_H - 4}\" y2=\"{height}\"/>"
                     f"<text class=\"tick\" x=\"{tx}\" y=\"{AXIS_H - 8}\">"
                     f"{_ms(k * step).rstrip('0').rstrip('.')} ms</text>")
        k += 1
    legend = "".join(f"<span><i style=\"background:{c}\"></i>{k}</span>" for k, c in COLORS.items())
    return "\n".join([
        "<section id=\"timeline-section\"><h2>Timeline</h2>",
        f"<p class=\"legend\">{legend}<span><i style=\"background:#f2b600\"></i>critical path</span>"
        "<span>dashed outline: a wait still blocked when the run was stopped</span>"
        "<span>arrows: notify → the wait it released</span>"
        "<span>signal cells: shaded while a rank waited on the cell, dashed at the value it waited for</span></p>",
        "<p class=\"controls\"><button id=\"zoom-out\" type=\"button\">zoom out</button>"
        "<button id=\"zoom-in\" type=\"button\">zoom in</button> <span id=\"zoom-level\">1x</span> "
        "<label><input type=\"checkbox\" id=\"show-critical\" checked> critical path</label> "
        "<label><input type=\"checkbox\" id=\"show-flows\" checked> arrows</label> "
        "<span class=\"muted\">hover a bar for its details</span></p>",
        f"<div id=\"timeline-frame\"><svg id=\"timeline-labels\" width=\"{LABEL_W}\" height=\"{height}\" "
        "role=\"img\" aria-label=\"the timeline's rows\">",
        *labels,
        "</svg>",
        f"<div id=\"timeline-box\"><svg id=\"timeline\" width=\"{PLOT_PAD + PLOT_W + 20}\" height=\"{height}\" "
        f"data-pad=\"{PLOT_PAD}\" data-plot=\"{PLOT_W}\" role=\"img\" aria-label=\"timeline of every rank\">",
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerUnits=\"userSpaceOnUse\" "
        "markerWidth=\"9\" markerHeight=\"9\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" "
        "fill=\"#1d2330\" stroke=\"#ffffff\" stroke-width=\"1\"/></marker></defs>",
        f"<g id=\"plot\" transform=\"translate({PLOT_PAD},0)\">",
        *bars, *ticks, *counters, path, *flows, "</g>",
        "</svg></div></div></section>",
    ])


def _tick_step(span_ns: float) -> float:
    raw = span_ns / 10
    base = 1.0
    while base * 10 <= raw:
        base *= 10
    for m in (1, 2, 5, 10):
        if base * m >= raw:
            return base * m
    return base * 10


def _matrix(ranks: list[dict], devices: dict[int, int], world: int) -> str:
    m = summary.wait_matrix(ranks)
    cells = [*m["by_pair"].values(), *m["unreleased"].values(), *m["pending"].values()]
    top = max(cells, default=0) or 1

    def cell(ns: int, attrs: str) -> str:
        if not ns:
            return f"<td {attrs}></td>"
        alpha = 0.1 + 0.75 * ns / top
        return f"<td {attrs} style=\"background: rgba(228, 87, 46, {alpha:.2f})\">{_ms(ns)}</td>"

    out = ["<section id=\"matrix\"><h2>Who waited on whom (ms)</h2>",
           "<p class=\"muted\">Row: the rank that waited; column: the rank whose notify released the wait (the "
           "pairing of the merged trace's arrows). Time summed over the waits.</p><table>",
           "<tr><th class=\"l\">waited \\ released by</th>"
           + "".join(f"<th data-notifier=\"{r}\">rank {r}</th>" for r in range(world))
           + "<th>no recorded notify</th><th>still waiting at the stop</th></tr>"]
    for w in range(world):
        row = [f"<tr data-rank=\"{w}\"><th class=\"l\">{_e(_label(w, devices))}</th>"]
        for n in range(world):
            row.append(cell(m["by_pair"].get((w, n), 0), f"data-waiter=\"{w}\" data-notifier=\"{n}\""))
        row.append(cell(m["unreleased"].get(w, 0), f"data-waiter=\"{w}\" data-notifier=\"none\""))
        row.append(cell(m["pending"].get(w, 0), f"data-waiter=\"{w}\" data-notifier=\"pending\""))
        out.append("".join(row) + "</tr>")
    out.append("</table></section>")
    return "\n".join(out)


def _waits(ranks: list[dict], devices: dict[int, int], t0: int, top: int) -> str:
    waits = summary.wait_list(ranks)
    out = [f"<section id=\"waits\"><h2>Longest waits ({min(top, len(waits))} of {len(waits)})</h2>"]
    if not waits:
        out.append("<p>none recorded</p></section>")
        return "\n".join(out)
    out.append("<table><tr><th>ms</th><th class=\"l\">rank</th><th class=\"l\">where</th><th class=\"l\">wait</th>"
               "<th>iteration</th><th class=\"l\">released by</th></tr>")
    for dur, r, rec, released in waits[:top]:
        a = rec["args"]
        if a.get("pending"):
            by = f"still waiting when the run was stopped (the cell held {a['seen']})"
        elif released is not None:
            n, src = released
            na = n["args"]
            by = (f"{_label(src, devices)} notify at {summary._where(n['where'])} ({na['op']} {na['value']}: "
                  f"{na['old']} -> {na['new']}, at {_ms(n['start'] - t0)} ms)")
        else:
            by = "no recorded notify on this cell produced the value seen"
        loops = a.get("loops") or []
        out.append(f"<tr data-rank=\"{r}\"><td>{_ms(dur)}</td><td class=\"l\">{_e(_label(r, devices))}</td>"
                   f"<td class=\"l\"><code>{_e(summary._where(rec['where']))}</code></td>"
                   f"<td class=\"l\">{_e(summary._describe(rec))}</td>"
                   f"<td>{_e(', '.join(map(str, loops)))}</td><td class=\"l\">{_e(by)}</td></tr>")
    out.append("</table></section>")
    return "\n".join(out)


def _path(ranks: list[dict], devices: dict[int, int], t0: int) -> str:
    steps = summary.critical_path(ranks)
    out = ["<section id=\"critical-path\"><h2>Critical path</h2>"]
    if not steps:
        out.append("<p>no records</p></section>")
        return "\n".join(out)
    p = summary.path_summary(steps, devices, t0)
    out.append(f"<p>{_ms(p['length'])} ms over rank(s) {', '.join(map(str, p['ranks']))}, {len(steps)} steps, "
               f"{p['crossings']} cross-rank release(s); earliest first. <i>at</i>: when the step ended; "
               "<i>on path</i>: time since the step before; <i>as</i>: what the step's rank did in it (waiting: "
               "only inside a wait record).</p>")
    out.append("<p>on path by rank: " + _e(", ".join(f"{k} {_ms(v)}" for k, v in p["by_rank"].items()))
               + "<br>on path by step: " + _e(", ".join(f"{k} {_ms(v)}" for k, v in p["by_kind"].items())) + "</p>")
    out.append("<table><tr><th>at</th><th>dur</th><th>on path</th><th class=\"l\">as</th><th class=\"l\">rank</th>"
               "<th class=\"l\">step</th>"
               "<th class=\"l\">name</th><th class=\"l\">where</th><th class=\"l\"></th></tr>")
    rows = p["rows"]
    if len(rows) > PATH_ROWS:
        left = rows[PATH_ROWS // 2:-PATH_ROWS // 2]
        out.append(f"<p class=\"muted\">{len(left)} steps in the middle are left out "
                   f"({_ms(sum(row['on_path'] for row in left))} ms on path).</p>")
        rows = rows[:PATH_ROWS // 2] + rows[-PATH_ROWS // 2:]
    for row in rows:
        note = " ".join(filter(None, [row["what"], "← released by the notify above" if row["released"] else ""]))
        out.append(f"<tr data-rank=\"{row['rank']}\"><td>{_ms(row['at'])}</td>"
                   f"<td>{_ms(row['dur']) if row['dur'] is not None else ''}</td><td>{_ms(row['on_path'])}</td>"
                   f"<td class=\"l\">{_e(summary.parts_text(row['parts']))}</td>"
                   f"<td class=\"l\">{_e(row['label'])}</td><td class=\"l\">{_e(row['step'])}</td>"
                   f"<td class=\"l\">{_e(row['name'])}</td><td class=\"l\"><code>{_e(row['where'])}</code></td>"
                   f"<td class=\"l\">{_e(note)}</td></tr>")
    out.append("</table></section>")
    return "\n".join(out)
