"""Check a collective call and normalise its arguments — the same rules at plan time and in a rank.

Works on anything with ``.shape``, ``.dtype`` and ``.buffer`` (a host-side
``WindowView`` or a rank-side ``WindowTensor``), so the host orchestrator's
builtin calls are rejected before any rank starts and a kernel's calls before
the collective communicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import (
    WINDOW_KIND_PITFALL,
    AliasingError,
    ProgramTypeError,
    ProgramValueError,
    SignalLayoutError,
    classified,
)
from ..language import dtypes as dt
from ..language.distributed.types import ReduceOp

ALLREDUCE_DTYPES = (dt.FP32, dt.FP16, dt.BF16, dt.INT32)
MODES = ("mesh", "ring")


@dataclass
class Call:
    """A checked collective call: its tensors by role and its options."""

    name: str
    where: str
    signal: object
    target: object
    source: object = None  # allgather's local data, all_to_all's input
    op: ReduceOp = ReduceOp.Sum
    mode: str = "mesh"
    core_num: int = 1
    root: int = 0
    counts: dict = field(default_factory=dict)
    # What run() derives from the call once per rank (chunk regions, reshaped views): a host call's
    # Call is kept across its invocations, so each repeat skips that work.
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def layout(self) -> tuple:
        """The signal layout this call uses: a signal window may serve one layout only."""
        return ("ring" if self.mode == "ring" else "mesh", tuple(self.signal.shape))

    def tensors(self) -> list:
        return [t for t in (self.source, self.target, self.signal) if t is not None]


def _is_window(x) -> bool:
    return hasattr(x, "buffer") and hasattr(x, "shape") and hasattr(x, "dtype")


def _describe(x) -> str:
    if _is_window(x):
        return f"window '{x.buffer.name}' {list(x.shape)} {x.dtype.name}"
    if hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x.dtype, "name"):
        return f"tensor '{getattr(x, 'name', '?')}' {list(x.shape)} {x.dtype.name}"
    return type(x).__name__


def _is_tensor(x) -> bool:
    """A plain (rank-local) tensor: shape, dtype and data, but no window buffer."""
    return not _is_window(x) and hasattr(x, "array") and hasattr(x, "shape") and hasattr(x, "dtype")


def check(name: str, args: tuple, kwargs: dict, world: int, where: str, host: bool) -> Call:
    """Return the checked call, or raise a ProgramError naming the call site and the fix."""
    op_name = f"pld.tensor.{name}"
    w = f"{op_name} at {where}"

    def window(x, role: str):
        if not _is_window(x):
            raise classified(ProgramTypeError(f"{w}: {role} must be a pld.DistributedTensor (a window from "
                                              f"pld.window), got {_describe(x)}"), pitfall=WINDOW_KIND_PITFALL,
                             fix=f"Pass a window as the {role}: pld.window(buf, shape, dtype=...) of a buffer from "
                                 "pld.alloc_window_buffer.")
        return x

    if name == "barrier":
        call = Call(name, where, window(args[0], "signal"), None)
    elif name == "allreduce":
        target, signal = args
        call = Call(name, where, signal, window(target, "target"), op=_op(w, kwargs["op"]),
                    mode=kwargs["mode"], core_num=kwargs["core_num"])
        if signal is not None:
            window(signal, "signal")
    elif name in ("broadcast", "reduce_scatter"):
        call = Call(name, where, window(args[1], "signal"), window(args[0], "target"),
                    op=_op(w, kwargs.get("op")), root=kwargs.get("root", 0))
    elif name == "allgather":
        call = Call(name, where, window(args[2], "signal"), window(args[1], "target"), source=args[0])
    elif name in ("all_to_all", "all_to_all_v"):
        call = Call(name, where, window(args[2], "signal"), window(args[1], "target"),
                    source=_a2a_input(args[0], w, host), counts={k: kwargs[k] for k in ("send_counts", "recv_counts")
                                                                 if k in kwargs})
    else:  # pragma: no cover - the pld.tensor entry points name only the collectives above
        raise ProgramValueError(f"unknown collective {name!r}")
    _check_mode(call, w, host)
    _check_signal(call, w, world, host)
    _check_options(call, w, world, host)
    return call


def _a2a_input(x, w: str, host: bool):
    """all_to_all's input: a window anywhere; in a kernel also a plain pl.Tensor (put reads any local tensor)."""
    if _is_window(x) or (not host and _is_tensor(x)):
        return x
    if host:
        raise classified(ProgramTypeError(
            f"{w}: in the host orchestrator the input must be a pld.DistributedTensor (a window from pld.window: "
            f"every rank sends its own copy), got {_describe(x)}. Stage the data into a window first, or call the "
            "collective inside a kernel, where a pl.Tensor input is accepted."), pitfall=WINDOW_KIND_PITFALL)
    raise ProgramTypeError(f"{w}: input must be a pl.Tensor or a pld.DistributedTensor, got {_describe(x)}")


