"""Linear algebra: ``matmul`` and its families; low-precision inputs accumulate in FP32, integers in INT32."""

from __future__ import annotations

from .. import tile_ops as _t
from .registry import NUMERIC, op

_LA = "Linear algebra"

op("matmul", family=_LA, dtypes=NUMERIC)(_t.matmul)
