"""Explain a hang from every rank's state on the status board."""

from __future__ import annotations


def hang_report(states: list[dict], certain: bool, idle_s: float, timeout_s: float) -> str:
    """Return the HangError message: every rank's state, then the likely causes and fixes."""
    waiting = [s for s in states if s["state"] == "waiting"]
    if certain:
        head = (f"deadlock: every unfinished rank is blocked in a wait that no running rank can satisfy "
                f"(nothing changed for {idle_s:.1f} s).")
    else:
        head = (f"no progress for {idle_s:.1f} s (hang timeout {timeout_s:g} s): the ranks stopped making progress.")
    lines = [head]
    for s in states:
        who = f"  rank {s['rank']} (device {s['device_id']})"
        if s["state"] == "waiting":
            sym = "==" if s["cmp"] == "Eq" else ">="
            task = f" in kernel '{s['task']}'" if s.get("task") else ""
            lines.append(f"{who}: blocked at {s['where']}{task}: {s['wait']} holds {s['current']}, "
                         f"needs {sym} {s['expected']} (waiting {s['waiting_s']:.2f} s)")
        elif s["state"] == "running":
            lines.append(f"{who}: running task '{s['task']}' (not in a wait)")
        else:
            lines.append(f"{who}: {s['state']}")
    if waiting:
        lines.append("Likely causes:")
        lines.append("  - a rank waits before it notifies: put the notify loop before the wait loop;")
        lines.append("  - a wait and the send it needs are in different tasks: order them with "
                     "pl.submit(..., deps=[send_task]);")
        lines.append("  - NotifyOp.Set on a cell with several writers overwrites earlier arrivals: use AtomicAdd "
                     "with WaitCmp.Ge for multi-party barriers;")
        lines.append("  - the expected value can never be reached (counters only grow; a reused row already "
                     "holds older arrivals), or a peer finished without notifying.")
    if not certain:
        lines.append("If a rank is legitimately computing for longer, raise RunConfig(hang_timeout_s=...) or "
                     "PTODIST_HANG_TIMEOUT.")
    return "\n".join(lines)
