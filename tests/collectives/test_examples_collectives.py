"""The collective steps of the tutorial ladder (examples/08..16): every mode runs, checks its golden, prints OK.

Every case runs on both local backends, shm and sim.
"""

from __future__ import annotations

import pytest
from conftest import load_example, run_example

# Every example runs on both local backends (PTODIST_BACKEND): the same program must pass the same golden.
pytestmark = pytest.mark.usefixtures("backend_env")


def devices(nranks: int) -> str:
    return ",".join(str(i) for i in range(nranks))


# Every example, mode and flag at P=2 and P=4; P=8 for the allreduces, allgather and the capstone.
CASES = [
    ("08_allreduce_mesh", [], (2, 4, 8)),
    ("09_allreduce_two_phase", [], (2, 4)),
    ("10_allreduce_ring", [], (2, 4, 8)),
    ("11_allreduce_builtin", ["--mode", "mesh", "--where", "kernel"], (2, 4, 8)),
    ("11_allreduce_builtin", ["--mode", "ring", "--where", "kernel"], (2, 4, 8)),
    ("11_allreduce_builtin", ["--mode", "mesh", "--where", "host"], (2, 4, 8)),
    ("11_allreduce_builtin", ["--mode", "ring", "--where", "host"], (2, 4, 8)),
    ("12_broadcast", [], (2, 4)),
    ("12_broadcast", ["--use-builtin"], (2, 4)),
    ("13_allgather", [], (2, 4, 8)),
    ("13_allgather", ["--use-builtin"], (2, 4, 8)),
    ("14_reduce_scatter", [], (2, 4)),
    ("14_reduce_scatter", ["--use-builtin"], (2, 4)),
    ("15_all_to_all", [], (2, 4)),
    ("15_all_to_all", ["--use-builtin"], (2, 4)),
    ("16_putting_it_together", ["--mode", "mesh"], (2, 4)),
    ("16_putting_it_together", ["--mode", "ring"], (2, 4, 8)),
]


@pytest.mark.parametrize("stem, extra, nranks", [
    pytest.param(stem, extra, p, id=f"{stem} {' '.join(extra)} P={p}".replace("  ", " "))
    for stem, extra, ps in CASES for p in ps
])
def test_collective_example(capsys, stem, extra, nranks):
    run_example(capsys, stem, "-d", devices(nranks), "-p", "a2a3sim", *extra)


@pytest.mark.parametrize("use_builtin", [False, True], ids=["by-hand", "builtin"])
@pytest.mark.parametrize("nranks, root", [(2, 1), (4, 3), (4, 2)])
def test_broadcast_from_a_nonzero_root(capsys, nranks, root, use_builtin):
    flags = ["--use-builtin"] if use_builtin else []
    run_example(capsys, "12_broadcast", "-d", devices(nranks), "--root", str(root), *flags)


@pytest.mark.parametrize("stem, extra", [
    ("10_allreduce_ring", []),
    ("11_allreduce_builtin", ["--mode", "ring", "--where", "host"]),
    ("15_all_to_all", ["--use-builtin"]),
])
def test_device_ids_need_not_be_contiguous(capsys, stem, extra):
    # Peers, neighbours and chunk owners are rank indices 0..P-1, whatever the device ids are.
    run_example(capsys, stem, "-d", "3,1,7,5", *extra)


@pytest.mark.parametrize("stem, extra", [
    ("10_allreduce_ring", []),
    ("11_allreduce_builtin", ["--mode", "ring"]),
    ("16_putting_it_together", ["--mode", "ring"]),
])
def test_ring_examples_refuse_a_rank_count_that_does_not_divide(capsys, stem, extra):
    with pytest.raises(SystemExit) as exc:
        load_example(stem).main(["-d", devices(3), *extra])
    assert exc.value.code == 2
    assert "divide" in capsys.readouterr().err
