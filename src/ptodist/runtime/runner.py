"""``pypto.runtime.runner``: the run configuration and the one-call ``run``."""

from __future__ import annotations

from ..config import DistributedConfig, RunConfig
from .chip_worker import run

__all__ = ["DistributedConfig", "RunConfig", "run"]
