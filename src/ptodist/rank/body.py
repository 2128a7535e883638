"""The one rank body every backend calls: run a rank's tasks, report how they ended, write its DFX files."""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler.state import changed_message, rank_state
from ..dfx import write_rank_outputs
from ..dfx.flush import write_stopped
from ..errors import KernelStateError, RankFailure
from .failures import rank_failure


class RankStopped(BaseException):
    """Raised inside a rank to stop its dispatch: a hang, another rank's failure, an interrupt.

    Not a failure of the rank itself, so it is a ``BaseException`` that user code's ``except
    Exception`` does not swallow.  Every backend stops a rank with it (a signal handler, an abort
    word seen in a wait, the sim scheduler's abort).
    """


@dataclass
class RankOutcome:
    """How one rank's run (or one segment of a dispatch) ended."""

    failure: RankFailure | None = None
    stopped: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.stopped


# In a process that runs nothing but rank bodies (an shm rank): the program state each ProgramState read when it
# first ran, the driver's as the process was forked (id(state) -> (state, stamp)). Later runs must end with it.
_started: dict = {}


def run_rank(ctx, log=None, dfx=None, *, last: bool = True, settle=None, dedicated: bool = False) -> RankOutcome:
    """Run ``ctx``'s tasks (a ``RankContext``) and say how they ended.

    ``log``/``dfx``: the rank's EventLog and the DfxRequest when diagnostic outputs are on.  The
    outputs are written when the rank's part of the dispatch ends: after its ``last`` segment, after
    a failure (before the rank reports it, so the driver finds every rank's files when it merges),
    and, marked stopped, when the rank is stopped.  ``settle()``, when given, runs when the tasks
    end however they end (mpi: complete this rank's puts at their targets).  Never raises: whatever escaped the tasks is the
    outcome's ``failure``.  A run that ends with Python state the program reads changed fails with
    ``KernelStateError`` (a failed run's failure is marked ``state_changed``).  ``dedicated``: this
    process runs nothing but rank bodies (no driver code), so every run must end with the state the
    process had when it first ran one.
    """
    failure = None
    state = rank_state(ctx.plan, ctx.rank)
    before = None
    if state is not None:
        first = _started.get(id(state)) if dedicated else None
        before = first[1] if first is not None and first[0] is state else state.stamp()
        if dedicated and first is None:
            _started[id(state)] = (state, before)
            if len(_started) > 64:  # the oldest programs' (dicts keep insertion order)
                del _started[next(iter(_started))]
    try:
        try:
            ctx.run_all()
        finally:
            if settle is not None:
                settle()
    except RankStopped:
        if log is not None and dfx is not None:  # the records up to the stop, ending with the pending wait
            write_stopped(log, dfx, ctx)
        return RankOutcome(stopped=True)
    except BaseException as e:  # noqa: BLE001 - everything a rank raises is reported to the driver
        failure = rank_failure(ctx.plan, ctx.rank, ctx.failed_task or ctx.task, e)
    changed = state.changed_since(before) if before is not None else []
    if changed:  # the next dispatch would see it on some backends only: refused on every one
        if failure is None:
            error = KernelStateError(changed_message(state, changed, "the rank's code"))
            failure = rank_failure(ctx.plan, ctx.rank, ctx.task, error)
            failure.traceback = ""  # found after the tasks, at no line of theirs: the message names the readers
        elif not failure.state_changed:
            failure.message += (" (before it failed, the rank's code also changed Python state the program "
                                f"reads: {', '.join(repr(label) for label in changed[:4])})")
        failure.state_changed = True
    if log is not None and dfx is not None and (last or failure is not None):
        try:
            write_rank_outputs(log, dfx)
        except Exception as e:  # noqa: BLE001 - a failed write is this rank's failure
            failure = failure or rank_failure(ctx.plan, ctx.rank, None, e)
    return RankOutcome(failure)
