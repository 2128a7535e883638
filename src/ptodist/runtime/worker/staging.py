"""Small host tensors the ranks have not mapped, copied through one shared staging area instead.

A host tensor whose memory the shm ranks do not map yet costs, to map, a file descriptor sent to every rank,
a mapping in each, and an unmapping in each once the tensor is gone: about 0.3 ms a dispatch at P = 2 for
the fresh tensors of ``rt(x_new, y_new)`` or the output ``y = rt(x)`` makes, against microseconds to copy a
small one.  So a tensor of at most :data:`STAGE_MAX` bytes whose memory is not mapped yet is *staged*: before
each command the driver copies it into an area the ranks map once, and when the command is over copies back
the elements the ranks may have written (those of its writable arguments).  The ranks see the same bytes as
in place, and a command carrying the same layout as the last one is the same command to them.

Arguments whose memory overlaps are staged as one span, so that a rank's write through one is seen through
the other, as in place.  Between two commands (a sub-worker callback) the caller's tensors hold what the
ranks wrote.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from ...backends.base import HostView
from .memory import SharedFile

STAGE_MAX = 256 << 10  # bytes a tensor's memory spans, at most, to be staged rather than mapped
_ALIGN = 64
_FIRST_SIZE = 64 << 10


def stageable(lo: int, hi: int, strides) -> bool:
    """Whether a tensor spanning bytes ``[lo, hi)`` with byte ``strides`` is staged: a small one, with no negative
    stride (its element 0 starts its span)."""
    return hi - lo <= STAGE_MAX and min(strides, default=0) >= 0


def _c_strides(shape, itemsize: int) -> tuple:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _groups(staged: list) -> tuple[list, list]:
    """The runs of overlapping spans of the staged arguments (``[lo, hi]`` each, by address), and where each
    argument lies: its run, and its element 0 from the run's start."""
    groups: list[list[int]] = []
    run = [0] * len(staged)
    for lo, hi, k in sorted((a.stage[0], a.stage[1], k) for k, (a, _) in enumerate(staged)):
        if groups and lo < groups[-1][1]:
            if hi > groups[-1][1]:
                groups[-1][1] = hi
        else:
            groups.append([lo, hi])
        run[k] = len(groups) - 1
    return groups, [(g, a.stage[2] - groups[g][0]) for g, (a, _) in zip(run, staged)]


class Staging:
    """The staging area of one worker's shm binding, and the staged arguments of the command in flight."""

    def __init__(self, binding):
        self.binding = binding  # its file_map / forget_file: the area is memory the ranks map under a token
        self.file: SharedFile | None = None
        self.base = 0  # the area's address here
        self.map = None
        self.back: list = []  # the copies back of the command in flight: (dst, src, bytes) or (dst, src, None)
        self.layout = None  # the last layout (see _layout): other arguments shaped alike are staged alike
        # The last command's staged arguments, weakly (compared by identity: an _Arg has no ==): the worker
        # must not keep the caller's tensors, nor an output it made, past their dispatch.
        self.last: list = []

    def views(self, staged: list) -> list[HostView]:
        """Copy the staged arguments ``[(arg, writable), ...]`` in; return their views, in order."""
        copies, views, self.back = self._place(staged)
        self.last = [weakref.ref(a) for a, _ in staged]
        for dst, src, n in copies:
            ctypes.memmove(dst, src, n)
        return views

    def idle(self) -> None:
        """A command with nothing staged: nothing to copy back after it, and the last staged arguments (the
        caller's tensors) no longer held."""
        self.last, self.back = [], []

    def _place(self, staged: list) -> tuple[list, list, list]:
        """``(copies in, views, copies back)`` of the staged arguments: where each lies in the area."""
        if len(staged) == 1:  # the usual case, kept short: every dispatch with a new small tensor places it
            a, writable = staged[0]
            lo, hi, first = a.stage
            groups = ((lo, hi),)
            key = ((hi - lo,), (((0, first - lo), a.shape, a.strides, a.dtype, writable),))
        else:
            groups, where = _groups(staged)
            key = (tuple(hi - lo for lo, hi in groups),
                   tuple((w, a.shape, a.strides, a.dtype, writable) for w, (a, writable) in zip(where, staged)))
        # The same layout as the last command's (new tensors shaped alike, the same ones again): the same views.
        layout = self.layout
        if layout is None or layout[0] != key or layout[1] is not self.map:
            layout = self.layout = self._layout(staged, key, groups)
        _, _, at, views, back = layout
        base = self.base
        copies = [(base + off, lo, hi - lo) for (lo, hi), off in zip(groups, at)]
        copies_back = []
        for k, offset, nbytes in back:
            a = staged[k][0]
            if nbytes is not None:  # contiguous: its bytes, at once
                copies_back.append((a.stage[2], base + offset, nbytes))
            else:  # only its elements: the bytes between them may be another argument's
                lo, hi, first = a.stage
                npdt = a.dtype.np_dtype
                dst = np.ndarray(a.shape, npdt, (ctypes.c_char * (hi - lo)).from_address(lo), first - lo, a.strides)
                copies_back.append((dst, np.ndarray(a.shape, npdt, self.file.bytes, offset, a.strides), None))
        return copies, views, copies_back

    def _layout(self, staged: list, key: tuple, groups) -> tuple:
        """Where the staged arguments lie in the area: ``(key, map, group offsets, views, copies back)``."""
        at, total = [], 0
        for lo, hi in groups:
            at.append(total)
            total += -(-(hi - lo) // _ALIGN) * _ALIGN
        self._reserve(total)
        views, back = [], []
        for k, ((a, writable), (g, rel)) in enumerate(zip(staged, (w for w, _, _, _, _ in key[1]))):
            offset = at[g] + rel
            views.append(HostView(a.shape, a.dtype.name, writable, self.map.token, offset, a.strides))
            if writable:
                itemsize = a.dtype.np_dtype.itemsize
                contiguous = a.strides == _c_strides(a.shape, itemsize)
                back.append((k, offset, int(np.prod(a.shape)) * itemsize if contiguous else None))
        return key, self.map, at, views, back

    def copy_back(self) -> None:
        """The command is over: the elements of its writable staged arguments go back to the caller's memory."""
        back, self.back = self.back, []
        for dst, src, n in back:
            if n is None:
                dst[...] = src
            else:
                ctypes.memmove(dst, src, n)

    def _reserve(self, size: int) -> None:
        if self.file is not None and self.file.size >= size:
            return
        grown = max(size, 2 * self.file.size if self.file is not None else _FIRST_SIZE)
        self.close()  # the ranks drop the old area with the next command
        self.file = SharedFile(grown, "ptodist-staging")
        self.base = self.file.bytes.ctypes.data
        self.map = self.binding.file_map(self.file)

    def close(self) -> None:
        self.layout, self.last, self.back = None, [], []
        if self.file is not None:
            self.binding.forget_file(self.file)
            self.file = self.map = None
