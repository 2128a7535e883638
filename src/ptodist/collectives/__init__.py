"""Collectives, written against the same notify/wait/RMA primitives users have.

``run`` executes a checked call (``spec.Call``) on the calling rank; the host
orchestrator's builtin calls take the direct (reduce-scatter/allgather)
allreduce, kernels the tutorial's mesh.
"""

from __future__ import annotations

from . import allreduce, common, movement
from .spec import Call, slot_shape


def run(call: Call, me: int, n: int, host: bool):
    """Run ``call`` on rank ``me`` of ``n``; return the rebound target."""
    name = call.name
    if name == "barrier":
        common.barrier(call.signal, me, n)
        return call.signal
    if name == "allreduce":
        if call.mode == "ring":
            allreduce.ring(call.target, call.signal, call.op, me, n)
        elif host:
            allreduce.direct(call.target, call.signal, call.op, me, n, call.core_num, call.cache)
        else:
            allreduce.mesh(call.target, call.signal, call.op, me, n)
    elif name == "reduce_scatter":
        allreduce.reduce_scatter(call.target, call.signal, call.op, me, n)
    elif name == "broadcast":
        movement.broadcast(call.target, call.signal, call.root, me, n, call.cache)
    elif name == "allgather":
        movement.allgather(call.source, call.target, call.signal, slot_shape(call, n), me, n, call.cache)
    elif name == "all_to_all":
        movement.all_to_all(call.source, call.target, call.signal, me, n)
    elif name == "all_to_all_v":
        movement.all_to_all_v(call.source, call.target, call.signal, call.counts["send_counts"],
                              call.counts["recv_counts"], me, n, call.where)
    return call.target
