"""Program structure: ``pl.jit`` (and ``.incore``/``.host``/``.inline``), ``pl.program``/``pl.function``.

A :class:`Function` wraps the user's Python function with its kind (kernel,
per-device orchestration, host orchestrator, ...).  Calling it asks the
current context what a call means there: the planner records a dispatch, a
rank runs a task, plain Python compiles and runs a host orchestrator.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from enum import Enum

import numpy as np

from .. import context
from ..errors import DeclarationError, ProgramError, UsageError
from ..source import is_internal, user_location, where
from .regions import outlined
from .types import ParamSpec, push_scope, spec_from_annotation

# How a Function becomes a compiled program: ptodist.runtime hands it in when imported (register_compiler), so the
# language never imports the layers above it that plan and run programs.
_compiler: Callable[[Function, tuple, object], object] | None = None


def register_compiler(compile_function: Callable[[Function, tuple, object], object]) -> None:
    """Make ``compile_function(fn, args, config)`` what :meth:`Function.compile` calls to build a program."""
    global _compiler
    _compiler = compile_function


class Level(Enum):
    HOST = "HOST"
    CLUSTER = "CLUSTER"
    CHIP = "CHIP"
    CORE_GROUP = "CORE_GROUP"
    CORE = "CORE"


class Role(Enum):
    Orchestrator = "Orchestrator"
    Worker = "Worker"
    SubWorker = "SubWorker"


class FunctionType(Enum):
    InCore = "InCore"
    Orchestration = "Orchestration"
    Opaque = "Opaque"
    Inline = "Inline"
    AIC = "AIC"
    AIV = "AIV"
    Group = "Group"
    Graph = "Graph"


class Kind(Enum):
    KERNEL = "kernel"
    ORCHESTRATION = "orchestration"
    HOST = "host"
    INLINE = "inline"
    SUBWORKER = "subworker"


class Function:
    """A program function of a given kind; call it like the Python function it wraps."""

    def __init__(self, fn, kind: Kind, bound_self=None, options: dict | None = None, scope: dict | None = None):
        if not callable(fn):
            raise DeclarationError(f"a program function must wrap a Python function, got {fn!r}: put @pl.jit "
                                   "(or .incore/.host/.inline) or @pl.function directly above a def")
        self.fn = fn
        self.kind = kind
        self.bound_self = bound_self
        self.options = dict(options or {})
        # Names visible where the function was defined (a factory's locals such as `nr`), for
        # string annotations (`from __future__ import annotations`) that closures do not capture.
        self.scope = scope if scope is not None else {}
        functools.update_wrapper(self, fn)
        self._params: list[ParamSpec] | None = None
        self._bound_params: list[ParamSpec] | None = None  # the specs every method-bound copy shares
        self._runnable = None  # fn with its regions outlined, made at the first run
        # compile()'s specializations, as upstream's @pl.jit keeps them: the key of each argument signature
        # (shapes, pl.dynamic dims as None, dtypes, scalar kinds) and config -> its compiled program.  One program
        # per config serves all its signatures (it plans per shape), so its rank group and output_dir are one.
        self._cache: dict = {}
        self._programs: dict = {}  # repr(config) -> the compiled program of that config

    # -- identity -----------------------------------------------------------
    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def file(self) -> str:
        return _source_file(self.fn)

    @property
    def line(self) -> int:
        """The line of the ``def`` (``co_firstlineno`` is the first decorator's line)."""
        return _def_line(self.fn)

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def __repr__(self) -> str:
        return f"<ptodist {self.kind.value} '{self.name}'>"

    def __get__(self, instance, owner=None):
        # Class form: `self.kernel(...)` binds the program instance like a method.
        if instance is None or self.bound_self is not None or not _takes_instance(self.fn):
            return self
        bound = Function(self.fn, self.kind, instance, self.options, self.scope)
        # Every `self.kernel` access makes a copy: evaluate the annotations once, for all of them.
        if self._bound_params is None:
            self._bound_params = bound.params
        bound._params = self._bound_params
        return bound

    # -- signature ------------------------------------------------------------
    @property
    def params(self) -> list[ParamSpec]:
        """Return the parameter specs, from annotations evaluated with closure constants."""
        if self._params is None:
            self._params = _param_specs(self.fn, self._takes_self(), self.scope)
        return self._params

    def _takes_self(self) -> bool:
        return self.bound_self is not None

    def invoke(self, *args, **kwargs):
        """Run the wrapped Python function itself (the context has decided to).

        While it runs, its arguments are where the ``pl.dynamic`` names of its annotations take their values.
        """
        stack = push_scope(self, args, kwargs)
        try:
            return self._run(*args, **kwargs)
        finally:
            stack.pop()

    def _run(self, *args, **kwargs):
        fn = self._runnable
        if fn is None:
            # Control-plane functions run with their pl.at / pl.spmd regions outlined into tasks.
            # (a kernel's regions run inline, as part of its task; its pl.while_ loops are rewritten all the same)
            fn = self._runnable = outlined(self.fn, regions=self.kind is not Kind.KERNEL)
        if self.bound_self is not None:
            return fn(self.bound_self, *args, **kwargs)
        return fn(*args, **kwargs)

    def bind_arguments(self, args: tuple, kwargs: dict) -> list:
        """Return the arguments in parameter order (keywords resolved), or raise a clear TypeError."""
        if not kwargs and len(args) == _positional_arity(self.fn, self._takes_self()):
            return list(args)  # the common call: every parameter given by position, no defaults to apply
        sig = _signature(self.fn)
        try:
            if self._takes_self():
                ba = sig.bind(self.bound_self, *args, **kwargs)
                values = list(ba.arguments.values())[1:]
            else:
                ba = sig.bind(*args, **kwargs)
                values = list(ba.arguments.values())
        except TypeError as e:
            raise ProgramError(f"{self.name}() at {self.location}: {e}") from None
        ba.apply_defaults()
        return values

    # -- calls ----------------------------------------------------------------
    def __call__(self, *args, device=None, config=None, **kwargs):
        outside = context.current().kind == "python"
        if self.kind is Kind.INLINE and config is None:
            return self.invoke(*args, **kwargs)
        if config is not None and not outside:
            raise ProgramError(f"{self.name}(..., config=...) at {_caller()}: config= is for a call from plain "
                               "Python (it compiles and runs the program); inside a program call the function "
                               "without it.")
        if outside and self.kind is Kind.HOST:
            # Plain Python calling a host orchestrator: compile (for config, else the default) and run once.
            return self.compile(*args, config=config)(*args)
        if outside and self.kind in (Kind.ORCHESTRATION, Kind.KERNEL):
            # A single-device (L2) program called directly: it runs on one device, chip 0.
            return self.single_device(*args, config=config, **kwargs)
        return context.current().call_function(self, args, kwargs, device)

    def single_device(self, *args, config=None, **kwargs):
        """Compile this per-device function (or kernel) as a one-device program and run it once.

        The compiled program is kept per configuration: calling again reuses its plans (per argument shapes)
        and, on shm, the ranks it kept from the last call.
        """
        values = self.bind_arguments(args, kwargs)
        return self.compile(*values, config=config)(*values)

    def compile(self, *args, config=None):
        """Compile this function for ``config`` (args, if given, fix the shapes): a host orchestrator as it is, a
        per-device function or a kernel as a one-device program.  A second compile (or direct call) with the same
        argument signature and config compiles nothing: ``_cache`` holds one entry per signature."""
        key = self._cache_key(args, config)
        compiled = self._cache.get(key)
        if compiled is not None:
            return compiled
        compiled = self._programs.get(repr(config))
        if compiled is None:
            compiled = self._programs[repr(config)] = self._compile(args, config)
        elif args and not compiled._calls_sub_workers():
            compiled._plan_for(args)  # a new signature of a compiled program: plan it now, as a compile would
        self._cache[key] = compiled
        return compiled

    def _compile(self, args: tuple, config):
        if _compiler is None:
            raise UsageError(
                f"'{self.name}' ({self.location}): compiled{where(user_location())} before ptodist.runtime handed "
                "the language its compiler: the runtime registers it when it is imported, and that import has not "
                "finished (it failed, or this call runs while ptodist is still being imported). Import ptodist "
                "(or ptodist.runtime) first, then compile.")
        return _compiler(self, args, config)

    def _cache_key(self, args: tuple, config) -> tuple:
        """What a specialization is found by: each tensor argument's shape (a ``pl.dynamic`` dim as None) and
        dtype, each scalar's kind, and the config."""
        params = self.params
        if len(args) != len(params):  # the inputs-only form: the outputs are made
            params = [p for p in params if p.direction.value != "out"]
        parts = []
        for p, a in zip(params, args):
            shape = getattr(a, "shape", None)
            if shape is None or isinstance(a, np.generic):
                parts.append((p.name, type(a).__name__))
                continue
            dims = getattr(p.ttype, "shape", None)
            if dims is None or len(dims) != len(shape):
                dims = (None,) * len(shape)
            parts.append((p.name, tuple(None if hasattr(d, "names") else int(n) for d, n in zip(dims, shape)),
                          str(getattr(a, "dtype", None))))
        return repr(config), len(args), tuple(parts)

    def lower(self, *args, config=None):
        """The program compiled for ``args`` with its dispatch planned, not run: print it to inspect the plan
        (ptodist's form of upstream's lowered IR); ``ir.compile`` and ``pypto.runtime.run`` accept it."""
        return self.compile(*args, config=config).lower(*args)


@functools.lru_cache(maxsize=1024)
@functools.lru_cache(maxsize=4096)
def _source_file(fn) -> str:
    # A wrapper made with functools.wraps (the one-kernel orchestration of a kernel called from Python) is
    # located where the function it wraps is, as inspect finds its lines.
    fn = inspect.unwrap(fn)
    return inspect.getsourcefile(fn) or fn.__code__.co_filename


@functools.lru_cache(maxsize=4096)
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


@functools.lru_cache(maxsize=4096)
def _takes_instance(fn) -> bool:
    """Whether a program method's first parameter is the instance: one without an annotation.  A function written
    without it (`def verify(f: pl.Tensor[...])`, called `self.verify(f)`) is called with its own parameters only."""
    params = list(_signature(fn).parameters.values())
    return bool(params) and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                               inspect.Parameter.POSITIONAL_OR_KEYWORD) \
        and params[0].annotation is inspect.Parameter.empty


