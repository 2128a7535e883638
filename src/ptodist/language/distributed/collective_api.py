"""``pld.all_reduce``, ``pld.all_gather``, ``pld.broadcast``, ...: host collectives whose signals are managed.

Each call (host orchestrator only, but ``barrier``) allocates a fresh INT32 signal window of the shape its ``pld.tensor.*``
collective needs and calls that collective, so what runs on the ranks, and what traces, the checker and
hang reports see, is exactly that ``pld.tensor.*`` call.  Two take no new window: ``all_reduce`` in mesh
mode uses the signal the host synthesises for a ``pld.tensor.allreduce`` without one, and ``barrier``
takes the caller's signal (a barrier has no data window whose ranks a fresh signal could follow).
"""

from __future__ import annotations

from ... import context
from ...errors import ProgramError, ProgramValueError, SignalLayoutError
from ...source import user_location
from .. import dtypes as dt
from . import tensor as _tensor
from .types import ReduceOp

__all__ = ["all_gather", "all_reduce", "all_to_all", "all_to_all_v", "barrier", "broadcast", "reduce_scatter"]


def _host_only(op: str, spelled: str) -> None:
    """Refuse a call outside the host orchestrator: only the host allocates the signal window."""
    if context.current().kind == "planning":
        return
    raise ProgramError(f"pld.{op} at {user_location(3)}: is called outside the host orchestrator; it allocates its "
                       "signal window, which only the host orchestrator (@pl.jit.host) can do. Call it there, or "
                       f"inside a kernel call {spelled} with a signal window the host passes in.")


def _static_positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _fresh_signal(op: str, shape: list):
    """A new zero-filled INT32 signal window of ``shape``, named after the op and the user's line."""
    loc = user_location(3)
    buf = _tensor.alloc_window_buffer(shape, dtype=dt.INT32, name=f"{op}_signal@{loc.short if loc else '?'}")
    return _tensor.window(buf, shape, dtype=dt.INT32)


def all_reduce(target, *, op: ReduceOp = ReduceOp.Sum, mode: str = "mesh", nranks: int | None = None):
    """Every rank's ``target`` becomes the reduction (``op``) of all ranks' ``target``; returns ``target``.

    ``mode="mesh"``: the host synthesises the signal (``nranks`` must be omitted).  ``mode="ring"``: a fresh
    ``[2*(nranks-1)+1, nranks]`` signal; ``nranks`` (the rank count, a positive int) is required, and the
    ring supports ``ReduceOp.Sum`` on FP32 only.
    """
    _host_only("all_reduce", "pld.tensor.allreduce(target, signal, ...)")
    loc = user_location(2)
    if mode not in ("mesh", "ring"):
        raise ProgramValueError(f"pld.all_reduce at {loc}: mode must be \"mesh\" or \"ring\", got {mode!r}.")
    if mode == "mesh":
        if nranks is not None:
            raise ProgramValueError(f"pld.all_reduce at {loc}: nranks is only used with mode='ring'; omit it for "
                                    "a mesh allreduce (or pass mode='ring').")
        return _tensor.allreduce(target, op=op)
    if not _static_positive(nranks):
        raise ProgramValueError(f"pld.all_reduce(mode='ring') at {loc}: needs nranks, the rank count as a positive "
                                f"int (the ring signal is [2*(nranks-1)+1, nranks]), got {nranks!r}.")
    if op is not ReduceOp.Sum:
        raise ProgramValueError(f"pld.all_reduce(mode='ring') at {loc}: supports only op=pld.ReduceOp.Sum, got "
                                f"{op!r}. Use mode='mesh' for {getattr(op, 'name', op)}.")
    dtype = getattr(target, "dtype", None)
    if isinstance(dtype, dt.DataType) and dtype is not dt.FP32:
        raise ProgramValueError(f"pld.all_reduce(mode='ring') at {loc}: supports only FP32 targets, got "
                                f"{dtype.name}. Use mode='mesh' for {dtype.name}.")
    signal = _fresh_signal("all_reduce_ring", [2 * (nranks - 1) + 1, nranks])
    try:
        return _tensor.allreduce(target, signal, op=op, mode="ring")
    except SignalLayoutError:  # the signal is ours: only nranks can be wrong
        raise _wrong_nranks("all_reduce(mode='ring')", nranks, loc) from None


