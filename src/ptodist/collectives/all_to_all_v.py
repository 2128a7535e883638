"""all_to_all_v: like all_to_all, but only the first ``send_counts[p]`` rows of block p travel to rank p."""

from __future__ import annotations

import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld

from .. import context
from ..errors import AliasingError, KernelValueError, ProgramTypeError, ProgramValueError
from ..language import dtypes as dt
from ..language.distributed.types import NotifyOp, WaitCmp
from . import common
from .registry import collective
from .spec import Call, check_exchange, describe, exchange_input, is_window, window


def _build(call, args, kwargs, w, host) -> None:
    call.signal, call.target = window(args[2], "signal", w), window(args[1], "target", w)
    call.source = exchange_input(args[0], w, host)
    call.counts = {k: kwargs[k] for k in ("send_counts", "recv_counts") if k in kwargs}


def _options(call, w: str, world: int, host: bool) -> None:
    check_exchange(call, w, world)
    if set(call.counts) != {"send_counts", "recv_counts"}:
        raise ProgramValueError(f"{w}: all_to_all_v needs send_counts and recv_counts")
    _check_counts(call, w, world, host)


def _check_counts(call: Call, w: str, world: int, host: bool) -> None:
    """Check all_to_all_v's counts: their kind and layout now, their values where they are known now.

    ``recv_counts`` given as an INT32 window ``[NR, 1]`` (or ``[NR]``) is an output, as upstream lays it
    out: rank p's count for this rank lands in cell ``[p, 0]``.  Given as constants, a tensor or
    Scalars, it is what this rank expects, checked against what every peer sends.
    """
    rows = call.target.shape[0] // world
    arrays = {}
    for what in ("send_counts", "recv_counts"):
        c = call.counts[what]
        if is_window(c):
            if c.dtype.is_float:
                raise ProgramTypeError(f"{w}: {what} must hold integer counts (INT32), but {describe(c)} is "
                                       f"{c.dtype.name}")
            if list(c.shape) not in ([world], [world, 1]) and not (what == "send_counts" and
                                                                    list(c.shape) == [world, world]):
                raise ProgramValueError(f"{w}: {what} as a window holds one count per rank, [NR, 1] = [{world}, 1] "
                                        f"(or [{world}]), but {describe(c)} has {list(c.shape)}")
            for role, t in (("signal", call.signal), ("target", call.target), ("input", call.source)):
                if is_window(t) and t.buffer is c.buffer:
                    raise AliasingError(f"{w}: {what} and the {role} are the same window buffer "
                                        f"'{c.buffer.name}'; the counts and the {role} would overwrite each "
                                        f"other. Give {what} its own INT32 window.")
            if what == "recv_counts" and c.dtype is not dt.INT32:
                raise ProgramTypeError(f"{w}: recv_counts as a window receives every peer's count by notify, so "
                                       f"it must be INT32; {describe(c)} is {c.dtype.name}")
            continue
        if hasattr(c, "shape") and not isinstance(c, np.ndarray) and not hasattr(c, "array"):
            continue  # a host tensor at plan time: its values are read in the rank
        arrays[what] = counts_array(c, world, rows, what, w)
    send, recv = arrays.get("send_counts"), arrays.get("recv_counts")
    if send is not None and recv is not None and send.ndim == 2 and recv.ndim == 2:
        for q in range(world):
            for p in range(world):
                if recv[q, p] != send[p, q]:
                    raise ProgramValueError(
                        f"{w}: rank {q} expects recv_counts[{p}] = {int(recv[q, p])} rows from rank {p}, but rank "
                        f"{p} sends send_counts[{q}] = {int(send[p, q])} rows to rank {q}. recv_counts[q][p] must "
                        "equal send_counts[p][q]: fix one of them (or pass recv_counts as an INT32 [NR, 1] window "
                        "to receive the counts the peers send).")


def _count_value(v, what: str, w: str) -> int:
    """One count: an int, an integer numpy scalar or an integer Scalar."""
    if isinstance(v, (bool, np.bool_)) or isinstance(v, (float, np.floating)):
        raise ProgramTypeError(f"{w}: {what} must hold integer counts, got {v!r} ({type(v).__name__})")
    if hasattr(v, "dtype") and hasattr(v, "value") and not isinstance(v, np.generic):  # a Scalar
        if v.dtype.is_float:
            raise ProgramTypeError(f"{w}: {what} must hold integer counts, got a {v.dtype.name} Scalar ({v.value})")
        return int(v.value)
    try:
        return int(v.__index__())
    except (AttributeError, TypeError):
        raise ProgramTypeError(f"{w}: {what} must hold integer counts (ints or integer Scalars), got {v!r} "
                               f"({type(v).__name__})") from None