@functools.lru_cache(maxsize=4096)
def _positional_arity(fn, takes_self: bool) -> int:
    """The number of arguments a call passes by position when every parameter is plain; -1 otherwise."""
    params = list(_signature(fn).parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return -1
    return len(params) - (1 if takes_self else 0)


@functools.lru_cache(maxsize=4096)
def _def_line(fn) -> int:
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return fn.__code__.co_firstlineno
    for i, text in enumerate(lines):
        if text.lstrip().startswith(("def ", "async def ")):
            return start + i
    return start


def _closure_namespace(fn) -> dict:
    ns = {}
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                ns[name] = cell.cell_contents
            except ValueError:
                pass
    return ns


def _defining_scope(depth: int = 2) -> dict:
    """Return the locals of the user frames a function is being defined in (class body, then factory)."""
    scope: dict = {}
    frame = sys._getframe(depth)
    for _ in range(2):
        while frame is not None and is_internal(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None or frame.f_globals is frame.f_locals:
            break  # module level: its names are the function's globals already
        for k, v in frame.f_locals.items():
            scope.setdefault(k, v)
        frame = frame.f_back
    return scope


def _param_specs(fn, skip_self: bool, scope: dict) -> list[ParamSpec]:
    try:
        anns = inspect.get_annotations(fn, eval_str=True, locals={**scope, **_closure_namespace(fn)})
    except NameError as e:
        raise ProgramError(
            f"cannot evaluate the annotations of {fn.__name__}() at "
            f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}: {e}"
        ) from None
    specs = []
    for i, (name, p) in enumerate(inspect.signature(fn).parameters.items()):
        if i == 0 and skip_self:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        specs.append(spec_from_annotation(name, anns.get(name, inspect.Parameter.empty)))
    return specs


def _decorator(kind: Kind, fn=None, **options):
    if fn is None:
        return lambda f: Function(f, kind, options=options, scope=_defining_scope())
    return Function(fn, kind, options=options, scope=_defining_scope())


class _Jit:
    """``@pl.jit`` (per-device orchestration), ``@pl.jit.incore``, ``@pl.jit.host``, ``@pl.jit.inline``."""

    def __call__(self, fn=None, **options):
        return _decorator(Kind.ORCHESTRATION, fn, **options)

    def incore(self, fn=None, **options):
        return _decorator(Kind.KERNEL, fn, **options)

    def host(self, fn=None, **options):
        if "level" in options:
            raise DeclarationError("@pl.jit.host does not take level=: HOST is implied; remove level=")
        return _decorator(Kind.HOST, fn, **options)

    def inline(self, fn=None, **options):
        return _decorator(Kind.INLINE, fn, **options)

    def opaque(self, fn=None, **options):
        """A function of the control plane that may hold loops and ``pl.at`` regions, called by orchestrations:
        a plain call of the caller's, its regions tasks of the caller's rank."""
        return _decorator(Kind.INLINE, fn, type=FunctionType.Opaque, **options)

    def graph(self, fn=None, **options):
        """A recordable orchestration fragment (:class:`GraphFunction`)."""
        if fn is None:
            return lambda f: GraphFunction(f, options, _defining_scope())
        return GraphFunction(fn, options, _defining_scope())


jit = _Jit()


class InlineFunction(Function):
    """What ``@pl.inline`` makes: a function spliced into each caller (a kernel, an orchestration, a host).

    A call runs its body where it is called, as part of the caller (no task of its own); errors in the body
    name the body's lines.  The attributes describe its source, as upstream's do.
    """

    def __init__(self, fn, scope: dict | None = None):
        super().__init__(fn, Kind.INLINE, scope=scope)

    def __get__(self, instance, owner=None):
        return self  # a template, not a method: `@pl.inline` inside a class body takes no `self`

    @property
    def param_names(self) -> list[str]:
        return list(_signature(self.fn).parameters)

    @property
    def source_file(self) -> str:
        return self.file

    @functools.cached_property
    def _source(self) -> tuple[list[str], int]:
        try:
            return inspect.getsourcelines(self.fn)
        except (OSError, TypeError):
            return [], self.fn.__code__.co_firstlineno

    @property
    def source_lines(self) -> list[str]:
        return [line.rstrip("\n") for line in self._source[0]]

    @property
    def line_offset(self) -> int:
        return self._source[1] - 1

    @property
    def col_offset(self) -> int:
        first = next((line for line in self._source[0] if line.strip()), "")
        return len(first) - len(first.lstrip())

    @property
    def func_def(self):
        """The ``ast.FunctionDef`` of the body (None without source)."""
        import ast
        import textwrap

        if not self._source[0]:
            return None
        tree = ast.parse(textwrap.dedent("".join(self._source[0])))
        return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)

    @property
    def closure_vars(self) -> dict:
        return {**self.scope, **_closure_namespace(self.fn)}

    def __repr__(self) -> str:
        return f"<ptodist InlineFunction '{self.name}'>"


