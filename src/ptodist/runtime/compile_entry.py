"""``Function.compile``'s entry into the runtime: a language Function built into a :class:`CompiledProgram`.

The language sits below the runtime and never imports it; the runtime hands this entry to the language when it
is imported (:func:`ptodist.language.functions.register_compiler`), as an interpreter is handed to the builder
interface it implements rather than imported by the language.
"""

from __future__ import annotations

from ..errors import ProgramError
from ..language.functions import EntryFunction, Function, Kind, register_compiler
from .program import CompiledProgram


def compile_function(fn: Function, args: tuple, config) -> CompiledProgram:
    """Build ``fn`` for ``config`` (``args``, if given, fix the shapes): a host orchestrator as it is, a per-device
    function or a kernel as a one-device program; ProgramError for any other kind."""
    if fn.kind in (Kind.ORCHESTRATION, Kind.KERNEL):
        return CompiledProgram.build(EntryFunction(fn), config=config, example_args=args)
    if fn.kind is not Kind.HOST:
        raise ProgramError(
            f"'{fn.name}' ({fn.location}) is not a host orchestrator (its kind: {fn.kind.value}); "
            "compile the host orchestrator (the @pl.jit.host function that dispatches it with device=r)"
        )
    return CompiledProgram.build(fn, config=config, example_args=args)


register_compiler(compile_function)
