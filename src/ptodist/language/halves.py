"""The halves of a running core group and what they share: the rings of its pipes, their set-ups, its
reserved buffers, its barrier and gather counts.

A mixed kernel runs as one AIC (cube) half and ``lanes`` AIV (vector) halves.  The scheduler that runs
them (:mod:`ptodist.language.core_group`, or a ``pl.split_aiv`` region's lane group) keeps a
:class:`GroupState`; the cross-core ops (:mod:`ptodist.language.ops.pipes`) find the half that calls them
with :func:`current_half` and act on its group's state.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import context
from .tile_ops import Tile

DIRS = {"C2V": "cube->vector", "V2C": "vector->cube"}


# -- the running half -----------------------------------------------------------------------------------
@dataclass(eq=False)
class Pending:
    """What a blocked half waits in: for the deadlock report."""

    op: str
    site: str
    what: Callable[[], str]  # the pipe (or buffer) and why it cannot go on, said when asked
    pop: bool = False  # a pop: without a producer left it can never be satisfied
    pipe: object = None  # the pipe a push or pop waits on


@dataclass(eq=False)
class Half:
    """One half of a running core group: the cube (``role="AIC"``) or vector lane ``lane`` (``"AIV"``)."""

    group: object  # the scheduler: ``wait_until(half, ready, pending)`` and ``state`` (a GroupState)
    role: str
    lane: int
    name: str  # the function it runs
    pending: Pending | None = None
    ready: object = None  # the condition it waits for (a callable), while pending
    done: bool = False

    @property
    def label(self) -> str:
        where = "AIC (cube)" if self.role == "AIC" else f"AIV lane {self.lane} (vector)"
        return f"{where} '{self.name}'"


_running = threading.local()


def enter_half(half: Half | None) -> None:
    """Make ``half`` the half the calling thread runs (None: none)."""
    _running.half = half


def current_half() -> Half | None:
    """The core-group half the calling thread runs, or None outside a mixed kernel."""
    return getattr(_running, "half", None)



# -- the shared state ------------------------------------------------------------------------------------
@dataclass(eq=False)
class Slot:
    tile: Tile
    split: int
    site: str
    order: object = None  # under ptodist check: the pushing half's point, which the pop is ordered after


def hb_token():
    """Under ``ptodist check``: a token for where the running half is now (see ``RankContext.hb_release``)."""
    release = getattr(context.current(), "hb_release", None)
    return release() if release is not None else None


def hb_order(tokens) -> None:
    """Under ``ptodist check``: order the running half after the points ``tokens`` mark."""
    tokens = [t for t in tokens if t is not None]
    if tokens:
        context.current().hb_acquire(tokens)


@dataclass(eq=False)
class Ring:
    """One lane's ring of one pipe: filled slots in order, then the popped ones not yet released."""

    ready: deque = field(default_factory=deque)
    held: list = field(default_factory=list)  # (tile popped, pop site)
    freed: list = field(default_factory=list)  # under ptodist check: the frees the producer's next push follows

    @property
    def taken(self) -> int:
        return len(self.ready) + len(self.held)


@dataclass(eq=False)
class Pipe:
    direction: str  # "C2V" or "V2C"
    id: int
    rings: list
    pushes: int = 0  # pushes by the producer side, for the reports
    joined: list = field(default_factory=list)  # V2C: (tile the cube popped, [lane tiles], site)

    @property
    def desc(self) -> str:
        return f"pipe {self.id} ({DIRS[self.direction]})"


@dataclass
class PipeSetup:
    dir_mask: int
    slot_size: int
    slot_num: int | None
    local_slot_num: int | None
    site: str

    @property
    def depth(self) -> int:
        if self.slot_num is not None:
            return self.slot_num
        return 4 if self.dir_mask == 3 else 8


class GroupState:
    """What the halves of one running core group share."""

    def __init__(self, lanes: int, split: int | None = None, slot_num: int | None = None):
        self.lanes = lanes
        self.split = split  # the split mode of the enclosing split region (aiv_shard/aic_gather); None: none
        self.slot_num = slot_num  # ring depth of a pipe set up without slot_num (pl.cross_core_slot); None: 8
        self.barriers: dict[tuple[str, int], int] = {}  # (role, lane) -> syncall barriers it has passed
        self.pipes: dict[tuple[str, int], Pipe] = {}
        self.setups: dict[int, dict[tuple[str, int], PipeSetup]] = {}  # id -> (role, lane) -> set-up
        self.buffers: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}  # (fn, name) -> lane -> (size, base)
        self.next_base: dict[tuple[str, int], int] = {}
        self.gathers: dict[int, dict[int, Tile]] = {}
        self.gather_count = [0] * lanes
        self.meetings: dict[tuple, list] = {}  # under ptodist check: (barrier or gather, number) -> arrivals' tokens

    def pipe(self, direction: str, pid: int) -> Pipe:
        p = self.pipes.get((direction, pid))
        if p is None:
            p = self.pipes[(direction, pid)] = Pipe(direction, pid, [Ring() for _ in range(self.lanes)])
        return p

    def setup(self, pid: int) -> PipeSetup | None:
        s = self.setups.get(pid)
        return next(iter(s.values())) if s else None

    def depth(self, pid: int) -> int:
        s = self.setup(pid)
        return s.depth if s is not None else (self.slot_num or 8)

    def leftovers(self) -> str | None:
        """Why the kernel cannot end as it is (a push never popped, a pop never released), or None."""
        for p in self.pipes.values():
            push, pop, free = (("tpush_to_aiv", "tpop_from_aic", "tfree_to_aic") if p.direction == "C2V"
                               else ("tpush_to_aic", "tpop_from_aiv", "tfree_to_aiv"))
            for lane, ring in enumerate(p.rings):
                if ring.ready:
                    s = ring.ready[0]
                    return (f"pl.{push} at {s.site}: {len(ring.ready)} tile(s) pushed on {p.desc} for AIV lane {lane} "
                            f"were never popped; the kernel ended with them in the ring. Pop each one with "
                            f"pl.{pop} on the other side, or push fewer.")
                if ring.held and p.direction == "C2V":
                    return (f"pl.{pop} at {ring.held[0][1]}: {len(ring.held)} tile(s) popped from {p.desc} on AIV "
                            f"lane {lane} were never released; the kernel ended holding their slots. Call "
                            f"pl.{free}(tile) once each popped tile is consumed.")
            if p.joined:
                return (f"pl.{pop} at {p.joined[0][2]}: {len(p.joined)} tile(s) popped from {p.desc} were never "
                        f"released; the kernel ended holding their slots. Call pl.{free}(tile) once each popped "
                        "tile is consumed.")
        return None
