"""``pypto.runtime.runner``: the run configuration, ``run``, and the two-step ``compile_program`` /
``execute_compiled``; ``RunResult`` (what a harness reports about one run) and ``RunTiming``.

``compile_program(program, work_dir)`` compiles into ``work_dir``; ``execute_compiled(work_dir, args)`` runs what
was compiled there with the arguments in parameter order (tensors, ``DeviceTensor``\\ s, ctypes scalars), writing
output tensors in place.  The program compiled into ``work_dir`` by this process is used as it is; a build made
by another process is loaded with ``CompiledProgram.from_dir``.
"""

from __future__ import annotations

import ctypes
import time
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..config import DistributedConfig, RunConfig
from ..errors import ApiTypeError
from .chip_worker import run

KEPT_PROGRAMS = 64  # the programs compile_program made in this process that execute_compiled finds by folder
_compiled: OrderedDict[Path, Any] = OrderedDict()


@dataclass
class RunResult:
    """What a harness reports about one run: ``passed``, and the test's name, error text and timings."""

    __test__ = False  # not a pytest test class

    passed: bool
    test_name: str | None = None
    error: str | None = None
    execution_time: float | None = None  # seconds, compile + run + check
    profile: dict[str, Any] | None = None
    device_wall_us: float | None = None
    host_wall_us: float | None = None

    def __str__(self) -> str:
        took = f" ({self.execution_time:.2f}s)" if self.execution_time else ""
        if self.passed:
            return (f"PASS: {self.test_name}" if self.test_name else "PASS") + took
        if self.test_name:
            text = f"FAIL: {self.test_name}" + (f" - {self.error}" if self.error else "")
        else:
            text = "FAIL" + (f": {self.error}" if self.error else "")
        return text + took


@dataclass(frozen=True)
class RunTiming:
    """The timing of one :func:`execute_compiled` call, in microseconds.

    ``host_wall_us`` is the dispatch's wall time around the run; ``device_wall_us`` is 0, as on a runtime built
    without device profiling: ptodist has no device clock.
    """

    host_wall_us: float
    device_wall_us: float = 0.0


@dataclass(frozen=True)
class DfxOptions:
    """The diagnostic outputs :func:`execute_compiled` asks for (PyPTO's names; ``enable_pmu`` has no CPU
    counterpart and writes nothing)."""

    enable_l2_swimlane: bool = False
    enable_dump_tensor: int = 0  # 0 off, 1 the tensors pl.dump_tag marks, 2 every task's tensors
    enable_pmu: int = 0
    enable_dep_gen: bool = False
    enable_scope_stats: bool = False

    def any(self) -> bool:
        return bool(self.enable_l2_swimlane or self.enable_dump_tensor or self.enable_pmu or self.enable_dep_gen
                    or self.enable_scope_stats)

    @classmethod
    def from_run_config(cls, cfg: RunConfig) -> DfxOptions:
        return cls(enable_l2_swimlane=cfg.enable_chip_swimlane, enable_dump_tensor=cfg.enable_dump_args,
                   enable_pmu=cfg.enable_pmu, enable_dep_gen=cfg.enable_dep_gen,
                   enable_scope_stats=cfg.enable_scope_stats)


def compile_program(program: Any, work_dir: str | Path, *, strategy=None, backend_type=None, dump_passes: bool = False,
                    diagnostic_phase=None, disabled_diagnostics=None, profiling: bool = False,
                    analyze_auto_scopes_for_deps: bool = False) -> None:
    """Compile ``program`` (a ``@pl.program`` class or a compiled program) into ``work_dir``.

    Run it with :func:`execute_compiled` on the same folder.  ``diagnostic_phase``, ``disabled_diagnostics`` and
    ``profiling`` configure a compiler ptodist does not have; they change nothing.
    """
    from .program import compile as compile_

    del diagnostic_phase, disabled_diagnostics, profiling
    compiled = compile_(program, output_dir=str(work_dir), strategy=strategy, backend_type=backend_type,
                        dump_passes=dump_passes or None,
                        analyze_auto_scopes_for_deps=analyze_auto_scopes_for_deps or None)
    key = Path(compiled.output_dir).resolve()  # makes the folder
    _compiled[key] = compiled
    _compiled.move_to_end(key)
    while len(_compiled) > KEPT_PROGRAMS:
        _compiled.popitem(last=False)


def execute_compiled(work_dir: str | Path, args, *, platform: str | None = None, device_id: int = 0,
                     pto_isa_commit: str | None = None, dfx: Any = None, level: int = 2,
                     block_dim: int | None = None, aicpu_thread_num: int | None = None,
                     analyze_auto_scopes_for_deps: bool = False) -> RunTiming:
    """Run the program compiled into ``work_dir`` once with ``args`` (in parameter order); return its timing.

    Tensors given for outputs are written in place.  A ``ctypes`` scalar (``ctypes.c_int64(5)``) passes its
    value.  ``dfx`` (a :class:`DfxOptions`, or any object with its fields) turns on diagnostic outputs under
    ``work_dir/dfx_outputs``.  ``level`` is the compiled program's own (a host orchestrator makes it an L3
    program); ``pto_isa_commit`` and ``analyze_auto_scopes_for_deps`` change nothing after compiling.
    """
    del level, analyze_auto_scopes_for_deps
    if isinstance(args, (str, bytes)) or hasattr(args, "shape") or not hasattr(args, "__iter__"):
        raise ApiTypeError(f"execute_compiled({str(work_dir)!r}, args=...): args must be a list of the program's "
                           f"arguments in parameter order, got {type(args).__name__}")
    compiled = _program_in(Path(work_dir), platform)
    values = [a.value if isinstance(a, ctypes._SimpleCData) else a for a in args]
    overrides = {"device_id": device_id, "pto_isa_commit": pto_isa_commit}
    if platform is not None:
        overrides["platform"] = platform
    if block_dim is not None:
        overrides["block_dim"] = block_dim
    if aicpu_thread_num is not None:
        overrides["aicpu_thread_num"] = aicpu_thread_num
    if dfx is not None:
        overrides.update(enable_chip_swimlane=bool(getattr(dfx, "enable_l2_swimlane", False)),
                         enable_dump_args=int(getattr(dfx, "enable_dump_tensor", 0)),
                         enable_pmu=int(getattr(dfx, "enable_pmu", 0)),
                         enable_dep_gen=bool(getattr(dfx, "enable_dep_gen", False)),
                         enable_scope_stats=bool(getattr(dfx, "enable_scope_stats", False)))
    known = {f.name for f in fields(RunConfig)}
    cfg = replace(compiled.config, **{k: v for k, v in overrides.items() if k in known})
    start = time.perf_counter_ns()
    compiled(*values, config=cfg)
    return RunTiming(host_wall_us=(time.perf_counter_ns() - start) / 1000.0)


def _program_in(work_dir: Path, platform: str | None):
    """The program compiled into ``work_dir``: this process's, else the build there loaded again."""
    found = _compiled.get(work_dir.resolve())
    if found is not None:
        return found
    from .program import CompiledProgram

    load = getattr(CompiledProgram, "from_dir", None)
    if load is None:
        from ..errors import BuildNotFoundError

        raise BuildNotFoundError(
            f"execute_compiled({str(work_dir)!r}): no program was compiled into this folder by this process; "
            f"call compile_program(program, {str(work_dir)!r}) first (in this process).")
    return load(work_dir, platform=platform)


__all__ = ["DistributedConfig", "DfxOptions", "RunConfig", "RunResult", "RunTiming", "compile_program",
           "execute_compiled", "run"]
