"""Diagnostic outputs (DFX): readers of the per-rank event log.

Each run gets its own folder, ``<output_dir>/dfx_outputs/run_<timestamp>_<pid>/`` (a run: the
dispatches of one ``CompiledProgram`` object in one process, or in every process of one MPI job), so
runs that share an ``output_dir`` — one after the other or at the same time — never read or replace
each other's files.  In it, ``RunConfig(enable_chip_swimlane=True)`` → per rank and dispatch
``rank{r}/d{k}/chip_swimlane_records.json`` and, per dispatch, ``merged_swimlane_<timestamp>.json``
(Chrome trace / Perfetto), and ``deps.json`` too (as in PyPTO, the swimlane co-enables dep_gen);
``enable_dep_gen`` → ``rank{r}/d{k}/deps.json``; ``enable_scope_stats`` →
``rank{r}/d{k}/scope_stats/scope_stats.jsonl``.  Ranks write their own files when their dispatch
ends, or when the driver stops it (:mod:`.flush`); the driver merges the swimlanes and, when the
dispatch ended with an error, writes ``findings_d{k}.json``.  ``ptodist trace DIR [--html FILE]``
(:mod:`.summary`, :mod:`.html`) reads them.
"""

from __future__ import annotations

import datetime
import itertools
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BUILD_TIME_SWITCHES = ("SIMPLER_HOST_STRACE", "SIMPLER_DFX")
DFX_DIR = "dfx_outputs"
RUN_DIR = re.compile(r"run_\d{8}_\d{6}_\d{6}_\d+(_\d+)?$")  # run_<YYYYmmdd_HHMMSS_ffffff>_<pid>[_<n>]
_told: set[str] = set()
_lock = threading.Lock()
_runs_by_owner: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # owner -> {(pid, dfx_outputs): run}
_runs_by_dir: dict[tuple, Path] = {}  # (pid, dfx_outputs) -> run folder, for callers that name no owner


@dataclass(frozen=True)
class DfxRequest:
    """Which diagnostic outputs one dispatch writes, and where."""

    root: Path          # the run's folder: <output_dir>/dfx_outputs/run_<timestamp>_<pid>
    dispatch: int       # k in d{k}: the index of this call of the compiled program
    swimlane: bool
    deps: bool
    scope_stats: bool
    device_markers: bool = True  # SIMPLER_DEVICE_STRACE_ENABLE=0 turns off per-operation slices
    dump_args: int = 0  # tensor dumps: 1 the marked tensors (pl.dump_tag, dumps=), 2 every task's tensors

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}" / f"d{self.dispatch}"


def request_for(config, output_dir: Callable[[], Path], dispatch: int, owner=None) -> DfxRequest | None:
    """Return what ``config`` asks for, or None when no diagnostic output is enabled.

    ``output_dir`` is called only when something is enabled (it creates the directory).  ``owner`` is
    the object whose dispatches make one run (the ``CompiledProgram``): its first request makes the
    run's folder, the later ones reuse it.  Without it, the owner is the object ``output_dir`` reads
    ``.output_dir`` from (``lambda: compiled.output_dir``); failing that, the run is this process's.
    """
    notice_build_time_switches()
    if not (config.enable_chip_swimlane or config.enable_dep_gen or config.enable_scope_stats
            or config.enable_dump_args):
        return None
    base = Path(output_dir()) / DFX_DIR
    return DfxRequest(_run_dir(base, owner if owner is not None else _owner_of(output_dir), config), dispatch,
                      bool(config.enable_chip_swimlane),
                      # as in PyPTO, the swimlane co-enables dep_gen: a dispatch's trace comes with its task graph
                      bool(config.enable_dep_gen or config.enable_chip_swimlane), bool(config.enable_scope_stats),
                      os.environ.get("SIMPLER_DEVICE_STRACE_ENABLE", "1") != "0", int(config.enable_dump_args))


def runs(path) -> list[Path]:
    """The run folders under ``path`` (an output_dir or its ``dfx_outputs`` folder), oldest first.

    Runs are ordered by the time their first dispatch asked for DFX outputs (the name's timestamp).
    """
    p = Path(path)
    base = p / DFX_DIR if (p / DFX_DIR).is_dir() else p
    if not base.is_dir():
        return []
    return sorted((c for c in base.iterdir() if RUN_DIR.match(c.name) and c.is_dir()), key=lambda c: c.name)


def latest_run(path) -> Path | None:
    """The newest run folder under ``path`` (an output_dir or its ``dfx_outputs`` folder), or None."""
    found = runs(path)
    return found[-1] if found else None


def _owner_of(output_dir: Callable[[], Path]):
    """The object that ``lambda: compiled.output_dir`` reads: the one whose dispatches make a run."""
    for cell in getattr(output_dir, "__closure__", None) or ():
        try:
            obj = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(getattr(type(obj), "output_dir", None), property):
            return obj
    return None


