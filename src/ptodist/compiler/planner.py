"""Run the host orchestrator against a planning context to build a DispatchPlan.

The host function runs once, in the driver.  Instead of doing work it
records: ``alloc_window_buffer`` reserves a symmetric region, ``window`` makes
a view descriptor, ``f(..., device=r)`` appends a task to rank r's list.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
import warnings

import numpy as np

from .. import context
from ..collectives import spec as coll_spec
from ..collectives.registry import REGISTRY as COLLECTIVES
from ..context import RegionResult
from ..errors import (
    WINDOW_KIND_PITFALL,
    CollectiveInLoopError,
    DispatchCoverageError,
    PitfallWarning,
    ProgramError,
    ProgramTypeError,
    ProgramValueError,
    RankIdentityError,
    WindowTooSmallError,
    classified,
)
from ..language import dtypes as dt
from ..language.dtypes import DataType
from ..language.functions import EntryFunction, Function, Kind
from ..language.scalar import Scalar, as_int
from ..language.types import Direction, ParamSpec, TensorType
from ..source import is_internal, user_location
from . import checks, scalars
from .plan import (
    WINDOW_ALIGN,
    BuiltinCall,
    DispatchPlan,
    HostTensorRef,
    HostTensorSpec,
    TaskSpec,
    WindowBuffer,
    WindowView,
    domain_args,
    resolve_groups,
)

_ASSIGN = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s*(?::[^=]*)?=")


class PlanningContext(context.Context):
    """The host orchestrator's view of the world while it is being planned."""

    kind = "planning"
    where_text = "in the host orchestrator"
    advice = "Move it into a kernel (@pl.jit.incore) that the host dispatches with device=r."

    def __init__(self, program: str, device_ids: list[int], host_tensors: list[HostTensorSpec], host: Function):
        self.host = host
        self.layouts: dict = {}  # signal buffer id -> the collective layout it serves
        self.world = len(device_ids)
        self.plan = DispatchPlan(program, self.world, list(device_ids), host_tensors, [], [[] for _ in device_ids])
        self._heap = 0
        self._seq = 0
        self._allocated: dict = {}  # window buffer id -> (shape or None, dtype or None): how the program sized it
        self.commless = 0  # dispatches made without device=: placed round-robin over the chips in submit order
        self._first_commless: str | None = None  # the line of the first of them
        self.chip_regions = 0  # `with pl.at(level=pl.Level.CHIP)` blocks outlined so far (names their functions)
        self._outlined: set[int] = set()  # ids of those blocks' functions: their parameters are ptodist's own
        self._n_params = len(host.params)

    # -- host operations ------------------------------------------------------
    def world_size(self):
        return Scalar(self.world, dt.INT64)

    def alloc_window_buffer(self, size_or_shape, dtype, name):
        loc = user_location(3)
        shape = None
        if isinstance(size_or_shape, (list, tuple)):
            if not isinstance(dtype, DataType):
                raise ProgramTypeError(
                    f"pld.alloc_window_buffer({list(size_or_shape)}) at {loc}: the shape form needs dtype=, "
                    "e.g. pld.alloc_window_buffer([NR, 1], dtype=pl.INT32)")
            shape = [as_int(d, "a window dimension") for d in size_or_shape]
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.get_byte()
        else:
            nbytes = as_int(size_or_shape, "pld.alloc_window_buffer size (bytes)")
            if dtype is not None:
                nbytes *= dtype.get_byte()
            elif nbytes == self.world and nbytes > 0:
                message = (f"pld.alloc_window_buffer({nbytes}) at {loc}: the size is in bytes and equals the world "
                           f"size ({self.world}); if you meant {nbytes} elements, use the shape form "
                           f"pld.alloc_window_buffer([{nbytes}, 1], dtype=pl.INT32)")
                # Attribute the warning to the user's line, not to ptodist's frames.
                if loc is not None:
                    warnings.warn_explicit(message, UserWarning, loc.file, loc.line)
                else:
                    warnings.warn(message, stacklevel=2)
        if nbytes <= 0:
            raise ProgramValueError(f"pld.alloc_window_buffer at {loc}: size must be positive, got {nbytes} bytes")
        if not name and loc is not None:
            m = _ASSIGN.match(loc.text())
            name = m.group(1) if m else f"window{len(self.plan.windows)}"
        buf = self._reserve(name or f"window{len(self.plan.windows)}", nbytes, str(loc))
        self._allocated[buf.id] = (shape, dtype if isinstance(dtype, DataType) else None)
        return buf

    def _reserve(self, name: str, nbytes: int, where: str) -> WindowBuffer:
        buf = WindowBuffer(len(self.plan.windows), name, nbytes, self._heap, where)
        self._heap += -(-nbytes // WINDOW_ALIGN) * WINDOW_ALIGN
        self.plan.windows.append(buf)
        self.plan.window_heap_bytes = self._heap
        return buf

    def window(self, buf, shape, dtype):
        loc = user_location(3)
        if not isinstance(buf, WindowBuffer):
            raise ProgramTypeError(f"pld.window at {loc}: the first argument must come from "
                                   f"pld.alloc_window_buffer, got {type(buf).__name__}")
        if not isinstance(dtype, DataType):
            raise ProgramTypeError(f"pld.window at {loc}: dtype= must be a pl dtype, got {dtype!r}")
        shape = tuple(as_int(d, "a window dimension") for d in shape)
        view = WindowView(buf, shape, dtype, str(loc))
        if view.nbytes > buf.nbytes:
            hint, fix = self._too_small(buf, list(shape), dtype)
            e = WindowTooSmallError(
                f"pld.window at {loc}: a view of shape {list(shape)} {dtype.name} needs {view.nbytes} bytes but "
                f"window buffer '{buf.name}' (allocated at {buf.location}) has only {buf.nbytes} bytes.{hint}")
            e.fix = fix
            e.locations = [buf.location, str(loc)]  # the allocation is what is wrong
            raise e
        return view

    def _too_small(self, buf: WindowBuffer, shape: list, dtype: DataType) -> tuple[str, str]:
        """Why a view does not fit its buffer, as (a hint for the message, the fix), from how the buffer was sized."""
        alloc_shape, alloc_dtype = self._allocated.get(buf.id, (None, None))
        fits = f"pld.alloc_window_buffer({_shape_text(shape)}, dtype=pl.{dtype.name})"
        if alloc_shape is None:
            if buf.nbytes == self.world:
                return ((f" The buffer's size equals the world size ({self.world}): alloc_window_buffer takes "
                         "bytes, not a rank count; use pld.alloc_window_buffer(shape, dtype=...)."),
                        f"alloc_window_buffer(n) takes bytes, not a rank count: allocate with the shape and dtype "
                        f"of the view, {fits}.")
            return "", (f"alloc_window_buffer(n) takes bytes: this view needs {int(np.prod(shape)) * dtype.get_byte()};"
                        f" allocate with the shape and dtype of the largest view, {fits}.")
        if alloc_dtype is not None and alloc_dtype.get_byte() < dtype.get_byte() and \
                int(np.prod(alloc_shape, dtype=np.int64)) >= int(np.prod(shape, dtype=np.int64)):
            return ((f" The buffer was allocated as {list(alloc_shape)} {alloc_dtype.name} ({alloc_dtype.get_byte()} "
                     f"bytes per element) and is viewed as {dtype.name} ({dtype.get_byte()} bytes per element)."),
                    f"Allocate the buffer with the dtype of its views: "
                    f"pld.alloc_window_buffer({_shape_text(alloc_shape)}, dtype=pl.{dtype.name}).")
        if len(shape) == len(alloc_shape) + 1 and shape[0] == self.world and list(shape[1:]) == list(alloc_shape):
            return ((f" The buffer was allocated as {list(alloc_shape)}, without the view's leading rank dimension "
                     f"({self.world} = the world size)."),
                    f"Size the buffer with the rank dimension, as the view is: "
                    f"pld.alloc_window_buffer({_shape_text(['pld.world_size()', *shape[1:]])}, "
                    f"dtype=pl.{dtype.name}).")
        if len(shape) == len(alloc_shape) and shape[0] == self.world and alloc_shape[0] != self.world \
                and list(shape[1:]) == list(alloc_shape[1:]):
            return ((f" The buffer was allocated as {list(alloc_shape)}: its dimension 0 is {alloc_shape[0]} where "
                     f"the view has the world size ({self.world})."),
                    f"Size the buffer's dimension 0 by the rank count, as the view is: "
                    f"pld.alloc_window_buffer({_shape_text(['pld.world_size()', *shape[1:]])}, "
                    f"dtype=pl.{dtype.name}).")
        return ((f" The buffer was allocated as {list(alloc_shape)} "
                 f"{alloc_dtype.name if alloc_dtype is not None else ''}".rstrip() + "."),
                f"Allocate the buffer with the shape and dtype of its largest view: {fits}.")

    # -- dispatch ---------------------------------------------------------------
    def region(self, region, body, args):
        """``with pl.at(level=pl.Level.CHIP):`` in the host: the block is outlined into a chip task, dispatched
        like a chip call without ``device=`` (round-robin over the chips, in submit order)."""
        loc = user_location(3)
        level = getattr(region.level, "name", region.level)
        if region.kind != "at" or level != "CHIP":
            what = f"pl.spmd({region.blocks})" if region.kind == "spmd" else f"pl.at(level={level})"
            raise ProgramError(
                f"{what} at {loc}: in the host orchestrator a region is chip work, `with pl.at(level="
                "pl.Level.CHIP):`; core-level work (CORE_GROUP, pl.spmd) belongs inside it or inside a chip "
                "function (@pl.jit) the host calls.")
        # Not an upstream rule: ptodist does not honour deps= between host regions, and ignoring an order the
        # program asked for could change its result (architecture.md, Differences).
        if region.deps:
            raise ProgramError(f"pl.at(level=pl.Level.CHIP, deps=...) at {loc}: the host orders chip tasks by "
                               "submission (and the data they share); drop deps= here, or put the dependent work "
                               "in one chip region")
        body.__name__ = body.__qualname__ = region.name_hint or f"{self.host.name}_chip_{self.chip_regions}"
        self.chip_regions += 1
        fn = Function(body, Kind.ORCHESTRATION, None, {}, {})
        fn._params = [_region_param(name, v) for name, v in zip(body.__code__.co_varnames, args)]
        self._outlined.add(id(fn))
        self.call_function(fn, args, {}, None)
        return RegionResult(None, None, str(loc))

    def call_function(self, fn: Function, args, kwargs, device):
        loc = user_location(3)
        if fn.kind is Kind.ORCHESTRATION:
            if device is None:
                # A comm-less chip call: no affinity, so it goes to the next chip round-robin, in submit
                # order (the first to chip 0), as PyPTO's runtime resolves a chip call without a device.
                device = self.commless % self.world
                self.commless += 1
                self.plan.commless = self.commless
                self._first_commless = self._first_commless or str(loc)
                out = self._dispatch(fn, args, kwargs, device, loc)
                self._check_placement(fn, device, loc)
                return out
            return self._dispatch(fn, args, kwargs, device, loc)
        if fn.kind is Kind.KERNEL:
            raise ProgramError(
                f"{fn.name}() at {loc}: the host dispatches the per-device @pl.jit wrapper with device=r, never a "
                f"kernel directly. Add a @pl.jit function that calls {fn.name}(...) and dispatch that.")
        if fn.kind is Kind.SUBWORKER:
            raise ProgramError(f"{fn.name}() at {loc}: '{fn.name}' is a sub-worker function (pl.Role.SubWorker), a "
                               "host-side callback that a DistributedWorker runs: call the program through "
                               f"compiled.prepare(callbacks={{'{fn.name}': python_function}}); a one-shot run "
                               "dispatches only per-device functions and collectives.")
        if device is not None:
            raise ProgramError(f"{fn.name}() at {loc}: device= is only for dispatching a per-device function")
        return fn.invoke(*args, **kwargs)

    def _check_placement(self, fn: Function, chip: int, loc) -> None:
        """Warn when a chip call placed round-robin is given another rank's slice of a per-rank host tensor.

        ``x[i]`` of a tensor with one slice per rank is rank ``i``'s data; a call without ``device=`` that lands on
        chip ``chip != i`` (an earlier call without ``device=`` moved the count on) and takes a window computes
        with it as rank ``chip`` (that rank's window, its ``pld.rank``).  A call with no window is comm-less: any
        chip computes the same, so it is left alone.  Upstream places it so too, so it runs; the note goes in the plan
        for ``ptodist check`` (``plan.misplaced``), which reports it if the script then fails.
        """
        if any(str(loc) == where[0] for _, where in self.plan.misplaced):
            return  # one note per call line (a dispatch loop makes the call once per rank)
        task = self.plan.tasks[chip][-1]
        if not any(isinstance(a, WindowView) for a in task.args):
            return  # a comm-less call (no window, so no rank identity): any chip computes the same
        for a in task.args:
            if not isinstance(a, HostTensorRef) or not a.index or a.tensor.shape[:1] != (self.world,) or \
                    a.index[0] == chip:
                continue
            i = a.index[0]
            before = self.commless - 1
            message = (f"{fn.name}() at {loc} has no device=, so it runs on chip {chip}: chip calls without device= "
                       f"go round-robin over the chips in submit order, and {before} came before it (the first at "
                       f"{self._first_commless}). It is given {a.name}, rank {i}'s slice of '{a.tensor.name}', so "
                       f"rank {chip} runs it on rank {i}'s data, with its own windows and pld.rank. Pass device=r, "
                       f"the dispatch loop's rank, to run it on rank {i}.")
            self.plan.misplaced.append((message, [str(loc), self._first_commless]))
            warnings.warn_explicit(message, PitfallWarning, loc.file, loc.line)
            return

    def _dispatch(self, fn, args, kwargs, device, loc):
        try:
            r = device.__index__()
        except (AttributeError, TypeError):
            raise ProgramTypeError(f"{fn.name}(..., device={device!r}) at {loc}: device= must be an integer "
                                   "rank index") from None
        if not 0 <= r < self.world:  # upstream: 04-debugging.md fatal pitfall, device=r validated in [0, world)
            e = DispatchCoverageError(
                f"{fn.name}(..., device={r}) at {loc}: device= is a logical rank index and must be in "
                f"[0, {self.world}) (world = len(device_ids) = {self.world}); device ids "
                f"{self.plan.device_ids} are mapped from rank indices. Loop with `for r in "
                "pl.range(pld.world_size())`.")
            if r in self.plan.device_ids:
                e.fix = (f"device= takes the rank index, not the device id (device {r} is rank "
                         f"{self.plan.device_ids.index(r)}): dispatch with device=r for r in "
                         "pl.range(pld.world_size()); DistributedConfig(device_ids=...) maps ranks to devices.")
            else:
                e.fix = ("Dispatch with device=r exactly, r the variable of `for r in pl.range(pld.world_size())` "
                         "(no offset, no other range).")
            raise e
        values = fn.bind_arguments(args, kwargs)
        # The TaskArgs order binds what the program's own host orchestrator dispatches; an L2 program's entry and
        # an outlined region have no such call in the program.
        child = id(fn) not in self._outlined and not (isinstance(self.host, EntryFunction)
                                                      and fn is self.host.orchestration)
        checks.check_dispatch_args(fn, values, loc, self.world, child)
        for v in values:
            if isinstance(v, WindowView):
                v.buffer.dispatched.add(r)  # the buffer's comm domain: every rank it is dispatched to
        self.plan.tasks[r].append(TaskSpec(r, fn, values, str(loc), self._seq))
        self._seq += 1
        return checks.dispatch_result(fn, values, loc)

    def collective(self, name, args, kwargs):
        loc = user_location(3)
        # A host scalar given to a collective shapes the plan (a root, counts): its value, used.
        args, kwargs = scalars.used(list(args)), scalars.used(dict(kwargs))
        # The collective runs over its data window's comm domain (as far as the dispatches so far tell).
        members = domain_args(name, args)
        data = members[0] if members else None
        n = self._group_size(data.buffer) if isinstance(data, WindowView) else self.world
        declared = COLLECTIVES[name]
        signal_at = declared.domain[-1]
        if declared.host_signal is not None and args[signal_at] is None:
            self._reject_in_loop(loc, name)
            shape = declared.host_signal(n, kwargs)
            buf = self._reserve(f"{name}_signal@{loc.short if loc else '?'}", max(4 * shape[0] * shape[1], 4),
                                str(loc))
            args[signal_at] = WindowView(buf, shape, dt.INT32, str(loc))
        if declared.host_window_source and not isinstance(args[0], WindowView):
            role = declared.source_role
            raise classified(ProgramTypeError(
                f"{declared.op_name} at {loc}: in the host orchestrator the {role} must be a window (each rank "
                f"contributes its own copy), got {checks.value_kind(args[0])}"), pitfall=WINDOW_KIND_PITFALL,
                fix=f"Stage each rank's {role} into a window (pld.window of a pld.alloc_window_buffer) and pass "
                    f"that, or call the {name} inside a kernel.")
        call = coll_spec.check(name, tuple(args), kwargs, n, str(loc), host=True)
        if call.signal is not None:
            coll_spec.check_layout(self.layouts, call)
        if isinstance(data, WindowView):
            # PyPTO: a host collective's signal (and all_to_all_v's recv_counts) takes its data's comm domain.
            for f in domain_args(name, args, kwargs)[1:]:
                if isinstance(f, WindowView) and f.buffer is not data.buffer and data.buffer not in f.buffer.inherits:
                    f.buffer.inherits.append(data.buffer)
        builtin = BuiltinCall(name, tuple(args), dict(kwargs), loc, n)
        for r in range(self.world):
            self.plan.tasks[r].append(TaskSpec(r, builtin, list(args), str(loc), self._seq))
        self._seq += 1
        return call.signal if call.target is None else call.target  # a barrier's: its signal

    def _group_size(self, buf: WindowBuffer) -> int:
        """How many ranks ``buf``'s comm domain has so far: the ranks dispatched its windows (the world when none)."""
        got, todo, seen = set(), [buf], set()
        while todo:
            b = todo.pop()
            if b.id in seen:
                continue
            seen.add(b.id)
            got |= b.dispatched
            todo.extend(b.inherits)
        return len(got) or self.world

    def _reject_in_loop(self, loc, name: str) -> None:
        """A host allreduce without a signal synthesises one per call site: not allowed inside a loop (upstream's
        ``pld.tensor.allreduce`` docstring: a HOST allreduce is rejected inside for/while loops).

        Every user frame from the call up to the host orchestrator is checked, so a loop in a
        helper function the host calls counts too.
        """
        frame = sys._getframe(2)
        while frame is not None:
            if not is_internal(frame.f_code.co_filename):
                loop_line = _enclosing_loop(frame.f_code, frame.f_lineno)
                if loop_line is not None:
                    raise CollectiveInLoopError(
                        f"pld.tensor.{name} at {loc}: called without a signal inside a loop (the loop at "
                        f"{frame.f_code.co_filename}:{loop_line}). The synthesised signal would serve every "
                        "iteration of the loop at once. Pass an explicit signal window "
                        "(pld.window(pld.alloc_window_buffer([NR, 1], dtype=pl.INT32), ...)) or hoist the "
                        f"{name} out of the loop.")
            if frame.f_code is self.host.fn.__code__:
                return
            frame = frame.f_back

    def _host_tensor(self, shape, dtype) -> HostTensorRef:
        """``pl.create_tensor`` in the host: a zeroed host intermediate that chip calls read and write."""
        loc = user_location(4)
        if not isinstance(dtype, DataType):
            raise ProgramTypeError(f"pl.create_tensor at {loc}: dtype= must be a pl dtype such as pl.FP32, "
                                   f"got {dtype!r}")
        shape = tuple(as_int(d, "a pl.create_tensor dimension") for d in shape)
        if any(d <= 0 for d in shape):
            raise ProgramValueError(f"pl.create_tensor({list(shape)}) at {loc}: every dimension must be positive; "
                                    "give the tensor's shape, e.g. pl.create_tensor([NR, 1, 64], dtype=pl.FP32)")
        k = len(self.plan.host_tensors)
        m = _ASSIGN.match(loc.text()) if loc is not None else None
        name = m.group(1) if m else f"intermediate{k}"
        index = max([self._n_params - 1, *(t.index for t in self.plan.host_tensors)]) + 1
        spec = HostTensorSpec(index, name, shape, dtype, Direction.INOUT)
        self.plan.host_tensors.append(spec)
        return HostTensorRef(spec)

    def get_comm_ctx(self, tensor):
        from ..language.distributed.types import CommCtx

        if not isinstance(tensor, WindowView):
            raise classified(ProgramTypeError(f"pld.get_comm_ctx at {user_location(3)}: needs a window "
                                              f"(pld.DistributedTensor), got {type(tensor).__name__}"),
                             pitfall=WINDOW_KIND_PITFALL,
                             fix="Pass a window (pld.window(buf, shape, dtype=...)) to pld.get_comm_ctx.")
        return CommCtx(self.world, -1)

    def comm_rank(self, comm):
        self._identity_outside_kernel("pld.rank")

    def comm_nranks(self, comm):
        self._identity_outside_kernel("pld.nranks")

    def _identity_outside_kernel(self, op):
        raise RankIdentityError(
            f"{op}() at {user_location(4)} is called in the host orchestrator: rank identity exists only "
            "inside a kernel running on a rank. Read it in the kernel with "
            f"{op}(pld.get_comm_ctx(window)), or pass the host loop variable r as a scalar argument.")

    def memory_op(self, name, *args, **kwargs):
        if name == "pl.create_tensor":
            return self._host_tensor(*args)
        raise ProgramError(f"{name}() at {user_location(3)} is called in the host orchestrator; it belongs in "
                           "a kernel (@pl.jit.incore) dispatched to a rank.")


def make_plan(host: Function, program: str, device_ids: list[int], host_specs: list[HostTensorSpec],
              host_values: list) -> DispatchPlan:
    """Run ``host`` with planning stand-ins for its tensors and return the checked plan."""
    ctx = PlanningContext(program, device_ids, list(host_specs), host)
    proxies = list(host_values)
    for spec in host_specs:
        proxies[spec.index] = HostTensorRef(spec)
    with context.using(ctx):
        host.invoke(*proxies)
    resolve_groups(ctx.plan)
    checks.check_coverage(ctx.plan, host, ctx.commless)
    return ctx.plan


def _shape_text(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _enclosing_loop(code, lineno: int) -> int | None:
    """Return the first line of the innermost ``for``/``while`` of ``code`` that contains ``lineno``."""
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    line = lineno - first + 1
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While)) and node.lineno < line <= (node.end_lineno or node.lineno):
            if found is None or node.lineno > found:
                found = node.lineno
    return None if found is None else first + found - 1


def _region_param(name: str, value) -> ParamSpec:
    """The parameter an outlined chip region takes for one enclosing local it reads: tensors are InOut (a region
    may write what it was given), scalars scalars, anything else as it is."""
    if isinstance(value, WindowView):
        return ParamSpec(name, "tensor", Direction.INOUT, TensorType(None, None, True))
    if isinstance(value, HostTensorRef):
        return ParamSpec(name, "tensor", Direction.INOUT, TensorType(None, None, False))
    if isinstance(value, (int, float, Scalar)) and not isinstance(value, bool):
        return ParamSpec(name, "scalar", Direction.IN, None)
    return ParamSpec(name, "any", Direction.IN, None)
