"""Single-device (L2) programs: ``@pl.jit`` functions and kernels called directly from Python."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
from conftest import child_env, source_line

import ptodist.language as pl
from ptodist import RunConfig
from ptodist.errors import RankError, UsageError
from ptodist.language import functions


@pl.jit
def tile_add(a: pl.Tensor, b: pl.Tensor, c: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        pl.store(pl.add(pl.load(a, [0, 0], [64, 32]), pl.load(b, [0, 0], [64, 32])), [0, 0], c)
    return c


@pl.jit.incore
def exp_kernel(a: pl.Tensor, c: pl.Out[pl.Tensor]):
    pl.store(pl.exp(pl.load(a, [0, 0], [64, 32])), [0, 0], c)


@pl.jit
def scale(x: pl.Tensor, out: pl.Out[pl.Tensor], factor: pl.Scalar[pl.FP32]):
    with pl.at(level=pl.Level.CORE_GROUP):
        out[:] = pl.mul(x, factor)
    return out


def test_a_jit_function_called_with_a_run_config_runs_on_one_device(torch):
    a, b, c = torch.rand(64, 32), torch.rand(64, 32), torch.zeros(64, 32)
    assert tile_add(a, b, c, config=RunConfig()) is c
    torch.testing.assert_close(c, a + b)


def test_a_jit_function_called_without_config_uses_the_default(torch):
    a, b, c = torch.rand(64, 32), torch.rand(64, 32), torch.zeros(64, 32)
    tile_add(a, b, c)
    torch.testing.assert_close(c, a + b)


def test_a_kernel_called_directly_runs_as_a_one_kernel_program(torch, backend):
    a, c = torch.rand(64, 32), torch.zeros(64, 32)
    exp_kernel(a, c, config=RunConfig(backend=backend))
    torch.testing.assert_close(c, torch.exp(a))


def test_config_inside_a_program_is_refused():
    @pl.jit
    def outer(a: pl.Tensor, c: pl.Out[pl.Tensor]):
        exp_kernel(a, c, config=RunConfig())

    import numpy as np

    with pytest.raises(RankError, match=r"failed in task 'outer': ProgramError: exp_kernel\(..., config=...\) at "
                                        r".*test_single_device.py:\d+: config= is for a call from plain Python"):
        outer(np.zeros((64, 32), np.float32), np.zeros((64, 32), np.float32), config=RunConfig(backend="sim"))


@pl.jit
def probed(x: pl.Tensor, out: pl.Out[pl.Tensor]):
    pl.static_print("x is", list(x.shape))
    pl.static_assert(x.shape[1] == 32, "expected 32 columns")
    with pl.at(level=pl.Level.CORE_GROUP):
        out[:] = pl.mul(x, 2.0)
    return out


def test_static_print_prints_once_per_line_and_static_assert_names_its_line(torch, capfd):
    x, out = torch.ones(4, 32), torch.zeros(4, 32)
    probed(x, out, config=RunConfig(backend="sim"))
    probed(x, out, config=RunConfig(backend="sim"))
    assert capfd.readouterr().out.count("x is [4, 32]") == 1
    torch.testing.assert_close(out, 2 * x)
    with pytest.raises(RankError, match=r"ProgramError: pl.static_assert at .*test_single_device.py:\d+ failed: "
                                        r"expected 32 columns"):
        probed(torch.ones(4, 8), torch.zeros(4, 8), config=RunConfig(backend="sim"))


# -- the compiler the runtime hands the language ---------------------------------------------------------------
def test_the_language_imported_alone_compiles_and_runs(tmp_path):
    # `import ptodist.language` runs the package root, whose runtime hands the language its compiler.
    script = tmp_path / "alone.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import ptodist.language as pl

        @pl.jit
        def double(a: pl.Tensor, c: pl.Out[pl.Tensor]):
            with pl.at(level=pl.Level.CORE_GROUP):
                pl.store(pl.mul(pl.load(a, [0, 0], [4, 8]), 2.0), [0, 0], c)
            return c

        a, c = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)
        double.compile(a, c)(a, c)
        print(float(c.sum()))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env(),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["64.0"]


def test_compiling_before_the_runtime_handed_in_its_compiler_says_what_to_import(monkeypatch):
    @pl.jit
    def copy(a: pl.Tensor, c: pl.Out[pl.Tensor]):
        with pl.at(level=pl.Level.CORE_GROUP):
            pl.store(pl.load(a, [0, 0], [4, 8]), [0, 0], c)
        return c

    monkeypatch.setattr(functions, "_compiler", None)
    with pytest.raises(UsageError) as e:
        copy.compile(config=RunConfig())  # the call's line
    assert isinstance(e.value, RuntimeError)
    line = source_line(test_compiling_before_the_runtime_handed_in_its_compiler_says_what_to_import,
                       "# the call's line")
    assert re.search(rf"'copy' \(.*\): compiled at {re.escape(__file__)}:{line} before ptodist.runtime handed the "
                     r"language its compiler", str(e.value))
    assert "Import ptodist (or ptodist.runtime) first, then compile." in str(e.value)
