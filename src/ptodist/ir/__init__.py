"""``ptodist.ir`` (PyPTO's ``pypto.ir``): compile a program."""

from __future__ import annotations

from ..compiler.ir_view import ParamDirection, python_print
from ..config import DistributedConfig
from ..language.types import TensorView, TileView
from ..runtime.program import CompiledProgram, compile
from .pass_manager import OptimizationStrategy, PassManager

DistributedCompiledProgram = CompiledProgram

__all__ = ["CompiledProgram", "DistributedCompiledProgram", "DistributedConfig", "OptimizationStrategy", "ParamDirection",
           "PassManager", "TensorView", "TileView", "compile", "python_print"]
