"""Names the language's modules lack, and keywords a call left out: errors that say what was meant.

``pl.laod`` is an :class:`~ptodist.errors.UnknownNameError` (an ``AttributeError``) that names the near names
(``did you mean pl.load?``), the namespace that has the name (``pld.notify``: ``pld.system.notify``), or why
ptodist lacks one of upstream PyPTO's names.  A call that leaves out a keyword without a default
(``pld.system.notify(..., op=...)``) is an :class:`~ptodist.errors.OperationTypeError` naming what to pass.
"""

from __future__ import annotations

import difflib
import sys
import types

from ..errors import OperationTypeError, UnknownNameError
from ..source import user_location

# How programs spell each module of the language (their usual import names), for messages.
_SPELLED: dict[str, str] = {}  # module name -> "pl", "pld.system", ...


class _Required:
    """The default of a keyword a call must give (upstream declares it without a default)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _Required()


def install(module: types.ModuleType, spelled: str) -> None:
    """Give ``module`` (spelled ``spelled`` in programs: ``pl``, ``pld.system``) a ``__getattr__`` for names it
    lacks; Python calls it only after the usual lookup failed, so names it has cost nothing more."""
    _SPELLED[module.__name__] = spelled

    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):  # probes such as __path__ or __wrapped__: Python's error
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        raise unknown_name(module, name)

    module.__getattr__ = __getattr__


def _public(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return [n for n in names if not isinstance(getattr(module, n, None), types.ModuleType)
            or n in ("tile", "tensor", "array", "system")]


def _near(module: types.ModuleType, name: str) -> list[str]:
    """Spelled names close to ``name``: ``module``'s own first, then the same name in another namespace."""
    spelled = _SPELLED[module.__name__]
    close = difflib.get_close_matches(name, _public(module), n=3, cutoff=0.75)
    if not close:
        close = [n for n in _public(module) if n.lower() == name.lower()]
    near = [f"{spelled}.{n}" for n in close]
    for other, other_spelled in _SPELLED.items():
        mod = sys.modules.get(other)
        if mod is None or mod is module or other_spelled == spelled:
            continue
        if name in vars(mod) and not name.startswith("_"):
            near.append(f"{other_spelled}.{name}")
    return near


def _upstream_reason(module: types.ModuleType, name: str) -> str | None:
    """Why ptodist lacks ``name`` where upstream PyPTO's module has it (None: upstream lacks it too)."""
    from .. import compat

    upstream = "pypto" + module.__name__[len("ptodist"):]
    return compat.why_absent(upstream, name)


def unknown_name(module: types.ModuleType, name: str) -> UnknownNameError:
    """The error for ``module.name``, a name ``module`` lacks."""
    spelled = _SPELLED.get(module.__name__, module.__name__)
    loc = user_location()
    where = f" at {loc}" if loc is not None else ""
    head = f"{spelled}.{name}{where}: module '{module.__name__}' ({spelled}) has no attribute '{name}'"
    near = _near(module, name)
    why = _upstream_reason(module, name)
    if why is not None:
        why = "ptodist does not have it yet" if why == "not yet in ptodist" else f"ptodist does not: {why}"
        message = f"{head}: upstream PyPTO has {spelled}.{name}; {why}."
        fix = f"Write the program without {spelled}.{name}" + (f", or use {_either(near)}." if near else ".")
    elif near:
        message = f"{head}. Did you mean {_either(near)}?"
        fix = f"Did you mean {_either(near)}? Write it instead of {spelled}.{name}."
    else:
        message = f"{head}."
        fix = None
    e = UnknownNameError(message)
    e.name = name  # as Python's AttributeError carries it
    if fix is not None:
        e.fix = fix
    return e


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def missing_keyword(op: str, keyword: str, takes: str, fix: str) -> OperationTypeError:
    """The error for a call of ``op`` without ``keyword=``, which has no default: ``takes`` says what it takes."""
    loc = user_location()
    where = f" at {loc}" if loc is not None else ""
    e = OperationTypeError(f"{op}(){where}: missing the keyword argument {keyword}=, which has no default: "
                           f"{keyword}= takes {takes}.")
    e.fix = fix
    return e
