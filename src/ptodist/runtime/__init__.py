"""Running programs: configuration, compiled programs, rank execution (``pypto.runtime``)."""

from __future__ import annotations

from ..config import DistributedConfig, RunConfig
from . import compile_entry  # noqa: F401 - hands the language Function.compile's compiler
from .chip_worker import BenchmarkStats, ChipRegistrationHandle, ChipWorker, benchmark, run
from .log_config import configure_log, log_level
from .runner import RunResult, compile_program, execute_compiled
from .tensor_spec import ScalarSpec, TensorSpec
from .worker import (
           DeviceTensor,
           DistributedWorker,
           RegistrationHandle,
           RunHandle,
           StackedDeviceTensor,
           Worker,
           shared_array,
)

__all__ = ["BenchmarkStats", "ChipRegistrationHandle", "ChipWorker", "DeviceTensor", "DistributedConfig",
           "DistributedWorker", "RegistrationHandle", "RunConfig", "RunHandle", "RunResult", "ScalarSpec",
           "StackedDeviceTensor", "TensorSpec", "Worker", "benchmark", "compile_program", "configure_log",
           "execute_compiled", "log_level", "run", "shared_array"]
