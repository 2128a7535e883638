"""all_to_all: row block p of every rank's input goes to rank p, pushed with ``put``."""

from __future__ import annotations

import ptodist.language.distributed as pld

from .. import context
from . import common
from .registry import collective
from .spec import check_exchange, exchange_input, window


def _build(call, args, kwargs, w, host) -> None:
    call.signal, call.target = window(args[2], "signal", w), window(args[1], "target", w)
    call.source = exchange_input(args[0], w, host)


def _options(call, w: str, world: int, host: bool) -> None:
    check_exchange(call, w, world)


def run(call, me: int, n: int, host: bool) -> None:
    """Row block p of my input goes to row block ``me`` of rank p's target."""
    input, target, signal = call.source, call.target, call.signal
    rows = input.shape[0] // n
    rest = [0] * (len(input.shape) - 1)
    ext = [rows, *input.shape[1:]]
    dst = [me * rows, *rest]
    common.enter(signal, me, n)
    for i in range(n):
        p = (me + i) % n
        pld.tensor.put(target, p, input, dst, [p * rows, *rest], ext)
    common.leave(signal, me, n)


@collective(domain=(1, 2), build=_build, options=_options, run=run, source_role="input", fixed_schedule=True)
def all_to_all(input, target, signal):
    """``target[src]`` on rank r becomes ``input[r]`` on rank src.

    ``input``: a window, or inside a kernel also a plain ``pl.Tensor``; ``target`` a separate window.
    """
    return context.current().collective("all_to_all", (input, target, signal), {})
