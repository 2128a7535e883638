"""What a rank reports when its tasks raise: the failure record, and whether the error is ptodist's own bug."""

from __future__ import annotations

import pickle
import traceback

from ..errors import PtodistError, RankFailure
from ..source import is_internal, is_library, is_ptodist, raise_lines

# Exceptions that say what the machine could not do, not what the code did wrong: never a bug in ptodist.
ENVIRONMENT_ERRORS = (MemoryError, OSError, RecursionError)


def ptodist_bug(e: BaseException) -> traceback.FrameSummary | None:
    """The frame of ptodist's own code that raised ``e`` by mistake, or None when ``e`` is not a bug in ptodist.

    The rule: ``e`` is a bug in ptodist when

    * it is an ``Exception`` but not a ``PtodistError`` (those ptodist raises on purpose), nor one the
      environment causes (``MemoryError``, ``OSError``, ``RecursionError``);
    * the innermost frame of its traceback that is not library code (the standard library, numpy, torch,
      any installed package: frames :func:`ptodist.source.is_library` names) is ptodist's — so an error
      raised in the program's own code, or inside a library the program itself called, is the program's;
    * and that frame did not raise it with a ``raise`` statement of its own: the few builtins ptodist
      still raises on purpose (``ZeroDivisionError`` for a Scalar divided by zero, as Python's ints do)
      come from a ``raise``; everything else raised on purpose is a ``PtodistError``.

    So a builtin error that numpy raises for bad data that ptodist handed it without checking counts as
    a bug in ptodist: a check is missing there, and the report must say so (the program's line is still
    in the traceback).
    """
    if not isinstance(e, Exception) or isinstance(e, (PtodistError, *ENVIRONMENT_ERRORS)):
        return None
    frames = traceback.extract_tb(e.__traceback__)
    for i in range(len(frames) - 1, -1, -1):
        f = frames[i]
        if is_ptodist(f.filename):
            if i == len(frames) - 1 and f.lineno in raise_lines(f.filename):
                return None  # raised on purpose
            return f
        if not is_library(f.filename):
            return None  # the program's own code, or a library it called itself
    return None


def user_traceback(e: BaseException) -> str:
    """Format the rank's traceback; for errors ptodist raised on purpose, without ptodist's own frames.

    For a bug in ptodist (:func:`ptodist_bug`) every frame is kept.
    """
    frames = traceback.extract_tb(e.__traceback__)
    innermost_is_user = bool(frames) and not is_internal(frames[-1].filename)
    if isinstance(e, PtodistError) or (innermost_is_user and ptodist_bug(e) is None):
        frames = traceback.StackSummary.from_list([f for f in frames if not is_internal(f.filename)])
    lines = ["Traceback (most recent call last):\n", *frames.format(),
             *traceback.format_exception_only(type(e), e)]
    return "".join(lines)


def rank_failure(plan, rank: int, task: str | None, e: BaseException) -> RankFailure:
    """What a rank reports when ``e`` escaped its tasks: the traceback as text, the exception when it pickles.

    ``internal`` says whether ``e`` is a bug in ptodist (:func:`ptodist_bug`)."""
    tb = user_traceback(e)
    exc = e if isinstance(e, PtodistError) or type(e).__module__ == "builtins" else None
    try:
        exc = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - exceptions that do not survive pickling travel as text only
        exc = None
    return RankFailure(rank, plan.device_ids[rank], task, type(e).__name__, str(e), tb, exc,
                       internal=ptodist_bug(e) is not None)
