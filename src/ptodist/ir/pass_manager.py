"""``pypto.ir.pass_manager``: the optimization strategies ``ir.compile(strategy=...)`` names.

They live in :mod:`ptodist.compiler.passes`, below the runtime whose ``compile`` checks them; this is their
upstream name.
"""

from __future__ import annotations

from ..compiler.passes import OptimizationStrategy, PassManager

__all__ = ["OptimizationStrategy", "PassManager"]
