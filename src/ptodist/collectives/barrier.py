"""barrier: every rank arrives before any leaves (``common.barrier``, the self-clearing token barrier)."""

from __future__ import annotations

from .. import context
from . import common
from .registry import collective
from .spec import window


def _build(call, args, kwargs, w, host) -> None:
    call.signal = window(args[0], "signal", w)


def run(call, me: int, n: int, host: bool) -> None:
    common.barrier(call.signal, me, n)


@collective(domain=(0,), build=_build, run=run, fixed_schedule=True)
def barrier(signal):
    """All ranks arrive before any leaves; self-clearing (the same signal may be reused)."""
    return context.current().collective("barrier", (signal,), {})
