"""The runtime surface upstream programs call: workers running inline chip regions, pypto.runtime's names."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir, shared_array
from ptodist.errors import ApiTypeError, ConfigError
from ptodist.runtime import (
    ChipWorker,
    DistributedWorker,
    RunResult,
    ScalarSpec,
    TensorSpec,
    Worker,
    compile_program,
    execute_compiled,
)
from ptodist.runtime.runner import DfxOptions, RunTiming

M = 16


@pl.program
class TwoChipRegions:
    """Chip 0 computes a + b, chip 1 a - b: each chip task is an inline `with pl.at(level=CHIP)` block."""

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host_orch(self, a: pl.Tensor[[M, M], pl.FP32], b: pl.Tensor[[M, M], pl.FP32],
                  sum_buf: pl.Out[pl.Tensor[[M, M], pl.FP32]], sub_buf: pl.Out[pl.Tensor[[M, M], pl.FP32]]):
        with pl.at(level=pl.Level.CHIP, role=pl.Role.Orchestrator):
            with pl.at(level=pl.Level.CORE_GROUP):
                out_sum = pl.assemble(sum_buf, pl.add(a, b), [0, 0])
        with pl.at(level=pl.Level.CHIP, role=pl.Role.Orchestrator):
            with pl.at(level=pl.Level.CORE_GROUP):
                pl.assemble(sub_buf, pl.sub(a, b), [0, 0])
        return out_sum


def test_a_worker_runs_chip_tasks_outlined_from_inline_regions(backend):
    """The outlined blocks are made after the worker's ranks started: they travel to the ranks by value."""
    compiled = ir.compile(TwoChipRegions, platform="a2a3sim",
                          config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=backend))
    rng = np.random.default_rng(3)
    a, b, s, d = (shared_array((M, M)) for _ in range(4))
    a[...] = rng.standard_normal((M, M))
    b[...] = rng.standard_normal((M, M))
    with compiled.prepare() as rt:
        handle = rt.register(compiled)
        for _ in range(2):  # the second call reuses the plan the ranks received
            s[...] = 0
            d[...] = 0
            handle(a, b, s, d)
            np.testing.assert_array_equal(s, a + b)
            np.testing.assert_array_equal(d, a - b)
        rt.run(compiled, b, a, s, d)
        np.testing.assert_array_equal(d, b - a)
    # a one-shot call keeps its ranks for the next call too
    compiled(a, b, s, d)
    compiled(b, a, s, d)
    np.testing.assert_array_equal(d, b - a)



# -- TensorSpec, ScalarSpec ---------------------------------------------------------------------------------------

