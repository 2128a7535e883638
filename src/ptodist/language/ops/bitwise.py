"""Bitwise logic and shifts on integer tiles: ``and_`` ``or_`` ``xor`` ``not_``, scalar forms, ``shl``/``shr``.

Results keep the left operand's dtype.  ``shr`` is arithmetic on signed types and logical on UINT8.  A
shift amount outside ``[0, bits)`` of the shifted type raises (the device result is undefined there); for
a tile of amounts only its valid region is checked.
"""

from __future__ import annotations

import numpy as np

from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from ..scalar import Scalar
from ..tile_ops import Tile
from .compare import (
    broadcast_shape,
    common_valid,
    inside,
    need_tile,
    need_tile_operand,
    result,
    same_dtype,
    scalar_operand,
    tensor_binary,
)
from .registry import INTS, REGISTRY, _check_dtypes, _fresh, _whole, op, tensor_impl

_BIT = "Bitwise"


def _logic(name: str, fn, lhs, rhs) -> Tile:
    a = need_tile_operand(name, lhs, "lhs", name.rstrip("_") + "s")
    b = need_tile_operand(name, rhs, "rhs", name.rstrip("_") + "s")
    same_dtype(name, a, b)
    shape = broadcast_shape(name, a, b)
    return result(fn(a.data, b.data), a.dtype, common_valid(shape, a, b))


def _logic_s(name: str, fn, lhs, rhs) -> Tile:
    a = need_tile(name, lhs, "lhs")
    return result(fn(a.data, scalar_operand(name, rhs, a.dtype, bits=True)), a.dtype, a.valid_shape)


def _need_tmp(name: str, tmp, call: str) -> None:
    if tmp is None:
        raise TileTypeError(f"pl.tile.{name} needs its scratch tile: pl.tile.{call}, e.g. a tile of the "
                            "operand's shape and dtype from pl.create_tile")
    need_tile(name, tmp, "tmp")


def _xor(lhs, rhs) -> Tile:
    return _logic("xor", np.bitwise_xor, lhs, rhs)


def _xors(lhs, rhs) -> Tile:
    return _logic_s("xors", np.bitwise_xor, lhs, rhs)


def and_(lhs: Tile, rhs: Tile) -> Tile:
    """Elementwise bitwise AND of two integer tiles of one dtype."""
    return _logic("and_", np.bitwise_and, lhs, rhs)


def or_(lhs: Tile, rhs: Tile) -> Tile:
    """Elementwise bitwise OR of two integer tiles of one dtype."""
    return _logic("or_", np.bitwise_or, lhs, rhs)


def xor(lhs: Tile, rhs: Tile, tmp: Tile | None = None) -> Tile:
    """Elementwise bitwise XOR of two integer tiles of one dtype; tmp is the scratch tile the device needs."""
    _need_tmp("xor", tmp, "xor(lhs, rhs, tmp)")
    return _xor(lhs, rhs)


def ands(lhs: Tile, rhs: int | Scalar) -> Tile:
    """Elementwise bitwise AND of an integer tile and an integer scalar (wrapped to the tile's width)."""
    return _logic_s("ands", np.bitwise_and, lhs, rhs)


def ors(lhs: Tile, rhs: int | Scalar) -> Tile:
    """Elementwise bitwise OR of an integer tile and an integer scalar (wrapped to the tile's width)."""
    return _logic_s("ors", np.bitwise_or, lhs, rhs)


def xors(lhs: Tile, rhs: int | Scalar, tmp: Tile | None = None) -> Tile:
    """Elementwise bitwise XOR of an integer tile and an integer scalar; tmp is the device's scratch tile."""
    _need_tmp("xors", tmp, "xors(lhs, scalar, tmp)")
    return _xors(lhs, rhs)


def not_(tile: Tile) -> Tile:
    """Elementwise bitwise NOT of an integer tile."""
    a = need_tile("not_", tile, "the operand")
    return result(np.invert(a.data), a.dtype, a.valid_shape)


# -- shifts ---------------------------------------------------------------------------------------------


def _bad_amount(name: str, amount: int, a: Tile) -> TileValueError:
    return TileValueError(f"pl.tile.{name}: shift amount {amount} is outside [0, {a.dtype.bits - 1}] for a "
                          f"{a.dtype.name} tile; the device result is undefined there, so clamp the amount first")


