"""Gather and scatter: ``gather`` ... ``scatter_mask`` (their family's sorting ops are ``sort.py``'s).

The ops that move values by position.  Index operands are read only inside their valid region; an index
outside its bound raises a ``TileIndexError`` naming the op, the index, its position and the bound (except
where upstream defines a policy, as ``mgather``'s ``gather_oob=``).  Results are fresh tiles: upstream's
destination-passing forms (``scatter``, ``gather_row``) alias their destination, which a functional
result models.
"""

from __future__ import annotations

import numpy as np

from ...errors import TileIndexError, TileTypeError, TileValueError
from .. import dtypes as dt
from ..dtypes import DataType
from ..scalar import Scalar
from ..tile_ops import Tile
from .registry import ANY, is_tensor, op, tensor_impl

_FAM = "Gather, scatter, sort"

# (first marked column, stride) of each hardware mask pattern, by its number (pl.tile.MaskPattern).
_MASKS = {1: (0, 2), 2: (1, 2), 3: (0, 4), 4: (1, 4), 5: (2, 4), 6: (3, 4), 7: (0, 1)}
_MASK_NAMES = {1: "P0101", 2: "P1010", 3: "P0001", 4: "P0010", 5: "P0100", 6: "P1000", 7: "P1111"}
_MASK_BY_SHAPE = {v: _MASK_NAMES[k] for k, v in _MASKS.items()}
_GATHER_SRC = (dt.FP16, dt.FP32, dt.INT16, dt.INT32)
_SCATTER_DST = (dt.INT8, dt.INT16, dt.INT32, dt.FP16, dt.FP32, dt.BF16)
_INT_INDEX = (dt.INT16, dt.INT32, dt.INT64)
_MGATHER_COALESCE = {"row": 0, "elem": 1}
_MGATHER_OOB = {"undefined": 0, "clamp": 1, "wrap": 2, "zero": 3}


# -- helpers ---------------------------------------------------------------------------------------------
def _names(dtypes) -> str:
    return ", ".join(d.name for d in dtypes)


def _q(opn: str) -> str:
    return opn if opn.startswith("pl.") else f"pl.tile.{opn}"


def _tile(opn: str, what: str, x) -> Tile:
    if not isinstance(x, Tile):
        raise TileTypeError(f"{_q(opn)}: {what} must be a Tile, got {type(x).__name__}; "
                            "load a tensor region into a tile with pl.load first")
    return x


def _dtype(opn: str, what: str, x: Tile, allowed) -> None:
    if x.dtype not in allowed:
        raise TileTypeError(f"{_q(opn)}: {what} is a {x.dtype.name} tile, but {opn.split('.')[-1]} takes {_names(allowed)} "
                            f"for it; convert it first with pl.cast(tile, target_type=pl.<dtype>)")


def _u32_index(opn: str, what: str, x: Tile) -> None:
    # ptodist has no UINT32 element type: an INT32 tile carries the same bits for every in-range value.
    if x.dtype.name not in ("UINT32", "INT32"):
        raise TileTypeError(f"{_q(opn)}: {what} is a {x.dtype.name} tile, but {opn.split('.')[-1]} takes a UINT32 tile "
                            "(INT32 in ptodist, which has no UINT32 type); build it with "
                            "pl.tile.arange(0, shape, dtype=pl.INT32)")


def _valid(x: Tile) -> np.ndarray:
    return x.data[tuple(slice(0, v) for v in x.valid_shape)]


def _ints(x) -> list[int]:
    return [int(v.value if isinstance(v, Scalar) else v) for v in x]


def _first_bad(opn: str, values: np.ndarray, bound: int, what: str, fix: str) -> None:
    """Raise for the first entry of ``values`` outside ``[0, bound)`` (row-major order)."""
    bad = (values < 0) | (values >= bound)
    if bad.any():
        pos = [int(p) for p in np.argwhere(bad)[0]]
        raise TileIndexError(f"{_q(opn)}: index {int(values[tuple(pos)])} at position {pos} of {what} is "
                             f"outside [0, {bound}); {fix}")


def _as_dtype(opn: str, x, what: str) -> DataType:
    if not isinstance(x, DataType):
        raise TileTypeError(f"pl.tile.{opn}: {what} must be a data type such as pl.INT32, got {x!r}")
    return x


def _mask(opn: str, pattern) -> tuple[int, int]:
    p = int(pattern.value if isinstance(pattern, Scalar) else pattern)
    if p not in _MASKS:
        raise TileValueError(f"pl.tile.{opn}: mask_pattern {pattern!r} is not a pattern; use 1..7 "
                             "(pl.tile.MaskPattern.P0101 ... P1111)")
    return _MASKS[p]


