"""The rest of upstream's op surface: atomic stores (``pl.AtomicType``), the ``pl.tile`` / ``pl.tensor`` /
``pl.system`` names that complete upstream's lists, and ``pld.tile.put`` / ``get``.

Every program runs on both local backends (the ``backend`` fixture) and its numbers are checked against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import window_program

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig, ir
from ptodist.check import explore

SIZE = 8


def cfg(backend: str, nr: int = 1) -> RunConfig:
    if nr == 1:
        return RunConfig(backend=backend)
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(range(nr))), backend=backend)


# -- atomic stores --------------------------------------------------------------------------------------------

@pl.jit
def split_k(a: pl.Tensor, b: pl.Tensor, c: pl.Out[pl.Tensor]):
    # Each block multiplies one K-strip and adds its partial product into the whole of c.
    with pl.spmd(4):
        k = pl.get_block_idx() * 8
        part = pl.matmul(pl.load(a, [0, k], [16, 8]), pl.load(b, [k, 0], [8, 16]))
        c = pl.assemble(c, part, [0, 0], atomic=pl.AtomicType.Add)
    return c


def test_atomic_assemble_sums_every_blocks_partial_product(backend):
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (16, 32)).astype(np.float32)
    b = rng.integers(-4, 5, (32, 16)).astype(np.float32)
    c = np.full((16, 16), 100, np.float32)  # atomic adds onto what the output held
    split_k(a, b, c, config=cfg(backend))
    np.testing.assert_array_equal(c, 100 + a @ b)


@pl.jit
def tile_atomics(x: pl.Tensor, out: pl.Out[pl.Tensor], mode: pl.Scalar[pl.INT32]):
    with pl.spmd(4):
        t = pl.load(x, [pl.get_block_idx() * 2, 0], [2, SIZE])
        pl.store(t, [0, 0], out, atomic=pl.AtomicType.Add)   # every block adds into rows 0..1
        pl.tile.store(t, [2, 0], out, atomic=1)             # the int form of AtomicType.Add
    with pl.at(level=pl.Level.CORE_GROUP):
        acc = pl.tile.full([2, SIZE], pl.INT32, 0)
        for i in pl.range(4):
            acc = pl.tile.assemble(acc, pl.load(x, [i * 2, 0], [2, SIZE]), [0, 0], atomic=pl.AtomicType.Add)
        pl.store(acc, [4, 0], out, atomic=pl.AtomicType.None_)
    return out


def test_atomic_store_and_tile_assemble_add_instead_of_overwriting(backend):
    x = np.arange(8 * SIZE, dtype=np.int32).reshape(8, SIZE)
    out = np.ones((6, SIZE), np.int32)
    tile_atomics(x, out, 0, config=cfg(backend))
    total = x.reshape(4, 2, SIZE).sum(axis=0)
    np.testing.assert_array_equal(out[0:2], 1 + total)
    np.testing.assert_array_equal(out[2:4], 1 + total)
    np.testing.assert_array_equal(out[4:6], total)


@pl.jit.incore
def bad_mode(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], out, atomic="add")


def test_an_unknown_atomic_mode_is_an_error_not_a_plain_store():
    x = np.zeros((1, SIZE), np.float32)
    with pytest.raises(RankError) as info:
        bad_mode(x, np.zeros_like(x), config=RunConfig(backend="sim"))
    assert isinstance(info.value.original, TypeError)
    assert (f"pl.store at {__file__}:" in str(info.value)
            and "atomic='add' is not an atomic mode; pass atomic=pl.AtomicType.Add to add into the destination, "
                "or pl.AtomicType.None_ (the default) to overwrite it" in str(info.value)), str(info.value)


def _barrier(w):
    for p in pl.range(w.n):
        pld.system.notify(w.sig, p, [w.me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    for p in pl.range(w.n):
        pld.system.wait(w.sig, [p, 0], 1, cmp=pld.WaitCmp.Ge)


def _add_into_rank_0(atomic):
    def body(w):
        t = pl.load(w.x, [0, 0], [1, SIZE])
        if w.me == 0:
            pl.store(t, [0, 0], w.data, atomic=atomic)  # rank 0 adds into its own window ...
        else:
            pld.tile.remote_store(t, w.data, 0, [0, 0], atomic=pl.AtomicType.Add)  # ... as its peers add into it
        _barrier(w)
        pl.store(pl.load(w.data, [0, 0], [1, SIZE]), [0, 0], w.y)
    return body


def check_atomic_window(config: RunConfig, nr: int) -> None:
    x = (np.arange(nr * SIZE, dtype=np.float32) + 1).reshape(nr, 1, SIZE)
    y = ir.compile(window_program(nr, _add_into_rank_0(pl.AtomicType.Add)), config=config)(x)
    np.testing.assert_array_equal(y[0], x.sum(axis=0))


@pytest.mark.parametrize("nr", [2, 4])
def test_atomic_stores_from_every_rank_into_one_window_sum_exactly(backend, nr):
    check_atomic_window(cfg(backend, nr), nr)


def test_the_checker_allows_atomic_adds_into_one_region_but_reports_a_plain_store_among_them():
    x = np.ones((3, 1, SIZE), np.float32)
    atomic = ir.compile(window_program(3, _add_into_rank_0(pl.AtomicType.Add)), config=cfg("sim", 3))
    for seed in range(3):
        out = explore.run_checked(lambda: atomic(x), seed)
        assert out.exit_code == 0 and not out.findings, [f.message for f in out.findings]
    plain = ir.compile(window_program(3, _add_into_rank_0(pl.AtomicType.None_)), config=cfg("sim", 3))
    out = explore.run_checked(lambda: plain(x), 0)
    races = [f for f in out.findings if f.kind == "race"]
    assert races, [f.message for f in out.findings]
    assert "pl.store (write of 'data')" in races[0].message and "atomic add" in races[0].message, races[0].message


def _shared_total_program(nr: int):
    """Every rank's chip task adds its x into the one host tensor ``total``."""
    @pl.program
    class Shared:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[[1, SIZE], pl.FP32], total: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
            pl.store(pl.load(x, [0, 0], [1, SIZE]), [0, 0], total, atomic=pl.AtomicType.Add)
            return total

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, SIZE], pl.FP32], total: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
            return self.k(x, total)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1, SIZE], pl.FP32], total: pl.InOut[pl.Tensor[[1, SIZE], pl.FP32]]):
            for r in pl.range(pld.world_size()):
                self.chip(x[r], total, device=r)
            return total

    return Shared


