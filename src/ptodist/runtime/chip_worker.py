"""PyPTO's single-device runtime surface: ``ChipWorker``, ``run`` and ``benchmark``.

A ChipWorker is a :class:`~ptodist.runtime.worker.DistributedWorker` on one device
(``RunConfig.device_id``).  PyPTO's worker takes programs at any time (``run``, ``register``)
while a DistributedWorker starts its ranks with the programs it runs, so the ChipWorker starts
its DistributedWorker again, with the resident tensors carried over, when a program it has not
run before arrives.  Host tensors need not be shared memory: on the shm backend they travel as
shared copies, as a one-shot call of a program with sub-worker functions does.
"""

from __future__ import annotations

import contextvars
import statistics
import time
import weakref
from dataclasses import dataclass, field, replace

from .. import backends
from ..config import RunConfig
from ..errors import ApiTypeError, ConfigError, DispatchTypeError, UsageError
from ..language.types import Direction
from .program import CompiledProgram, _copy_back, _shared_copy
from .program import compile as compile_program
from .worker import DeviceTensor, DistributedWorker, RegistrationHandle, StackedDeviceTensor
from .worker.base import Worker

DEFAULT_RUNTIME = "tensormap_and_ringbuffer"

# The ChipWorkers whose with block is running, innermost last (ChipWorker.current looks here).
_ACTIVE: contextvars.ContextVar[tuple] = contextvars.ContextVar("ptodist_active_chip_workers", default=())

_IDLE: list = []  # the function of the program every ChipWorker's DistributedWorker starts with


def _idle_program(config: RunConfig) -> CompiledProgram:
    """A program that is never dispatched: a DistributedWorker needs one to start before any real one arrives."""
    from ..language import jit
    from ..language.functions import EntryFunction

    if not _IDLE:
        def chip_worker_idle():
            """Never dispatched."""

        _IDLE.append(EntryFunction(jit(chip_worker_idle)))
    return CompiledProgram.build(_IDLE[0], config, write_tree=False)  # ptodist's own: no build to show


class ChipRegistrationHandle(RegistrationHandle):
    """A program registered on a ChipWorker: ``handle(*args, config=None)`` is ``worker.run(compiled, *args)``."""

    def __init__(self, worker: ChipWorker, compiled: CompiledProgram, cid: int):
        super().__init__(worker, compiled)
        self.cid = cid
        self._worker_closed = False

    @property
    def closed(self) -> bool:
        return self._unregistered or self._worker_closed

    def __call__(self, *args, config: RunConfig | None = None):
        """Dispatch the program on its ChipWorker and wait; returns what ``worker.run`` returns."""
        if self._worker_closed:
            raise UsageError(f"RegistrationHandle of '{self._compiled.name}': its ChipWorker was closed (close(), or "
                             "leaving its with block), so it can dispatch nothing more. Register the program on an "
                             "open ChipWorker: worker.register(compiled).")
        if self._unregistered:
            raise UsageError(f"RegistrationHandle of '{self._compiled.name}' was unregistered (unregister(), or "
                             "leaving its with block), so it can dispatch nothing more. Get a fresh handle with "
                             "worker.register(compiled), or dispatch with worker.run(compiled, *args).")
        return self._worker.run(self._compiled, *args, config=config)


