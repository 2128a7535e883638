"""A rank's tasks as its orchestration submits them: ``pl.submit``, ``pl.at`` / ``pl.spmd`` regions, scopes, block
indices, dumps, and, under ``ptodist check``, the happens-before actors of tasks, blocks and a mixed kernel's halves.

The task graph itself (when a task may run) is ``rank/tasks.py``'s; this is what hands tasks to it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from ..errors import ProgramError, ProgramTypeError
from ..language import dtypes as dt
from ..language.functions import Function, Kind
from ..language.regions import RegionResult
from ..language.scalar import Scalar
from ..language.types import Direction
from ..source import user_location
from .tasks import OverlapIndex, Task, buffer_key, overlap
from .tensors import RankTensor


@dataclass
class TaskState:
    """What a rank keeps of the tasks its orchestration submits (the graph itself is ``RankContext.graph``)."""

    hb_tasks: OverlapIndex | None  # under the checker: every task since the last wait for all, by its bytes
    started: int = 0  # the task ids handed out
    manual: int = 0  # depth of pl.manual_scope blocks
    no_dep: set[int] = field(default_factory=set)  # ids of the arguments pl.no_dep excluded from the next task
    left: list = field(default_factory=list)  # the deferred waits the last lazily run task left pending
    spmd_blocks: int = 0  # the block count pl.spmd / pl.spmd_submit gives the kernel calls in it
    region_blocks: int = 0  # the block count of the outlined pl.spmd region running (get_block_num)
    block_idx: int = 0
    dump_keys: set = field(default_factory=set)  # the memory pl.dump_tag marked for the selective dump
    # Under the checker, a rank's tasks are actors of the event log (rank/events.py): the actor of each task id,
    # and the actor each pending deferred wait belongs to (by its id).
    tid_actor: dict[int, int] = field(default_factory=dict)
    cond_actor: dict[int, int] = field(default_factory=dict)


class TaskCalls:
    """The task, region and happens-before calls of :class:`~ptodist.rank.context.RankContext` (a part of
    it, with its state in ``self._tasks``, a :class:`TaskState`)."""

    def _new_tid(self) -> int:
        tid = self._tasks.started
        self._tasks.started += 1
        return tid

    def _check_deps(self, op: str, deps) -> None:
        for d in deps:
            if not isinstance(d, int) or not 0 <= d < self._tasks.started:
                raise ProgramError(f"{op} at {user_location(2)}: deps= must hold task ids of earlier tasks (from "
                                   f"`with pl.at(...) as tid` or pl.submit), got {d!r}")

    @staticmethod
    def _tensors(values):
        for v in values:
            if isinstance(v, RankTensor):
                yield v
            elif isinstance(v, (list, tuple)):
                yield from TaskCalls._tensors(v)

    def _buffers(self, values) -> frozenset:
        return frozenset(buffer_key(t) for t in self._tensors(values) if id(t) not in self._tasks.no_dep)

    def _submit_task(self, tid: int, name: str, run, deps, values, where: object = "", holdable: bool = False,
                     site: object = None) -> bool:
        """Hand a task to the graph (it runs now unless it must wait); True when it ran at once.

        ``where``: the line that submitted it (the checker's reports name it as where a dependency belongs);
        ``holdable``: its result does not depend on running at once (a ``pl.submit``: its outputs are its result);
        ``site``: that line as ``(code, line)``, where ``where`` is not known (read only by a hang report).
        """
        task = Task(tid, name, run, list(deps), self._buffers(values), self._tasks.manual > 0)
        task.site = where or site
        task.holdable = holdable and task.manual
        self._tasks.no_dep.clear()
        if self.checking:
            task.run = self._as_actor(task, run, str(where))
        return self.graph.submit(task)

    def _as_actor(self, task: Task, run, where: str):
        """Under the checker: make ``task`` an actor of the event log, forked from the orchestration where it is
        submitted; ``run``, wrapped so that the task runs as that actor, starting after the tasks it depends on
        (its deps=, and outside a manual scope every earlier task that shares bytes with it, complete or not)."""
        events = self.events
        explicit = [self._tasks.tid_actor[d] for d in task.deps if d in self._tasks.tid_actor]
        after = list(explicit)
        if not task.manual and task.buffers:
            after += [t.actor for t in self._tasks.hb_tasks.overlapping(task.buffers, prune=True)]
        actor = task.actor = events.fork(kind="task", name=task.name, task_id=task.tid, where=where,
                                         deps=list(task.deps), manual=task.manual,
                                         dep_lines=[events.actors[a]["where"] for a in explicit])
        self._tasks.tid_actor[task.tid] = actor
        self._open_actors.append(actor)
        if task.buffers:
            self._tasks.hb_tasks.add(task)

        def run_as_actor():
            outer, events.actor = events.actor, actor
            try:
                events.join(after)
                left = run()
            finally:
                events.actor = outer
            for c in left:  # its deferred waits complete it: they are the task's, whenever they hold
                self._tasks.cond_actor[id(c)] = actor
            return left

        return run_as_actor

    # -- the checker's actors for a mixed kernel's halves (language/core_group.py, language/ops/pipes.py) -------
    def hb_halves(self, labels: list) -> tuple | None:
        """Under the checker: fork one actor per half of a mixed kernel (``labels``: AIC, AIV0, ...) from the
        running one; returns ``(running actor, [the halves' actors])``, None when not checking."""
        if not self.checking:
            return None
        events = self.events
        parent = events.actor
        info = events.actors[parent]
        where = info["where"] if info.get("kind") == "task" else str(user_location(2))
        return parent, [events.fork(kind="half", name=label, task_id=self._run.task_id, where=where)
                        for label in labels]

    def hb_act(self, actor: int) -> None:
        """What the rank records from now on is ``actor``'s (a half got the turn)."""
        self.events.actor = actor

    def hb_rejoin(self, parent: int, actors: list) -> None:
        """Back to ``parent``, after every one of ``actors`` (the halves of a finished mixed kernel)."""
        self.events.actor = parent
        self.events.join(actors)

    def hb_release(self):
        """Under the checker: a token for where the running actor is now (a pipe push, a barrier arrival)."""
        return self.events.release() if self.checking else None

    def hb_acquire(self, tokens: list) -> None:
        """Order the running actor after the points ``tokens`` mark (a pop after its push, after a barrier)."""
        self.events.acquire(tokens)

    def _await_overlapping(self, values) -> None:
        """The orchestration is about to touch ``values``: wait for the unfinished tasks that touch them; under
        the checker it goes on after every task since its last wait for all that touched them."""
        buffers = self._buffers(values)
        if not self.graph.idle:
            self.graph.wait_overlapping(buffers)
        if self._open_actors:
            tasks = self._tasks.hb_tasks.overlapping(buffers)
            if tasks:
                self.events.join([t.actor for t in tasks])
                for t in tasks:
                    t.joined = True  # ordered before all the orchestration does next: the index may drop it

    def _await_all(self) -> None:
        """The orchestration waits for every task it submitted (a collective, the end of the dispatch)."""
        if not self.graph.idle:
            self.graph.wait_for()
        if self._open_actors:
            self.events.join(self._open_actors)
            self._open_actors = []
            self._tasks.hb_tasks = OverlapIndex(keep_done=True)

    def submit(self, fn, args, kwargs, deps, blocks=0, dumps=()):
        op = "pl.spmd_submit" if blocks else "pl.submit"
        self._check_deps(op, deps)
        if not isinstance(fn, Function) or fn.kind is not Kind.KERNEL:
            raise ProgramTypeError(f"{op} at {user_location(2)}: the first argument must be a kernel "
                                   f"(@pl.jit.incore), got {fn!r}")
        if self._kernel_depth:
            raise ProgramError(f"{op} at {user_location(2)}: tasks are submitted by the orchestration, not from "
                               "inside a kernel; call the kernel directly here")
        tid, out = self._new_tid(), {}

        def run():
            saved, self._tasks.spmd_blocks = self._tasks.spmd_blocks, blocks
            try:
                out["result"] = self._run_kernel(fn, args, kwargs, deps, tid=tid, lazy=True, dumps=dumps)
            finally:
                self._tasks.spmd_blocks = saved
            return self._tasks.left

        # A task with one output at most may be held past its submission (sim): its result, the tensor it writes,
        # is the same whenever it runs; with more, what it returns when it runs at once may differ.
        holdable = sum(spec.kind == "tensor" and spec.direction is not Direction.IN for spec in fn.params) <= 1
        caller = sys._getframe(2)  # submit <- pl.submit <- the program: its line, for a hang report (no walk here)
        if self._submit_task(tid, fn.name, run, deps, _tracked(fn, args, kwargs),
                             user_location(2) if self.checking else "", holdable=holdable,
                             site=(caller.f_code, caller.f_lineno)):
            result = out["result"]
        else:  # it runs later: what it returns is its outputs, the tensors it was given to write
            outs = [v for spec, v in zip(fn.params, fn.bind_arguments(args, kwargs))
                    if spec.kind == "tensor" and spec.direction is not Direction.IN]
            result = None if not outs else outs[0] if len(outs) == 1 else tuple(outs)
        if isinstance(result, tuple):
            return (*result, tid)
        return result, tid

    # -- regions and scopes -------------------------------------------------------------
    def region(self, region, body, args):
        if self._kernel_depth:  # a region inside a task is part of that task
            return RegionResult(None, body(*args))
        level = getattr(region.level, "name", region.level)
        if level == "HOST":
            raise ProgramError(f"pl.at(level=pl.Level.HOST) at {user_location(2)}: a rank runs chip and core work; "
                               "the host level is the host orchestrator's (@pl.jit.host)")
        self._check_deps(f"pl.{region.kind}", region.deps)
        tid, out = self._new_tid(), {}
        where = user_location(2)
        name = region.name_hint or f"{self.task or 'region'}@{where.line if where is not None else '?'}"

        def run():
            saved, self._tasks.spmd_blocks = self._tasks.spmd_blocks, 0
            try:
                run_body = (lambda: self._blocks(region.blocks, body, args)) if region.kind == "spmd" else \
                    (lambda: body(*args))
                out["values"] = self._task_body(name, run_body, where=str(where), deps=region.deps, tid=tid,
                                                lazy=True, tensors=list(zip(body.__code__.co_varnames, args)),
                                                dumps=region.options.get("dumps", ()))
            finally:
                self._tasks.spmd_blocks = saved
            return self._tasks.left

        for t in region.options.get("no_dep_args", ()):
            self.exclude_from_deps(t)
        ran = self._submit_task(tid, name, run, region.deps, args, where)
        return RegionResult(tid, out.get("values") if ran else None, str(where))

    def _blocks(self, n: int, body, args):
        values = None
        saved, self._tasks.region_blocks = self._tasks.region_blocks, n
        blocks = [] if self.checking and n > 1 else None  # the blocks' actors, under the checker
        try:
            for b in range(n):
                self._tasks.block_idx = b
                parent = self._enter_block(b, None, None, blocks) if blocks is not None else None
                try:
                    values = body(*args)
                finally:
                    if parent is not None:
                        self.events.actor = parent
        finally:
            self._tasks.block_idx, self._tasks.region_blocks = 0, saved
        if blocks:
            self.events.join(blocks)  # the task is complete when all its blocks are
        return values

    def _enter_block(self, b: int, name, where, blocks: list) -> int:
        """Under the checker: run block ``b`` as an actor of its own, forked from the running one (the task the
        blocks belong to: blocks run concurrently); returns the running actor, to go back to after the block."""
        events = self.events
        parent = events.actor
        info = dict(events.actors[parent])
        if info.get("kind") != "task":  # blocks of a kernel called from the orchestration: the call is their task
            info = {"name": name, "task_id": self._run.task_id, "where": str(where), "deps": [], "manual": False}
        info.pop("parent", None)
        info["kind"], info["block"] = "block", b
        actor = events.fork(**info)
        blocks.append(actor)
        events.actor = actor
        return parent

    def region_begin(self, region):
        # A region run in place (its function's source was not available to outline it): its deps first.
        self._check_deps(f"pl.{region.kind}", region.deps)
        self.graph.wait_for(region.deps)
        if self._open_actors:
            self.events.join([self._tasks.tid_actor[d] for d in region.deps if d in self._tasks.tid_actor])
        if region.kind == "spmd":
            self._tasks.spmd_blocks = region.blocks
        return self._new_tid()

    def region_end(self, region, tid, failed: bool) -> None:
        if region.kind == "spmd":
            self._tasks.spmd_blocks = 0

    def scope_begin(self, manual: bool) -> None:
        if manual and self._tasks.manual:
            raise ProgramError(f"pl.manual_scope() at {user_location(2)}: a manual scope may not nest inside "
                               "another; flatten them into one")
        self._tasks.manual += manual

    def scope_end(self, manual: bool) -> None:
        self._tasks.manual -= manual

    def exclude_from_deps(self, tensor) -> None:
        self._tasks.no_dep.add(id(tensor))

    def dump_tag(self, tensor) -> None:
        self._tasks.dump_keys.add(buffer_key(self._tensor("pl.dump_tag", tensor)))

    def _dump(self, task: str, tensors, dumps) -> None:
        """Copy the task's tensors the dump asks for (all of them under enable_dump_args=2) into the event log."""
        marked = self._tasks.dump_keys | {buffer_key(t) for t in self._tensors(dumps)}
        for arg, t in tensors:
            if isinstance(t, RankTensor) and (self.events.dump_args == 2 or overlap(marked, [buffer_key(t)])):
                self.events.dumps.append({"task_id": self._run.task_id, "task": task, "arg": arg,
                                          "array": np.array(t.array, copy=True)})

    def spmd(self, n: int):
        return _Spmd(self, n)

    def block_idx(self):
        return Scalar(self._tasks.block_idx, dt.INDEX)

    def block_num(self):
        return Scalar(self._tasks.spmd_blocks or self._tasks.region_blocks or 1, dt.INDEX)


class _Spmd:
    """``pl.spmd(n)``: iterate block indices, or as a ``with`` block run each kernel call n times."""

    def __init__(self, ctx: TaskCalls, n: int):
        self.ctx, self.n = ctx, n

    def __iter__(self):
        for b in range(self.n):
            self.ctx._tasks.block_idx = b
            yield Scalar(b, dt.INDEX)
        self.ctx._tasks.block_idx = 0

    def __enter__(self):
        self.ctx._tasks.spmd_blocks = self.n
        return self.ctx._tasks.started

    def __exit__(self, *exc):
        self.ctx._tasks.spmd_blocks = 0
        return False


_MANUAL_DEP: dict = {}  # id(a kernel's params) -> (params, indices of its pl.ManualDep parameters)


def _tracked(fn: Function, args, kwargs) -> tuple:
    """The arguments of a call of kernel ``fn`` that its task's automatic dependencies follow: all of them but
    those whose parameter is annotated ``pl.ManualDep``."""
    params = fn.params
    entry = _MANUAL_DEP.get(id(params))
    if entry is None or entry[0] is not params:
        entry = _MANUAL_DEP[id(params)] = (params, [i for i, p in enumerate(params)
                                                    if getattr(p.ttype, "manual_dep", False)])
    if not entry[1]:
        return (*args, *kwargs.values())
    values = fn.bind_arguments(args, kwargs)
    return tuple(v for i, v in enumerate(values) if i not in entry[1])