# -- gather ----------------------------------------------------------------------------------------------
@op("gather", family=_FAM, dtypes=ANY)
def gather(src: Tile, dim=None, index=None, tmp=None, *, mask_pattern=None, output_dtype=None,
           kvalue=None, cmp_mode=None, out_cols=None, offset: int = 0, count_dtype=None):
    """Gather by index: ``out = src.flat[idx]`` (tile), ``out[b, k] = src[b, idx[b, k]]`` (``dim=``), or by mask pattern."""
    _tile("gather", "src", src)
    is_mask = mask_pattern is not None
    is_cmp = kvalue is not None or cmp_mode is not None or out_cols is not None
    is_index = dim is not None or index is not None
    if is_index + is_mask + is_cmp > 1:
        raise TileTypeError("pl.tile.gather: the index form (dim=, index=), the mask form (mask_pattern=) and the "
                            "compare form (kvalue=, cmp_mode=, out_cols=) are exclusive; pass the arguments of one")
    if output_dtype is not None and not is_mask:
        raise TileTypeError("pl.tile.gather: output_dtype= belongs to the mask form; add mask_pattern=<1..7> or "
                            "drop output_dtype")
    _dtype("gather", "src", src, _GATHER_SRC)
    if is_mask:
        return _gather_mask(src, mask_pattern, output_dtype)
    if is_cmp:
        return _gather_compare(src, kvalue, cmp_mode, out_cols, offset, count_dtype)
    if isinstance(dim, Tile):  # pl.tile.gather(src, indices[, tmp]): the flat form
        dim, index, tmp = None, dim, index if index is not None else tmp
    if index is None:
        raise TileTypeError("pl.tile.gather needs an index: pl.tile.gather(src, indices, tmp), "
                            "pl.gather(src, dim=-1, index=idx), or mask_pattern=<1..7>")
    if tmp is not None:
        _tile("gather", "tmp", tmp)  # device scratch: nothing to compute with it here
    idx = _tile("gather", "index", index)
    allowed = (dt.INT32, dt.INT16) if src.dtype.get_byte() == 2 else (dt.INT32,)
    _dtype("gather", "index", idx, allowed)
    vidx = _valid(idx).astype(np.int64)
    out = np.zeros(idx.data.shape, dtype=src.dtype.np_dtype)
    vsl = tuple(slice(0, v) for v in idx.valid_shape)
    if dim is None:
        _first_bad("gather", vidx, src.data.size, f"the index tile (flat offsets into src {src.shape})",
                   "flat indices count elements of the whole src tile, row-major")
        out[vsl] = src.data.reshape(-1)[vidx]
        return Tile(out, src.dtype, idx.valid_shape)
    rank = src.data.ndim
    d = int(dim.value if isinstance(dim, Scalar) else dim)
    if not -rank <= d < rank:
        raise TileValueError(f"pl.tile.gather: dim={d} is outside a rank-{rank} src; use -{rank}..{rank - 1}")
    d %= rank
    if idx.data.ndim != rank:
        raise TileValueError(f"pl.tile.gather: index {idx.shape} has rank {idx.data.ndim}, src {src.shape} rank "
                             f"{rank}; the index needs the src's rank (output shape = index shape)")
    for a in range(rank):
        if a != d and idx.shape[a] > src.shape[a]:
            raise TileValueError(f"pl.tile.gather: index {idx.shape} is larger than src {src.shape} on axis {a}; "
                                 f"only axis {d} (dim) may differ")
    _first_bad("gather", vidx, src.shape[d], f"the index tile (positions along axis {d} of src {src.shape})",
               "each index names a position along dim")
    part = src.data[tuple(slice(0, vidx.shape[a]) if a != d else slice(None) for a in range(rank))]
    out[vsl] = np.take_along_axis(part, vidx, axis=d)
    return Tile(out, src.dtype, idx.valid_shape)