class ChipWorker(Worker):
    """A single-device worker (PyPTO's L2 ``ChipWorker``): dispatch compiled programs, keep tensors resident.

    Args:
        config: the RunConfig of its device (``platform``, ``device_id``, ``backend``); default ``RunConfig()``.
        level: 2 only (one chip); several devices are a DistributedWorker's (``compiled.prepare()``).
        runtime: PyPTO's runtime name; recorded (ptodist has one runtime).
        enable_sdma: recorded (ptodist needs no SDMA workspace).
        auto_init: ``init()`` at once (default True); else ``init()`` or a ``with`` block does.
    """

    def __init__(self, config: RunConfig | None = None, *, level: int = 2, runtime: str = DEFAULT_RUNTIME,
                 enable_sdma: bool = False, auto_init: bool | None = None):
        if level != 2:
            raise ConfigError(f"ChipWorker(level={level!r}): a ChipWorker runs one chip (level=2); run programs on "
                              "several devices with a DistributedWorker (compiled.prepare())")
        if config is not None and not isinstance(config, RunConfig):
            raise ApiTypeError(f"ChipWorker(config=...): expects a RunConfig, got {type(config).__name__}")
        config = config or RunConfig()
        if config.distributed_config is not None and len(config.distributed_config.device_ids) != 1:
            raise ConfigError(f"ChipWorker(config=...): distributed_config lists devices "
                              f"{config.distributed_config.device_ids}, but a ChipWorker runs one device; pick it "
                              "with RunConfig(device_id=...), or run on several with compiled.prepare()")
        self._config = config
        self._device = config.devices.device_ids[0]
        self._dw_config = replace(config, device_id=self._device, distributed_config=None)
        self._runtime = runtime
        self._enable_sdma = bool(enable_sdma)
        self._dw: DistributedWorker | None = None
        self._known: dict[int, tuple[CompiledProgram, CompiledProgram]] = {}  # id(given) -> (given, on this device)
        self._handles: weakref.WeakSet = weakref.WeakSet()
        self._initialized = False
        self._token = None
        if auto_init is None or auto_init:
            self.init()

    # -- identity ----------------------------------------------------------------------------------
    @property
    def level(self) -> int:
        return 2

    @property
    def platform(self) -> str:
        return self._config.platform

    @property
    def device_id(self) -> int:
        return self._device

    @property
    def runtime(self) -> str:
        return self._runtime

    @property
    def initialized(self) -> bool:
        return self._initialized

    @property
    def closed(self) -> bool:
        """True until ``init()`` and again after ``close()``: the worker can dispatch nothing then."""
        return not self._initialized

    @property
    def _binding(self) -> tuple:
        return (2, self.platform, self._device, self._runtime)

    def __repr__(self) -> str:
        state = "open" if self._initialized else "closed"
        return f"<ChipWorker {self.platform} device {self._device} ({state})>"

    @classmethod
    def current(cls, *, level: int = 2, platform: str, device_id: int, runtime: str = DEFAULT_RUNTIME,
                require_sdma: bool = False) -> ChipWorker | None:
        """Return the innermost ChipWorker whose ``with`` block is running for this binding, or None."""
        for w in reversed(_ACTIVE.get()):
            if w._binding == (level, platform, device_id, runtime):
                return w
        return None

    # -- lifecycle ---------------------------------------------------------------------------------
    def init(self) -> None:
        """Make the worker usable (idempotent); its ranks start with the first tensor or program it needs."""
        self._initialized = True

    def close(self) -> None:
        """Stop the ranks, free the resident tensors and end the registrations (idempotent; ``init()`` reopens)."""
        if not self._initialized:
            return
        self._initialized = False
        for h in list(self._handles):
            h._worker_closed = True
        self._handles = weakref.WeakSet()
        self._known.clear()
        dw, self._dw = self._dw, None
        if dw is not None:
            dw.close()

    def __enter__(self) -> ChipWorker:
        active = _ACTIVE.get()
        if any(w._binding == self._binding for w in active):
            raise ConfigError(f"ChipWorker: one for platform {self.platform!r}, device {self._device} is already "
                              "active in an enclosing with block; use that worker instead of nesting another")
        self.init()
        self._token = _ACTIVE.set(active + (self,))
        return self

    def __exit__(self, *exc) -> bool:
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None
        self.close()
        return False

    def _require_open(self, call: str) -> None:
        if not self._initialized:
            raise UsageError(f"ChipWorker.{call}(): called after close() (or before init()): the worker is closed; "
                             "call init() or use it in a with block (with ChipWorker(config) as w: ...)")

    # -- programs ----------------------------------------------------------------------------------
    def _worker(self) -> DistributedWorker:
        if self._dw is None:
            self._restart()
        return self._dw

    def _restart(self) -> None:
        """Start the DistributedWorker with every known program; carry the resident tensors over."""
        programs = [_idle_program(self._dw_config)] + [local for _, local in self._known.values()]
        old, moved = self._dw, []
        if old is not None:
            core = old._core
            with core.state:  # taken out of the old worker, so that closing it does not free them
                for serial, t in list(core.residents.items()):
                    if t._file is not None:
                        moved.append(core.residents.pop(serial))
            self._dw = None
            old.close()
        try:
            dw = DistributedWorker(programs, self._dw_config)
        except BaseException:
            for t in moved:
                t._file.close()
                t._file = None
            raise
        core = dw._core
        with core.state:
            for t in moved:
                t._core = core
                for shard in getattr(t, "_shards", ()):
                    shard._core = core
                core.residents[t._file.serial] = t
        self._dw = dw

    def _adopt(self, compiled, call: str) -> CompiledProgram:
        """Return ``compiled`` as this worker runs it (compiled for its device), starting the ranks anew if new."""
        if not isinstance(compiled, CompiledProgram):
            raise DispatchTypeError(f"ChipWorker.{call}(): the first argument is the program to run (a compiled "
                                    f"program: ir.compile(...), fn.lower(...)), got {type(compiled).__name__}")
        known = self._known.get(id(compiled))
        if known is not None:
            return known[1]
        if compiled._orchestrations:
            names = compiled.orchestration_names
            raise DispatchTypeError(f"ChipWorker.{call}(): program '{compiled.name}' has {len(names)} orchestrations "
                                    f"{names}; select one: worker.{call}(compiled['{names[0]}'], ...)")
        if compiled.config.platform != self.platform:
            raise ConfigError(f"ChipWorker.{call}(): program '{compiled.name}' is compiled for platform "
                              f"{compiled.config.platform!r} but the worker runs {self.platform!r}; compile for the "
                              f"worker's platform, or make a ChipWorker(config=RunConfig(platform="
                              f"{compiled.config.platform!r}))")
        if compiled.world != 1:
            raise ConfigError(f"ChipWorker.{call}(): program '{compiled.name}' is compiled for {compiled.world} "
                              f"devices {compiled.device_ids}; a ChipWorker runs one. Run it on a DistributedWorker: "
                              "compiled.prepare()")
        local = compiled
        if compiled.device_ids != [self._device]:  # PyPTO picks the chip at dispatch: the worker's device
            local = compile_program(compiled, config=replace(compiled.config, device_id=self._device,
                                                             distributed_config=None))
        self._known[id(compiled)] = (compiled, local)
        self._restart()
        return local

    def register(self, compiled: CompiledProgram) -> ChipRegistrationHandle:
        """Prepare ``compiled`` for dispatch now and return a handle: ``handle(*args)`` is ``run(compiled, *args)``."""
        self._require_open("register")
        self._adopt(compiled, "register")
        cid = list(self._known).index(id(compiled))
        handle = ChipRegistrationHandle(self, compiled, cid)
        self._handles.add(handle)
        return handle

    def run(self, compiled: CompiledProgram, *args, config: RunConfig | None = None):
        """Dispatch ``compiled`` on this device and wait; return what ``compiled(*args)`` returns."""
        self._require_open("run")
        local = self._adopt(compiled, "run")
        dw = self._worker()
        if dw._core.intake.stale():  # what the programs read changed since its ranks started: run on fresh ones
            self._restart()
            dw = self._dw
        names = compiled.param_names
        for i, a in enumerate(args):
            if isinstance(a, (DeviceTensor, StackedDeviceTensor)) and a._core is not dw._core:
                name = names[i] if i < len(names) else str(i)
                whose = "a closed worker (closing a worker frees its resident tensors)" if a._core.closed else \
                    "another worker (a resident tensor lives on the worker that allocated it)"
                raise DispatchTypeError(f"ChipWorker.run(): parameter '{name}' of '{compiled.name}' is "
                                        f"{a.describe()} of {whose}. Allocate it on this worker with "
                                        "alloc_tensor(shape, dtype, init=host_tensor).")
        shared = backends.capabilities(dw._core.backend).shared_host_memory  # its ranks see only shared memory
        copies = [_shared_copy(a) if shared else a for a in args]
        result = dw.run(local, *copies, config=config)
        params = local.host.params
        if len(args) != len(params):  # the inputs-only form: the arguments are the non-Out parameters
            params = [p for p in params if p.direction is not Direction.OUT]
        originals = {}
        for a, c, p in zip(args, copies, params):
            if c is not a and p.direction is not Direction.IN:  # what the ranks may have written
                _copy_back(a, c)
                originals[id(c)] = a
        if isinstance(result, tuple):
            return tuple(originals.get(id(r), r) for r in result)
        return originals.get(id(result), result)

    # -- resident tensors ------------------------------------------------------------------------
    def alloc_tensor(self, shape, dtype, *, init=None, worker_id: int = 0) -> DeviceTensor:
        """Allocate a zero-filled tensor resident on the device; ``init`` (a host tensor) fills it once."""
        self._require_open("alloc_tensor")
        self._local_only(worker_id, "alloc_tensor")
        return self._worker().alloc_tensor(shape, dtype, init=init)

    def free_tensor(self, tensor: DeviceTensor, *, worker_id: int = 0) -> None:
        """Free a resident tensor; freeing twice does nothing."""
        self._require_open("free_tensor")
        self._local_only(worker_id, "free_tensor")
        self._worker().free_tensor(tensor)

    def copy_to(self, dst: DeviceTensor, src, *args, worker_id: int = 0) -> None:
        """Copy host tensor ``src`` into resident tensor ``dst`` (same shape and dtype); or PyPTO's pointer form,
        ``copy_to(dst_dev_ptr, src_host_ptr, nbytes)`` (a ``DeviceTensor.data_ptr`` and a host ``data_ptr()``)."""
        self._require_open("copy_to")
        self._local_only(worker_id, "copy_to")
        self._worker().copy_to(dst, src, *args)

    def copy_from(self, dst, src: DeviceTensor, *args, worker_id: int = 0) -> None:
        """Copy resident tensor ``src`` into host tensor ``dst`` (same shape and dtype); or PyPTO's pointer form,
        ``copy_from(dst_host_ptr, src_dev_ptr, nbytes)``."""
        self._require_open("copy_from")
        self._local_only(worker_id, "copy_from")
        self._worker().copy_from(dst, src, *args)

    def malloc(self, nbytes: int, *, worker_id: int = 0) -> int:
        """Refused: ptodist has no raw device memory; allocate a tensor with ``alloc_tensor(shape, dtype)``."""
        raise UsageError("ChipWorker.malloc(): ptodist has no raw device memory or device pointers; allocate a "
                         "resident tensor with alloc_tensor(shape, dtype, init=...) and pass it to run()")

    def free(self, ptr: int, *, worker_id: int = 0) -> None:
        """Refused: ptodist has no raw device memory; free a resident tensor with ``free_tensor(t)``."""
        raise UsageError("ChipWorker.free(): ptodist has no raw device memory or device pointers; free a resident "
                         "tensor with free_tensor(t)")

    @staticmethod
    def _local_only(worker_id: int, call: str) -> None:
        if worker_id != 0:
            raise ConfigError(f"ChipWorker.{call}(worker_id={worker_id!r}): a ChipWorker has one device, worker 0")


