"""Comparison and selection: ``maximum``/``minimum`` (and scalar forms), ``cmp``/``cmps``, ``sel``/``sels``.

On tiles, ``cmp``/``cmps`` produce the device's packed predicate mask (UINT8, one bit per element, lowest
bit = lowest column, columns padded to 32 bytes) that ``sel`` consumes; on tensors ``cmp`` gives 0/1 in the
left operand's dtype, as upstream's tensor level does.  The helpers here are shared with ``bitwise``.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from ..dtypes import DataType
from ..scalar import Scalar, _wrap
from ..tile_ops import Tile
from .registry import ANY, NUMERIC, REGISTRY, _fresh, _whole, is_tensor, op, tensor_impl

_CMP = "Comparison and selection"

# -- shared helpers (bitwise.py uses them too) ----------------------------------------------------------


def need_tile(name: str, x, what: str) -> Tile:
    """``x`` if it is a Tile; otherwise a TileTypeError naming the op and the argument."""
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.tile.{name}: {what} must be a Tile, got {type(x).__name__}; "
                            "load tensors into tiles with pl.load first")
    if x.data.ndim < 1:
        raise TileTypeError(f"pl.tile.{name}: {what} is a 0-d tile; tiles have at least one dimension")
    return x


def need_tile_operand(name: str, x, what: str, scalar_form: str) -> Tile:
    """Like :func:`need_tile`, but a number points the user at the scalar-operand form."""
    if isinstance(x, (int, float, Scalar, np.number)) and not isinstance(x, bool):
        value = x.value if isinstance(x, Scalar) else x
        raise TileTypeError(f"pl.tile.{name}: {what} is the scalar {value!r}, but {name} takes two tiles; "
                            f"for a scalar operand call pl.tile.{scalar_form} (or pl.{name}, which picks it)")
    return need_tile(name, x, what)


def same_dtype(name: str, a: Tile, b: Tile) -> None:
    """Both tiles share one element type (the device instruction has one), or a TileTypeError."""
    if a.dtype is not b.dtype:
        raise TileTypeError(f"pl.tile.{name}: operands are {a.dtype.name} and {b.dtype.name} tiles; {name} "
                            "needs one element type: convert one with pl.cast(tile, target_type=pl.<dtype>)")


def broadcast_shape(name: str, *tiles: Tile) -> tuple:
    """The shape the tiles broadcast to, or a TileValueError."""
    try:
        return tuple(np.broadcast_shapes(*(t.data.shape for t in tiles)))
    except ValueError:
        shapes = " and ".join(str(t.shape) for t in tiles)
        raise TileValueError(f"pl.tile.{name}: shapes {shapes} do not broadcast; use equal shapes, or size 1 "
                             "in a dimension to repeat it") from None


def common_valid(shape: tuple, *tiles: Tile) -> tuple:
    """The valid region of a result of ``shape``: where every operand is valid (broadcast dims do not narrow)."""
    valid = list(shape)
    for t in tiles:
        lead = len(shape) - t.data.ndim
        for i, (s, v) in enumerate(zip(t.data.shape, t.valid_shape)):
            if s == shape[lead + i]:
                valid[lead + i] = min(valid[lead + i], int(v))
    return tuple(valid)


def inside(shape: tuple, valid: tuple) -> np.ndarray:
    """Boolean array of ``shape``: True on the leading ``valid`` region."""
    m = np.zeros(shape, dtype=bool)
    m[tuple(slice(0, int(v)) for v in valid)] = True
    return m


def scalar_operand(name: str, x, dtype: DataType, *, bits: bool = False) -> np.ndarray:
    """A scalar operand as a 0-d array of the tile's type, as the device holds it next to the tile.

    Floats round to the tile's float type.  For integer tiles the value must be a whole number in the
    type's range; ``bits=True`` (the bitwise ops) takes only integers, and any value of the type's width
    read signed or unsigned (``0xFF`` or ``-1`` for an INT8 all-ones mask).
    """
    if isinstance(x, Scalar):
        if bits and x.dtype.is_float:
            raise TileTypeError(f"pl.tile.{name}: the scalar operand is a {x.dtype.name} Scalar; {name} takes "
                                "an integer scalar")
        x = x.value
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TileTypeError(f"pl.tile.{name}: the scalar operand must be a Python number or a pl.Scalar, "
                            f"got {type(x).__name__}")
    if bits and isinstance(x, float):
        raise TileTypeError(f"pl.tile.{name}: the scalar operand is the float {x!r}; {name} takes an integer "
                            "scalar")
    if dtype.is_float:
        # Through float32 so BF16/FP16 round once, from the value the device would hold in a register.
        with np.errstate(over="ignore"):
            return np.asarray(np.float32(x)).astype(dtype.np_dtype)
    if isinstance(x, float):
        if not math.isfinite(x):
            raise TileValueError(f"pl.tile.{name}: scalar {x!r} has no {dtype.name} value; pass a finite number")
        if not x.is_integer():
            raise TileTypeError(f"pl.tile.{name}: scalar {x!r} has a fraction but the tile is {dtype.name}; use "
                                "an integer, or cast the tile to a float type first with pl.cast")
        x = int(x)
    info = np.iinfo(dtype.np_dtype)
    lo, hi = int(info.min), int(info.max)
    if bits:
        lo, hi = min(lo, -(1 << (dtype.bits - 1))), max(hi, (1 << dtype.bits) - 1)
    if not lo <= x <= hi:
        raise TileValueError(f"pl.tile.{name}: scalar {x} does not fit the tile's {dtype.name} (range {lo}..{hi}); "
                             "use a value in range, or cast the tile to a wider type first with pl.cast")
    return np.asarray(_wrap(x, dtype), dtype=dtype.np_dtype)


def math_view(x: np.ndarray, dtype: DataType) -> np.ndarray:
    """``x`` in a type numpy computes exactly in: FP16/BF16 widen to FP32 (exact; round back after)."""
    return x.astype(np.float32) if dtype in (dt.FP16, dt.BF16) else x


def result(data: np.ndarray, dtype: DataType, valid: tuple) -> Tile:
    return Tile(np.ascontiguousarray(data).astype(dtype.np_dtype, copy=False), dtype, valid_shape=valid)


def mixed_levels(name: str) -> TileTypeError:
    return TileTypeError(f"pl.{name}: lhs is a tensor but rhs is a Tile; operands must be all tensors or all tiles: "
                         "pl.load the tensor into a tile, or pl.store the tile into a tensor")


def tensor_binary(name: str, tile_fn, scalar_fn, *, tile_only: tuple = ()):
    """The tensor level of a binary op: a tensor or a number on the right, a fresh tensor out."""

    def tensor_level(lhs, rhs, *rest, **kwargs):
        if rest and not tile_only:
            raise TileTypeError(f"pl.tensor.{name} takes two operands (lhs, rhs), got {2 + len(rest)}")
        bad = [k for k in kwargs if k in tile_only] or (list(tile_only[:1]) if rest else [])
        if bad:
            raise TileTypeError(f"pl.tensor.{name}: '{bad[0]}' is tile-level only (the tensor level allocates its "
                                f"own scratch); drop it, or call pl.tile.{name} on tiles")
        a = _whole(lhs)
        if not isinstance(a, Tile):
            raise TileTypeError(f"pl.tensor.{name}: lhs must be a tensor, got {type(lhs).__name__}")
        if is_tensor(rhs):
            return _fresh(tile_fn(a, _whole(rhs), **kwargs))
        if isinstance(rhs, Tile):
            raise mixed_levels(name)
        return _fresh(scalar_fn(a, rhs, **kwargs))

    tensor_level.__name__ = name
    tensor_level.__doc__ = tile_fn.__doc__
    return tensor_level


# -- maximum / minimum ----------------------------------------------------------------------------------


def _extremum(name: str, fn, lhs, rhs) -> Tile:
    a = need_tile_operand(name, lhs, "lhs", name + "s")
    b = need_tile_operand(name, rhs, "rhs", name + "s")
    same_dtype(name, a, b)
    shape = broadcast_shape(name, a, b)
    out = fn(math_view(a.data, a.dtype), math_view(b.data, b.dtype))
    return result(out, a.dtype, common_valid(shape, a, b))


def _extremum_s(name: str, fn, lhs, rhs) -> Tile:
    a = need_tile(name, lhs, "lhs")
    s = scalar_operand(name, rhs, a.dtype)
    out = fn(math_view(a.data, a.dtype), math_view(s, a.dtype))
    return result(out, a.dtype, a.valid_shape)


def maximum(lhs: Tile, rhs: Tile) -> Tile:
    """Elementwise maximum of two tiles of one dtype (broadcasting; NaN propagates)."""
    return _extremum("maximum", np.maximum, lhs, rhs)


def minimum(lhs: Tile, rhs: Tile) -> Tile:
    """Elementwise minimum of two tiles of one dtype (broadcasting; NaN propagates)."""
    return _extremum("minimum", np.minimum, lhs, rhs)


def maximums(lhs: Tile, rhs: int | float | Scalar) -> Tile:
    """Elementwise maximum of a tile and a scalar (the scalar is narrowed to the tile's dtype)."""
    return _extremum_s("maximums", np.maximum, lhs, rhs)


def minimums(lhs: Tile, rhs: int | float | Scalar) -> Tile:
    """Elementwise minimum of a tile and a scalar (the scalar is narrowed to the tile's dtype)."""
    return _extremum_s("minimums", np.minimum, lhs, rhs)


# -- cmp / cmps -----------------------------------------------------------------------------------------

CMP_NAMES = ("EQ", "NE", "LT", "LE", "GT", "GE")
_CMP_FNS = (np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal)
_CODES = ", ".join(f"{i} ({n})" for i, n in enumerate(CMP_NAMES))


def _cmp_fn(name: str, cmp_type):
    if isinstance(cmp_type, Scalar) and not cmp_type.dtype.is_float:
        cmp_type = cmp_type.value
    if isinstance(cmp_type, np.integer):
        cmp_type = int(cmp_type)
    if isinstance(cmp_type, bool) or not isinstance(cmp_type, int):
        raise TileTypeError(f"pl.tile.{name}: cmp_type must be an integer code, got {cmp_type!r}; use {_CODES}")
    if not 0 <= cmp_type < len(_CMP_FNS):
        raise TileValueError(f"pl.tile.{name}: cmp_type={cmp_type} is not a comparison code; use {_CODES}")
    return _CMP_FNS[cmp_type]


def _compare(name: str, lhs, rhs, cmp_type, scalar: bool):
    """(predicate over the broadcast shape, its valid region, lhs)."""
    fn = _cmp_fn(name, cmp_type)
    a = need_tile(name, lhs, "lhs")
    if scalar:
        s = scalar_operand(name, rhs, a.dtype)
        return fn(math_view(a.data, a.dtype), math_view(s, a.dtype)), a.valid_shape, a
    b = need_tile_operand(name, rhs, "rhs", "cmps")
    same_dtype(name, a, b)
    shape = broadcast_shape(name, a, b)
    pred = fn(math_view(a.data, a.dtype), math_view(b.data, b.dtype))
    return np.broadcast_to(pred, shape), common_valid(shape, a, b), a


def pack_mask(pred: np.ndarray, valid: tuple) -> Tile:
    """The device's packed predicate mask of ``pred``: UINT8, bit j%8 of byte j//8; bits outside ``valid`` are 0."""
    pred = pred & inside(pred.shape, valid)
    nbytes = -(-pred.shape[-1] // 8)
    width = -(-nbytes // 32) * 32
    out = np.zeros(pred.shape[:-1] + (width,), dtype=np.uint8)
    out[..., :nbytes] = np.packbits(pred, axis=-1, bitorder="little")
    return Tile(out, dt.UINT8, valid_shape=tuple(valid[:-1]) + (-(-int(valid[-1]) // 8),))


def cmp(lhs: Tile, rhs: Tile, cmp_type: int = 0) -> Tile:
    """Compare two tiles elementwise (cmp_type 0 EQ, 1 NE, 2 LT, 3 LE, 4 GT, 5 GE) into a packed UINT8 mask."""
    pred, valid, _ = _compare("cmp", lhs, rhs, cmp_type, scalar=False)
    return pack_mask(pred, valid)


def cmps(lhs: Tile, rhs: int | float | Scalar, cmp_type: int = 0) -> Tile:
    """Compare a tile with a scalar elementwise (cmp_type as for cmp) into a packed UINT8 mask."""
    pred, valid, _ = _compare("cmps", lhs, rhs, cmp_type, scalar=True)
    return pack_mask(pred, valid)


def _tensor_cmp(lhs, rhs, cmp_type: int = 0):
    """Compare a tensor with a tensor or a scalar elementwise: 0/1 in the lhs dtype, a fresh tensor."""
    a = _whole(lhs)
    if not isinstance(a, Tile):
        raise TileTypeError(f"pl.tensor.cmp: lhs must be a tensor, got {type(lhs).__name__}")
    if isinstance(rhs, Tile):
        raise mixed_levels("cmp")
    scalar = not is_tensor(rhs)
    pred, valid, _ = _compare("cmps" if scalar else "cmp", a, rhs if scalar else _whole(rhs), cmp_type, scalar)
    return _fresh(result(pred, a.dtype, valid))


# -- sel / sels -----------------------------------------------------------------------------------------


def sel(mask: Tile, lhs: Tile, rhs: Tile, tmp: Tile | None = None) -> Tile:
    """Per element, lhs where the packed mask bit (from cmp/cmps) is set, else rhs; tmp is the scratch tile."""
    m = need_tile("sel", mask, "mask")
    a = need_tile("sel", lhs, "lhs")
    b = need_tile("sel", rhs, "rhs")
    if tmp is None:
        raise TileTypeError("pl.tile.sel needs its scratch tile: pl.tile.sel(mask, lhs, rhs, tmp), e.g. "
                            "tmp = pl.create_tile([1, 32], pl.UINT8)")
    need_tile("sel", tmp, "tmp")
    for what, t in (("lhs", a), ("rhs", b)):
        if t.dtype not in NUMERIC:
            raise TileTypeError(f"pl.tile.sel: {what} is a {t.dtype.name} tile; sel selects between "
                                f"{', '.join(d.name for d in NUMERIC)} tiles")
    same_dtype("sel", a, b)
    shape = broadcast_shape("sel", a, b)
    if m.dtype is not dt.UINT8:
        raise TileTypeError(f"pl.tile.sel: mask is a {m.dtype.name} tile, but sel reads the packed UINT8 "
                            "predicate mask that pl.cmp / pl.cmps produce on tiles; build the mask with them")
    need = -(-shape[-1] // 8)
    if m.data.ndim != len(shape) or tuple(m.data.shape[:-1]) != shape[:-1] or m.data.shape[-1] < need:
        raise TileValueError(f"pl.tile.sel: mask shape {m.shape} does not cover a {list(shape)} result; a packed "
                             f"mask has the result's leading dimensions and at least {need} byte column(s) "
                             f"(8 elements per byte): pass the mask pl.cmp / pl.cmps made from same-shape tiles")
    bits = np.unpackbits(m.data, axis=-1, bitorder="little")[..., : shape[-1]].astype(bool)
    return result(np.where(bits, a.data, b.data), a.dtype, common_valid(shape, a, b))


def sels(lhs: Tile, rhs: Tile, select_mode: int | Scalar) -> Tile:
    """The whole of lhs when select_mode is 1, otherwise the whole of rhs (one scalar choice, not per element)."""
    a = need_tile("sels", lhs, "lhs")
    b = need_tile("sels", rhs, "rhs")
    same_dtype("sels", a, b)
    shape = broadcast_shape("sels", a, b)
    mode = select_mode.value if isinstance(select_mode, Scalar) else select_mode
    if isinstance(mode, bool) or not isinstance(mode, (int, float, np.number)):
        raise TileTypeError(f"pl.tile.sels: select_mode must be a number or a pl.Scalar, got "
                            f"{type(select_mode).__name__}")
    chosen = a if mode == 1 else b
    return result(np.broadcast_to(chosen.data, shape), a.dtype, common_valid(shape, a, b))


# -- registration ---------------------------------------------------------------------------------------

op("maximum", family=_CMP, scalar="maximums", scalar_fn=lambda a, b: a if a >= b else b)(maximum)
op("minimum", family=_CMP, scalar="minimums", scalar_fn=lambda a, b: a if a <= b else b)(minimum)
op("maximums", family=_CMP, reach="pl(t)", levels=("tile",))(maximums)
op("minimums", family=_CMP, reach="pl(t)", levels=("tile",))(minimums)
tensor_impl("maximum")(tensor_binary("maximum", REGISTRY["maximum"].fn, REGISTRY["maximums"].fn))
tensor_impl("minimum")(tensor_binary("minimum", REGISTRY["minimum"].fn, REGISTRY["minimums"].fn))
op("cmp", family=_CMP, scalar="cmps")(cmp)
op("cmps", family=_CMP, levels=("tile",))(cmps)
tensor_impl("cmp")(_tensor_cmp)
op("sel", family=_CMP, reach="pl(t)", dtypes=ANY, levels=("tile",))(sel)
op("sels", family=_CMP, reach="pl(t)", levels=("tile",))(sels)
