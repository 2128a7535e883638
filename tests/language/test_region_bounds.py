"""Region bounds: every region operation refuses every region outside its tensor, whatever the numbers.

A fuzz of offsets and shapes around 0, -1, the bounds, 2**31, 2**32, 2**62, 2**63 - 1, -2**63 and Python ints
beyond int64 runs every region operation (load, store, read, write, slice, assemble, subscripts, remote_load,
remote_store, put, get, notify, wait) inside one kernel on every rank; each case records how it ended.  A region
inside the tensor must work, one outside it must raise ``KernelIndexError`` naming the operation, the user's
line and the tensor: never a silent wrong answer (an offset near 2**63 used to overflow the native check and read
zeros) and never a raw numpy error.  The same fuzz runs on shm and sim, and under ``mpirun -n 2``: this file is
also the program that job runs (``python tests/language/test_region_bounds.py OUT_DIR``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import on_every_rank, run_in_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RankError, RunConfig
from ptodist.errors import KernelIndexError
from ptodist.language.scalar import Scalar
from ptodist.language.tile_ops import Tile

THIS = Path(__file__).resolve()
ROWS, COLS = 4, 6
BOUNDS = (ROWS, COLS)
NR = pl.dynamic("NR")

# Offsets and sizes around every edge a 64-bit check can get wrong; the last ones are beyond int64.
OFFSETS = [0, 1, 3, 4, 5, 6, 7, -1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -2**63, 2**63, 2**64, -2**64 - 1]
SIZES = [0, 1, 2, 4, 6, 7, -1, 2**31, 2**32, 2**62, 2**63 - 1, -2**63, 2**63, 2**64]
REAL_SIZES = [0, 1, 2, 4, 5]  # the shapes of tiles a kernel can make, for the operations that store a tile
# Integers that are not Python ints take the explained path too: numpy integers and integer Scalars.
OTHER_INTS = [np.int64(2**63 - 1), np.uint64(2**64 - 1), np.int32(-1), Scalar(2**63 - 1, pl.INDEX), Scalar(3, pl.INT32)]


def _regions(sizes) -> list[tuple[list, list]]:
    """(offsets, shape) pairs: each edge value in one dimension, the other dimension a small valid region."""
    out = []
    for d in range(2):
        for o in OFFSETS + OTHER_INTS:
            for s in sizes:
                offsets, shape = [1, 2], [1, 2]
                offsets[d], shape[d] = o, s
                out.append((offsets, shape))
    return out


def _indices() -> list[list]:
    out = []
    for d in range(2):
        for o in OFFSETS + OTHER_INTS:
            idx = [1, 2]
            idx[d] = o
            out.append(idx)
    return out


def _inside(offsets, shape, bounds=BOUNDS) -> bool:
    return all(0 <= int(o) and 0 <= int(s) and int(o) + int(s) <= b for o, s, b in zip(offsets, shape, bounds))


def _index_inside(idx) -> bool:
    return all(0 <= int(i) < b for i, b in zip(idx, BOUNDS))


def _subscript_inside(offsets, shape) -> bool:
    """The rule of ``t[a:b, c:d]``: negative ends count from the end (as in Python), then 0 <= start <= stop <= d."""
    for o, s, d in zip(offsets, shape, BOUNDS):
        lo, hi = int(o), int(o) + int(s)
        lo, hi = lo + d if lo < 0 else lo, hi + d if hi < 0 else hi
        if not 0 <= lo <= hi <= d:
            return False
    return True


def _tile(shape, value=1.0) -> Tile:
    return pl.full(list(shape), value, pl.FP32)


# Every case: (operation as messages name it, the tensor it names, how to run it, whether it is inside).  Each runs
# as `run(x, y, w, sig, peer)` in the kernel.
CASES: list[tuple[str, str, object, bool]] = []
for _o, _s in _regions(SIZES):
    CASES += [
        ("pl.load", "'x", lambda x, y, w, sig, p, o=_o, s=_s: pl.load(x, o, s), _inside(_o, _s)),
        ("pl.load", "'x", lambda x, y, w, sig, p, o=_o, s=_s: pl.load(x, o, s, valid_shape=s), _inside(_o, _s)),
        ("pl.slice", "'x", lambda x, y, w, sig, p, o=_o, s=_s: pl.slice(x, s, o), _inside(_o, _s)),
        ("pl.slice", "[4, 6]",
         lambda x, y, w, sig, p, o=_o, s=_s: pl.slice(_tile(BOUNDS), s, o), _inside(_o, _s)),
        ("subscript", "'x", lambda x, y, w, sig, p, o=_o, s=_s: x[o[0]:int(o[0]) + s[0], o[1]:int(o[1]) + s[1]],
         _subscript_inside(_o, _s)),
        ("pld.tile.remote_load", "'w", lambda x, y, w, sig, p, o=_o, s=_s: pld.tile.remote_load(w, p, o, s),
         _inside(_o, _s)),
        ("pld.tile.remote_load", "'w",
         lambda x, y, w, sig, p, o=_o, s=_s: pld.tile.remote_load(w, p, o, s, valid_shape=s), _inside(_o, _s)),
        ("pld.tensor.put", "'w", lambda x, y, w, sig, p, o=_o, s=_s: pld.tensor.put(w, p, x, o, [0, 0], s),
         _inside(_o, _s) and _inside([0, 0], _s)),
        # The destination's region is checked first: with a shape too large for it, it is the one named.
        ("pld.tensor.put", "'x" if _inside([0, 0], _s) else "'w",
         lambda x, y, w, sig, p, o=_o, s=_s: pld.tensor.put(w, p, x, [0, 0], o, s),
         _inside(_o, _s) and _inside([0, 0], _s)),
        ("pld.tensor.put", "'w", lambda x, y, w, sig, p, o=_o, s=_s: pld.tensor.put(
            w, p, x, o, [0, 0], s, atomic=pld.AtomicType.Add), _inside(_o, _s) and _inside([0, 0], _s)),
        ("pld.tensor.get", "'y", lambda x, y, w, sig, p, o=_o, s=_s: pld.tensor.get(y, p, w, o, [0, 0], s),
         _inside(_o, _s) and _inside([0, 0], _s)),
        ("pld.tensor.get", "'w" if _inside([0, 0], _s) else "'y",
         lambda x, y, w, sig, p, o=_o, s=_s: pld.tensor.get(y, p, w, [0, 0], o, s),
         _inside(_o, _s) and _inside([0, 0], _s)),
    ]
for _o, _s in _regions(REAL_SIZES):
    CASES += [
        ("pl.store", "'y", lambda x, y, w, sig, p, o=_o, s=_s: pl.store(_tile(s), o, y), _inside(_o, _s)),
        ("pl.assemble", "'y", lambda x, y, w, sig, p, o=_o, s=_s: pl.assemble(y, _tile(s), o), _inside(_o, _s)),
        ("pl.assemble", "[4, 6]",
         lambda x, y, w, sig, p, o=_o, s=_s: pl.assemble(_tile(BOUNDS), _tile(s), o), _inside(_o, _s)),
        ("pld.tile.remote_store", "'w",
         lambda x, y, w, sig, p, o=_o, s=_s: pld.tile.remote_store(_tile(s), w, p, o), _inside(_o, _s)),
        ("pld.tile.remote_store", "'w", lambda x, y, w, sig, p, o=_o, s=_s: pld.tile.remote_store(
            _tile(s), w, p, o, atomic=pld.AtomicType.Add), _inside(_o, _s)),
        ("pld.tensor.remote_store", "'w",
         lambda x, y, w, sig, p, o=_o, s=_s: pld.tensor.remote_store(_tile(s), w, p, o), _inside(_o, _s)),
    ]
for _i in _indices():
    CASES += [
        ("pl.read", "'x", lambda x, y, w, sig, p, i=_i: pl.read(x, i), _index_inside(_i)),
        ("pl.write", "'y", lambda x, y, w, sig, p, i=_i: pl.write(y, i, 1.0), _index_inside(_i)),
        ("pld.system.notify", "'sig", lambda x, y, w, sig, p, i=_i: pld.system.notify(
            sig, p, i, 0, op=pld.NotifyOp.AtomicAdd), _index_inside(_i)),
        ("pld.system.wait", "'sig", lambda x, y, w, sig, p, i=_i: pld.system.wait(sig, i, 0, cmp=pld.WaitCmp.Ge),
         _index_inside(_i)),
    ]
for _f in OFFSETS + OTHER_INTS:
    CASES += [
        ("pl.read", "'x", lambda x, y, w, sig, p, f=_f: pl.read(x, f), 0 <= int(_f) < ROWS * COLS),
        ("pl.write", "'y", lambda x, y, w, sig, p, f=_f: pl.write(y, f, 1.0), 0 <= int(_f) < ROWS * COLS),
    ]

# How a case ended, as the kernel records it.
OK, EXPLAINED, UNEXPLAINED, OTHER = 0, 1, 2, 3


def _outcome(op: str, tensor: str, run, args) -> int:
    try:
        run(*args)
    except KernelIndexError as e:
        text = str(e)
        return EXPLAINED if op in text and f"{THIS.name}:" in text and tensor in text else UNEXPLAINED
    except Exception:  # noqa: BLE001 - recorded: a raw numpy error or any other exception fails the test
        return OTHER
    return OK


@pl.jit.incore
def fuzz(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]],
         codes: pl.Out[pl.Tensor[[1, len(CASES)], pl.INT32]],
         w: pl.InOut[pld.DistributedTensor[[ROWS, COLS], pl.FP32]],
         sig: pl.InOut[pld.DistributedTensor[[ROWS, COLS], pl.INT32]]):
    ctx = pld.get_comm_ctx(w)
    peer = (pld.rank(ctx) + 1) % pld.nranks(ctx)
    out = [_outcome(op, tensor, run, (x, y, w, sig, peer)) for op, tensor, run, _ in CASES]
    pl.store(Tile(np.asarray(out, dtype=np.int32).reshape(1, -1)), [0, 0], codes)


fuzz_host = on_every_rank(fuzz)


def run_fuzz(backend: str | None, world: int = 2) -> np.ndarray:
    """Run the fuzz on ``world`` ranks; return each rank's codes, [world, len(CASES)]."""
    x = np.arange(world * ROWS * COLS, dtype=np.float32).reshape(world, ROWS, COLS)
    y = np.zeros_like(x)
    codes = np.full((world, 1, len(CASES)), -1, np.int32)
    cfg = RunConfig(backend=backend, distributed_config=DistributedConfig(device_ids=list(range(world))))
    fuzz_host.compile(x, y, codes, config=cfg)(x, y, codes)
    return codes[:, 0, :]


