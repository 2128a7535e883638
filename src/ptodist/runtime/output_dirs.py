"""Default output directories: a new one per program (``<name>_<YYYYmmdd_HHMMSS_ffffff>``), held in use while
the program lives, the oldest pruned beyond the number kept.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path

IN_USE = ".ptodist-in-use"  # a default output directory's lock file: a shared flock on it while its program lives
_held: dict = {}  # descriptor -> the finalizer that releases it: the output directories this process's programs hold


def _hold(owner, fd: int) -> None:
    """Hold ``fd`` (a directory's lock) while ``owner`` lives."""
    _held[fd] = weakref.finalize(owner, _release, fd)


def _release(fd: int) -> None:
    _held.pop(fd, None)
    os.close(fd)


def _forget_held() -> None:
    """In a forked child (a rank): the directories are the parent's to hold, and to release when its programs go
    (a child keeping the descriptor would keep the lock past them)."""
    for fd, fin in list(_held.items()):
        fin.detach()
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_held)


def new_output_dir(root: Path, name: str) -> tuple[Path, int]:
    """Make ``root/<name>_<YYYYmmdd_HHMMSS_ffffff>`` and hold it in use: return it and the descriptor whose shared
    ``flock`` on its lock file says so (closing it, or the process ending, releases it).

    The directory is made and locked under a hidden name and then renamed, so a process pruning ``root`` never
    sees it unlocked; two made in one microsecond get different stamps.
    """
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}_", suffix=".new", dir=root))
    fd = os.open(tmp / IN_USE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        while True:
            path = root / f"{name}_{datetime.datetime.now().strftime('%Y%m%d_%H%M%S_%f')}"
            try:
                os.rename(tmp, path)  # refused over another program's directory: it is not empty (its lock file)
                return path, fd
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
    except BaseException:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _unused(path: Path) -> int | bool:
    """Whether no live process holds ``path`` (a default output directory): False while one does; else True, or a
    descriptor that holds its lock file exclusively until closed (no one can take the directory up meanwhile)."""
    try:
        fd = os.open(path / IN_USE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # no lock file: made by an older ptodist, or by hand
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    return fd


def prune_outputs(root: Path, name: str, keep: int, current: Path) -> list[Path]:
    """Delete all but the ``keep`` newest of program ``name``'s default output directories under ``root``.

    Only directories named as ptodist names them (``<name>_<YYYYmmdd_HHMMSS_ffffff>``) are candidates, never
    ``current`` and never one a live process holds (its lock file's ``flock``: a program of this process or of
    another one writing there); ``keep`` 0 keeps every one.  A directory that cannot be deleted is left.  Returns
    the deleted.
    """
    if keep <= 0:
        return []
    pattern = re.compile(re.escape(name) + r"_\d{8}_\d{6}_\d{6}")
    try:
        with os.scandir(root) as entries:
            ours = sorted(e.name for e in entries if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False))
    except OSError:
        return []
    gone = []
    for old in ours[:-keep] if len(ours) > keep else []:  # the stamp sorts by time: oldest first
        path = root / old
        if path.name == current.name:
            continue
        unused = _unused(path)
        if unused is False:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if unused is not True:
            os.close(unused)
        gone.append(path)
    return gone