class GraphFunction(Function):
    """What ``@pl.jit.graph`` makes: an orchestration fragment a runtime records once and replays; each call is
    a ``pl.graph(<its name>)`` region, with its rules (no graph inside another, none inside a task)."""

    def __init__(self, fn, options: dict | None = None, scope: dict | None = None):
        super().__init__(fn, Kind.INLINE, options={**(options or {}), "type": FunctionType.Graph}, scope=scope)

    def invoke(self, *args, **kwargs):
        from .control import GraphScope

        with GraphScope(self.name, _caller()):
            return super().invoke(*args, **kwargs)


def inline(fn) -> InlineFunction:
    """``@pl.inline``: a helper spliced into every call site (see :class:`InlineFunction`)."""
    if not callable(fn) or isinstance(fn, Function):
        raise DeclarationError(f"@pl.inline wraps a Python function, got {fn!r}: put @pl.inline directly above a "
                               "def (it takes no arguments)")
    return InlineFunction(fn, scope=_defining_scope())


def function(fn=None, *, type: FunctionType | None = None, level: Level | None = None,
             role: Role | None = None, **options):
    """Mark a method of a ``@pl.program`` class with its kind."""
    if role is Role.SubWorker or (role is Role.Worker and level is Level.HOST):  # a host worker: a sub-worker
        kind = Kind.SUBWORKER
    elif level is Level.HOST:
        kind = Kind.HOST
    elif type in (FunctionType.InCore, FunctionType.AIC, FunctionType.AIV, FunctionType.Group):
        kind = Kind.KERNEL
    elif type is FunctionType.Orchestration or level is Level.CHIP:
        kind = Kind.ORCHESTRATION
    else:
        kind = Kind.INLINE
    return _decorator(kind, fn, type=type, level=level, role=role, **options)


