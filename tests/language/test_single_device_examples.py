"""The single-device examples (examples/single_device/*.py): each runs, passes its golden and prints OK,
on shm and on sim, and ``ptodist check`` finds nothing in it."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, load_example, ptodist_cli

HERE = EXAMPLES / "single_device"
STEMS = ["elementwise", "softmax", "rmsnorm", "ffn", "splitk_matmul", "task_graph", "attention"]

def load(stem: str):
    """Import ``examples/single_device/<stem>.py`` once (skipped where torch is not installed)."""
    return load_example(f"single_device/{stem}")


def test_every_example_is_listed():
    assert sorted(p.stem for p in HERE.glob("*.py")) == sorted(STEMS)


@pytest.mark.usefixtures("backend_env")
@pytest.mark.parametrize("stem", STEMS)
def test_example_runs_and_passes_its_golden(capsys, stem):
    assert load(stem).main([]) == 0
    out = capsys.readouterr().out
    assert "OK" in out.split(), out


@pytest.mark.parametrize("stem", STEMS)
def test_example_is_deterministic_and_leaves_its_inputs_alone(stem, torch):
    m = load(stem)
    first = m.inputs()
    again = m.inputs()
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    before = [t.clone() for t in first]
    m.run(*first)
    n_out = 2 if stem == "task_graph" else 1  # outputs are the trailing arguments
    for a, b in zip(first[:-n_out], before[:-n_out]):
        assert torch.equal(a, b), "an input tensor changed"


@pytest.mark.usefixtures("torch")
@pytest.mark.parametrize("stem", STEMS)
def test_example_under_ptodist_check_has_no_findings(stem):
    proc = ptodist_cli("check", "--schedules", "2", HERE / f"{stem}.py", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # check keeps the script's own output to itself unless something is found
    assert "ptodist check: no findings in 2 schedule(s)" in proc.stderr, proc.stderr
    assert "1 dispatch(es)" in proc.stderr, proc.stderr


@pytest.mark.usefixtures("torch")
def test_examples_run_unmodified_with_the_pypto_spelling(tmp_path):
    # The same programs as a PyPTO user imports them; ptodist run makes pypto.* resolve to ptodist.*.
    spelling = {"import ptodist.language as pl\n": "import pypto.language as pl\n",
                "from ptodist import RunConfig\n": "from pypto.runtime import RunConfig\n"}
    for stem in STEMS:
        text = (HERE / f"{stem}.py").read_text()
        for ours, theirs in spelling.items():
            assert ours in text, f"{stem}.py: expected the line {ours!r}"
            text = text.replace(ours, theirs)
        assert "ptodist" not in text, stem
        (tmp_path / f"{stem}.py").write_text(text)
    driver = tmp_path / "all_examples.py"
    driver.write_text("import importlib\n\n"
                      f"for stem in {STEMS!r}:\n"
                      "    assert importlib.import_module(stem).main([]) == 0\n")
    proc = ptodist_cli("run", driver, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["OK"] * len(STEMS), proc.stdout + proc.stderr


@pytest.mark.parametrize("stem", STEMS)
def test_example_runs_with_every_diagnostic_output_on(capsys, monkeypatch, tmp_path, stem):
    from ptodist import RunConfig

    init = RunConfig.__init__

    def all_on(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.enable_chip_swimlane = self.enable_dep_gen = self.enable_scope_stats = True
        self.enable_dump_args = 2
        self.output_dir = str(tmp_path / "out")

    monkeypatch.setattr(RunConfig, "__init__", all_on)
    assert load(stem).main([]) == 0
    assert "OK" in capsys.readouterr().out.split()
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"chip_swimlane_records.json", "deps.json", "scope_stats.jsonl"} <= written, sorted(written)
    assert any(name.startswith("merged_swimlane_") for name in written), sorted(written)
    assert any(p.suffix == ".npy" for p in tmp_path.rglob("dump/*")), "no tensor dumps"
