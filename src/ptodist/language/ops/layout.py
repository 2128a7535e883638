"""Shape and layout: ``reshape``, ``slice``, ``assemble``, ``cast`` ..."""

from __future__ import annotations

from .. import memory_ops as _m
from .. import tile_ops as _t
from .registry import ANY, op

_SHAPE = "Shape and layout"

op("reshape", family=_SHAPE, dtypes=ANY)(_t.reshape)
op("cast", family=_SHAPE, dtypes=ANY)(_t.cast)
op("assemble", family=_SHAPE, dtypes=ANY)(_t.assemble)
op("slice", family=_SHAPE, dtypes=ANY, levels=("tile",))(_m.slice)
