"""Tiles and tile math, on numpy.

A :class:`Tile` is an n-d block held "on chip": a private copy of the data a
kernel loaded or computed.  Arithmetic keeps the tile's element type, as the
device does (FP16/BF16 math stays in FP16/BF16).  These functions need no
context: they are pure.
"""

from __future__ import annotations

import numpy as np

from ..errors import TileIndexError, TileTypeError, TileValueError
from ..source import user_location
from . import dtypes as dt
from .dtypes import DataType
from .scalar import Scalar, as_int
from .spaces import MemorySpace, as_space, check_move


class Tile:
    """A block of data in a kernel; supports ``+ - * /`` and unary ``-``.

    ``space`` is the on-chip memory the program placed the tile in (``None``: never placed, which reads
    as ``Vec``; see :mod:`ptodist.language.spaces`).  ``pad_src``, set only under ``ptodist check`` and
    only on a partly valid tile, is the ``file:line`` that left its padding undefined (a ``pl.load`` with
    ``valid_shape``); read it with ``getattr(tile, "pad_src", None)``, as plain runs never set it.
    ``pad_filled`` (unset: False) says the padding holds defined values (``pl.tile.fillpad_inplace`` wrote it),
    which a reduction then reads, as a device's does.
    """

    __slots__ = ("data", "dtype", "valid_shape", "space", "pad_src", "pad_filled")

    def __init__(self, data: np.ndarray, dtype: DataType | None = None, valid_shape=None,
                 space: MemorySpace | None = None):
        self.dtype = dtype or dt.from_numpy(data.dtype)
        if self.dtype is None:
            held = ", ".join(dict.fromkeys(str(d.np_dtype) for d in dt.ALL))
            raise TileTypeError(f"a tile cannot hold numpy dtype {data.dtype}: convert the data to one of {held}")
        self.data = data.astype(self.dtype.np_dtype, copy=False)
        self.valid_shape = tuple(valid_shape) if valid_shape is not None else self.data.shape
        self.space = space

    @classmethod
    def of(cls, data: np.ndarray, dtype: DataType) -> Tile:
        """A fully valid, unplaced tile of ``data``, which already has ``dtype``'s numpy type (no checks)."""
        t = cls.__new__(cls)
        t.data, t.dtype, t.valid_shape, t.space = data, dtype, data.shape, None
        return t

    @property
    def memory_space(self) -> MemorySpace:
        """The on-chip memory the tile is in (``Vec`` unless the program or a cube op placed it elsewhere)."""
        return self.space or MemorySpace.Vec

    def __class_getitem__(cls, item):
        # `pl.Tile[[shape], dtype]` is accepted as an annotation.
        return cls

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape)

    def numpy(self) -> np.ndarray:
        """Return the tile's data (a numpy array)."""
        return self.data

    def __repr__(self) -> str:
        return f"Tile(shape={self.shape}, dtype={self.dtype.name})"

    # Operators are the catalog's ops (registered in ops/elementwise.py, imported late: it imports this module).
    def __add__(self, o):
        return _op("add")(self, o)

    def __radd__(self, o):
        return _op("add")(o, self)

    def __sub__(self, o):
        return _op("sub")(self, o)

    def __rsub__(self, o):
        return _op("sub")(o, self)

    def __mul__(self, o):
        return _op("mul")(self, o)

    def __rmul__(self, o):
        return _op("mul")(o, self)

    def __truediv__(self, o):
        return _op("div")(self, o)

    def __rtruediv__(self, o):
        return _op("div")(o, self)

    def __neg__(self):
        return _op("neg")(self)

    def __abs__(self):
        return _op("abs")(self)


def carry_pad(out: Tile, *operands) -> Tile:
    """``out``, a result computed from ``operands``, naming where their undefined padding came from.

    Its padding was computed from theirs, so a later reduction over it reads what they left undefined.
    Only tiles made under ``ptodist check`` carry ``pad_src``; the test is cheap where there is no padding.
    """
    if out.valid_shape != out.data.shape:
        for t in operands:
            src = getattr(t, "pad_src", None)
            if src:
                out.pad_src = src
                break
        partial = [t for t in operands if isinstance(t, Tile) and t.valid_shape != t.data.shape]
        if partial and all(getattr(t, "pad_filled", False) for t in partial):
            out.pad_filled = True  # computed from defined padding only: defined too
    return out


def _op(name: str):
    fn = _OPS.get(name)
    if fn is None:
        from .ops.registry import REGISTRY

        fn = _OPS[name] = REGISTRY[name].fn
    return fn


_OPS: dict = {}  # operator name -> the catalog op, looked up once


_ROUNDING = {"round": np.rint, "rint": np.rint, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
             "none": np.trunc}


