"""PyPTO's single-device compile/run names: ``pypto.backend``, ``pypto.ir.pass_manager``, ``ir.compile``
keywords, ``pypto.runtime.run``, ``ChipWorker`` and ``benchmark``, on real programs with torch tensors."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ptodist.language as pl
from ptodist import RunConfig, backend, ir
from ptodist.backend import BackendType
from ptodist.config import DistributedConfig
from ptodist.errors import ApiTypeError, ConfigError, DispatchTypeError, DispatchValueError, UsageError
from ptodist.ir.pass_manager import OptimizationStrategy, PassManager
from ptodist.runtime import ChipWorker, benchmark, run
from ptodist.runtime.program import IGNORED_COMPILE_OPTIONS, CompiledProgram

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[torch]')")

ROWS, COLS = 16, 32


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


# -- programs --------------------------------------------------------------------------------------------

@pl.jit
def add_kernel(a: pl.Tensor, b: pl.Tensor, out: pl.Out[pl.Tensor]):
    with pl.at(level=pl.Level.CORE_GROUP):
        ta = pl.load(a, [0, 0], [ROWS, COLS])
        tb = pl.load(b, [0, 0], [ROWS, COLS])
        pl.store(pl.add(ta, tb), [0, 0], out)
    return out


@pl.program
class Scale:
    @pl.function(type=pl.FunctionType.InCore)
    def scale_kernel(self, x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [ROWS, COLS]), 3.0), [0, 0], y)
        return y

    @pl.function(type=pl.FunctionType.Orchestration)
    def scale(self, x: pl.Tensor[[ROWS, COLS], pl.FP32],
              y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]) -> pl.Tensor[[ROWS, COLS], pl.FP32]:
        return self.scale_kernel(x, y)


@pl.program
class TwoOrch:
    @pl.function(type=pl.FunctionType.InCore)
    def neg_kernel(self, x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [ROWS, COLS]), -1.0), [0, 0], y)
        return y

    @pl.function(type=pl.FunctionType.Orchestration)
    def neg(self, x: pl.Tensor[[ROWS, COLS], pl.FP32],
            y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]) -> pl.Tensor[[ROWS, COLS], pl.FP32]:
        return self.neg_kernel(x, y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def also_neg(self, x: pl.Tensor[[ROWS, COLS], pl.FP32],
                 y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]) -> pl.Tensor[[ROWS, COLS], pl.FP32]:
        return self.neg_kernel(x, y)


def rand(*shape):
    return torch.randn(*shape) if shape else torch.randn(ROWS, COLS)


def zeros():
    return torch.zeros(ROWS, COLS)


def lowered(fn, *args, config=None) -> CompiledProgram:
    """``fn.lower(*args)``: the one-device program compiled for those shapes, its dispatch planned."""
    return fn.lower(*args, config=config)


# -- pypto.backend ---------------------------------------------------------------------------------------

@pytest.fixture
def fresh_backend():
    backend.reset_for_testing()
    yield
    backend.reset_for_testing()


def test_backend_types_are_pyptos():
    assert [(b.name, b.value) for b in BackendType] == [("Ascend910B", 0), ("Ascend950", 1)]


def test_set_backend_type_records_the_choice(fresh_backend):
    assert not backend.is_backend_configured()
    backend.set_backend_type(BackendType.Ascend950)
    backend.set_backend_type(BackendType.Ascend950)  # the same again: allowed
    assert backend.is_backend_configured()
    assert backend.get_backend_type() is BackendType.Ascend950
    backend.reset_for_testing()
    assert not backend.is_backend_configured()
    backend.set_backend_type(BackendType.Ascend910B)
    assert backend.get_backend_type() is BackendType.Ascend910B


def test_the_backend_type_cannot_change_without_a_reset(fresh_backend):
    backend.set_backend_type(BackendType.Ascend910B)
    with pytest.raises(ConfigError, match=exactly(
            "set_backend_type(BackendType.Ascend950): the backend type is already BackendType.Ascend910B in this "
            "process and cannot change; call reset_for_testing() first (tests only)")) as e:
        backend.set_backend_type(BackendType.Ascend950)
    assert isinstance(e.value, ValueError)  # as PyPTO raises


def test_backend_errors(fresh_backend):
    with pytest.raises(ConfigError, match=exactly(
            "get_backend_type(): no backend type is configured; call set_backend_type(BackendType.Ascend910B) "
            "(or Ascend950) first")):
        backend.get_backend_type()
    with pytest.raises(ApiTypeError, match=exactly(
            "set_backend_type(): expected a BackendType (BackendType.Ascend910B or BackendType.Ascend950), got "
            "'Ascend910B'")):
        backend.set_backend_type("Ascend910B")


@pytest.mark.parametrize("platform, expected", [("a2a3sim", BackendType.Ascend910B), ("a2a3", BackendType.Ascend910B),
                                                ("a5sim", BackendType.Ascend950), ("a5", BackendType.Ascend950)])
def test_backend_type_for_platform(platform, expected):
    assert backend.backend_type_for_platform(platform) is expected


def test_upstream_import_spellings_resolve(fresh_backend):
    from ptodist import compat

    compat.install()
    from pypto import backend as upstream_backend
    from pypto.backend import BackendType as UpstreamType
    from pypto.ir.pass_manager import OptimizationStrategy as UpstreamStrategy
    from pypto.runtime import ChipWorker as UpstreamWorker
    from pypto.runtime import run as upstream_run

    assert upstream_backend is backend and UpstreamType is BackendType and UpstreamStrategy is OptimizationStrategy
    assert UpstreamWorker is ChipWorker and upstream_run is run


# -- pypto.ir.pass_manager -------------------------------------------------------------------------------

def test_optimization_strategies_are_pyptos():
    assert [s.value for s in OptimizationStrategy] == ["Default", "DebugTileOptimization"]
    assert ir.OptimizationStrategy is OptimizationStrategy and ir.PassManager is PassManager


@pytest.mark.parametrize("strategy", list(OptimizationStrategy))
def test_pass_manager_lists_ptodists_stages(strategy):
    pm = PassManager.get_strategy(strategy, analyze_auto_scopes_for_deps=True)
    assert pm.strategy is strategy and pm.analyze_auto_scopes_for_deps
    assert pm.pass_names == ["CheckProgramSignatures", "BindArguments", "PlanDispatch", "WriteDispatchPlan",
                             "RunRanks"]
    assert pm.describe().splitlines()[0] == ("CheckProgramSignatures: parameter annotations and the calls between "
                                             "functions are checked (compile)")


def test_pass_manager_errors():
    with pytest.raises(UsageError, match=exactly(
            "PassManager.run_passes(): ptodist has no IR to transform: a program's functions run as written, so "
            "there is no lowered program to return or dump. Compile and run it with ir.compile(program) "
            "(PassManager.pass_names lists what that does).")):
        PassManager.get_strategy().run_passes(Scale)
    with pytest.raises(ApiTypeError, match=exactly(
            "PassManager: strategy must be an OptimizationStrategy (OptimizationStrategy.Default, "
            "OptimizationStrategy.DebugTileOptimization), got 'Default'")):
        PassManager.get_strategy("Default")


# -- ir.compile ------------------------------------------------------------------------------------------

def check_scale(compiled, **call):
    x, y = rand(), zeros()
    compiled(x, y, **call)
    torch.testing.assert_close(y, x * 3)


def test_ir_compile_defaults():
    compiled = ir.compile(Scale)
    assert compiled.config.platform == "a2a3sim" and compiled.config.backend_type is BackendType.Ascend910B
    check_scale(compiled)


@pytest.mark.parametrize("option", IGNORED_COMPILE_OPTIONS)
def test_ir_compile_accepts_and_ignores_pyptos_codegen_keywords(option, tmp_path):
    compiled = ir.compile(Scale, **{option: True}, output_dir=tmp_path / "out")
    check_scale(compiled, config=RunConfig(backend="sim"))
    assert (tmp_path / "out" / "dispatch_plan.json").is_file()


def test_ir_compile_records_what_runconfig_has_a_field_for():
    compiled = ir.compile(Scale, strategy=OptimizationStrategy.DebugTileOptimization, dump_passes=True,
                          block_dim=8, analyze_auto_scopes_for_deps=True, backend_type=BackendType.Ascend950)
    cfg = compiled.config
    assert (cfg.strategy, cfg.dump_passes, cfg.block_dim, cfg.analyze_auto_scopes_for_deps) == \
        (OptimizationStrategy.DebugTileOptimization, True, 8, True)
    # no platform: the simulator of the backend type
    assert (cfg.platform, cfg.backend_type) == ("a5sim", BackendType.Ascend950)
    check_scale(compiled)


def test_ir_compile_platform_decides_the_backend_type():
    compiled = ir.compile(Scale, platform="a2a3", backend_type=BackendType.Ascend950)
    assert (compiled.config.platform, compiled.config.backend_type) == ("a2a3", BackendType.Ascend910B)


def test_ir_compile_keywords_override_the_config():
    compiled = ir.compile(Scale, config=RunConfig(backend="sim", platform="a2a3"), platform="a5sim")
    assert (compiled.config.backend, compiled.config.platform, compiled.config.backend_type) == \
        ("sim", "a5sim", BackendType.Ascend950)
    check_scale(compiled)


def test_ir_compile_refuses_an_unknown_keyword():
    with pytest.raises(ApiTypeError, match=exactly(
            "compile() got an unexpected keyword argument 'optimise'; it accepts output_dir, strategy, dump_passes, "
            "backend_type, platform, distributed_config, block_dim, analyze_auto_scopes_for_deps, config, "
            "skip_ptoas, verification_level, memory_planner, diagnostic_phase, disabled_diagnostics, profiling, "
            "enable_pypto_l0c_double_buffer, emit_source_loc, dump_ptoas_passes, runtime (ptodist ignores "
            "skip_ptoas, verification_level, memory_planner, diagnostic_phase, disabled_diagnostics, profiling, "
            "enable_pypto_l0c_double_buffer, emit_source_loc, dump_ptoas_passes, runtime)")) as e:
        ir.compile(Scale, optimise=True)
    assert isinstance(e.value, TypeError)


def test_ir_compile_options_are_keywords_only():
    with pytest.raises(TypeError, match=r"compile\(\) takes 1 positional argument but 2 were given"):
        ir.compile(Scale, "a2a3sim")


@pytest.mark.parametrize("kw, message", [
    ({"strategy": "Default"}, "compile(strategy='Default'): expects an OptimizationStrategy "
                              "(OptimizationStrategy.Default, OptimizationStrategy.DebugTileOptimization)"),
    ({"backend_type": "Ascend910B"}, "compile(backend_type='Ascend910B'): expects a BackendType "
                                     "(BackendType.Ascend910B, BackendType.Ascend950)"),
    ({"config": {"platform": "a5"}}, "compile(config=...): expects a RunConfig, got dict"),
])
def test_ir_compile_option_types(kw, message):
    with pytest.raises(ApiTypeError, match=exactly(message)):
        ir.compile(Scale, **kw)


def test_ir_compile_of_a_compiled_program_returns_it_when_nothing_changes():
    compiled = ir.compile(Scale)
    assert ir.compile(compiled) is compiled
    assert ir.compile(compiled, platform="a2a3sim") is compiled
    again = ir.compile(compiled, platform="a5sim")
    assert again is not compiled and again.config.platform == "a5sim" and compiled.config.platform == "a2a3sim"
    check_scale(again)


def test_ir_compile_of_a_lowered_jit_function():
    a, b = rand(), rand()
    compiled = ir.compile(lowered(add_kernel, a, b, zeros()), platform="a2a3sim")
    out = zeros()
    compiled(a, b, out)
    torch.testing.assert_close(out, a + b)


def test_ir_compile_again_keeps_the_orchestrations():
    again = ir.compile(ir.compile(TwoOrch), platform="a5")
    assert again.orchestration_names == ["also_neg", "neg"]
    x, y = rand(), zeros()
    again["neg"](x, y)
    torch.testing.assert_close(y, -x)


def test_ir_compile_distributed_config_picks_the_device():
    compiled = ir.compile(Scale, distributed_config=DistributedConfig(device_ids=[2]))
    assert compiled.device_ids == [2]
    check_scale(compiled)


# -- pypto.runtime.run -----------------------------------------------------------------------------------

def test_run_compiles_and_runs_once(backend):
    x, y = rand(), zeros()
    compiled = run(Scale, x, y, config=RunConfig(backend=backend))
    assert isinstance(compiled, CompiledProgram) and compiled.config.backend == backend
    torch.testing.assert_close(y, x * 3)
    x2, y2 = rand(), zeros()
    compiled(x2, y2)
    torch.testing.assert_close(y2, x2 * 3)


def test_run_without_tensors_only_compiles(tmp_path):
    compiled = run(Scale, config=RunConfig(save_kernels_dir=str(tmp_path / "kept")))
    assert compiled.output_dir == tmp_path / "kept"
    check_scale(compiled)


def test_run_with_codegen_only_does_not_run():
    x, y = rand(), zeros()
    run(Scale, x, y, config=RunConfig(codegen_only=True))
    assert not y.any()


def test_run_takes_a_lowered_program():
    a, b, out = rand(), rand(), zeros()
    run(lowered(add_kernel, a, b, zeros()), a, b, out)
    torch.testing.assert_close(out, a + b)


# -- ChipWorker ------------------------------------------------------------------------------------------

def test_chip_worker_keeps_a_weight_resident(backend):
    a, b = rand(), rand()
    compiled = ir.compile(lowered(add_kernel, a, b, zeros()), platform="a2a3sim")
    with ChipWorker(config=RunConfig(backend=backend)) as w:
        resident = w.alloc_tensor((ROWS, COLS), torch.float32, init=b)
        for _ in range(3):
            x, out = rand(), zeros()
            assert w.run(compiled, x, resident, out) is out
            torch.testing.assert_close(out, x + b)
        back = zeros()
        w.copy_from(back, resident)
        torch.testing.assert_close(back, b)
        w.copy_to(resident, a)
        out = zeros()
        w.run(compiled, a, resident, out)
        torch.testing.assert_close(out, a + a)
        w.free_tensor(resident)
        w.free_tensor(resident)  # twice: nothing
        assert resident.freed


def test_compiled_called_inside_a_chip_worker_block_runs_on_it(backend):
    a, b = rand(), rand()
    compiled = ir.compile(lowered(add_kernel, a, b, zeros()), platform="a2a3sim")
    with ChipWorker(config=RunConfig(backend=backend)) as w:
        resident = w.alloc_tensor((ROWS, COLS), torch.float32, init=b)
        out = zeros()
        compiled(a, resident, out)  # a DeviceTensor: only the worker's dispatch takes it
        torch.testing.assert_close(out, a + b)


def test_lower_plans_without_running_and_prints_the_plan():
    a, b, out = rand(), rand(), zeros()
    low = add_kernel.lower(a, b, out)
    text = str(low)
    assert text.startswith("# ptodist program 'add_kernel' for devices [0]: 1 dispatch plan(s)\n")
    assert '"function": "add_kernel"' in text
    assert (out == 0).all()  # nothing ran
    low(a, b, out)
    torch.testing.assert_close(out, a + b)


def test_chip_worker_registration_handle(backend):
    a, b = rand(), rand()
    compiled = ir.compile(Scale)
    worker = ChipWorker(config=RunConfig(backend=backend))
    try:
        handle = worker.register(compiled)
        assert worker.register(compiled).cid == handle.cid == 0
        for _ in range(3):
            out = zeros()
            handle(a, out)
            torch.testing.assert_close(out, a * 3)
        created = handle(b)  # the inputs-only form: the output is created and returned
        torch.testing.assert_close(created, b * 3)
    finally:
        worker.close()
    assert handle.closed
    with pytest.raises(UsageError, match=exactly(
            "RegistrationHandle of 'Scale': its ChipWorker was closed (close(), or leaving its with block), so it "
            "can dispatch nothing more. Register the program on an open ChipWorker: worker.register(compiled).")):
        handle(a, zeros())


def test_an_unregistered_handle_is_refused():
    with ChipWorker(config=RunConfig(backend="sim")) as w:
        with w.register(ir.compile(Scale)) as handle:
            pass
        with pytest.raises(UsageError, match=exactly(
                "RegistrationHandle of 'Scale' was unregistered (unregister(), or leaving its with block), so it "
                "can dispatch nothing more. Get a fresh handle with worker.register(compiled), or dispatch with "
                "worker.run(compiled, *args).")):
            handle(rand(), zeros())


def test_chip_worker_runs_new_programs_and_keeps_resident_tensors(backend):
    a, b = rand(), rand()
    add = ir.compile(lowered(add_kernel, a, b, zeros()))
    with ChipWorker(config=RunConfig(backend=backend)) as w:
        y = w.run(ir.compile(Scale), a)
        torch.testing.assert_close(y, a * 3)
        resident = w.alloc_tensor([ROWS, COLS], np.float32, init=b.numpy())
        out = zeros()
        w.run(add, a, resident, out)  # a program new to the worker: its ranks start again, the tensor stays
        torch.testing.assert_close(out, a + b)
        y = w.run(ir.compile(TwoOrch)["neg"], a)
        torch.testing.assert_close(y, -a)
        host = np.zeros((ROWS, COLS), np.float32)
        w.copy_from(host, resident)
        np.testing.assert_array_equal(host, b.numpy())


def test_chip_worker_takes_numpy_arrays(backend):
    x, y = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS), np.zeros((ROWS, COLS), np.float32)
    with ChipWorker(config=RunConfig(backend=backend)) as w:
        w.run(ir.compile(Scale), x, y)
    np.testing.assert_array_equal(y, x * 3)


def test_chip_worker_runs_on_its_device():
    with ChipWorker(config=RunConfig(device_id=3, backend="sim")) as w:
        assert (w.device_id, w.platform, w.level, w.runtime) == (3, "a2a3sim", 2, "tensormap_and_ringbuffer")
        assert ChipWorker.current(platform="a2a3sim", device_id=3) is w
        assert ChipWorker.current(platform="a2a3sim", device_id=0) is None
        x = rand()
        torch.testing.assert_close(w.run(ir.compile(Scale), x), x * 3)  # compiled for device 0, run on 3
    assert ChipWorker.current(platform="a2a3sim", device_id=3) is None


def test_chip_worker_reopens_after_close():
    w = ChipWorker(config=RunConfig(backend="sim"), auto_init=False)
    assert w.closed and not w.initialized
    with pytest.raises(UsageError, match=exactly(
            "ChipWorker.run(): called after close() (or before init()): the worker is closed; call init() or use it "
            "in a with block "
            "(with ChipWorker(config) as w: ...)")):
        w.run(ir.compile(Scale), rand())
    w.init()
    check_scale_on(w)
    w.close()
    w.close()  # twice: nothing
    w.init()
    check_scale_on(w)
    w.close()


def check_scale_on(w):
    x = rand()
    torch.testing.assert_close(w.run(ir.compile(Scale), x), x * 3)


def test_a_device_tensor_of_a_closed_worker_is_refused():
    with ChipWorker(config=RunConfig(backend="sim")) as old:
        stale = old.alloc_tensor((ROWS, COLS), torch.float32)
    with ChipWorker(config=RunConfig(backend="sim")) as w:
        with pytest.raises(DispatchTypeError, match=exactly(
                "ChipWorker.run(): parameter 'x' of 'Scale' is DeviceTensor [16, 32] FP32 of a closed worker "
                "(closing a worker frees its resident tensors). Allocate it on this worker with "
                "alloc_tensor(shape, dtype, init=host_tensor).")):
            w.run(ir.compile(Scale), stale, zeros())


def test_a_device_tensor_of_another_worker_is_refused():
    with ChipWorker(config=RunConfig(backend="sim")) as other, \
            ChipWorker(config=RunConfig(backend="sim", device_id=1)) as w:
        theirs = other.alloc_tensor((ROWS, COLS), torch.float32)
        with pytest.raises(DispatchTypeError, match=exactly(
                "ChipWorker.run(): parameter 'x' of 'Scale' is DeviceTensor [16, 32] FP32 of another worker (a "
                "resident tensor lives on the worker that allocated it). Allocate it on this worker with "
                "alloc_tensor(shape, dtype, init=host_tensor).")):
            w.run(ir.compile(Scale), theirs, zeros())


@pytest.mark.parametrize("make, call, error, message", [
    (lambda: ChipWorker(level=3), None, ConfigError,
     "ChipWorker(level=3): a ChipWorker runs one chip (level=2); run programs on several devices with a "
     "DistributedWorker (compiled.prepare())"),
    (lambda: ChipWorker(RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]))), None, ConfigError,
     "ChipWorker(config=...): distributed_config lists devices [0, 1], but a ChipWorker runs one device; pick it "
     "with RunConfig(device_id=...), or run on several with compiled.prepare()"),
    (lambda: ChipWorker({"platform": "a2a3"}), None, ApiTypeError,
     "ChipWorker(config=...): expects a RunConfig, got dict"),
    (None, lambda w: w.run(ir.compile(Scale, platform="a5sim"), rand()), ConfigError,
     "ChipWorker.run(): program 'Scale' is compiled for platform 'a5sim' but the worker runs 'a2a3sim'; compile "
     "for the worker's platform, or make a ChipWorker(config=RunConfig(platform='a5sim'))"),
    (None, lambda w: w.register(ir.compile(Scale, distributed_config=DistributedConfig(device_ids=[0, 1]))),
     ConfigError, "ChipWorker.register(): program 'Scale' is compiled for 2 devices [0, 1]; a ChipWorker runs one. "
                  "Run it on a DistributedWorker: compiled.prepare()"),
    (None, lambda w: w.run(Scale, rand()), DispatchTypeError,
     "ChipWorker.run(): the first argument is the program to run (a compiled program: ir.compile(...), "
     "fn.lower(...)), got Program"),
    (None, lambda w: w.run(ir.compile(TwoOrch), rand()), DispatchTypeError,
     "ChipWorker.run(): program 'TwoOrch' has 2 orchestrations ['also_neg', 'neg']; select one: "
     "worker.run(compiled['also_neg'], ...)"),
    (None, lambda w: w.malloc(64), UsageError,
     "ChipWorker.malloc(): ptodist has no raw device memory or device pointers; allocate a resident tensor with "
     "alloc_tensor(shape, dtype, init=...) and pass it to run()"),
    (None, lambda w: w.free(64), UsageError,
     "ChipWorker.free(): ptodist has no raw device memory or device pointers; free a resident tensor with "
     "free_tensor(t)"),
    (None, lambda w: w.copy_from(0x1000, 0x2000, 64), DispatchValueError,
     "copy_from(dst_host_ptr, src_dev_ptr, nbytes): no resident tensor of this worker holds the 64 bytes at device "
     "pointer 0x2000; give a DeviceTensor's data_ptr (alloc_tensor(...)) and at most its nbytes"),
    (None, lambda w: w.copy_to(0x1000, 0x2000, -1), DispatchTypeError,
     "copy_to(dst_dev_ptr, src_host_ptr, nbytes): the nbytes must be a non-negative int (a DeviceTensor's data_ptr, "
     "a host tensor's data_ptr(), a byte count), got -1; or pass the tensors themselves: "
     "copy_to(device_tensor, host)"),
    (None, lambda w: w.alloc_tensor((4,), torch.float32, worker_id=1), ConfigError,
     "ChipWorker.alloc_tensor(worker_id=1): a ChipWorker has one device, worker 0"),
])
def test_chip_worker_errors(make, call, error, message):
    with pytest.raises(error, match=exactly(message)):
        if call is None:
            make()
        else:
            with ChipWorker(RunConfig(backend="sim")) as w:
                call(w)


def test_nesting_a_chip_worker_for_the_same_device_is_refused():
    with ChipWorker(RunConfig(backend="sim")):
        with pytest.raises(ConfigError, match=exactly(
                "ChipWorker: one for platform 'a2a3sim', device 0 is already active in an enclosing with block; "
                "use that worker instead of nesting another")):
            with ChipWorker(RunConfig(backend="sim")):
                pass
        with ChipWorker(RunConfig(backend="sim", device_id=1)):
            pass


# -- benchmark -------------------------------------------------------------------------------------------

def test_benchmark_times_each_launch():
    x, y = rand(), zeros()
    stats = benchmark(ir.compile(Scale, config=RunConfig(backend="sim")), [x, y], rounds=4, warmup=1)
    assert (stats.rounds, stats.warmup, len(stats.host_wall_us), stats.device_wall_us) == (4, 1, 4, [0.0] * 4)
    assert stats.all_zero_device and stats.samples is stats.device_wall_us and stats.device_wall_us_median == 0
    assert stats.per_round("host") == stats.host_wall_us and all(t > 0 for t in stats.host_wall_us)
    assert str(stats).startswith("BenchmarkStats(rounds=4, warmup=1): device_wall_us all 0 (no device clock on the "
                                 "CPU); host_wall_us min=")
    torch.testing.assert_close(y, x * 3)


def test_benchmark_errors():
    compiled = ir.compile(Scale)
    with pytest.raises(ConfigError, match=exactly("benchmark(rounds=0): must be a positive int")):
        benchmark(compiled, [rand(), zeros()], rounds=0)
    with pytest.raises(ConfigError, match=exactly(
            "benchmark(): pass either config=... or platform=/device_id=, not both")):
        benchmark(compiled, [rand(), zeros()], config=RunConfig(), device_id=1)
    with pytest.raises(ConfigError, match=exactly(
            "BenchmarkStats.per_round('union'): ptodist measures 'device' (always 0: no device clock) and 'host' "
            "only")):
        benchmark(compiled, [rand(), zeros()], rounds=1, warmup=0, config=RunConfig(backend="sim")).per_round("union")