def run(program, *tensors, config: RunConfig | None = None) -> CompiledProgram:
    """Compile ``program`` for ``config`` and, given tensors, run it once with them; return the compiled program."""
    config = config or RunConfig()
    if config.output_dir is None and config.save_kernels_dir:  # PyPTO's run writes its artifacts there
        config = replace(config, output_dir=config.save_kernels_dir)
    compiled = compile_program(program, config=config)
    if tensors and not config.codegen_only:
        compiled(*tensors, config=config)
    return compiled


@dataclass
class BenchmarkStats:
    """Per-launch timings of :func:`benchmark` in microseconds: ``host_wall_us`` measured, ``device_wall_us`` 0."""

    device_wall_us: list[float] = field(default_factory=list)
    host_wall_us: list[float] = field(default_factory=list)
    rounds: int = 0
    warmup: int = 0
    # Upstream sets it when it could not split its trace into rounds; ptodist times each round itself.
    fallback_flattened: bool = False

    @property
    def all_zero_device(self) -> bool:
        """True when launches ran but none has a device time: always on ptodist, which has no device clock."""
        return bool(self.device_wall_us) and not any(self.device_wall_us)

    @property
    def samples(self) -> list[float]:
        """The ``device_wall_us`` samples (PyPTO's alias)."""
        return self.device_wall_us

    def per_round(self, metric: str = "device") -> list[float]:
        """One value per measured launch: ``"device"`` (0) or ``"host"`` (its wall time)."""
        if metric == "device":
            return list(self.device_wall_us)
        if metric == "host":
            return list(self.host_wall_us)
        raise ConfigError(f"BenchmarkStats.per_round({metric!r}): ptodist measures 'device' (always 0: no device "
                          "clock) and 'host' only")

    @property
    def device_us_min(self) -> float:
        return min(self.device_wall_us, default=0.0)

    @property
    def device_us_median(self) -> float:
        return statistics.median(self.device_wall_us) if self.device_wall_us else 0.0

    @property
    def device_us_mean(self) -> float:
        return statistics.fmean(self.device_wall_us) if self.device_wall_us else 0.0

    @property
    def device_us_max(self) -> float:
        return max(self.device_wall_us, default=0.0)

    @property
    def device_us_stdev(self) -> float:
        return statistics.stdev(self.device_wall_us) if len(self.device_wall_us) > 1 else 0.0

    device_wall_us_min = device_us_min
    device_wall_us_median = device_us_median
    device_wall_us_mean = device_us_mean
    device_wall_us_max = device_us_max
    device_wall_us_stdev = device_us_stdev

    def __str__(self) -> str:
        if not self.host_wall_us:
            return f"BenchmarkStats(rounds={self.rounds}: no samples)"
        h = self.host_wall_us
        return (f"BenchmarkStats(rounds={self.rounds}, warmup={self.warmup}): device_wall_us all 0 (no device "
                f"clock on the CPU); host_wall_us min={min(h):.1f} median={statistics.median(h):.1f} "
                f"mean={statistics.fmean(h):.1f} max={max(h):.1f}")


