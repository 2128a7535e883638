"""The build output tree a compile writes (upstream's layout, ptodist's information), loading a build back with
``from_dir``, and the introspection upstream's tests read (``compiled.program``, ``python_print``, ``_cache``)."""

from __future__ import annotations

import inspect
import json
import os
import runpy
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import child_env, python_exe

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, compat, ir
from ptodist.errors import BuildError, BuildNotFoundError, UsageError
from ptodist.ir import ParamDirection
from ptodist.ir.distributed_compiled_program import DistributedCompiledProgram
from ptodist.runtime import BenchmarkStats
from ptodist.runtime.artifacts import ArgDirection, CallConfig
from ptodist.runtime.program import CompiledProgram

NR = pl.dynamic("NR")
N = pl.dynamic("N")
HERE = os.path.abspath(__file__)


def sim(nr: int = 2, **kw) -> RunConfig:
    return RunConfig(backend="sim", distributed_config=DistributedConfig(device_ids=list(range(nr))), **kw)


# -- an L3 program: two chip-level functions and a builtin allreduce --------------------------------

@pl.jit.incore
def bump(x: pl.Tensor[[1, 64], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, 64], pl.FP32]]):
    pl.store(pl.add(pl.load(x, [0, 0], [1, 64]), 1.0), [0, 0], data)


@pl.jit
def stage(x: pl.Tensor[[1, 64], pl.FP32], data: pl.InOut[pld.DistributedTensor[[1, 64], pl.FP32]]):
    bump(x, data)


@pl.jit.incore
def fetch(data: pld.DistributedTensor[[1, 64], pl.FP32], y: pl.Out[pl.Tensor[[1, 64], pl.FP32]]):
    pl.store(pl.load(data, [0, 0], [1, 64]), [0, 0], y)


@pl.jit
def collect(data: pld.DistributedTensor[[1, 64], pl.FP32], y: pl.Out[pl.Tensor[[1, 64], pl.FP32]]):
    fetch(data, y)


@pl.jit.host
def peak(x: pl.Tensor[[NR, 1, 64], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 64], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 64], dtype=pl.FP32)
    sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        data = pld.window(buf, [1, 64], dtype=pl.FP32)
        stage(x[r], data, device=r)
    data = pld.window(buf, [1, 64], dtype=pl.FP32)
    sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
    pld.tensor.allreduce(data, sig, op=pld.ReduceOp.Max)
    for r in pl.range(pld.world_size()):
        data = pld.window(buf, [1, 64], dtype=pl.FP32)
        collect(data, y[r], device=r)


@pl.jit.host
def total(x: pl.Tensor[[NR, 1, 64], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 64], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 64], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        stage(x[r], pld.window(buf, [1, 64], dtype=pl.FP32), device=r)
    pld.tensor.allreduce(pld.window(buf, [1, 64], dtype=pl.FP32))  # its text does not name the window's dtype
    for r in pl.range(pld.world_size()):
        collect(pld.window(buf, [1, 64], dtype=pl.FP32), y[r], device=r)


@pl.jit.incore
def pick_row(g: pld.DistributedTensor[[NR, 64], pl.FP32], y: pl.Out[pl.Tensor[[1, 64], pl.FP32]]):
    pl.store(pl.load(g, [1, 0], [1, 64]), [0, 0], y)


@pl.jit
def pick(g: pld.DistributedTensor[[NR, 64], pl.FP32], y: pl.Out[pl.Tensor[[1, 64], pl.FP32]]):
    pick_row(g, y)