def mismatches(codes: np.ndarray) -> list[str]:
    """The cases whose outcome is not the one a user relies on (rank, operation, arguments, outcome)."""
    names = {OK: "ran", EXPLAINED: "KernelIndexError", UNEXPLAINED: "a KernelIndexError not naming op/line/tensor",
             OTHER: "another exception", -1: "not run"}
    bad = []
    for r, row in enumerate(codes):
        for (op, _, run, inside), code in zip(CASES, row):
            want = OK if inside else EXPLAINED
            if code != want:
                defaults = run.__defaults__
                bad.append(f"rank {r}: {op} with {defaults} {names.get(int(code), code)}, expected {names[want]}")
    return bad


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_every_region_operation_refuses_every_region_outside_its_tensor(backend):
    bad = mismatches(run_fuzz(backend))
    assert not bad, f"{len(bad)} of {len(CASES)} cases per rank:\n" + "\n".join(bad[:40])


MPIRUN = __import__("shutil").which("mpirun") or __import__("shutil").which("mpiexec")


@pytest.mark.skipif(MPIRUN is None or __import__("importlib").util.find_spec("mpi4py") is None,
                    reason="needs an MPI launcher and mpi4py")
def test_the_region_fuzz_holds_under_mpirun(tmp_path):
    from test_mpi import _mpirun

    proc = _mpirun(2, [sys.executable, str(THIS), str(tmp_path)])
    assert proc.returncode == 0, f"mpirun exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    for r in range(2):
        path = tmp_path / f"rank{r}.json"
        assert path.is_file(), f"process {r} wrote no results\n{proc.stderr[-6000:]}"
        result = json.loads(path.read_text())
        assert result["backend"] == "mpi"
        assert not result["mismatches"], "\n".join(result["mismatches"][:40])


