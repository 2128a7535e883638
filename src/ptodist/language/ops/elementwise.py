"""Elementwise arithmetic and math: ``add`` ... ``div`` and their scalar forms, ``neg``, ``abs``, ``exp`` ...

The binary operators keep the tile's element type, as the device does; integer ``div`` truncates toward zero.
"""

from __future__ import annotations

from .. import tile_ops as _t
from .registry import FLOATS, NUMERIC, op

_ARITH = "Elementwise arithmetic"
_MATH = "Math"

op("add", family=_ARITH, scalar="adds", scalar_fn=lambda a, b: a + b)(_t.add)
op("sub", family=_ARITH, scalar="subs", scalar_fn=lambda a, b: a - b)(_t.sub)
op("mul", family=_ARITH, scalar="muls", scalar_fn=lambda a, b: a * b)(_t.mul)
op("div", family=_ARITH, scalar="divs", scalar_fn=lambda a, b: a / b)(_t.div)
# The scalar-operand forms: the same arithmetic with a scalar on the right.
op("adds", family=_ARITH, scalar_fn=lambda a, b: a + b)(_t.add)
op("subs", family=_ARITH, scalar_fn=lambda a, b: a - b)(_t.sub)
op("muls", family=_ARITH, scalar_fn=lambda a, b: a * b)(_t.mul)
op("divs", family=_ARITH, scalar_fn=lambda a, b: a / b)(_t.div)
op("neg", family=_ARITH, dtypes=NUMERIC)(_t.neg)
op("abs", family=_ARITH, dtypes=NUMERIC)(_t.abs_)
op("exp", family=_MATH, dtypes=FLOATS)(_t.exp)
op("log", family=_MATH, dtypes=FLOATS)(_t.log)
op("sqrt", family=_MATH, dtypes=FLOATS, tensor_only=("high_precision",))(_t.sqrt)
op("rsqrt", family=_MATH, dtypes=FLOATS, tensor_only=("high_precision",))(_t.rsqrt)
