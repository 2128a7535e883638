"""Control flow: ``pl.range`` (with loop-carried values), ``pl.yield_``, tasks and scopes.

Loops run as Python loops.  Indices are ``Scalar(INDEX)`` so that index
arithmetic has the device's C semantics.  ``pl.range(..., init_values=(...))``
yields ``(i, values)`` pairs; ``pl.yield_(...)`` inside the body sets the
values the next iteration sees, and returns them so that ``acc = pl.yield_(acc2)``
leaves the final value bound after the loop.

Every ``pl.range`` loop also keeps its current index on a per-thread stack
(:func:`loop_indices`), so that a rank's event log can say in which loop
iteration a wait happened: one list store per iteration.
"""

from __future__ import annotations

import builtins
import threading
from contextlib import contextmanager
from enum import Enum

from .. import context
from ..errors import OperationTypeError, OperationValueError, ProgramError
from ..source import user_location
from . import dtypes as dt
from . import mixed
from .regions import Region
from .scalar import Scalar, as_int

_loops = threading.local()


def _stack() -> list:
    st = getattr(_loops, "stack", None)
    if st is None:
        st = _loops.stack = []
    return st


def _index_stack() -> list:
    st = getattr(_loops, "indices", None)
    if st is None:
        st = _loops.indices = []
    return st


def loop_indices() -> list[int]:
    """The current index of every ``pl.range`` loop running on this thread, outermost first."""
    st = getattr(_loops, "indices", None)
    return [i for i in st if i is not None] if st else []


def _indexed(rng: builtins.range):
    """Iterate ``rng`` as INDEX scalars, keeping the current index on this thread's loop stack."""
    st = _index_stack()
    k = len(st)
    st.append(None)
    try:
        for i in rng:
            st[k] = i
            yield Scalar(i, dt.INDEX)
    finally:
        del st[k:]  # also drops the entries of inner loops left by a break or an exception


class _CarriedLoop:
    def __init__(self, rng: range, init_values: tuple):
        self.rng = rng
        self.values = tuple(init_values)
        self.yielded = False

    def __iter__(self):
        stack = _stack()
        stack.append(self)
        indices = _index_stack()
        k = len(indices)
        indices.append(None)
        try:
            for i in self.rng:
                self.yielded = False
                indices[k] = i
                yield Scalar(i, dt.INDEX), self.values
        finally:
            del indices[k:]
            stack.remove(self)


class ForKind(Enum):
    """How a compiler is told to treat a loop; every kind runs its iterations in order here."""

    Sequential = "Sequential"
    Parallel = "Parallel"
    Unroll = "Unroll"
    Pipeline = "Pipeline"


def _loop(op: str, args: tuple, init_values):
    if not 1 <= len(args) <= 3:
        raise OperationTypeError(f"{op} takes 1 to 3 positional arguments (start, stop, step), got {len(args)}")
    bounds = [as_int(a, f"a {op} bound") for a in args]
    rng = builtins.range(*bounds)
    if init_values is not None:
        if not isinstance(init_values, (tuple, list)):
            init_values = (init_values,)
        return _CarriedLoop(rng, tuple(init_values))
    return _indexed(rng)


def range(*args, init_values=None, **options):
    """``pl.range(stop)`` / ``pl.range(start, stop, step, init_values=(...))``."""
    if "stage" in options:
        raise OperationTypeError(f"pl.range(..., stage={options['stage']!r}) at {user_location(2)}: stage= is only "
                                 "supported on pl.pipeline; write `for i in pl.pipeline(..., stage=N):` to pipeline "
                                 "the loop")
    return _loop("pl.range", args, init_values)


parallel = range
unroll = range


def pipeline(*args, stage=None, init_values=None, **options):
    """``pl.pipeline(stop, stage=F)`` / ``pl.pipeline(start, stop, step, stage=F, init_values=(...))``.

    A device replicates the body ``F`` times per outer iteration so that buffers can ping-pong; the
    iterations, their order and what each computes are those of ``pl.range`` with the same bounds, which is
    how the loop runs here.
    """
    loc = user_location(2)
    if stage is None:
        raise OperationTypeError(f"pl.pipeline() at {loc} requires stage=: the number of times the body is "
                                 "replicated per outer iteration (typically 2 to 4); write "
                                 "`pl.pipeline(n, stage=2)`")
    if isinstance(stage, Scalar):
        raise OperationTypeError(f"pl.pipeline() at {loc}: stage must be a compile-time constant (a Python int), "
                                 f"got the runtime value {stage!r}; write the replication factor as a literal")
    if isinstance(stage, bool) or not isinstance(stage, int):
        raise OperationTypeError(f"pl.pipeline() at {loc}: stage must be a positive int, got {stage!r}")
    if stage < 1:
        raise OperationValueError(f"pl.pipeline() at {loc}: stage must be >= 1, got {stage}; stage=1 pipelines "
                                  "without replicating the body")
    return _loop("pl.pipeline", args, init_values)