def benchmark(compiled: CompiledProgram, args, *, rounds: int = 100, warmup: int = 3, platform: str | None = None,
              device_id: int | None = None, config: RunConfig | None = None) -> BenchmarkStats:
    """Register ``compiled`` once on a worker and time ``rounds`` launches after ``warmup`` untimed ones."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds <= 0:
        raise ConfigError(f"benchmark(rounds={rounds!r}): must be a positive int")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"benchmark(warmup={warmup!r}): must be an int >= 0")
    if not isinstance(compiled, CompiledProgram):
        raise ApiTypeError(f"benchmark(): expects a compiled program (ir.compile(...)), got {type(compiled).__name__}")
    args = tuple(args)
    stats = BenchmarkStats(rounds=rounds, warmup=warmup)
    if compiled.world > 1:
        if platform is not None or device_id is not None:
            raise ConfigError("benchmark(): platform=/device_id= do not apply to a program compiled for several "
                              "devices (its distributed_config fixes them); pass config=RunConfig(...) if needed")
        with compiled.prepare(config) as rt:
            _time(rt.register(compiled), args, config, stats)
        return stats
    if config is not None and (platform is not None or device_id is not None):
        raise ConfigError("benchmark(): pass either config=... or platform=/device_id=, not both")
    if config is None:
        config = replace(compiled.config, platform=platform or compiled.config.platform, distributed_config=None,
                         device_id=compiled.device_ids[0] if device_id is None else device_id)
    with ChipWorker(config) as worker:
        _time(worker.register(compiled), args, None, stats)
    return stats


def _time(handle, args: tuple, config: RunConfig | None, stats: BenchmarkStats) -> None:
    for _ in range(stats.warmup):
        handle(*args, config=config)
    for _ in range(stats.rounds):
        start = time.perf_counter()
        handle(*args, config=config)
        stats.host_wall_us.append((time.perf_counter() - start) * 1e6)
        stats.device_wall_us.append(0.0)


__all__ = ["BenchmarkStats", "ChipRegistrationHandle", "ChipWorker", "benchmark", "run"]
