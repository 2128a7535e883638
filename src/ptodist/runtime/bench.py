"""``pypto.runtime.bench``: timing a compiled program's launches."""

from __future__ import annotations

from .chip_worker import BenchmarkStats, benchmark

__all__ = ["BenchmarkStats", "benchmark"]
