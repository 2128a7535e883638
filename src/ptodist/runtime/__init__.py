"""Running programs: configuration, compiled programs, rank execution (``pypto.runtime``)."""

from __future__ import annotations

from .config import DistributedConfig, RunConfig

__all__ = ["DistributedConfig", "RunConfig"]
