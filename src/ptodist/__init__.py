"""ptodist: PyPTO's distributed programming model on ordinary machines.

Public tiers: ``ptodist.language`` (``pl``) and ``ptodist.language.distributed``
(``pld``) are the language; ``ptodist.ir.compile`` and ``RunConfig`` /
``DistributedConfig`` run programs; the exceptions live in ``ptodist.errors``.
Everything else is internal.
"""

from __future__ import annotations

from .errors import (
    CheckError,
    ConfigError,
    DispatchError,
    HangError,
    KernelError,
    ProgramError,
    PtodistError,
    PtodistInternalError,
    RankError,
)
from .runtime.config import DistributedConfig, RunConfig
from .runtime.program import CompiledProgram, compile

__version__ = "0.1.0"

__all__ = [
    "CheckError", "CompiledProgram", "ConfigError", "DispatchError", "DistributedConfig", "HangError",
    "KernelError", "ProgramError", "PtodistError", "PtodistInternalError", "RankError", "RunConfig", "compile",
]
