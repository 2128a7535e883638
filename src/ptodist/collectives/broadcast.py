"""broadcast: every rank ends with root's window, moved by ``put`` / ``get`` straight between the windows.

Large copies are split so that every rank copies a share at once.
"""

from __future__ import annotations

import numpy as np

import ptodist.language.distributed as pld

from .. import context
from . import common
from .registry import collective
from .spec import check_root, flat_regions, window

# Below this many bytes a broadcast's receivers read root's window whole: a split saves less copy
# time than its extra operations cost.
SPLIT_BROADCAST_BYTES = 256 * 1024
_WHOLE = "whole"  # a broadcast receiver's plan below the split size: get root's window whole


def _build(call, args, kwargs, w, host) -> None:
    call.signal, call.target = window(args[1], "signal", w), window(args[0], "target", w)
    call.root = kwargs.get("root", 0)


def _options(call, w: str, world: int, host: bool) -> None:
    check_root(call.root, w, world)


def _broadcast_plan(target, root: int, me: int, n: int) -> list[tuple[bool, int, list[int], list[int]]]:
    """The transfers of a split broadcast on rank ``me``: ``(is_put, peer, offsets, extents)``.

    The flat data is cut into n balanced chunks, chunk c for group rank c.  Root puts chunk r into
    receiver r; receiver r gets every other chunk (its own two flat ranges around chunk r, root's
    included) from root.  Each rank copies (n-1)/n of the data, all at once, and only root's window
    is read, so no barrier is needed between the two halves.
    """
    shape = list(target.shape)
    size = int(np.prod(shape)) if shape else 1
    bounds = [size * c // n for c in range(n + 1)]
    if me == root:
        return [(True, p, o, e) for p in range(n) if p != root for o, e in flat_regions(shape, bounds[p], bounds[p + 1])]
    return [(False, root, o, e) for lo, hi in ((0, bounds[me]), (bounds[me + 1], size))
            for o, e in flat_regions(shape, lo, hi)]


def run(call, me: int, n: int, host: bool) -> None:
    """Every rank ends with root's window; the closing barrier keeps root's data until all have read it."""
    target, signal, root, cache = call.target, call.signal, call.root, call.cache
    key = ("broadcast", root, me, n)
    plan = cache.get(key) if cache is not None else None
    if plan is None:
        nbytes = int(np.prod(target.shape, dtype=np.int64)) * np.dtype(target.dtype.np_dtype).itemsize
        if nbytes >= SPLIT_BROADCAST_BYTES and n > 1:
            plan = _broadcast_plan(target, root, me, n)
        else:
            plan = [] if me == root else _WHOLE
        if cache is not None:
            cache[key] = plan
    common.enter(signal, me, n)
    if plan is _WHOLE:
        pld.tensor.get(target, root, target)
    else:
        for is_put, peer, offsets, ext in plan:
            if is_put:
                pld.tensor.put(target, peer, target, offsets, offsets, ext)
            else:
                pld.tensor.get(target, peer, target, offsets, offsets, ext)
    common.leave(signal, me, n)


@collective(domain=(0, 1), build=_build, options=_options, run=run, fixed_schedule=True)
def broadcast(target, signal, *, root):
    """Every rank ends with rank ``root``'s ``target``; ``root`` is a Python int."""
    return context.current().collective("broadcast", (target, signal), {"root": root})
