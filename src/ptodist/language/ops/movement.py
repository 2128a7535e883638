"""Data movement: ``load``, ``store``, ``move``, ``read``, ``write`` (the running context gives them meaning)."""

from __future__ import annotations

from .. import memory_ops as _m
from .. import tile_ops as _t
from .registry import ANY, op

_MOVE = "Data movement"

op("load", family=_MOVE, reach="pl(t)", dtypes=ANY, levels=("tile",))(_m.load)
op("store", family=_MOVE, reach="pl(t)", dtypes=ANY, levels=("tile",))(_m.store)
op("move", family=_MOVE, reach="pl(t)", dtypes=ANY, levels=("tile",))(_t.move)
op("read", family="Shape and layout", dtypes=ANY, levels=("tensor",))(_m.read)
op("write", family="Shape and layout", dtypes=ANY, levels=("tensor",))(_m.write)