class _WhileLoop:
    """``pl.while_(init_values=...)``: yields the carried values until ``pl.cond`` says stop.

    A function's ``for ... in pl.while_(...)`` loop is rewritten when it first runs (``regions.outlined``)
    so that a false ``pl.cond`` ends the loop before the rest of the body runs; ``_guarded`` marks a
    loop so rewritten.
    """

    def __init__(self, init_values: tuple, where):
        self.values = tuple(init_values)
        self.where = where
        self.yielded = False
        self.guarded = False
        self.checked = False

    def _guarded(self) -> _WhileLoop:
        self.guarded = True
        return self

    def __iter__(self):
        stack = _stack()
        stack.append(self)
        indices = _index_stack()
        k = len(indices)
        indices.append(None)
        try:
            n = 0
            while True:
                self.yielded = self.checked = False
                indices[k] = n
                yield self.values
                if not self.checked:
                    raise ProgramError(
                        f"the pl.while_ loop at {self.where} ran an iteration without pl.cond(...): the first "
                        "statement of its body must be pl.cond(<condition>), which decides whether the loop goes on")
                n += 1
        finally:
            del indices[k:]
            stack.remove(self)


def while_(*, init_values=None) -> _WhileLoop:
    """``for (x, ...) in pl.while_(init_values=(x0, ...)):`` with ``pl.cond(<condition>)`` as the body's first
    statement: the body runs while the condition holds; ``pl.yield_`` carries the values to the next
    iteration, and the name it binds holds them after the loop (the initial values when it never ran)."""
    loc = user_location(2)
    if init_values is None:
        raise OperationValueError(f"pl.while_() at {loc}: while_() requires init_values to be specified: the loop "
                                  "carries its state in them; write `for (x,) in pl.while_(init_values=(x0,)):`, "
                                  "even for a single counter")
    if not isinstance(init_values, (tuple, list)):
        init_values = (init_values,)
    return _WhileLoop(tuple(init_values), loc)


def yield_(*values):
    """Set the loop-carried values of the innermost ``pl.range(..., init_values=...)``; return them."""
    stack = _stack()
    if stack:
        loop = stack[-1]
        if len(values) != len(loop.values):
            raise OperationValueError(
                f"pl.yield_ got {len(values)} value(s) but the loop carries {len(loop.values)} "
                "(one per entry of init_values)"
            )
        loop.values = tuple(values)
        loop.yielded = True
    return values[0] if len(values) == 1 else values


def cond(condition) -> bool:
    """``pl.cond(<condition>)``, the first statement of a ``pl.while_`` body: whether the loop goes on."""
    stack = _stack()
    loop = stack[-1] if stack else None
    if not isinstance(loop, _WhileLoop):
        raise ProgramError(f"pl.cond(...) at {user_location(2)}: pl.cond is the condition of a pl.while_ loop and "
                           "may only be the first statement of a `for ... in pl.while_(...)` body; for a branch "
                           "write a plain `if`")
    holds = bool(condition)
    loop.checked = True
    if not holds and not loop.guarded:
        raise ProgramError(
            f"the pl.while_ loop at {loop.where} cannot stop at pl.cond(...) ({user_location(2)}): the source of the "
            "function holding it could not be read, and a loop ends at its condition only in a function ptodist "
            "could read; define the function in a file (or with pl.parse), not with exec()")
    return holds


def func_attr(attrs: dict) -> None:
    """``pl.func_attr({...})``, the first statement(s) of a body: attributes of the whole function (``"stationary"``,
    ``"split"``, ...), which steer a device compiler; checked here (a dict with str keys, placed first, each key
    once: ``regions.outlined`` checks the placement when the function first runs) and otherwise unused."""
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise OperationTypeError(f"pl.func_attr at {user_location(2)}: takes one dict of attributes with str keys "
                                 f"(pl.func_attr({{\"stationary\": w}})), got {attrs!r}")


