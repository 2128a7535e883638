"""Linear algebra: ``matmul`` and its family (accumulate, bias, batched, GEMV, MX block-scale).

As on the cube unit: both operands have one dtype (FP32, FP16, BF16 or INT8), float products accumulate
in FP32 and INT8 products in INT32 (wrapping), and the result lands in ``Acc``.  A product reads the
valid region of its operands (``M`` rows and ``K`` columns of ``lhs``, ``N`` columns of ``rhs``); the
result keeps the operands' physical shape with valid shape ``[M, N]`` and zeros elsewhere.

MX block scale: data tiles are FP8E4M3FN, each run of 32 consecutive K elements shares one FP8E8M0
scale (a power of two): ``lhs_scale`` is ``[M, ceil(K/32)]`` (row ``i``, group ``g`` scales
``lhs[i, 32g:32g+32]``), ``rhs_scale`` is ``[ceil(K/32), N]`` (scales ``rhs[32g:32g+32, j]``).
"""

from __future__ import annotations

import numpy as np

from ...errors import TileTypeError, TileValueError
from .. import dtypes as dt
from ..dtypes import DataType
from ..scalar import Scalar
from ..spaces import MemorySpace, check_operand
from ..tile_ops import Tile
from .registry import ANY, _fresh, _whole, is_tensor, op, tensor_impl

_LA = "Linear algebra"

CUBE = (dt.FP32, dt.FP16, dt.BF16, dt.INT8)  # what the cube unit multiplies
_WITH_ACC = (*CUBE, dt.INT32)  # ... plus the INT32 accumulator of INT8 products
MX_BLOCK = 32  # K elements per FP8E8M0 scale
_ACC_PHASES = ("unspecified", "partial", "final")
_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}
_TRANSPOSE_FIX = ("at tile level transpose the operand itself (pl.transpose(tile), or pl.load(..., "
                  "target_memory=pl.MemorySpace.Mat, transpose=True)) and pass it")


# -- checks ------------------------------------------------------------------------------------------------
def _tiles(name: str, *args) -> None:
    if not all(isinstance(a, Tile) for a in args):
        kinds = [type(a).__name__ for a in args]
        got = ", ".join(kinds[:-1]) + " and " + kinds[-1]
        raise TileTypeError(f"pl.{name} takes {_WORDS[len(args)]} Tiles, got {got}; "
                            "load tensors into tiles with pl.load first")


def _two_d(name: str, slot: str, t: Tile, hint: str = "") -> None:
    if t.data.ndim != 2:
        raise TileValueError(f"pl.{name}: {slot} must be a 2-D tile, got shape {t.shape}{hint}")


def _tile_flags(name: str, **flags) -> None:
    """Upstream rejects the tensor-level layout flags on tiles rather than dropping them."""
    for flag, given in flags.items():
        if given:
            fix = _TRANSPOSE_FIX if flag.endswith("_trans") else (
                "the layout of a tile product is fixed by its Acc tile; the flag exists for tensors only")
            raise TileTypeError(f"pl.{name}: '{flag}' is not supported for Tile operands: {fix}")


def _cube_operands(name: str, lhs: Tile, rhs: Tile) -> DataType:
    """Check the operand dtypes; return the accumulator dtype."""
    for slot, t in (("lhs", lhs), ("rhs", rhs)):
        if t.dtype not in CUBE:
            raise TileTypeError(
                f"pl.{name}: {slot} is {t.dtype.name}, but the cube unit multiplies "
                f"{', '.join(d.name for d in CUBE)}; convert it first with pl.cast({slot}, target_type=pl.<dtype>)")
    if lhs.dtype is not rhs.dtype:
        raise TileTypeError(f"pl.{name}: lhs is {lhs.dtype.name} but rhs is {rhs.dtype.name}; the cube unit multiplies "
                            f"two operands of one dtype: convert one with pl.cast(tile, target_type=pl.{lhs.dtype.name})")
    return dt.FP32 if lhs.dtype.is_float else dt.INT32


