"""``ShmBackend``: a DistributedWorker's rank group, started once; a one-shot call's group, forked over
one mapping its ranks inherit (host tensors and window heaps), and kept for the program's next call.
"""

from __future__ import annotations

import mmap

import numpy as np

from ...compiler.plan import DispatchPlan
from ...dfx import finish_run
from ...language import dtypes as dt
from ...language.types import Direction
from .. import resources
from ..base import STOP_WRITE_S, Command, HostView, SharedHeap, note_where
from .group import RankGroup
from .kept import _KEPT, ONE_SHOT_TOKEN, _KeptGroup
from .memory import ALIGN, _align
from .watch import POLL_S


class ShmBackend:
    """Runs a plan with one forked process per rank."""

    name = "shm"

    def start(self, device_ids: list, objects: dict, startup_timeout_s: float) -> RankGroup:
        """Fork a DistributedWorker's rank processes; raise RankError (nothing left running) if one fails to start."""
        group = RankGroup(device_ids, objects, startup_timeout_s)
        try:
            group.start()
        except BaseException:
            group.close()
            raise
        return group

    def run(self, plan: DispatchPlan, host_arrays: list, config, dfx=None, *, owner=None, stamp=None,
            scalars: tuple = ()) -> None:
        """A one-shot call: a rank group forked with its command already published, or, for ``owner``, reused.

        The host tensors and the window heaps lie in one anonymous shared mapping made before the
        fork, so the ranks inherit it (no descriptor travels); the host tensors are copied in, and the
        outputs out once every rank succeeded.  Forking a torch-sized driver costs tens of
        milliseconds, so with ``owner`` (the CompiledProgram making the call) the group and its
        mapping are kept for that owner's next call (``_KEPT``): closed after an error or an
        interrupt, after ``KEPT_IDLE_S`` idle, when the owner is collected, and at exit.  ``stamp`` is the
        owner's program state now (``compiler.state``): kept ranks were forked with the state of their
        first call, so a call whose stamp differs forks afresh, and its ranks see the driver's state as
        it is (what the ranks' code changes is refused by every rank itself).
        """
        host_bytes = sum(a.nbytes for a in host_arrays if a is not None)
        resources.check_windows(plan.program, plan.windows, plan.world, host_bytes)
        offsets, off = [], 0
        for a in host_arrays:
            offsets.append(off if a is not None else None)
            off = _align(off + (a.nbytes if a is not None else 0))
        stride = _align(max(plan.window_heap_bytes, ALIGN))
        total = off + stride * plan.world
        kept = _KEPT.take(owner, plan.device_ids, total, stamp) if owner is not None else None
        if kept is not None and not kept.accepts(plan):
            kept.close()  # a plan of functions its ranks were forked without: fork again
            kept = None
        if kept is None:
            try:
                mm = mmap.mmap(-1, total)
            except OSError as e:
                raise resources.no_memory(plan.program, plan.windows, plan.world, total, e) from None
            kept = _KeptGroup.fork_for(plan, mm, stamp) if owner is not None else None
        else:
            kept.memory[off:total] = 0  # the window heaps start zeroed, as in a fresh mapping
        if kept is None:  # no owner, or a plan the ranks cannot be sent by value: a group used once
            memory = np.frombuffer(mm, dtype=np.uint8)
            try:
                group = RankGroup(plan.device_ids, {id(plan): plan}, 0.0, owner=plan.program,
                                  inherited={ONE_SHOT_TOKEN: memory}, once=True)
                self._run_on(group, None, plan, host_arrays, config, dfx, memory, offsets, off, stride, scalars)
            finally:
                del memory
                try:
                    mm.close()
                except BufferError:
                    pass  # a view is still referenced (e.g. by a traceback); the GC unmaps it later
            return
        try:
            self._run_on(kept.group, kept, plan, host_arrays, config, dfx, kept.memory, offsets, off, stride,
                         scalars)
        except BaseException:
            kept.close()
            raise
        _KEPT.give(owner, kept)

    @staticmethod
    def _run_on(group: RankGroup, kept: _KeptGroup | None, plan, host_arrays, config, dfx, memory, offsets,
                heap_at, stride, scalars: tuple = ()) -> None:
        """Run ``plan`` on ``group`` (forked now when it has no ranks yet); close it unless ``kept``."""
        hosts, views = [], []
        inputs = {spec.index for spec in plan.host_tensors if spec.direction is Direction.IN}
        for i, (a, off) in enumerate(zip(host_arrays, offsets)):
            if a is None:
                hosts.append(None)
                views.append(None)
                continue
            view = memory[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
            view[...] = a
            views.append(view)
            writable = i not in inputs
            hosts.append(HostView(a.shape, dt.from_numpy(a.dtype).name, writable, ONE_SHOT_TOKEN, off,
                                  view.strides))
        heap = SharedHeap(ONE_SHOT_TOKEN, stride, memory, heap_at)
        if kept is None:
            number, plan_id, blob, forget = 0, 0, group.encode_plan((plan, [])), False
        else:
            number, plan_id, blob, forget = kept.prepare(plan)
        command = Command(number, plan_id, plan, [], 0, hosts, heap, dfx, config.resolved_hang_timeout(),
                          blob=blob, forget_plans=forget, scalars=scalars)
        watch = None
        try:
            watch = group.submit(command) if group.pids else group.start(first=command)
            try:
                while not watch.poll(POLL_S):
                    pass
            except BaseException as e:  # Ctrl-C, SIGTERM (the CLI's): stop the ranks, letting them write DFX records
                note_where(e, watch.interrupt(STOP_WRITE_S if dfx is not None else 0.0))
                raise
        finally:
            if kept is None:
                group.close()
            if dfx is not None:
                finish_run(dfx, plan.world, plan.device_ids, error=watch.error if watch is not None else None)
        if watch.error is not None:
            raise watch.error
        for spec in plan.host_tensors:
            if spec.direction is not Direction.IN:
                host_arrays[spec.index][...] = views[spec.index]