_graphs = threading.local()


class GraphScope:
    """``with pl.graph("name"):`` (and a ``@pl.jit.graph`` function's call): a recordable orchestration
    fragment. A runtime that records it once and replays it runs the same tasks in the same order, which is
    how it runs here; the rules are checked: a name, no graph inside another, none inside a task."""

    __slots__ = ("name", "where")

    def __init__(self, name, where):
        self.name, self.where = name, where

    def __enter__(self) -> None:
        stack = getattr(_graphs, "stack", None)
        if stack is None:
            stack = _graphs.stack = []
        if stack:
            outer = stack[-1]
            raise ProgramError(f"pl.graph({self.name!r}) at {self.where}: a graph region may not nest inside another "
                               f"(pl.graph({outer.name!r}) at {outer.where}); make them siblings, or one graph")
        if getattr(context.current(), "_kernel_depth", 0):
            raise ProgramError(f"pl.graph({self.name!r}) at {self.where}: a graph region records a topology of tasks, "
                               "so it may not sit inside pl.at / pl.spmd / pl.cluster (one task) or a kernel; put "
                               "the task regions inside the graph instead")
        stack.append(self)

    def __exit__(self, *exc) -> bool:
        _graphs.stack.pop()
        return False


def graph(name) -> GraphScope:
    """``with pl.graph("decoder_layer"):``: the block is a recordable graph region named ``name``."""
    where = user_location(2)
    if not isinstance(name, str) or not name:
        raise OperationTypeError(f"pl.graph(...) at {where}: the name is required, a non-empty str that identifies "
                                 f"the recorded graph (pl.graph(\"decoder_layer\")), got {name!r}")
    return GraphScope(name, where)


class _ArgDirections:
    """``pl.adir``: call-site direction markers, ``f(pl.adir.input(a), pl.adir.inout(out))``. They return their
    argument; ``pl.adir.no_dep(t)`` also leaves ``t`` out of the next task's dependency tracking, as
    ``pl.no_dep`` does (the other directions come from the callee's annotations here)."""

    @staticmethod
    def input(x):
        return x

    output = output_existing = inout = scalar = input

    @staticmethod
    def no_dep(x):
        return no_dep(x)


adir = _ArgDirections()

_printed: set = set()  # (file, line) of the pl.static_print calls that printed already


def static_print(*args, **kwargs) -> None:
    """``pl.static_print(*args)``: print once per call site and process (upstream prints when it parses the
    function; ptodist has no parse step, so the first time the line runs stands for it)."""
    where = user_location(2)
    key = (where.file, where.line) if where is not None else None
    if key is None or key not in _printed:
        if key is not None:
            _printed.add(key)
        print(*args, **kwargs)


def static_assert(condition, msg: str = "") -> None:
    """``pl.static_assert(cond, msg)``: a ``ProgramError`` naming the line and ``msg`` when ``cond`` is false."""
    if not condition:
        raise ProgramError(f"pl.static_assert at {user_location(2)} failed" + (f": {msg}" if msg else ""))


def at(level=None, role=None, *, deps=None, name_hint: str | None = None, optimizations=None, **options) -> Region:
    """``with pl.at(level=..., role=...) [as tid]:``: the block is one task (a kernel at ``CORE_GROUP``, a chip
    task at ``CHIP`` in the host orchestrator), submitted after the tasks in ``deps``; ``as tid`` names it."""
    options = {**options, **mixed.region_options(optimizations, "pl.at")}
    return Region("at", level, role, _task_ids(deps, "pl.at"), name_hint, options=options)


