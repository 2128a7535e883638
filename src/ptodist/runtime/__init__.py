"""Running programs: configuration, compiled programs, rank execution (``pypto.runtime``)."""

from __future__ import annotations

from ..config import DistributedConfig, RunConfig
from .worker import DeviceTensor, DistributedWorker, RunHandle, StackedDeviceTensor, shared_array

__all__ = ["DeviceTensor", "DistributedConfig", "DistributedWorker", "RunConfig", "RunHandle", "StackedDeviceTensor",
           "shared_array"]