def _acc_dtype_is(name: str, slot: str, t: Tile, acc: DataType) -> None:
    if t.dtype is not acc:
        raise TileTypeError(f"pl.{name}: {slot} is {t.dtype.name}, but the product accumulates in {acc.name} and the "
                            f"{slot} must have the accumulator dtype; convert it with pl.cast({slot}, "
                            f"target_type=pl.{acc.name})")


def _truth(cond) -> bool:
    if isinstance(cond, Scalar):
        cond = cond.value
    return bool(cond)


def _phase(name: str, acc_phase: str) -> None:
    if acc_phase not in _ACC_PHASES:
        raise TileValueError(f"pl.{name}: acc_phase={acc_phase!r} is not one of {', '.join(map(repr, _ACC_PHASES))}")


# -- the product ---------------------------------------------------------------------------------------------
def _product(name: str, a: np.ndarray, b: np.ndarray, a_valid, b_valid, acc: DataType):
    """``a @ b`` over the valid region, in ``acc``: ``(full-shape result, its valid shape)``."""
    if a.shape[-1] != b.shape[-2]:
        raise TileValueError(f"pl.{name}: inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    m, k = a_valid[-2:]
    n = b_valid[-1]
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise TileValueError(f"pl.{name}: batch dimensions {list(a.shape[:-2])} and {list(b.shape[:-2])} do not "
                             "broadcast") from None
    # Accumulate in the accumulator dtype: FP16/BF16 products in FP32, INT8 in INT32 (numpy wraps like C).
    part = np.matmul(a[..., :m, :k].astype(acc.np_dtype), b[..., :k, :n].astype(acc.np_dtype))
    out = np.zeros((*batch, a.shape[-2], b.shape[-1]), acc.np_dtype)
    out[..., :m, :n] = part
    return out, (*batch, m, n)


def _valid(valid, shape):
    return None if tuple(valid) == tuple(shape) else valid


def _acc_tile(out: np.ndarray, dtype: DataType, valid) -> Tile:
    return Tile(out, dtype, _valid(valid, out.shape), space=MemorySpace.Acc)


def _mm(name: str, lhs: Tile, rhs: Tile, hint: str = ""):
    _two_d(name, "lhs", lhs, hint)
    _two_d(name, "rhs", rhs, hint)
    acc = _cube_operands(name, lhs, rhs)
    check_operand(name, "lhs", lhs)
    check_operand(name, "rhs", rhs)
    out, valid = _product(name, lhs.data, rhs.data, lhs.valid_shape, rhs.valid_shape, acc)
    return out, valid, acc


def _accumulate(name: str, acc_t: Tile, out: np.ndarray, valid, acc: DataType, init_cond) -> Tile:
    _two_d(name, "acc", acc_t)
    _acc_dtype_is(name, "acc", acc_t, acc)
    if acc_t.shape != list(out.shape):
        raise TileValueError(f"pl.{name}: acc has shape {acc_t.shape}, but the product is {list(out.shape)}")
    check_operand(name, "acc", acc_t)
    if init_cond is not None and _truth(init_cond):
        return _acc_tile(out, acc, valid)
    return _acc_tile(acc_t.data + out, acc, acc_t.valid_shape)


def _add_bias(name: str, bias: Tile, out: np.ndarray, valid, acc: DataType) -> Tile:
    _two_d(name, "bias", bias)
    n = out.shape[-1]
    if bias.shape != [1, n]:
        raise TileValueError(f"pl.{name}: bias must have shape [1, N] = [1, {n}], got {bias.shape}")
    _acc_dtype_is(name, "bias", bias, acc)
    check_operand(name, "bias", bias)
    out = out.copy()
    m, nv = valid[-2:]
    out[:m, :nv] += bias.data[:, :nv]
    return _acc_tile(out, acc, valid)


# -- matmul ----------------------------------------------------------------------------------------------
@op("matmul", family=_LA, dtypes=CUBE)
def matmul(lhs: Tile, rhs: Tile, out_dtype: DataType | None = None, a_trans: bool = False, b_trans: bool = False,
           c_matrix_nz: bool = False) -> Tile:
    """Matrix product ``lhs @ rhs`` into ``Acc`` (FP32 for float operands, INT32 for INT8); tensors take ``a_trans``/``b_trans``."""
    _tiles("matmul", lhs, rhs)
    _tile_flags("matmul", a_trans=a_trans, b_trans=b_trans, c_matrix_nz=c_matrix_nz)
    out, valid, acc = _mm("matmul", lhs, rhs, "; use pl.batch_matmul for batched tiles")
    if out_dtype is not None:
        if not isinstance(out_dtype, DataType):
            raise TileTypeError(f"pl.matmul: out_dtype must be a pl dtype (pl.FP32, ...), got {out_dtype!r}")
        return Tile(out.astype(out_dtype.np_dtype), out_dtype, _valid(valid, out.shape), space=MemorySpace.Acc)
    return _acc_tile(out, acc, valid)


def _tensor_operands(name: str, *xs):
    if not all(is_tensor(x) for x in xs):
        kinds = " and ".join(type(x).__name__ for x in xs)
        raise TileTypeError(f"pl.{name}: cannot mix tensors and tiles ({kinds}); pass all tensors "
                            f"(pl.tensor.{name}) or all tiles (pl.tile.{name})")
    return _whole(list(xs))


def _oriented(name: str, slot: str, t: Tile, trans: bool) -> np.ndarray:
    data = t.data
    if trans:
        if data.ndim < 2:
            raise TileValueError(f"pl.tensor.{name}: {slot[0]}_trans needs a {slot} of at least 2 dimensions, "
                                 f"got shape {t.shape}")
        data = np.swapaxes(data, -1, -2)
    return data


def _tensor_product(name: str, a: Tile, b: Tile, a_trans: bool, b_trans: bool):
    acc = _cube_operands(name, a, b)
    x, y = _oriented(name, "lhs", a, a_trans), _oriented(name, "rhs", b, b_trans)
    # A 1-D operand is a vector: [K] @ [K, N] -> [N], [M, K] @ [K] -> [M].
    vec_l, vec_r = x.ndim == 1, y.ndim == 1
    x = x[None, :] if vec_l else x
    y = y[:, None] if vec_r else y
    out, _ = _product(name, x, y, x.shape, y.shape, acc)
    if vec_r:
        out = out[..., 0]
    if vec_l:
        out = out[..., 0, :] if not vec_r else out[..., 0]
    return out, acc


@tensor_impl("matmul")
def tensor_matmul(lhs, rhs, out_dtype: DataType | None = None, a_trans: bool = False, b_trans: bool = False,
                  c_matrix_nz: bool = False):
    """Matrix product of two tensors into a fresh tensor; rank > 2 is a batched product."""
    if out_dtype is not None and not isinstance(out_dtype, DataType):
        raise TileTypeError(f"pl.matmul: out_dtype must be a pl dtype (pl.FP32, ...), got {out_dtype!r}")
    a, b = _tensor_operands("matmul", lhs, rhs)
    out, acc = _tensor_product("matmul", a, b, a_trans, b_trans)
    dtype = out_dtype or acc
    return _fresh(Tile(np.asarray(out).astype(dtype.np_dtype), dtype))


# -- matmul_acc / matmul_bias / batch_matmul -------------------------------------------------------------------
@op("matmul_acc", family=_LA, dtypes=_WITH_ACC)
def matmul_acc(acc: Tile, lhs: Tile, rhs: Tile, init_cond=None, *, a_trans: bool = False,
               b_trans: bool = False) -> Tile:
    """``acc + lhs @ rhs`` in the accumulator (``acc`` from an earlier product); ``init_cond`` true: ``lhs @ rhs``."""
    _tiles("matmul_acc", acc, lhs, rhs)
    _tile_flags("matmul_acc", a_trans=a_trans, b_trans=b_trans)
    out, valid, dtype = _mm("matmul_acc", lhs, rhs)
    return _accumulate("matmul_acc", acc, out, valid, dtype, init_cond)


@tensor_impl("matmul_acc")
def tensor_matmul_acc(acc, lhs, rhs, a_trans: bool = False, b_trans: bool = False, init_cond=None):
    """``acc + lhs @ rhs`` on tensors, into a fresh tensor."""
    c, a, b = _tensor_operands("matmul_acc", acc, lhs, rhs)
    out, dtype = _tensor_product("matmul_acc", a, b, a_trans, b_trans)
    _acc_dtype_is("matmul_acc", "acc", c, dtype)
    if list(np.shape(out)) != c.shape:
        raise TileValueError(f"pl.matmul_acc: acc has shape {c.shape}, but the product is {list(np.shape(out))}")
    if init_cond is None or not _truth(init_cond):
        out = c.data + out
    return _fresh(Tile(np.asarray(out, dtype.np_dtype), dtype))


@op("matmul_bias", family=_LA, reach="pl(t)", dtypes=_WITH_ACC, levels=("tile",))
def matmul_bias(lhs: Tile, rhs: Tile, bias: Tile) -> Tile:
    """``lhs @ rhs + bias``; ``bias`` is ``[1, N]`` in the accumulator dtype, added to every row."""
    _tiles("matmul_bias", lhs, rhs, bias)
    out, valid, acc = _mm("matmul_bias", lhs, rhs)
    return _add_bias("matmul_bias", bias, out, valid, acc)


@op("batch_matmul", family=_LA, reach="pl(t)", dtypes=CUBE, levels=("tile",))
def batch_matmul(lhs: Tile, rhs: Tile) -> Tile:
    """Batched product ``[..., M, K] @ [..., K, N] -> [..., M, N]``, batch dimensions broadcast."""
    _tiles("batch_matmul", lhs, rhs)
    for slot, t in (("lhs", lhs), ("rhs", rhs)):
        if t.data.ndim < 2:
            raise TileValueError(f"pl.batch_matmul: {slot} must have at least 2 dimensions, got shape {t.shape}")
    acc = _cube_operands("batch_matmul", lhs, rhs)
    check_operand("batch_matmul", "lhs", lhs)
    check_operand("batch_matmul", "rhs", rhs)
    out, valid = _product("batch_matmul", lhs.data, rhs.data, lhs.valid_shape, rhs.valid_shape, acc)
    return _acc_tile(out, acc, valid)


@op("batch_matmul_acc", family=_LA, reach="tile", dtypes=_WITH_ACC, levels=("tile",))
def batch_matmul_acc(acc: Tile, lhs: Tile, rhs: Tile) -> Tile:
    """``acc + lhs @ rhs`` for batched tiles: ``lhs`` and ``rhs`` broadcast to ``acc``'s batch shape."""
    _tiles("batch_matmul_acc", acc, lhs, rhs)
    prod = batch_matmul(lhs, rhs)
    if acc.shape != prod.shape:
        raise TileValueError(f"pl.batch_matmul_acc: acc has shape {acc.shape}, but the product is {prod.shape}; "
                             "the broadcast batch shape of lhs and rhs must be acc's (acc is not broadcast)")
    _acc_dtype_is("batch_matmul_acc", "acc", acc, prod.dtype)
    check_operand("batch_matmul_acc", "acc", acc)
    return _acc_tile(acc.data + prod.data, prod.dtype, acc.valid_shape)


# -- GEMV --------------------------------------------------------------------------------------------------
def _gemv(name: str, lhs: Tile, rhs: Tile, acc_phase: str):
    _phase(name, acc_phase)
    _two_d(name, "lhs", lhs)
    if lhs.shape[0] != 1 or lhs.valid_shape[0] != 1:
        raise TileValueError(f"pl.{name}: lhs must be one row [1, K] (valid rows 1), got shape {lhs.shape} with "
                             f"valid shape {list(lhs.valid_shape)}; use pl.matmul for more rows")
    _two_d(name, "rhs", rhs)
    if lhs.shape[1] == rhs.shape[0] and rhs.valid_shape[0] < lhs.valid_shape[1]:
        raise TileValueError(f"pl.{name}: rhs has {rhs.valid_shape[0]} valid rows, fewer than the lhs's valid "
                             f"K={lhs.valid_shape[1]}; the rhs must cover the lhs's K")
    return _mm(name, lhs, rhs)


@op("gemv", family=_LA, reach="pl(t)", dtypes=CUBE, levels=("tile",))
def gemv(lhs: Tile, rhs: Tile, acc_phase: str = "unspecified") -> Tile:
    """Vector-matrix product ``[1, K] @ [K, N] -> [1, N]`` (FP32, or INT32 for INT8)."""
    _tiles("gemv", lhs, rhs)
    out, valid, acc = _gemv("gemv", lhs, rhs, acc_phase)
    return _acc_tile(out, acc, valid)


@op("gemv_acc", family=_LA, reach="pl(t)", dtypes=_WITH_ACC, levels=("tile",))
def gemv_acc(acc: Tile, lhs: Tile, rhs: Tile, acc_phase: str = "unspecified", *, init_cond=None) -> Tile:
    """``acc + lhs @ rhs`` for a one-row ``lhs``; ``init_cond`` true: ``lhs @ rhs``."""
    _tiles("gemv_acc", acc, lhs, rhs)
    out, valid, dtype = _gemv("gemv_acc", lhs, rhs, acc_phase)
    return _accumulate("gemv_acc", acc, out, valid, dtype, init_cond)


@op("gemv_bias", family=_LA, reach="pl(t)", dtypes=_WITH_ACC, levels=("tile",))
def gemv_bias(lhs: Tile, rhs: Tile, bias: Tile, acc_phase: str = "unspecified") -> Tile:
    """``lhs @ rhs + bias`` for a one-row ``lhs``; ``bias`` is ``[1, N]`` in the accumulator dtype."""
    _tiles("gemv_bias", lhs, rhs, bias)
    out, valid, acc = _gemv("gemv_bias", lhs, rhs, acc_phase)
    return _add_bias("gemv_bias", bias, out, valid, acc)


# -- MX block scale ------------------------------------------------------------------------------------------
def _groups(k: int) -> int:
    return -(-k // MX_BLOCK)


def _mx_scaled(name: str, slot: str, data: Tile, scale: Tile, k_axis: int) -> np.ndarray:
    """``data`` (FP32) times its per-32-K block scales, over ``data``'s valid region."""
    rows, cols = data.valid_shape
    k = data.valid_shape[k_axis]
    phys = [data.shape[0], _groups(data.shape[1])] if k_axis == 1 else [_groups(data.shape[0]), data.shape[1]]
    want_valid = [rows, _groups(k)] if k_axis == 1 else [_groups(k), cols]
    _two_d(name, f"{slot}_scale", scale)
    if scale.shape != phys or list(scale.valid_shape) != want_valid:
        raise TileValueError(
            f"pl.{name}: {slot}_scale must have shape {phys} (valid {want_valid}): one FP8E8M0 scale per "
            f"{MX_BLOCK} K elements of {slot} (shape {data.shape}, valid {list(data.valid_shape)}), "
            f"got shape {scale.shape} (valid {list(scale.valid_shape)})")
    factor = np.repeat(scale.data.astype(np.float32), MX_BLOCK, axis=k_axis)
    values = data.data[:rows, :cols].astype(np.float32)
    return values * (factor[:rows, :k] if k_axis == 1 else factor[:k, :cols])


def _mx(name: str, lhs: Tile, lhs_scale: Tile, rhs: Tile, rhs_scale: Tile):
    for slot, t, want in (("lhs", lhs, dt.FP8E4M3FN), ("rhs", rhs, dt.FP8E4M3FN),
                          ("lhs_scale", lhs_scale, dt.FP8E8M0), ("rhs_scale", rhs_scale, dt.FP8E8M0)):
        if t.dtype is not want:
            why = ("MX data tiles are FP8E4M3FN (FP4 data is not supported natively: the cube has no FP4 x FP4 "
                   "MX product, so cast an FP4 lhs to FP8E4M3FN with pl.cast first)" if want is dt.FP8E4M3FN else
                   "MX block scales are FP8E8M0 (one power-of-two exponent per 32 K elements)")
            raise TileTypeError(f"pl.{name}: {slot} is {t.dtype.name}, but {why}")
    _two_d(name, "lhs", lhs)
    _two_d(name, "rhs", rhs)
    (m, k), (k2, n) = lhs.shape, rhs.shape
    if k != k2:
        raise TileValueError(f"pl.{name}: inner dimensions differ: {lhs.shape} @ {rhs.shape}")
    for what, size, align in (("lhs rows M", m, 16), ("rhs columns N", n, 32), ("K", k, 64)):
        if size % align:
            raise TileValueError(f"pl.{name}: {what}={size} must be a multiple of {align}, as the MX cube "
                                 f"instruction requires (tile the data to M % 16, K % 64, N % 32)")
    kv = lhs.valid_shape[1]
    if rhs.valid_shape[0] != kv:
        raise TileValueError(f"pl.{name}: lhs valid K={kv} and rhs valid K={rhs.valid_shape[0]} differ")
    if _groups(kv) != _groups(k):
        raise TileValueError(f"pl.{name}: valid K={kv} must round up to as many {MX_BLOCK}-element scale groups as "
                             f"the physical K={k} ({_groups(k)}), got {_groups(kv)}")
    for slot, t in (("lhs", lhs), ("lhs_scale", lhs_scale), ("rhs", rhs), ("rhs_scale", rhs_scale)):
        check_operand(name, slot, t)
    a = _mx_scaled(name, "lhs", lhs, lhs_scale, 1)
    b = _mx_scaled(name, "rhs", rhs, rhs_scale, 0)
    out = np.zeros((m, n), np.float32)
    mv, nv = lhs.valid_shape[0], rhs.valid_shape[1]
    out[:mv, :nv] = a @ b
    return out, (mv, nv), dt.FP32


@op("matmul_mx", family=_LA, reach="pl(t)", dtypes=ANY)
def matmul_mx(lhs: Tile, lhs_scale: Tile, rhs: Tile, rhs_scale: Tile) -> Tile:
    """MX block-scale product of FP8E4M3FN tiles, each 32 K elements scaled by one FP8E8M0; FP32 result."""
    _tiles("matmul_mx", lhs, lhs_scale, rhs, rhs_scale)
    out, valid, acc = _mx("matmul_mx", lhs, lhs_scale, rhs, rhs_scale)
    return _acc_tile(out, acc, valid)


@op("matmul_mx_acc", family=_LA, reach="pl(t)", dtypes=ANY, levels=("tile",))
def matmul_mx_acc(acc: Tile, lhs: Tile, lhs_scale: Tile, rhs: Tile, rhs_scale: Tile) -> Tile:
    """``acc + matmul_mx(lhs, lhs_scale, rhs, rhs_scale)`` with an FP32 ``acc``."""
    _tiles("matmul_mx_acc", acc, lhs, lhs_scale, rhs, rhs_scale)
    out, valid, dtype = _mx("matmul_mx_acc", lhs, lhs_scale, rhs, rhs_scale)
    return _accumulate("matmul_mx_acc", acc, out, valid, dtype, None)


@op("matmul_mx_bias", family=_LA, reach="pl(t)", dtypes=ANY, levels=("tile",))
def matmul_mx_bias(lhs: Tile, lhs_scale: Tile, rhs: Tile, rhs_scale: Tile, bias: Tile) -> Tile:
    """``matmul_mx(lhs, lhs_scale, rhs, rhs_scale) + bias`` with an FP32 ``[1, N]`` bias."""
    _tiles("matmul_mx_bias", lhs, lhs_scale, rhs, rhs_scale, bias)
    out, valid, acc = _mx("matmul_mx_bias", lhs, lhs_scale, rhs, rhs_scale)
    return _add_bias("matmul_mx_bias", bias, out, valid, acc)
