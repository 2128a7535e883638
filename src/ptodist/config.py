"""``RunConfig`` and ``DistributedConfig``, validated when made."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .errors import ConfigError

PLATFORMS = ("a2a3sim", "a2a3", "a5sim", "a5")
# The registered backends' names: the backends' registry (backends/registry.py) hands its listing down at import,
# as config lies below the backends and imports nothing of them.
_backend_names: list[Callable[[], tuple[str, ...]]] = []
# Set by MPI launchers (Open MPI, MPICH/Hydra and Intel MPI, PMIx-based launchers, MVAPICH) in each process.
MPI_LAUNCHER_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
DEFAULT_HANG_TIMEOUT_S = 60.0
DEFAULT_KEEP_OUTPUTS = 20
_announced: set[str] = set()


def use_backend_names(names: Callable[[], tuple[str, ...]]) -> None:
    """Check backend names against ``names()`` (the backends' registry calls this once, at import)."""
    _backend_names[:] = [names]


def backend_names() -> tuple[str, ...]:
    """The names ``RunConfig(backend=...)`` and ``PTODIST_BACKEND`` take: the registered backends'."""
    return _backend_names[0]() if _backend_names else ()


def started_by_mpi_launcher() -> bool:
    """Whether this process was started by an MPI launcher (``mpirun``, ``mpiexec``, ``srun --mpi=pmix``)."""
    return any(os.environ.get(name) for name in MPI_LAUNCHER_ENV)


def rank_prefix_setting() -> bool | None:
    """``PTODIST_RANK_PREFIX``: ``True`` (1: always prefix), ``False`` (0: never), ``None`` (unset: when world > 1)."""
    text = os.environ.get("PTODIST_RANK_PREFIX", "").strip()
    if not text:
        return None
    if text not in ("0", "1"):
        raise ConfigError(f"PTODIST_RANK_PREFIX={text!r}: must be 0 (the ranks' output lines are not prefixed) or 1 "
                          "(each line a rank prints starts with [rank r], even with one rank)")
    return text == "1"


# The threshold of ptodist's notices on stderr (``configure_log``; PyPTO's runtime log levels, as logging's numbers).
LOG_LEVELS = {"debug": 10, "info": 20, "timing": 25, "warn": 30, "warning": 30, "error": 40, "null": 100}
_log_threshold: list[int] = []  # set by configure_log(); empty: PYPTO_RUNTIME_LOG, else info


def parse_log_level(level, where: str) -> int:
    """A log level: one of :data:`LOG_LEVELS` (any case) or a ``logging`` number; else ConfigError."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str):
        text = level.strip().lower()
        if text in LOG_LEVELS:
            return LOG_LEVELS[text]
        if text.lstrip("-").isdigit():
            return int(text)
    raise ConfigError(f"{where}: {level!r} is not a log level; give one of {', '.join(LOG_LEVELS)} or a logging "
                      "level number (10 debug ... 40 error)")


def log_threshold() -> int:
    """The level a notice needs to be printed: configure_log's, else ``PYPTO_RUNTIME_LOG``'s, else info (20)."""
    if _log_threshold:
        return _log_threshold[0]
    env = os.environ.get("PYPTO_RUNTIME_LOG", "").strip()
    return parse_log_level(env, f"PYPTO_RUNTIME_LOG={env!r}") if env else LOG_LEVELS["info"]


def set_log_threshold(level: int) -> None:
    _log_threshold[:] = [level]


def notice(text: str, level: int = LOG_LEVELS["info"]) -> None:
    """Print one of ptodist's notices on stderr (``ptodist: ...``) when ``level`` reaches the log threshold."""
    if level >= log_threshold():
        print(f"ptodist: {text}", file=sys.stderr)


def keep_outputs_setting() -> int:
    """``PTODIST_KEEP_OUTPUTS``: how many default output directories to keep per program (0: all); default 20."""
    text = os.environ.get("PTODIST_KEEP_OUTPUTS", "").strip()
    if not text:
        return DEFAULT_KEEP_OUTPUTS
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"PTODIST_KEEP_OUTPUTS={text!r}: must be a whole number >= 0: how many of a program's "
                          f"newest output directories to keep (default {DEFAULT_KEEP_OUTPUTS}; 0 keeps them all)")
    return value


# The diagnostic outputs ``PTODIST_DFX`` (and ``ptodist run --dfx``, which sets it) turns on: name -> RunConfig flag.
DFX_KINDS = {"swimlane": "enable_chip_swimlane", "deps": "enable_dep_gen", "scope_stats": "enable_scope_stats",
             "dump": "enable_dump_args"}
DFX_ALIASES = {"trace": "swimlane"}  # what `ptodist trace` reads
DFX_OFF = ("", "none", "0", "off")
_DFX_NAMES = ("swimlane (or trace: timing records and the merged trace), deps (deps.json), scope_stats "
              "(scope_stats.jsonl), dump (the tensors pl.dump_tag marks)")


