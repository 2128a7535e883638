"""Programs and functions from source text: ``pl.parse``, ``pl.loads``, ``pl.parse_program``, ``pl.loads_program``.

The text is ordinary ptodist source: it is compiled as a module of its own (``pl`` and ``pld`` already
imported), with its lines kept where ``inspect`` and tracebacks find them, so that the object it defines
runs exactly like one defined in a file: its ``pl.at`` regions are outlined, its ``pl.while_`` loops stop at
their ``pl.cond``, and every message names the text's own lines.  A dimension name an annotation uses
without defining it (``pl.Tensor[[M, 64], pl.FP32]``) is ``pl.dynamic("M")``, as in printed IR.

The text's name is ``filename``; the default ``"<string>"`` becomes ``"<string:<hash>>"`` (the hash of the
text), so that two texts never share a name, nor the lines a message quotes.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import linecache
import sys
import types

from ..errors import ProgramSyntaxError, ProgramValueError, PtodistError
from ..source import register_text
from .functions import Function, FunctionType, InlineFunction, Level, Program, Role

_ENUMS = {"type": FunctionType, "level": Level, "role": Role}


def parse(code: str, filename: str = "<string>", source_map=None) -> Function | Program:
    """Define the one ``@pl.program`` class or program function in ``code`` and return it.

    Args:
        code: ptodist source text; ``pl`` and ``pld`` need no import.
        filename: the name messages give the text (default: ``<string:<hash of code>>``).
        source_map: accepted for compatibility (a map from generated lines to original ones); unused.

    Raises:
        ProgramSyntaxError: the text does not compile, a decorator names an unknown enum value, or defining
            its objects failed (the message names the text's line).
        ProgramValueError: the text defines no program or function, or more than one.
    """
    if not isinstance(code, str):
        raise ProgramValueError(f"pl.parse(code): code must be the program's source text (a str), got "
                                f"{type(code).__name__}")
    digest = hashlib.sha1(f"{filename}\0{code}".encode()).hexdigest()[:12]
    name = f"<string:{digest[:8]}>" if filename == "<string>" else filename
    linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
    register_text(name)
    try:
        compiled = compile(code, name, "exec")
    except SyntaxError as e:
        raise ProgramSyntaxError(f"Failed to compile code from {name}: {e.msg} at {name}:{e.lineno}; fix the "
                                 "text's Python syntax") from None
    tree = ast.parse(code, name)
    _check_decorators(tree, name)

    from .. import language as pl  # noqa: PLC0415
    from . import distributed as pld  # noqa: PLC0415  (pld imports this package)

    module_name = f"_ptodist_text_{digest}"
    module = types.ModuleType(module_name)
    module.__file__ = name
    module.pl, module.pld = pl, pld
    for dim in _undefined_dims(tree, module.__dict__):
        module.__dict__[dim] = pl.dynamic(dim)
    # Kept registered: the objects it defines are found by their module (pickling, inspect) as long as they live.
    sys.modules[module_name] = module
    try:
        exec(compiled, module.__dict__)
    except PtodistError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as e:
        sys.modules.pop(module_name, None)
        line = _last_line(e.__traceback__, name)
        where = f" at {name}:{line}" if line is not None else f" in {name}"
        raise ProgramSyntaxError(f"{type(e).__name__}: {e}{where} (while the text defined its objects)") from e

    found = [(key, v) for key, v in module.__dict__.items() if _defined_here(v, name, module_name)]
    if not found:
        raise ProgramValueError(
            f"No @pl.function or @pl.program found in {name}. Make sure the text defines a function decorated "
            "with @pl.function (or @pl.jit, @pl.jit.incore, ...) or a class decorated with @pl.program.")
    if len(found) > 1:
        names = ", ".join(key for key, _ in found)
        raise ProgramValueError(
            f"Multiple functions/programs found in {name}: {names}. pl.parse() can only parse code containing a "
            "single function or program: gather the functions in one @pl.program class, or parse them from "
            "separate texts.")
    return found[0][1]


def loads(filepath: str) -> Function | Program:
    """Read ``filepath`` and :func:`parse` it; messages name the file's lines."""
    with open(filepath, encoding="utf-8") as f:
        code = f.read()
    return parse(code, filename=str(filepath))


def parse_program(code: str, filename: str = "<string>") -> Program:
    """:func:`parse` text that must define a ``@pl.program`` class."""
    return _program(parse(code, filename), filename)


def loads_program(filepath: str) -> Program:
    """:func:`loads` a file that must define a ``@pl.program`` class."""
    return _program(loads(filepath), filepath)


def _program(result, filename: str) -> Program:
    if not isinstance(result, Program):
        raise ProgramValueError(
            f"Expected @pl.program but found @pl.function in {filename} ({result.name} at {result.location}). "
            "Use pl.parse() for "
            "auto-detection or ensure your code contains @pl.program.")
    return result


def _defined_here(value, name: str, module_name: str) -> bool:
    """Whether ``value`` is a program or a (non-inline) program function the text itself defines."""
    if isinstance(value, Program):
        return value.cls.__module__ == module_name
    if isinstance(value, Function) and not isinstance(value, InlineFunction):
        return getattr(value.fn, "__code__", None) is not None and value.fn.__code__.co_filename == name
    return False


def _check_decorators(tree: ast.AST, name: str) -> None:
    """``@pl.function(type=pl.FunctionType.X)`` (and ``level=``, ``role=``) with an unknown ``X``: say which
    values exist, before running the text turns it into a bare AttributeError."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr == "function"):
                continue
            for kw in dec.keywords:
                enum = _ENUMS.get(kw.arg)
                value = kw.value
                if enum is None or not isinstance(value, ast.Attribute):
                    continue
                if value.attr not in enum.__members__:
                    valid = ", ".join(sorted(enum.__members__))
                    raise ProgramSyntaxError(
                        f"Unknown {enum.__name__} value: {value.attr} at {name}:{value.lineno} "
                        f"({kw.arg}= of @pl.function on {node.name}); valid values: {valid}")


def _undefined_dims(tree: ast.AST, namespace: dict) -> list[str]:
    """Names the text's annotations read that nothing defines: its dynamic dimensions."""
    bound = set(namespace) | set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    annotations = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    found = []
    for ann in annotations:
        for n in ast.walk(ann):
            if isinstance(n, ast.Name) and n.id not in bound and not n.id.startswith("__") and n.id not in found:
                found.append(n.id)
    return found


def _last_line(tb, name: str) -> int | None:
    """The innermost line of the traceback ``tb`` in the text ``name``."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == name:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