def all_gather(local_data, target):
    """``target[src]`` becomes rank ``src``'s ``local_data`` ``[1, SIZE]`` on every rank; returns ``target``."""
    _host_only("all_gather", "pld.tensor.allgather(local_data, target, signal)")
    signal = _fresh_signal("all_gather", [_tensor_world(), 1])
    return _tensor.allgather(local_data, target, signal)


def reduce_scatter(target, *, op: ReduceOp = ReduceOp.Sum):
    """``target`` ``[NR, SIZE]`` holds one chunk per rank; rank r ends with the sum of every rank's row r in
    row r; returns ``target``.  Sum only."""
    _host_only("reduce_scatter", "pld.tensor.reduce_scatter(target, signal)")
    if op is not ReduceOp.Sum:
        raise ProgramValueError(f"pld.reduce_scatter at {user_location(2)}: supports only op=pld.ReduceOp.Sum, got "
                                f"{op!r}. Reduce with pld.tensor.reduce_scatter inside a kernel for other ops.")
    signal = _fresh_signal("reduce_scatter", [_tensor_world()])
    return _tensor.reduce_scatter(target, signal, op=op)


def broadcast(target, *, root: int):
    """Every rank's ``target`` becomes rank ``root``'s (root stages it before the call); returns ``target``."""
    _host_only("broadcast", "pld.tensor.broadcast(target, signal, root=...)")
    signal = _fresh_signal("broadcast", [_tensor_world()])
    return _tensor.broadcast(target, signal, root=root)


def barrier(signal):
    """All ranks arrive before any leaves, on the caller's INT32 ``signal`` window; returns ``signal``.

    It allocates nothing, so a kernel may call it too (it is ``pld.tensor.barrier(signal)`` there as well).
    """
    return _tensor.barrier(signal)


def all_to_all(input, target):
    """``target[src]`` on rank r becomes ``input[r]`` on rank ``src`` (``[NR, SIZE]`` each); returns ``target``."""
    _host_only("all_to_all", "pld.tensor.all_to_all(input, target, signal)")
    signal = _fresh_signal("all_to_all", [_tensor_world(), 1])
    return _tensor.all_to_all(input, target, signal)


def all_to_all_v(input, target, send_counts, recv_counts, *, nranks: int):
    """Variable-size all_to_all over ``[nranks*MAX_RECV, SIZE]`` buffers: ``send_counts[p]`` leading rows of
    block p go to rank p, ``recv_counts`` (INT32 ``[NR, 1]`` window) receives the counts; returns ``target``.

    ``nranks``: the rank count, a positive int (it sizes the ``[nranks, 1]`` signal).
    """
    _host_only("all_to_all_v", "pld.tensor.all_to_all_v(input, target, signal, send_counts, recv_counts)")
    if not _static_positive(nranks):
        raise ProgramValueError(f"pld.all_to_all_v at {user_location(2)}: needs nranks, the rank count as a positive "
                                f"int (it sizes the [nranks, 1] signal and MAX_RECV = target rows // nranks), got "
                                f"{nranks!r}.")
    signal = _fresh_signal("all_to_all_v", [nranks, 1])
    try:
        return _tensor.all_to_all_v(input, target, signal, send_counts, recv_counts)
    except SignalLayoutError:  # the signal is ours: only nranks can be wrong
        raise _wrong_nranks("all_to_all_v", nranks, user_location(2)) from None


def _wrong_nranks(op: str, nranks: int, loc) -> SignalLayoutError:
    return SignalLayoutError(f"pld.{op} at {loc}: nranks={nranks} is not the number of ranks the collective runs "
                             "over (the ranks its target window is dispatched to; all of them unless the host "
                             "dispatched it to fewer). Pass that rank count, e.g. nranks=NR for the NR of "
                             "DistributedConfig(device_ids=...).")


def _tensor_world() -> int:
    return context.current().world_size().value
