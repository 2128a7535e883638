"""The exception hierarchy.

Every error a user can cause derives from :class:`PtodistError` and, where a
user would naturally catch a builtin (``TypeError``, ``ValueError``), from that
builtin too.  :class:`PtodistInternalError` is kept apart: it means a bug in
ptodist itself, never a mistake in the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class PtodistError(Exception):
    """Base of every error ptodist raises on purpose.

    ``kind`` is the finding kind reports use (``ptodist.check.findings``) and
    ``pitfall`` the SPEC §8 row it matches, when one does.
    """

    kind = "invalid_argument"
    pitfall: str | None = None
    fix: str | None = None  # a fix specific to this class (or, set on the instance, to this error's cause);
    # reports fall back to one per kind
    locations: list[str] | None = None  # set on an instance: the user's ``file:line``s, root cause first


class ProgramError(PtodistError):
    """The program is wrong, found before any rank starts (types, shapes, plan)."""


class ProgramTypeError(ProgramError, TypeError):
    """A value's kind does not match its annotation (e.g. a window given to a ``pl.Tensor``)."""

    kind = "type_mismatch"  # the pitfall is the instance's: only a window/tensor mix-up is step 03


# The SPEC §8 row of a window where a tensor is declared, or a plain tensor where a window is needed.
WINDOW_KIND_PITFALL = "8.3 step 03"
# What a notify's op= takes, for errors about it.
NOTIFY_OP_FIX = ("Pass op=pld.NotifyOp.AtomicAdd (add the value to the cell: the choice for a cell several ranks "
                 "notify, waited on with pld.WaitCmp.Ge) or op=pld.NotifyOp.Set (overwrite the cell: one writer).")


def classified(exc: PtodistError, fix: str | None = None, locations: list[str] | None = None, *,
               kind: str | None = None, pitfall: str | None = None) -> PtodistError:
    """``exc`` with the fix, user lines (root cause first), finding kind and SPEC §8 row of its cause, where
    they are not its class's."""
    if fix is not None:
        exc.fix = fix
    if locations is not None:
        exc.locations = locations
    if kind is not None:
        exc.kind = kind
    if pitfall is not None:
        exc.pitfall = pitfall
    return exc


class ProgramValueError(ProgramError, ValueError):
    """A value is outside what the program allows (shapes, ranges, sizes)."""


class ProgramIndexError(ProgramError, IndexError):
    """An index in the host orchestrator is outside its tensor (e.g. ``x[r]`` past the rank count)."""


class ProgramSyntaxError(ProgramError, SyntaxError):
    """Program text (``pl.parse``, ``pl.loads``) does not compile, or failed while it was being defined."""


class ShapeError(ProgramValueError):
    """An argument's shape does not match its annotation."""

    kind = "shape_mismatch"
    pitfall = "8.1 shape mismatch at compile time; 8.3 step 07"


class DispatchCoverageError(ProgramValueError):
    """The dispatch loop does not cover every rank, or ``device=`` is outside ``[0, world)``."""

    kind = "dispatch_coverage"
    pitfall = "8.2 dispatch loop trip count != len(device_ids)"


class WindowTooSmallError(ProgramValueError):
    """A window view is larger than its buffer."""

    kind = "window_too_small"
    pitfall = "8.2 alloc_window_buffer(NR)"


class RankIdentityError(ProgramError):
    """``pld.rank``/``pld.nranks`` read outside a kernel, where every rank would see the same value."""

    pitfall = "8.3 step 02"
    fix = ("Read rank identity inside a kernel with pld.rank(pld.get_comm_ctx(window)), or pass the host loop "
           "variable r as a scalar argument.")


class CollectiveInLoopError(ProgramError):
    """A host allreduce without a signal is called inside a loop."""

    kind = "collective_in_loop"
    pitfall = "8.1 allreduce rejected in a loop"


class SignalLayoutError(ProgramValueError):
    """A collective's signal does not match its mode, or one signal window serves two layouts."""

    kind = "signal_layout"
    pitfall = "8.3 steps 11, 16"


class AliasingError(ProgramValueError):
    """One window is used as two operands that must be distinct (source and result, signal and data)."""

    kind = "aliasing"
    pitfall = "8.3 step 15"


class TaskArgsError(ProgramTypeError):
    """A function takes a tensor parameter after a scalar one."""

    kind = "task_args_order"
    pitfall = "8.2 scalar before tensor; 8.3 step 01"


class DeclarationError(ProgramError, TypeError):
    """A program function is declared wrong: a malformed annotation (``pl.Tensor[[4], "x"]``) or decorator."""


class DispatchError(PtodistError):
    """The arguments given at dispatch cannot be used."""