def counts_array(counts, world: int, rows: int, what: str, w: str) -> np.ndarray:
    """Return all_to_all_v counts as an int array of shape [world] or [world, world] (row r for rank r).

    Accepts a list/tuple (of ints or integer Scalars, flat or nested), a numpy array, a tensor or window
    (its local data), shaped ``[NR]``, ``[NR, 1]`` (upstream's layout) or ``[NR, NR]``.
    """
    if hasattr(counts, "array"):
        arr = np.asarray(counts.array)
    elif isinstance(counts, np.ndarray):
        arr = counts
    elif isinstance(counts, (list, tuple)):
        nested = [list(c) if isinstance(c, (list, tuple, np.ndarray)) else c for c in counts]
        if any(isinstance(c, list) for c in nested):
            try:
                arr = np.array([[_count_value(v, what, w) for v in c] if isinstance(c, list) else
                                [_count_value(c, what, w)] for c in nested], dtype=np.int64)
            except ValueError:  # ragged rows
                raise ProgramValueError(f"{w}: {what} rows have different lengths: {counts!r}") from None
        else:
            arr = np.array([_count_value(v, what, w) for v in nested], dtype=np.int64)
    else:
        arr = np.array(_count_value(counts, what, w))
    if arr.ndim == 2 and arr.shape == (world, 1):
        arr = arr.reshape(world)
    if arr.shape not in ((world,), (world, world)):
        raise ProgramValueError(f"{w}: {what} must hold one count per rank, as [{world}] (this rank's) or "
                                f"[{world}, {world}] (row r for rank r), got shape {list(arr.shape)}: {arr.tolist()}")
    if arr.dtype.kind not in "iu" or ((arr < 0) | (arr > rows)).any():
        raise ProgramValueError(f"{w}: {what} {arr.tolist()} must be integers in [0, {rows}] (rows per block)")
    return arr


def run(call, me: int, n: int, host: bool) -> None:
    """Like all_to_all, but only the first ``send_counts[p]`` rows of block p travel to rank p.

    The first barrier carries the counts: sender p adds ``1 + 2*count`` (not 1) to its cell on the
    receiver, which waits for it, reads the count back and consumes exactly that.  Only p's next
    token (+1) can arrive before the read, so ``(value - 1) // 2`` is the count either way, and the
    signal is left clear as after any barrier.  A window ``recv_counts`` ([NR, 1] INT32, upstream's
    layout) receives the counts: sender p sets cell ``[p, 0]`` on each receiver.  Any other
    ``recv_counts`` is what this rank expects; a peer that sends another count is an error, raised
    after the exchange completes (so the other ranks finish and the signal is left clear).
    """
    input, target, signal, where = call.source, call.target, call.signal, call.where
    send_counts, recv_counts = call.counts["send_counts"], call.counts["recv_counts"]
    rows = input.shape[0] // n
    rest = [0] * (len(input.shape) - 1)
    w = f"pld.tensor.all_to_all_v at {where}"
    send = counts_array(send_counts, n, rows, "send_counts", w)
    send = send[me] if send.ndim == 2 else send
    publish = _is_rank_window(recv_counts)
    expect = None
    if not publish:
        expect = counts_array(recv_counts, n, rows, "recv_counts", w)
        expect = expect[me] if expect.ndim == 2 else expect
    if publish:
        for p in range(n):
            pld.system.notify(recv_counts, p, _count_cell(recv_counts, me), int(send[p]), op=NotifyOp.Set)
    for p in range(n):
        if p != me:
            pld.system.notify(signal, p, common.cell(signal, me), 1 + 2 * int(send[p]), op=NotifyOp.AtomicAdd)
    got = [0] * n
    got[me] = int(send[me])
    for p in range(n):
        if p != me:
            c = common.cell(signal, p)
            pld.system.wait(signal, c, 1, cmp=WaitCmp.Ge)
            got[p] = (int(pl.read(signal, c)) - 1) // 2
            pld.system.notify(signal, me, c, -(1 + 2 * got[p]), op=NotifyOp.AtomicAdd)
    for p in range(n):
        if send[p]:
            pld.tensor.put(target, p, input, [me * rows, *rest], [p * rows, *rest], [int(send[p]), *input.shape[1:]])
    common.barrier(signal, me, n)  # its first half was the count exchange, consumed there
    if expect is not None:
        wrong = [p for p in range(n) if int(expect[p]) != got[p]]
        if wrong:
            pairs = "; ".join(f"rank {me} expects recv_counts[{p}] = {int(expect[p])} rows from rank {p}, but rank "
                              f"{p} sends send_counts[{me}] = {got[p]}" for p in wrong)
            raise KernelValueError(
                f"{w}: {pairs}. recv_counts on rank q must list, for each sender p, the rows p's send_counts give "
                "q: fix the counts, or pass recv_counts as an INT32 [NR, 1] window to receive the counts the "
                "peers send.")


def _is_rank_window(x) -> bool:
    return hasattr(x, "buffer") and hasattr(x, "peer_array")


def _count_cell(counts, sender: int) -> list[int]:
    return [sender] if len(counts.shape) == 1 else [sender, 0]


@collective(domain=(1, 2), domain_kwargs=("recv_counts",), build=_build, options=_options, run=run,
            source_role="input")
def all_to_all_v(input, target, signal, send_counts, recv_counts):
    """Variable-size all_to_all: ``send_counts[p]`` leading rows of ``input[p]`` go to rank p.

    ``send_counts``: a ``[NR, 1]`` or ``[NR]`` integer tensor or window, a list of ints or integer
    Scalars, or ``[NR, NR]`` (row r for rank r).  ``recv_counts``: an INT32 ``[NR, 1]`` window receives
    the counts (sender p's count lands in cell ``[p, 0]``); given in any other form it is what this
    rank expects, and a peer that sends another count is an error naming both ranks and counts.
    """
    return context.current().collective("all_to_all_v", (input, target, signal),
                                        {"send_counts": send_counts, "recv_counts": recv_counts})
