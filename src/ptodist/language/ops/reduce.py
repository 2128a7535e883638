"""Reductions: row reductions collapse the last axis (kept as size 1), column reductions the first."""

from __future__ import annotations

from .. import tile_ops as _t
from .registry import NUMERIC, op

_RED = "Reductions"

op("row_sum", family=_RED, dtypes=NUMERIC)(_t.row_sum)
op("row_max", family=_RED, dtypes=NUMERIC)(_t.row_max)
op("row_min", family=_RED, dtypes=NUMERIC)(_t.row_min)
