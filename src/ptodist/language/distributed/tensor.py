"""``pld.tensor.*``: window buffers and tensor-level point-to-point transfers."""

from __future__ import annotations

from ... import context
from .types import AtomicType


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
    context.current().memory_op("pld.tensor.put", dst, peer, src, dst_offsets, src_offsets, shape, atomic,
                                chunk_rows, chunk_cols, pipeline)


def get(dst, peer, src, dst_offsets=None, src_offsets=None, shape=None, *, atomic=AtomicType.None_,
        chunk_rows=0, chunk_cols=0, pipeline=False):
    """Read rank ``peer``'s window ``src`` into local ``dst`` (whole slice, or the given region)."""
    context.current().memory_op("pld.tensor.get", dst, peer, src, dst_offsets, src_offsets, shape, atomic,
                                chunk_rows, chunk_cols, pipeline)


def remote_store(src, target, peer, offsets, *, atomic=AtomicType.None_):
    """Write a local tensor or tile into rank ``peer``'s window at ``offsets``."""
    context.current().memory_op("pld.tensor.remote_store", src, target, peer, list(offsets), atomic)
