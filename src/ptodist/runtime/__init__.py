"""Running programs: configuration, compiled programs, rank execution (``pypto.runtime``)."""

from __future__ import annotations

from ..config import DistributedConfig, RunConfig
from .chip_worker import BenchmarkStats, ChipRegistrationHandle, ChipWorker, benchmark, run
from .worker import (
           DeviceTensor,
           DistributedWorker,
           RegistrationHandle,
           RunHandle,
           StackedDeviceTensor,
           shared_array,
)

__all__ = ["BenchmarkStats", "ChipRegistrationHandle", "ChipWorker", "DeviceTensor", "DistributedConfig",
           "DistributedWorker", "RegistrationHandle", "RunConfig", "RunHandle", "StackedDeviceTensor", "benchmark",
           "run", "shared_array"]
