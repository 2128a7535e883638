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
from .registry import REGISTRY

ALLREDUCE_DTYPES = (dt.FP32, dt.FP16, dt.BF16, dt.INT32)  # what the reducing collectives take


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


def is_window(x) -> bool:
    return hasattr(x, "buffer") and hasattr(x, "shape") and hasattr(x, "dtype")


def describe(x) -> str:
    if is_window(x):
        return f"window '{x.buffer.name}' {list(x.shape)} {x.dtype.name}"
    if hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x.dtype, "name"):
        return f"tensor '{getattr(x, 'name', '?')}' {list(x.shape)} {x.dtype.name}"
    return type(x).__name__


def _is_tensor(x) -> bool:
    """A plain (rank-local) tensor: shape, dtype and data, but no window buffer."""
    return not is_window(x) and hasattr(x, "array") and hasattr(x, "shape") and hasattr(x, "dtype")


def check(name: str, args: tuple, kwargs: dict, world: int, where: str, host: bool) -> Call:
    """Return the checked call, or raise a ProgramError naming the call site and the fix."""
    c = REGISTRY.get(name)
    if c is None:  # pragma: no cover - the pld.tensor entry points name only registered collectives
        raise ProgramValueError(f"unknown collective {name!r}")
    w = f"{c.op_name} at {where}"
    call = Call(name, where, None, None)
    c.build(call, args, kwargs, w, host)
    _check_signal(call, c, w, world, host)
    if c.options is not None:
        c.options(call, w, world, host)
    return call


def window(x, role: str, w: str):
    """``x``, checked to be a window (the collective's ``role``)."""
    if not is_window(x):
        raise classified(ProgramTypeError(f"{w}: {role} must be a pld.DistributedTensor (a window from "
                                          f"pld.window), got {describe(x)}"), pitfall=WINDOW_KIND_PITFALL,
                         fix=f"Pass a window as the {role}: pld.window(buf, shape, dtype=...) of a buffer from "
                             "pld.alloc_window_buffer.")
    return x


def exchange_input(x, w: str, host: bool):
    """all_to_all's input: a window anywhere; in a kernel also a plain pl.Tensor (put reads any local tensor)."""
    if is_window(x) or (not host and _is_tensor(x)):
        return x
    if host:
        raise classified(ProgramTypeError(
            f"{w}: in the host orchestrator the input must be a pld.DistributedTensor (a window from pld.window: "
            f"every rank sends its own copy), got {describe(x)}. Stage the data into a window first, or call the "
            "collective inside a kernel, where a pl.Tensor input is accepted."), pitfall=WINDOW_KIND_PITFALL)
    raise ProgramTypeError(f"{w}: input must be a pl.Tensor or a pld.DistributedTensor, got {describe(x)}")


def reduce_op(w: str, op) -> ReduceOp:
    if op is None:
        return ReduceOp.Sum
    if not isinstance(op, ReduceOp):
        raise ProgramTypeError(f"{w}: op= must be pld.ReduceOp.Sum, Max, Min or Prod, got {op!r}")
    return op


def check_root(root, w: str, world: int) -> None:
    """A root (broadcast's, reduce's): a Python int naming a rank of the group."""
    if isinstance(root, bool) or type(root) is not int:
        raise ProgramTypeError(f"{w}: root= must be a Python int (a rank index known when the program is "
                               f"built), got {root!r} ({type(root).__name__})")
    if not 0 <= root < world:
        raise ProgramValueError(f"{w}: root={root} is outside [0, {world})")


def check_exchange(call: Call, w: str, world: int) -> None:
    """all_to_all's (and all_to_all_v's) input and target: separate windows of one shape and dtype, one row
    block per rank."""
    t, src = call.target, call.source
    if is_window(src) and src.buffer is t.buffer:
        raise AliasingError(f"{w}: input and target are the same window buffer '{t.buffer.name}'; "
                                "rows would be overwritten before they are sent. Use separate windows.")
    if list(src.shape) != list(t.shape) or not t.shape or t.shape[0] % world:
        raise ProgramValueError(f"{w}: input and target need the same shape with a first dimension that "
                                f"divides by {world}; got {describe(src)} and {describe(t)}")
    if src.dtype is not t.dtype:
        raise ProgramTypeError(f"{w}: input and target need the same dtype; got {describe(src)} and "
                               f"{describe(t)}")


def _check_signal(call: Call, c, w: str, world: int, host: bool) -> None:
    sig = call.signal
    if sig is None:
        return  # host allreduce without a signal: one is synthesised
    if sig.dtype is not dt.INT32:
        raise ProgramTypeError(f"{w}: the signal must be an INT32 window, but {describe(sig)} is {sig.dtype.name}")
    for role, t in (("target", call.target), (c.source_role, call.source)):
        if is_window(t) and t.buffer is sig.buffer:
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
                f"host orchestrator's layout, but {describe(sig)} is used inside a kernel. Inside a kernel "
                f"mode='ring' takes [2*(NR-1), NR] = {want}: allocate the signal with that shape, or call the "
                "allreduce from the host orchestrator.")
        # (The host also takes [2*(NR-1)+1, NR]; the message names the one layout that works at both sites.)
        raise SignalLayoutError(
            f"{w}: mode='ring' needs a signal of shape [2*(NR-1), NR] = {want} (one row per ring round, one "
            f"cell per rank), but {describe(sig)} has {shape}. A [NR, 1] signal is the mesh layout.")
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
        raise SignalLayoutError(f"{w}: {call.mode if c.modes else call.name} signals have shape "
                                f"{want}, but {describe(sig)} has {shape}.{hint}")


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
