"""Comparison and selection: ``maximum``, ``minimum`` ..."""

from __future__ import annotations

from .. import tile_ops as _t
from .registry import op

_CMP = "Comparison and selection"

op("maximum", family=_CMP, scalar="maximums", scalar_fn=lambda a, b: a if a >= b else b)(_t.maximum)
op("minimum", family=_CMP, scalar="minimums", scalar_fn=lambda a, b: a if a <= b else b)(_t.minimum)
