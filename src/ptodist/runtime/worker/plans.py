"""A worker's plans: the host orchestrator planned with its sub-worker calls, cached per argument signature (and
the values of the scalars the host used: ``compiler.scalars``), split into segments, and checked against what a
worker allows (stacked shards, persistent layouts)."""

from __future__ import annotations

import ast
import inspect
import itertools
import math
import textwrap
from dataclasses import dataclass, field

from ... import context
from ...compiler import checks, scalars
from ...compiler.plan import DispatchPlan, HostTensorRef, WindowView, _arg_json
from ...compiler.planner import PlanningContext
from ...errors import (
    WINDOW_KIND_PITFALL,
    DispatchTypeError,
    DispatchValueError,
    ProgramError,
    ProgramTypeError,
    classified,
)
from ...language.functions import Function, Kind
from ...source import user_location

ALIGN = 64


@dataclass
class _HostCall:
    """A sub-worker call the host orchestrator made: it runs in the driver between two segments."""

    seq: int
    function: Function
    args: list
    location: str


class _WorkerPlanningContext(PlanningContext):
    """Planning on a worker: sub-worker calls are recorded (they run as callbacks), not refused."""

    def __init__(self, *args):
        super().__init__(*args)
        self.host_calls: list[_HostCall] = []

    def call_function(self, fn, args, kwargs, device):
        if fn.kind is not Kind.SUBWORKER:
            return super().call_function(fn, args, kwargs, device)
        loc = user_location(2)
        if device is not None:
            raise ProgramError(f"{fn.name}(..., device=...) at {loc}: '{fn.name}' is a sub-worker function "
                               "(pl.Role.SubWorker): it runs once per dispatch on the host, as a callback. "
                               "Call it without device=.")
        values = fn.bind_arguments(args, kwargs)
        for spec, v in zip(fn.params, values):
            if isinstance(v, WindowView):
                raise classified(ProgramTypeError(
                    f"{fn.name}() at {loc}: parameter '{spec.name}' is given a window; windows live in the ranks, a "
                    "sub-worker callback runs on the host. Pass a host tensor (copy the window into one in a kernel "
                    "first)."), pitfall=WINDOW_KIND_PITFALL)
        self.host_calls.append(_HostCall(self._seq, fn, values, str(loc)))
        self._seq += 1
        return None


@dataclass
class _PlanEntry:
    """A plan as the worker uses it: the plan, its callbacks, and how it travels to the ranks."""

    id: int
    plan: DispatchPlan
    host_calls: list
    blob: bytes
    steps: list          # ("segment", j) and ("call", _HostCall), in host order
    layout: tuple        # (name, nbytes, offset) of each window buffer
    heap: int            # bytes of window heap per rank
    refs: dict = field(default_factory=dict)  # host param index -> [(rank, index, location)]
    done: scalars.Finished = field(default_factory=lambda: scalars.Finished(frozenset()))  # the scalars it used
    boundaries: list = field(init=False)      # the seq of each sub-worker call: where segments end

    def __post_init__(self):
        self.boundaries = [c.seq for c in self.host_calls]


def _steps(plan: DispatchPlan, calls: list[_HostCall]) -> list:
    bounds = [c.seq for c in calls]
    steps = []
    for j in range(len(calls) + 1):
        lo = bounds[j - 1] if j else -1
        hi = bounds[j] if j < len(bounds) else math.inf
        if any(lo < t.seq < hi for ts in plan.tasks for t in ts):
            steps.append(("segment", j))
        if j < len(calls):
            steps.append(("call", calls[j]))
    return steps


def _host_refs(plan: DispatchPlan) -> dict:
    refs: dict = {}

    def visit(a, rank, loc):
        if isinstance(a, HostTensorRef):
            refs.setdefault(a.tensor.index, []).append((rank, a.index, loc))
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x, rank, loc)

    for r, tasks in enumerate(plan.tasks):
        for t in tasks:
            visit(t.args, r, t.location)
    return refs


