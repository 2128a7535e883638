"""The tutorial ladder (examples/01..07): every example runs, checks its golden and prints OK, on shm and sim."""

from __future__ import annotations

import pytest
from conftest import REPO, ptodist_cli, run_example

# Every example runs on both local backends (PTODIST_BACKEND): the same program must pass the same golden.
pytestmark = pytest.mark.usefixtures("backend_env")


@pytest.mark.parametrize("stem, extra", [
    ("01_hello_rank", []),
    ("02_three_levels", []),
    ("03_window_buffer", []),
    ("04_barrier", []),
    ("05_remote_load_store", ["--mode", "load"]),
    ("05_remote_load_store", ["--mode", "store"]),
    ("06_put_get", ["--mode", "put"]),
    ("06_put_get", ["--mode", "get"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_example_two_ranks(capsys, stem, extra):
    run_example(capsys, stem, "-d", "0,1", "-p", "a2a3sim", *extra)


@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_dynamic_rank_count_any_p(capsys, nranks):
    run_example(capsys, "07_dynamic_rank_count", "-d", ",".join(str(i) for i in range(nranks)))


@pytest.mark.parametrize("stem, devices", [
    ("04_barrier", "4,6"),
    ("07_dynamic_rank_count", "9,2,5"),
])
def test_device_ids_need_not_be_contiguous_or_start_at_zero(capsys, stem, devices):
    # Ranks are indices 0..P-1 whatever the device ids are; peers are addressed by rank.
    run_example(capsys, stem, "-d", devices)


@pytest.mark.usefixtures("torch")  # the example imports torch
def test_example_through_cli():
    proc = ptodist_cli("run", "examples/05_remote_load_store.py", "-d", "0,1", cwd=REPO, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout.split(), proc.stdout + proc.stderr