def _shift(name: str, fn, lhs, rhs) -> Tile:
    a = need_tile_operand(name, lhs, "lhs", name + "s")
    b = need_tile_operand(name, rhs, "rhs", name + "s")
    shape = broadcast_shape(name, a, b)
    valid = common_valid(shape, a, b)
    amounts = np.broadcast_to(b.data.astype(np.int64), shape)
    bad = inside(shape, valid) & ((amounts < 0) | (amounts >= a.dtype.bits))
    if bad.any():
        raise _bad_amount(name, int(amounts[bad][0]), a)
    # Amounts in the padding are not the program's; clip them so they cannot fault the computation.
    safe = np.clip(amounts, 0, a.dtype.bits - 1).astype(a.dtype.np_dtype)
    return result(fn(a.data, safe), a.dtype, valid)


def _shift_s(name: str, fn, lhs, rhs) -> Tile:
    a = need_tile(name, lhs, "lhs")
    amount = int(scalar_operand(name, rhs, dt.INT64, bits=True))
    if not 0 <= amount < a.dtype.bits:
        raise _bad_amount(name, amount, a)
    return result(fn(a.data, np.asarray(amount, dtype=a.dtype.np_dtype)), a.dtype, a.valid_shape)


def shl(lhs: Tile, rhs: Tile) -> Tile:
    """Shift each element of lhs left by the matching element of the integer tile rhs (bits shifted out are lost)."""
    return _shift("shl", np.left_shift, lhs, rhs)


def shr(lhs: Tile, rhs: Tile) -> Tile:
    """Shift each element of lhs right by the matching element of rhs (arithmetic if signed, logical for UINT8)."""
    return _shift("shr", np.right_shift, lhs, rhs)


def shls(lhs: Tile, rhs: int | Scalar) -> Tile:
    """Shift every element of an integer tile left by a scalar amount in [0, bits)."""
    return _shift_s("shls", np.left_shift, lhs, rhs)


def shrs(lhs: Tile, rhs: int | Scalar) -> Tile:
    """Shift every element of an integer tile right by a scalar amount in [0, bits) (arithmetic if signed)."""
    return _shift_s("shrs", np.right_shift, lhs, rhs)


# -- registration ---------------------------------------------------------------------------------------

op("and_", family=_BIT, dtypes=INTS, scalar="ands")(and_)
op("or_", family=_BIT, dtypes=INTS, scalar="ors")(or_)
op("xor", family=_BIT, dtypes=INTS, scalar="xors", tile_only=("tmp",))(xor)
op("not_", family=_BIT, dtypes=INTS)(not_)
op("ands", family=_BIT, dtypes=INTS)(ands)
op("ors", family=_BIT, dtypes=INTS)(ors)
op("xors", family=_BIT, dtypes=INTS, tile_only=("tmp",))(xors)
op("shl", family=_BIT, dtypes=INTS, scalar="shls")(shl)
op("shr", family=_BIT, dtypes=INTS, scalar="shrs")(shr)
op("shls", family=_BIT, dtypes=INTS)(shls)
op("shrs", family=_BIT, dtypes=INTS)(shrs)
for _name in ("and_", "or_", "shl", "shr"):
    tensor_impl(_name)(tensor_binary(_name, REGISTRY[_name].fn, REGISTRY[REGISTRY[_name].scalar].fn))


def _checked(fn, name: str):
    """``fn`` under op ``name``'s dtype rule (the tensor level of xor/xors has no tmp to pass)."""
    rule = REGISTRY[name].dtypes

    def run(*args, **kwargs):
        _check_dtypes(name, rule, args)
        return fn(*args, **kwargs)

    return run


def _tensor_xors(lhs, rhs, *rest, **kwargs):
    """Elementwise bitwise XOR of an integer tensor and an integer scalar: a fresh tensor."""
    if rest or "tmp" in kwargs:
        raise TileTypeError("pl.tensor.xors: 'tmp' is tile-level only (the tensor level allocates its own "
                            "scratch); drop it, or call pl.tile.xors on tiles")
    a = _whole(lhs)
    if not isinstance(a, Tile):
        raise TileTypeError(f"pl.tensor.xors: lhs must be a tensor, got {type(lhs).__name__}")
    return _fresh(_checked(_xors, "xors")(a, rhs))


# Upstream's tensor-level xor/xors take no tmp: the scratch is allocated while lowering.
tensor_impl("xor")(tensor_binary("xor", _checked(_xor, "xor"), _checked(_xors, "xors"), tile_only=("tmp",)))
tensor_impl("xors")(_tensor_xors)
