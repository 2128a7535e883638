"""Synchronisation inside a core: ``sync_src`` / ``sync_dst`` (set and wait a flag between two pipes) and the
barriers ``bar_v``, ``bar_m``, ``bar_all`` (``pl.system.*``).

On the device the pipes of a core (DMA in and out, vector, cube, ...) run concurrently and these order them.
Here a core runs one operation at a time and each finishes before the next starts, so every one of them is an
ordering point that already holds: they check their arguments and return.
"""

from __future__ import annotations

import enum

from ...errors import TileTypeError, TileValueError
from .registry import ANY, op

_SYNC = "Synchronization"


class PipeType(enum.Enum):
    """A core's pipes: scalar, vector, cube, the DMA engines (MTE1: L1 -> L0, MTE2: GM -> on-chip, MTE3: on-chip
    -> GM), the fixpipe (FIX: Acc -> out), and all of them."""

    S = 0
    V = 1
    M = 2
    MTE1 = 3
    MTE2 = 4
    MTE3 = 5
    FIX = 6
    ALL = 7


def _flag(name: str, set_pipe, wait_pipe, event_id) -> None:
    for what, pipe in (("set_pipe", set_pipe), ("wait_pipe", wait_pipe)):
        if not isinstance(pipe, PipeType):
            raise TileTypeError(f"pl.system.{name}: {what}={pipe!r} is not a pipe; pass pl.PipeType."
                                f"{{{', '.join(PipeType.__members__)}}}")
    if isinstance(event_id, bool) or not hasattr(event_id, "__index__") or event_id.__index__() < 0:
        raise TileValueError(f"pl.system.{name}: event_id={event_id!r} must be a non-negative integer (the flag "
                             "that pairs a sync_src with its sync_dst)")


@op("sync_src", family=_SYNC, reach="system", dtypes=ANY, levels=())
def sync_src(*, set_pipe: PipeType, wait_pipe: PipeType, event_id: int) -> None:
    """Set flag ``event_id`` from ``set_pipe`` for ``wait_pipe`` (here every earlier operation has finished)."""
    _flag("sync_src", set_pipe, wait_pipe, event_id)


@op("sync_dst", family=_SYNC, reach="system", dtypes=ANY, levels=())
def sync_dst(*, set_pipe: PipeType, wait_pipe: PipeType, event_id: int) -> None:
    """Wait in ``wait_pipe`` for flag ``event_id`` of ``set_pipe`` (here it has always been reached)."""
    _flag("sync_dst", set_pipe, wait_pipe, event_id)


@op("bar_v", family=_SYNC, reach="system", dtypes=ANY, levels=())
def bar_v() -> None:
    """Barrier on the vector pipe: its earlier operations complete first (they have, here)."""


@op("bar_m", family=_SYNC, reach="system", dtypes=ANY, levels=())
def bar_m() -> None:
    """Barrier on the cube pipe: its earlier operations complete first (they have, here)."""


@op("bar_all", family=_SYNC, reach="system", dtypes=ANY, levels=())
def bar_all() -> None:
    """Barrier on every pipe of the core: all earlier operations complete first (they have, here)."""
