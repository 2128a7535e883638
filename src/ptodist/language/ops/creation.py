"""Creation: ``create_tensor``, ``create_tile``, ``create_l1``, ``full``, ``arange``, ``random``, ``tri``, ``const``,
and the small on-core arrays of ``pl.array``.

``pl.full``, ``pl.arange`` and ``pl.random`` take no operand to dispatch on: they make tiles (what a kernel
computes with; a tile is stored, or passed where a tensor operand is taken); ``pl.tensor.<name>`` makes a fresh
tensor in memory.
"""

from __future__ import annotations

import numpy as np

from ...errors import TileIndexError, TileTypeError, TileValueError
from ...source import user_location
from .. import dtypes as dt
from .. import memory_ops as _m
from ..dtypes import DataType
from ..scalar import Scalar, const
from ..tile_ops import Tile
from .registry import ANY, op, tensor_impl

_NEW = "Creation"
_ARRAYS = "Arrays"

op("create_tensor", family=_NEW, dtypes=ANY, levels=("tensor",))(_m.create_tensor)
op("const", family=_NEW, dtypes=ANY, levels=("tile",))(const)


def _shape(name: str, shape) -> list[int]:
    if not isinstance(shape, (list, tuple)):
        raise TileTypeError(f"pl.{name}: shape must be a list of sizes, got {shape!r}")
    out = []
    for d in shape:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TileTypeError(f"pl.{name}: shape {list(shape)} holds {d!r}; sizes are integers")
        out.append(d.__index__())
    if any(d < 0 for d in out):
        raise TileValueError(f"pl.{name}: shape {out} has a negative size")
    return out


def _dtype(name: str, dtype, allowed=None) -> DataType:
    if not isinstance(dtype, DataType):
        raise TileTypeError(f"pl.{name}: dtype must be a pl dtype (pl.FP32, pl.INT32, ...), got {dtype!r}")
    if allowed is not None and dtype not in allowed:
        raise TileTypeError(f"pl.{name}: dtype {dtype.name} is not supported; use one of "
                            f"{', '.join(d.name for d in allowed)}")
    return dtype


def _value(v):
    return v.value if isinstance(v, Scalar) else v


def _to_dtype(values: np.ndarray, dtype: DataType) -> np.ndarray:
    """Integer ``values`` in ``dtype`` with C wrap-around (numpy refuses an out-of-range Python int)."""
    return values.astype(np.int64).astype(dtype.np_dtype)


def _fill(shape: list[int], value, dtype: DataType) -> np.ndarray:
    value = _value(value)
    if dtype in dt.RAW_BITS:
        raise TileTypeError(f"pl.full at {user_location()}: cannot fill with {value!r}: " + dt.raw_bits_why(dtype))
    if dtype.is_float or dtype is dt.BOOL:
        return np.full(shape, value, dtype=dtype.np_dtype)
    if isinstance(value, float) and not value.is_integer():
        raise TileValueError(f"pl.full: value {value} is not an integer, but the dtype is {dtype.name}; "
                             f"give an integer, or a float dtype")
    return _to_dtype(np.full(shape, int(value), dtype=np.int64), dtype)


@op("full", family=_NEW, reach="pl(t)", dtypes=ANY)
def full(shape, dtype=None, value=None) -> Tile:
    """A tile of ``shape`` filled with ``value``: ``full(shape, dtype, value)``; ``full(shape, value, dtype)`` too."""
    if not isinstance(dtype, DataType) and isinstance(value, DataType):
        dtype, value = value, dtype
    dtype = _dtype("full", dt.FP32 if dtype is None else dtype)
    shape = _shape("full", shape)
    return Tile(_fill(shape, 0 if value is None else value, dtype), dtype)


def _fresh(tile: Tile):
    t = _m.create_tensor(tile.shape, tile.dtype)
    _m.store(tile, [0] * len(tile.shape), t)
    return t


@tensor_impl("full")
def _full_tensor(shape, dtype=None, value=None):
    """``pl.tensor.full``: a fresh tensor filled with ``value``."""
    return _fresh(full(shape, dtype, value))