@pl.program
class AddScalar:
    """An L2 program: y = x + k, with k a scalar argument."""

    @pl.function(type=pl.FunctionType.InCore)
    def add_k(self, x: pl.Tensor[[4, M], pl.FP32], y: pl.Out[pl.Tensor[[4, M], pl.FP32]], k: pl.Scalar[pl.FP32]):
        return pl.store(pl.add(pl.load(x, [0, 0], [4, M]), k), [0, 0], y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def orch(self, x: pl.Tensor[[4, M], pl.FP32], y: pl.Out[pl.Tensor[[4, M], pl.FP32]], k: pl.Scalar[pl.FP32]):
        return self.add_k(x, y, k)


def test_tensor_specs_make_the_arguments_of_a_run(torch):
    torch.manual_seed(0)
    specs = [TensorSpec("x", [4, M], torch.float32, init_value=torch.randn),
             TensorSpec("y", [4, M], torch.float32, init_value=7.0, is_output=True)]
    x, y = (s.create_tensor() for s in specs)
    assert x.dtype == torch.float32 and list(x.shape) == [4, M] and x.std() > 0
    assert (y == 0).all()                              # an output starts as zeros, whatever its init_value
    k = ScalarSpec("k", 1.5, ctype="float")
    ir.compile(AddScalar)(x, y, k.value)
    np.testing.assert_array_equal(y.numpy(), x.numpy() + np.float32(1.5))
    # every init_value form
    assert (TensorSpec("a", [2, 3], torch.int32, init_value=5).create_tensor() == 5).all()
    src = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    b = TensorSpec("b", [2, 3], torch.float16, init_value=src).create_tensor()
    assert b.dtype == torch.float16 and (b == src.half()).all()
    c = TensorSpec("c", [2, 3], torch.float32, init_value=lambda: [[1, 2, 3], [4, 5, 6]]).create_tensor()
    assert c.dtype == torch.float32 and c.sum().item() == 21
    assert (TensorSpec("d", [2, 3], torch.float32, init_value=torch.ones).create_tensor() == 1).all()


def test_tensor_specs_without_torch_make_numpy_arrays():
    a = TensorSpec("a", [2, 3], pl.FP16, init_value=2).create_tensor()
    assert isinstance(a, np.ndarray) and a.dtype == np.float16 and (a == 2).all()
    b = TensorSpec("b", [3], np.int64, init_value=lambda: np.arange(3)).create_tensor()
    assert b.dtype == np.int64 and b.tolist() == [0, 1, 2]
    with pytest.raises(ConfigError) as e:
        TensorSpec("c", [2, 2], np.float32, init_value=np.zeros(3)).create_tensor()
    assert str(e.value) == ("TensorSpec('c'): init_value has shape [3], the spec's shape is [2, 2]; give values of "
                            "the spec's shape")
    with pytest.raises(ApiTypeError) as e:
        TensorSpec("d", [2], np.float32, init_value=object()).create_tensor()
    assert str(e.value) == ("TensorSpec('d'): unsupported init_value type object; give None, a number, a tensor or "
                            "array, or a callable returning one")


def test_scalar_spec_names_the_ctypes_it_accepts():
    assert ScalarSpec("n", 3).ctype == "int64"
    with pytest.raises(ValueError) as e:
        ScalarSpec("n", 3, ctype="int16")
    assert str(e.value) == ("Unsupported ctype 'int16' for scalar 'n'. Supported: ['int64', 'int32', 'uint64', "
                            "'uint32', 'float', 'double']")


def test_run_result_reads_as_pass_or_fail():
    assert str(RunResult(True)) == "PASS"
    assert str(RunResult(True, test_name="add", execution_time=1.234)) == "PASS: add (1.23s)"
    assert str(RunResult(False, error="mismatch")) == "FAIL: mismatch"
    assert str(RunResult(False, test_name="add", error="mismatch")) == "FAIL: add - mismatch"


# -- compile_program, execute_compiled ----------------------------------------------------------------------------

def test_compile_program_then_execute_compiled(tmp_path):
    work = tmp_path / "work dir"
    assert compile_program(AddScalar, work) is None
    assert work.is_dir()
    x = np.random.default_rng(5).standard_normal((4, M)).astype(np.float32)
    y = np.zeros_like(x)
    timing = execute_compiled(work, [x, y, ctypes.c_float(-2.5)], platform="a2a3sim", device_id=0)
    np.testing.assert_array_equal(y, x - np.float32(2.5))
    assert isinstance(timing, RunTiming) and timing.host_wall_us > 0 and timing.device_wall_us == 0
    # a second run of the same build, with diagnostic outputs under the work dir
    execute_compiled(str(work), [y, x, 1.0], platform="a2a3sim", device_id=0,
                     dfx=DfxOptions(enable_dep_gen=True, enable_scope_stats=True))
    np.testing.assert_array_equal(x, y + np.float32(1.0))
    assert (work / "dfx_outputs" / "rank0" / "d1" / "deps.json").is_file()
    with pytest.raises(ApiTypeError, match="args must be a list of the program's arguments"):
        execute_compiled(work, x)


def test_execute_compiled_on_a_folder_without_a_build(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        execute_compiled(tmp_path / "empty", [], platform="a2a3sim", device_id=0)
    assert str(tmp_path / "empty") in str(e.value)


# -- Worker --------------------------------------------------------------------------------------------------------

NR = pl.dynamic("NR")


@pl.jit.incore
def double(x: pl.Tensor[[1, M], pl.FP32], y: pl.Out[pl.Tensor[[1, M], pl.FP32]]):
    return pl.store(pl.mul(pl.load(x, [0, 0], [1, M]), 2.0), [0, 0], y)


@pl.jit
def double_rank(x: pl.Tensor[[1, M], pl.FP32], y: pl.Out[pl.Tensor[[1, M], pl.FP32]]):
    return double(x, y)


@pl.jit.host
def double_all(x: pl.Tensor[[NR, 1, M], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, M], pl.FP32]]):
    for r in pl.range(pld.world_size()):
        double_rank(x[r], y[r], device=r)


