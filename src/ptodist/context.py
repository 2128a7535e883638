"""The current execution context: plain Python, a host being planned, or a rank.

``pl``/``pld`` operations are thin: they look up the context of the calling
thread and let it give the operation its meaning (the planner records, a rank
executes).  The base class is plain Python, where every distributed operation
fails with a message saying where it belongs.  What a context's ``region()``
returns, :class:`RegionResult`, lives here so that every context (plain
Python, the planner, a rank) makes one without importing the language.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

from .errors import ProgramError
from .source import user_location, where

_local = threading.local()

_KERNEL = "inside a kernel (a @pl.jit.incore function) running on a rank"
_HOST = "inside the host orchestrator (a @pl.jit.host function)"


class RegionResult:
    """The task id of a submitted region and, when it ran at once, the names it assigned."""

    __slots__ = ("tid", "values", "where")

    def __init__(self, tid, values: dict | None, where: str = ""):
        self.tid = tid
        self.values = values or {}
        self.where = where

    def later(self, name: str) -> Later:
        return Later(name, self.where)


class Later:
    """A name a region assigns, read after a region that runs later (on a chip, or after its deps): no value here."""

    def __init__(self, name: str, where: str):
        self.name, self.where = name, where

    def _refuse(self, *_args, **_kwargs):
        raise ProgramError(
            f"'{self.name}' is assigned inside the region at {self.where or '?'}, which runs later (on a chip, or "
            "once its deps= are complete), so it has no value where it is read. Pass results out through tensors "
            "the region writes (pl.Out parameters, slice assignment), not through names.")

    __getattr__ = __getitem__ = __call__ = __iter__ = __index__ = __bool__ = __add__ = __radd__ = _refuse

    def __repr__(self) -> str:
        return f"<'{self.name}': assigned by the region at {self.where}, which runs later>"


class Context:
    """Plain Python: no program is running on this thread."""

    kind = "python"
    where_text = "outside a program"
    checking = False  # True in a rank under `ptodist check`: it notes what only the checker reports

    def padding_read(self, op: str, tile, axis: int) -> None:
        """Note that ``op`` reads ``tile``'s padding along ``axis`` on a device; only a checked rank reports it."""
    advice = "Call the host orchestrator (or a compiled program) and let ptodist run it."

    def unavailable(self, op: str, where_ok: str):
        loc = user_location(2)
        raise ProgramError(f"{op} called {self.where_text}{where(loc)}: it is only available {where_ok}. "
                           f"{self.advice}")

    # Host-level operations.
    def world_size(self):
        self.unavailable("pld.world_size()", _HOST)

    def alloc_window_buffer(self, size_or_shape, dtype):
        self.unavailable("pld.alloc_window_buffer()", _HOST)

    def window(self, buf, shape, dtype):
        self.unavailable("pld.window()", _HOST)

    def collective(self, name, args, kwargs):
        self.unavailable(f"pld.tensor.{name}()", f"{_HOST} or {_KERNEL}")

    # Rank-level operations.
    def call_function(self, fn, args, kwargs, device):
        self.unavailable(f"{fn.name}()", _HOST)

    def submit(self, fn, args, kwargs, deps, blocks=0, dumps=()):
        self.unavailable("pl.submit()", "inside a per-device orchestration function")

    # Regions (pl.at / pl.spmd blocks) and task scopes. Plain Python runs a region's block as it stands.
    def region(self, region, body, args):
        return RegionResult(None, body(*args))

    def region_begin(self, region):
        return None

    def region_end(self, region, tid, failed: bool) -> None:
        pass

    def scope_begin(self, manual: bool) -> None:
        pass

    def scope_end(self, manual: bool) -> None:
        pass

    def exclude_from_deps(self, tensor) -> None:
        pass

    def dump_tag(self, tensor) -> None:
        pass  # only a rank's tasks are dumped

    def spmd(self, n):
        self.unavailable("pl.spmd()", "inside a per-device orchestration function")

    def block_idx(self):
        self.unavailable("pl.get_block_idx()", _KERNEL)

    def block_num(self):
        self.unavailable("pl.get_block_num()", _KERNEL)

    def get_comm_ctx(self, tensor):
        self.unavailable("pld.get_comm_ctx()", _KERNEL)

    def comm_rank(self, comm):
        self.unavailable("pld.rank()", _KERNEL)

    def comm_nranks(self, comm):
        self.unavailable("pld.nranks()", _KERNEL)

    def memory_op(self, name, *args, **kwargs):
        self.unavailable(f"{name}()", _KERNEL)

    # The signal and RMA operations: a rank gives each its own method (they are the hot path); elsewhere they
    # are memory operations like the others.
    def notify(self, target, peer, offsets, value, notify_op):
        return self.memory_op("pld.system.notify", target, peer, offsets, value, notify_op)

    def wait(self, signal, offsets, expected, cmp):
        return self.memory_op("pld.system.wait", signal, offsets, expected, cmp)

    def remote_load(self, target, peer, offsets, shape, valid_shape=None):
        return self.memory_op("pld.tile.remote_load", target, peer, offsets, shape, valid_shape)

    def remote_store(self, tile, target, peer, offsets, atomic, op="pld.tile.remote_store"):
        return self.memory_op(op, tile, target, peer, offsets, atomic)

    def put(self, dst, peer, src, *transfer):
        # transfer: the seven arguments of a put, then the op's name when it is not pld.tensor.put
        return self.memory_op(transfer[7] if len(transfer) > 7 else "pld.tensor.put", dst, peer, src, *transfer[:7])

    def get(self, dst, peer, src, *transfer):
        return self.memory_op(transfer[7] if len(transfer) > 7 else "pld.tensor.get", dst, peer, src, *transfer[:7])


_PYTHON = Context()


# current() -> Context: the context of the calling thread. Every pl/pld operation calls it first; as a partial
# of the builtin getattr it runs without a Python frame of its own.
current = functools.partial(getattr, _local, "ctx", _PYTHON)


@contextmanager
def using(ctx: Context):
    """Make ``ctx`` current for the calling thread while the block runs."""
    prev = getattr(_local, "ctx", _PYTHON)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = prev