@op("create_tile", family=_NEW, reach="pl(t)", dtypes=ANY, levels=("tile",))
def create_tile(shape, dtype: DataType = dt.FP32, target_memory=None) -> Tile:
    """Allocate an on-chip tile of ``shape`` (its contents start as zeros here; ``target_memory`` is accepted)."""
    return Tile(np.zeros(_shape("create_tile", shape), dtype=_dtype("create_tile", dtype).np_dtype), dtype)


op("create", family=_NEW, reach="tile", dtypes=ANY)(create_tile)
tensor_impl("create")(_m.create_tensor)


@op("create_l1", family=_NEW, reach="pl(t)", dtypes=ANY)
def create_l1(shape, dtype: DataType = dt.FP32, transpose: bool = False) -> Tile:
    """Allocate a tile in L1 (a zeroed tile here: on-chip spaces and the ``transpose`` layout are not modelled)."""
    return Tile(np.zeros(_shape("create_l1", shape), dtype=_dtype("create_l1", dtype).np_dtype), dtype)


@tensor_impl("create_l1")
def _create_l1_tensor(shape, dtype: DataType = dt.FP32, transpose: bool = False):
    """``pl.tensor.create_l1``: a zeroed tensor (a rank has one memory; ``pl.gather_row`` fills it)."""
    return _m.create_tensor(_shape("tensor.create_l1", shape), _dtype("tensor.create_l1", dtype))


class MemRefType:
    """What ``pl.tile.alloc`` / ``pl.tensor.alloc`` return: an allocation's identity, with no address."""

    __slots__ = ("memory_space", "size")

    def __init__(self, memory_space=None, size: int = 0):
        self.memory_space, self.size = memory_space, size

    def __repr__(self) -> str:
        return f"MemRefType(memory_space={self.memory_space}, size={self.size})"


@op("alloc", family=_NEW, reach="tile", dtypes=ANY)
def alloc(memory_space, size: int) -> MemRefType:
    """An allocation of ``size`` bytes in ``memory_space`` (upstream's printed IR; no memory is reserved here)."""
    if isinstance(size, bool) or not hasattr(size, "__index__") or size.__index__() < 0:
        raise TileValueError(f"pl.tile.alloc: size must be a non-negative number of bytes, got {size!r}")
    return MemRefType(memory_space, size.__index__())


tensor_impl("alloc")(alloc)


@op("arange", family=_NEW, reach="pl(t)", dtypes=ANY)
def arange(start, shape, dtype: DataType = dt.INT32, descending: bool = False) -> Tile:
    """Consecutive integers ``start, start+1, ...`` (or down, ``descending=True``) along a ``[1, ..., N]`` tile."""
    dtype = _dtype("arange", dtype, (dt.INT16, dt.INT32))
    shape = _shape("arange", shape)
    if not shape or shape[-1] == 1 or any(d != 1 for d in shape[:-1]):
        raise TileValueError(f"pl.arange: shape {shape} must be [1, ..., N] with N > 1: the sequence fills one row "
                             f"(the leading dimensions are 1 and the last is longer than 1), e.g. [1, 16]")
    s = _value(start)
    if isinstance(s, bool) or not hasattr(s, "__index__"):
        raise TileTypeError(f"pl.arange: start must be an integer, got {start!r}")
    step = -1 if descending else 1
    seq = s.__index__() + step * np.arange(shape[-1], dtype=np.int64)
    return Tile(_to_dtype(seq, dtype).reshape(shape), dtype)


@tensor_impl("arange")
def _arange_tensor(start, shape, dtype: DataType = dt.INT32, descending: bool = False):
    """``pl.tensor.arange``: a fresh tensor holding the sequence."""
    return _fresh(arange(start, shape, dtype, descending))


op("ci", family=_NEW, reach="tile", dtypes=ANY)(arange)  # upstream's name for arange (pto.tci)
tensor_impl("ci")(_arange_tensor)


_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_MASK = 0xFFFFFFFF


