"""Upstream-style examples (class-form programs, ``ir.compile``, ``main(argv)``): they run at P = 2 and 4 on
shm and sim, print OK, pass ``ptodist check`` with no findings, and run with every DFX flag on (the MoE
example, examples/moe_dispatch_combine.py, too).

* examples/tp_gemm_allreduce.py: tensor-parallel GEMM, ring and mesh allreduce, in the kernel or from the host,
  on a [5, 7] output (35 elements: no P divides it).
* examples/persistent_worker_callbacks.py: a persistent DistributedWorker, a sub-worker callback between two
  segments of every dispatch, two dispatches in flight, resident and stacked tensors, a deferred completion.
"""

from __future__ import annotations

import json
import sys

import pytest
from conftest import EXAMPLES, run_example

from ptodist import cli
from ptodist.check import explore

GEMM = "tp_gemm_allreduce"
WORKER = "persistent_worker_callbacks"
GEMM_VARIANTS = [["--mode", m, "--where", w] for m in ("ring", "mesh") for w in ("kernel", "host")]


def devices(nranks: int) -> str:
    return ",".join(str(i) for i in range(nranks))


# -- each example runs on shm and sim at P = 2 and 4 ---------------------------------------------------------

@pytest.mark.usefixtures("backend_env")
@pytest.mark.parametrize("extra", GEMM_VARIANTS, ids=" ".join)
@pytest.mark.parametrize("nranks", [2, 4])
def test_tp_gemm_allreduce_runs(capsys, nranks, extra):
    run_example(capsys, GEMM, "-d", devices(nranks), *extra)


@pytest.mark.usefixtures("backend_env")
@pytest.mark.parametrize("nranks", [2, 4])
def test_persistent_worker_callbacks_runs(capsys, nranks):
    run_example(capsys, WORKER, "-d", devices(nranks))


# -- and passes ptodist check -------------------------------------------------------------------------------

CHECKED = [(GEMM, extra) for extra in GEMM_VARIANTS] + [(WORKER, [])]


@pytest.mark.parametrize("stem, extra", CHECKED, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
@pytest.mark.parametrize("nranks", [2, 4])
def test_example_has_no_findings_under_several_schedules(stem, extra, nranks, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    argv = [*extra, "-d", devices(nranks)]
    for seed in range(8):
        out = explore.run_schedule(str(EXAMPLES / f"{stem}.py"), argv, seed)
        assert out.exit_code == 0 and not out.findings, (seed, out.traceback, [f.render() for f in out.findings])
        assert out.session.dispatches >= 1 and "OK" in out.stdout.split(), out.stdout


@pytest.mark.parametrize("stem, extra", [(GEMM, ["--mode", "ring", "--where", "host"]), (WORKER, [])],
                         ids=[GEMM, WORKER])
def test_ptodist_check_command_reports_no_findings(stem, extra, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", list(sys.path))
    report = tmp_path / "report.json"
    rc = cli.main(["check", "--schedules", "2", "--report-json", str(report),
                   str(EXAMPLES / f"{stem}.py"), "-d", "0,1,2,3", *extra])
    err = capsys.readouterr().err
    assert rc == 0, err
    doc = json.loads(report.read_text())
    assert doc["status"] == "ok" and doc["findings"] == [], doc
    assert "no findings in 2 schedule(s) (seeds 0..1)." in err, err


def test_the_worker_example_keeps_two_dispatches_in_flight_and_calls_back_every_step(capsys, monkeypatch):
    # The callback ran once per step, in step order of acceptance, and saw mid before its correction.
    monkeypatch.setenv("PTODIST_BACKEND", "sim")
    module = __import__("conftest").load_example(WORKER)
    seen = []
    original = module.Inspector.__call__

    def spy(self, args):
        seen.append((int(args.scalar(0)), args.tensor_count(), args.scalar_count()))
        original(self, args)

    monkeypatch.setattr(module.Inspector, "__call__", spy)
    assert module.main(["-d", "0,1,2", "--steps", "4"]) == 0
    assert "OK" in capsys.readouterr().out.split()
    assert seen == [(s, 1, 1) for s in range(4)], seen


# -- every example also runs with every diagnostic output on ---------------------------------------------------

@pytest.mark.parametrize("stem, extra", [(GEMM, ["--mode", "ring", "--where", "host"]), (WORKER, []),
                                         ("moe_dispatch_combine", [])], ids=lambda v: v if isinstance(v, str) else "")
def test_example_runs_with_every_diagnostic_output_on(capsys, monkeypatch, tmp_path, stem, extra):
    from ptodist import RunConfig

    init = RunConfig.__init__

    def all_on(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.enable_chip_swimlane = self.enable_dep_gen = self.enable_scope_stats = True
        self.output_dir = str(tmp_path / "out")

    monkeypatch.setattr(RunConfig, "__init__", all_on)
    run_example(capsys, stem, "-d", devices(2), *extra)
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"chip_swimlane_records.json", "deps.json", "scope_stats.jsonl"} <= written, sorted(written)
    assert any(name.startswith("merged_swimlane_") for name in written), sorted(written)
