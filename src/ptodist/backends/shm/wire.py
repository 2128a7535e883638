"""How the driver and a group's ranks talk: the group's control mapping (``GroupLayout``: the doorbell,
the counters, per-rank words, the command frame, the failure reports) and what travels in it: a command
(``_Wire``, pickled into the frame, or in a shared file when too large) and plans, whose functions travel
by reference (``PlanPickler``).
"""

from __future__ import annotations

import os
import pickle
from typing import NamedTuple

from ...language.regions import reduce_region
from ...rank.status import StatusBoard
from .memory import WAKE_BYTES, _align

FRAME_BYTES = 1 << 20      # one command, pickled; a larger one travels as a shared file
# A frame starts with the payload's length and the dispatch's number; the payload (the rest of the command)
# is then byte-identical when a caller dispatches the same arguments again, and a rank reuses what it decoded.
FRAME_HEAD = 16
RESULT_BYTES = 256 << 10   # one rank's failure report, pickled
FDS_PER_MESSAGE = 200      # below the kernel's SCM_MAX_FD
# Waiting for a command or for the ranks to finish: spin a moment when every process has a core of its
# own (the next command, or the last rank, is often close).  The driver then sleeps on a futex: a waiting
# driver must not take a core from a rank.  An idle rank first polls with sched_yield() for a while
# (which hands the core to any runnable process, the driver included), because a caller dispatching in
# a loop sends the next command within that time and waking a sleeping rank costs tens of µs; then
# it sleeps.
CTL_SPIN_S = 20e-6
IDLE_YIELD_S = 250e-6
OK, CMD_FAILED, ABORTED = 0, 1, 2


class GroupLayout:
    """Byte offsets of a rank group's control mapping (every region 64-byte aligned)."""

    def __init__(self, world: int):
        self.world = world
        self.sleepers = 0          # waiters on window signal cells (ShmMemory)
        # Waiters on the words below, counted per side: a notifier makes the wake-up system call only when
        # the side it notifies sleeps (a rank's report must not pay for an idle rank's sleep, nor a
        # doorbell ring for the driver's).
        self.rank_sleepers = 64    # idle ranks, on the doorbell
        self.driver_sleepers = 128  # the driver, on finished and started
        self.doorbell = 192        # commands published
        self.finished = 256        # rank completions, over all commands
        self.started = 320         # ranks that came up
        self.abort = 384           # commands with an index below this are aborted
        self.zero = 448            # always 0: a sleepers word for atomics that must wake no one
        self.locks = 512
        self.up = _align(self.locks + 4 * world)
        self.done = _align(self.up + 4 * world)      # per rank: index + 1 of its last finished command
        self.result = _align(self.done + 4 * world)  # per rank: OK, CMD_FAILED or ABORTED
        self.wakes = _align(self.result + 4 * world)  # per rank: its wake slot (ShmMemory.wait_any)
        self.status = _align(self.wakes + WAKE_BYTES * world)
        self.frame = _align(self.status + StatusBoard.nbytes(world))
        self.results = _align(self.frame + FRAME_HEAD + FRAME_BYTES)
        self.total = self.results + RESULT_BYTES * world


class _Wire(NamedTuple):
    """A command as it travels to the ranks, pickled into the group's frame (as a plain tuple: cheaper).

    The dispatch's number (which its segments share) travels in the frame's head, beside the payload.
    """

    plan_id: int
    blob: bytes | None         # the plan, pickled by reference, the first time the ranks see it
    segment: int
    hosts: list                # HostView.key (token, offset, shape, strides, dtype, writable) or None
    heap: tuple | None         # (token, stride, base) of the window arena
    maps: list                 # (token, size) of the files whose descriptors follow on the socket
    drops: list                # tokens of memory to unmap
    dfx: object
    forget_plans: bool
    scalars: bytes             # the dispatch's scalar arguments, pickled: the frame is sent again when their bits
    #                            differ (-0.0 == 0.0, but not as bytes)


class PlanPickler(pickle.Pickler):
    """Pickles plans for ranks forked earlier: program functions travel as references into ``objects``.

    A rank is a fork of the driver made when the worker started, so every function of the
    worker's programs (closures of program factories included) exists in it at the same id.
    """

    def __init__(self, file, objects: dict, strict: bool = False):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.objects = objects
        self.strict = strict  # refuse a Function the ranks lack (instead of pickling it by value)

    def persistent_id(self, obj):
        from ...language.functions import Function

        if obj is not None and self.objects.get(id(obj)) is obj and not isinstance(obj, Function):
            return ("object", id(obj), 0)  # e.g. a one-shot call's whole plan, made before its ranks forked
        if isinstance(obj, Function):
            known = self.objects.get(id(obj.fn))
            bound = obj.bound_self
            if getattr(known, "fn", None) is obj.fn and (bound is None or self.objects.get(id(bound)) is bound):
                return ("function", id(obj.fn), id(bound) if bound is not None else 0)
            if self.strict and reduce_region(obj.fn) is None:  # a region's chip task travels by value
                raise _NotInRanks(obj.name)
        return None

    def reducer_override(self, obj):
        # a `with pl.at(level=CHIP)` block the host outlined while planning: made after the ranks forked
        return reduce_region(obj) or NotImplemented


class _NotInRanks(Exception):
    """A plan refers to a function the group's ranks were forked without."""


class _PlanUnpickler(pickle.Unpickler):
    def __init__(self, file, objects: dict, cache: dict):
        super().__init__(file)
        self.objects = objects
        self.cache = cache

    def persistent_load(self, pid):
        from ...language.functions import Function

        kind, fn_id, self_id = pid
        if kind == "object":
            return self.objects[fn_id]
        f = self.cache.get((fn_id, self_id))
        if f is None:
            base = self.objects[fn_id]
            bound = self.objects[self_id] if self_id else None
            f = self.cache[(fn_id, self_id)] = Function(base.fn, base.kind, bound, base.options, base.scope)
        return f


class _SharedBytes:
    """Bytes in a shared file (a command too large for the frame)."""

    def __init__(self, data: bytes):
        self.fd = os.memfd_create("ptodist-command", os.MFD_CLOEXEC)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def close(self) -> None:
        os.close(self.fd)
