"""Collectives, written against the same notify/wait/RMA primitives users have.

One module per collective, each registering itself with ``registry.collective``; importing this package
imports them all, so every collective is registered (and installed as ``pld.tensor.<name>``) before any
is called.  ``run`` executes a checked call (``spec.Call``) on the calling rank.
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import REGISTRY
from .spec import Call

for _module in pkgutil.iter_modules(__path__):  # in name order: the status board numbers them in this order
    importlib.import_module(f"{__name__}.{_module.name}")


def run(call: Call, me: int, n: int, host: bool):
    """Run ``call`` on rank ``me`` of ``n``; return the rebound target (a barrier's: its signal)."""
    REGISTRY[call.name].run(call, me, n, host)
    return call.signal if call.target is None else call.target