def is_abstract(fn: Function) -> bool:
    """True when the function's body is ``...`` (after an optional docstring): a callback point."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        return False
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
            isinstance(body[0].value.value, str):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
        body[0].value.value is Ellipsis



class Planner:
    """Plans a worker's dispatches: one cache entry per program and argument signature (and the values of the scalars
    its host used), the least recently used of more than ``scalars.PLANS_KEPT`` dropped."""

    def __init__(self, callbacks: dict, persistent: bool, encode):
        self.callbacks = callbacks
        self.persistent = persistent
        self.encode = encode         # (plan, boundaries) -> bytes for ranks in other processes, or None
        self.plans = scalars.PlanCache()
        self.plan_ids = itertools.count()
        self.layouts: dict = {}      # program index -> persistent window layout

    def plan_for(self, index: int, compiled, values: list, hosts: list) -> _PlanEntry:
        key = (index, compiled.plan_key(values, hosts))
        entry = self.plans.get(key, values)
        if entry is not None:
            scalars.check_values(entry.done, values)
            return entry
        specs = compiled.host_specs(hosts)
        ctx = _WorkerPlanningContext(compiled.name, compiled.device_ids, specs, compiled.host)
        proxies = scalars.slots_for(values, hosts)  # a scalar the host only passes on leaves the plan open
        for spec in specs:
            proxies[spec.index] = HostTensorRef(spec)
        with context.using(ctx):
            compiled.host.invoke(*proxies)
        plan = ctx.plan
        checks.check_coverage(plan, compiled.host)
        calls = ctx.host_calls
        done = scalars.finish(plan, proxies, compiled.param_names, calls)
        for call in calls:
            if call.function.name not in self.callbacks and is_abstract(call.function):
                raise ProgramError(f"{call.function.name}() at {call.location}: sub-worker function "
                                   f"'{call.function.name}' ({call.function.location}) has no body and no callback; "
                                   f"pass prepare(callbacks={{'{call.function.name}': fn}}).")
        try:
            blob = self.encode(plan, [c.seq for c in calls])
        except Exception as e:  # noqa: BLE001 - anything unpicklable in a task's arguments
            raise DispatchTypeError(
                f"{compiled.name}: the dispatch plan cannot be sent to the worker's ranks ({type(e).__name__}: {e}). "
                "Arguments of per-device functions must be tensors, windows, scalars or picklable values, and the "
                "functions must be reachable from the programs given to prepare().") from None
        heap = -(-plan.window_heap_bytes // ALIGN) * ALIGN
        entry = _PlanEntry(next(self.plan_ids), plan, calls, blob, _steps(plan, calls),
                           # the program's own windows; the host's chip-task order signal is ptodist's
                           tuple((w.name, w.nbytes, w.offset) for w in plan.windows if w is not plan.order_signal),
                           heap, _host_refs(plan), done)
        self.plans.put(key, values, done.used, entry)
        out = plan.to_json()
        if calls:
            out["sub_worker_calls"] = [{"seq": c.seq, "function": c.function.name, "called_at": c.location,
                                        "args": [_arg_json(a) for a in c.args]} for c in calls]
        compiled.write_plan(out, plan)
        return entry


    def check_args(self, compiled, entry: _PlanEntry, hosts: list) -> None:
        for i, h in enumerate(hosts):
            if h is None or h.kind != "stacked":
                continue
            name = compiled.host.params[i].name
            ids = h.resident.worker_ids
            placed = ids != tuple(range(len(ids)))
            for rank, idx, loc in entry.refs.get(i, ()):
                if placed:
                    self._check_placed(compiled, name, ids, rank, idx, loc)
                elif not idx or idx[0] != rank:
                    given = f"{name}[{', '.join(map(str, idx))}]" if idx else name
                    raise DispatchValueError(
                        f"{compiled.name}() parameter '{name}' is a StackedDeviceTensor: shard i lives on rank i, but "
                        f"the dispatch to rank {rank} at {loc} is given {given}. Give each rank its own shard: "
                        f"{name}[r] in the dispatch loop.")
            for call in entry.host_calls:
                for a in call.args:
                    if isinstance(a, HostTensorRef) and a.tensor.index == i and len(a.index) > 1:
                        raise DispatchValueError(
                            f"{call.function.name}() at {call.location}: a sub-worker callback gets a "
                            f"StackedDeviceTensor whole or one shard ({name}[i]), not {a.name}")
        for call in entry.host_calls:
            for a in call.args:
                if isinstance(a, HostTensorRef) and hosts[a.tensor.index].kind == "resident" and a.index:
                    name = compiled.host.params[a.tensor.index].name
                    raise DispatchValueError(
                        f"{call.function.name}() at {call.location}: a sub-worker callback gets a DeviceTensor "
                        f"whole ({name}), not a part of it ({a.name}); read parts with rt.copy_from.")

    @staticmethod
    def _check_placed(compiled, name: str, ids: tuple, rank: int, idx: tuple, loc) -> None:
        """A stacked tensor placed with worker_ids: rank r must be given the shard i with ids[i] == r."""
        if idx and isinstance(idx[0], int) and 0 <= idx[0] < len(ids) and ids[idx[0]] == rank:
            return
        given = f"{name}[{', '.join(map(str, idx))}]" if idx else name
        where = f", which lives on rank {ids[idx[0]]}" if idx and isinstance(idx[0], int) and \
            0 <= idx[0] < len(ids) else ""
        own = [i for i, w in enumerate(ids) if w == rank]
        want = f"{name}[{own[0]}]" if own else f"no shard (worker_ids {list(ids)} place none on rank {rank})"
        raise DispatchValueError(
            f"{compiled.name}() parameter '{name}' is a StackedDeviceTensor placed with worker_ids={list(ids)} "
            f"(shard i lives on rank worker_ids[i]), but the dispatch to rank {rank} at {loc} is given {given}{where}. "
            f"Rank {rank} holds {want}: give each rank the shard placed on it, or allocate the stacked tensor with "
            "worker_ids matching the program's device= placement (alloc_stacked_tensor(host, worker_ids=[...])).")

    def check_layout(self, index: int, compiled, entry: _PlanEntry) -> None:
        before = self.layouts.get(index)
        if before is not None and before != entry.layout:
            raise DispatchValueError(
                f"{compiled.name}: this dispatch allocates windows {_layout_text(entry.layout)}, but the worker's "
                f"persistent windows were laid out as {_layout_text(before)} by the program's first dispatch. "
                "Persistent windows keep one layout for the worker's lifetime: allocate the same window buffers "
                "(names and sizes, in the same order) on every dispatch, or prepare the worker without "
                "persistent=True.")

        if self.persistent and entry.heap and index not in self.layouts:
            self.layouts[index] = entry.layout


def _layout_text(layout: tuple) -> str:
    return "[" + ", ".join(f"'{n}' {b} bytes at {o}" for n, b, o in layout) + "]"
