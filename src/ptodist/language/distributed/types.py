"""Distributed enums and the communication context."""

from __future__ import annotations

from enum import Enum, IntEnum

from ...errors import OperationTypeError
from ...source import user_location
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


class AtomicType(IntEnum):
    """How a store combines with its destination: overwrite (``None_``) or atomically add (``Add``).

    One type for ``pl.store`` / ``pl.assemble`` and for the remote writes of ``pld`` (``pl.AtomicType`` is
    ``pld.AtomicType``); an int, as upstream's (``int(pl.AtomicType.Add) == 1``).
    """

    None_ = 0
    Add = 1


def atomic_type(value, op: str) -> AtomicType:
    """``value`` as an :class:`AtomicType` (``None`` and the ints 0 and 1 too); anything else is an error.

    A mode that is neither would otherwise read as a plain store: a silent wrong sum.
    """
    if value is None:
        return AtomicType.None_
    if isinstance(value, AtomicType):
        return value
    if type(value) is int and value in (0, 1):
        return AtomicType(value)
    raise OperationTypeError(f"{op} at {user_location(2)}: atomic={value!r} is not an atomic mode; pass "
                             "atomic=pl.AtomicType.Add to add into the destination, or "
                             "pl.AtomicType.None_ (the default) to overwrite it")


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


class AsyncSession:
    """``pld.system.async_session()``: the SDMA session a kernel issues ``pld.tensor.put_async`` transfers on
    (``pl.AsyncSession``); ``sync_id`` and ``block_bytes`` are the device's session settings."""

    __slots__ = ("sync_id", "block_bytes", "task", "where")

    def __init__(self, sync_id: int, block_bytes: int, task, where: str):
        self.sync_id = sync_id
        self.block_bytes = block_bytes
        self.task = task  # the id of the task that built it
        self.where = where

    def __repr__(self) -> str:
        return f"AsyncSession(sync_id={self.sync_id}, block_bytes={self.block_bytes})"


class AsyncEvent:
    """The completion handle of one ``pld.tensor.put_async`` transfer (``pl.AsyncEvent``); drained by
    ``pld.system.wait_async_event(event, session)``.  ``transfer`` is the rank's record of it, None once drained."""

    __slots__ = ("session", "where", "transfer")

    def __init__(self, session: AsyncSession, where: str, transfer):
        self.session = session
        self.where = where
        self.transfer = transfer

    def __repr__(self) -> str:
        return f"AsyncEvent(put_async at {self.where}, {'pending' if self.transfer is not None else 'drained'})"
