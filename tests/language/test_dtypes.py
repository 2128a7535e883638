"""The element types and layouts: sizes, host arrays of every type, and ``pl.cast``'s rounding onto each format's grid.

Casts run inside a complete program (one rank) and are checked value by value against the format's
definition: round to nearest, ties to even; FP8E5M2 overflows to infinity, FP4 (E2M1) saturates at 6;
4-bit integers wrap modulo 16. Layout markers are recorded; DN and NZ tensor annotations are refused.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from conftest import on_every_rank, run_in_rank

import ptodist.language as pl
from ptodist import RankError, RunConfig, ir
from ptodist.errors import (
    DeclarationError,
    OperationTypeError,
    ProgramValueError,
    TileTypeError,
    TileValueError,
)
from ptodist.language.tile_ops import Tile


def cast_in_a_rank(values, target, source=pl.FP32, backend="sim", mode="round"):
    """Cast a row of ``source`` values to ``target`` inside a kernel; return the stored row."""
    x = np.asarray([values]).astype(source.np_dtype)
    n = x.shape[1]

    def body(x, out):
        pl.store(pl.cast(pl.load(x, [0, 0], [1, n]), target, mode), [0, 0], out)

    _, out = run_in_rank(body, x, np.zeros((1, n), target.np_dtype), backend=backend)
    assert out.dtype == target.np_dtype
    return out[0]


def test_sizes_follow_upstream_get_byte():
    sizes = {pl.INT4: (4, 1), pl.UINT4: (4, 1), pl.FP4: (4, 1), pl.HF4: (4, 1), pl.HF8: (8, 1),
             pl.FP8E5M2: (8, 1), pl.UINT16: (16, 2), pl.UINT32: (32, 4), pl.UINT64: (64, 8)}
    for dtype, (bits, size) in sizes.items():
        assert (dtype.bits, dtype.get_byte()) == (bits, size), dtype


@pytest.mark.parametrize("backend", ["sim", "shm"])
def test_fp4_rounds_to_nearest_even_and_saturates(backend):
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0]
    ties = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0, -5.0: -4.0}
    between = {0.26: 0.5, 0.7: 0.5, 2.9: 3.0, 4.9: 4.0, 5.1: 6.0, 0.1: 0.0}
    overflow = {6.5: 6.0, 7.0: 6.0, 1e30: 6.0, float("inf"): 6.0, -7.0: -6.0, float("-inf"): -6.0}
    cases = {**{v: v for v in grid}, **ties, **between, **overflow}
    out = cast_in_a_rank(list(cases), pl.FP4, backend=backend)
    assert out.astype(np.float32).tolist() == list(cases.values())


def test_fp4_from_nan_is_refused():
    t = Tile(np.array([1.0, np.nan], np.float32), pl.FP32)
    with pytest.raises(TileValueError) as info:
        pl.cast(t, pl.FP4)
    assert re.fullmatch(r"pl\.cast at .*test_dtypes\.py:\d+: the FP32 tile holds NaN, which FP4 \(E2M1\) cannot "
                        r"represent \(it has no NaN or infinity\); replace NaNs before the cast, e\.g\. with pl\.sel",
                        str(info.value))


def test_fp8e5m2_rounds_to_nearest_even_and_overflows_to_infinity():
    tiny = 2.0 ** -16  # the smallest subnormal
    cases = {1.0: 1.0, 1.25: 1.25, 1.125: 1.0, 1.375: 1.5, 1.2: 1.25, 57344.0: 57344.0, 61439.0: 57344.0,
             61440.0: float("inf"), 1e6: float("inf"), -1e6: float("-inf"), tiny: tiny, tiny / 2: 0.0,
             tiny * 1.5: tiny * 2, 3 * tiny / 2 + tiny / 64: tiny * 2}
    out = cast_in_a_rank(list(cases), pl.FP8E5M2)
    assert out.astype(np.float32).tolist() == list(cases.values())
    assert np.isnan(cast_in_a_rank([np.nan], pl.FP8E5M2).astype(np.float32)).all()


def test_narrow_floats_widen_exactly():
    fp4 = np.array([0.5, 1.5, 3.0, -6.0], ml_dtypes.float4_e2m1fn)
    assert cast_in_a_rank(fp4, pl.FP32, source=pl.FP4).tolist() == [0.5, 1.5, 3.0, -6.0]
    e5m2 = np.array([57344.0, 2.0 ** -16, -1.75], ml_dtypes.float8_e5m2)
    assert cast_in_a_rank(e5m2, pl.FP32, source=pl.FP8E5M2).tolist() == [57344.0, 2.0 ** -16, -1.75]


def test_four_bit_integers_wrap_modulo_16():
    assert cast_in_a_rank([7, 8, -8, -9, 15, 16, -1], pl.INT4, source=pl.INT32).astype(int).tolist() == \
        [7, -8, -8, 7, -1, 0, -1]
    assert cast_in_a_rank([7, 8, -1, 16, 31], pl.UINT4, source=pl.INT32).astype(int).tolist() == [7, 8, 15, 0, 15]
    # floats round by the cast's mode (ties to even by default), then wrap
    assert cast_in_a_rank([2.5, 3.5, -8.5, 7.6], pl.INT4).astype(int).tolist() == [2, 4, -8, -8]
    assert cast_in_a_rank([2.5, -0.5], pl.INT4, mode="floor").astype(int).tolist() == [2, -1]
    four = np.array([-8, 7, -1], ml_dtypes.int4)
    assert cast_in_a_rank(four, pl.FP32, source=pl.INT4).tolist() == [-8.0, 7.0, -1.0]
    assert cast_in_a_rank(four, pl.INT32, source=pl.INT4).tolist() == [-8, 7, -1]


def test_unsigned_integers():
    assert cast_in_a_rank([-1, 65536, 65535], pl.UINT16, source=pl.INT32).tolist() == [65535, 0, 65535]
    assert cast_in_a_rank([3e9, 2.5], pl.UINT32).tolist() == [3000000000, 2]
    assert cast_in_a_rank([-1, 2 ** 62], pl.UINT64, source=pl.INT64).tolist() == [2 ** 64 - 1, 2 ** 62]
    assert cast_in_a_rank(np.array([2 ** 64 - 1], np.uint64), pl.INT64, source=pl.UINT64).tolist() == [-1]


def test_large_integers_round_once():
    big = 2 ** 60
    # BF16 has 8 bits of precision: at 2**60 its spacing is 2**53, so 2**52 is half of it
    values = [big + 2 ** 52 + 1, big + 2 ** 52, big + 3 * 2 ** 52, -(big + 2 ** 52 + 1)]
    want = [big + 2 ** 53, big, big + 2 ** 54, -(big + 2 ** 53)]
    assert cast_in_a_rank(values, pl.BF16, source=pl.INT64).astype(np.float64).tolist() == want
    assert cast_in_a_rank([big + 2 ** 36 + 1], pl.FP32, source=pl.INT64).tolist() == [big + 2 ** 37]
    assert cast_in_a_rank(np.array([2 ** 63 + 2 ** 55 + 1], np.uint64), pl.BF16, source=pl.UINT64) \
        .astype(np.float64).tolist() == [2 ** 63 + 2 ** 56]


def test_hifloat_tiles_keep_their_bits_and_refuse_values():
    why = ("ptodist keeps HF8 (a HiSilicon float format) as raw bits and does not emulate its encoding or rounding; "
           "load, store and move HF8 data as it is, and compute in FP32/FP16/BF16")
    bits = np.array([0x00, 0x7F, 0x80, 0xFF], np.uint8)
    t = Tile(bits, pl.HF8)
    assert pl.cast(t, pl.HF8).data.tolist() == bits.tolist()
    assert pl.move(t, target_memory=pl.MemorySpace.Mat).data.tolist() == bits.tolist()
    for call, cls, what in [
            (lambda: pl.cast(t, pl.FP32), TileTypeError, "pl.cast at {}: cannot convert HF8 to FP32: "),
            (lambda: pl.cast(Tile(np.ones(4, np.float32), pl.FP32), pl.HF8), TileTypeError,
             "pl.cast at {}: cannot convert FP32 to HF8: "),
            (lambda: pl.full([4], pl.HF8, 1.0), TileTypeError, "pl.full at {}: cannot fill with 1.0: "),
            (lambda: pl.tile.write(t, [0], 1.0), TileTypeError, "pl.tile.write at {}: cannot write 1.0 into the HF8 "
                                                               "tile: "),
            (lambda: pl.tile.read(t, [1]), OperationTypeError, "a Scalar of HF8 at {}: ")]:
        with pytest.raises(cls) as info:
            call()
        assert isinstance(info.value, TypeError)
        assert re.fullmatch(re.escape(what).replace(r"\{\}", r".*test_dtypes\.py:\d+") + re.escape(why),
                            str(info.value)), str(info.value)


def _hf8_program(body):
    @pl.jit.incore
    def kernel(x: pl.Tensor[[1, 4], pl.HF8], out: pl.Out[pl.Tensor[[1, 4], pl.HF8]]):
        body(x, out)

    @pl.jit
    def orch(x: pl.Tensor[[1, 4], pl.HF8], out: pl.Out[pl.Tensor[[1, 4], pl.HF8]]):
        kernel(x, out)

    @pl.jit.host
    def host(x: pl.Tensor[[1, 4], pl.HF8], out: pl.Out[pl.Tensor[[1, 4], pl.HF8]]):
        orch(x, out, device=0)

    return host


def test_hifloat_host_tensors_pass_as_their_bits_and_refuse_values():
    """A uint8 array given for an HF8 parameter is HF8 in the ranks: its bits move, its values are refused."""
    def copies(x, out):
        pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], out)

    def reads(x, out):
        pl.write(out, [0, 0], pl.read(x, [0, 1]))

    def casts(x, out):
        pl.store(pl.cast(pl.cast(pl.load(x, [0, 0], [1, 4]), pl.FP32), pl.HF8), [0, 0], out)

    x = np.array([[0x00, 0x7F, 0x80, 0xFF]], np.uint8)
    out = np.zeros_like(x)
    _hf8_program(copies).compile(x, out, config=RunConfig(backend="sim"))(x, out)
    assert out.tolist() == x.tolist()
    for body, what in [(reads, "a Scalar of HF8 at "), (casts, "pl.cast at ")]:
        with pytest.raises(RankError) as info:
            _hf8_program(body).compile(x, out, config=RunConfig(backend="sim"))(x, out)
        assert what in str(info.value) and "ptodist keeps HF8 (a HiSilicon float format) as raw bits" in str(info.value)


# -- layouts ---------------------------------------------------------------------------------------------------
def test_layout_markers_are_recorded_and_change_no_numbers():
    assert pl.ND is pl.TensorLayout.ND and pl.MX_B_NN is pl.TensorLayout.MX_B_NN
    assert {m.name for m in pl.TileLayout} == {"none_box", "row_major", "col_major"}
    assert pl.Tensor[[4, 8], pl.FP32, pl.MX_A_ZZ].type_name == "pl.Tensor[[4, 8], pl.FP32, pl.MX_A_ZZ]"
    assert pl.Tensor[[4, 8], pl.FP32, pl.ND].type_name == "pl.Tensor[[4, 8], pl.FP32]"

    @pl.jit.incore
    def double(x: pl.Tensor[[2, 4], pl.FP32, pl.ND], out: pl.Out[pl.Tensor[[2, 4], pl.FP32, pl.ND]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [2, 4]), 2.0), [0, 0], out)

    @pl.jit
    def orch(x: pl.Tensor[[2, 4], pl.FP32, pl.ND], out: pl.Out[pl.Tensor[[2, 4], pl.FP32, pl.ND]]):
        double(x, out)

    @pl.jit.host
    def host(x: pl.Tensor[[2, 4], pl.FP32, pl.ND], out: pl.Out[pl.Tensor[[2, 4], pl.FP32, pl.ND]]):
        orch(x, out, device=0)

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = np.zeros_like(x)
    host.compile(x, out, config=RunConfig(backend="sim"))(x, out)
    np.testing.assert_array_equal(out, 2 * x)


@pytest.mark.parametrize(("marker", "why"), [
    (pl.DN, "a tensor annotation takes no DN marker (PyPTO refuses this shorthand too); annotate the source shape "
            "with no marker and transpose where it is used, with pl.transpose(x, -2, -1) or "
            "pl.matmul(..., b_trans=True)"),
    (pl.NZ, "NZ is a tile layout, never a tensor's; annotate the tensor with no marker (pl.ND, row-major, is the "
            "default)"),
])
def test_dn_and_nz_tensor_annotations_are_refused(marker, why):
    with pytest.raises(DeclarationError) as info:
        pl.Tensor[[16, 32], pl.BF16, marker]
    assert isinstance(info.value, TypeError)
    assert re.fullmatch(re.escape(f"pl.Tensor[[16, 32], pl.BF16, {marker!r}] at ") + r".*test_dtypes\.py:\d+: "
                        + re.escape(why), str(info.value))


@pytest.mark.parametrize("backend", ["sim", "shm"])
def test_torch_host_tensors_of_the_new_types(backend):
    torch = pytest.importorskip("torch")

    @pl.jit.incore
    def kernel(x: pl.Tensor[[1, 4], pl.FP32], e5m2: pl.Out[pl.Tensor[[1, 4], pl.FP8E5M2]],
               u16: pl.Out[pl.Tensor[[1, 4], pl.UINT16]], back: pl.Out[pl.Tensor[[1, 4], pl.FP32]],
               src: pl.Tensor[[1, 4], pl.FP8E4M3FN]):
        t = pl.load(x, [0, 0], [1, 4])
        pl.store(pl.cast(t, pl.FP8E5M2), [0, 0], e5m2)
        pl.store(pl.cast(t, pl.UINT16), [0, 0], u16)
        pl.store(pl.cast(pl.load(src, [0, 0], [1, 4]), pl.FP32), [0, 0], back)

    @pl.jit
    def orch(x: pl.Tensor, e5m2: pl.Out[pl.Tensor], u16: pl.Out[pl.Tensor], back: pl.Out[pl.Tensor],
             src: pl.Tensor):
        kernel(x, e5m2, u16, back, src)

    @pl.jit.host
    def host(x: pl.Tensor, e5m2: pl.Out[pl.Tensor], u16: pl.Out[pl.Tensor], back: pl.Out[pl.Tensor],
             src: pl.Tensor):
        orch(x, e5m2, u16, back, src, device=0)

    x = torch.tensor([[1.125, 1.375, 61440.0, 65535.0]])
    e5m2 = torch.zeros(1, 4, dtype=torch.float8_e5m2)
    u16 = torch.zeros(1, 4, dtype=torch.uint16)
    back = torch.zeros(1, 4)
    src = torch.tensor([[448.0, -0.5, 0.001953125, 3.0]]).to(torch.float8_e4m3fn)
    host.compile(x, e5m2, u16, back, src, config=RunConfig(backend=backend))(x, e5m2, u16, back, src)
    assert e5m2.float().tolist() == [[1.0, 1.5, float("inf"), float("inf")]]
    assert u16.to(torch.int32).tolist() == [[1, 1, 61440, 65535]]
    assert back.tolist() == [[448.0, -0.5, 0.001953125, 3.0]]


def test_the_dispatch_plan_records_a_host_tensor_layout(tmp_path):
    import json

    @pl.jit.incore
    def kernel(scale: pl.Tensor[[2, 4], pl.FP32, pl.MX_B_NN], out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        pl.store(pl.load(scale, [0, 0], [2, 4]), [0, 0], out)

    @pl.jit
    def orch(scale: pl.Tensor[[2, 4], pl.FP32, pl.MX_B_NN], out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        kernel(scale, out)

    @pl.jit.host
    def host(scale: pl.Tensor[[2, 4], pl.FP32, pl.MX_B_NN], out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        orch(scale, out, device=0)

    scale, out = np.arange(8, dtype=np.float32).reshape(2, 4), np.zeros((2, 4), np.float32)
    compiled = host.compile(scale, out, config=RunConfig(backend="sim", output_dir=str(tmp_path)))
    compiled(scale, out)
    np.testing.assert_array_equal(out, scale)
    plan = json.loads((compiled.output_dir / "dispatch_plan.json").read_text())
    assert plan["host_tensors"] == [
        {"name": "scale", "shape": [2, 4], "dtype": "FP32", "direction": "in", "layout": "MX_B_NN"},
        {"name": "out", "shape": [2, 4], "dtype": "FP32", "direction": "out"}]


def test_tensor_and_tile_views_are_recorded():
    view = pl.TensorView(stride=[8, 2], layout=pl.ND, valid_shape=[2, 4])
    assert repr(view) == "pl.TensorView(stride=[8, 2], layout=pl.ND, valid_shape=[2, 4])"
    assert pl.Tensor[[2, 4], pl.FP32, view].type_name == \
        "pl.Tensor[[2, 4], pl.FP32, pl.TensorView(stride=[8, 2], layout=pl.ND, valid_shape=[2, 4])]"
    # a view states its strides, so a DN layout there describes the memory (not the refused shorthand)
    assert pl.Tensor[[4, 2], pl.FP32, pl.TensorView(stride=[1, 4], layout=pl.DN)].layout is pl.DN
    assert repr(pl.TileView(blayout=pl.TileLayout.col_major, slayout=pl.TileLayout.row_major)) == \
        "pl.TileView(blayout=pl.TileLayout.col_major, slayout=pl.TileLayout.row_major)"
    assert repr(pl.TileView(valid_shape=[16, 64], compact=pl.CompactMode.normal)) == \
        "pl.TileView(valid_shape=[16, 64], compact=pl.CompactMode.normal)"
    assert ir.TensorView is pl.TensorView and ir.TileView is pl.TileView
    with pytest.raises(ProgramValueError) as info:
        pl.TensorView(stride=[8, 1])
    assert isinstance(info.value, ValueError)
    assert re.fullmatch(re.escape("pl.TensorView(stride=[8, 1]) at ") + r".*test_dtypes\.py:\d+: "
                        + re.escape("layout= is required when stride, valid_shape or pad is given; add "
                                    "layout=pl.TensorLayout.ND for a row-major tensor"), str(info.value))

    @pl.jit.incore
    def double(x: pl.Tensor[[2, 4], pl.FP32, view], out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [2, 4]), 2.0), [0, 0], out)

    @pl.jit
    def orch(x: pl.Tensor[[2, 4], pl.FP32, view], out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        double(x, out)

    @pl.jit.host
    def host(x: pl.Tensor[[2, 4], pl.FP32, view], out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        orch(x, out, device=0)

    big = np.arange(16, dtype=np.float32).reshape(2, 8)
    x, out = big[:, ::2], np.zeros((2, 4), np.float32)  # the strided window the view describes
    host.compile(x, out, config=RunConfig(backend="sim"))(x, out)
    np.testing.assert_array_equal(out, 2 * big[:, ::2])


def test_dumped_tensors_of_types_numpy_lacks_load_back_with_their_values(tmp_path):
    from ptodist import dfx

    @pl.jit.incore
    def kernel(x: pl.Tensor[[1, 4], pl.FP32], e5m2: pl.Out[pl.Tensor[[1, 4], pl.FP8E5M2]],
               i4: pl.Out[pl.Tensor[[1, 4], pl.INT4]]):
        t = pl.load(x, [0, 0], [1, 4])
        pl.store(pl.cast(t, pl.FP8E5M2), [0, 0], e5m2)
        pl.store(pl.cast(t, pl.INT4), [0, 0], i4)

    @pl.jit
    def orch(x: pl.Tensor, e5m2: pl.Out[pl.Tensor], i4: pl.Out[pl.Tensor]):
        kernel(x, e5m2, i4)

    @pl.jit.host
    def host(x: pl.Tensor, e5m2: pl.Out[pl.Tensor], i4: pl.Out[pl.Tensor]):
        orch(x, e5m2, i4, device=0)

    x = np.array([[1.125, -3.0, 7.0, 9.0]], np.float32)
    e5m2, i4 = np.zeros((1, 4), ml_dtypes.float8_e5m2), np.zeros((1, 4), ml_dtypes.int4)
    host.compile(x, e5m2, i4, config=RunConfig(backend="sim", enable_dump_args=2, output_dir=str(tmp_path)))(
        x, e5m2, i4)
    dumps = {p.name.rpartition("_")[2]: np.load(p) for p in dfx.latest_run(tmp_path).glob("rank0/d*/dump/*.npy")}
    assert dumps["e5m2.npy"].dtype == np.float32 and dumps["e5m2.npy"].tolist() == [[1.0, -3.0, 7.0, 8.0]]
    assert dumps["i4.npy"].dtype == np.int8 and dumps["i4.npy"].tolist() == [[1, -3, 7, -7]]
    assert e5m2.astype(np.float32).tolist() == [[1.0, -3.0, 7.0, 8.0]]


def _shift_program(dtype, nr):
    """Each rank writes its index (as ``dtype``) into its window; every rank reads its left neighbour's."""
    import ptodist.language.distributed as pld

    @pl.jit.incore
    def step(y: pl.Out[pl.Tensor[[1, 4], dtype]], data: pl.InOut[pld.DistributedTensor[[1, 4], dtype]],
             sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
        ctx = pld.get_comm_ctx(data)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        mine = pl.cast(pl.full([1, 4], dtype=pl.FP32, value=pl.cast(me + 1, target_type=pl.FP32)), dtype)
        data = pl.store(mine, [0, 0], data)
        for p in pl.range(n):
            pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
        for p in pl.range(n):
            pld.system.wait(sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)
        return pl.store(pld.tile.remote_load(data, (me - 1 + n) % n, [0, 0], [1, 4]), [0, 0], y)

    return on_every_rank(step)


@pytest.mark.parametrize("backend", ["sim", "shm"])
@pytest.mark.parametrize("dtype", [pl.FP8E5M2, pl.FP4, pl.INT4, pl.UINT4, pl.UINT16, pl.UINT64],
                         ids=lambda d: d.name)
def test_windows_hold_the_new_types(dtype, backend):
    from ptodist import DistributedConfig

    compiled = ir.compile(_shift_program(dtype, 3), platform="a2a3sim",
                          distributed_config=DistributedConfig(device_ids=[0, 1, 2]),
                          config=RunConfig(backend=backend))
    y = np.zeros((3, 1, 4), dtype.np_dtype)
    compiled(y)
    assert y.astype(np.float64)[:, 0, :].tolist() == [[3.0] * 4, [1.0] * 4, [2.0] * 4]


def test_dynvar_and_intlike_are_the_dynamic_dimension_types():
    rows = pl.DynVar("ROWS")  # what pl.dynamic returns, made directly
    assert isinstance(pl.dynamic("M"), pl.DynVar)
    assert all(isinstance(v, pl.IntLike) for v in (3, rows, rows * 2, pl.dynamic("M") + 1))
    assert not isinstance(1.5, pl.IntLike)

    @pl.jit.incore
    def double(x: pl.Tensor[[rows, 4], pl.FP32], out: pl.Out[pl.Tensor[[rows, 4], pl.FP32]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [3, 4]), 2.0), [0, 0], out)

    @pl.jit
    def orch(x: pl.Tensor[[rows, 4], pl.FP32], out: pl.Out[pl.Tensor[[rows, 4], pl.FP32]]):
        double(x, out)

    @pl.jit.host
    def host(x: pl.Tensor[[rows, 4], pl.FP32], out: pl.Out[pl.Tensor[[rows, 4], pl.FP32]]):
        orch(x, out, device=0)

    x, out = np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((3, 4), np.float32)
    host.compile(x, out, config=RunConfig(backend="sim"))(x, out)
    np.testing.assert_array_equal(out, 2 * x)
