"""Creation: ``create_tensor``, ``full``, ``const`` ..."""

from __future__ import annotations

from .. import memory_ops as _m
from ..scalar import const
from .registry import ANY, op

_NEW = "Creation"

op("create_tensor", family=_NEW, dtypes=ANY, levels=("tensor",))(_m.create_tensor)
op("full", family=_NEW, dtypes=ANY, levels=("tile",))(_m.full)
op("const", family=_NEW, dtypes=ANY, levels=("tile",))(const)
