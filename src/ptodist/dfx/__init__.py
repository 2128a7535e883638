"""Diagnostic outputs (DFX): readers of the per-rank event log.

A program's outputs go where PyPTO puts them, ``<output_dir>/dfx_outputs/``: ``RunConfig(enable_chip_swimlane=True)``
→ per rank and dispatch ``rank{r}/d{k}/chip_swimlane_records.json`` and, per dispatch,
``merged_swimlane_<timestamp>.json`` (Chrome trace / Perfetto), and ``deps.json`` too (as in PyPTO, the swimlane
co-enables dep_gen); ``enable_dep_gen`` → ``rank{r}/d{k}/deps.json``; ``enable_scope_stats`` →
``rank{r}/d{k}/scope_stats/scope_stats.jsonl``.  Ranks write their own files when their dispatch ends, or when the
driver stops it (:mod:`.flush`); the driver merges the swimlanes and, when the dispatch ended with an error, writes
``findings_d{k}.json``.  ``ptodist trace DIR [--html FILE]`` (:mod:`.summary`, :mod:`.html`) reads them.

A *run* (the dispatches of one ``CompiledProgram`` object in one process, or in every process of one MPI job)
takes the folder (its process holds an exclusive ``flock`` on the folder's lock file) and first clears what an
earlier run left there (as PyPTO clears stale ``rank*/d{k}`` folders).  In one process the folder passes to the next
run that asks once no dispatch of the holder is in progress; a run that finds it in use (a dispatch writing into it,
or another process holding it) writes beside it, in ``dfx_outputs.2`` (``.3``, ...), and says so on stderr: two
runs never mix files.
Folders of the older ``dfx_outputs/run_<timestamp>_<pid>/`` layout are still read, never cleared.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import LOG_LEVELS, notice
from ..language import dtypes as dt

BUILD_TIME_SWITCHES = ("SIMPLER_HOST_STRACE", "SIMPLER_DFX")
DFX_DIR = "dfx_outputs"
OUTPUTS_DIR = re.compile(r"dfx_outputs(\.\d+)?$")  # dfx_outputs, or dfx_outputs.<n> beside a folder in use
RUN_DIR = re.compile(r"run_\d{8}_\d{6}_\d{6}_\d+(_\d+)?$")  # the older layout: dfx_outputs/run_<stamp>_<pid>[_<n>]
IN_USE = ".ptodist-in-use"  # a run's lock file: an exclusive flock while the run's program lives; holds its pid
_STALE = (re.compile(r"merged_swimlane_.*\.json$"), re.compile(r"findings_d\d+\.json$"))
_RANK = re.compile(r"rank\d+$")
_DISPATCH = re.compile(r"d\d+$")
_told: set[str] = set()
_told_where: set[Path] = set()
_lock = threading.RLock()  # reentrant: a collected program's release may run while it is held
_runs_by_owner: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # owner -> {(pid, output_dir): run}
_runs_by_dir: dict[tuple, Path] = {}  # (pid, output_dir) -> run folder, for callers that name no owner


@dataclass(frozen=True)
class DfxRequest:
    """Which diagnostic outputs one dispatch writes, and where."""

    root: Path          # the run's folder: <output_dir>/dfx_outputs (dfx_outputs.<n> beside one in use)
    dispatch: int       # k in d{k}: the index of this call of the compiled program
    swimlane: bool
    deps: bool
    scope_stats: bool
    device_markers: bool = True  # SIMPLER_DEVICE_STRACE_ENABLE=0 turns off per-operation slices
    dump_args: int = 0  # tensor dumps: 1 the marked tensors (pl.dump_tag, dumps=), 2 every task's tensors

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}" / f"d{self.dispatch}"


def request_for(config, output_dir: Callable[[], Path], dispatch: int, owner=None,
                job: Callable[[], Any] | None = None) -> DfxRequest | None:
    """Return what ``config`` (with what ``PTODIST_DFX`` adds) asks for, or None when no diagnostic output is enabled.

    ``output_dir`` is called only when something is enabled (it creates the directory).  ``owner`` is
    the object whose dispatches make one run (the ``CompiledProgram``): its first request takes the
    run's folder, the later ones reuse it.  Without it, the owner is the object ``output_dir`` reads
    ``.output_dir`` from (``lambda: compiled.output_dir``); failing that, the run is this process's.
    ``job`` (the backend's, ``backends.Capabilities.job``), called only when something is enabled, gives the
    communicator of the processes that each run this dispatch (``Get_rank``, ``bcast``), or None for this process
    alone: they all write into process 0's run folder.
    """
    notice_build_time_switches()
    own, config = config, config.with_dfx_setting()  # PTODIST_DFX (ptodist run --dfx): no need to edit the script
    if not (config.enable_chip_swimlane or config.enable_dep_gen or config.enable_scope_stats
            or config.enable_dump_args):
        return None
    comm = job() if job is not None else None
    root = _run_dir(Path(output_dir()), owner if owner is not None else _owner_of(output_dir), comm)
    if config is not own:
        _tell_where(root, config, comm)
    return DfxRequest(root, dispatch, bool(config.enable_chip_swimlane),
                      # as in PyPTO, the swimlane co-enables dep_gen: a dispatch's trace comes with its task graph
                      bool(config.enable_dep_gen or config.enable_chip_swimlane), bool(config.enable_scope_stats),
                      os.environ.get("SIMPLER_DEVICE_STRACE_ENABLE", "1") != "0", int(config.enable_dump_args))


def _tell_where(root: Path, config, comm) -> None:
    """Say once per run folder where the outputs that ``PTODIST_DFX`` turned on go (the script does not say)."""
    if root in _told_where:
        return
    _told_where.add(root)
    if comm is not None and comm.Get_rank() != 0:  # one line per job: process 0's
        return
    try:
        shown = root.relative_to(Path.cwd())
    except ValueError:
        shown = root
    notice(f"PTODIST_DFX={os.environ.get('PTODIST_DFX', '')}: this run's diagnostic outputs go to {shown}; "
           f"summarise them with: ptodist trace {shown.parent}")


def runs(path) -> list[Path]:
    """The run folders of ``path`` (an output_dir, its ``dfx_outputs`` folder or one beside it), oldest first.

    Folders of the older layout (``dfx_outputs/run_<timestamp>_<pid>``, ordered by that timestamp) come first, then
    ``dfx_outputs`` and the ``dfx_outputs.<n>`` beside it that hold rank folders, by when their run took them.
    """
    p = Path(path)
    out_dir = p.parent if OUTPUTS_DIR.match(p.name) else p
    if not out_dir.is_dir():
        return []
    old = []
    if (out_dir / DFX_DIR).is_dir():
        old = sorted((c for c in (out_dir / DFX_DIR).iterdir() if RUN_DIR.match(c.name) and c.is_dir()),
                     key=lambda c: c.name)
    new = [c for c in out_dir.iterdir() if OUTPUTS_DIR.match(c.name) and c.is_dir() and has_rank_dirs(c)]
    return old + sorted(new, key=_taken_at)


def latest_run(path) -> Path | None:
    """The newest run folder of ``path`` (an output_dir or its ``dfx_outputs`` folder), or None."""
    found = runs(path)
    return found[-1] if found else None


def has_rank_dirs(path: Path) -> bool:
    """Whether ``path`` holds ``rank{r}`` folders (the outputs of one run)."""
    return any(_RANK.match(c.name) and c.is_dir() for c in path.iterdir())


def _taken_at(folder: Path) -> tuple:
    """When a run took ``folder`` (its lock file's last write), then its name."""
    try:
        return (os.stat(folder / IN_USE).st_mtime_ns, _beside_number(folder), folder.name)
    except OSError:
        return (os.stat(folder).st_mtime_ns, _beside_number(folder), folder.name)


def _beside_number(folder: Path) -> int:
    suffix = folder.name[len(DFX_DIR) + 1:]
    return int(suffix) if suffix else 1


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


class _Holder:
    """This process's hold on a run folder: its lock's descriptor, the program whose run it holds, and how many
    of that program's dispatches are writing into it."""

    __slots__ = ("fd", "owner", "active")

    def __init__(self, fd: int, owner):
        self.fd = fd
        self.owner = owner  # a weak reference to the owner, or None: this process's own run
        self.active = 0

    def owned_by(self, owner) -> bool:
        if owner is None:
            return self.owner is None
        return self.owner is not None and self.owner() is owner

    def idle(self) -> bool:
        return self.active == 0 or (self.owner is not None and self.owner() is None)


_holders: dict[Path, _Holder] = {}  # run folder -> this process's hold on it


def _run_dir(out_dir: Path, owner, comm) -> Path:
    """The run folder this owner's next dispatch writes into (its own while it holds one; else taken now).

    ``comm``: the processes that each run the dispatch (an MPI job's), which all take process 0's folder; or None.
    """
    if comm is not None and comm.Get_rank() != 0:  # every process of an MPI job writes where its process 0 does
        name = comm.bcast(None, root=0)
        (out_dir / name).mkdir(parents=True, exist_ok=True)  # processes on other machines
        return out_dir / name
    out_dir = out_dir.resolve()  # one folder, one hold, however the output_dir is spelled
    key = (os.getpid(), out_dir)  # a forked process that dispatches makes its own run
    with _lock:
        try:
            mine = _runs_by_owner.setdefault(owner, {}) if owner is not None else _runs_by_dir
        except TypeError:  # an owner without weak references: one run per process
            owner, mine = None, _runs_by_dir
        run = mine.get(key)
        holder = _holders.get(run) if run is not None else None
        if holder is None or not holder.owned_by(owner):  # its first dispatch, or another run took the folder
            run = mine[key] = _take(out_dir, owner)
            holder = _holders[run]
        holder.active += 1
    if comm is not None:
        comm.bcast(run.name, root=0)
    return run


def _take(out_dir: Path, owner) -> Path:
    """Hold ``dfx_outputs`` (else the first free ``dfx_outputs.<n>``) for ``owner``'s run, cleared of what an
    earlier run left there.  A folder this process holds for a program with no dispatch in progress passes to the
    new run; one a dispatch is writing into, or another process holds, is in use."""
    busy = []
    for n in itertools.count(1):
        folder = out_dir / (DFX_DIR if n == 1 else f"{DFX_DIR}.{n}")
        held = _holders.get(folder)
        if held is not None:
            if not held.idle():
                busy.append((folder, str(os.getpid())))
                continue
            held.owner = _ref(owner, folder)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / IN_USE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy.append((folder, os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"))
                os.close(fd)
                continue
            _holders[folder] = _Holder(fd, _ref(owner, folder))
        fd = _holders[folder].fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it (for the message of a run that finds it busy)
        _clear_stale(folder)
        if busy:
            first, pid = busy[0]
            notice(f"{first} is in use by another run (process {pid}, which is still running); to keep the two "
                   f"runs' files apart this run writes its DFX outputs to {folder} instead. Give runs that overlap "
                   "in time their own output_dir to find the outputs in dfx_outputs/.", LOG_LEVELS["warn"])
        return folder


def _ref(owner, folder: Path):
    """A weak reference to ``owner`` that lets ``folder`` go when the owner is collected with no dispatch active."""
    return weakref.ref(owner, lambda ref: _release(folder, ref)) if owner is not None else None


def _release(folder: Path, ref) -> None:
    with _lock:
        held = _holders.get(folder)
        if held is not None and held.owner is ref and held.active == 0:
            del _holders[folder]
            with contextlib.suppress(OSError):
                os.close(held.fd)


def _dispatch_ended(root: Path) -> None:
    """A dispatch writing into ``root`` ended (``finish_run``): the folder may pass to another run."""
    with _lock:
        held = _holders.get(root)
        if held is not None and held.active > 0:
            held.active -= 1
            if held.active == 0 and held.owner is not None and held.owner() is None:
                _release(root, held.owner)


def _forget_held() -> None:
    """In a forked child (a rank): the run folders are the parent's to hold, and to release."""
    for held in _holders.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _holders.clear()


os.register_at_fork(after_in_child=_forget_held)


def _clear_stale(folder: Path) -> None:
    """Remove what an earlier run wrote in ``folder``: ``rank*/d*`` folders, merged traces, findings files."""
    for child in list(folder.iterdir()):
        if _RANK.match(child.name) and child.is_dir():
            for d in list(child.iterdir()):
                if _DISPATCH.match(d.name) and d.is_dir():
                    shutil.rmtree(d, ignore_errors=True)
            with contextlib.suppress(OSError):
                child.rmdir()  # only when nothing else is left in it
        elif any(p.match(child.name) for p in _STALE) and child.is_file():
            child.unlink(missing_ok=True)


def notice_build_time_switches() -> None:
    """Say once that SIMPLER_HOST_STRACE / SIMPLER_DFX in the environment change nothing."""
    for name in BUILD_TIME_SWITCHES:
        if name in os.environ and name not in _told:
            _told.add(name)
            notice(f"{name} is a build-time switch of the simpler runtime (a C preprocessor macro); setting it in "
                   "the environment changes nothing. Use RunConfig(enable_chip_swimlane=True, enable_dep_gen=True, "
                   "enable_scope_stats=True) for ptodist's diagnostic outputs.", LOG_LEVELS["warn"])


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
            np.save(dump / f"task{d['task_id']}_{d['task']}_{d['arg']}.npy", dt.portable(d["array"]))


def finish_run(request: DfxRequest, world: int, device_ids: list[int],
               error: BaseException | None = None) -> Path | None:
    """In the driver, after the ranks ended: merge the swimlanes; return the merged trace's path.

    When the dispatch ended with an error, also write ``findings_d{k}.json`` in the run's folder.
    The error is ``error``, or else the exception propagating through the caller (backends call
    this in a ``finally``); an exception the caller's callers are handling does not count.
    """
    _dispatch_ended(request.root)
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
