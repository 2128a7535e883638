"""Every process takes each step together: one plan, one error for a step that failed anywhere, and a
process that cannot keep step ends the job."""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import time
import traceback

from ...compiler.plan import BuiltinCall, DispatchPlan, HostTensorRef, WindowView
from ...config import started_by_mpi_launcher
from ...errors import ConfigError, DispatchValueError
from ...language.scalar import Scalar
from .layout import END_WAIT_S
from .session import _Session

# -- before the run: one plan, one set of inputs ------------------------------------------------------

def _arg_key(a):
    if isinstance(a, WindowView):
        return ("window", a.buffer.id, tuple(a.shape), a.dtype.name)
    if isinstance(a, HostTensorRef):
        return ("host", a.tensor.index, tuple(a.index))
    if isinstance(a, Scalar):
        return ("scalar", a.value, a.dtype.name)
    if isinstance(a, (list, tuple)):
        return tuple(_arg_key(x) for x in a)
    if isinstance(a, (int, float, bool, str)) or a is None:
        return a
    return type(a).__name__


def plan_digest(plan: DispatchPlan, scalars: tuple = ()) -> str:
    """A digest of what the ranks will do: windows, host tensors, every rank's tasks and arguments, and the
    dispatch's scalar arguments (exactly: ``-0.0`` is not ``0.0``)."""
    tasks = [[(t.function.describe() if isinstance(t.function, BuiltinCall) else t.function.name,
               tuple(_arg_key(a) for a in t.args)) for t in ts] for ts in plan.tasks]
    parts = (plan.program, plan.world, tuple(plan.device_ids), plan.window_heap_bytes,
             tuple((w.name, w.offset, w.nbytes) for w in plan.windows),
             tuple((t.index, t.name, tuple(t.shape), t.dtype.name, t.direction.value) for t in plan.host_tensors),
             tasks, tuple((type(v).__name__, v.hex() if isinstance(v, float) else repr(v)) for v in scalars))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _agree_on_plan(s: _Session, plan: DispatchPlan, what: str, scalars: tuple = ()) -> BaseException | None:
    """Check, in every process alike, that the job has one process per rank and one plan (with the same scalar
    arguments: each process's rank takes its own); return the error every process raises (a process that failed
    to prepare the command sends its error instead of a plan)."""
    error, everyone = _exchange(s, plan.device_ids, "segment", what, None,
                                (plan.world, plan_digest(plan, scalars)))
    if error is not None:
        return error
    worlds = sorted({w for w, _ in everyone})
    if worlds != [s.size]:
        ids = list(plan.device_ids)
        if s.size == 1 and not started_by_mpi_launcher():
            return _no_launcher(plan.program, plan.device_ids)
        return ConfigError(
            f"{plan.program}: the program has {plan.world} ranks (DistributedConfig(device_ids={ids})) but this "
            f"MPI job has {s.size} process{'es' if s.size != 1 else ''}, and each MPI process runs one rank. "
            f"Start it with `mpirun -n {plan.world} ...`, or give device_ids {s.size} "
            f"entr{'ies' if s.size != 1 else 'y'}.")
    differ = [p for p, (_, d) in enumerate(everyone) if d != everyone[0][1]]
    if differ:
        return DispatchValueError(
            f"{plan.program}: MPI process(es) {differ} planned a different dispatch than process 0 (other "
            "windows, tasks or scalar arguments). Every process runs the host orchestrator and must plan the "
            "same thing: do not derive shapes, scalar arguments or control flow of the host orchestrator from "
            "the process (its MPI rank, host name, unseeded randomness).")
    return None


# -- taking each step together --------------------------------------------------------------------------------

PICKLED_ERROR_MAX = 1 << 20  # a larger pickled exception travels as its type and text only
# The steps the processes take together where a step can fail in some of them (``_exchange``), as a report
# names them.
_STEPS = {"accept": "binding and planning a dispatch", "windows": "making a worker's window memory",
          "segment": "the plan of a command", "callback": "a sub-worker callback", "outputs": "exchanging outputs",
          "dfx": "exchanging DFX files", "dfx written": "writing DFX files"}