@pl.jit.host
def mixed(x: pl.Tensor[[NR, 1, 64], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 64], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 64], dtype=pl.FP32)
    gbuf = pld.alloc_window_buffer([pld.world_size(), 64], dtype=pl.FP32)
    bbuf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    abuf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        stage(x[r], pld.window(buf, [1, 64], dtype=pl.FP32), device=r)
    data = pld.window(buf, [1, 64], dtype=pl.FP32)
    bar = pld.window(bbuf, [pld.world_size(), 1], dtype=pl.INT32)
    pld.tensor.barrier(bar)
    pld.tensor.allreduce(data, mode="ring")
    gathered = pld.window(gbuf, [pld.world_size(), 64], dtype=pl.FP32)
    pld.tensor.allgather(data, gathered, pld.window(abuf, [pld.world_size(), 1], dtype=pl.INT32))
    for r in pl.range(pld.world_size()):
        pick(gathered, y[r], device=r)


# -- L2 programs ------------------------------------------------------------------------------------

@pl.program
class Scale:
    @pl.function(type=pl.FunctionType.InCore)
    def scale_kernel(self, x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [4, 8]), 3.0), [0, 0], y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def scale(self, x: pl.Tensor[[4, 8], pl.FP32],
              y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]) -> pl.Tensor[[4, 8], pl.FP32]:
        self.scale_kernel(x, y)
        return y


