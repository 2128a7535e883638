"""A program as upstream's ``ir.Program`` shows it: its functions by name, each with its type, level, role,
parameters and directions; ``as_python()`` prints it.

ptodist runs a program's Python functions as written, so there is no lowered IR to show: the view reads the
functions themselves (their annotations and source), and printing a program prints its source.
"""

from __future__ import annotations

import ast
import enum
import inspect
import textwrap
from dataclasses import dataclass

from ..language.functions import EntryFunction, Function, FunctionType, Kind, Level, Program, Role
from ..language.types import Direction, ParamSpec
from ..source import is_internal
from .checks import reachable_functions


class ParamDirection(enum.Enum):
    """A parameter's direction, as upstream names it (``pl.Tensor``: In, ``pl.Out``: Out, ``pl.InOut``: InOut)."""

    In = "In"
    Out = "Out"
    InOut = "InOut"


_DIRECTIONS = {Direction.IN: ParamDirection.In, Direction.OUT: ParamDirection.Out,
               Direction.INOUT: ParamDirection.InOut}
# The FunctionType a function declared without ``type=`` has, by what it is.
_KIND_TYPES = {Kind.KERNEL: FunctionType.InCore, Kind.ORCHESTRATION: FunctionType.Orchestration,
               Kind.HOST: FunctionType.Opaque, Kind.INLINE: FunctionType.Inline, Kind.SUBWORKER: FunctionType.Opaque}


@dataclass(frozen=True)
class ParamView:
    """One parameter: ``name_hint`` (upstream's name for it), ``type`` (its annotation's type, None when bare) and
    ``direction``."""

    name_hint: str
    type: object
    direction: ParamDirection
    kind: str  # "tensor", "scalar" or "any" (unannotated)

    @property
    def name(self) -> str:
        return self.name_hint


class FunctionView:
    """One function of a program: ``name``, ``func_type``, ``level``, ``role``, ``params``, ``param_directions``,
    ``return_types``; ``source`` is its Python text."""

    def __init__(self, function: Function):
        self.function = function

    @property
    def name(self) -> str:
        return self.function.name

    @property
    def func_type(self) -> FunctionType:
        declared = self.function.options.get("type")
        return declared if isinstance(declared, FunctionType) else _KIND_TYPES[self.function.kind]

    @property
    def level(self) -> Level | None:
        declared = self.function.options.get("level")
        if isinstance(declared, Level):
            return declared
        return Level.HOST if self.function.kind is Kind.HOST else None

    @property
    def role(self) -> Role | None:
        declared = self.function.options.get("role")
        if isinstance(declared, Role):
            return declared
        if self.function.kind is Kind.HOST:
            return Role.Orchestrator
        return Role.SubWorker if self.function.kind is Kind.SUBWORKER else None

    @property
    def params(self) -> list[ParamView]:
        return [_param(p) for p in self.function.params]

    @property
    def param_directions(self) -> list[ParamDirection]:
        return [p.direction for p in self.params]

    @property
    def return_types(self) -> list:
        """The types the function declares it returns (its return annotation; a tuple of them for several); one
        ``None`` per value when it returns a value without declaring its type."""
        return return_types(self.function)

    @property
    def location(self) -> str:
        return self.function.location

    @property
    def source(self) -> str:
        """The function's Python text, dedented (decorators included)."""
        return function_source(self.function)

    def as_python(self) -> str:
        return self.source

    def __repr__(self) -> str:
        return f"<Function {self.name}: {self.func_type} at {self.location}>"


def _param(p: ParamSpec) -> ParamView:
    return ParamView(p.name, p.ttype, _DIRECTIONS[p.direction], p.kind)


def function_source(function: Function) -> str:
    """``function``'s Python text, dedented; its ``def`` line alone when the source cannot be read."""
    try:
        return textwrap.dedent(inspect.getsource(function.fn))
    except (OSError, TypeError):
        return f"# {function.name}: source not available ({function.location})\n"


def return_types(function: Function) -> list:
    """What ``function`` returns: its return annotation's types, else one ``None`` per value a ``return`` gives."""
    ann = inspect.signature(function.fn).return_annotation
    if ann is not inspect.Signature.empty and ann is not None:
        if isinstance(ann, str):
            try:
                ann = inspect.get_annotations(function.fn, eval_str=True,
                                              locals=dict(function.scope)).get("return", ann)
            except Exception:  # an annotation only the user's names can evaluate: its text is the type
                pass
        return list(ann) if isinstance(ann, tuple) else [ann]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function.fn)))
    except (OSError, TypeError, SyntaxError):
        return []
    fn = tree.body[0]
    for node in _own_nodes(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            return [None] * (len(node.value.elts) if isinstance(node.value, ast.Tuple) else 1)
    return []


def _own_nodes(fn: ast.AST):
    """The nodes of ``fn``'s body, not of functions or classes nested in it."""
    todo = list(getattr(fn, "body", []))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def entry_target(entry: EntryFunction) -> Function:
    """The user's function an L2 entry runs on its chip: its orchestration, or a kernel compiled on its own (whose
    orchestration is ptodist's one-call wrapper)."""
    if entry.orchestration.fn is entry.fn:
        return entry.orchestration
    return Function(entry.fn, Kind.KERNEL, entry.bound_self, entry.options, entry.scope)


def user_functions(host: Function, extra=()) -> list[Function]:
    """The program's own functions: ``host`` and what its code reaches, with an L2 entry as the user's function it
    stands for, by name."""
    out = {}
    for f in reachable_functions(host, extra):
        if isinstance(f, EntryFunction):
            f = entry_target(f)
        if not is_internal(f.fn.__code__.co_filename):
            out.setdefault(f.name, f)
    return [out[name] for name in sorted(out)]


class ProgramView:
    """A program's functions as upstream's ``ir.Program`` lists them: ``functions`` (name -> function, sorted by
    name), ``get_function(name)`` and ``as_python()``."""

    def __init__(self, name: str, functions: list[Function], program: Program | None = None):
        self.name = name
        self.program = program
        self.functions: dict[str, FunctionView] = {f.name: FunctionView(f) for f in functions}

    def get_function(self, name: str) -> FunctionView | None:
        """The function called ``name``, or None (as upstream's ``Program.get_function``)."""
        return self.functions.get(name)

    def as_python(self) -> str:
        """The program's Python source: a ``@pl.program`` class as written, else each function's text (by name)."""
        if self.program is not None:
            try:
                return textwrap.dedent(inspect.getsource(self.program.cls))
            except (OSError, TypeError):
                pass
        return "\n\n".join(f.source.rstrip("\n") for f in self.functions.values()) + "\n"

    def __repr__(self) -> str:
        return f"<Program {self.name}: {', '.join(self.functions)}>"


def python_print(node, prefix: str = "pl", **options) -> str:
    """Print a program (a compiled program, a ``@pl.program`` class, a ``@pl.jit`` function or one of a program's
    functions) as Python text: ptodist runs the Python as written, so this is its source.  ``prefix`` and the
    printer's other options shape upstream's IR text and change nothing here."""
    if hasattr(node, "as_python"):
        return node.as_python()
    if isinstance(node, Program):
        return ProgramView(node.name, [], node).as_python()
    if isinstance(node, Function):
        return function_source(node)
    from ..errors import ApiTypeError

    raise ApiTypeError(f"python_print(): expects a program (ir.compile(...), a @pl.program class, a @pl.jit function "
                       f"or one of a program's functions), got {type(node).__name__}")