class DispatchTypeError(DispatchError, TypeError):
    """A dispatch argument has the wrong type (e.g. a host tensor not in shared memory)."""


class NotSharedError(DispatchTypeError):
    """A host tensor given to a DistributedWorker is not in shared memory, so its ranks cannot see it."""

    kind = "not_shared"
    pitfall = "8.1 TypeError at dispatch; 8.2 missing .share_memory_()"
    fix = ("Share the tensor (tensor.share_memory_() for torch, ptodist.shared_array(...) for numpy), or copy it "
           "to the worker with rt.alloc_tensor(..., init=tensor) / rt.copy_to and pass the DeviceTensor.")


class DispatchIndexError(DispatchError, IndexError):
    """An index given to a dispatch API is out of range (a shard of a stacked tensor)."""


class DispatchStateError(DispatchError, RuntimeError):
    """A DistributedWorker's dispatch refused: Python state its program reads changed since ``prepare()``
    started the ranks, so the ranks would compute with values the driver no longer has."""

    kind = "state_changed"


class DispatchValueError(DispatchError, ValueError):
    """A dispatch argument has the wrong shape, dtype or value."""


class ConfigError(PtodistError, ValueError):
    """A setting is invalid: a ``RunConfig``/``DistributedConfig`` field, an API option or an environment value."""


class ApiTypeError(PtodistError, TypeError):
    """A ptodist API function got an argument of the wrong kind (``ptodist.testing.check(42)``)."""


class OperationTypeError(PtodistError, TypeError):
    """A ``pl`` operation got an argument of the wrong kind (``pl.range(2.5)``, a float Scalar as an index)."""


class UnknownNameError(PtodistError, AttributeError):
    """A name the language's modules lack (``pl.laod``); the message names the near ones (``pl.load``)."""

    kind = "unknown_name"


class OperationValueError(PtodistError, ValueError):
    """A ``pl`` operation got a value it cannot use (``pl.yield_`` with more values than the loop carries)."""


class UsageError(PtodistError, RuntimeError):
    """An API used in a state that does not allow it: a closed or broken worker, a call from inside a
    sub-worker callback that cannot work there, a second ``ptodist check`` session in one process."""


class BuildError(PtodistError, ValueError):
    """A build folder (a compiled program's output_dir) that cannot be loaded: not one ptodist wrote, unreadable,
    or made from source that changed since."""


class BuildNotFoundError(PtodistError, FileNotFoundError):
    """``from_dir`` was given a folder without the build's meta file."""


class ResourceError(PtodistError, OSError):
    """The machine cannot give the run what it needs (memory for its windows, files for its ranks)."""

    kind = "resource"


class KernelError(PtodistError):
    """An operation inside a rank failed (bounds, peer range, signal misuse)."""


class KernelValueError(KernelError, ValueError):
    """An operation inside a rank got a value outside its range."""


class KernelDeadlockError(KernelValueError):
    """The halves of a mixed kernel (its cube and vector lanes) wait for one another and none can go on.

    A deadlock, reported as a hang (kind ``hang``): ``locations`` put the line that causes it first (the pop
    whose tile is never freed, the push that outnumbers the pops) and ``fix`` says what to change there.
    """

    kind = "hang"
    pitfall = "8.1 all ranks hang"


class KernelIndexError(KernelError, IndexError):
    """A tile or RMA region lies outside its tensor or window."""

    kind = "out_of_bounds"


class PeerRangeError(KernelValueError):
    """A ``peer`` argument is outside ``[0, world)``."""

    kind = "peer_out_of_range"
    pitfall = "8.3 step 10"


class KernelStateError(KernelError, RuntimeError):
    """A rank's code changed Python state the program reads (a module global, a closure cell, a global random
    generator): the next dispatch would see it on some backends and not on others."""

    kind = "state_changed"


class TileTypeError(KernelError, TypeError):
    """A tile operation got an operand of the wrong kind (a tensor not loaded with ``pl.load``)."""


class TileValueError(KernelValueError):
    """A tile operation got operands that do not fit (shapes that do not broadcast, a bad cast mode)."""


class TileIndexError(KernelIndexError):
    """A region of a tile outside the tile (``pl.slice`` of a tile)."""


class RankDiedError(PtodistError, RuntimeError):
    """A rank process ended without reporting (``os._exit``, a native crash, a kill): the ``original`` of its
    :class:`RankError`, whose ``fix`` fits how it died, where that is known."""

    kind = "rank_died"


