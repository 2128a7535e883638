"""Diagnostic outputs (DFX): readers of the per-rank event log.

``RunConfig(enable_chip_swimlane=True)`` → per rank and dispatch
``<output_dir>/dfx_outputs/rank{r}/d{k}/chip_swimlane_records.json`` and, per
run, ``<output_dir>/dfx_outputs/merged_swimlane_<timestamp>.json`` (Chrome trace
/ Perfetto); ``enable_dep_gen`` → ``deps.json``; ``enable_scope_stats`` →
``scope_stats/scope_stats.jsonl``.  Ranks write their own files when their
dispatch ends; the driver merges the swimlanes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BUILD_TIME_SWITCHES = ("SIMPLER_HOST_STRACE", "SIMPLER_DFX")
_told: set[str] = set()


@dataclass(frozen=True)
class DfxRequest:
    """Which diagnostic outputs one dispatch writes, and where."""

    root: Path          # <output_dir>/dfx_outputs
    dispatch: int       # k in d{k}: the index of this call of the compiled program
    swimlane: bool
    deps: bool
    scope_stats: bool
    device_markers: bool = True  # SIMPLER_DEVICE_STRACE_ENABLE=0 turns off per-operation slices

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}" / f"d{self.dispatch}"


def request_for(config, output_dir: Callable[[], Path], dispatch: int) -> DfxRequest | None:
    """Return what ``config`` asks for, or None when no diagnostic output is enabled.

    ``output_dir`` is called only when something is enabled (it creates the directory).
    """
    notice_build_time_switches()
    if not (config.enable_chip_swimlane or config.enable_dep_gen or config.enable_scope_stats):
        return None
    return DfxRequest(Path(output_dir()) / "dfx_outputs", dispatch, bool(config.enable_chip_swimlane),
                      bool(config.enable_dep_gen), bool(config.enable_scope_stats),
                      os.environ.get("SIMPLER_DEVICE_STRACE_ENABLE", "1") != "0")


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


def finish_run(request: DfxRequest, world: int, device_ids: list[int]) -> Path | None:
    """In the driver, after the ranks ended: merge the swimlanes; return the merged trace's path."""
    if not request.swimlane:
        return None
    from . import swimlane

    return swimlane.merge(request, world, device_ids)
