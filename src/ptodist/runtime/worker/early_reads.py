"""Under ``ptodist check``: host code that touches a submitted dispatch's outputs before its ``result()``.

On a device a submitted dispatch runs while the host goes on, so a host line that reads (or writes) one
of its ``pl.Out`` / ``pl.InOut`` tensors between ``submit()`` and ``result()`` races with it: it sees the
old data, the new, or a mix.  A worker on ``sim`` runs the dispatch when ``result()`` asks for it (the
latest point a device may finish it), so the host saw the old data.  While such a dispatch is pending
the program's own lines are traced (``sys.settrace``, on the submitting thread, only under the checker);
a line that names a tensor whose memory overlaps a pending output is a touch.  When the dispatch ends
having changed that output, the touch is a race with an observable difference, kept in the check
session; it becomes a finding only if the script then fails (``check/explore.py``), so a program that
works is never reported for a line the tracer read wrongly.
"""

from __future__ import annotations

import keyword
import linecache
import re
import sys

import numpy as np

from ...check.findings import Finding
from ...source import is_internal, is_library, user_location
from .binding import byte_bounds

# Attributes that read a tensor's description, not its data: a line naming the tensor only for these is no touch.
_METADATA = frozenset({"shape", "dtype", "device", "ndim", "size", "dim", "numel", "stride", "strides",
                       "is_shared", "is_contiguous", "itemsize", "nbytes", "element_size", "data_ptr",
                       "share_memory_", "flags"})
_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)(?:\s*\.\s*([A-Za-z_]\w*))?")

FIX = ("Call result() (or wait()) on the dispatch's handle before the host reads or writes its outputs: move the "
       "host's line below result(), or give that code other tensors.")


class _Watch:
    """One submitted dispatch: its handle, the line that submitted it, its outputs and what touched them."""

    def __init__(self, handle, where: str, outputs: list):
        self.handle = handle
        self.where = where
        self.outputs = outputs      # (parameter name, value, (lo, hi) bytes, a copy of the data at submit)
        self.touches: dict = {}     # (line, name in the line, parameter name) -> the named tensor's bytes


_watches: list[_Watch] = []
_session = None  # the check session the pending watches report to


def _bounds(value) -> tuple[int, int] | None:
    """The byte range of a torch tensor's or numpy array's elements (None: not a tensor, or empty)."""
    if isinstance(value, np.ndarray):
        return byte_bounds(value) if value.size else None
    if type(value).__module__.startswith("torch") and hasattr(value, "data_ptr") and hasattr(value, "stride"):
        try:
            n = value.numel()
            if n == 0 or value.device.type != "cpu":
                return None
            size = value.element_size()
            lo = value.data_ptr()
            return lo, lo + sum((d - 1) * s for d, s in zip(value.shape, value.stride())) * size + size
        except (RuntimeError, TypeError):
            return None
    return None


def _snapshot(value) -> np.ndarray:
    return np.array(value.numpy(), copy=True) if hasattr(value, "numpy") and not isinstance(value, np.ndarray) \
        else np.array(value, copy=True)


def watch(session, handle, compiled, args: list) -> None:
    """Start watching the dispatch of ``handle`` (``args``: its bound host tensors, by host parameter)."""
    from ...language.types import Direction

    global _session
    if sys.gettrace() is not None and sys.gettrace() is not _global:
        return  # a debugger or coverage tool traces this thread: leave it alone
    outputs = []
    for p, a in zip(compiled.host.params, args):
        if a is None or a.kind != "host" or p.direction is Direction.IN:
            continue
        b = _bounds(a.value)
        if b is not None:
            outputs.append((p.name, a.value, b, _snapshot(a.value)))
    if not outputs:
        return
    if session is not _session:
        _watches.clear()  # left by an earlier schedule whose worker was never closed: not this run's
    loc = user_location(2)
    _watches.append(_Watch(handle, str(loc) if loc else "", outputs))
    _session = session
    sys.settrace(_global)
    frame = sys._getframe(1)
    while frame is not None:  # the frames already running: the submit's caller and those above it
        if _traced(frame.f_code.co_filename):
            frame.f_trace = _local
        frame = frame.f_back


def dispatched(args: list, line: str) -> None:
    """A later dispatch at ``line`` takes ``args``: naming them there hands them on (the ranks run dispatches in
    order), it touches nothing."""
    if not _watches:
        return
    passed = [b for a in args if a is not None and (b := _bounds(a.value)) is not None]
    for w in _watches:
        w.touches = {t: b for t, b in w.touches.items()
                     if t[0] != line or not any(_overlap(b, p) for p in passed)}


def finished(handle, error) -> None:
    """The dispatch of ``handle`` ended: keep its races (touched outputs it changed) in the session."""
    if not _watches:
        return
    w = next((w for w in _watches if w.handle is handle), None)
    if w is None:
        return
    _watches.remove(w)
    if not _watches:
        sys.settrace(None)
    if error is not None or not w.touches:
        return
    changed = {n for n, v, _, before in w.outputs
               if not np.array_equal(before, _snapshot(v), equal_nan=before.dtype.kind in "fc")}
    touches = [t for t in w.touches if t[2] in changed]
    if not touches:
        return
    params = list(dict.fromkeys(param for _, _, param in touches))
    outputs = ", ".join(f"'{p}'" for p in params)
    lines = ", ".join(f"'{name}' at {line}" for line, name, _ in touches)
    message = (f"the host uses output {outputs} of dispatch {handle.number} of '{handle.program}', submitted at "
               f"{w.where}, before its result(): {lines}. On a device a submitted dispatch runs while the host goes "
               "on, so such a line sees the old data, the new, or a mix. Here the dispatch ran at result(), after "
               "those lines, and changed what they named.")
    locations = list(dict.fromkeys(line for line, _, _ in touches)) + [w.where]
    _session.suspects.append(Finding("race", message, [], locations, None, FIX))


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _traced(filename: str) -> bool:
    return not is_internal(filename) and not is_library(filename) and not filename.startswith("<")


def _global(frame, event, arg):
    if event == "call" and _watches and _traced(frame.f_code.co_filename):
        return _local
    return None


def _local(frame, event, arg):
    if not _watches:
        frame.f_trace = None
        return None
    if event == "line":
        _line(frame)
    return _local


def _line(frame) -> None:
    """Note the watched outputs the line about to run names (a touch, unless only their metadata is read)."""
    code = frame.f_code
    text = linecache.getline(code.co_filename, frame.f_lineno)
    where = f"{code.co_filename}:{frame.f_lineno}"
    seen = set()
    for m in _NAME.finditer(text.split("#", 1)[0]):
        name, attr = m.group(1), m.group(2)
        if name in seen or keyword.iskeyword(name) or attr in _METADATA:
            continue
        seen.add(name)
        value = frame.f_locals.get(name, frame.f_globals.get(name))
        b = _bounds(value) if value is not None else None
        if b is None:
            continue
        for w in _watches:
            for param, _, ob, _ in w.outputs:
                if _overlap(b, ob):
                    w.touches[(where, name, param)] = b