def _exchange(s: _Session, device_ids, step: str, what: str, error: BaseException | None,
              value=None) -> tuple[BaseException | None, list | None]:
    """Every process of the job at ``step``: send ``value``, or ``error`` where the step failed in this process.

    Returns ``(error, values)``: ``values`` every process's value when the step succeeded everywhere;
    else ``error``, what this process fails ``what`` with, and ``values`` None.  Every process fails alike,
    with the failure that weighs most (an interrupt, then another exit, then an ordinary exception; the
    lowest process among equals): a process whose own failure weighs as much raises its own (with its
    traceback), the others a copy (``_rebuild``).  A note names the process it was raised in.  Processes at
    different steps are out of step (they made different calls): every later exchange would pair
    unrelated data, so the job ends.
    """
    mine = (step, _failure(error) if error is not None else None, value)
    if s.size == 1:
        everyone = [mine]
    else:
        everyone = s.comm.allgather(mine)
    steps = [st for st, _, _ in everyone]
    if any(st != step for st in steps):
        if s.rank == 0:
            at = ", ".join(f"process {p} at {_STEPS.get(st, st)}" for p, st in enumerate(steps))
            _say([f"ptodist: the processes of the MPI job are out of step ({at}): every process of the job must "
                  "make the same calls on ptodist (the same dispatches and worker calls, in the same order), and "
                  "here they did not, so the MPI job is ended with MPI_Abort."])
        else:
            time.sleep(END_WAIT_S)  # process 0 reports, then ends the job
        _abort(s)
    failed = [(p, f) for p, (_, f, _) in enumerate(everyone) if f is not None]
    if not failed:
        return None, [v for _, _, v in everyone]
    if error is not None and s.size == 1:
        return error, None
    chosen, first = max(failed, key=lambda pf: (pf[1]["weight"], -pf[0]))

    def where(p: int) -> str:
        return f"MPI process {p} (rank {p}, device {device_ids[p]})"

    others = [(p, f) for p, f in failed if p != s.rank]
    if error is not None and _weight(error) == first["weight"]:
        also = "".join(f"; {where(p)} failed at this step too: {f['summary']}" for p, f in others)
        error.add_note(f"raised in {where(s.rank)}{also}. Every process of the MPI job fails {what}.")
        return error, None
    out = _rebuild(first)
    note = (f"raised in {where(chosen)}, not in this process ({s.rank}). Every process of the MPI job fails "
            f"{what}. Its traceback in process {chosen}:\n{first['traceback'].rstrip()}")
    if error is not None:
        note += f"\nThis process failed at this step too: {type(error).__name__}: {error}"
    out.add_note(note)
    return out, None


def _weight(e: BaseException) -> int:
    return 2 if isinstance(e, KeyboardInterrupt) else 0 if isinstance(e, Exception) else 1


def _failure(e: BaseException) -> dict:
    """A failure as the other processes can take it: its text, its traceback, and the exception pickled
    (or its importable classes, most derived first, when it cannot be: a class local to a function)."""
    try:
        data = pickle.dumps(e)
        data = data if len(data) <= PICKLED_ERROR_MAX else None
    except Exception:  # noqa: BLE001 - anything may fail to pickle: the classes and the text still travel
        data = None
    classes = []
    for cls in type(e).__mro__:
        try:
            classes.append(pickle.dumps(cls))
        except Exception:  # noqa: BLE001 - a class that cannot be named in another process
            continue
    try:
        args = pickle.dumps(e.args)
    except Exception:  # noqa: BLE001 - its text stands for them
        args = pickle.dumps((str(e),))
    return {"weight": _weight(e), "summary": f"{type(e).__name__}: {e}", "args": args,
            "traceback": "".join(traceback.format_exception(e)), "exception": data, "classes": classes}


def _rebuild(f: dict) -> BaseException:
    """The exception another process raised: itself if it unpickles here, else its nearest class that does,
    made from its arguments."""
    if f["exception"] is not None:
        try:
            e = pickle.loads(f["exception"])
            if isinstance(e, BaseException):
                return e
        except Exception:  # noqa: BLE001 - e.g. a class whose __init__ the pickled arguments do not fit
            pass
    try:
        args = pickle.loads(f["args"])
    except Exception:  # noqa: BLE001 - arguments of a class not importable here
        args = (f["summary"],)
    for data in f["classes"]:
        try:
            e = pickle.loads(data)(*args)
        except Exception:  # noqa: BLE001 - not importable here, or its __init__ wants other arguments
            continue
        if isinstance(e, BaseException):
            return e
    return Exception(f["summary"])


def _abort(s: _Session) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    s.comm.Abort(1)


def _leave_job(s: _Session, device_ids, error: BaseException | None, doing: str) -> None:
    """This process stopped ``doing`` alone (``error`` escaped it); the others would wait for it in the next
    collective step for ever: say so, and end the job.  Nothing to do in a job of one process."""
    if s.size == 1:
        return
    lines = ["".join(traceback.format_exception(error)).rstrip()] if error is not None else []
    why = f" ({type(error).__name__}{': ' if str(error) else ''}{error})" if error is not None else ""
    lines.append(f"ptodist: MPI process {s.rank} (rank {s.rank}, device {device_ids[s.rank]}) stopped {doing} "
                 f"alone{why}; the other processes would wait for it for ever in the next step they take "
                 "together, so it ends the MPI job with MPI_Abort.")
    _say(lines)
    _abort(s)


def _no_launcher(program: str, device_ids) -> ConfigError:
    return ConfigError(
        f"{program}: the program has {len(device_ids)} ranks (DistributedConfig(device_ids={list(device_ids)})) "
        "and runs on the 'mpi' backend, where each MPI process runs one rank, but no MPI launcher started this "
        f"process. Start it with `mpirun -n {len(device_ids)} python SCRIPT`, or choose another backend "
        "(RunConfig(backend='shm') or PTODIST_BACKEND=shm).")


def _say(lines: list[str]) -> None:
    """Write ``lines`` to stderr at once, bypassing Python's buffers (also safe inside a signal handler)."""
    if lines:
        try:
            os.write(2, ("\n".join(lines) + "\n").encode(errors="replace"))
        except OSError:
            pass