def run_on(worker: Worker, compiled, *args):
    """Level-agnostic code: any Worker runs a compiled program."""
    return worker.run(compiled, *args)


def test_chip_and_distributed_workers_are_workers(backend):
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=backend)
    x, y = shared_array((2, 1, M)), shared_array((2, 1, M))
    x[...] = np.arange(2 * M, dtype=np.float32).reshape(2, 1, M)
    compiled = double_all.compile(x, y, config=cfg)
    with compiled.prepare() as rt:
        assert isinstance(rt, DistributedWorker) and isinstance(rt, Worker)
        run_on(rt, compiled, x, y)
    np.testing.assert_array_equal(y, 2 * x)
    single = ir.compile(AddScalar)
    a = np.ones((4, M), np.float32)
    b = np.zeros_like(a)
    with ChipWorker(RunConfig(backend=backend)) as chip:
        assert isinstance(chip, Worker)
        run_on(chip, single, a, b, 3.0)
    np.testing.assert_array_equal(b, a + 3)
    with pytest.raises(TypeError, match="abstract"):
        Worker()



# -- sub-workers written without `self`; upstream's wording of the worker's refusals ----------------------------

@pl.program
class AddThenVerify:
    """host: chip a + b into f, then the sub-worker `verify(f)`, a program function written without `self`."""

    @pl.function(type=pl.FunctionType.InCore)
    def tile_add(self, a: pl.Tensor[[4, M], pl.FP32], b: pl.Tensor[[4, M], pl.FP32],
                 f: pl.Out[pl.Tensor[[4, M], pl.FP32]]):
        return pl.store(pl.add(pl.load(a, [0, 0], [4, M]), pl.load(b, [0, 0], [4, M])), [0, 0], f)

    @pl.function(type=pl.FunctionType.Orchestration)
    def chip_orch(self, a: pl.Tensor[[4, M], pl.FP32], b: pl.Tensor[[4, M], pl.FP32],
                  f: pl.Out[pl.Tensor[[4, M], pl.FP32]]):
        return self.tile_add(a, b, f)

    @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
    def verify(f: pl.Tensor[[4, M], pl.FP32]):
        SEEN.append(np.asarray(f).copy())

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host_orch(self, a: pl.Tensor[[4, M], pl.FP32], b: pl.Tensor[[4, M], pl.FP32],
                  f: pl.Out[pl.Tensor[[4, M], pl.FP32]]):
        out_f = self.chip_orch(a, b, f)
        self.verify(out_f)
        return out_f


SEEN: list = []


def test_a_sub_worker_without_self_is_called_with_its_own_arguments(backend, torch):
    from ptodist.runtime.distributed_runner import _tensor_from_continuous

    compiled = ir.compile(AddThenVerify, platform="a2a3sim",
                          config=RunConfig(distributed_config=DistributedConfig(device_ids=[0]), backend=backend))
    a, b = torch.full((4, M), 2.0), torch.arange(4 * M, dtype=torch.float32).reshape(4, M)
    f = torch.zeros(4, M)
    SEEN.clear()
    compiled(a, b, f)                                  # the sub-worker's body runs in the driver
    np.testing.assert_array_equal(f.numpy(), (a + b).numpy())
    np.testing.assert_array_equal(SEEN[0], (a + b).numpy())
    seen = []
    f.zero_()
    with compiled.prepare(callbacks={"verify": lambda args: seen.append(_tensor_from_continuous(args.tensor(0)) * 1)}) \
            as rt:
        rt(a.share_memory_(), b.share_memory_(), f.share_memory_())
    assert torch.equal(seen[0], a + b) and torch.equal(f, a + b)


