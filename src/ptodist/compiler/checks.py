"""Static checks: run on signatures and on the finished plan, before any rank starts.

The same shape/type checks are reused by the rank context for kernel calls,
which only exist once a rank runs the per-device orchestration.
"""

from __future__ import annotations

import ast
import inspect
import io
import linecache
import textwrap
import tokenize
import types as pytypes
import warnings
import weakref

from ..errors import (
    WINDOW_KIND_PITFALL,
    DispatchCoverageError,
    PitfallWarning,
    ProgramTypeError,
    ProgramValueError,
    ShapeError,
    TaskArgsError,
    classified,
)
from ..language.functions import EntryFunction, Function, Kind
from ..language.scalar import Scalar, scalar_value
from ..language.types import (
    DynDim,
    DynExpr,
    ParamSpec,
    TensorType,
    TensorValue,
    WindowValue,
    solve,
    unit_dims_reshape,
)
from ..source import enclosing_loop_line, param_lines
from .plan import DispatchPlan, HostTensorRef, WindowView, resolve_groups


def param_location(fn: Function, name: str) -> str:
    """``file:line`` of parameter ``name`` of ``fn``: the line its annotation is on (the ``def``'s when the
    source cannot be read)."""
    return f"{fn.file}:{param_lines(fn.fn).get(name, fn.line)}"


def param_where(fn: Function, spec: ParamSpec) -> str:
    """How messages name a parameter: ``f() parameter 'x' (declared pl.Tensor[...] at FILE:LINE)``."""
    return f"{fn.name}() parameter '{spec.name}' (declared {spec.type_name} at {param_location(fn, spec.name)})"


def check_task_args_order(fn: Function) -> None:
    """Raise TaskArgsError if a tensor parameter follows a scalar parameter.

    Only for a function the host orchestrator dispatches (a chip function given ``device=``, or a sub-worker):
    upstream PyPTO's distributed hello-rank page (docs/en/user/distributed/06-hello_rank.md, "Edge cases") and
    its debugging page (04-debugging.md, per-step pitfall 01) state that such a child's arguments are packed into
    the runtime's ``TaskArgs``, tensors first, and a scalar before a tensor fails with this message.  A kernel
    called from an orchestration takes its parameters in any order (upstream's examples/models/02_vector_dag.py
    passes ``(a, scalar, output)``): ptodist binds arguments by parameter, so nothing needs reordering.
    """
    first_scalar: ParamSpec | None = None
    for p in fn.params:
        if p.kind == "scalar" and first_scalar is None:
            first_scalar = p
        elif p.kind == "tensor" and first_scalar is not None:
            raise TaskArgsError(
                f"TaskArgs: cannot add tensor after scalar: in {fn.kind.value} '{fn.name}' ({fn.location}), "
                f"tensor parameter '{p.name}' comes after scalar parameter '{first_scalar.name}'. "
                "The host orchestrator dispatches this function, and the runtime packs a dispatched function's "
                "arguments tensors first, then scalars; move the scalar parameters "
                f"('{first_scalar.name}', ...) after the tensor parameters, and the arguments likewise. "
                "(A kernel the function calls may take its parameters in any order.)")


def reachable_functions(root: Function, extra=()) -> list[Function]:
    """Return ``root`` and every program Function its code refers to (globals, closures, nested code)."""
    seen: dict[int, Function] = {}
    todo = [root, *extra]
    while todo:
        f = todo.pop()
        if id(f.fn) in seen:
            continue
        seen[id(f.fn)] = f
        todo.extend(_referenced(f))
    return list(seen.values())


def _referenced(f: Function) -> list[Function]:
    ns = dict(f.fn.__globals__)
    if f.fn.__closure__:
        for name, cell in zip(f.fn.__code__.co_freevars, f.fn.__closure__):
            try:
                ns[name] = cell.cell_contents
            except ValueError:
                pass
    # An L2 entry runs its orchestration, which for a kernel called directly is a wrapper that calls it.
    inner = getattr(f, "orchestration", None)
    out = [inner] if isinstance(inner, Function) else []
    codes = [f.fn.__code__]
    while codes:
        code = codes.pop()
        for name in code.co_names + code.co_freevars:
            v = ns.get(name)
            if isinstance(v, Function):
                out.append(v)
        codes.extend(c for c in code.co_consts if isinstance(c, pytypes.CodeType))
    if f.bound_self is not None:
        for v in vars(type(f.bound_self)).values():
            if isinstance(v, Function) and v.fn.__name__ in _all_names(f.fn.__code__):
                out.append(v.__get__(f.bound_self))
    return out


