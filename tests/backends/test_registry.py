"""Backends registered by name with what they do: the built-in ones, one the test suite registers, and the runtime
asking capabilities (a worker's dispatches recorded with the backend they ran on, on every backend).

``reverse_sim.py`` is a whole new backend: that file and the one ``register(...)`` line of the fixture below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import worker_everywhere
from conftest import load_example, ptodist_cli
from reverse_sim import ReverseSimBackend, ReverseTurns
from test_mpi import LADDER, _mpirun, _run_example, needs_mpi

from ptodist import ConfigError, DistributedConfig, RunConfig, backends, ir
from ptodist.backends import Capabilities
from ptodist.errors import ApiTypeError

REVERSE = Capabilities(in_process=True, shared_host_memory=False, multi_node=False, deterministic=True)


@pytest.fixture
def reverse():
    """The test backend, registered for this test only (other tests list the built-in names alone)."""
    backends.register("sim-reverse", ReverseSimBackend, REVERSE)
    yield "sim-reverse"
    backends.unregister("sim-reverse")


def test_the_built_in_backends_declare_what_they_do():
    assert backends.names()[:3] == ("shm", "sim", "mpi")
    want = {"shm": (False, True, False, False, True), "sim": (True, False, False, True, False),
            "mpi": (True, False, True, False, False)}
    for name, (in_process, shared, multi_node, deterministic, keeps) in want.items():
        can = backends.capabilities(name)
        assert (can.in_process, can.shared_host_memory, can.multi_node, can.deterministic,
                can.keeps_groups) == (in_process, shared, multi_node, deterministic, keeps), name
    assert backends.capabilities("shm").job() is None and backends.capabilities("sim").job() is None


def test_a_registered_backend_is_a_name_every_selection_takes(reverse, monkeypatch):
    assert backends.names() == ("shm", "sim", "mpi", "sim-reverse")
    assert RunConfig(backend=reverse).resolved_backend() == reverse
    monkeypatch.setenv("PTODIST_BACKEND", reverse)
    assert RunConfig().resolved_backend() == reverse
    assert isinstance(backends.for_config(RunConfig()), ReverseSimBackend)
    assert backends.capabilities_for(RunConfig()) == REVERSE


def test_an_unknown_backend_is_refused_with_the_registered_names(reverse, monkeypatch):
    with pytest.raises(ConfigError) as info:
        RunConfig(backend="nccl")
    assert str(info.value) == "RunConfig(backend='nccl'): available backends are shm, sim, mpi, sim-reverse"
    monkeypatch.setenv("PTODIST_BACKEND", "nccl")
    with pytest.raises(ConfigError) as info:
        RunConfig().resolved_backend()
    assert str(info.value) == "PTODIST_BACKEND='nccl': available backends are shm, sim, mpi, sim-reverse"
    with pytest.raises(ConfigError) as info:
        backends.get_backend("nccl")
    assert str(info.value) == "unknown backend 'nccl'; available: shm, sim, mpi, sim-reverse"


def test_an_unregistered_backend_is_no_longer_a_name(reverse):
    backends.unregister(reverse)
    with pytest.raises(ConfigError) as info:
        RunConfig(backend=reverse)
    assert str(info.value) == "RunConfig(backend='sim-reverse'): available backends are shm, sim, mpi"


def test_register_refuses_a_taken_name_and_what_is_not_a_backend(reverse):
    with pytest.raises(ConfigError) as info:
        backends.register("sim", ReverseSimBackend, REVERSE)
    assert str(info.value) == ("backends.register('sim', ...): a backend named 'sim' is already registered "
                               "(registered: shm, sim, mpi, sim-reverse); register it under another name")
    with pytest.raises(ConfigError) as info:
        backends.register("", ReverseSimBackend, REVERSE)
    assert str(info.value) == "backends.register(name=''): a backend's name must be a non-empty string"
    with pytest.raises(ApiTypeError) as info:
        backends.register("other", None, REVERSE)
    assert str(info.value) == ("backends.register('other', factory=None, ...): the factory must be callable with no "
                               "argument and return the backend")
    with pytest.raises(ApiTypeError) as info:
        backends.register("other", ReverseSimBackend, {"in_process": True})
    assert str(info.value) == (
        "backends.register('other', ..., capabilities={'in_process': True}): expects a "
        "ptodist.backends.Capabilities(in_process=..., shared_host_memory=..., multi_node=..., deterministic=...)")
    assert "other" not in backends.names()


@pytest.mark.parametrize("stem, extra", LADDER, ids=[" ".join([s, *e]) for s, e in LADDER])
def test_a_registered_backend_runs_the_tutorial_ladder_selected_by_the_environment(reverse, stem, extra, monkeypatch):
    monkeypatch.setenv("PTODIST_BACKEND", reverse)
    before = ReverseTurns.made
    _run_example(stem, ["-d", "0,1,2,3", *extra])  # main checks its numbers against its golden and prints OK
    assert ReverseTurns.made > before  # its scheduler ran the ranks


def test_a_registered_backend_is_selected_by_the_run_config(reverse, torch):
    module = load_example("08_allreduce_mesh")
    p = 4
    x = torch.randn(p, 1, module.SIZE)
    y = torch.zeros(p, 1, module.SIZE)
    config = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p))), backend=reverse)
    before = ReverseTurns.made
    ir.compile(module.build(p), config=config)(x, y)
    assert ReverseTurns.made > before
    want = x.numpy().sum(0, keepdims=True).repeat(p, 0)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_registered_backend_runs_a_prepared_worker(reverse):
    got = worker_everywhere.run(4, reverse)
    assert got["backend"] == reverse
    assert {k: got[k] for k in ("ys", "z", "tallies")} == worker_everywhere.expected(4)


# -- what ran: `ptodist run --report-json` names the backend a worker's dispatches ran on ----------------------

WORKER = Path(worker_everywhere.__file__)


def _backends_ran(report: Path) -> tuple[str, list[str]]:
    doc = json.loads(report.read_text())
    assert doc["status"] == "ok", doc
    return doc["backend"], [p["backend"] for p in doc["programs"]]


@pytest.mark.parametrize("backend", ["sim", "shm"])
def test_the_report_names_the_backend_a_workers_dispatches_ran_on(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("PTODIST_BACKEND", backend)
    report = tmp_path / "report.json"
    proc = ptodist_cli("run", "--report-json", report, WORKER, 2, tmp_path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _backends_ran(report) == (backend, [backend])


@needs_mpi
def test_the_report_names_the_mpi_backend_for_a_workers_dispatches_under_mpirun(tmp_path):
    # Each process writes its own report (the launcher gives each its rank in the environment).
    command = ('exec "$0" -m ptodist run --report-json "$1/report${OMPI_COMM_WORLD_RANK:-$PMI_RANK}.json" "$2" 2 "$1"')
    proc = _mpirun(2, ["sh", "-c", command, sys.executable, str(tmp_path), str(WORKER)])
    assert proc.returncode == 0, f"mpirun exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    for rank in range(2):
        assert _backends_ran(tmp_path / f"report{rank}.json") == ("mpi", ["mpi"])