@pl.program
class TwoWays:
    @pl.function(type=pl.FunctionType.InCore)
    def times(self, x: pl.Tensor[[2, 8], pl.FP32], y: pl.Out[pl.Tensor[[2, 8], pl.FP32]], k: pl.Scalar[pl.FP32]):
        pl.store(pl.mul(pl.load(x, [0, 0], [2, 8]), k), [0, 0], y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def double(self, x: pl.Tensor[[2, 8], pl.FP32], y: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
        self.times(x, y, 2.0)

    @pl.function(type=pl.FunctionType.Orchestration)
    def triple(self, x: pl.Tensor[[2, 8], pl.FP32], y: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
        self.times(x, y, 3.0)


@pl.jit.incore
def twice_kernel(x: pl.Tensor[[N, 8], pl.FP32], y: pl.Out[pl.Tensor[[N, 8], pl.FP32]]):
    pl.store(pl.mul(pl.load(x, [0, 0], [x.shape[0], 8]), 2.0), [0, 0], y)


@pl.jit
def twice(x: pl.Tensor[[N, 8], pl.FP32], y: pl.Out[pl.Tensor[[N, 8], pl.FP32]]):
    twice_kernel(x, y)


@pl.jit.incore
def square(a: pl.Tensor[[16, 16], pl.FP32], c: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
    t = pl.load(a, [0, 0], [16, 16])
    pl.store(pl.matmul(t, t), [0, 0], c)


@pl.jit
def copy_any(x: pl.Tensor, y: pl.Out[pl.Tensor]):
    y[...] = x


def config_of(path) -> dict:
    return runpy.run_path(str(path))


def inputs(nr: int = 2) -> np.ndarray:
    return np.arange(nr * 64, dtype=np.float32).reshape(nr, 1, 64) * np.float32(0.5)


# -- the L3 build ----------------------------------------------------------------------------------

def test_an_l3_build_holds_the_host_orchestration_its_meta_and_a_folder_per_chip_function(tmp_path):
    compiled = ir.compile(peak, output_dir=tmp_path / "peak", config=sim())
    out = compiled.output_dir
    assert Path(compiled) == out == tmp_path / "peak" and os.path.join(compiled, "x") == str(out / "x")
    assert sorted(p.name for p in (out / "next_levels").iterdir()) == [
        "builtin.tensor.allreduce__max__fp32", "collect", "stage"]
    assert (out / "orchestration" / "host_orch.py").is_file()
    meta = json.loads((out / "distributed_meta.json").read_text())
    assert {k: v for k, v in meta.items() if k != "ptodist"} == {
        "schema": 1,
        "params": [{"name": "x", "direction": "In", "shape": [-1, 1, 64], "dtype": "fp32"},
                   {"name": "y", "direction": "Out", "shape": [-1, 1, 64], "dtype": "fp32"}],
        "num_return_types": 0, "platform": "a2a3sim", "backend_type": "Ascend910B",
        "distributed_config": {"device_ids": [0, 1], "num_sub_workers": 0, "runtime": "tensormap_and_ringbuffer",
                               "block_dim": None, "aicpu_thread_num": 4}}
    assert meta["ptodist"]["origin"] == {"form": "function", "module": __name__, "qualname": "peak", "file": HERE,
                                         "orchestration": None}
    assert [f["name"] for f in meta["ptodist"]["functions"]] == ["bump", "collect", "fetch", "peak", "stage"]

    chip = config_of(out / "next_levels" / "stage" / "kernel_config.py")
    assert chip["RUNTIME_CONFIG"] == {"runtime": "tensormap_and_ringbuffer", "aicpu_thread_num": 4, "block_dim": None}
    assert chip["ORCHESTRATION"] == {"source": HERE, "function_name": "stage", "line": stage.line,
                                     "qualname": "stage", "signature": [ArgDirection.IN, ArgDirection.INOUT]}
    assert chip["KERNELS"] == [{"func_id": 0, "name": "bump", "source": HERE, "line": bump.line, "qualname": "bump",
                                "core_type": "aiv", "signature": [ArgDirection.IN, ArgDirection.INOUT]}]
    assert config_of(out / "next_levels" / "collect" / "kernel_config.py")["KERNELS"][0]["signature"] == [
        ArgDirection.IN, ArgDirection.OUT]

    variant = config_of(out / "next_levels" / "builtin.tensor.allreduce__max__fp32" / "kernel_config.py")
    assert variant["ORCHESTRATION"]["function_name"] == "pld.tensor.allreduce"
    assert variant["KERNELS"][0]["name"] == "allreduce__max__fp32"
    assert variant["KERNELS"][0]["signature"] == [ArgDirection.INOUT, ArgDirection.INOUT]
    line = open(HERE).read().splitlines().index("    pld.tensor.allreduce(data, sig, op=pld.ReduceOp.Max)") + 1
    assert variant["KERNELS"][0]["called_at"] == f"{HERE}:{line}"

    host_orch = config_of(out / "orchestration" / "host_orch.py")
    assert host_orch["CALLABLES"] == {"collect": "next_levels/collect", "stage": "next_levels/stage",
                                      "builtin.tensor.allreduce__max__fp32":
                                          "next_levels/builtin.tensor.allreduce__max__fp32"}
    assert host_orch["entry"]._pypto_distributed_entry is True


def test_the_tree_is_written_at_compile_and_never_per_dispatch(tmp_path):
    compiled = ir.compile(peak, output_dir=tmp_path / "peak", config=sim())
    files = sorted(p for p in compiled.output_dir.rglob("*") if p.is_file() and p.name != ".ptodist-in-use")
    stamps = [p.stat().st_mtime_ns for p in files]
    x = inputs()
    for _ in range(3):
        np.testing.assert_array_equal(compiled(x), np.broadcast_to((x + 1).max(axis=0), x.shape))
    assert [p.stat().st_mtime_ns for p in files] == stamps


def test_a_collective_variant_the_source_does_not_tell_is_written_with_the_first_plan(tmp_path):
    compiled = ir.compile(total, output_dir=tmp_path / "total", config=sim())
    out = compiled.output_dir
    assert sorted(p.name for p in (out / "next_levels").iterdir()) == ["collect", "stage"]
    x = inputs()
    np.testing.assert_array_equal(compiled(x), np.broadcast_to((x + 1).sum(axis=0), x.shape))
    assert sorted(p.name for p in (out / "next_levels").iterdir()) == [
        "builtin.tensor.allreduce__sum__fp32", "collect", "stage"]
    assert "builtin.tensor.allreduce__sum__fp32" in config_of(out / "orchestration" / "host_orch.py")["CALLABLES"]
    variant = config_of(out / "next_levels" / "builtin.tensor.allreduce__sum__fp32" / "kernel_config.py")
    line = [i for i, t in enumerate(open(HERE).read().splitlines(), 1)
            if t.startswith("    pld.tensor.allreduce(pld.window(buf")][0]
    assert variant["KERNELS"][0]["called_at"] == f"{HERE}:{line}"


def test_a_workers_first_plan_writes_the_variant_too(tmp_path):
    compiled = ir.compile(total, output_dir=tmp_path / "total", config=sim())
    x = inputs()
    y = np.zeros_like(x)
    with compiled.prepare() as rt:
        rt(x, y)
    np.testing.assert_array_equal(y, np.broadcast_to((x + 1).sum(axis=0), x.shape))
    assert sorted(p.name for p in (compiled.output_dir / "next_levels").iterdir()) == [
        "builtin.tensor.allreduce__sum__fp32", "collect", "stage"]


def test_each_collective_variant_is_named_as_upstream_names_it_at_compile_and_by_the_plan_alike(tmp_path):
    compiled = ir.compile(mixed, output_dir=tmp_path / "mixed", config=sim())
    variants = ["builtin.tensor.allgather__fp32", "builtin.tensor.allreduce_ring__sum__fp32",
                "builtin.tensor.barrier__fp32"]
    folders = ["pick", "stage"]
    assert sorted(p.name for p in (compiled.output_dir / "next_levels").iterdir()) == variants + folders
    x = inputs()
    np.testing.assert_array_equal(compiled(x), np.broadcast_to((x + 1).sum(axis=0), x.shape))
    assert sorted(p.name for p in (compiled.output_dir / "next_levels").iterdir()) == variants + folders
    barrier = config_of(compiled.output_dir / "next_levels" / variants[2] / "kernel_config.py")
    assert barrier["ORCHESTRATION"]["signature"] == [ArgDirection.INOUT]
    gather = config_of(compiled.output_dir / "next_levels" / variants[0] / "kernel_config.py")
    assert gather["ORCHESTRATION"]["signature"] == [ArgDirection.IN, ArgDirection.INOUT, ArgDirection.INOUT]


def test_an_l3_build_loads_back_and_runs(tmp_path):
    compiled = ir.compile(peak, output_dir=tmp_path / "peak", config=sim(4))
    loaded = DistributedCompiledProgram.from_dir(compiled.output_dir)
    assert loaded is not compiled and loaded.device_ids == [0, 1, 2, 3] and loaded.output_dir == compiled.output_dir
    x = inputs(4)
    np.testing.assert_array_equal(loaded(x), np.broadcast_to((x + 1).max(axis=0), x.shape))
    entry = config_of(compiled.output_dir / "orchestration" / "host_orch.py")["entry"]
    np.testing.assert_array_equal(entry(x), np.broadcast_to((x + 1).max(axis=0), x.shape))


# -- L2 builds ---------------------------------------------------------------------------------------

def test_an_l2_build_holds_kernel_config_and_compiled_meta_and_loads_back(tmp_path):
    compiled = ir.compile(Scale, output_dir=tmp_path / "scale", config=RunConfig(backend="sim"))
    out = compiled.output_dir
    meta = json.loads((out / "compiled_meta.json").read_text())
    assert {k: v for k, v in meta.items() if k != "ptodist"} == {
        "schema": 1,
        "params": [{"name": "x", "direction": "In", "shape": [4, 8], "dtype": "fp32"},
                   {"name": "y", "direction": "Out", "shape": [4, 8], "dtype": "fp32"}],
        "num_return_types": 1, "platform": "a2a3sim", "backend_type": "Ascend910B"}
    assert meta["ptodist"]["origin"] == {"form": "program", "module": __name__, "qualname": "Scale", "file": HERE,
                                         "orchestration": None}
    config = config_of(out / "kernel_config.py")
    assert config["ORCHESTRATION"] == {"source": HERE, "function_name": "scale", "line": Scale.scale.line,
                                       "qualname": "Scale.scale", "signature": [ArgDirection.IN, ArgDirection.OUT]}
    assert config["KERNELS"] == [{"func_id": 0, "name": "scale_kernel", "source": HERE,
                                  "line": Scale.scale_kernel.line, "qualname": "Scale.scale_kernel",
                                  "core_type": "aiv", "signature": [ArgDirection.IN, ArgDirection.OUT]}]
    assert not (out / "distributed_meta.json").exists() and not (out / "orchestration").exists()

    loaded = CompiledProgram.from_dir(out)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(loaded(x), 3 * x)


def test_a_kernel_compiled_on_its_own_is_the_chips_one_kernel_and_a_matmul_makes_it_aic(tmp_path):
    compiled = square.compile(config=RunConfig(backend="sim", output_dir=str(tmp_path / "sq")))
    config = config_of(compiled.output_dir / "kernel_config.py")
    assert config["ORCHESTRATION"]["function_name"] == "square"
    assert config["KERNELS"] == [{"func_id": 0, "name": "square", "source": HERE, "line": square.line,
                                  "qualname": "square", "core_type": "aic",
                                  "signature": [ArgDirection.IN, ArgDirection.OUT]}]
    a = np.arange(256, dtype=np.float32).reshape(16, 16) / 256
    c = np.zeros_like(a)
    CompiledProgram.from_dir(compiled.output_dir)(a, c)
    np.testing.assert_allclose(c, a @ a, rtol=1e-5)


def test_several_orchestrations_each_get_a_build_of_their_own(tmp_path):
    compiled = ir.compile(TwoWays, output_dir=tmp_path / "two", config=RunConfig(backend="sim"))
    out = compiled.output_dir
    assert not (out / "compiled_meta.json").exists()
    assert sorted(p.name for p in (out / "next_levels").iterdir()) == ["double", "triple"]
    meta = json.loads((out / "next_levels" / "triple" / "compiled_meta.json").read_text())
    assert meta["ptodist"]["origin"]["orchestration"] == "triple"
    assert config_of(out / "next_levels" / "triple" / "kernel_config.py")["KERNELS"][0]["name"] == "times"
    x = np.ones((2, 8), np.float32)
    np.testing.assert_array_equal(CompiledProgram.from_dir(out / "next_levels" / "triple")(x), 3 * x)
    np.testing.assert_array_equal(CompiledProgram.from_dir(out / "next_levels" / "double")(x), 2 * x)
    with pytest.raises(BuildNotFoundError) as info:
        CompiledProgram.from_dir(out)
    assert str(info.value) == (
        f"CompiledProgram.from_dir({str(out)!r}): {out / 'compiled_meta.json'} not found, so the folder is not a "
        "build ptodist can load. It holds next_levels/: a program with several orchestrations keeps one build per "
        "orchestration there; load next_levels/<name>. Compile the program (ir.compile(...)) to make one.")


def test_a_build_a_script_made_in_another_process_loads_from_the_scripts_file(tmp_path):
    script = tmp_path / "negate.py"
    script.write_text(textwrap.dedent("""
        import sys

        import ptodist.language as pl
        from ptodist import RunConfig


        @pl.jit.incore
        def negate(x: pl.Tensor[[2, 4], pl.FP32], y: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
            pl.store(pl.neg(pl.load(x, [0, 0], [2, 4])), [0, 0], y)


        if __name__ == "__main__":
            print(negate.compile(config=RunConfig(backend="sim", output_dir=sys.argv[1])).output_dir)
    """))
    done = subprocess.run([python_exe(), str(script), str(tmp_path / "build")], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = CompiledProgram.from_dir(done.stdout.strip())
    assert json.loads((tmp_path / "build" / "compiled_meta.json").read_text())["ptodist"]["origin"]["module"] == \
        "__main__"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.zeros_like(x)
    loaded(x, y)
    np.testing.assert_array_equal(y, -x)


def test_from_dir_of_a_folder_without_a_build_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        DistributedCompiledProgram.from_dir(tmp_path)
    assert isinstance(info.value, BuildNotFoundError)
    assert str(info.value) == (
        f"CompiledProgram.from_dir({str(tmp_path)!r}): {tmp_path / 'compiled_meta.json'} not found, so the folder "
        "is not a build ptodist can load. Compile the program (ir.compile(...)) to make one.")


def test_from_dir_refuses_a_build_whose_source_changed(tmp_path, monkeypatch):
    source = textwrap.dedent("""
        import ptodist.language as pl


        @pl.jit.incore
        def halve(x: pl.Tensor[[2, 4], pl.FP32], y: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
            pl.store(pl.mul(pl.load(x, [0, 0], [2, 4]), 0.5), [0, 0], y)
    """)
    module = tmp_path / "build_tree_halve.py"
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "build_tree_halve", raising=False)
    import build_tree_halve

    compiled = build_tree_halve.halve.compile(config=RunConfig(backend="sim", output_dir=str(tmp_path / "b")))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(CompiledProgram.from_dir(compiled.output_dir)(x), 0.5 * x)
    module.write_text(source.replace("0.5), [0, 0], y)", "0.25), [0, 0], y)"))
    with pytest.raises(ValueError) as info:
        CompiledProgram.from_dir(compiled.output_dir)
    assert isinstance(info.value, BuildError)
    assert str(info.value) == (
        f"CompiledProgram.from_dir({str(compiled.output_dir)!r}): the program's source changed since this build was "
        f"made: 'halve' ({module}:6, built from line 6) changed. The build describes the old code; compile the "
        "program again (ir.compile(...)) to refresh it, or restore the source.")


def test_from_dir_refuses_a_program_defined_inside_a_function(tmp_path):
    def factory():
        @pl.jit.incore
        def inner(x: pl.Tensor[[2, 4], pl.FP32], y: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
            pl.store(pl.load(x, [0, 0], [2, 4]), [0, 0], y)
        return inner

    compiled = factory().compile(config=RunConfig(backend="sim", output_dir=str(tmp_path / "b")))
    with pytest.raises(BuildError) as info:
        CompiledProgram.from_dir(compiled.output_dir)
    assert str(info.value) == (
        f"CompiledProgram.from_dir({str(compiled.output_dir)!r}): the build's program "
        "'test_from_dir_refuses_a_program_defined_inside_a_function.<locals>.factory.<locals>.inner' was defined "
        f"inside a function (in {HERE}), so it cannot be imported again. Define the program at module level to "
        "load its builds, or compile it again where it is defined.")


# -- introspection -----------------------------------------------------------------------------------

def test_the_program_lists_its_functions_as_upstream_does():
    compiled = ir.compile(peak, config=sim())
    program = compiled.program
    assert list(program.functions) == ["bump", "collect", "fetch", "peak", "stage"]
    assert compiled.functions.keys() == program.functions.keys()
    host = program.get_function("peak")
    assert (str(host.func_type), str(host.level), str(host.role)) == ("FunctionType.Opaque", "Level.HOST",
                                                                       "Role.Orchestrator")
    assert [p.name_hint for p in host.params] == ["x", "y"]
    assert host.param_directions == [ParamDirection.In, ParamDirection.Out]
    assert str(program.get_function("bump").func_type) == "FunctionType.InCore"
    assert str(program.get_function("stage").func_type) == "FunctionType.Orchestration"
    assert program.get_function("nowhere") is None and compiled.get_function("nowhere") is None
    assert compiled.has_return is False

    scale = ir.compile(Scale, config=RunConfig(backend="sim"))
    assert list(scale.program.functions) == ["scale", "scale_kernel"]
    assert scale.has_return is True and scale.program.get_function("scale").return_types[0].shape == (4, 8)


def test_python_print_shows_the_program_source():
    scale = ir.compile(Scale, config=RunConfig(backend="sim"))
    text = textwrap.dedent(inspect.getsource(Scale.cls))
    assert scale.as_python() == text and ir.python_print(scale) == text and ir.python_print(Scale) == text
    compiled = ir.compile(peak, config=sim())
    parts = [textwrap.dedent(inspect.getsource(f.fn)).rstrip("\n") for f in (bump, collect, fetch, peak, stage)]
    assert ir.python_print(compiled) == "\n\n".join(parts) + "\n"
    assert ir.python_print(stage) == textwrap.dedent(inspect.getsource(stage.fn))


def test_a_second_call_with_the_same_shapes_compiles_nothing(monkeypatch):
    twice._cache.clear()
    twice._programs.clear()
    builds = []
    real = CompiledProgram.build.__func__
    monkeypatch.setattr(CompiledProgram, "build", classmethod(lambda cls, *a, **k: builds.append(a) or
                                                               real(cls, *a, **k)))
    cfg = RunConfig(backend="sim")
    x4, x6 = np.ones((4, 8), np.float32), np.ones((6, 8), np.float32)
    y4, y6 = np.zeros_like(x4), np.zeros_like(x6)
    for _ in range(2):
        twice(x4, y4, config=cfg)
        np.testing.assert_array_equal(y4, 2 * x4)
    assert len(builds) == 1 and len(twice._cache) == 1
    twice(x6, y6, config=cfg)  # N is dynamic: the same specialization
    np.testing.assert_array_equal(y6, 2 * x6)
    assert len(builds) == 1 and len(twice._cache) == 1
    assert twice.compile(x4, y4, config=cfg) is twice.compile(x6, y6, config=cfg)

    copy_any._cache.clear()
    a = copy_any.compile(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), config=cfg)
    assert copy_any.compile(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), config=cfg) is a
    assert len(copy_any._cache) == 1
    copy_any.compile(np.ones((5, 3), np.float32), np.ones((5, 3), np.float32), config=cfg)  # another shape
    copy_any.compile(np.ones((2, 3), np.int32), np.ones((2, 3), np.int32), config=cfg)
    assert len(copy_any._cache) == 3


def test_build_call_config_takes_the_argument_then_the_config_then_the_build(tmp_path):
    compiled = ir.compile(peak, config=sim())
    assert compiled.build_call_config() == CallConfig(aicpu_thread_num=4)
    cfg = sim(aicpu_thread_num=2, enable_dep_gen=True)
    assert compiled.build_call_config(cfg, block_dim=8, dfx_dir=tmp_path) == CallConfig(
        block_dim=8, aicpu_thread_num=2, enable_dep_gen=True, output_prefix=str(tmp_path))
    assert compiled.build_call_config(cfg, aicpu_thread_num=6).aicpu_thread_num == 6


def test_benchmark_stats_are_never_flattened_and_device_tensors_have_an_address():
    assert BenchmarkStats().fallback_flattened is False
    compiled = ir.compile(peak, config=sim())
    with compiled.prepare() as rt:
        a = rt.alloc_tensor([2, 64], pl.FP32)
        b = rt.alloc_tensor([2, 64], pl.FP32)
        assert isinstance(a.data_ptr, int) and a.data_ptr > 0 and abs(b.data_ptr - a.data_ptr) >= a.nbytes
        rt.free_tensor(a)
        with pytest.raises(UsageError) as info:
            print(a.data_ptr)
    assert str(info.value) == ("DeviceTensor [2, 64] FP32.data_ptr: the tensor was freed (or its worker closed); it "
                               "has no memory any more. Allocate a new one with rt.alloc_tensor(shape, dtype).")


def test_the_upstream_module_paths_resolve():
    compat.install()
    from pypto.ir.compiled_program import _COMPILED_META_SCHEMA
    from pypto.ir.compiled_program import CompiledProgram as Upstream
    from pypto.ir.distributed_compiled_program import _META_SCHEMA

    assert Upstream is CompiledProgram and _COMPILED_META_SCHEMA == _META_SCHEMA == 1
    from pypto.runtime.bench import BenchmarkStats as Stats
    from pypto.runtime.device_tensor import DeviceTensor, StackedDeviceTensor

    assert Stats is BenchmarkStats and DeviceTensor is ptodist.DeviceTensor
    assert StackedDeviceTensor is ptodist.StackedDeviceTensor
