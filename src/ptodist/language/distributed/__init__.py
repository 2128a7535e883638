"""``import ptodist.language.distributed as pld``: symmetric windows, signals, RMA.

Everything is reachable by its full three-part name (``pld.system.notify``,
``pld.tile.remote_load``, ``pld.tensor.put``); the most common calls also
have a short form here; ``pld.all_reduce`` and the other top-level collectives are the host
orchestrator's forms that allocate their own signal windows (``collective_api``).
"""

from __future__ import annotations

import sys as _sys

from .. import names as _names
from . import system, tensor, tile
from .collective_api import (
    all_gather,
    all_reduce,
    all_to_all,
    all_to_all_v,
    barrier,
    broadcast,
    reduce_scatter,
)
from .system import get_comm_ctx, nranks, rank, world_size
from .tensor import alloc_window_buffer, window
from .tile import remote_load, remote_store
from .types import AtomicType, CommCtx, CommCtxType, DistributedTensor, NotifyOp, ReduceOp, WaitCmp

__all__ = [
    "AtomicType", "CommCtx", "CommCtxType", "DistributedTensor", "NotifyOp", "ReduceOp", "WaitCmp",
    "all_gather", "all_reduce", "all_to_all", "all_to_all_v", "alloc_window_buffer", "barrier", "broadcast",
    "reduce_scatter", "get_comm_ctx", "nranks", "rank", "remote_load", "remote_store", "system",
    "tensor", "tile", "window", "world_size",
]

# A name pld lacks (pld.notify) is an AttributeError that names where it is (pld.system.notify).
_names.install(_sys.modules[__name__], "pld")
for _space in (system, tensor, tile):
    _names.install(_space, f"pld.{_space.__name__.rsplit('.', 1)[1]}")
