"""A rank's DFX outputs when its dispatch is cut short: a hang, an interrupt, another rank's failure.

The driver stops such a rank by raising an exception in it (``shm``: SIGTERM, whose handler raises;
a worker's ranks: the abort; ``sim``: the scheduler's abort).  The rank then writes what it recorded
so far with :func:`write_stopped`: its records, marked ``"stopped": true``, end with the wait it was
blocked in (``"pending": true``), so a hanging run's merged trace shows the timeline up to the hang.

The wait is the one the rank context says it is blocked in (``RankContext.blocked_in``, kept only
while a rank with an event log waits past its first slice).  The ``pl.range`` loop indices are gone
by then (the loops were unwound), so the context keeps them with the wait.
"""

from __future__ import annotations

from . import write_rank_outputs


def pending_wait(log, ctx) -> dict | None:
    """Record the wait ``ctx`` was blocked in when it was stopped; return the record (or None).

    The record is a ``wait`` like the others, ended now, with ``pending: true`` and ``seen`` the
    cell's value at the stop; ``iteration``/``loops`` are the ``pl.range`` indices of the wait.
    """
    blocked = getattr(ctx, "blocked_in", None)
    if blocked is None:
        return None
    w, byte, idx, expected, cmp, where, start, task, loops = blocked
    try:
        seen = int(ctx.memory.cell_load(w.buffer.id, ctx.rank, byte))
    except Exception:  # noqa: BLE001 - the memory is already gone: no value to show
        seen = None
    rec = log.op("wait", "pld.system.wait", start, task["task_id"] if task else None, task["lane"] if task else 0,
                 str(where or ""), buffer=w.buffer.name, buffer_id=w.buffer.id, owner=log.rank,
                 cell=[int(i) for i in idx], offset=byte, cmp=cmp.name, expected=expected, seen=seen)
    if task is not None and task["end"] is not None and task["end"] < rec["end"]:
        rec["end"] = max(task["end"], rec["start"])  # the task was closed as the stop unwound it: the wait ended there
    rec["args"]["iteration"] = loops[-1] if loops else None
    rec["args"]["loops"] = loops
    rec["args"]["pending"] = True
    return rec


def write_stopped(log, request, ctx) -> bool:
    """In a stopped rank: add the wait ``ctx`` was blocked in, mark the log stopped, write the outputs.

    Returns whether the files were written; never raises (a stopped rank has no one to report to).
    """
    try:
        log.stopped = True
        pending_wait(log, ctx)
        write_rank_outputs(log, request)
        return True
    except Exception:  # noqa: BLE001
        return False