def cast(x: Tile, target_type: DataType | None = None, mode: str = "round", *, dtype: DataType | None = None) -> Tile:
    """Return ``x`` converted to ``target_type``; float to integer rounds by ``mode``.

    Modes: ``"round"``/``"rint"`` (to nearest, ties to even; the default), ``"floor"``,
    ``"ceil"``, ``"trunc"`` (``"none"``: C truncation).
    """
    target = target_type or dtype
    if not isinstance(target, DataType):
        raise TileTypeError(f"pl.cast needs target_type=<pl dtype>, got {target!r}")
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.tile.cast takes a Tile, got {type(x).__name__}")
    rounding = _ROUNDING.get(mode or "none")
    if rounding is None:
        raise TileValueError(f"pl.cast mode={mode!r}: use one of {', '.join(_ROUNDING)}")
    for raw in (x.dtype, target):
        if raw in dt.RAW_BITS and x.dtype is not target:
            raise TileTypeError(f"pl.cast at {user_location(2)}: cannot convert {x.dtype.name} to {target.name}: "
                                + dt.raw_bits_why(raw))
    data = x.data
    if x.dtype.is_float and not target.is_float:
        data = rounding(data.astype(np.float64))
    if target is dt.FP4 and x.dtype.is_float and np.isnan(data.astype(np.float32)).any():
        raise TileValueError(f"pl.cast at {user_location(2)}: the {x.dtype.name} tile holds NaN, which FP4 (E2M1) "
                             f"cannot represent (it has no NaN or infinity); replace NaNs before the cast, e.g. "
                             f"with pl.sel")
    return Tile(dt.convert(data, x.dtype, target), target)


def full(shape, value, dtype: DataType = dt.FP32) -> Tile:
    """Return a tile of ``shape`` filled with ``value``."""
    if isinstance(value, Scalar):
        value = value.value
    return Tile(np.full([int(d) for d in shape], value, dtype=dtype.np_dtype), dtype)


def reshape(x: Tile, shape) -> Tile:
    """Return ``x`` with a new shape of the same element count."""
    shape = [int(d) for d in shape]
    if int(np.prod(shape)) != x.data.size:
        raise TileValueError(f"pl.reshape: cannot reshape {x.shape} ({x.data.size} elements) to {shape}")
    # Upstream's reshape keeps its input's memory space.
    return Tile(x.data.reshape(shape), x.dtype, space=x.space)


def move(x: Tile, target_memory: MemorySpace | None = None, blayout=None, slayout=None) -> Tile:
    """Copy a tile to another on-chip memory (``Mat -> Left/Right/Bias``, ``Acc -> Vec/Mat``, ``Vec -> Mat``).

    ``blayout`` / ``slayout`` choose the destination's physical layout; element values do not depend on
    it, so they are accepted and have no visible effect here.
    """
    if not isinstance(x, Tile):
        raise TileTypeError(f"pl.move takes a Tile, got {type(x).__name__}; load tensors into tiles with pl.load")
    if target_memory is None:
        raise TileTypeError("pl.move needs target_memory=pl.MemorySpace.<space>: the space the tile moves to")
    dst = as_space(target_memory, "pl.move")
    check_move(x.memory_space, dst)
    return Tile(x.data.copy(), x.dtype, None if x.valid_shape == x.data.shape else x.valid_shape, space=dst)


def slice_(x: Tile, shape, offsets) -> Tile:
    """Return the sub-tile of ``shape`` at ``offsets``."""
    offsets, shape = _check_region("pl.slice", x.shape, offsets, shape)
    idx = tuple(slice(o, o + s) for o, s in zip(offsets, shape))
    return Tile(x.data[idx].copy(), x.dtype, space=x.space)


def assemble(dst: Tile, src: Tile, offsets, *, atomic=None) -> Tile:
    """Return ``dst`` with ``src`` written (``atomic=pl.AtomicType.Add``: added) at ``offsets``."""
    from .distributed.types import AtomicType, atomic_type  # the distributed package imports this module

    offsets, _ = _check_region("pl.assemble", dst.shape, offsets, src.shape)
    out = dst.data.copy()
    region = tuple(slice(o, o + s) for o, s in zip(offsets, src.shape))
    if atomic_type(atomic, "pl.assemble") is AtomicType.Add:
        if src.dtype is not dst.dtype:
            raise TileTypeError(f"pl.assemble at {user_location(2)}: adding a {src.dtype.name} tile into a "
                                f"{dst.dtype.name} tile; convert it first with pl.cast(src, target_type=pl."
                                f"{dst.dtype.name})")
        out[region] += src.data
    else:
        out[region] = src.data
    return Tile(out, dst.dtype)


def _check_region(op: str, bounds, offsets, shape) -> tuple[list[int], list[int]]:
    """``(offsets, shape)`` as ints, checked to lie inside a tile of shape ``bounds`` (any int, however large)."""
    offsets = [as_int(o, f"{op} offset") for o in offsets]
    shape = [as_int(s, f"{op} shape") for s in shape]
    if len(offsets) != len(bounds) or len(shape) != len(bounds):
        raise TileValueError(f"{op} at {user_location(3)}: offsets {offsets} and shape {shape} must have "
                             f"{len(bounds)} entries, one per dimension of the {list(bounds)} tile")
    for i, (o, s, b) in enumerate(zip(offsets, shape, bounds)):
        if s < 0 or o < 0 or o + s > b:
            why = f"has a negative size ({s}); sizes are 0 or more" if s < 0 else \
                f"reaches [{o}, {o + s}), whose bounds are [0, {b})"
            raise TileIndexError(f"{op} at {user_location(3)}: region at offsets {offsets} with shape {shape} is "
                                 f"outside the {list(bounds)} tile: dimension {i} {why}.")
    return offsets, shape
