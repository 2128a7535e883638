"""``pld.system.*``: rank identity and signals."""

from __future__ import annotations

from ... import context
from ...errors import NOTIFY_OP_FIX
from ..names import REQUIRED, missing_keyword
from .types import WaitCmp

_current = context.current  # the hot operations look it up once


def world_size():
    """Return the number of ranks (host orchestrator only), a ``Scalar(INT64)``."""
    return context.current().world_size()


def get_comm_ctx(dist_tensor):
    """Return the communication context of a window-bound tensor: its comm domain.

    A window buffer's comm domain is the set of ranks the host orchestrator dispatched its windows to
    (``device=r``); ``rank`` / ``nranks`` of the context, and the peers of every RMA and signal operation
    on the window, are group ranks of that domain (world rank ``ranks[g]`` is group rank ``g``).
    """
    return context.current().get_comm_ctx(dist_tensor)


def rank(ctx):
    """Return this rank's index in ``ctx``'s comm domain (kernels only), a ``Scalar(INT32)``."""
    return context.current().comm_rank(ctx)


def nranks(ctx):
    """Return the number of ranks in ``ctx``'s comm domain (kernels only), a ``Scalar(INT32)``."""
    return context.current().comm_nranks(ctx)


def notify(target, peer, offsets, value, *, op=REQUIRED):
    """On group rank ``peer``'s copy of signal window ``target``, add ``value`` to (or set) cell ``offsets``.

    ``op`` (a ``pld.NotifyOp``) has no default, as upstream's: leaving it out names what to pass."""
    if op is REQUIRED:
        raise missing_keyword("pld.system.notify", "op", "pld.NotifyOp.AtomicAdd (add value to the cell) or "
                              "pld.NotifyOp.Set (overwrite the cell)", NOTIFY_OP_FIX)
    _current().notify(target, peer, offsets, value, op)


def wait(signal, offsets, expected, *, cmp=WaitCmp.Ge):
    """Block until this rank's cell ``offsets`` of ``signal`` is ``== expected`` (Eq) or ``>= expected`` (Ge)."""
    _current().wait(signal, offsets, expected, cmp)


def defer_wait(signal, offsets, expected, *, cmp=WaitCmp.Ge):
    """Keep the running task incomplete until the cell reaches ``expected`` (checked at task end)."""
    context.current().memory_op("pld.system.defer_wait", signal, offsets, expected, cmp)


def fence():
    """Order this rank's earlier remote writes before its later ones (always true here)."""


def async_session(*, sync_id: int = 0, block_bytes: int = 0):
    """Build the ``pl.AsyncSession`` that ``pld.tensor.put_async`` issues on (inside a kernel; one per kernel).

    ``sync_id``: the SDMA sync flag, 0-7; ``block_bytes``: the SDMA chunk size, 0 for the 1 MiB default.
    """
    return context.current().memory_op("pld.system.async_session", sync_id, block_bytes)


def wait_async_event(event, session):
    """Block until the ``pld.tensor.put_async`` transfer ``event`` (on ``session``) is complete; ``Scalar(BOOL)``.

    A notify that tells a peer the data arrived must come after this wait, not after the put_async.
    """
    return context.current().memory_op("pld.system.wait_async_event", event, session)
