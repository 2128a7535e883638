"""Default output directories: pruning keeps the newest few of a program, and never removes one in use.

Several processes running the same program under one ``PTODIST_OUTPUT_ROOT`` each make their own directory
and prune the old ones; a directory a live process still writes into (its program holds it) must survive that
pruning, whoever prunes, and be pruned once its process has ended.
"""

from __future__ import annotations

import gc
import subprocess
import textwrap
from pathlib import Path

import numpy as np
from conftest import child_env, on_every_rank, python_exe

import ptodist.language as pl
from ptodist import DistributedConfig, RunConfig, ir

# A process that makes its program's output directory, says which, waits for a line on stdin, then runs the program
# again with a diagnostic output on (its ranks write into that directory) and says it is done.
HOLDER = textwrap.dedent("""
    import sys

    import numpy as np

    sys.path.insert(0, {tests!r})
    from test_outputs_pruning import pruned
    from ptodist import DistributedConfig, RunConfig

    x = np.ones((2, 1, 4), np.float32)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), enable_dep_gen=True)
    compiled = pruned.compile(x, config=cfg)
    print(compiled.output_dir, flush=True)
    sys.stdin.readline()
    assert (compiled(x) == 1).all()
    print(sorted(p.name for p in compiled.output_dir.rglob("deps.json")), flush=True)
""")


def _start(script: Path, keep: int) -> subprocess.Popen:
    return subprocess.Popen([python_exe(), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(PTODIST_KEEP_OUTPUTS=keep))


def _finish(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err
    return out.splitlines()


def _ours(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("pruned_"))


def test_a_directory_a_live_process_writes_into_is_never_pruned_by_another(tmp_path):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER.format(tests=str(Path(__file__).parent)))
    root = Path(child_env()["PTODIST_OUTPUT_ROOT"])
    first = _start(script, keep=1)
    try:
        held = Path(first.stdout.readline().strip())  # its directory: made, and the process waits on stdin
        assert held.is_dir() and held.parent == root
        second = _start(script, keep=1)  # keeps 1: the newest (its own); the first's is older but in use
        lines = _finish(second)
        assert held.is_dir(), "a live process's output directory was pruned"
        assert _ours(root) == sorted([held.name, Path(lines[0]).name])
    finally:
        lines = _finish(first)  # its ranks write deps.json into its directory: it is still there
    assert lines == ["['deps.json', 'deps.json']"]
    third = _start(script, keep=1)  # both earlier processes have ended: their directories go now
    lines = _finish(third)
    assert _ours(root) == [Path(lines[0]).name]


NR = pl.dynamic("NR")


@pl.jit.incore
def _copy(x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
    pl.store(pl.load(x, [0, 0], [1, 4]), [0, 0], y)


pruned = on_every_rank(_copy, name="pruned")


def test_a_directory_a_live_program_of_this_process_holds_is_never_pruned(monkeypatch):
    monkeypatch.setenv("PTODIST_KEEP_OUTPUTS", "1")
    x = np.ones((2, 1, 4), np.float32)
    cfg = RunConfig(backend="sim", distributed_config=DistributedConfig(device_ids=[0, 1]))
    # ir.compile makes a new program each time (pruned.compile would give its cached one back)
    a = ir.compile(pruned, config=cfg)
    b = ir.compile(pruned, config=cfg)
    root = a.output_dir.parent
    assert a.output_dir != b.output_dir and _ours(root) == sorted([a.output_dir.name, b.output_dir.name])
    assert (a(x) == 1).all() and (a.output_dir / "dispatch_plan.json").is_file()
    gone = a.output_dir.name
    del a
    gc.collect()  # the program is gone: nothing writes into its directory any more
    c = ir.compile(pruned, config=cfg)
    assert gone not in _ours(root) and _ours(root) == sorted([b.output_dir.name, c.output_dir.name])
