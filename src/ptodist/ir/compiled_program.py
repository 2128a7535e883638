"""``pypto.ir.compiled_program``: the compiled program, its parameters' directions and the build meta's schema."""

from __future__ import annotations

from ..compiler.ir_view import ParamDirection
from ..runtime import artifacts
from ..runtime.program import CompiledProgram

_COMPILED_META_SCHEMA = artifacts.SCHEMA  # the schema of compiled_meta.json (upstream's name)

__all__ = ["CompiledProgram", "ParamDirection"]