def _gather_mask(src: Tile, pattern, output_dtype) -> Tile:
    start, stride = _mask("gather", pattern)
    cols = src.shape[-1]
    if cols % stride:
        raise TileValueError(f"pl.tile.gather: mask pattern {_MASK_BY_SHAPE[start, stride]} takes every {stride}th "
                             f"column, but src {src.shape} has {cols} columns; the last dim must divide by {stride}")
    data = src.data[..., start::stride]
    dtype = src.dtype
    if output_dtype is not None:
        dtype = _as_dtype("gather", output_dtype, "output_dtype")
        if dtype.get_byte() != src.dtype.get_byte():
            raise TileTypeError(f"pl.tile.gather: output_dtype {dtype.name} is {dtype.bits}-bit but src is "
                                f"{src.dtype.name} ({src.dtype.bits}-bit); the mask form reinterprets bits, so "
                                "the widths must match")
        data = np.ascontiguousarray(data).view(dtype.np_dtype)
    vc = src.valid_shape[-1]
    valid = (*src.valid_shape[:-1], max(0, (vc - start + stride - 1) // stride))
    return Tile(np.ascontiguousarray(data), dtype, valid)


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal}
_CMP_NAMES = list(_CMP)


def _gather_compare(src: Tile, kvalue, cmp_mode, out_cols, offset, count_dtype):
    if kvalue is None or cmp_mode is None or out_cols is None:
        raise TileTypeError("pl.tile.gather: the compare form needs kvalue=, cmp_mode= and out_cols= together")
    mode = _CMP_NAMES[cmp_mode] if isinstance(cmp_mode, int) and 0 <= cmp_mode < 6 else cmp_mode
    if mode not in _CMP:
        raise TileValueError(f"pl.tile.gather: cmp_mode {cmp_mode!r} is not one of {_CMP_NAMES} or 0..5")
    cdt = dt.INT32 if count_dtype is None else _as_dtype("gather", count_dtype, "count_dtype")
    if cdt.name not in ("INT32", "UINT32"):
        raise TileTypeError(f"pl.tile.gather: count_dtype is {cdt.name}; the per-row counts are INT32 or UINT32")
    if src.data.ndim != 2:
        raise TileValueError(f"pl.tile.gather: the compare form takes a 2-D src, got {src.shape}")
    k = kvalue.value if isinstance(kvalue, Scalar) else kvalue
    vr, vc = src.valid_shape
    rows, n = src.shape[0], int(out_cols)
    dst = np.zeros((rows, n), dtype=np.int32)
    counts = np.zeros((rows, 1), dtype=cdt.np_dtype)
    hits = _CMP[mode](src.data[:vr, :vc], np.asarray(k, dtype=src.dtype.np_dtype))
    for r in range(vr):
        cols = np.flatnonzero(hits[r])
        counts[r, 0] = len(cols)
        take = cols[:n] + int(offset)
        dst[r, :len(take)] = take
    return Tile(dst, dt.INT32, (vr, n)), Tile(counts, cdt, (vr, 1))


# -- gather_row ------------------------------------------------------------------------------------------
@op("gather_row", family=_FAM, dtypes=ANY)
def gather_row(dst: Tile, src, dst_offset, src_offset, shapes, transpose: bool = False, *, valid_shape=None) -> Tile:
    """Copy the ``shapes`` window of GM tensor ``src`` at ``src_offset`` into ``dst`` at ``dst_offset`` (``transpose``: as columns)."""
    _tile("gather_row", "dst", dst)
    if not is_tensor(src):
        raise TileTypeError(f"pl.tile.gather_row: src must be a tensor in global memory, got "
                            f"{type(src).__name__}; gather_row copies from GM (use pl.assemble between tiles)")
    from ..memory_ops import load

    so, do, shp = _ints(src_offset), _ints(dst_offset), _ints(shapes)
    if len(do) != dst.data.ndim:
        raise TileValueError(f"pl.tile.gather_row: dst_offset {do} needs one entry per dst dimension "
                             f"({dst.data.ndim}, dst {dst.shape})")
    if src.dtype is not dst.dtype:
        raise TileTypeError(f"pl.tile.gather_row: src is {src.dtype.name} but dst is {dst.dtype.name}; "
                            "the copy does not convert, so allocate dst with the src's dtype")
    extent = _ints(valid_shape) if valid_shape is not None else shp
    if len(so) != len(src.shape) or len(extent) != len(src.shape) or any(
            o < 0 or o + e > b for o, e, b in zip(so, extent, src.shape)):
        raise TileIndexError(f"pl.tile.gather_row: the window {extent} at src_offset {so} runs outside src "
                             f"{list(src.shape)}; shrink the window or move the offset")
    window = load(src, so, shp, list(valid_shape) if valid_shape is not None else None)
    data = _valid(window)
    if transpose:
        if data.ndim != 2:
            raise TileValueError(f"pl.tile.gather_row: transpose=True places a 2-D row window as columns, "
                                 f"got the window {shp}")
        data = data.T
    end = [o + s for o, s in zip(do, data.shape)]
    if any(o < 0 for o in do) or any(e > b for e, b in zip(end, dst.shape)):
        raise TileIndexError(f"pl.tile.gather_row: the window {list(data.shape)} at dst_offset {do} runs outside "
                             f"dst {dst.shape}; shrink the window or move the offset")
    out = dst.data.copy()
    out[tuple(slice(o, e) for o, e in zip(do, end))] = data
    return Tile(out, dst.dtype, dst.valid_shape)


@tensor_impl("gather_row")
def _gather_row_tensor(dst, src, dst_offset, src_offset, shapes, transpose: bool = False, *, valid_shape=None):
    if isinstance(dst, Tile):
        return gather_row(dst, src, dst_offset, src_offset, shapes, transpose, valid_shape=valid_shape)
    if not is_tensor(dst):
        raise TileTypeError(f"pl.gather_row: dst must be a tile or an on-chip accumulator tensor "
                            f"(pl.create_l1), got {type(dst).__name__}")
    from ..memory_ops import load, store

    whole = load(dst, [0] * len(dst.shape), list(dst.shape))
    res = gather_row(whole, src, dst_offset, src_offset, shapes, transpose, valid_shape=valid_shape)
    store(res, [0] * len(dst.shape), dst)
    return dst  # upstream aliases the accumulator: the result is dst, written in place


# -- paged_gather ----------------------------------------------------------------------------------------
@op("paged_gather", family=_FAM, dtypes=ANY, levels=("tensor",))
def paged_gather(src, indices, block_table, block_size: int, size: int, max_indices: int, *, space=None,
                 col_off: int = 0, is_trans: bool = False, is_b_matrix: bool = False):
    """Gather rows of paged pool ``src``: row ``block_table[i // block_size] * block_size + i % block_size`` per logical ``i``."""
    from ..memory_ops import load
    from .registry import _fresh, _whole

    if not is_tensor(src) or len(src.shape) != 2:
        raise TileTypeError(f"pl.paged_gather: src must be a 2-D tensor (the paged pool in GM), got "
                            f"{type(src).__name__}{' ' + str(list(src.shape)) if is_tensor(src) else ''}")
    if src.dtype not in (dt.FP16, dt.BF16, dt.FP32, dt.INT8):
        raise TileTypeError(f"pl.paged_gather: src is {src.dtype.name}; the pool holds FP16, BF16, FP32 or INT8")
    idx_t, bt_t = _whole(indices), _whole(block_table)
    for what, t in (("indices", idx_t), ("block_table", bt_t)):
        _tile("pl.paged_gather", what, t)
        _dtype("pl.paged_gather", what, t, (dt.INT32,))
    if idx_t.data.ndim not in (1, 2) or (idx_t.data.ndim == 2 and idx_t.shape[0] != 1):
        raise TileValueError(f"pl.paged_gather: indices {idx_t.shape} must be 1-D [n] or 2-D [1, n]")
    bs, size, cap, col_off = int(block_size), int(size), int(max_indices), int(col_off)
    if bs <= 0:
        raise TileValueError(f"pl.paged_gather: block_size {bs} must be positive")
    if col_off < 0 or col_off + size > src.shape[1]:
        raise TileIndexError(f"pl.paged_gather: columns [{col_off}, {col_off + size}) run outside src "
                             f"{list(src.shape)}; size + col_off must stay within the row")
    logical = _valid(idx_t).reshape(-1).astype(np.int64)
    table = _valid(bt_t).reshape(-1).astype(np.int64)
    if len(logical) > cap:
        raise TileValueError(f"pl.paged_gather: {len(logical)} indices exceed max_indices={cap}; raise "
                             "max_indices (it sizes the result)")
    _first_bad("pl.paged_gather", logical, len(table) * bs, "indices",
               f"a logical row must fall in one of the block table's {len(table)} blocks of {bs} rows")
    phys = table[logical // bs] * bs + logical % bs
    _first_bad("pl.paged_gather", phys, src.shape[0], "the physical rows (block_table[i // block_size] * "
               "block_size + i % block_size)", f"block_table entries must name pages of the {src.shape[0]}-row pool")
    out = np.zeros((cap, size), dtype=src.dtype.np_dtype)
    for k, r in enumerate(phys):
        out[k] = load(src, [int(r), col_off], [1, size]).data[0]
    valid = (len(logical), size)
    if is_trans:
        name = getattr(space, "name", "Mat") if space is not None else "Mat"
        if name != "Mat":
            raise TileValueError("pl.paged_gather: is_trans=True lays the rows out for a matmul B operand in L1; "
                                 "it needs space=pl.MemorySpace.Mat")
        out, valid = np.ascontiguousarray(out.T), (size, len(logical))
    return _fresh(Tile(out, src.dtype, valid))


# -- gatherb ---------------------------------------------------------------------------------------------
@op("gatherb", family=_FAM, reach="pl(t)", dtypes=ANY, levels=("tile",))
def gatherb(src: Tile, offsets: Tile, *, output_dtype=None) -> Tile:
    """Gather 32-byte blocks of ``src`` at UINT32 byte ``offsets``; each offset becomes ``32 / sizeof(output_dtype)`` elements."""
    _tile("gatherb", "src", src)
    _tile("gatherb", "offsets", offsets)
    _u32_index("gatherb", "offsets", offsets)
    out_dt = src.dtype if output_dtype is None else _as_dtype("gatherb", output_dtype, "output_dtype")
    if offsets.data.ndim != 2 or offsets.shape[1] == 0 or offsets.shape[1] % 8:
        raise TileValueError(f"pl.tile.gatherb: offsets {offsets.shape} must be 2-D with a positive multiple of 8 "
                             "entries per row")
    per = 32 // out_dt.get_byte()
    raw = np.frombuffer(np.ascontiguousarray(src.data).tobytes(), dtype=np.uint8)
    vr, vc = offsets.valid_shape
    off = _valid(offsets).astype(np.int64) & 0xFFFFFFFF  # the device reads the offsets as unsigned
    _first_bad("gatherb", off, len(raw) - 31, "offsets",
               f"a 32-byte block at that byte offset would run past src ({len(raw)} bytes)")
    out = np.zeros((offsets.shape[0], offsets.shape[1] * per), dtype=out_dt.np_dtype)
    blocks = raw[off[..., None] + np.arange(32)].reshape(vr, vc * 32)
    out[:vr, :vc * per] = np.ascontiguousarray(blocks).view(out_dt.np_dtype)
    return Tile(out, out_dt, (vr, vc * per))


# -- mgather ---------------------------------------------------------------------------------------------
def _policy(opn: str, table: dict, value, what: str) -> int:
    if isinstance(value, str) and value in table:
        return table[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in table.values():
        return value
    raise TileValueError(f"pl.tile.{opn}: {what} must be one of {', '.join(map(repr, table))} or "
                         f"0..{len(table) - 1}, got {value!r}")


@op("mgather", family=_FAM, reach="pl(t)", dtypes=ANY, levels=("tile",))
def mgather(mem, idx, coalesce="row", *, gather_oob="undefined", target_memory=None, scratch=None,
            valid_shape=None) -> Tile:
    """Gather rows (``coalesce="row"``) or flat elements (``"elem"``) of GM tensor ``mem`` by an INT32 index tile."""
    from ..memory_ops import load
    from .registry import _whole

    mode = _policy("mgather", _MGATHER_COALESCE, coalesce, "coalesce")
    oob = _policy("mgather", _MGATHER_OOB, gather_oob, "gather_oob")
    if not is_tensor(mem):
        raise TileTypeError(f"pl.tile.mgather: mem must be a tensor in global memory, got {type(mem).__name__}; "
                            "to gather from a tile use pl.tile.gather")
    it = _tile("mgather", "idx", _whole(idx))
    _dtype("mgather", "idx", it, (dt.INT32,))
    shape = list(mem.shape)
    if mode == 0:
        if len(shape) != 2:
            raise TileValueError(f"pl.tile.mgather: coalesce='row' gathers rows of a 2-D tensor, mem is {shape}")
        if it.data.ndim != 2 or 1 not in it.shape:
            raise TileValueError(f"pl.tile.mgather: a row index tile is [1, R] or [R, 1], got {it.shape}")
        bound, out_shape = shape[0], (it.data.size, shape[1])
    else:
        bound, out_shape = int(np.prod(shape)), tuple(it.shape)
    active = _valid(it).reshape(-1).astype(np.int64)
    if oob == 0:
        _first_bad("mgather", active, bound, "idx", "pass gather_oob='clamp', 'wrap' or 'zero' to define "
                   "out-of-range indices, or fix the index")
    elif oob == 1:
        active = np.clip(active, 0, bound - 1)
    elif oob == 2:
        active = active % bound
    hit = (active >= 0) & (active < bound)  # only gather_oob='zero' leaves misses here: they read as zero
    out = np.zeros(out_shape, dtype=mem.dtype.np_dtype)
    if mode == 0:
        rows = {int(r): load(mem, [int(r), 0], [1, shape[1]]).data[0] for r in np.unique(active[hit])}
        for k, r in enumerate(active):
            if hit[k]:
                out[k] = rows[int(r)]
        valid = (len(active), shape[1])
    else:
        flat = out.reshape(-1)
        vals = {int(f): load(mem, [int(i) for i in np.unravel_index(int(f), shape)], [1] * len(shape)).data.item()
                for f in np.unique(active[hit])}
        dest = np.ravel_multi_index(np.nonzero(np.ones(it.valid_shape, dtype=bool)), it.shape)
        for k, f in enumerate(active):
            if hit[k]:
                flat[dest[k]] = vals[int(f)]
        valid = tuple(it.valid_shape)
    if valid_shape is not None:
        valid = tuple(min(int(a), b) for a, b in zip(_ints(valid_shape), valid))
    return Tile(out, mem.dtype, valid)


# -- scatter ---------------------------------------------------------------------------------------------
@op("scatter", family=_FAM, dtypes=ANY)
def scatter(input: Tile, dim=None, index=None, src=None, *, mask_pattern=None, dst=None) -> Tile:
    """Scatter by index: ``out[b, index[b, k]] = src[b, k]`` (last write wins), or into ``dst``'s mask-pattern columns."""
    _tile("scatter", "input", input)
    is_index = dim is not None or index is not None or src is not None
    is_mask = mask_pattern is not None or dst is not None
    if is_index and is_mask:
        raise TileTypeError("pl.tile.scatter: the index form (dim, index, src) and the mask form "
                            "(mask_pattern=, dst=) are exclusive; pass the arguments of one")
    _dtype("scatter", "input", input, _SCATTER_DST)
    if is_mask:
        if mask_pattern is None or dst is None:
            raise TileTypeError("pl.tile.scatter: the mask form needs both mask_pattern= and dst=")
        _tile("scatter", "dst", dst)
        start, stride = _mask("scatter", mask_pattern)
        if dst.dtype is not input.dtype or list(dst.shape[:-1]) != input.shape[:-1] or \
                dst.shape[-1] != input.shape[-1] * stride:
            raise TileValueError(f"pl.tile.scatter: the mask form writes input {input.shape} {input.dtype.name} "
                                 f"into every {stride}th column of dst, so dst must be "
                                 f"{[*input.shape[:-1], input.shape[-1] * stride]} {input.dtype.name}; got "
                                 f"{dst.shape} {dst.dtype.name}")
        out = dst.data.copy()
        out[..., start::stride] = input.data
        return Tile(out, dst.dtype, dst.valid_shape)
    if isinstance(dim, Tile):
        raise TileTypeError("pl.tile.scatter: the second argument is the axis (dim=-1), got a Tile; call "
                            "pl.tile.scatter(input, -1, index, src)")
    if dim is None or index is None or src is None:
        raise TileTypeError("pl.tile.scatter: the index form needs dim, index and src: "
                            "pl.scatter(input, dim=-1, index=idx, src=values)")
    _tile("scatter", "index", index)
    _tile("scatter", "src", src)
    if input.data.ndim != 2 or int(dim) not in (-1, 1):
        raise TileValueError(f"pl.tile.scatter: scatters along the last axis of a 2-D input (dim=-1); got "
                             f"input {input.shape} with dim={dim}")
    if src.dtype is not input.dtype:
        raise TileTypeError(f"pl.tile.scatter: src is {src.dtype.name} but input is {input.dtype.name}; "
                            "cast src to the input's dtype")
    want = dt.INT32 if input.dtype.get_byte() == 4 else dt.INT16
    _dtype("scatter", "index", index, (want,))
    if index.shape != src.shape or index.shape[0] > input.shape[0] or index.shape[1] > input.shape[1]:
        raise TileValueError(f"pl.tile.scatter: index {index.shape} must have src's shape {src.shape}, with no "
                             f"more rows or columns than input {input.shape}")
    vr = min(index.valid_shape[0], src.valid_shape[0])
    vk = min(index.valid_shape[1], src.valid_shape[1])
    cols = index.data[:vr, :vk].astype(np.int64)
    _first_bad("scatter", cols, input.shape[1], "index", "each index names a column of input")
    out = input.data.copy()
    rows = np.arange(vr)
    for k in range(vk):  # ascending k: a column written twice keeps the later value
        out[rows, cols[:, k]] = src.data[:vr, k]
    return Tile(out, input.dtype, input.valid_shape)


# -- scatter_update --------------------------------------------------------------------------------------
@op("scatter_update", family=_FAM, dtypes=ANY)
def scatter_update(input: Tile, *args, dim=None, index=None, src=None, scratch=None) -> Tile:
    """Replace rows of ``input`` with rows of ``src``: row ``index.flat[k]`` gets ``src`` row ``k`` (``dim=-2``; last write wins)."""
    _tile("scatter_update", "input", input)
    if len(args) >= 3 and dim is None and index is None and src is None:
        dim, index, src, *rest = args
    elif len(args) >= 2 and dim is not None and index is None and src is None:
        index, src, *rest = args
    elif len(args) == 1 and dim is None and index is not None and src is not None:
        dim, rest = args[0], []
    elif not args and dim is not None and index is not None and src is not None:
        rest = []
    else:
        raise TileTypeError("pl.tile.scatter_update takes (input, dim, index, src), (input, index, src, dim=-2) "
                            "or (input, dim, index=..., src=...)")
    if len(rest) > 1 or (rest and scratch is not None):
        raise TileTypeError("pl.tile.scatter_update: too many arguments; the only extra one is the scratch tile")
    d = int(dim.value if isinstance(dim, Scalar) else dim)
    if d != -2:
        raise TileValueError(f"pl.tile.scatter_update: only dim=-2 is supported (whole rows), got {d}")
    _tile("scatter_update", "index", index)
    _tile("scatter_update", "src", src)
    _dtype("scatter_update", "index", index, _INT_INDEX)
    if src.dtype is not input.dtype:
        raise TileTypeError(f"pl.tile.scatter_update: src is {src.dtype.name} but input is {input.dtype.name}; "
                            "cast src to the input's dtype")
    nd = input.data.ndim
    ok = (nd == 2 and src.data.ndim == 2) or (nd == 4 and src.data.ndim == 4 and input.shape[2] == 1
                                              and src.shape[2] == 1)
    if not ok or index.data.ndim != 2 or src.shape[-1] != input.shape[-1]:
        raise TileValueError(f"pl.tile.scatter_update: takes input [rows, d] with src [b*s, d], or input "
                             f"[blocks, block_size, 1, d] with src [b, s, 1, d], and index [b, s]; got input "
                             f"{input.shape}, src {src.shape}, index {index.shape}")
    width = input.shape[-1]
    dst = input.data.copy().reshape(-1, width)
    rows = src.data.reshape(-1, width)
    if rows.shape[0] != index.data.size:
        raise TileValueError(f"pl.tile.scatter_update: index {index.shape} names {index.data.size} rows but src "
                             f"{src.shape} holds {rows.shape[0]}; they must match")
    vb, vs = index.valid_shape
    s = index.shape[1]
    targets = index.data[:vb, :vs].astype(np.int64)
    _first_bad("scatter_update", targets, dst.shape[0], "index", f"each index names one of input's "
               f"{dst.shape[0]} rows")
    for i in range(vb):  # row-major order: a row written twice keeps the later src row
        for j in range(vs):
            dst[targets[i, j]] = rows[i * s + j]
    return Tile(dst.reshape(input.data.shape), input.dtype, input.valid_shape)


# -- mscatter --------------------------------------------------------------------------------------------
@op("mscatter", family=_FAM, reach="pl(t)", dtypes=ANY, levels=("tile",))
def mscatter(src: Tile, idx: Tile, output_tensor):
    """Store ``src`` elements into GM tensor ``output_tensor`` at flat offsets ``idx`` (row-major; last write wins)."""
    from ..memory_ops import store

    _tile("mscatter", "src", src)
    _tile("mscatter", "idx", idx)
    _dtype("mscatter", "src", src, _GATHER_SRC)
    _dtype("mscatter", "idx", idx, (dt.INT32,))
    if not is_tensor(output_tensor):
        raise TileTypeError(f"pl.tile.mscatter: output_tensor must be a tensor in global memory, got "
                            f"{type(output_tensor).__name__}")
    if output_tensor.dtype is not src.dtype:
        raise TileTypeError(f"pl.tile.mscatter: src is {src.dtype.name} but output_tensor is "
                            f"{output_tensor.dtype.name}; they must match")
    if idx.shape != src.shape:
        raise TileValueError(f"pl.tile.mscatter: idx {idx.shape} must have src's shape {src.shape}")
    shape = list(output_tensor.shape)
    vsh = [min(a, b) for a, b in zip(src.valid_shape, idx.valid_shape)]
    sl = tuple(slice(0, v) for v in vsh)
    offs = idx.data[sl].astype(np.int64)
    _first_bad("mscatter", offs, int(np.prod(shape)), "idx", f"offsets are flat element positions in "
               f"output_tensor {shape}")
    vals = src.data[sl]
    one = [1] * len(shape)
    for pos in np.ndindex(*offs.shape):
        at = [int(i) for i in np.unravel_index(int(offs[pos]), shape)]
        store(Tile(vals[pos].reshape(one), src.dtype), at, output_tensor)
    return output_tensor


class MaskPattern:
    """The column patterns of ``pl.tile.gather_mask`` (bits read right to left: bit i selects column i)."""

    P0101 = 1  # columns 0, 2, 4, ...
    P1010 = 2  # columns 1, 3, 5, ...
    P0001 = 3  # columns 0, 4, 8, ...
    P0010 = 4  # columns 1, 5, 9, ...
    P0100 = 5  # columns 2, 6, 10, ...
    P1000 = 6  # columns 3, 7, 11, ...
    P1111 = 7  # every column


_MASK_COLUMNS = {1: (0, 2), 2: (1, 2), 3: (0, 4), 4: (1, 4), 5: (2, 4), 6: (3, 4), 7: (0, 1)}  # (first, stride)


def _mask_columns(name: str, mask_pattern) -> tuple[int, int]:
    """``(first column, stride)`` of a mask pattern."""
    if isinstance(mask_pattern, bool) or mask_pattern not in _MASK_COLUMNS:
        raise TileValueError(f"pl.tile.{name}: mask_pattern={mask_pattern!r} is not a pattern; pass one of "
                             "pl.tile.MaskPattern.P0101 .. P1111 (1 .. 7)")
    return _MASK_COLUMNS[int(mask_pattern)]


@op("gather_mask", family=_FAM, reach="tile", dtypes=(dt.FP16, dt.FP32, dt.INT16, dt.INT32), levels=("tile",))
def gather_mask(src: Tile, mask_pattern: int, *, output_dtype: DataType | None = None) -> Tile:
    """The columns of each row that ``mask_pattern`` (``pl.tile.MaskPattern``) selects; ``output_dtype``
    reinterprets their bits."""
    if not isinstance(src, Tile):
        raise TileTypeError(f"pl.tile.gather_mask takes a Tile, got {type(src).__name__}")
    first, stride = _mask_columns("gather_mask", mask_pattern)
    out = np.ascontiguousarray(src.data[..., first::stride])
    valid = (*src.valid_shape[:-1], max(0, -(-(src.valid_shape[-1] - first) // stride)))
    dtype = src.dtype
    if output_dtype is not None:
        if not isinstance(output_dtype, DataType) or output_dtype.get_byte() != src.dtype.get_byte():
            raise TileTypeError(f"pl.tile.gather_mask: output_dtype={output_dtype!r} must be a pl dtype of the "
                                f"source's width ({src.dtype.get_byte()} bytes): the bits are reinterpreted")
        out, dtype = out.view(output_dtype.np_dtype), output_dtype
    return Tile(out, dtype, valid if tuple(valid) != out.shape else None)


@op("scatter_mask", family=_FAM, reach="tile", dtypes=ANY, levels=("tile",))
def scatter_mask(dst: Tile, src: Tile, mask_pattern: int) -> Tile:
    """``dst`` with each row of ``src`` written into the columns ``mask_pattern`` selects (gather_mask's inverse)."""
    for what, t in (("dst", dst), ("src", src)):
        if not isinstance(t, Tile):
            raise TileTypeError(f"pl.tile.scatter_mask: {what} must be a Tile, got {type(t).__name__}")
    first, stride = _mask_columns("scatter_mask", mask_pattern)
    if src.dtype is not dst.dtype:
        raise TileTypeError(f"pl.tile.scatter_mask: src is {src.dtype.name} but dst is {dst.dtype.name}; convert "
                            f"src first with pl.cast(src, target_type=pl.{dst.dtype.name})")
    selected = dst.data[..., first::stride].shape
    if src.data.shape != selected:
        raise TileValueError(f"pl.tile.scatter_mask: src has shape {src.shape}, but the pattern selects "
                             f"{list(selected)} of the {dst.shape} dst (its columns {first}, {first + stride}, ...)")
    out = dst.data.copy()
    out[..., first::stride] = src.data
    return Tile(out, dst.dtype, None if dst.valid_shape == dst.data.shape else dst.valid_shape)
