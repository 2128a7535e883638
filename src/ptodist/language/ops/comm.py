"""Cross-rank signals on a one-cell INT32 tensor: ``pl.system.comm_notify``, ``comm_wait``, ``comm_test``.

The signal is a tensor whose one INT32 element is a cell of a window (``pl.slice(window, [1], [i])``, or a
one-cell window); what each operation means lives in the rank context, which gives them the meaning of
``pld.system.notify`` / ``wait`` on that cell, so hang reports, traces and ``ptodist check`` see them as such.
"""

from __future__ import annotations

from ... import context
from .registry import ANY, op

_SYNC = "Synchronization"


@op("comm_notify", family=_SYNC, reach="system", dtypes=ANY, levels=())
def comm_notify(signal, value, *, op: str) -> None:
    """Write (``op="set"``) or atomically add (``op="atomic_add"``) INT32 ``value`` to the window cell ``signal``."""
    context.current().memory_op("pl.system.comm_notify", signal, value, op)


@op("comm_wait", family=_SYNC, reach="system", dtypes=ANY, levels=())
def comm_wait(signal, cmp_value, *, cmp: str) -> None:
    """Block until this rank's window cell ``signal`` ``cmp`` (eq ne gt ge lt le) ``cmp_value`` holds."""
    context.current().memory_op("pl.system.comm_wait", signal, cmp_value, cmp)


@op("comm_test", family=_SYNC, reach="system", dtypes=ANY, levels=())
def comm_test(signal, cmp_value, *, cmp: str):
    """Whether this rank's window cell ``signal`` ``cmp`` ``cmp_value`` holds now, a BOOL Scalar; never blocks."""
    return context.current().memory_op("pl.system.comm_test", signal, cmp_value, cmp)