@pl.program
class HostWorkerRole:
    """A host function with role=pl.Role.Worker is a sub-worker too (PyPTO's earlier spelling)."""

    @pl.function(type=pl.FunctionType.InCore)
    def tile_add(self, a: pl.Tensor[[4, M], pl.FP32], b: pl.Tensor[[4, M], pl.FP32],
                 f: pl.Out[pl.Tensor[[4, M], pl.FP32]]):
        return pl.store(pl.add(pl.load(a, [0, 0], [4, M]), pl.load(b, [0, 0], [4, M])), [0, 0], f)

    @pl.function(type=pl.FunctionType.Orchestration)
    def chip_orch(self, a: pl.Tensor[[4, M], pl.FP32], b: pl.Tensor[[4, M], pl.FP32],
                  f: pl.Out[pl.Tensor[[4, M], pl.FP32]]):
        return self.tile_add(a, b, f)

    @pl.function(level=pl.Level.HOST, role=pl.Role.Worker)
    def verify(self, f: pl.Tensor[[4, M], pl.FP32]):
        SEEN.append(np.asarray(f).copy())

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host_orch(self, a: pl.Tensor[[4, M], pl.FP32], b: pl.Tensor[[4, M], pl.FP32],
                  f: pl.Out[pl.Tensor[[4, M], pl.FP32]]):
        out_f = self.chip_orch(a, b, f)
        self.verify(out_f)
        return out_f


def test_a_host_function_with_the_worker_role_is_a_sub_worker(backend):
    compiled = ir.compile(HostWorkerRole, platform="a2a3sim",
                          config=RunConfig(distributed_config=DistributedConfig(device_ids=[7]), backend=backend))
    a, b = np.full((4, M), 2.0, np.float32), np.full((4, M), 3.0, np.float32)
    f = np.zeros_like(a)
    SEEN.clear()
    compiled(a, b, f)
    np.testing.assert_array_equal(f, a + b)
    np.testing.assert_array_equal(SEEN[0], a + b)


def test_the_worker_refuses_with_upstreams_words(backend):
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0]), backend=backend)
    compiled = ir.compile(AddThenVerify, platform="a2a3sim", config=cfg)
    with pytest.raises(ValueError, match=r"not sub-workers.*Available sub-workers") as e:
        compiled.prepare(callbacks={"nonexistent": lambda args: None})
    assert str(e.value) == ("prepare(callbacks=...): ['nonexistent'] are not sub-workers of the worker's programs "
                            "('AddThenVerify'): no @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker) has "
                            "that name. Available sub-workers: ['verify']. Name one of those, or drop the entry.")
    with pytest.raises(ValueError, match="positive finite"):
        compiled.prepare(startup_timeout_s=float("nan"))
    other = ir.compile(TwoChipRegions, platform="a2a3sim", config=cfg)
    rt = compiled.prepare()
    with pytest.raises(ValueError, match="registered when this worker"):
        rt.register(other)
    with pytest.raises(ValueError, match="registered when this worker"):
        rt.run(other, *(np.zeros((M, M), np.float32) for _ in range(4)))
    rt.close()
    with pytest.raises(RuntimeError, match="called after close") as e:
        rt.register(compiled)
    assert str(e.value) == ("DistributedWorker.register(): called after close(): the worker is closed. Prepare a new "
                            "one with compiled.prepare().")