class ScopeMode(Enum):
    """``pl.scope(mode=...)``: AUTO orders tasks by the tensors they touch (and ``deps=``); MANUAL by ``deps=`` only."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


@contextmanager
def scope(mode: ScopeMode = ScopeMode.AUTO):
    """``with pl.scope(mode=pl.ScopeMode.MANUAL):``: a runtime scope; a manual one may not nest in another."""
    if not isinstance(mode, ScopeMode):
        raise OperationTypeError(f"pl.scope(mode={mode!r}): mode must be pl.ScopeMode.AUTO or pl.ScopeMode.MANUAL")
    manual = mode is ScopeMode.MANUAL
    ctx = context.current()
    ctx.scope_begin(manual=manual)
    try:
        yield
    finally:
        ctx.scope_end(manual=manual)


def manual_scope():
    """``with pl.manual_scope()``: tasks in the block order only by explicit ``deps=``."""
    return scope(ScopeMode.MANUAL)


def auto_scope():
    """``with pl.auto_scope()``: tasks order by the tensors they touch, plus ``deps=`` (the default)."""
    return scope(ScopeMode.AUTO)


def submit(fn, *args, deps=(), dumps=(), allow_early_resolve: bool = False, timing_slot=None, **kwargs):
    """Launch kernel ``fn`` as a task after the tasks in ``deps``; return ``(*results, task_id)``.

    ``dumps=[t, ...]`` marks tensors of this one task for the selective dump (``RunConfig(enable_dump_args=1)``);
    ``allow_early_resolve`` and ``timing_slot`` are scheduling and device-timing hints a CPU has no use for.
    """
    return context.current().submit(fn, args, kwargs, _task_ids(deps, "pl.submit"), dumps=list(dumps or ()))


def spmd_submit(fn, *args, core_num=None, deps=(), sync_start: bool = False, dumps=(),
                allow_early_resolve: bool = False, timing_slot=None, **kwargs):
    """Launch kernel ``fn`` as one task of ``core_num`` blocks (``pl.get_block_idx()`` tells each its index)."""
    if core_num is None:
        raise OperationTypeError("pl.spmd_submit needs core_num=<block count> (a keyword: the positional "
                                 "arguments are the kernel's)")
    n = as_int(core_num, "pl.spmd_submit core_num")
    return context.current().submit(fn, args, kwargs, _task_ids(deps, "pl.spmd_submit"), blocks=n,
                                    dumps=list(dumps or ()))


class SpmdRegion(Region):
    """``pl.spmd(n)``: ``for i in pl.spmd(n)`` iterates block indices; ``with pl.spmd(n) [as tid]`` is one task of
    n blocks (each kernel call in it runs once per block)."""

    def __iter__(self):
        if self.deps:
            raise OperationValueError("pl.spmd() does not accept 'deps=' here: only `with pl.spmd(n, deps=[...]) "
                                      "as tid:` names a task that can wait; bind the region with `as tid`")
        return iter(context.current().spmd(self.blocks))


def spmd(n, *, name=None, name_hint=None, deps=None, predicate=None, **options) -> SpmdRegion:
    """``pl.spmd(n)``: blocks ``0..n-1`` (see :class:`SpmdRegion`)."""
    options.update(mixed.region_options(options.pop("optimizations", None), "pl.spmd"))
    return SpmdRegion("spmd", None, None, _task_ids(deps, "pl.spmd"), name_hint or name,
                      as_int(n, "pl.spmd block count"), options)


def dump_tag(tensor):
    """``pl.dump_tag(t)``: mark ``t`` for the selective dump in every later task that takes it
    (``RunConfig(enable_dump_args=1)`` writes those tensors as the tasks leave them); returns ``t``."""
    context.current().dump_tag(tensor)
    return tensor


def no_dep(tensor):
    """``pl.no_dep(t)``: leave argument ``t`` of the task being submitted out of its dependency tracking."""
    context.current().exclude_from_deps(tensor)
    return tensor


def _task_ids(deps, op: str) -> list:
    """``deps=``: task ids, or arrays of them (``pl.array`` of ``pl.TASK_ID``), flattened."""
    out = []
    for d in deps or ():
        if getattr(d, "dtype", None) is dt.TASK_ID and hasattr(d, "values"):
            out.extend(t for t in d.values.tolist() if t >= 0)  # a TASK_ID array: the ids stored in it
            continue
        items = list(d) if hasattr(d, "__iter__") and not isinstance(d, (str, bytes)) else [d]
        for x in items:
            if x is None:
                continue
            try:
                out.append(x.__index__())
            except (AttributeError, TypeError):
                raise OperationTypeError(f"{op}: deps= entries must be task ids (from `as tid` or pl.submit), "
                                         f"got {x!r}") from None
    return out


def get_block_idx():
    """Return the index of the running block inside ``pl.spmd`` (0 outside)."""
    return context.current().block_idx()


def get_block_num():
    """Return the number of blocks of the running ``pl.spmd`` (1 outside)."""
    return context.current().block_num()