def check_atomic_host_tensor(config: RunConfig, nr: int) -> None:
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE)
    total = np.full((1, SIZE), 0.5, np.float32)
    ir.compile(_shared_total_program(nr), config=config)(x, total)
    np.testing.assert_array_equal(total, 0.5 + x.sum(axis=0))


def test_atomic_stores_of_every_rank_into_one_host_tensor_sum_exactly(backend):
    check_atomic_host_tensor(cfg(backend, 3), 3)


# -- pld.tile.put / get -------------------------------------------------------------------------------------

def _ring_through_stages(w):
    stage = pl.tile.create([1, SIZE], pl.FP32)
    pld.tile.put(w.data, (w.me + 1) % w.n, w.x, stage)  # my x into the next rank's window
    _barrier(w)
    prev = (w.me + w.n - 1) % w.n
    pld.tile.get(w.y, prev, w.data, stage, [0, 0], [0, 0], [1, SIZE])  # a region given positionally
    return prev


def _atomic_puts(w):
    stage = pl.tile.create([1, SIZE], pl.FP32)
    pld.tile.put(w.data, 0, w.x, stage, None, [0, 0], [0, 0], [1, SIZE], atomic=pl.AtomicType.Add)
    _barrier(w)
    pl.store(pl.load(w.data, [0, 0], [1, SIZE]), [0, 0], w.y)


def check_tile_put_get(config: RunConfig, nr: int) -> None:
    x = np.arange(nr * SIZE, dtype=np.float32).reshape(nr, 1, SIZE)
    y = ir.compile(window_program(nr, _ring_through_stages), config=config)(x)
    for r in range(nr):
        np.testing.assert_array_equal(y[r], x[(r - 2) % nr])  # rank r reads rank r-1's window: x of rank r-2
    y = ir.compile(window_program(nr, _atomic_puts), config=config)(x)
    np.testing.assert_array_equal(y[0], x.sum(axis=0))


@pytest.mark.parametrize("nr", [2, 4])
def test_tile_put_and_get_move_what_the_tensor_forms_move(backend, nr):
    check_tile_put_get(cfg(backend, nr), nr)


def test_the_checker_sees_a_tile_put_racing_the_peers_read():
    def unsynchronised(w):
        pld.tile.put(w.data, (w.me + 1) % w.n, w.x, pl.tile.create([1, SIZE], pl.FP32))
        pl.store(pl.load(w.data, [0, 0], [1, SIZE]), [0, 0], w.y)  # no barrier: the put may not have landed

    run = ir.compile(window_program(2, unsynchronised), config=cfg("sim", 2))
    out = explore.run_checked(lambda: run(np.ones((2, 1, SIZE), np.float32)), 0)
    races = [f for f in out.findings if f.kind == "race"]
    assert races and "pld.tile.put (write of 'data')" in races[0].message, [f.message for f in out.findings]


