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


def run_rank(ctx, log=None, dfx=None, *, last: bool = True, settle=None) -> RankOutcome:
    """Run ``ctx``'s tasks (a ``RankContext``) and say how they ended.

    ``log``/``dfx``: the rank's EventLog and the DfxRequest when diagnostic outputs are on.  The
    outputs are written when the rank's part of the dispatch ends: after its ``last`` segment, after
    a failure (before the rank reports it, so the driver finds every rank's files when it merges),
    and, marked stopped, when the rank is stopped.  ``settle()``, when given, runs when the tasks
    end however they end (mpi: complete this rank's puts at their targets).  Never raises: whatever escaped the tasks is the
    outcome's ``failure``.
    """
    failure = None
    state = rank_state(ctx.plan, ctx.rank)
    before = state.stamp() if state is not None else None
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
    if before is not None and failure is None:
        changed = before.changed(state.stamp())
        if changed:  # the next dispatch would see it on some backends only: refused on every one
            error = KernelStateError(changed_message(state, changed, f"rank {ctx.rank}'s code"))
            failure = rank_failure(ctx.plan, ctx.rank, ctx.task, error)
    if log is not None and dfx is not None and (last or failure is not None):
        try:
            write_rank_outputs(log, dfx)
        except Exception as e:  # noqa: BLE001 - a failed write is this rank's failure
            failure = failure or rank_failure(ctx.plan, ctx.rank, None, e)
    return RankOutcome(failure)
