"""``pld.tensor.*``: window buffers and tensor-level point-to-point transfers."""

from __future__ import annotations

from ... import context
from .types import AtomicType, atomic_type

_current = context.current  # the hot operations look it up once


def alloc_window_buffer(size_or_shape, dtype=None, *, name: str = ""):
    """Reserve a symmetric, zero-filled buffer on every rank (host only).

    ``alloc_window_buffer(nbytes)`` takes a size in **bytes**;
    ``alloc_window_buffer(shape, dtype=pl.FP32)`` computes it from a shape.
    """
    return context.current().alloc_window_buffer(size_or_shape, dtype, name)


def window(buf, shape, *, dtype):
    """Return a typed view (a DistributedTensor) of a window buffer."""
    return context.current().window(buf, list(shape), dtype)


def put(dst, peer, src, dst_offsets=None, src_offsets=None, shape=None, *, atomic=AtomicType.None_,
        chunk_rows=0, chunk_cols=0, pipeline=False):
    """Write local ``src`` into rank ``peer``'s window ``dst`` (whole slice, or the given region)."""
    if atomic is not AtomicType.None_:
        atomic = atomic_type(atomic, "pld.tensor.put")
    _current().put(dst, peer, src, dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline)


def get(dst, peer, src, dst_offsets=None, src_offsets=None, shape=None, *, atomic=AtomicType.None_,
        chunk_rows=0, chunk_cols=0, pipeline=False):
    """Read rank ``peer``'s window ``src`` into local ``dst`` (whole slice, or the given region)."""
    if atomic is not AtomicType.None_:
        atomic = atomic_type(atomic, "pld.tensor.get")
    _current().get(dst, peer, src, dst_offsets, src_offsets, shape, atomic, chunk_rows, chunk_cols, pipeline)


def put_async(dst, peer, src, session, dst_offsets=None, src_offsets=None, shape=None):
    """Start writing local ``src`` into rank ``peer``'s window ``dst`` on ``session``; return its ``pl.AsyncEvent``.

    The transfer is complete only at ``pld.system.wait_async_event(event, session)`` (before the kernel ends);
    what moves is logically 1-D (every dimension but one of size 1); there is no atomic form.
    """
    return _current().memory_op("pld.tensor.put_async", dst, peer, src, session, dst_offsets, src_offsets, shape)


def remote_store(src, target, peer, offsets, *, atomic=AtomicType.None_):
    """Write a local tensor or tile into rank ``peer``'s window at ``offsets``."""
    if atomic is not AtomicType.None_:
        atomic = atomic_type(atomic, "pld.tensor.remote_store")
    _current().remote_store(src, target, peer, offsets, atomic, "pld.tensor.remote_store")


# -- collectives: built from the primitives above (see ptodist/collectives/) -------------------
# Called in a kernel they run at once on the calling rank; called in the host orchestrator
# they become a builtin task on every rank.  Each returns the rebound target.

def barrier(signal):
    """All ranks arrive before any leaves; self-clearing (the same signal may be reused)."""
    return context.current().collective("barrier", (signal,), {})


def allreduce(target, signal=None, *, op=None, mode: str = "mesh", core_num: int = 1):
    """Every rank ends with the reduction (``op``, default Sum) of all ranks' ``target``.

    ``mode="mesh"``: signal ``[NR, 1]`` (or ``[NR]``); with ``core_num`` > 1 (host orchestrator only)
    ``[NR, stride]`` with ``stride >= core_num``, lane b using column b.  ``mode="ring"``: any target
    length (balanced segments, 32-byte aligned for 2-byte dtypes); signal ``[2*(NR-1), NR]``, and from
    the host orchestrator also ``[2*(NR-1)+1, NR]`` (a last row for the return barrier).
    """
    return context.current().collective("allreduce", (target, signal), {"op": op, "mode": mode,
                                                                        "core_num": core_num})


def broadcast(target, signal, *, root):
    """Every rank ends with rank ``root``'s ``target``; ``root`` is a Python int."""
    return context.current().collective("broadcast", (target, signal), {"root": root})


def allgather(local_data, target, signal):
    """``target[src]`` becomes rank ``src``'s ``local_data`` on every rank."""
    return context.current().collective("allgather", (local_data, target, signal), {})


def reduce_scatter(target, signal, *, op=None):
    """``target`` holds one chunk per rank (row j for rank j); rank r ends with the sum of chunk r in row r."""
    return context.current().collective("reduce_scatter", (target, signal), {"op": op})


def all_to_all(input, target, signal):
    """``target[src]`` on rank r becomes ``input[r]`` on rank src.

    ``input``: a window, or inside a kernel also a plain ``pl.Tensor``; ``target`` a separate window.
    """
    return context.current().collective("all_to_all", (input, target, signal), {})


def all_to_all_v(input, target, signal, send_counts, recv_counts):
    """Variable-size all_to_all: ``send_counts[p]`` leading rows of ``input[p]`` go to rank p.

    ``send_counts``: a ``[NR, 1]`` or ``[NR]`` integer tensor or window, a list of ints or integer
    Scalars, or ``[NR, NR]`` (row r for rank r).  ``recv_counts``: an INT32 ``[NR, 1]`` window receives
    the counts (sender p's count lands in cell ``[p, 0]``); given in any other form it is what this
    rank expects, and a peer that sends another count is an error naming both ranks and counts.
    """
    return context.current().collective("all_to_all_v", (input, target, signal),
                                        {"send_counts": send_counts, "recv_counts": recv_counts})