@functools.lru_cache(maxsize=16)
def parse_dfx(text: str, where: str = "PTODIST_DFX") -> frozenset[str]:
    """The diagnostic outputs a ``PTODIST_DFX`` / ``--dfx`` value names (keys of :data:`DFX_KINDS`); else ConfigError.

    ``all`` names every one; ``none``, ``off``, ``0`` or nothing names none; else names separated by commas.
    """
    value = text.strip().lower()
    if value in DFX_OFF:
        return frozenset()
    kinds = set()
    for word in (w.strip() for w in value.split(",")):
        name = DFX_ALIASES.get(word, word)
        if name == "all":
            kinds.update(DFX_KINDS)
        elif name in DFX_KINDS:
            kinds.add(name)
        else:
            shown = f"'{word}'" if word else "an empty name"
            raise ConfigError(f"{where}={text!r}: {shown} is not one of ptodist's diagnostic outputs. Give all, "
                              f"none, or a comma-separated list of: {_DFX_NAMES} (docs/dfx.md#without-editing-the-script)")
    return frozenset(kinds)


def dfx_setting() -> frozenset[str]:
    """The diagnostic outputs ``PTODIST_DFX`` turns on for every run of this process (``ptodist run --dfx`` sets it)."""
    return parse_dfx(os.environ.get("PTODIST_DFX", ""))


@dataclass
class DistributedConfig:
    """Which devices the program runs on: rank r runs on ``device_ids[r]``."""

    device_ids: list[int] = field(default_factory=lambda: [0])
    num_sub_workers: int = 0
    runtime: str = "tensormap_and_ringbuffer"
    block_dim: int | None = None
    aicpu_thread_num: int = 4

    def __post_init__(self):
        ids = self.device_ids
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ConfigError(f"DistributedConfig(device_ids={ids!r}): device_ids must be a list of ints, "
                              "e.g. [0, 1] (parse '-d 0,1' with [int(d) for d in s.split(',')])")
        ids = list(ids)
        if not ids:
            raise ConfigError("DistributedConfig(device_ids=[]): at least one device id is needed")
        for d in ids:
            if isinstance(d, bool) or not isinstance(d, int):
                raise ConfigError(f"DistributedConfig(device_ids={ids!r}): {d!r} is not an int")
            if d < 0:
                raise ConfigError(f"DistributedConfig(device_ids={ids!r}): device ids must be non-negative, got {d}")
        dup = sorted({d for d in ids if ids.count(d) > 1})
        if dup:
            raise ConfigError(f"DistributedConfig(device_ids={ids!r}): device ids must be distinct; "
                              f"{dup} appear more than once")
        if not isinstance(self.num_sub_workers, int) or self.num_sub_workers < 0:
            raise ConfigError(f"DistributedConfig(num_sub_workers={self.num_sub_workers!r}): must be an int >= 0")
        self.device_ids = ids

    @property
    def world_size(self) -> int:
        return len(self.device_ids)


