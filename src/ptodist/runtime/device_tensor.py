"""``pypto.runtime.device_tensor``: handles of tensors resident in a worker's ranks."""

from __future__ import annotations

from .worker.handles import DeviceTensor, StackedDeviceTensor

__all__ = ["DeviceTensor", "StackedDeviceTensor"]
