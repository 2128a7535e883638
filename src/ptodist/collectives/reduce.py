"""reduce: rank ``root``'s target becomes the reduction of every rank's target; the others keep theirs.

Not in upstream PyPTO (whose collectives reduce to every rank): an addition on allreduce's mesh protocol,
with broadcast's ``root``.
"""

from __future__ import annotations

import ptodist.language as pl

from .. import context
from ..errors import ProgramTypeError
from . import common
from .registry import collective
from .spec import ALLREDUCE_DTYPES, check_root, describe, reduce_op, window


def _build(call, args, kwargs, w, host) -> None:
    call.signal, call.target = window(args[1], "signal", w), window(args[0], "target", w)
    call.op, call.root = reduce_op(w, kwargs.get("op")), kwargs.get("root", 0)


def _options(call, w: str, world: int, host: bool) -> None:
    check_root(call.root, w, world)
    t = call.target
    if t.dtype not in ALLREDUCE_DTYPES:
        raise ProgramTypeError(f"{w}: reduce supports {', '.join(d.name for d in ALLREDUCE_DTYPES)}; "
                               f"{describe(t)} is {t.dtype.name}")


def run(call, me: int, n: int, host: bool) -> None:
    """Root reads every rank's target (``remote_load``) between two barriers and reduces in rank order, as the
    mesh allreduce does: the first barrier says every contribution is in place, the second that root has read
    them all, so no rank overwrites its target while root may still read it.  Only root writes, its own
    target, which no other rank reads."""
    target, signal = call.target, call.signal
    common.enter(signal, me, n)
    if me == call.root:
        pl.store(common.reduce_from_all(target, common.whole(target), call.op, n), [0] * len(target.shape), target)
    common.leave(signal, me, n)


@collective(domain=(0, 1), build=_build, options=_options, run=run)
def reduce(target, signal, *, root, op=None):
    """Rank ``root``'s ``target`` becomes the reduction (``op``, default Sum) of all ranks' ``target``, over
    ranks 0, 1, ... in that order; every other rank's ``target`` is left as it was.  ``root`` is a Python int;
    the signal is a mesh signal, ``[NR, 1]`` (or ``[NR]``).  FP32, FP16, BF16, INT32, as allreduce."""
    return context.current().collective("reduce", (target, signal), {"root": root, "op": op})