def test_a_tile_put_needs_a_tile_to_stage_through():
    run = ir.compile(window_program(2, lambda w: pld.tile.put(w.data, 0, w.x, w.x)), config=cfg("sim", 2))
    with pytest.raises(RankError) as info:
        run(np.ones((2, 1, SIZE), np.float32))
    assert isinstance(info.value.original, TypeError)
    assert (f"pld.tile.put at {__file__}:" in str(info.value)
            and "stage must be a Tile (the on-chip staging buffer the transfer passes through), got RankTensor; "
                "make one with pl.tile.create(shape, dtype), or call the pld.tensor form, which needs none"
            in str(info.value)), str(info.value)


# -- pl.tile names -----------------------------------------------------------------------------------------

@pl.jit
def tile_surface(x: pl.Tensor, out: pl.Out[pl.Tensor], ids: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        t = pl.load(x, [0, 0], [4, SIZE])
        pl.system.sync_src(set_pipe=pl.PipeType.MTE2, wait_pipe=pl.PipeType.V, event_id=0)
        pl.system.sync_dst(set_pipe=pl.PipeType.MTE2, wait_pipe=pl.PipeType.V, event_id=0)
        out = pl.store(pl.tile.sum(t, 0), [0, 0], out)                       # row 0: a 1-D result
        out = pl.store(pl.tile.max(t, 0, keepdim=True), [1, 0], out)        # row 1
        out = pl.store(pl.tile.min(t, -2, keepdim=True), [2, 0], out)       # row 2
        out = pl.store(pl.tile.sum(t, 1, keepdim=True), [3, 0], out)        # rows 3..6, column 0
        odd = pl.tile.gather_mask(t, pl.tile.MaskPattern.P1010)              # columns 1, 3, 5, 7
        out = pl.store(odd, [3, 4], out)                                     # rows 3..6, columns 4..7
        c = pl.tile.create([1, SIZE], pl.FP32)
        pl.tile.write(c, [0, 3], pl.tile.read(t, [2, 5]))                    # one element, read and written
        pl.tile.write(c, 6, pl.read(t, 9))                                   # flat indices, through pl.read
        out = pl.store(c, [7, 0], out)                                       # row 7
        seq = pl.tile.ci(5, [1, SIZE], pl.INT32, descending=True)
        out = pl.store(pl.cast(seq, pl.FP32), [8, 0], out)                   # row 8
        part = pl.load(x, [0, 0], [2, SIZE], valid_shape=[2, 3])
        filled = pl.tile.fillpad_inplace(part, pl.PadValue.max)
        out = pl.store(filled, [9, 0], out)                                  # rows 9..10
        mat = pl.load(x, [0, 0], [4, SIZE], target_memory=pl.MemorySpace.Mat)
        out = pl.store(pl.tile.extract(mat, 1, 2, [2, 4], target_memory=pl.MemorySpace.Left), [11, 0], out)
        pl.system.bar_v()
        pl.system.bar_m()
        pl.system.bar_all()
    with pl.spmd(3):
        b = pl.tile.get_block_idx()
        pl.write(ids, [0, b], pl.tile.get_block_num() * 10 + b)
        pl.write(ids, [1, b], pl.tensor.get_block_idx())
    return out, ids


def test_tile_names_compute_what_numpy_does(backend):
    x = np.arange(4 * SIZE, dtype=np.float32).reshape(4, SIZE) * np.float32(0.5) - 3
    out = np.zeros((13, SIZE), np.float32)
    ids = np.full((2, 3), -1, np.int32)
    tile_surface(x, out, ids, config=cfg(backend))
    np.testing.assert_allclose(out[0], x.sum(axis=0))
    np.testing.assert_array_equal(out[1], x.max(axis=0))
    np.testing.assert_array_equal(out[2], x.min(axis=0))
    np.testing.assert_allclose(out[3:7, 0], x.sum(axis=1))
    np.testing.assert_array_equal(out[3:7, 4:8], x[:, 1::2])
    want = np.zeros(SIZE, np.float32)
    want[3], want[6] = x[2, 5], x.reshape(-1)[9]
    np.testing.assert_array_equal(out[7], want)
    np.testing.assert_array_equal(out[8], 5 - np.arange(SIZE))
    pad = np.full((2, SIZE), np.inf, np.float32)
    pad[:, :3] = x[:2, :3]
    np.testing.assert_array_equal(out[9:11], pad)
    np.testing.assert_array_equal(out[11:13, 0:4], x[1:3, 2:6])
    assert ids.tolist() == [[30, 31, 32], [0, 1, 2]]


@pl.jit.incore
def batched(a: pl.Tensor, b: pl.Tensor, c: pl.Out[pl.Tensor]):
    lhs = pl.reshape(pl.load(a, [0, 0], [4, 4]), [2, 2, 4])
    rhs = pl.reshape(pl.load(b, [0, 0], [8, 3]), [2, 4, 3])
    acc = pl.tile.batch_matmul(lhs, rhs)
    acc = pl.tile.batch_matmul_acc(acc, lhs, rhs)  # twice the product
    pl.store(pl.reshape(acc, [4, 3]), [0, 0], c)


def test_batch_matmul_acc_adds_the_batched_product(backend):
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    b = np.arange(24, dtype=np.float32).reshape(8, 3) - 10
    c = np.zeros((4, 3), np.float32)
    batched(a, b, c, config=cfg(backend))
    want = 2 * np.matmul(a.reshape(2, 2, 4), b.reshape(2, 4, 3)).reshape(4, 3)
    np.testing.assert_array_equal(c, want)


def test_tile_max_and_min_of_two_scalars_and_the_namespace_classes():
    assert pl.tile.max(3, 7) == 7 and pl.tile.min(3, 7) == 3
    assert pl.tile.MaskPattern.P0101 == 1 and pl.tile.MaskPattern.P1111 == 7
    ref = pl.tile.alloc(pl.MemorySpace.Vec, 256)
    assert isinstance(ref, pl.tile.MemRefType) and ref.size == 256 and pl.MemRefType is pl.tile.MemRefType
    assert isinstance(pl.tensor.alloc(pl.MemorySpace.Vec, 64), pl.tile.MemRefType)
    assert pl.system.PipeType is pl.PipeType and int(pl.AtomicType.Add) == 1
    assert pl.tensor.no_dep is pl.no_dep and pl.tensor.dump_tag is pl.dump_tag


def test_a_sync_with_a_pipe_that_is_not_one_is_an_error():
    with pytest.raises(TypeError, match=r"pl.system.sync_src: set_pipe='MTE2' is not a pipe; pass "
                                        r"pl.PipeType.\{S, V, M, MTE1, MTE2, MTE3, FIX, ALL\}"):
        pl.system.sync_src(set_pipe="MTE2", wait_pipe=pl.PipeType.V, event_id=0)
    with pytest.raises(ValueError, match=r"pl.system.sync_dst: event_id=-1 must be a non-negative integer"):
        pl.system.sync_dst(set_pipe=pl.PipeType.V, wait_pipe=pl.PipeType.MTE3, event_id=-1)


# -- pl.tensor names ---------------------------------------------------------------------------------------

@pl.jit
def tensor_surface(x: pl.Tensor, out: pl.Out[pl.Tensor], seq: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        pl.set_cache_policy(x, pl.CachePolicy.BYPASS)
        flat = pl.tensor.view(x, [1, 4 * SIZE])                      # the same memory, another shape
        rows = pl.tensor.slice(flat, [1, SIZE], [0, SIZE])           # elements 8..15: x's row 1
        scratch = pl.tensor.create([2, SIZE], pl.FP32)
        scratch = pl.assemble(scratch, rows, [1, 0])
        scratch = pl.tensor.assemble(scratch, pl.load(x, [3, 0], [1, SIZE]), [1, 0], atomic=pl.AtomicType.Add)
        l1 = pl.tensor.create_l1([2, SIZE], pl.FP32)
        l1 = pl.assemble(l1, pl.tensor.add(scratch, scratch), [0, 0])
        out = pl.assemble(out, l1, [0, 0])
        pl.tensor.write(out, [0, 0], pl.tensor.read(x, [2, 2]))
        seq = pl.assemble(seq, pl.tensor.ci(3, [1, SIZE]), [0, 0])
        out = pl.assemble(out, pl.tensor.view(pl.tensor.dump_tag(x), [4, SIZE]), [2, 0])
    return out, seq


def test_tensor_names_compute_what_numpy_does(backend):
    x = np.arange(4 * SIZE, dtype=np.float32).reshape(4, SIZE)
    out = np.zeros((6, SIZE), np.float32)
    seq = np.zeros((1, SIZE), np.int32)
    tensor_surface(x, out, seq, config=cfg(backend))
    want = np.zeros((2, SIZE), np.float32)
    want[1] = 2 * (x[1] + x[3])
    want[0, 0] = x[2, 2]
    np.testing.assert_array_equal(out[0:2], want)
    np.testing.assert_array_equal(out[2:6], x)
    np.testing.assert_array_equal(seq[0], 3 + np.arange(SIZE))


@pl.jit.incore
def bad_view(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    pl.tensor.view(x, [3, 3])


def test_a_view_that_changes_the_element_count_is_an_error():
    x = np.zeros((2, SIZE), np.float32)
    with pytest.raises(RankError) as info:
        bad_view(x, x.copy(), config=RunConfig(backend="sim"))
    assert isinstance(info.value.original, ValueError)
    assert "has 16 elements, so it cannot be viewed as [3, 3]; the view keeps every element" in str(info.value)


# -- launch-shape queries -----------------------------------------------------------------------------------

@pl.jit
def whole_chip(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    # One block per AIV: each scales its own row by its index; a mixed launch counts clusters instead.
    with pl.spmd(pl.system.available_aiv_count()):
        b = pl.get_block_idx()
        out[b:b + 1, :] = pl.mul(pl.load(x, [b, 0], [1, SIZE]), pl.cast(b, pl.FP32))
    with pl.spmd(pl.system.available_cluster_count()):
        b = pl.get_block_idx()
        pl.write(out, [b, 0], pl.cast(pl.get_block_num(), pl.FP32))
    return out


def test_available_counts_are_the_a2a3_core_counts_and_size_a_launch(backend):
    assert (int(pl.system.available_cluster_count()), int(pl.system.available_aiv_count())) == (24, 48)
    x = np.ones((48, SIZE), np.float32)
    out = np.zeros_like(x)
    whole_chip(x, out, config=cfg(backend))
    want = np.arange(48, dtype=np.float32)[:, None] * x
    want[:24, 0] = 24
    np.testing.assert_array_equal(out, want)


@pl.jit.incore
def masks_and_views(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    t = pl.load(x, [0, 0], [4, SIZE])
    even = pl.tile.gather_mask(t, pl.tile.MaskPattern.P0101)                     # columns 0, 2, 4, 6
    back = pl.tile.scatter_mask(pl.tile.full([4, SIZE], pl.FP32, -1.0), even, pl.tile.MaskPattern.P0101)
    out = pl.store(back, [0, 0], out)                                              # rows 0..3
    nz = pl.load(x, [0, 0], [4, SIZE], target_memory=pl.MemorySpace.Mat)
    out = pl.store(pl.tile.transpose_view(nz), [4, 0], out)                        # rows 4..11, columns 0..3
    return out


def test_scatter_mask_inverts_gather_mask_and_transpose_view_swaps_the_last_axes(backend):
    x = np.arange(4 * SIZE, dtype=np.float32).reshape(4, SIZE)
    out = np.zeros((12, SIZE), np.float32)
    masks_and_views(x, out, config=cfg(backend))
    want = np.full((4, SIZE), -1, np.float32)
    want[:, 0::2] = x[:, 0::2]
    np.testing.assert_array_equal(out[0:4], want)
    np.testing.assert_array_equal(out[4:12, 0:4], x.T)


def test_a_mask_pattern_outside_the_seven_is_an_error():
    t = pl.tile.full([2, SIZE], pl.FP32, 1.0)
    with pytest.raises(ValueError, match=r"pl.tile.gather_mask: mask_pattern=9 is not a pattern; pass one of "
                                         r"pl.tile.MaskPattern.P0101 .. P1111 \(1 .. 7\)"):
        pl.tile.gather_mask(t, 9)
    with pytest.raises(ValueError, match=r"pl.tile.scatter_mask: src has shape \[2, 8\], but the pattern selects "
                                         r"\[2, 4\] of the \[2, 8\] dst"):
        pl.tile.scatter_mask(t, t, pl.tile.MaskPattern.P1010)


def test_a_tile_put_outside_a_kernel_is_named_as_written():
    stage = pl.tile.create([1, SIZE], pl.FP32)
    with pytest.raises(Exception, match=r"^pld.tile.put\(\) called outside a program at .*test_ops_surface.py:\d+: "
                                        r"it is only available inside a kernel"):
        pld.tile.put(None, 0, None, stage)
    with pytest.raises(Exception, match=r"^pld.tile.get\(\) called outside a program"):
        pld.tile.get(None, 0, None, stage)
