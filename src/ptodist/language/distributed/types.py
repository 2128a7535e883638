"""Distributed enums and the communication context."""

from __future__ import annotations

from enum import Enum

from ..types import DistributedTensor  # noqa: F401  (re-exported by pld)


class NotifyOp(Enum):
    """How ``notify`` changes the peer's cell: add atomically, or overwrite."""

    AtomicAdd = 0
    Set = 1


class WaitCmp(Enum):
    """How ``wait`` compares the local cell with ``expected``."""

    Eq = 0
    Ge = 1


class ReduceOp(Enum):
    Sum = 0
    Max = 1
    Min = 2
    Prod = 3


class AtomicType(Enum):
    """Atomic mode of a remote write: plain (``None_``) or accumulate (``Add``)."""

    None_ = 0
    Add = 1


class CommCtxType(Enum):
    WORLD = 0


class CommCtx:
    """The communication context of a window: its comm domain's rank count and this rank's index in it."""

    __slots__ = ("world", "rank_index")

    def __init__(self, world: int, rank_index: int):
        self.world = world
        self.rank_index = rank_index

    def __repr__(self) -> str:
        return f"CommCtx(rank={self.rank_index}, nranks={self.world})"