@dataclass
class RunConfig:
    """How to run: the platform name, the devices, diagnostics, and ptodist's own settings.

    ``backend`` picks ptodist's backend (default: env ``PTODIST_BACKEND``, else
    ``"mpi"`` in a process an MPI launcher started, else ``"shm"``; always
    ``"sim"`` under ``ptodist check``); ``hang_timeout_s`` how long ranks may
    make no progress before the run ends with HangError (default: env
    ``PTODIST_HANG_TIMEOUT``, else 60 s).
    """

    platform: str = "a2a3sim"
    device_id: int = 0
    distributed_config: DistributedConfig | None = None
    enable_chip_swimlane: bool = False
    enable_scope_stats: bool = False
    enable_dump_args: int = 0  # 1: dump the tensors pl.dump_tag / dumps= mark, 2: every task's tensors
    enable_dep_gen: bool = False
    enable_profiling: bool = False
    rtol: float = 1e-5
    atol: float = 1e-5
    output_dir: str | None = None
    backend: str | None = None
    hang_timeout_s: float | None = None
    strategy: object = None
    backend_type: object = None
    dump_passes: bool = False
    save_kernels: bool = False
    save_kernels_dir: str | None = None
    codegen_only: bool = False
    pto_isa_commit: str | None = None
    block_dim: int | None = None
    aicpu_thread_num: int | None = None
    ring_task_window: int | None = None
    ring_heap: int | None = None
    ring_dep_pool: int | None = None
    analyze_auto_scopes_for_deps: bool = False
    enable_pmu: int = 0  # PyPTO's AICore PMU event type: recorded; a CPU has no such counters, nothing is written

    def __post_init__(self):
        if self.platform not in PLATFORMS:
            raise ConfigError(f"RunConfig(platform={self.platform!r}): must be one of {', '.join(PLATFORMS)}")
        if self.distributed_config is not None and not isinstance(self.distributed_config, DistributedConfig):
            raise ConfigError("RunConfig(distributed_config=...): expects a DistributedConfig, "
                              f"got {type(self.distributed_config).__name__}")
        if self.backend is not None and self.backend not in (known := backend_names()):
            raise ConfigError(f"RunConfig(backend={self.backend!r}): available backends are {', '.join(known)}")
        if self.enable_dump_args not in (0, 1, 2, False, True):
            raise ConfigError(f"RunConfig(enable_dump_args={self.enable_dump_args!r}): must be 0 (off), 1 (the "
                              "tensors marked with pl.dump_tag / dumps=) or 2 (every task's tensors)")
        t = self.hang_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            raise ConfigError(f"RunConfig(hang_timeout_s={self.hang_timeout_s!r}): must be a positive number of "
                              "seconds")

    @property
    def devices(self) -> DistributedConfig:
        return self.distributed_config or DistributedConfig(device_ids=[self.device_id])

    def resolved_backend(self) -> str:
        """The backend this config selects (``ptodist check`` overrides it: ``backends.for_config``)."""
        name = self.backend or os.environ.get("PTODIST_BACKEND") or ("mpi" if started_by_mpi_launcher() else "shm")
        if name not in (known := backend_names()):
            raise ConfigError(f"PTODIST_BACKEND={name!r}: available backends are {', '.join(known)}")
        return name

    def resolved_hang_timeout(self) -> float:
        if self.hang_timeout_s is not None:
            return float(self.hang_timeout_s)
        env = os.environ.get("PTODIST_HANG_TIMEOUT")
        if env:
            try:
                value = float(env)
            except ValueError:
                raise ConfigError(f"PTODIST_HANG_TIMEOUT={env!r}: must be a number of seconds") from None
            if not value > 0:  # also refuses nan, which would disable hang detection
                raise ConfigError(f"PTODIST_HANG_TIMEOUT={env!r}: must be a positive number of seconds")
            return value
        return DEFAULT_HANG_TIMEOUT_S

    def announce_platform(self, backend: str, local: bool) -> None:
        """Say once per process which of ptodist's backends the upstream platform runs on (``local``: its ranks
        run on this machine only).

        Called before every run starts, so it also refuses a malformed ``PTODIST_RANK_PREFIX`` here, before
        the ranks (which read it) exist.
        """
        rank_prefix_setting()
        key = f"{self.platform}->{backend}"
        if key not in _announced:
            _announced.add(key)
            where = "the local" if local else "ptodist's"
            notice(f"platform '{self.platform}' runs on {where} '{backend}' backend (no NPU needed)")

    def any_dfx_enabled(self) -> bool:
        """Whether a diagnostic output is on (swimlane, tensor dump, PMU, dependency graph, scope stats), by this
        config or by ``PTODIST_DFX``."""
        cfg = self.with_dfx_setting()
        return bool(cfg.enable_chip_swimlane or cfg.enable_dump_args or cfg.enable_pmu or cfg.enable_dep_gen
                    or cfg.enable_scope_stats)

    def with_dfx_setting(self) -> RunConfig:
        """This config with the diagnostic outputs ``PTODIST_DFX`` names turned on as well (itself if none is added).

        The environment only adds: an output the config turns on stays on (a flag left ``False`` cannot be told
        from one set ``False``), so the script's setting and the environment's are combined.
        """
        kinds = dfx_setting()
        if not kinds:
            return self
        changes = {flag: 1 if flag == "enable_dump_args" else True
                   for name, flag in DFX_KINDS.items() if name in kinds and not getattr(self, flag)}
        return replace(self, **changes) if changes else self

    # PyPTO's current names of two DFX flags: the same settings as enable_chip_swimlane / enable_dump_args.
    @property
    def enable_l2_swimlane(self) -> bool:
        return self.enable_chip_swimlane

    @enable_l2_swimlane.setter
    def enable_l2_swimlane(self, value) -> None:
        self.enable_chip_swimlane = value

    @property
    def enable_dump_tensor(self) -> int:
        return self.enable_dump_args

    @enable_dump_tensor.setter
    def enable_dump_tensor(self, value) -> None:
        self.enable_dump_args = value


_UPSTREAM_NAMES = {"enable_l2_swimlane": "enable_chip_swimlane", "enable_dump_tensor": "enable_dump_args"}
_dataclass_init = RunConfig.__init__


@functools.wraps(_dataclass_init)
def _run_config_init(self, *args, **kwargs):
    """RunConfig(...), also taking PyPTO's names enable_l2_swimlane= and enable_dump_tensor=."""
    for alias, name in _UPSTREAM_NAMES.items():
        if alias in kwargs:
            value = kwargs.pop(alias)
            if name in kwargs and kwargs[name] != value:
                raise ConfigError(f"RunConfig({alias}={value!r}, {name}={kwargs[name]!r}): both name one setting "
                                  f"({alias} is PyPTO's name of {name}); give one of them")
            kwargs[name] = value
    _dataclass_init(self, *args, **kwargs)


RunConfig.__init__ = _run_config_init