def _philox(key: tuple[int, int], counters: np.ndarray, rounds: int) -> np.ndarray:
    """Philox4x32 with ``rounds`` rounds over ``counters`` ([n, 4] uint64 words < 2**32); [n, 4] output words."""
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m0, m1, mask = np.uint64(_PHILOX_M[0]), np.uint64(_PHILOX_M[1]), np.uint64(_MASK)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + np.uint64(_PHILOX_W[0])) & mask, (k1 + np.uint64(_PHILOX_W[1])) & mask
        p0, p1 = m0 * c[0], m1 * c[2]  # 32 x 32 bits: exact in uint64
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & mask, p1 & mask,
             ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & mask, p0 & mask]
    return np.stack(c, axis=1)


def _word(name: str, v, what: str) -> int:
    v = _value(v)
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TileTypeError(f"pl.random: {what} must be an integer, got {v!r}")
    return v.__index__() & _MASK


@op("random", family=_NEW, reach="pl(t)", dtypes=ANY)
def random(key0, key1, counter0, counter1, counter2, counter3, shape, dtype: DataType | None = None,
           rounds: int = 10) -> Tile:
    """Counter-based random bits (Philox4x32): the same key and counter always give the same tile."""
    if dtype is None:
        raise TileTypeError("pl.random: upstream's default dtype UINT32 does not exist in ptodist; pass "
                            "dtype=pl.INT32 (the same 32 random bits, read as signed)")
    dtype = _dtype("random", dtype, (dt.INT32,))
    if rounds not in (7, 10):
        raise TileValueError(f"pl.random: rounds={rounds!r}; the cipher runs 7 or 10 rounds")
    shape = _shape("random", shape)
    key = (_word("random", key0, "key0"), _word("random", key1, "key1"))
    ctr = [_word("random", c, f"counter{i}") for i, c in enumerate((counter0, counter1, counter2, counter3))]
    n = int(np.prod(shape, dtype=np.int64))
    blocks = (n + 3) // 4
    # Element e comes from word e % 4 of the block whose 128-bit counter is the given counter plus e // 4.
    base = ctr[0] | ctr[1] << 32 | ctr[2] << 64 | ctr[3] << 96
    wrap = (1 << 128) - 1
    words = np.array([[((base + b) & wrap) >> (32 * i) & _MASK for i in range(4)] for b in range(blocks)],
                     dtype=np.uint64).reshape(blocks, 4)
    bits = _philox(key, words, rounds).reshape(-1)[:n].astype(np.uint32)
    return Tile(bits.view(np.int32).reshape(shape), dtype)


@tensor_impl("random")
def _random_tensor(key0, key1, counter0, counter1, counter2, counter3, shape, dtype: DataType | None = None,
                   rounds: int = 10):
    """``pl.tensor.random``: a fresh tensor of random bits."""
    return _fresh(random(key0, key1, counter0, counter1, counter2, counter3, shape, dtype, rounds))


_TRI_DTYPES = (dt.INT8, dt.UINT8, dt.INT16, dt.INT32, dt.FP16, dt.BF16, dt.FP32)


@op("tri", family=_NEW, reach="pl(t)", dtypes=ANY, levels=("tile",))
def tri(diagonal, shape, *, valid_shape=None, dtype: DataType = dt.FP32, upper: bool = False) -> Tile:
    """A triangular 0/1 mask tile: lower keeps ``j <= i + diagonal``, ``upper=True`` keeps ``j >= i + diagonal``."""
    dtype = _dtype("tri", dtype, _TRI_DTYPES)
    shape = _shape("tri", shape)
    if len(shape) != 2:
        raise TileValueError(f"pl.tri: shape {shape} must be 2-D [rows, cols]")
    d = _value(diagonal)
    if isinstance(d, bool) or not hasattr(d, "__index__"):
        raise TileTypeError(f"pl.tri: diagonal must be an integer, got {diagonal!r}")
    valid = shape if valid_shape is None else _shape("tri", valid_shape)
    if len(valid) != 2 or any(not 0 <= v <= s for v, s in zip(valid, shape)):
        raise TileValueError(f"pl.tri: valid_shape {valid} does not fit the {shape} tile; give [rows, cols] no "
                             "larger than the shape")
    i, j = np.indices(valid)
    mask = j >= i + d.__index__() if upper else j <= i + d.__index__()
    data = np.zeros(shape, dtype=dtype.np_dtype)
    data[: valid[0], : valid[1]] = mask.astype(dtype.np_dtype)  # the padding stays zero: only the valid box is written
    return Tile(data, dtype, valid if valid != shape else None)