# -- the message a user sees -----------------------------------------------------------------------

def _error_of(body, backend: str = "sim") -> str:
    with pytest.raises(RankError) as info:
        run_in_rank(body, np.zeros(BOUNDS, np.float32), backend=backend)
    return str(info.value)


def test_an_offset_near_2_to_the_63_is_out_of_bounds_not_a_read_of_zeros():
    def body(a):
        pl.load(a, [2**63 - 1, 0], [1, 6])  # o + s overflows int64

    line = THIS.read_text().splitlines().index("        pl.load(a, [2**63 - 1, 0], [1, 6])  # o + s overflows int64") + 1
    assert (f"KernelIndexError: pl.load at {THIS}:{line}: out of bounds on tensor 'a0' [4, 6] FP32: offsets "
            "[9223372036854775807, 0] with shape [1, 6] reach [9223372036854775807, 9223372036854775808) in "
            "dimension 0, whose bounds are [0, 4).") in _error_of(body)


def test_a_store_near_2_to_the_63_is_out_of_bounds_not_a_numpy_error():
    def body(a):
        pl.store(pl.full([1, 6], 1.0, pl.FP32), [2**63 - 1, 0], a)

    text = _error_of(body)
    assert "KernelIndexError: pl.store at" in text and "bug in ptodist" not in text
    assert "offsets [9223372036854775807, 0] with shape [1, 6]" in text