class Program:
    """A ``@pl.program`` class: its functions bound to one instance of the class."""

    def __init__(self, cls):
        self.cls = cls
        self.name = cls.__name__
        self.instance = cls.__new__(cls)
        self.functions: dict[str, Function] = {}
        outer = _defining_scope(3)
        for name, value in vars(cls).items():
            if isinstance(value, Function):
                for k, v in outer.items():
                    value.scope.setdefault(k, v)
                self.functions[name] = value.__get__(self.instance, cls)
        hosts = [f for f in self.functions.values() if f.kind is Kind.HOST]
        orchs = [f for f in self.functions.values() if f.kind is Kind.ORCHESTRATION]
        # An L2 program: Orchestration functions and no host; each runs on one chip (compiled[name]).
        self.orchestrations: dict[str, Function] = {} if hosts else {f.name: f for f in
                                                                     sorted(orchs, key=lambda f: f.name)}
        if len(hosts) != 1 and not (not hosts and orchs):
            found = ", ".join(f"{f.name} ({f.location})" for f in hosts) or "none"
            extra = "" if hosts else (
                ", and no Orchestration function (@pl.function(type=pl.FunctionType.Orchestration)) for an L2 "
                "program either")
            raise ProgramError(
                f"@pl.program class {self.name} needs exactly one host orchestrator "
                f"(@pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)); found {found}{extra}"
                f" (class {self.name} at {_class_location(cls)}). "
                + ("Keep one host orchestrator; the others can be per-device functions it calls."
                   if hosts else "Add a host orchestrator that dispatches its per-device functions, or mark the "
                   "function(s) the program runs on one chip @pl.function(type=pl.FunctionType.Orchestration).")
            )
        self.host = hosts[0] if hosts else None

    def __getattr__(self, name: str):
        try:
            return self.__dict__["functions"][name]
        except KeyError:
            raise AttributeError(f"program {self.__dict__.get('name')} has no function {name!r}") from None

    def __repr__(self) -> str:
        return f"<ptodist program {self.name}>"


