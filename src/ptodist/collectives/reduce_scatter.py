"""reduce_scatter: rank r ends with the sum of every rank's row block r, in its own row block r."""

from __future__ import annotations

from .. import context
from ..errors import ProgramValueError
from ..language.distributed.types import ReduceOp
from . import common
from .registry import collective
from .spec import describe, reduce_op, window


def _build(call, args, kwargs, w, host) -> None:
    call.signal, call.target = window(args[1], "signal", w), window(args[0], "target", w)
    call.op = reduce_op(w, kwargs.get("op"))


def _options(call, w: str, world: int, host: bool) -> None:
    t = call.target
    if call.op is not ReduceOp.Sum:
        raise ProgramValueError(f"{w}: reduce_scatter supports op=pld.ReduceOp.Sum only, got {call.op.name}")
    if not t.shape or t.shape[0] % world:
        raise ProgramValueError(f"{w}: the target holds one chunk per rank along dimension 0, so its first "
                                f"dimension must divide by {world}; {describe(t)}")


def run(call, me: int, n: int, host: bool) -> None:
    """Rank r ends with the reduction of every rank's chunk r (row block r) in its own row block r."""
    target, signal = call.target, call.signal
    rows = target.shape[0] // n
    offsets = [me * rows] + [0] * (len(target.shape) - 1)
    ext = [rows, *target.shape[1:]]
    common.enter(signal, me, n)
    # Only this rank touches row block `me` of its own window, so it can accumulate in place (Sum only).
    common.accumulate_peers(target, offsets, ext, me, n)
    common.leave(signal, me, n)


@collective(domain=(0, 1), build=_build, options=_options, run=run, fixed_schedule=True)
def reduce_scatter(target, signal, *, op=None):
    """``target`` holds one chunk per rank (row j for rank j); rank r ends with the sum of chunk r in row r."""
    return context.current().collective("reduce_scatter", (target, signal), {"op": op})
