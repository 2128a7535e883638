"""CompiledProgram: a host orchestrator bound to a RunConfig; call it to run, or prepare a worker.

One-shot ``compiled(*args)`` takes host tensors (torch or numpy), either
every parameter (outputs filled in place) or the inputs only (outputs are
created and returned).  It plans (once per argument signature), runs the
static checks, writes the plan to ``output_dir`` and hands it to the backend.
``compiled.prepare()`` starts a :class:`~ptodist.runtime.worker.DistributedWorker`
that keeps its rank processes for many dispatches.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .. import backends, dfx
from ..check import findings
from ..compiler import checks, ir_view, planner, scalars
from ..compiler.plan import DispatchPlan
from ..compiler.scalars import PlanCache
from ..compiler.state import ProgramState, state_of
from ..config import DistributedConfig, RunConfig, keep_outputs_setting
from ..errors import (
    BuildError,
    ConfigError,
    DispatchError,
    DispatchTypeError,
    DispatchValueError,
)
from ..language.functions import EntryFunction, Function, Kind, Program
from ..language.types import Direction
from . import artifacts
from .host_args import HostArguments
from .output_dirs import _hold, new_output_dir, prune_outputs


class OrchestrationKeyError(DispatchError, KeyError):
    """``compiled[name]`` for a name that is not one of the program's L2 orchestrations."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CompiledProgram(HostArguments):
    """A compiled distributed program: call it (one shot); ``output_dir`` holds the dispatch plan."""

    def __init__(self, host: Function, name: str, config: RunConfig, extra_functions=()):
        self.host = host
        self.name = name
        self.config = config
        self.device_ids = list(config.devices.device_ids)
        self.world = len(self.device_ids)
        self.extra_functions = list(extra_functions)
        self._plans = PlanCache()  # (plan, what finishing it found) per argument signature, bounded
        self._state = None  # what the program's code reads from this process (compiler.state), made when needed
        self.stamp = None   # that state when the cached plans were made (a change empties the cache)
        self._dispatches = 0  # k in dfx_outputs/rank{r}/d{k}
        self._sub_workers: bool | None = None  # whether the host reaches a sub-worker function (then calls go
        #                                         through a DistributedWorker used once)
        self._output_dir: Path | None = Path(config.output_dir) if config.output_dir else None
        self._parent: CompiledProgram | None = None  # an orchestration of a multi-orchestration L2 program
        self._orchestrations: dict[str, CompiledProgram] = {}  # name -> its program (multi-orchestration L2)
        self.source_program: Program | None = None  # the @pl.program it was compiled from (a build records it)
        self._variants_written: set | None = None  # the builtin collectives' next_levels folders (L3 builds)
        self._callees: list[str] = []  # the chip-level functions with a next_levels folder (L3 builds)
        checks.check_program_signatures(host, self.extra_functions)

    @classmethod
    def build(cls, target, config: RunConfig | None = None, example_args=(), *, write_tree: bool = True
              ) -> CompiledProgram:
        """Compile a host Function or a ``@pl.program``; write its build tree (``write_tree``); plan now if shapes
        are known."""
        config = config or RunConfig()
        if isinstance(target, Program) and target.host is None:
            return cls._build_l2(target, config, example_args, write_tree)
        if isinstance(target, Program):
            prog = cls(target.host, target.name, config, target.functions.values())
            prog.source_program = target
        elif isinstance(target, Function) and target.kind is Kind.HOST:
            prog = cls(target, target.name, config)
        else:
            raise DispatchTypeError(f"compile() takes a @pl.program class or a @pl.jit.host function, got {target!r}")
        if write_tree:
            artifacts.write_build(prog)
        if example_args and not prog._calls_sub_workers():  # a worker plans those (with its callbacks)
            prog._plan_for(example_args)
        return prog

    @classmethod
    def _build_l2(cls, target: Program, config: RunConfig, example_args=(), write_tree: bool = True
                  ) -> CompiledProgram:
        """An L2 program (Orchestration functions, no host orchestrator): each orchestration runs on one chip.

        With one orchestration the program is called directly; with several, ``compiled[name]`` (or
        ``compiled.<name>``) is the one to call, and ``orchestration_names`` lists them (sorted).
        """
        functions = list(target.functions.values())
        orchs = target.orchestrations  # sorted by name
        first = next(iter(orchs.values()))
        prog = cls(EntryFunction(first), target.name, config, functions)
        prog.source_program = target
        if len(orchs) > 1:
            for name, orch in orchs.items():
                sub = cls(EntryFunction(orch), name, config, functions)
                sub._output_dir = None
                sub._parent = prog
                sub.source_program = target
                prog._orchestrations[name] = sub
        if write_tree:
            artifacts.write_build(prog)
        if example_args and len(orchs) == 1:
            prog._plan_for(example_args)
        return prog

    @classmethod
    def from_dir(cls, output_dir, *, platform: str | None = None, backend_type=None,
                 distributed_config: DistributedConfig | None = None) -> CompiledProgram:
        """Load a build (a compiled program's ``output_dir``) back: its program is imported again and compiled
        for the recorded configuration (``platform``, ``backend_type``, ``distributed_config`` override it).

        An L3 build holds ``distributed_meta.json``, an L2 one ``compiled_meta.json``.  Raises
        ``BuildNotFoundError`` (a FileNotFoundError) without one, ``BuildError`` (a ValueError) for a build
        ptodist cannot use, or one whose program's source changed since it was made.
        """
        from ..backend import BackendType

        path = Path(output_dir).resolve()
        l3 = (path / artifacts.DISTRIBUTED_META).is_file()
        loader = "DistributedCompiledProgram" if l3 else "CompiledProgram"
        meta = artifacts.read_meta(path, artifacts.DISTRIBUTED_META if l3 else artifacts.COMPILED_META, loader)
        obj = artifacts.load_origin(meta, path, loader)
        sub = meta["ptodist"]["origin"].get("orchestration")
        if isinstance(obj, Program) and sub is not None:
            if sub not in obj.orchestrations:
                raise BuildError(f"{loader}.from_dir({str(output_dir)!r}): program {obj.name} has no orchestration "
                                 f"{sub!r} any more; compile it again (ir.compile(...)).")
            target, extra = EntryFunction(obj.orchestrations[sub]), list(obj.functions.values())
        elif isinstance(obj, Program):
            target, extra = obj, list(obj.functions.values())
        else:
            target, extra = (obj if obj.kind is Kind.HOST else EntryFunction(obj)), []
        host = target if isinstance(target, Function) else obj.host or EntryFunction(next(iter(
            obj.orchestrations.values())))
        artifacts.check_sources(meta, ir_view.user_functions(host, extra), path, loader)
        dc = distributed_config
        if dc is None and isinstance(meta.get("distributed_config"), dict):
            dc = DistributedConfig(**meta["distributed_config"])
        bt = backend_type if backend_type is not None else getattr(BackendType, str(meta.get("backend_type")), None)
        cfg = RunConfig(platform=platform or meta.get("platform") or "a2a3sim", distributed_config=dc,
                        output_dir=str(path), backend_type=bt, backend=meta["ptodist"].get("backend"))
        if isinstance(target, EntryFunction) and sub is not None:
            prog = cls(target, sub, cfg, extra)
            prog.source_program = obj
        else:
            prog = cls.build(target, cfg, write_tree=False)
        if l3:
            prog._variants_written = {p.name for p in (path / "next_levels").glob("builtin.*")}
            prog._callees = [f.name for f in ir_view.user_functions(prog.host, prog.extra_functions)
                             if f.kind is Kind.ORCHESTRATION]
        return prog

    def __fspath__(self) -> str:
        """The output directory: as upstream's, a compiled program stands for its build (``Path(compiled)``)."""
        return str(self.output_dir)

    # -- introspection (upstream's compiled.program, ir.Program) ---------------------------------
    @property
    def program(self) -> ir_view.ProgramView:
        """The program's functions as upstream's ``ir.Program`` lists them (``functions``, ``get_function``,
        ``as_python()``)."""
        return ir_view.ProgramView(self.name, ir_view.user_functions(self.host, self.extra_functions),
                                   self.source_program)

    @property
    def functions(self) -> dict:
        """The program's functions by name (``self.program.functions``)."""
        return self.program.functions

    def get_function(self, name: str):
        """The program function called ``name``, or None."""
        return self.program.get_function(name)

    def as_python(self) -> str:
        """The program's Python source (ptodist runs it as written)."""
        return self.program.as_python()

    @property
    def has_return(self) -> bool:
        """Whether the entry function (the host orchestrator, or an L2 program's orchestration) returns values."""
        return len(ir_view.return_types(self.host)) > 0

    def build_call_config(self, config: RunConfig | None = None, *, aicpu_thread_num: int | None = None,
                          block_dim: int | None = None, dfx_dir=None) -> artifacts.CallConfig:
        """The per-call settings ``config`` (else the compiled config) gives, as upstream's ``CallConfig``: block
        dim and AICPU threads (argument, else ``config``, else the build's ``RUNTIME_CONFIG``), the DFX flags, and
        ``dfx_dir`` as ``output_prefix``."""
        self._refuse_multi(f"{self.name}.build_call_config()")
        return artifacts.call_config(config or self.config, artifacts.runtime_config(self.config),
                                     aicpu_thread_num=aicpu_thread_num, block_dim=block_dim, dfx_dir=dfx_dir)

    # -- L2 programs with several orchestrations (PyPTO's compiled[name]) ------------------------
    @property
    def orchestration_names(self) -> list[str]:
        """The orchestrations ``compiled[name]`` selects, sorted; empty unless the program is an L2 program with
        several Orchestration functions (call any other program directly)."""
        return sorted(self._orchestrations)

    @property
    def param_names(self) -> list[str]:
        """The parameter names of the function a call binds: the host orchestrator's, or an L2 program's
        orchestration's (with several, the first by name, as PyPTO reports)."""
        return [p.name for p in self.host.params]

    @property
    def output_indices(self) -> list[int]:
        """The indices of the pure outputs (``pl.Out``): created and returned when only inputs are passed."""
        return [i for i, p in enumerate(self.host.params) if p.direction is Direction.OUT]

    def __getitem__(self, name: str) -> CompiledProgram:
        sub = self._orchestrations.get(name) if isinstance(name, str) else None
        if sub is None:
            available = sorted(self._orchestrations)
            if available:
                hint = f"Available: {available}."
            else:
                hint = (f"Available: []. '{self.name}' is not an L2 program with several orchestrations: call it "
                        "directly, compiled(...).")
            raise OrchestrationKeyError(f"No orchestration {name!r} in program '{self.name}'. {hint}")
        return sub

    def __getattr__(self, name: str):
        subs = self.__dict__.get("_orchestrations") or {}
        if name in subs:
            return subs[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _refuse_multi(self, what: str) -> None:
        if self._orchestrations:
            names = sorted(self._orchestrations)
            raise DispatchTypeError(
                f"{what}: program '{self.name}' has {len(names)} L2 orchestrations {names} and no host "
                f"orchestrator, so it is ambiguous which one to run. Select one explicitly: "
                f"compiled['{names[0]}'](...) or compiled.{names[0]}(...).")

    @property
    def output_dir(self) -> Path:
        if self._parent is not None:  # an orchestration of an L2 program: next_levels/<name>, as PyPTO lays out
            path = self._parent.output_dir / "next_levels" / self.name
            path.mkdir(parents=True, exist_ok=True)
            return path
        if self._output_dir is None:
            keep = keep_outputs_setting()
            root = Path(os.environ.get("PTODIST_OUTPUT_ROOT", "build_output"))
            path, lock = new_output_dir(root, self.name)
            _hold(self, lock)  # in use while this program lives: never pruned meanwhile
            self._output_dir = path
            prune_outputs(root, self.name, keep, path)
        self._output_dir.mkdir(parents=True, exist_ok=True)
        return self._output_dir

    # -- planning -----------------------------------------------------------------
    @property
    def state(self) -> ProgramState:
        """The Python state this program's code reads (module globals, closure cells, ...): ``state.stamp()``."""
        if self._state is None:
            self._state = state_of([self.host, *self.extra_functions])
        return self._state

    def _plan_for(self, args: tuple) -> tuple[DispatchPlan, list, list, bool]:
        if self.stamp is None or not self.state.unchanged(self.stamp):
            stamp = self.state.stamp()
            if stamp != self.stamp:  # the host orchestrator may read what changed: plan again
                self._plans.clear()
            self.stamp = stamp
        values, hosts, created = self.bind(args)
        key = self.plan_key(values, hosts)
        cached = self._plans.get(key, values)
        if cached is None:
            # The host runs with a stand-in for each scalar: one it only passes on leaves the plan open for any value.
            proxies = scalars.slots_for(values, hosts)
            plan = planner.make_plan(self.host, self.name, self.device_ids, self.host_specs(hosts), proxies)
            done = scalars.finish(plan, proxies, self.param_names)
            self._plans.put(key, values, done.used, (plan, done))
            self.write_plan(plan.to_json(), plan)
        else:
            plan, done = cached
            scalars.check_values(done, values)
        return plan, values, hosts, created

    def dispatch_number(self) -> int:
        """Count a dispatch of this program (one-shot or on a worker); return its number (k of ``d{k}``)."""
        k = self._dispatches
        self._dispatches += 1
        return k

    def write_plan(self, plan_json: dict, plan: DispatchPlan | None = None) -> None:
        """Write a new plan to ``dispatch_plan.json``; the build gains the builtin collectives ``plan`` calls."""
        path = self.output_dir / "dispatch_plan.json"
        path.write_text(json.dumps(plan_json, indent=2) + "\n")
        if plan is not None:
            artifacts.write_variants(self, plan)

    def lower(self, *args) -> CompiledProgram:
        """Plan the dispatch for ``args`` without running it; ``str()`` then shows that plan (``fn.lower``)."""
        self._plan_for(args)
        return self

    def __str__(self) -> str:
        """The program's dispatch plans (the tasks each rank runs, windows, host tensors), as JSON."""
        plans = [plan.to_json() for plan, _ in self._plans.items()]
        head = f"# ptodist program '{self.name}' for devices {self.device_ids}: "
        if not plans:
            return head + "no dispatch planned yet (call it, or lower(*args))"
        return head + f"{len(plans)} dispatch plan(s)\n" + "\n".join(json.dumps(p, indent=2) for p in plans)

    # -- running ------------------------------------------------------------------
    def __call__(self, *args, config: RunConfig | None = None):
        """Run once on every rank; return the outputs (created ones in the inputs-only form)."""
        self._refuse_multi(f"{self.name}(...)")
        if self.world == 1:  # inside `with ChipWorker(...)`: upstream's compiled(...) dispatches on that worker
            from .chip_worker import ChipWorker

            worker = ChipWorker.current(platform=(config or self.config).platform, device_id=self.device_ids[0])
            if worker is not None:
                return worker.run(self, *args, config=config)
        cfg = config or self.config
        if config is not None and config.distributed_config is not None and \
                list(config.distributed_config.device_ids) != self.device_ids:
            raise DispatchValueError(f"{self.name}: called with device_ids {config.distributed_config.device_ids} but "
                                     f"compiled for {self.device_ids}; compile again for other devices")
        if self._calls_sub_workers():
            return self._call_on_a_worker(args, config)
        backend = backends.for_config(cfg)
        can = backends.capabilities(backend.name)
        cfg.announce_platform(backend.name, local=not can.multi_node)
        note_dispatch(self, backend.name)
        plan, values, hosts, created = self._plan_for(args)
        note_plan(plan)
        arrays = [h.array if h is not None else None for h in hosts]
        for spec in plan.host_tensors:  # host intermediates (pl.create_tensor in the host): zeroed per call
            if spec.index >= len(arrays):
                arrays.extend([None] * (spec.index + 1 - len(arrays)))
                arrays[spec.index] = np.zeros(spec.shape, dtype=spec.dtype.np_dtype)
        dfx_request = dfx.request_for(cfg, lambda: self.output_dir, self.dispatch_number(), job=can.job)
        scalar_args = self.scalar_values(values, hosts)
        if can.keeps_groups:  # its rank group is kept for this program's next call (forking costs ms)
            backend.run(plan, arrays, cfg, dfx_request, owner=self, stamp=self.stamp, scalars=scalar_args)
        else:
            backend.run(plan, arrays, cfg, dfx_request, scalars=scalar_args)
        outs = []
        for p, h in zip(self.host.params, hosts):
            if h is not None and p.direction is not Direction.IN:
                h.write_back()
                outs.append(h.value)
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _calls_sub_workers(self) -> bool:
        if self._sub_workers is None:
            self._sub_workers = any(f.kind is Kind.SUBWORKER
                                    for f in checks.reachable_functions(self.host, self.extra_functions))
        return self._sub_workers

    def _call_on_a_worker(self, args: tuple, config: RunConfig | None):
        """A one-shot call of a program with sub-worker functions: a DistributedWorker used once.

        The sub-worker functions run between the segments of the dispatch, in this process, as on a
        worker.  Where the worker's ranks see host tensors only in shared memory (forked ranks), the arguments
        travel as shared copies, and what the ranks wrote is copied back into the caller's tensors.
        """
        from .worker.plans import is_abstract

        for f in checks.reachable_functions(self.host, self.extra_functions):
            if f.kind is Kind.SUBWORKER and is_abstract(f):
                raise ConfigError(
                    f"{self.name}(...): sub-worker function '{f.name}' ({f.location}) has no body ('...'): it is a "
                    "callback point, and a one-shot call has no callback to run there. Give it a body, or run the "
                    f"program on a worker with its callback: compiled.prepare(callbacks={{'{f.name}': fn}}).")
        shared = backends.capabilities_for(config or self.config).shared_host_memory
        copies, passed = [], []
        for a in args:
            c = _shared_copy(a) if shared else a
            copies.append(c)
            if c is not a:
                passed.append((a, c))
        with self.prepare(config) as rt:
            result = rt(*copies)
        originals = {id(c): a for a, c in passed}
        for a, c in passed:
            _copy_back(a, c)
        if isinstance(result, tuple):
            return tuple(originals.get(id(r), r) for r in result)
        return originals.get(id(result), result)

    def prepare(self, config: RunConfig | None = None, *, extra_compiled=(), persistent: bool = False,
                reset_persistent_windows: bool | None = None, callbacks: dict | None = None,
                sub_worker_overrides: dict | None = None, inherited_host_tensors=None,
                startup_timeout_s: float | None = None):
        """Start a DistributedWorker for this program (and ``extra_compiled``): ranks start once.

        Returns the worker; use it as a context manager, or call ``close()``.  See
        :class:`ptodist.runtime.worker.DistributedWorker` for the arguments.
        """
        from .worker import DistributedWorker

        self._refuse_multi(f"{self.name}.prepare()")
        return DistributedWorker(self, config, extra_compiled=extra_compiled, persistent=persistent,
                                 reset_persistent_windows=reset_persistent_windows, callbacks=callbacks,
                                 sub_worker_overrides=sub_worker_overrides,
                                 inherited_host_tensors=inherited_host_tensors, startup_timeout_s=startup_timeout_s)


def _shared_copy(value):
    """A copy of a CPU host tensor in shared memory (a shm worker's ranks see only that); other values as they are."""
    if isinstance(value, np.ndarray) and value.size:
        from .worker import shared_array

        out = shared_array(value.shape, value.dtype)
        out[...] = value
        return out
    if type(value).__module__.startswith("torch") and hasattr(value, "share_memory_") and value.numel() and \
            value.device.type == "cpu" and not value.is_shared():
        return value.detach().clone().share_memory_()
    return value


def _copy_back(original, copy) -> None:
    """After a call through a worker: what the ranks wrote into ``copy`` goes back into the caller's tensor."""
    if isinstance(original, np.ndarray):
        if original.flags.writeable:
            np.copyto(original, copy)
    else:
        import torch

        with torch.no_grad():
            original.copy_(copy)


# ir.compile keywords PyPTO documents that steer its pass pipeline, codegen or ptoas: accepted, and ignored, because
# ptodist runs the program's Python functions as written (docs/running.md lists them).
IGNORED_COMPILE_OPTIONS = ("skip_ptoas", "verification_level", "memory_planner", "diagnostic_phase",
                           "disabled_diagnostics", "profiling", "enable_pypto_l0c_double_buffer", "emit_source_loc",
                           "dump_ptoas_passes", "runtime")
# The ones ptodist uses (platform, distributed_config, output_dir, config) or records in the RunConfig.
COMPILE_OPTIONS = ("output_dir", "strategy", "dump_passes", "backend_type", "platform", "distributed_config",
                   "block_dim", "analyze_auto_scopes_for_deps", "config")


def compile(program, *, output_dir=None, strategy=None, dump_passes=None, backend_type=None, platform=None,
            distributed_config=None, block_dim=None, analyze_auto_scopes_for_deps=None, config=None,
            **options) -> CompiledProgram:
    """Compile a ``@pl.program``, host function or CompiledProgram for a platform, devices and output directory.

    ``config`` (ptodist's) gives the whole RunConfig; the other keywords given override its fields.
    ``platform`` defaults to the simulator of ``backend_type`` (``a2a3sim``; ``a5sim`` for Ascend950);
    a given platform decides the recorded ``backend_type``, as in PyPTO.  ``strategy``, ``dump_passes``,
    ``block_dim`` and ``analyze_auto_scopes_for_deps`` are recorded in the RunConfig and change
    nothing; the keywords in ``IGNORED_COMPILE_OPTIONS`` are accepted and ignored.  A CompiledProgram
    (``fn.lower(...)``, an earlier ``ir.compile``) comes back as it is when nothing changes, else
    compiled again for the new configuration.
    """
    from dataclasses import replace

    from ..backend import PLATFORMS, BackendType, backend_type_for_platform
    from ..compiler.passes import OptimizationStrategy
    from ..errors import ApiTypeError

    unknown = [k for k in options if k not in IGNORED_COMPILE_OPTIONS]
    if unknown:
        accepted = ", ".join(COMPILE_OPTIONS + IGNORED_COMPILE_OPTIONS)
        raise ApiTypeError(f"compile() got an unexpected keyword argument '{unknown[0]}'; it accepts {accepted} "
                           f"(ptodist ignores {', '.join(IGNORED_COMPILE_OPTIONS)})")
    if strategy is not None and not isinstance(strategy, OptimizationStrategy):
        raise ApiTypeError(f"compile(strategy={strategy!r}): expects an OptimizationStrategy "
                           f"({', '.join('OptimizationStrategy.' + s.name for s in OptimizationStrategy)})")
    if backend_type is not None and not isinstance(backend_type, BackendType):
        raise ApiTypeError(f"compile(backend_type={backend_type!r}): expects a BackendType "
                           f"({', '.join('BackendType.' + b.name for b in BackendType)})")
    if config is not None and not isinstance(config, RunConfig):
        raise ApiTypeError(f"compile(config=...): expects a RunConfig, got {type(config).__name__}")
    base = config if config is not None else program.config if isinstance(program, CompiledProgram) else None
    if platform is None and base is None:
        platform = PLATFORMS[backend_type or BackendType.Ascend910B][0]
    fields = {"platform": platform, "distributed_config": distributed_config,
              "output_dir": str(output_dir) if output_dir is not None else None, "strategy": strategy,
              "dump_passes": dump_passes, "block_dim": block_dim,
              "analyze_auto_scopes_for_deps": analyze_auto_scopes_for_deps}
    given = {k: v for k, v in fields.items() if v is not None}
    cfg = replace(base, **given) if base is not None else RunConfig(**given)
    # The platform decides the generation, as in PyPTO; a config's own record stands when nothing overrides it.
    if platform is not None or backend_type is not None or cfg.backend_type is None:
        cfg.backend_type = backend_type_for_platform(cfg.platform)
    if isinstance(program, CompiledProgram):
        before = program.config
        if before.backend_type is None:
            before = replace(before, backend_type=backend_type_for_platform(before.platform))
        return program if cfg == before else _recompiled(program, cfg)
    return CompiledProgram.build(program, cfg)


def _recompiled(compiled: CompiledProgram, cfg: RunConfig) -> CompiledProgram:
    """``compiled``'s functions compiled again for ``cfg`` (plans are made again at the first call)."""
    new = CompiledProgram(compiled.host, compiled.name, cfg, compiled.extra_functions)
    new.source_program = compiled.source_program
    for name, sub in compiled._orchestrations.items():
        again = CompiledProgram(sub.host, name, cfg, sub.extra_functions)
        again._output_dir = None
        again._parent = new
        again.source_program = sub.source_program
        new._orchestrations[name] = again
    artifacts.write_build(new)
    return new


# -- what this process ran: read by `ptodist run --report-json` ---------------------------------

_ran: list[tuple[CompiledProgram, str]] = []  # (program, backend), in the order of their first dispatch
_last: list[tuple[CompiledProgram, str]] = []  # the last dispatched
_RAN_MAX = 64
_suspects: list = []  # findings.misplaced of the plans dispatched: the cause, should the script fail
_recording = [False]  # only once `ptodist run` asked: a library user's programs are not kept alive


def note_dispatch(compiled: CompiledProgram, backend: str) -> None:
    """Record that ``compiled`` is being dispatched on ``backend`` (while :func:`forget_dispatches` made a record).

    The record is a description, not the program: holding the program would keep it (and the rank group kept
    for its next one-shot call) alive for as long as the record lasts.
    """
    if not _recording[0]:
        return
    entry = {"program": compiled.name, "backend": backend, "device_ids": list(compiled.device_ids),
             "world_size": compiled.world, "output_dir": os.path.abspath(compiled.output_dir)}
    if entry not in _ran:
        _ran.append(entry)
        del _ran[:-_RAN_MAX]
    _last[:] = [entry]


def note_plan(plan: DispatchPlan) -> None:
    """Keep what the plan of a dispatch noted that a failure of the script is blamed on (while recording)."""
    if not _recording[0]:
        return
    for message, locations in plan.misplaced:  # a chip call placed round-robin on another rank's slice
        if all(f.message != message for f in _suspects):
            _suspects.append(findings.misplaced(message, locations))


def suspects() -> list:
    """The findings ``ptodist run`` reports before the script's own error when the script fails."""
    return list(_suspects)


def forget_dispatches() -> None:
    """Start a new record of the dispatches (``ptodist run`` does, before it runs the script)."""
    _ran.clear()
    _last.clear()
    _suspects.clear()
    _recording[0] = True


def dispatched() -> tuple[list[dict], dict | None]:
    """Every program dispatched since :func:`forget_dispatches`, and the last one dispatched (None: none)."""
    return [dict(e) for e in _ran], (dict(_last[0]) if _last else None)
