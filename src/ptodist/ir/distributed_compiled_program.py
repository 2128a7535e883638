"""``pypto.ir.distributed_compiled_program``: the compiled program and its device configuration."""

from __future__ import annotations

from ..config import DistributedConfig
from ..runtime import artifacts
from ..runtime.program import CompiledProgram

DistributedCompiledProgram = CompiledProgram
_META_SCHEMA = artifacts.SCHEMA  # the schema of distributed_meta.json (upstream's name)

__all__ = ["DistributedCompiledProgram", "DistributedConfig"]
