"""A rank's DFX outputs when its dispatch is cut short: a hang, an interrupt, another rank's failure.

The driver stops such a rank by raising an exception in it (``shm``: SIGTERM, whose handler raises;
a worker's ranks: the abort; ``sim``: the scheduler's abort).  The rank then writes what it recorded
so far with :func:`write_stopped`: its records, marked ``"stopped": true``, end with the wait it was
blocked in (``"pending": true``), so a hanging run's merged trace shows the timeline up to the hang.

The wait is read from the exception's traceback (the frames of ``RankContext._block_until`` and
``RankContext._task_body`` in ``ptodist/runtime/rank.py``, which a traceback keeps with their
locals).  The ``pl.range`` loop indices are gone by then (the loops were unwound), so the
exception takes them when it is made: :func:`loops_now`.
"""

from __future__ import annotations

from ..source import is_internal
from . import write_rank_outputs


def loops_now() -> list[int]:
    """The ``pl.range`` indices of this thread, outermost first (call it where the stop is raised)."""
    from ..language.control import loop_indices

    return loop_indices()


def _frames(tb):
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def pending_wait(log, exc: BaseException) -> dict | None:
    """Record the wait the rank was blocked in when ``exc`` stopped it; return the record (or None).

    The record is a ``wait`` like the others, ended now, with ``pending: true`` and ``seen`` the
    cell's value at the stop; ``iteration``/``loops`` are those the exception took when raised.
    """
    wait = task = None
    user = None
    for frame, line in _frames(exc.__traceback__):
        code = frame.f_code
        if not is_internal(code.co_filename):
            user = f"{code.co_filename}:{line}"  # the innermost user line: the pld.system.wait call
            continue
        if code.co_name not in ("_block_until", "_task_body"):
            continue
        loc = frame.f_locals
        if getattr(loc.get("self"), "events", None) is not log:
            continue
        if code.co_name == "_task_body" and loc.get("rec") is not None:
            task = loc["rec"]
        elif code.co_name == "_block_until" and loc.get("start"):
            wait = (loc, user)
    if wait is None:
        return None
    loc, user = wait
    try:
        ctx, w, byte, idx, expected, cmp = (loc[k] for k in ("self", "w", "byte", "idx", "expected", "cmp"))
        try:
            seen = int(ctx.memory.cell_load(w.buffer.id, ctx.rank, byte))
        except Exception:  # noqa: BLE001 - memory already gone: the last value the wait saw, if any
            seen = loc.get("seen")
        where = loc.get("loc") or user or ""
        rec = log.op("wait", "pld.system.wait", loc["start"], task["task_id"] if task else None,
                     task["lane"] if task else 0, str(where), buffer=w.buffer.name, buffer_id=w.buffer.id,
                     owner=log.rank, cell=[int(i) for i in idx], offset=byte, cmp=cmp.name, expected=expected,
                     seen=seen)
    except Exception:  # noqa: BLE001 - frames of another shape (a changed runtime): no pending record
        return None
    if task is not None and task["end"] is not None and task["end"] < rec["end"]:
        rec["end"] = max(task["end"], rec["start"])  # the task was closed as the stop unwound it: the wait ended there
    loops = list(getattr(exc, "loops", None) or [])
    rec["args"]["iteration"] = loops[-1] if loops else None
    rec["args"]["loops"] = loops
    rec["args"]["pending"] = True
    return rec


def write_stopped(log, request, exc: BaseException) -> bool:
    """In a rank stopped by ``exc``: add the pending wait, mark the log stopped and write the outputs.

    Returns whether the files were written; never raises (a stopped rank has no one to report to).
    """
    try:
        log.stopped = True
        pending_wait(log, exc)
        write_rank_outputs(log, request)
        return True
    except Exception:  # noqa: BLE001
        return False