def _op(w: str, op) -> ReduceOp:
    if op is None:
        return ReduceOp.Sum
    if not isinstance(op, ReduceOp):
        raise ProgramTypeError(f"{w}: op= must be pld.ReduceOp.Sum, Max, Min or Prod, got {op!r}")
    return op


def _check_mode(call: Call, w: str, host: bool) -> None:
    """Check allreduce's mode and core_num first: the signal's expected shape depends on them."""
    if call.name != "allreduce":
        return
    if call.mode not in MODES:
        raise ProgramValueError(f"{w}: mode= must be 'mesh' or 'ring', got {call.mode!r}")
    if not isinstance(call.core_num, int) or isinstance(call.core_num, bool) or call.core_num < 1:
        raise ProgramValueError(f"{w}: core_num= must be an int >= 1, got {call.core_num!r}")
    if call.core_num > 1 and (not host or call.mode != "mesh"):
        raise ProgramValueError(f"{w}: core_num > 1 is available only for the host orchestrator's mesh "
                                "allreduce")


def _check_signal(call: Call, w: str, world: int, host: bool) -> None:
    sig = call.signal
    if sig is None:
        return  # host allreduce without a signal: one is synthesised
    if sig.dtype is not dt.INT32:
        raise ProgramTypeError(f"{w}: the signal must be an INT32 window, but {_describe(sig)} is {sig.dtype.name}")
    for role, t in (("target", call.target), ("input" if call.name.startswith("all_to_all") else "local data",
                                              call.source)):
        if _is_window(t) and t.buffer is sig.buffer:
            raise AliasingError(f"{w}: the signal and the {role} are the same window buffer '{sig.buffer.name}'; "
                                    "the collective's counters would overwrite the data. Give the signal its own "
                                    "INT32 window.")
    shape = list(sig.shape)
    if call.mode == "ring":
        want, with_return = [2 * (world - 1), world], [2 * (world - 1) + 1, world]
        if shape == want or (host and shape == with_return):
            return
        if shape == with_return:
            raise SignalLayoutError(
                f"{w}: a [2*(NR-1)+1, NR] = {with_return} ring signal (with a row for the return barrier) is the "
                f"host orchestrator's layout, but {_describe(sig)} is used inside a kernel. Inside a kernel "
                f"mode='ring' takes [2*(NR-1), NR] = {want}: allocate the signal with that shape, or call the "
                "allreduce from the host orchestrator.")
        # (The host also takes [2*(NR-1)+1, NR]; the message names the one layout that works at both sites.)
        raise SignalLayoutError(
            f"{w}: mode='ring' needs a signal of shape [2*(NR-1), NR] = {want} (one row per ring round, one "
            f"cell per rank), but {_describe(sig)} has {shape}. A [NR, 1] signal is the mesh layout.")
    lanes = call.core_num
    # Lane b of a multi-core allreduce owns column b: a [NR, stride] signal with stride >= core_num
    # (columns beyond core_num stay unused); a rank-1 [NR] signal has one lane only.
    ok = (len(shape) == 1 and shape[0] == world and lanes == 1) or \
         (len(shape) == 2 and shape[0] == world and shape[1] >= lanes)
    if not ok:
        want = f"[NR, core_num] = [{world}, {lanes}] (one column per lane)" if lanes > 1 else f"[NR, 1] = [{world}, 1] (or [{world}])"
        hint = " That is the ring layout; pass mode='ring' or a [NR, 1] signal." \
            if shape in ([2 * (world - 1), world], [2 * (world - 1) + 1, world]) and world > 2 else ""
        if lanes > 1:
            hint += f" A wider [NR, stride] signal (stride >= core_num = {lanes}) works too."
        raise SignalLayoutError(f"{w}: {call.mode if call.name == 'allreduce' else call.name} signals have shape "
                                f"{want}, but {_describe(sig)} has {shape}.{hint}")