def _all_names(code) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            names |= _all_names(c)
    return names


def check_program_signatures(host: Function, extra=()) -> None:
    """Check every function the host can reach: TaskArgs order of the functions a host orchestrator calls
    (its children; ``check_task_args_order``), and put/get arguments in kernels."""
    reached = reachable_functions(host, extra)
    for f in reached:
        if f.kind is Kind.HOST and not isinstance(f, EntryFunction):  # an L2 entry is no host orchestrator
            for child in _referenced(f):
                if child.kind in (Kind.ORCHESTRATION, Kind.SUBWORKER):
                    check_task_args_order(child)
        if f.kind is Kind.KERNEL:
            lint_transfers(f)


_REGION = ("dst_offsets", "src_offsets", "shape")


def lint_transfers(fn: Function) -> None:
    """Reject ``pld.tensor.put``/``get`` calls whose literal arguments can never be valid.

    ``pipeline=True`` needs ``chunk_rows > 0`` and ``chunk_cols > 0``; the three region
    arguments go together.  Only what the source states literally is judged here; the
    rank context checks the computed values again when the call runs.  Upstream rule: the ``pld.tensor.put`` /
    ``get`` docstrings and their ``ValueError`` checks (regions "must be provided together"; pipelining needs
    both chunk extents).
    """
    try:
        source = textwrap.dedent(inspect.getsource(fn.fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("put", "get") and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "tensor"):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue  # *args / **kwargs: the positions are not known until the call runs
        op = f"pld.tensor.{node.func.attr}"
        where = f"{op} in {fn.kind.value} '{fn.name}' at {fn.file}:{fn.line + node.lineno - 1}"
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        given = [name for i, name in enumerate(_REGION) if len(node.args) > 3 + i or name in kw]
        if 0 < len(given) < 3:
            missing = [n for n in _REGION if n not in given]
            raise ProgramValueError(f"{where}: dst_offsets, src_offsets and shape go together; "
                                    f"{', '.join(given)} given without {', '.join(missing)}.")
        pipeline = kw.get("pipeline")
        if isinstance(pipeline, ast.Constant) and pipeline.value is True:
            for name in ("chunk_rows", "chunk_cols"):
                value = kw.get(name)
                if value is None or (isinstance(value, ast.Constant) and isinstance(value.value, int)
                                     and value.value <= 0):
                    shown = "not given" if value is None else f"{value.value}"
                    raise ProgramValueError(f"{where}: pipeline=True needs chunk_rows > 0 and chunk_cols > 0; "
                                            f"{name} is {shown}.")


def value_kind(v) -> str:
    """Describe an argument for messages: its ptodist type."""
    if isinstance(v, (WindowView, WindowValue)):
        return f"a window (pld.DistributedTensor{list(v.shape)} {v.dtype.name})"
    if isinstance(v, (HostTensorRef, TensorValue)):
        return f"a tensor (pl.Tensor{list(v.shape)} {v.dtype.name})"
    if isinstance(v, (Scalar, int, float)):
        return f"a scalar ({v!r})"
    return f"a {type(v).__name__}"


def check_arg(fn: Function, spec: ParamSpec, value, loc, world: int, bindings: dict) -> None:
    """Check one argument against its parameter spec (kind, dtype, shape with dynamic binding).

    Upstream rule: 04-debugging.md, per-step pitfall 03 (a window for a ``pl.Tensor`` or the reverse is a
    compile-time type error) and "shape mismatch at compile time"; dimensions of size 1 aside (ptodist's own).
    """
    where = LazyText(lambda: f"{param_where(fn, spec)}, called at {loc}")
    if spec.kind == "scalar":
        if isinstance(value, (WindowView, WindowValue, HostTensorRef, TensorValue)):
            raise classified(ProgramTypeError(f"{where}: expected a scalar, got {value_kind(value)}."),
                             f"Pass a scalar (a Python number, or a pl.Scalar) as '{spec.name}', or annotate the "
                             "parameter as a tensor (in a function the host dispatches, tensor parameters come before "
                             "scalar ones).")
        scalar_argument(fn, spec, value, where)
        return
    if spec.kind != "tensor":
        return
    ttype: TensorType = spec.ttype
    is_window = isinstance(value, (WindowView, WindowValue))
    is_tensor = is_window or isinstance(value, (HostTensorRef, TensorValue))
    if not is_tensor:
        raise classified(ProgramTypeError(f"{where}: expected a tensor, got {value_kind(value)}."),
                         f"Pass a tensor as '{spec.name}' (a slice of a host tensor such as x[r], or a window), or "
                         "annotate the parameter pl.Scalar[...] (after the tensor parameters, in a function the host "
                         "dispatches).")
    if ttype.distributed and not is_window:
        raise classified(ProgramTypeError(
            f"{where}: expected pld.DistributedTensor (a window-bound tensor) but got {value_kind(value)}. "
            "RMA, signals and collectives need window memory: pass pld.window(buf, shape, dtype=...) here."),
            f"Pass a window as '{spec.name}': pld.window(buf, {list(value.shape)}, dtype=pl.{value.dtype.name}) of a "
            "buffer from pld.alloc_window_buffer; stage a host tensor's data into it inside the kernel.",
            pitfall=WINDOW_KIND_PITFALL)
    if not ttype.distributed and is_window:
        raise classified(ProgramTypeError(
            f"{where}: expected pl.Tensor but got {value_kind(value)}. Annotate the parameter as "
            "pld.DistributedTensor[...] (wrapped in pl.InOut[...] if written) or pass a plain tensor."),
            f"Annotate '{spec.name}' as pld.DistributedTensor[...] (pl.InOut[...] if the kernel writes it), or pass "
            "a host tensor slice instead of the window.", pitfall=WINDOW_KIND_PITFALL)
    if ttype.dtype is not None and value.dtype is not ttype.dtype and value.dtype.np_dtype != ttype.dtype.np_dtype:
        raise classified(ProgramTypeError(f"{where}: dtype mismatch: the argument is {value.dtype.name}, "
                                          f"the annotation says {ttype.dtype.name}."),
                         f"Pass a {ttype.dtype.name} argument as '{spec.name}' (or a window viewed with "
                         f"dtype=pl.{ttype.dtype.name}), or annotate the parameter pl.{value.dtype.name}.")
    if ttype.shape is not None:
        actual = tuple(value.shape)
        if len(actual) != len(ttype.shape):  # shapes that differ only by dimensions of size 1 are accepted
            actual = unit_dims_reshape(tuple(ttype.shape), actual) or actual
        bind_shape(where, ttype.shape, actual, bindings, world)


def scalar_argument(fn: Function, spec: ParamSpec, value, where=None):
    """The exact value scalar parameter ``spec`` of ``fn`` takes from ``value`` (its dtype's rule), else a
    ProgramTypeError / ProgramValueError naming the parameter, the value and the dtype's range.

    No upstream rule: refused because the device would wrap or truncate the value (a silent wrong answer).
    """
    dtype = spec.ttype.dtype if spec.ttype is not None else None
    if where is None:
        where = LazyText(lambda: param_where(fn, spec))
    return scalar_value(value, dtype, where, ProgramTypeError, ProgramValueError)


class LazyText:
    """Text made only when a message needs it: arguments are checked on every call, and formatting where
    each one was declared would cost more than the checks."""

    __slots__ = ("_make",)

    def __init__(self, make):
        self._make = make

    def __str__(self) -> str:
        return self._make()

    def __format__(self, spec: str) -> str:
        return format(self._make(), spec)


def bind_shape(where, declared: tuple, actual: tuple, bindings: dict, world: int) -> None:
    """Match ``actual`` against ``declared`` dims, binding ``pl.dynamic`` names in ``bindings``.

    ``where`` (a string, or anything whose ``str`` is one) starts every message and is kept with each binding.
    Upstream rule: one size per ``pl.dynamic`` name, and "shape mismatch at compile time" (04-debugging.md).
    """
    def decl() -> str:
        return _decl(declared)

    if len(declared) != len(actual):
        raise classified(ShapeError(f"{where}: the argument has shape {list(actual)} ({len(actual)} dims) but the "
                                    f"annotation {decl()} has {len(declared)} dims."),
                         f"Pass an argument with {len(declared)} dimensions ({decl()}), or make the annotation match "
                         f"the argument's {len(actual)}.")
    for i, (d, a) in enumerate(zip(declared, actual)):
        if isinstance(d, DynDim):
            prev = bindings.setdefault(d.name, (a, where))
            if prev[0] != a:
                raise classified(ShapeError(f"{where}: dimension {i} is pl.dynamic('{d.name}') = {a} here, but "
                                            f"'{d.name}' was bound to {prev[0]} by {prev[1]}; all uses of one name must "
                                            "agree."),
                                 f"Make every use of pl.dynamic('{d.name}') the same size ({prev[0]} or {a}), or use "
                                 "separate pl.dynamic names for sizes that differ.")
            if prev[1] is where:
                _retry_pending(bindings)
        elif isinstance(d, DynExpr):
            _bind_expr(where, i, d, a, actual, bindings)
        elif d != a:
            hint = ""
            fix = (f"Pass an argument whose dimension {i} is {d}, or change the annotation (a pl.dynamic name for "
                   "a size that varies).")
            if a == world:
                hint = (f" The argument's size {a} is the world size: the annotation hard-codes a rank count. "
                        f"Use NR = pl.dynamic(\"NR\") for dimension {i} so one program runs at any P.")
                fix = (f"Declare dimension {i} as NR = pl.dynamic(\"NR\") instead of {d}: the rank count binds "
                       "from the arguments at each call.")
            raise classified(ShapeError(f"{where}: shape mismatch in dimension {i}: the annotation {decl()} fixes it at "
                                        f"{d}, the argument has {a} (shape {list(actual)}).{hint}"), fix)


_PENDING = "__pending__"  # bindings key: expression dims whose names are not all bound yet


def _env(bindings: dict) -> dict:
    return {k: v[0] for k, v in bindings.items() if k != _PENDING}


def _bind_expr(where, i: int, d: DynExpr, a: int, actual, bindings: dict) -> None:
    """Match dimension ``i``, an expression on pl.dynamic names, against ``a``: check it, bind the one name it
    determines, or keep it for when its names are bound."""
    env = _env(bindings)
    r = solve(d, a, env)
    if r[0] == "bound":
        bindings[r[1]] = (r[2], where)
        _retry_pending(bindings)
    elif r[0] == "open":
        bindings.setdefault(_PENDING, []).append((where, i, d, a, tuple(actual)))
    elif r[0] == "mismatch":
        values = ", ".join(f"{n} = {env[n]}" for n in d.names() if n in env)
        got = f"{d} = {r[1]} ({values})"
        raise classified(ShapeError(f"{where}: dimension {i} is {got}, but the argument has {a} (shape "
                                    f"{list(actual)})."),
                         f"Pass an argument whose dimension {i} is {d} for the sizes the other arguments bind, or "
                         "change the annotation.")


def _retry_pending(bindings: dict) -> None:
    pending = bindings.get(_PENDING)
    if pending:
        bindings[_PENDING] = []
        for where, i, d, a, actual in pending:
            _bind_expr(where, i, d, a, actual, bindings)


def finish_bindings(bindings: dict) -> None:
    """Every expression dim must end up determined: ShapeError naming the pl.dynamic names nothing binds.

    Not an upstream rule: without a value for the name ptodist cannot make the outputs or check the dims.
    """
    _retry_pending(bindings)
    pending = bindings.get(_PENDING)
    if not pending:
        return
    where, i, d, a, actual = pending[0]
    env = _env(bindings)
    missing = [n for n in d.names() if n not in env]
    names = ", ".join(f"'{n}'" for n in missing)
    one = len(missing) == 1
    raise classified(ShapeError(
        f"{where}: dimension {i} is {d} = {a} (shape {list(actual)}), but pl.dynamic {names} cannot be bound: "
        f"{'it is' if one else 'they are'} not any argument's dimension on {'its' if one else 'their'} own, and "
        f"{d} = {a} does not determine {'it' if one else 'them'}."),
        f"Annotate a dimension of some parameter with {missing[0]} alone (e.g. pl.Tensor[[{missing[0]}, ...], "
        "...]) so the argument shapes bind it.")


def check_dispatch_args(fn: Function, values: list, loc, world: int, child: bool = True) -> None:
    """Check one ``f(..., device=r)`` dispatch against the per-device function's signature.

    ``child``: ``fn`` is a function of the program's own that a host orchestrator dispatches (its TaskArgs order is
    checked); False for an L2 program's orchestration and for a chip region ptodist outlined, whose parameters
    no runtime packs.
    """
    if child:
        check_task_args_order(fn)
    bindings: dict = {}
    for spec, v in zip(fn.params, values):
        if isinstance(v, UnresolvedResult):
            raise v.error()
        check_arg(fn, spec, v, loc, world, bindings)
    finish_bindings(bindings)


def check_coverage(plan: DispatchPlan, host: Function, commless: int = 0) -> None:
    """Every rank must be dispatched (the loop trip count must equal len(device_ids)), and every
    slice of a host tensor the dispatch loop splits per rank must go to a rank (``check_rank_slices``).

    Upstream rule: 04-debugging.md, fatal pitfall "dispatch loop trip count != len(device_ids)"
    (``MaterializeCommDomainScopes`` requires the ``device=r`` loop to cover ``[0, N)``).

    ``commless``: how many chip calls were made without ``device=``.  Those go round-robin over the chips,
    so a program that makes fewer of them than there are chips leaves some idle on purpose: then only a
    plan that dispatched nothing at all is refused.
    """
    resolve_groups(plan)  # idempotent: a worker's planner resolves the comm domains here
    commless = max(commless, plan.commless)
    missing = [r for r in range(plan.world) if not plan.tasks[r]]
    if not missing or (commless and len(missing) < plan.world):
        check_rank_slices(plan, host)
        return
    covered = [r for r in range(plan.world) if plan.tasks[r]]
    if not covered:
        call = _dispatch_call_line(host)
        loop = enclosing_loop_line(host.file, call) if call is not None else None
        extra = ""
        locations = [host.location]
        if loop is not None:
            extra = (f" The dispatch at {host.file}:{call} is in the loop at {host.file}:{loop} "
                     f"(`{_line_text(host.file, loop)}`), which ran no iteration.")
            locations = [f"{host.file}:{loop}", f"{host.file}:{call}", host.location]
        raise classified(DispatchCoverageError(
            f"host orchestrator '{host.name}' ({host.location}) dispatched nothing: call the per-device function "
            f"with device=r for every rank.{extra}"),
            "Dispatch every rank: `for r in pl.range(pld.world_size()): per_rank(..., device=r)`.", locations)
    file, _, line = plan.tasks[covered[0]][0].location.rpartition(":")
    loop = enclosing_loop_line(file, int(line)) if file and line.isdigit() else None
    if loop is not None:
        at = f"{file}:{loop}"
        loop_text = f" The dispatch loop at {at}, `{_line_text(file, loop)}`, must cover [0, world)"
        fix = f"Make the loop at {at} run over every rank: `for r in pl.range(pld.world_size()):`."
    else:
        at = f"{file}:{line}" if file else host.location
        loop_text = (f" The dispatch at {at} is not in a loop; the dispatches must cover [0, world)" if file else
                     " The dispatch loop must cover [0, world)")
        fix = (f"Put the dispatch at {at} in `for r in pl.range(pld.world_size()):` with device=r, so that every "
               "rank gets one.")
    raise classified(DispatchCoverageError(
        f"host orchestrator '{host.name}' ({host.location}) dispatched ranks {covered} but never ranks "
        f"{missing} (devices {[plan.device_ids[r] for r in missing]}); world = len(device_ids) = {plan.world}."
        f"{loop_text}: write `for r in pl.range(pld.world_size()):`."), fix, [at, host.location])


def _line_text(file: str, line: int) -> str:
    """The source text of a line, without its comment."""
    text = linecache.getline(file, line)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                text = text[:tok.start[1]]
                break
    except (tokenize.TokenError, SyntaxError):
        pass
    return text.strip()


def _dispatch_call_line(host: Function) -> int | None:
    """The line of the first call with ``device=`` in the host orchestrator's source (None: none, or no source)."""
    try:
        lines, start = inspect.getsourcelines(host.fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and any(k.arg == "device" for k in n.keywords)]
    return start + min(n.lineno for n in calls) - 1 if calls else None


def check_rank_slices(plan: DispatchPlan, host: Function) -> None:
    """Warn (``PitfallWarning``) when a host tensor split per rank (rank r is given ``x[r]``) has more slices than
    ranks.

    The slices past the world are never read or written, as upstream PyPTO runs the same program; it is the
    shape of upstream's "hard-coded rank count" pitfall (04-debugging.md, per-step pitfall 07), but no upstream
    rule refuses it, so the run goes ahead.  A tensor counts as split per rank when every rank r is given
    ``x[r]...``, no dispatch is given the whole tensor, and no dispatch uses a slice past the world.  Fewer slices
    than ranks already fails at ``x[r]`` while planning (``HostTensorRef.__getitem__``).
    """
    world = plan.world
    uses: dict[int, list[tuple[int, HostTensorRef, str]]] = {}
    for r in range(world):
        for task in plan.tasks[r]:
            for a in task.args:
                if isinstance(a, HostTensorRef):
                    uses.setdefault(a.tensor.index, []).append((r, a, task.location))
    for _, refs in sorted(uses.items()):  # in parameter order
        spec = refs[0][1].tensor
        if spec.index >= len(host.params):
            continue  # a host intermediate (pl.create_tensor in the host): its shape is the program's own
        if not spec.shape or spec.shape[0] <= world:
            continue
        if any(not a.index or a.index[0] >= world for _, a, _ in refs):
            continue  # the whole tensor, or a slice past the world, is used: nothing is silently left out
        own: dict[int, str] = {}
        for r, a, loc in refs:
            if a.index[0] == r:
                own.setdefault(r, loc)
        if len(own) != world:
            continue  # not the per-rank pattern: the leading dimension is not the rank count
        _warn_rank_slices(host, spec, world, plan.device_ids, own[0])


def _warn_rank_slices(host: Function, spec, world: int, device_ids: list, loc: str) -> None:
    n = spec.shape[0]
    param = host.params[spec.index]
    declared = param.ttype.shape if isinstance(param.ttype, TensorType) else None
    where = param_where(host, param)
    locations = [param_location(host, param.name), loc]
    dim0 = declared[0] if declared else None
    unused = f"slice {world}" if n == world + 1 else f"slices {world} to {n - 1}"
    ranks = f"the world has {world} rank{'s' if world != 1 else ''} (len(device_ids) = {world}, device_ids " \
            f"{list(device_ids)})"
    split = (f"The dispatch loop gives rank r the slice {spec.name}[r] (at {loc} for rank 0), so {unused} of "
             f"{spec.name} {'is' if n == world + 1 else 'are'} never read or written (as upstream PyPTO runs it).")
    if isinstance(dim0, int):
        message = (f"{where}: dimension 0 is fixed at {dim0} by the annotation {_decl(declared)} and the argument "
                   f"has {n} slices (shape {list(spec.shape)}), but {ranks}. {split} The annotation hard-codes a "
                   f"rank count: use NR = pl.dynamic(\"NR\") for dimension 0 so one program runs at any P, and pass "
                   f"one slice per rank ({world}).")
    else:
        size = f"pl.dynamic('{dim0.name}') = {n}, bound from" if isinstance(dim0, DynDim) else f"{n} in"
        message = (f"{where}: dimension 0 is {size} the argument's shape {list(spec.shape)}, but {ranks}. {split} "
                   f"Pass one slice per rank (a leading dimension of {world}), or run on {n} devices "
                   f"(DistributedConfig(device_ids=[...]) with one device id per slice).")
    # Attributed to the parameter's line, the root cause (not to ptodist's frames).
    file, _, line = locations[0].rpartition(":")
    warnings.warn_explicit(message, PitfallWarning, file, int(line) if line.isdigit() else 0)


def _decl(declared: tuple) -> str:
    return "[" + ", ".join(str(d) for d in declared) + "]"


# -- what a chip call returns to the host ------------------------------------------------------

class UnresolvedResult:
    """What a host chip call returns when ptodist cannot tell which of the chip function's arguments its
    return values are: any use of it raises the error that says so (an unused result costs nothing)."""

    def __init__(self, message: str, fix: str):
        object.__setattr__(self, "_message", message)
        object.__setattr__(self, "_fix", fix)

    def error(self) -> ProgramTypeError:
        return classified(ProgramTypeError(self._message), self._fix)

    def __iter__(self):
        raise self.error()

    def __getitem__(self, item):
        raise self.error()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise self.error()

    def __repr__(self) -> str:
        return "<unresolved chip-call result>"


# fn.fn -> ("none",) | ("params", [param indices], is_tuple) | ("unknown", text, fix)
_RESULTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def dispatch_result(fn: Function, values: list, loc):
    """The value a host chip call ``fn(...)`` returns: the arguments its return statement names.

    A chip function returns tensors it was given (its outputs), so ``s, d = chip(a, b, out_s, out_d)`` in
    the host binds ``s`` and ``d`` to the arguments passed for ``out_s`` and ``out_d``.  When the return
    statement names parameters, those are used; otherwise the return annotation's arity is matched against
    the output parameters (``pl.Out``, then ``pl.Out``/``pl.InOut``) in declaration order.
    """
    found = _RESULTS.get(fn.fn)
    if found is None:
        found = _RESULTS[fn.fn] = _analyse_result(fn)
    if found[0] == "none":
        return None
    if found[0] == "unknown":
        return UnresolvedResult(f"{fn.name}() at {loc}: its result is used in the host, but {found[1]}", found[2])
    _, indices, is_tuple = found
    out = tuple(values[i] for i in indices)
    return out if is_tuple else out[0]


def _analyse_result(fn: Function):
    try:
        source = textwrap.dedent(inspect.getsource(fn.fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return ("unknown", f"the source of '{fn.name}' ({fn.location}) cannot be read to see what it returns.",
                "Use the arguments you passed for its outputs directly instead of its result.")
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        return ("none",)
    names = [p.name for p in fn.params]
    returns = [n for n in _own_nodes(node) if isinstance(n, ast.Return) and n.value is not None
               and not (isinstance(n.value, ast.Constant) and n.value.value is None)]
    ann = node.returns
    if not returns and ann is None:
        return ("none",)
    # 1. Every return statement names parameters (return out_s, out_d): those are the results.
    mapped = set()
    for r in returns:
        elts = r.value.elts if isinstance(r.value, ast.Tuple) else [r.value]
        if all(isinstance(e, ast.Name) and e.id in names for e in elts):
            mapped.add((tuple(names.index(e.id) for e in elts), isinstance(r.value, ast.Tuple)))
        else:
            mapped.add(None)
    if len(mapped) == 1 and None not in mapped:
        indices, is_tuple = mapped.pop()
        return ("params", list(indices), is_tuple)
    # 2. Otherwise the arity (the return annotation's, else the return statement's) against the outputs.
    count, is_tuple = _arity(ann, returns)
    outs = [i for i, p in enumerate(fn.params) if p.kind == "tensor" and p.direction.value == "out"]
    inouts = [i for i, p in enumerate(fn.params) if p.kind == "tensor" and p.direction.value != "in"]
    for group in (outs, inouts):
        if count and len(group) == count:
            return ("params", group, is_tuple)
    wanted = f"{count} value{'s' if count != 1 else ''}" if count else "a value"
    return ("unknown",
            f"'{fn.name}' ({fn.location}) returns {wanted} that ptodist cannot match to its parameters: its return "
            f"statement does not name parameters, and it has {len(outs)} pl.Out and {len(inouts)} pl.Out/pl.InOut "
            "tensor parameters.",
            f"End '{fn.name}' with `return <its output parameters>` (e.g. `return out`), or use the arguments you "
            "passed for its outputs directly in the host.")


def _own_nodes(node):
    """The nodes of a function body, not descending into nested functions, classes or lambdas."""
    todo = list(node.body)
    while todo:
        n = todo.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.append(child)


def _arity(ann, returns) -> tuple[int, bool]:
    if ann is not None:
        if isinstance(ann, ast.Subscript):
            base = ann.value
            base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if base_name in ("Tuple", "tuple"):
                elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                return len(elts), True
        if not (isinstance(ann, ast.Constant) and ann.value is None):
            return 1, False
    if returns:
        v = returns[0].value
        return (len(v.elts), True) if isinstance(v, ast.Tuple) else (1, False)
    return 0, False