def test_pointer_copies_between_host_and_resident_tensors(backend, torch):
    """PyPTO's copy_to(dst_dev_ptr, src_host_ptr, nbytes) / copy_from(dst_host_ptr, src_dev_ptr, nbytes)."""
    host_in = torch.arange(256, dtype=torch.float32).view(16, 16)
    host_out = torch.zeros_like(host_in)
    with ChipWorker(RunConfig(backend=backend)) as w:
        t = w.alloc_tensor((16, 16), torch.float32, init=host_in)
        w.copy_from(host_out.data_ptr(), t.data_ptr, t.nbytes)
        assert torch.equal(host_out, host_in)
        row = torch.full((16,), -1.0)
        w.copy_to(t.data_ptr + 3 * 16 * 4, row.data_ptr(), 16 * 4)     # row 3 only
        back = torch.zeros_like(host_in)
        w.copy_from(back, t)
        expected = host_in.clone()
        expected[3] = -1.0
        assert torch.equal(back, expected)
        x = torch.ones(4, M)
        y = torch.zeros(4, M)
        k = w.alloc_tensor((4, M), torch.float32)
        w.copy_to(k.data_ptr, x.data_ptr(), k.nbytes)
        w.run(ir.compile(AddScalar), k, y, 2.0)                          # the program reads what was copied
        assert torch.equal(y, x + 2)
        with pytest.raises(ValueError, match="no resident tensor of this worker holds the 1028 bytes"):
            w.copy_from(host_out.data_ptr(), t.data_ptr, t.nbytes + 4)



def test_run_config_takes_pyptos_current_dfx_names():
    c = RunConfig(enable_l2_swimlane=True, enable_dump_tensor=2, enable_pmu=4)
    assert (c.enable_chip_swimlane, c.enable_dump_args, c.enable_pmu, c.any_dfx_enabled()) == (True, 2, 4, True)
    c.enable_l2_swimlane = False
    c.enable_dump_tensor = 0
    assert (c.enable_chip_swimlane, c.enable_dump_args) == (False, 0)
    assert not RunConfig().any_dfx_enabled()
    with pytest.raises(ConfigError) as e:
        RunConfig(enable_l2_swimlane=True, enable_chip_swimlane=False)
    assert str(e.value) == ("RunConfig(enable_l2_swimlane=True, enable_chip_swimlane=False): both name one setting "
                            "(enable_l2_swimlane is PyPTO's name of enable_chip_swimlane); give one of them")



def test_configure_log_sets_the_threshold_of_ptodists_notices(monkeypatch, capfd):
    from ptodist import config
    from ptodist.runtime import configure_log, log_level

    monkeypatch.setattr(config, "_log_threshold", [])
    monkeypatch.delenv("PYPTO_RUNTIME_LOG", raising=False)
    assert log_level() == 20                           # info: every notice, as before any configure_log
    x, y = np.ones((4, M), np.float32), np.zeros((4, M), np.float32)
    cfg = RunConfig(backend="sim")
    configure_log("ERROR")
    assert log_level() == 40
    monkeypatch.setattr(config, "_announced", set())
    ir.compile(AddScalar, config=cfg)(x, y, 1.0)
    assert "ptodist: platform" not in capfd.readouterr().err
    np.testing.assert_array_equal(y, x + 1)
    configure_log("info")
    monkeypatch.setattr(config, "_announced", set())
    ir.compile(AddScalar, config=cfg)(x, y, 2.0)
    assert "ptodist: platform 'a2a3sim' runs on the local 'sim' backend (no NPU needed)" in capfd.readouterr().err
    monkeypatch.setattr(config, "_log_threshold", [])
    monkeypatch.setenv("PYPTO_RUNTIME_LOG", "warn")
    assert log_level() == 30
    with pytest.raises(ConfigError) as e:
        configure_log("loud")
    assert str(e.value) == ("configure_log('loud'): 'loud' is not a log level; give one of debug, info, timing, warn, "
                            "warning, error, null or a logging level number (10 debug ... 40 error)")


if __name__ == "__main__":
    pytest.main([__file__, "-v"])