# -- pl.array: small on-core arrays -----------------------------------------------------------------------
_ARRAY_DTYPES = (dt.INT8, dt.INT16, dt.INT32, dt.INT64, dt.UINT8, dt.BOOL, dt.INDEX, dt.FP16, dt.BF16, dt.FP32,
                 dt.TASK_ID)


class Array:
    """A small fixed-size 1-D array on the core: ``arr[i]`` reads a Scalar, ``arr[i] = v`` updates it."""

    __slots__ = ("values", "dtype")

    def __init__(self, values: np.ndarray, dtype: DataType):
        self.values = values
        self.dtype = dtype

    def __class_getitem__(cls, item):
        # `pl.Array[16, pl.INT32]` is accepted as an annotation.
        return cls

    @property
    def extent(self) -> int:
        return int(self.values.shape[0])

    def _index(self, name: str, index) -> int:
        i = _value(index)
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TileTypeError(f"pl.array.{name}: the index must be an integer, got {index!r}")
        i = i.__index__()
        if not 0 <= i < self.extent:
            raise TileIndexError(f"pl.array.{name}: index {i} is outside the array of {self.extent} "
                                 f"{self.dtype.name} elements (indices 0 .. {self.extent - 1})")
        return i

    def __getitem__(self, index) -> Scalar:
        return get_element(self, index)

    def __setitem__(self, index, value) -> None:
        # Upstream's update is functional and rebinds the name; updating this object in place is the same to
        # every later read of the name.
        self.values = update_element(self, index, value).values

    def __len__(self) -> int:
        return self.extent

    def __repr__(self) -> str:
        return f"Array({self.values.tolist()}, {self.dtype.name})"


@op("array.create", family=_ARRAYS, reach="array", dtypes=ANY, levels=("tile",))
def array_create(extent: int, dtype: DataType) -> Array:
    """Allocate an on-core array of ``extent`` elements of ``dtype`` (zeroed here)."""
    if isinstance(extent, bool) or not hasattr(extent, "__index__") or extent.__index__() < 1:
        raise TileValueError(f"pl.array.create: extent must be a positive integer, got {extent!r}")
    dtype = _dtype("array.create", dtype, _ARRAY_DTYPES)
    # A TASK_ID array starts with no task in it (-1), so that deps=[tids] waits only for the ids stored.
    return Array(np.full(extent.__index__(), -1 if dtype is dt.TASK_ID else 0, dtype=dtype.np_dtype), dtype)


def _array(name: str, arr) -> Array:
    if not isinstance(arr, Array):
        raise TileTypeError(f"pl.array.{name}: the first argument must be an array from pl.array.create, got "
                            f"{type(arr).__name__}")
    return arr


@op("array.get_element", family=_ARRAYS, reach="array", dtypes=ANY, levels=("tile",))
def get_element(arr: Array, index) -> Scalar:
    """Element ``index`` of an array, as a Scalar of its dtype; also written ``arr[index]``."""
    arr = _array("get_element", arr)
    return Scalar(arr.values[arr._index("get_element", index)].item(), arr.dtype)


@op("array.update_element", family=_ARRAYS, reach="array", dtypes=ANY, levels=("tile",))
def update_element(arr: Array, index, value) -> Array:
    """A new array equal to ``arr`` but with ``value`` at ``index`` (integers wrap); also written ``arr[i] = v``."""
    arr = _array("update_element", arr)
    i = arr._index("update_element", index)
    v = _value(value)
    if isinstance(v, (np.generic,)):
        v = v.item()
    if not isinstance(v, (int, float, bool)):
        raise TileTypeError(f"pl.array.update_element: the value must be a number or a Scalar, got {value!r}")
    if not arr.dtype.is_float and not float(v).is_integer():
        raise TileValueError(f"pl.array.update_element: value {v} is not an integer, but the array is "
                             f"{arr.dtype.name}; convert it first (pl.cast)")
    values = arr.values.copy()
    values[i] = float(v) if arr.dtype.is_float else Scalar(int(v), arr.dtype).value
    return Array(values, arr.dtype)