def _run_dir(base: Path, owner, config) -> Path:
    """This owner's run folder under ``base`` (made at its first request)."""
    key = (os.getpid(), base.resolve())  # a forked process that dispatches makes its own run
    with _lock:
        try:
            mine = _runs_by_owner.setdefault(owner, {}) if owner is not None else _runs_by_dir
        except TypeError:  # an owner without weak references: one run per process
            mine = _runs_by_dir
        run = mine.get(key)
        if run is None:
            run = mine[key] = _new_run(base, config)
        return run


def _new_run(base: Path, config) -> Path:
    """Make a new run folder under ``base``; every process of an MPI job gets the same one."""
    comm = _mpi_comm(config)
    name = None
    if comm is None or comm.Get_rank() == 0:
        base.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S_%f")
        first = f"run_{stamp}_{os.getpid()}"
        for n in itertools.count(1):
            name = first if n == 1 else f"{first}_{n}"
            try:
                (base / name).mkdir()  # exclusive: a folder some other run made is never shared
                break
            except FileExistsError:
                continue
    if comm is not None:
        name = comm.bcast(name, root=0)
        (base / name).mkdir(parents=True, exist_ok=True)  # processes on other machines
    return base / name


def _mpi_comm(config):
    """ptodist's MPI communicator when this dispatch runs on the mpi backend with more than one process."""
    try:
        from ..backends import name_for

        if name_for(config) != "mpi":
            return None
    except Exception:  # noqa: BLE001 - a bad PTODIST_BACKEND is reported by the run itself
        return None
    from ..backends import mpi

    comm = mpi.job_communicator()
    return comm if comm is not None and comm.Get_size() > 1 else None


def notice_build_time_switches() -> None:
    """Say once that SIMPLER_HOST_STRACE / SIMPLER_DFX in the environment change nothing."""
    for name in BUILD_TIME_SWITCHES:
        if name in os.environ and name not in _told:
            _told.add(name)
            print(f"ptodist: {name} is a build-time switch of the simpler runtime (a C preprocessor macro); "
                  "setting it in the environment changes nothing. Use RunConfig(enable_chip_swimlane=True, "
                  "enable_dep_gen=True, enable_scope_stats=True) for ptodist's diagnostic outputs.", file=sys.stderr)


def write_rank_outputs(log, request: DfxRequest) -> None:
    """In a rank, at the end of its dispatch: write the files this rank owns."""
    from . import deps, scope_stats, swimlane

    out = request.rank_dir(log.rank)
    out.mkdir(parents=True, exist_ok=True)
    if request.swimlane:
        swimlane.write_records(log, out, request.device_markers)
    if request.deps:
        deps.write(log, out)
    if request.scope_stats:
        scope_stats.write(log, out)
    if log.dumps:
        dump = out / "dump"
        dump.mkdir(exist_ok=True)
        for d in log.dumps:  # the tensors as the task left them: task<id>_<task>_<argument>.npy
            np.save(dump / f"task{d['task_id']}_{d['task']}_{d['arg']}.npy", d["array"])


def finish_run(request: DfxRequest, world: int, device_ids: list[int],
               error: BaseException | None = None) -> Path | None:
    """In the driver, after the ranks ended: merge the swimlanes; return the merged trace's path.

    When the dispatch ended with an error, also write ``findings_d{k}.json`` in the run's folder.
    The error is ``error``, or else the exception propagating through the caller (backends call
    this in a ``finally``); an exception the caller's callers are handling does not count.
    """
    if error is None:
        error = _propagating(sys._getframe(1))
    if error is not None:
        write_findings(request, error)
    if not request.swimlane:
        return None
    from . import swimlane

    return swimlane.merge(request, world, device_ids)


FINDINGS = "findings_d{dispatch}.json"


def _propagating(frame) -> BaseException | None:
    """The exception now passing through (or handled in) ``frame``, or None."""
    exc = sys.exc_info()[1]
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        if tb.tb_frame is frame:
            return exc
        tb = tb.tb_next
    return None


def findings_document(request: DfxRequest, error: BaseException) -> dict:
    """What ``findings_d{k}.json`` holds for a dispatch that ended with ``error``."""
    from ..check import findings

    interrupted = not isinstance(error, Exception)  # KeyboardInterrupt, SIGTERM under ptodist run, ...
    try:
        found = [] if interrupted else [f.to_json() for f in findings.from_exception(error)]
    except Exception:  # noqa: BLE001 - the error itself still goes in the file
        found = []
    return {"dispatch": request.dispatch, "status": "interrupted" if interrupted else "error",
            "error": type(error).__name__, "message": str(error), "findings": found}


def write_findings(request: DfxRequest, error: BaseException) -> Path | None:
    """Write ``findings_d{k}.json`` for a dispatch that ended with ``error``; never raises."""
    import json

    from .swimlane import _write_atomically

    try:
        path = request.root / FINDINGS.format(dispatch=request.dispatch)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, json.dumps(findings_document(request, error), indent=1) + "\n")
        return path
    except Exception:  # noqa: BLE001 - the run's own error is the one to report
        return None
