"""ptodist: PyPTO's distributed programming model on ordinary machines.

Public tiers: ``ptodist.language`` (``pl``) and ``ptodist.language.distributed``
(``pld``) are the language; ``ptodist.ir.compile`` and ``RunConfig`` /
``DistributedConfig`` run programs, once per call or on a ``DistributedWorker``
(``compiled.prepare()``, with its resident tensors and ``shared_array`` for
numpy host tensors); the exceptions live in ``ptodist.errors``.  Everything
else is internal.
"""

from __future__ import annotations

from .config import DistributedConfig, RunConfig
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
from .runtime.program import CompiledProgram, compile
from .runtime.worker import DeviceTensor, DistributedWorker, RunHandle, StackedDeviceTensor, shared_array

__version__ = "0.1.0"

__all__ = [
    "CheckError", "CompiledProgram", "ConfigError", "DeviceTensor", "DispatchError", "DistributedConfig",
    "DistributedWorker", "HangError", "KernelError", "ProgramError", "PtodistError", "PtodistInternalError",
    "RankError", "RunConfig", "RunHandle", "StackedDeviceTensor", "compile", "shared_array",
]
