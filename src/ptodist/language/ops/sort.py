"""Sorting: ``sort32`` and ``mrgsort``, on (value, index) pairs.

The pairs are laid out as the device lays them out: an FP32 pair is two FP32 slots (the value, then the
index as raw UINT32 bits); an FP16 pair is four FP16 slots (the value, a zero slot, then the UINT32 index
bits over two slots).  Sorting is descending.
"""

from __future__ import annotations

import numpy as np

from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from ..dtypes import DataType
from ..scalar import Scalar
from ..tile_ops import Tile
from .gather import _FAM, _dtype, _tile, _u32_index, _valid
from .registry import ANY, op, tensor_impl

_SORTABLE = (dt.FP16, dt.FP32)


# -- sort32 / mrgsort ------------------------------------------------------------------------------------
def _pair_width(dtype: DataType) -> int:
    return 2 if dtype is dt.FP32 else 4


def _pairs(dtype: DataType, values: np.ndarray, index_bits: np.ndarray) -> np.ndarray:
    """``[..., n]`` values and their UINT32 index bits as ``[..., n * width]`` slots of ``dtype``."""
    w = _pair_width(dtype)
    out = np.zeros((*values.shape, w), dtype=dtype.np_dtype)
    out[..., 0] = values
    out[..., w // 2:] = np.ascontiguousarray(index_bits.astype(np.uint32)).view(dtype.np_dtype).reshape(
        *values.shape, w // 2)
    return out.reshape(*values.shape[:-1], -1)


@op("sort32", family=_FAM, dtypes=ANY)
def sort32(src: Tile, idx: Tile) -> Tile:
    """Sort each 32-element block of ``src`` descending, as (value, index) pairs: the last dim grows x2 (FP32) or x4 (FP16)."""
    _tile("sort32", "src", src)
    _tile("sort32", "idx", idx)
    _dtype("sort32", "src", src, _SORTABLE)
    _u32_index("sort32", "idx", idx)
    if idx.shape != src.shape:
        raise TileValueError(f"pl.tile.sort32: idx {idx.shape} must have src's shape {src.shape}")
    vc = src.valid_shape[-1]
    if vc % 32:
        raise TileValueError(f"pl.tile.sort32: src has {vc} valid columns, not a whole number of 32-element "
                             "blocks; pad the row first (pl.fillpad(tile, pad_value=pl.PadValue.min))")
    w = _pair_width(src.dtype)
    lead = src.data.shape[:-1]
    vals = src.data[..., :vc].reshape(*lead, vc // 32, 32)
    ids = idx.data[..., :vc].astype(np.int64).reshape(*lead, vc // 32, 32)
    # Stable on the negated value: descending, equal values keep their position order.
    order = np.argsort(-vals.astype(np.float32), axis=-1, kind="stable")
    pairs = _pairs(src.dtype, np.take_along_axis(vals, order, -1), np.take_along_axis(ids, order, -1))
    out = np.zeros((*lead, src.shape[-1] * w), dtype=src.dtype.np_dtype)
    out[..., :vc * w] = pairs.reshape(*lead, vc * w)
    return Tile(out, src.dtype, (*src.valid_shape[:-1], vc * w))


def _merge(dtype: DataType, runs: list[np.ndarray], exhausted: bool = False) -> tuple[np.ndarray, list[int]]:
    """Merge descending pair runs (each ``[n_i * width]`` slots); return the slots and the pairs taken per run."""
    w = _pair_width(dtype)
    blocks = [r.reshape(-1, w) for r in runs]
    allp = np.concatenate(blocks)
    src_run = np.concatenate([np.full(len(b), i) for i, b in enumerate(blocks)])
    order = np.argsort(-allp[:, 0].astype(np.float32), kind="stable")
    take = len(order)
    if exhausted and len(blocks) > 1:
        # Stop once any run has been consumed completely.
        take = min(int(np.flatnonzero(src_run[order] == i)[-1]) + 1 for i in range(len(blocks)) if len(blocks[i]))
    order = order[:take]
    counts = [int(np.count_nonzero(src_run[order] == i)) for i in range(len(blocks))]
    return allp[order].reshape(-1), counts


@op("mrgsort", family=_FAM, dtypes=ANY)
def mrgsort(src0: Tile, src1=None, src2=None, src3=None, tmp=None, executed=None, exhausted: bool = False, *,
            block_len=None) -> Tile:
    """Merge descending (value, index) pair runs: groups of 4 runs of ``block_len`` elements, or 2-4 sorted tiles."""
    return _mrgsort(src0, src1, src2, src3, tmp, executed, exhausted, block_len, need_tmp=True)


def _mrgsort(src0, src1, src2, src3, tmp, executed, exhausted, block_len, need_tmp: bool) -> Tile:
    srcs = [s for s in (src0, src1, src2, src3) if s is not None]
    for i, s in enumerate(srcs):
        _tile("mrgsort", f"src{i}", s)
        _dtype("mrgsort", f"src{i}", s, _SORTABLE)
    w = _pair_width(src0.dtype)
    if block_len is not None:
        if len(srcs) > 1 or tmp is not None or executed is not None or exhausted:
            raise TileTypeError("pl.tile.mrgsort: format1 (block_len=) and format2 (src1, ..., tmp, executed, "
                                "exhausted) are exclusive; do not pass format2 arguments with block_len")
        bl = int(block_len.value if isinstance(block_len, Scalar) else block_len)
        vc = src0.valid_shape[-1]
        if bl <= 0 or bl % 64 or vc % (4 * bl):
            raise TileValueError(f"pl.tile.mrgsort: block_len={bl} must be a positive multiple of 64 with the "
                                 f"{vc} valid columns a multiple of 4 * block_len ({4 * bl}); each step merges 4 "
                                 "runs of block_len elements")
        out = src0.data.copy()
        rows = out.reshape(-1, out.shape[-1])
        for row in rows[:int(np.prod(src0.valid_shape[:-1]))]:
            for g in range(0, vc, 4 * bl):
                runs = [row[g + k * bl:g + (k + 1) * bl] for k in range(4)]
                row[g:g + 4 * bl] = _merge(src0.dtype, runs)[0]
        return Tile(out, src0.dtype, src0.valid_shape)
    if len(srcs) < 2 or (src3 is not None and src2 is None):
        raise TileTypeError("pl.tile.mrgsort needs block_len=<int> (format1) or 2 to 4 sorted tiles "
                            "src0, src1[, src2[, src3]] (format2)")
    if need_tmp and tmp is None:
        raise TileTypeError("pl.tile.mrgsort: format2 on tiles needs the scratch tile tmp= (and executed=); "
                            "pl.tensor.mrgsort / pl.mrgsort on tensors allocate it for you")
    for s in srcs:
        if s.dtype is not src0.dtype or s.data.ndim != 2 or s.valid_shape[0] != 1:
            raise TileValueError("pl.tile.mrgsort: format2 merges single-row [1, n] tiles of one dtype; got "
                                 + ", ".join(f"{s.shape} {s.dtype.name}" for s in srcs))
        if s.valid_shape[-1] % w:
            raise TileValueError(f"pl.tile.mrgsort: a {src0.dtype.name} pair is {w} slots, but a source has "
                                 f"{s.valid_shape[-1]} valid columns")
    merged, counts = _merge(src0.dtype, [_valid(s)[0] for s in srcs], bool(exhausted))
    total = sum(s.valid_shape[-1] for s in srcs)
    out = np.zeros((1, total), dtype=src0.dtype.np_dtype)
    out[0, :len(merged)] = merged
    if executed is not None:
        _tile("mrgsort", "executed", executed)
        # The device reports how many pairs it took from each source: the one output written in place.
        executed.data.reshape(-1)[:len(counts)] = counts
    return Tile(out, src0.dtype, (1, len(merged)))


@tensor_impl("mrgsort")
def _mrgsort_tensor(src0, src1=None, src2=None, src3=None, *, exhausted: bool = False, block_len=None, tmp=None,
                    executed=None):
    from .registry import _fresh, _whole

    if tmp is not None or executed is not None:
        raise TileTypeError("pl.tensor.mrgsort: tmp= and executed= are tile-level only; on tensors the scratch is "
                            "allocated for you, so drop them (or call pl.tile.mrgsort on tiles)")
    return _fresh(_mrgsort(_whole(src0), _whole(src1), _whole(src2), _whole(src3), None, None, exhausted,
                           block_len, need_tmp=False))

