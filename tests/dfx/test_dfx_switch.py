"""Diagnostic outputs on without editing the script: ``ptodist run --dfx`` and ``PTODIST_DFX``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import child_env, on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, dfx, shared_array
from ptodist.config import DFX_KINDS, parse_dfx
from ptodist.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "04_barrier.py"
# the in-script switch: every output PTODIST_DFX=all turns on, given to the example's own RunConfig
IN_SCRIPT = "enable_chip_swimlane=True, enable_dep_gen=True, enable_scope_stats=True, enable_dump_args=1, "
NAMES = ("swimlane (or trace: timing records and the merged trace), deps (deps.json), scope_stats "
         "(scope_stats.jsonl), dump (the tensors pl.dump_tag marks) (docs/dfx.md#without-editing-the-script)")


def bad_value(where: str, value: str, word: str) -> str:
    return (f"{where}={value!r}: '{word}' is not one of ptodist's diagnostic outputs. Give all, none, or a "
            f"comma-separated list of: {NAMES}")


def ptodist_run(cwd: Path, *args, **env) -> subprocess.CompletedProcess:
    """``python -m ptodist run ARGS`` in ``cwd``, its default output directories under ``cwd/<PTODIST_OUTPUT_ROOT>``."""
    environ = child_env(**env)
    if "PTODIST_DFX" not in env:
        environ.pop("PTODIST_DFX", None)
    return subprocess.run([sys.executable, "-m", "ptodist", "run", *map(str, args)], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=300)


def outputs(root: Path) -> tuple[list[str], dict]:
    """The DFX files one run of the example wrote under ``root`` (the merged trace's time stamp left out), and
    what they hold that does not depend on timing: records, task graphs, scope events."""
    (run,) = root.glob("*/dfx_outputs")
    files = sorted(re.sub(r"merged_swimlane_\d{8}_\d{6}_\d{6}", "merged_swimlane_<stamp>", str(p.relative_to(run)))
                   for p in run.rglob("*") if p.is_file() and p.name != dfx.IN_USE)
    held = {}
    for r in (0, 1):
        d = run / f"rank{r}" / "d0"
        recs = json.loads((d / "chip_swimlane_records.json").read_text())["records"]
        held[f"records {r}"] = [(x["kind"], x["name"], Path(x["where"]).name) for x in recs]
        deps = json.loads((d / "deps.json").read_text())
        held[f"deps {r}"] = (deps["edges"], [t["kernel"] for t in deps["tasks"]])
        lines = [json.loads(line) for line in (d / "scope_stats" / "scope_stats.jsonl").read_text().splitlines()]
        held[f"scopes {r}"] = [(x.get("event"), x.get("scope"), x.get("name")) for x in lines]
    return files, held


@pytest.fixture(scope="module")
def three_ways(tmp_path_factory):
    """examples/04_barrier.py run as ``ptodist run --dfx``, under ``PTODIST_DFX=all``, and edited to ask itself."""
    base = tmp_path_factory.mktemp("dfx switch")  # a path with a space
    edited = base / "edited" / EXAMPLE.name
    edited.parent.mkdir()
    text = EXAMPLE.read_text()
    assert text.count("RunConfig(platform=args.platform, ") == 1
    edited.write_text(text.replace("RunConfig(platform=args.platform, ", "RunConfig(platform=args.platform, "
                                   + IN_SCRIPT))  # on the same line: the records' lines stay those of the example
    runs = {"flag": ptodist_run(base, "--dfx", EXAMPLE, PTODIST_OUTPUT_ROOT="flag"),
            "env": ptodist_run(base, EXAMPLE, PTODIST_OUTPUT_ROOT="env", PTODIST_DFX="all"),
            "script": ptodist_run(base, edited, PTODIST_OUTPUT_ROOT="script")}
    for p in runs.values():
        assert p.returncode == 0 and p.stdout == "OK\n", p.stderr
    return base, runs


def test_the_flag_and_the_environment_write_what_the_script_s_own_switch_writes(three_ways):
    base, _ = three_ways
    files, held = outputs(base / "script")
    assert files == ["merged_swimlane_<stamp>.json"] + [f"rank{r}/d0/{name}" for r in (0, 1) for name in (
        "chip_swimlane_records.json", "deps.json", "scope_stats/scope_stats.jsonl")]
    assert {kind for r in (0, 1) for kind, _, _ in held[f"records {r}"]} == {"task", "notify", "wait", "rma"}
    assert outputs(base / "flag") == (files, held)
    assert outputs(base / "env") == (files, held)


def test_a_run_the_environment_switched_on_says_where_its_outputs_are(three_ways):
    base, runs = three_ways
    (folder,) = (base / "flag").glob("barrier_shift_*")
    where = Path("flag") / folder.name
    assert (f"ptodist: PTODIST_DFX=all: this run's diagnostic outputs go to {where / 'dfx_outputs'}; summarise "
            f"them with: ptodist trace {where}\n") in runs["flag"].stderr
    assert "PTODIST_DFX" not in runs["script"].stderr  # the script's own switch: it knows where its outputs go
    p = subprocess.run([sys.executable, "-m", "ptodist", "trace", str(where)], cwd=base, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith(f"ptodist trace: {where / 'dfx_outputs'}\n"), p.stderr


def test_a_list_turns_on_those_outputs_only(tmp_path):
    p = ptodist_run(tmp_path, "--dfx", "deps,scope_stats", EXAMPLE, PTODIST_OUTPUT_ROOT="out")
    assert p.returncode == 0, p.stderr
    (run,) = (tmp_path / "out").glob("*/dfx_outputs")
    assert sorted(str(f.relative_to(run)) for f in run.rglob("*") if f.is_file() and f.name != dfx.IN_USE) == \
        [f"rank{r}/d0/{name}" for r in (0, 1) for name in ("deps.json", "scope_stats/scope_stats.jsonl")]


def test_a_bad_value_is_refused_before_the_script_runs(tmp_path):
    p = ptodist_run(tmp_path, "--dfx", "swimlanes,deps", EXAMPLE, PTODIST_OUTPUT_ROOT="out")
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"ptodist run: {bad_value('--dfx', 'swimlanes,deps', 'swimlanes')}\n"
    p = ptodist_run(tmp_path, EXAMPLE, PTODIST_OUTPUT_ROOT="out", PTODIST_DFX="timeline")
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"ptodist run: {bad_value('PTODIST_DFX', 'timeline', 'timeline')}\n"
    assert not (tmp_path / "out").exists()  # nothing ran


def test_parse_dfx():
    assert parse_dfx("all") == set(DFX_KINDS) == {"swimlane", "deps", "scope_stats", "dump"}
    assert parse_dfx(" Swimlane , DEPS") == parse_dfx("trace,deps") == {"swimlane", "deps"}
    for off in ("", "none", "off", "0", " NONE "):
        assert parse_dfx(off) == set()
    with pytest.raises(ConfigError) as e:
        parse_dfx("swimlane,,deps")
    assert str(e.value).startswith("PTODIST_DFX='swimlane,,deps': an empty name is not one of ptodist's diagnostic")


# -- in this process: the environment adds to the config's own switch, on every path ---------------------------------

@pl.jit.incore
def ping(sig: pl.InOut[pld.DistributedTensor[[pl.dynamic("NR"), 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(sig))
    pld.system.notify(sig, 1 - me, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
    pld.system.wait(sig, [1 - me, 0], 1, cmp=pld.WaitCmp.Ge)
    return sig


ping_host = on_every_rank(ping)


def run_files(out: Path) -> list[str]:
    run = dfx.latest_run(out)
    if run is None:
        return []
    return sorted(str(f.relative_to(run)) for f in run.glob("rank0/**/*") if f.is_file())


@pytest.mark.parametrize("how", ["one-shot", "sim", "worker"])
def test_the_environment_adds_to_the_config_s_own_outputs(tmp_path, monkeypatch, how):
    x = shared_array((2, 1), np.float32)  # a worker's ranks see host tensors in shared memory
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), output_dir=str(tmp_path / "out"),
                    enable_scope_stats=True, backend="sim" if how == "sim" else None)
    compiled = ping_host.compile(x, config=cfg)
    monkeypatch.setenv("PTODIST_DFX", "swimlane")
    assert cfg.any_dfx_enabled() and cfg.with_dfx_setting().enable_chip_swimlane and not cfg.enable_chip_swimlane
    if how == "worker":
        with compiled.prepare() as rt:
            rt(x)
    else:
        compiled(x)
    # the config's scope stats, and the environment's swimlane (which brings deps.json, as upstream's does)
    assert run_files(tmp_path / "out") == ["rank0/d0/chip_swimlane_records.json", "rank0/d0/deps.json",
                                           "rank0/d0/scope_stats/scope_stats.jsonl"]


def test_none_adds_nothing_and_a_bad_value_stops_the_call(tmp_path, monkeypatch):
    x = np.zeros((2, 1), np.float32)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), output_dir=str(tmp_path / "out"))
    compiled = ping_host.compile(x, config=cfg)
    monkeypatch.setenv("PTODIST_DFX", "none")
    compiled(x)
    assert run_files(tmp_path / "out") == [] and not cfg.any_dfx_enabled()
    monkeypatch.setenv("PTODIST_DFX", "swimlane;deps")
    with pytest.raises(ConfigError) as e:
        compiled(x)
    assert str(e.value) == bad_value("PTODIST_DFX", "swimlane;deps", "swimlane;deps")


def test_ptodist_trace_names_the_switch_that_needs_no_edit(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ptodist", "trace", str(tmp_path)], env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr == (f"ptodist trace: {tmp_path} holds no DFX outputs (no dfx_outputs/ folder in it). Run the "
                        "program with RunConfig(enable_chip_swimlane=True) (or, without editing the script, ptodist "
                        "run --dfx SCRIPT or PTODIST_DFX=swimlane) (and its output_dir, or PTODIST_OUTPUT_ROOT, "
                        "pointing here), then run ptodist trace on compiled.output_dir.\n")