@dataclass
class RankFailure:
    """One rank's failure, as reported back to the driver."""

    rank: int
    device_id: int
    task: str | None
    error_type: str
    message: str
    traceback: str
    exception: BaseException | None = field(default=None, repr=False)
    # True when the exception is a bug in ptodist (raised in ptodist's own code, not on purpose; see
    # ``ptodist.rank.failures.ptodist_bug``); ``traceback`` then keeps ptodist's frames.
    internal: bool = False
    # True when the rank's code also changed Python state the program reads (``compiler.state``): the rank's
    # state is no longer the driver's, so ranks that live on (a worker's) must run nothing more.
    state_changed: bool = False


# Said under every failure that is a bug in ptodist rather than in the program.
INTERNAL_NOTE = ("This is a bug in ptodist, not in your program: the exception was raised inside ptodist without "
                 "ptodist meaning to raise it. Please report it, with the traceback below.")


class RankError(PtodistError):
    kind = "rank_error"

    """A rank raised or died; the run was stopped.

    Attributes:
        rank, device_id, task: where the first failure happened.
        failures: every rank failure that arrived before the others were stopped.
        original: the exception raised inside the rank, when it could be carried back.
        internal: True when a failure is a bug in ptodist; the error is then a :class:`RankInternalError`,
            which is also a :class:`PtodistInternalError`.
    """

    def __new__(cls, failures=(), *args, **kwargs):
        # Whoever reports the failures (every backend's driver) makes a RankError; one that carries a bug
        # in ptodist becomes a RankInternalError, so that it is caught as a PtodistInternalError too.
        if cls is RankError and any(getattr(f, "internal", False) for f in failures or ()):
            cls = RankInternalError
        return super().__new__(cls, failures, *args, **kwargs)

    def __init__(self, failures: list[RankFailure]):
        self.failures = failures
        first = failures[0]
        self.rank = first.rank
        self.device_id = first.device_id
        self.task = first.task
        self.original = first.exception
        self.internal = any(getattr(f, "internal", False) for f in failures)
        super().__init__(_format_failures(failures))


def _format_failures(failures: list[RankFailure]) -> str:
    # Ranks that failed the same way are reported once, as a group.
    groups: dict[tuple[str, str], list[RankFailure]] = {}
    for f in failures:
        groups.setdefault((f.error_type, _strip_rank(f)), []).append(f)
    parts = []
    for (etype, _), members in groups.items():
        f = members[0]
        who = ", ".join(f"rank {m.rank} (device {m.device_id})" for m in members)
        where = f" in task '{f.task}'" if f.task else ""
        parts.append(f"{who} failed{where}: {etype}: {f.message}")
        if getattr(f, "internal", False):
            parts.append(INTERNAL_NOTE)
        if f.traceback:
            parts.append(f"--- traceback of rank {f.rank} ---\n{f.traceback.rstrip()}")
    return "\n".join(parts)


def _strip_rank(f: RankFailure) -> str:
    return f.message.replace(f"rank {f.rank}", "rank ?")


class HangError(PtodistError):
    kind = "hang"
    pitfall = "8.1 all ranks hang"

    """Ranks stopped making progress; carries every rank's state.

    Attributes:
        ranks: one dict per rank (state, wait cell, expected/current value, source line).
        certain: True when every unfinished rank was blocked and no cell could change.
    """

    def __init__(self, message: str, ranks: list[dict], certain: bool, diagnosis: dict | None = None):
        self.ranks = ranks
        self.certain = certain
        # From check.hang.diagnose_hang: "kind" (hang or set_clobber), "cause", "culprits" (file:line), "cycle".
        self.diagnosis = diagnosis or {}
        super().__init__(message)


class CheckError(PtodistError):
    """The checker (``ptodist check``) found problems in a dispatch; ``findings`` lists them."""

    kind = "race"

    def __init__(self, message: str, findings=()):
        self.findings = list(findings)
        super().__init__(message)


class PitfallWarning(UserWarning):
    """A program upstream PyPTO runs, shaped like a documented pitfall: ptodist runs it as upstream does and says
    what looks wrong (e.g. a host tensor with more per-rank slices than ranks: the extra slices are never touched).

    Filter it like any warning: ``warnings.simplefilter("error", ptodist.errors.PitfallWarning)`` makes it an error.
    """


class PtodistInternalError(Exception):
    """A bug in ptodist itself (not in the user's program); please report it."""

    kind = "internal_error"


class RankInternalError(RankError, PtodistInternalError):
    """A rank failed because of a bug in ptodist (an exception ptodist's own code raised without meaning to).

    A :class:`RankError` (``failures``, ``rank``, ``original``, ... as usual) and a
    :class:`PtodistInternalError`: ``ptodist run`` reports it as a bug in ptodist and exits with status 3.
    """

    kind = "internal_error"