def program(cls):
    """Class decorator: a program whose methods are ``@pl.function``s."""
    return Program(cls)


def _class_location(cls) -> str:
    try:
        lines, start = inspect.getsourcelines(cls)
        offset = next((i for i, t in enumerate(lines) if t.lstrip().startswith("class ")), 0)
        return f"{inspect.getsourcefile(cls)}:{start + offset}"
    except (OSError, TypeError):
        return getattr(sys.modules.get(cls.__module__), "__file__", "?") or "?"


class EntryFunction(Function):
    """The host entry of an L2 program (no host orchestrator): it calls one Orchestration function, a chip
    call without ``device=``, which a one-chip program runs on chip 0.  Its parameters are the
    orchestration's."""

    def __init__(self, orchestration: Function):
        super().__init__(orchestration.fn, Kind.HOST, orchestration.bound_self, orchestration.options,
                         orchestration.scope)
        self.called = orchestration  # the function the user called: a kernel or an orchestration
        if orchestration.kind is Kind.KERNEL:
            # A kernel called directly: the chip's orchestration is the one call of it.
            orchestration = Function(_calls(orchestration), Kind.ORCHESTRATION, None, {}, orchestration.scope)
            orchestration._params = self.params
        self.orchestration = orchestration
        self._params = orchestration.params

    def __get__(self, instance, owner=None):
        return self

    def _run(self, *args, **kwargs):
        return self.orchestration(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<ptodist L2 entry of orchestration '{self.name}'>"


def _calls(kernel: Function):
    """A plain function with ``kernel``'s signature that calls it (a one-kernel orchestration body)."""

    @functools.wraps(kernel.fn)
    def orchestration(*args, **kwargs):
        return kernel(*args, **kwargs)

    if kernel.bound_self is not None:  # the signature without `self`
        orchestration.__signature__ = inspect.signature(functools.partial(kernel.fn, kernel.bound_self))
    return orchestration


def _caller() -> str:
    return str(user_location(3))
