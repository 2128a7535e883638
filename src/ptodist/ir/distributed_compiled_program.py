"""``pypto.ir.distributed_compiled_program``: the compiled program and its device configuration."""

from __future__ import annotations

from ..config import DistributedConfig
from ..runtime.program import CompiledProgram

DistributedCompiledProgram = CompiledProgram

__all__ = ["DistributedCompiledProgram", "DistributedConfig"]