def test_a_negative_size_is_named_as_such():
    def body(a):
        pl.load(a, [0, 0], [-1, 6])

    assert ("out of bounds on tensor 'a0' [4, 6] FP32: offsets [0, 0] with shape [-1, 6] have a negative size in "
            "dimension 0; sizes are 0 or more.") in _error_of(body)


def test_a_subscript_outside_the_tensor_names_the_users_line():
    def body(a):
        a[0:2**63, :]

    line = THIS.read_text().splitlines().index("        a[0:2**63, :]") + 1
    assert (f"KernelIndexError: tensor 'a0' [4, 6] FP32 at {THIS}:{line}: subscript [0:9223372036854775808] in "
            "dimension 0 is outside [0, 4]; a region must lie inside the tensor (0 <= start <= stop <= 4)") \
        in _error_of(body)


def test_a_tile_slice_outside_the_tile_names_the_users_line():
    def body(a):
        pl.slice(pl.load(a, [0, 0], [4, 6]), [1, 2], [2**63 - 1, 0])

    line = THIS.read_text().splitlines().index("        pl.slice(pl.load(a, [0, 0], [4, 6]), [1, 2], [2**63 - 1, 0])") + 1
    assert (f"TileIndexError: pl.slice at {THIS}:{line}: region at offsets [9223372036854775807, 0] with shape "
            "[1, 2] is outside the [4, 6] tile: dimension 0 reaches [9223372036854775807, 9223372036854775808), "
            "whose bounds are [0, 4).") in _error_of(body)


def _mpi_main(out_dir: Path) -> int:
    """Run the fuzz in this MPI process (one rank of the job); write ``OUT_DIR/rank<r>.json``."""
    from ptodist.backends.mpi import load_mpi

    rank = load_mpi().COMM_WORLD.Get_rank()
    backend = RunConfig().resolved_backend()
    codes = run_fuzz(None)
    bad = [m for m in mismatches(codes) if m.startswith(f"rank {rank}:")]
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"backend": backend, "mismatches": bad}))
    return 0


if __name__ == "__main__":
    os.environ.pop("PTODIST_BACKEND", None)
    raise SystemExit(_mpi_main(Path(sys.argv[1])))
