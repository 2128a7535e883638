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


# The collectives (pld.tensor.barrier, allreduce, broadcast, ...) are built from the primitives above, one module
# each under ptodist/collectives/: registering one installs its entry point here.  Called in a kernel they run at
# once on the calling rank; called in the host orchestrator they become a builtin task on every rank.
