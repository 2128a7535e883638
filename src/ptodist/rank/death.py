"""Where a rank process was when it died without reporting: ``os._exit`` or a fatal signal (a native crash).

Such a rank runs no more Python, so it cannot send a result or a traceback.  Before it runs anything, a rank
process points ``faulthandler`` at a file of its own (an anonymous memfd that the driver, or the peers of an MPI
job, also hold open) and wraps ``os._exit`` so that a call writes the calling stack there first.  Whoever finds
the process gone reads the file (:func:`read`).  Nothing of this runs while the rank works: faulthandler's
handlers run only on a fatal signal, the wrapper only when the rank exits.
"""

from __future__ import annotations

import faulthandler
import os
import re
from dataclasses import dataclass

from ..source import is_internal, is_library, is_ptodist

# ptodist's own ways out of a rank process (a served group's end, a parent gone): no stack is written for them.
quiet_exit = os._exit

_RECORD_BYTES = 1 << 16  # what is read back: faulthandler writes at most 100 frames a thread
_EXIT_HEAD = "os._exit("
_BODY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "body.py")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def new_file(name: str) -> int:
    """A file for one rank's record: anonymous (nothing to delete), gone when its last holder closes it."""
    return os.memfd_create(f"ptodist-{name}", os.MFD_CLOEXEC)


def arm(fd: int) -> None:
    """In a rank process: on a fatal signal, or a call of ``os._exit``, write the Python stack to ``fd``."""
    faulthandler.enable(file=fd, all_threads=True)

    def _exit(status, /):
        if isinstance(status, int):  # anything else: os._exit raises TypeError, and the rank goes on
            os.write(fd, f"{_EXIT_HEAD}{status})\n".encode())
            faulthandler.dump_traceback(file=fd, all_threads=False)
        quiet_exit(status)

    _exit.__doc__ = quiet_exit.__doc__
    os._exit = _exit


@dataclass
class Death:
    """What a dead rank's record says: how it ended and the dying thread's Python stack."""

    cause: str                              # "os._exit(3)", or faulthandler's "Segmentation fault", ...
    frames: list[tuple[str, int, str]]      # (file, line, function), innermost first
    exited: bool                            # it called os._exit (else a fatal signal)

    def user_frame(self) -> tuple[str, int, str] | None:
        """The innermost frame of the program's own code (else of any code but ptodist's), or None."""
        ours = [f for f in self.frames if not is_internal(f[0])]
        return next((f for f in ours if not is_library(f[0])), ours[0] if ours else None)

    def at(self, task: str | None) -> str:
        """`` at FILE:LINE in kernel 'k'`` (or ``in FUNCTION``), the rank's last Python line; "" when unknown."""
        f = self.user_frame()
        if f is None:
            return ""
        where = f"kernel '{task}'" if f[2] == task else f[2]
        return f" at {f[0]}:{f[1]} in {where} (its last Python line)"

    def stack(self) -> str:
        """The stack as a traceback reads (outermost first): without ptodist's frames, unless it died in them."""
        frames = self.frames
        if frames and not is_ptodist(frames[0][0]):
            frames = [f for f in frames if not is_ptodist(f[0])]
        what = f"called {self.cause}" if self.exited else f"died ({self.cause})"
        lines = [f"Python stack when the rank {what} (faulthandler's dump, most recent call last):"]
        lines += [f'  File "{f}", line {n}, in {fn}' for f, n, fn in reversed(frames)]
        return "\n".join(lines)


def read(fd: int) -> Death | None:
    """The record a rank left in ``fd`` (None: it left none, e.g. killed by SIGKILL)."""
    try:
        text = os.pread(fd, _RECORD_BYTES, 0).decode(errors="replace")
    except OSError:
        return None
    if not text:
        return None
    lines = text.splitlines()
    exited = lines[0].startswith(_EXIT_HEAD)
    cause = lines[0].strip() if exited else lines[0].removeprefix("Fatal Python error:").strip()
    # faulthandler lists every thread; the one that died is "Current thread" (os._exit's dump: "Stack").
    blocks: list[tuple[str, list]] = []
    for line in lines[1:]:
        m = _FRAME.match(line)
        if m:
            if blocks:
                blocks[-1][1].append((m.group(1), int(m.group(2)), m.group(3)))
        elif line.endswith("(most recent call first):"):
            blocks.append((line, []))
    dying = next((b for b in blocks if b[0].startswith(("Current thread", "Stack"))), blocks[0] if blocks else None)
    frames = dying[1] if dying else []
    if exited and frames and frames[0][0] == __file__:
        frames = frames[1:]  # the os._exit wrapper's own frame
    # The rank's part ends at its body: a forked rank's outer frames are the driver's, where it forked.
    body = next((i for i, f in enumerate(frames) if f[0] == _BODY), None)
    return Death(cause or "a fatal signal", frames[:body] if body else frames, exited)