def _check_options(call: Call, w: str, world: int, host: bool) -> None:
    t = call.target
    if call.name == "allreduce":
        if t.dtype not in ALLREDUCE_DTYPES:
            raise ProgramTypeError(f"{w}: allreduce supports {', '.join(d.name for d in ALLREDUCE_DTYPES)}; "
                                   f"{_describe(t)} is {t.dtype.name}")
        if call.mode == "ring":
            if world < 2:
                raise ProgramValueError(f"{w}: mode='ring' needs at least 2 ranks, the world has {world}")
            if host and (call.op is not ReduceOp.Sum or t.dtype is not dt.FP32):
                raise ProgramValueError(f"{w}: the host orchestrator's ring allreduce supports op=Sum on FP32 only "
                                        f"(got {call.op.name} on {t.dtype.name}); use mode='mesh'")
    elif call.name == "reduce_scatter":
        if call.op is not ReduceOp.Sum:
            raise ProgramValueError(f"{w}: reduce_scatter supports op=pld.ReduceOp.Sum only, got {call.op.name}")
        if not t.shape or t.shape[0] % world:
            raise ProgramValueError(f"{w}: the target holds one chunk per rank along dimension 0, so its first "
                                    f"dimension must divide by {world}; {_describe(t)}")
    elif call.name == "broadcast":
        root = call.root
        if isinstance(root, bool) or type(root) is not int:
            raise ProgramTypeError(f"{w}: root= must be a Python int (a rank index known when the program is "
                                   f"built), got {root!r} ({type(root).__name__})")
        if not 0 <= root < world:
            raise ProgramValueError(f"{w}: root={root} is outside [0, {world})")
    elif call.name == "allgather":
        src = call.source
        if _is_window(src) and src.buffer is t.buffer:
            raise AliasingError(f"{w}: local data and target are the same window buffer '{t.buffer.name}'; "
                                    "each rank's slot would overwrite another's input. Use separate windows.")
        slot_shape(call, world)  # raises when the target has no slot per rank
    elif call.name in ("all_to_all", "all_to_all_v"):
        src = call.source
        if _is_window(src) and src.buffer is t.buffer:
            raise AliasingError(f"{w}: input and target are the same window buffer '{t.buffer.name}'; "
                                    "rows would be overwritten before they are sent. Use separate windows.")
        if list(src.shape) != list(t.shape) or not t.shape or t.shape[0] % world:
            raise ProgramValueError(f"{w}: input and target need the same shape with a first dimension that "
                                    f"divides by {world}; got {_describe(src)} and {_describe(t)}")
        if src.dtype is not t.dtype:
            raise ProgramTypeError(f"{w}: input and target need the same dtype; got {_describe(src)} and "
                                   f"{_describe(t)}")
        if call.name == "all_to_all_v":
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
        if _is_window(c):
            if c.dtype.is_float:
                raise ProgramTypeError(f"{w}: {what} must hold integer counts (INT32), but {_describe(c)} is "
                                       f"{c.dtype.name}")
            if list(c.shape) not in ([world], [world, 1]) and not (what == "send_counts" and
                                                                    list(c.shape) == [world, world]):
                raise ProgramValueError(f"{w}: {what} as a window holds one count per rank, [NR, 1] = [{world}, 1] "
                                        f"(or [{world}]), but {_describe(c)} has {list(c.shape)}")
            for role, t in (("signal", call.signal), ("target", call.target), ("input", call.source)):
                if _is_window(t) and t.buffer is c.buffer:
                    raise AliasingError(f"{w}: {what} and the {role} are the same window buffer "
                                        f"'{c.buffer.name}'; the counts and the {role} would overwrite each "
                                        f"other. Give {what} its own INT32 window.")
            if what == "recv_counts" and c.dtype is not dt.INT32:
                raise ProgramTypeError(f"{w}: recv_counts as a window receives every peer's count by notify, so "
                                       f"it must be INT32; {_describe(c)} is {c.dtype.name}")
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


