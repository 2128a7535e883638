"""The same DistributedWorker program on every backend: shm, sim, and mpi under ``mpirun -n 2`` / ``-n 4``.

The program (tests/programs/worker_everywhere.py) uses resident and stacked tensors, persistent windows,
two dispatches in flight and a sub-worker callback; every backend must give the same numbers.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import worker_everywhere
from test_mpi import _leftovers, _mpirun

MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")


def _same(got: dict, world: int) -> None:
    want = worker_everywhere.expected(world)
    assert got["ys"] == want["ys"]           # dispatch k: each rank pulled its right neighbour's k * x
    assert got["z"] == want["z"]             # the stacked output after three dispatches: 3 * x
    assert got["tallies"] == want["tallies"]  # the callback ran once per dispatch, in order, after the ranks


@pytest.mark.parametrize("backend", ["shm", "sim"])
@pytest.mark.parametrize("world", [2, 4])
def test_a_prepared_worker_gives_the_same_results_on_a_local_backend(backend, world):
    got = worker_everywhere.run(world, backend)
    assert got["backend"] == backend
    _same(got, world)


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun on this machine")
@pytest.mark.parametrize("world", [2, 4])
def test_a_prepared_worker_gives_the_same_results_under_mpirun(world, tmp_path):
    script = Path(worker_everywhere.__file__)
    proc = _mpirun(world, [sys.executable, str(script), str(world), str(tmp_path)])
    assert proc.returncode == 0, f"mpirun exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    for p in range(world):
        got = json.loads((tmp_path / f"process{p}.json").read_text())
        assert got["backend"] == "mpi"
        _same(got, world)
    assert not _leftovers(str(tmp_path))