def ring_segments(size: int, world: int, itemsize: int) -> list[tuple[int, int]]:
    """The ring's ``world`` segments of a ``size``-element flat stream: ``[lo, hi)`` per rank.

    Balanced boundaries ``floor(i * size / world)``; for 2-byte dtypes each interior boundary is
    rounded up to a multiple of 16 elements (32 bytes) and capped at ``size``, so every non-empty
    segment starts 32-byte aligned.  Segments may be empty (a stream shorter than the rank count).
    """
    align = 32 // itemsize if itemsize == 2 else 1
    bounds = [0]
    for i in range(1, world):
        b = size * i // world
        b = min(size, -(-b // align) * align)
        bounds.append(max(b, bounds[-1]))
    bounds.append(size)
    return [(bounds[i], bounds[i + 1]) for i in range(world)]


def flat_regions(shape, lo: int, hi: int) -> list[tuple[list[int], list[int]]]:
    """Boxes (offsets, extents) covering flat elements ``[lo, hi)`` of a row-major ``shape``, in order."""
    shape = [int(d) for d in shape]
    if hi <= lo:
        return []
    if not shape:
        return [([], [])]
    if len(shape) == 1:
        return [([lo], [hi - lo])]
    inner = int(np.prod(shape[1:]))
    first, last = lo // inner, (hi - 1) // inner
    if first == last:
        return [([first, *o], [1, *e]) for o, e in flat_regions(shape[1:], lo - first * inner, hi - first * inner)]
    out = []
    if lo % inner:
        out += [([first, *o], [1, *e]) for o, e in flat_regions(shape[1:], lo % inner, inner)]
        first += 1
    full_end = hi // inner  # rows [first, full_end) are whole
    if full_end > first:
        out.append(([first] + [0] * (len(shape) - 1), [full_end - first, *shape[1:]]))
    if hi % inner:
        out += [([full_end, *o], [1, *e]) for o, e in flat_regions(shape[1:], 0, hi % inner)]
    return out


def slot_shape(call: Call, world: int) -> list[int]:
    """Return the shape of one rank's slot in allgather's target (``[NR, *local]`` or ``[NR*rows, ...]``)."""
    t, src = call.target, call.source
    local = list(src.shape)
    tshape = list(t.shape)
    if tshape == [world, *local]:
        return [1, *local]
    if len(tshape) == len(local) and tshape[0] == world * local[0] and tshape[1:] == local[1:]:
        return local
    raise ProgramValueError(f"pld.tensor.{call.name} at {call.where}: the target needs one slot per rank for the "
                            f"local data {local}: shape {[world, *local]} or {[world * local[0], *local[1:]] if local else []}, "
                            f"but {_describe(t)} has {tshape}")


def check_hand_rolled(hand: dict, call: Call) -> None:
    """Reject a collective whose signal window the program's own notify/wait used with another shape."""
    sig = call.signal
    prev = hand.get(sig.buffer.id)
    if prev is not None and prev[0] != tuple(sig.shape):
        raise SignalLayoutError(
            f"pld.tensor.{call.name} at {call.where}: signal window buffer '{sig.buffer.name}' was used by "
            f"hand-rolled notify/wait at {prev[1]} as {list(prev[0])}, and is now a collective signal of layout "
            f"{list(sig.shape)}. Hand-rolled counters are not self-clearing, so their leftover counts would release "
            "the collective's waits early: give the collective its own signal window.")


def check_layout(registry: dict, call: Call) -> None:
    """Reject a signal window used with two different collective layouts (SPEC §8.3 step 16)."""
    sig = call.signal
    key = sig.buffer.id
    layout = call.layout
    prev = registry.setdefault(key, (layout, call.where, call.name))
    if prev[0] != layout:
        raise SignalLayoutError(
            f"pld.tensor.{call.name} at {call.where}: signal window buffer '{sig.buffer.name}' is used with the "
            f"{layout[0]} layout {list(layout[1])}, but pld.tensor.{prev[2]} at {prev[1]} used it with the "
            f"{prev[0][0]} layout {list(prev[0][1])}. Collective signals are self-clearing only within one layout: "
            "give each layout its own signal window.")
