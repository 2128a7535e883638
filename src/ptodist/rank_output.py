"""What a rank prints: each line starts with ``[rank r] `` and reaches the terminal whole.

``shm`` ranks are forked processes that share the driver's stdout and stderr.
:func:`enter_rank`, called first thing in each rank process, sets the rank's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``PTODIST_DEVICE_ID``)
and replaces ``sys.stdout`` / ``sys.stderr`` with a :class:`RankStream`: it
holds text until a line is complete, then writes whole lines, prefixed, with
one ``os.write`` per batch of at most ``PIPE_BUF`` bytes (a write that size to
a pipe is atomic; a terminal or a file gets one write per batch too), so lines
of different ranks never mix. A line without its newline is written when the
rank flushes its output (``print(..., flush=True)``, the end of a dispatch).

``sim`` ranks are threads of one process, one running at a time:
:func:`enter_sim_rank` marks the calling thread as rank ``r`` and puts a
:class:`ThreadTagged` stream (which prefixes the lines of marked threads and
passes every other thread's text through) in front of ``sys.stdout`` and
``sys.stderr``. Threads share one environment, so it sets no variables.

Text written below Python's ``sys.stdout`` (``os.write(1, ...)``, C code,
``sys.stdout.buffer``) is not prefixed. ``PTODIST_RANK_PREFIX=0`` turns the
prefix off, ``1`` turns it on with one rank too; unset, it is on when the
world has more than one rank.
"""

from __future__ import annotations

import os
import select
import sys
import threading

from .config import rank_prefix_setting
from .errors import ConfigError

PIPE_BUF = getattr(select, "PIPE_BUF", 512)  # the size up to which a write to a pipe is atomic (4096 on Linux)


def prefix_wanted(world: int) -> bool:
    """Whether the ranks of a ``world``-rank run prefix their lines (``PTODIST_RANK_PREFIX``; default world > 1)."""
    try:
        setting = rank_prefix_setting()
    except ConfigError:  # refused by the driver before the run; a rank keeps the default
        setting = None
    return world > 1 if setting is None else setting


def prefix_of(rank: int) -> str:
    return f"[rank {rank}] "


def rank_environment(rank: int, world: int, device_id: int) -> dict[str, str]:
    """The variables a rank process gets: its rank, the world size, its rank on this machine, its device id."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "PTODIST_DEVICE_ID": str(device_id)}


def enter_rank(rank: int, world: int, device_id: int) -> None:
    """First thing in a rank process: set its environment; prefix what it prints (when wanted)."""
    os.environ.update(rank_environment(rank, world, device_id))
    if not prefix_wanted(world):
        return
    prefix = prefix_of(rank)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RankStream):
            setattr(sys, name, RankStream(stream, prefix))


class RankStream:
    """A text stream that writes whole lines, each starting with ``prefix``, to ``stream``'s file descriptor.

    Complete lines are written at once; the rest of the text waits for its newline or for :meth:`flush`.
    Without a file descriptor (an in-memory stream) the lines go to ``stream.write``.
    """

    def __init__(self, stream, prefix: str):
        self._stream = stream
        self._prefix = prefix
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._errors = getattr(stream, "errors", None) or "strict"
        try:
            self._fd = stream.fileno()
        except Exception:  # noqa: BLE001 - io.UnsupportedOperation, AttributeError, a closed stream
            self._fd = None
        self._pending: list[str] = []  # the text of the unfinished line
        self._at_start = True          # the next text starts a line (it gets the prefix)
        self._lock = threading.RLock()  # re-entrant: a signal handler may print while a write holds it
        self._os_write = os.write       # one call per batch of lines

    @property
    def encoding(self) -> str:
        return self._encoding

    @property
    def errors(self) -> str:
        return self._errors

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            cut = text.rfind("\n")
            if cut < 0:
                if text:
                    self._pending.append(text)
                return len(text)
            self._pending.append(text[:cut + 1])
            whole = "".join(self._pending)
            rest = text[cut + 1:]
            self._pending = [rest] if rest else []
            self._emit(_lines(whole))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Write the unfinished line, if any (the rest of it, when it comes, gets no prefix)."""
        with self._lock:
            if self._pending:
                text = "".join(self._pending)
                self._pending = []
                self._emit([text])
            if self._fd is None:
                self._stream.flush()

    def _emit(self, pieces: list[str]) -> None:
        """Write ``pieces`` (lines with their newline; the last may lack it), prefixing those that start a line."""
        batch: list[bytes] = []
        size = 0
        for piece in pieces:
            data = ((self._prefix if self._at_start else "") + piece).encode(self._encoding, self._errors)
            self._at_start = piece.endswith("\n")
            if batch and size + len(data) > PIPE_BUF:
                self._send(b"".join(batch))
                batch, size = [], 0
            batch.append(data)
            size += len(data)
        if batch:
            self._send(b"".join(batch))

    def _send(self, data: bytes) -> None:
        if self._fd is None:
            self._stream.write(data.decode(self._encoding, self._errors))
            self._stream.flush()
            return
        view = memoryview(data)
        while view:
            view = view[self._os_write(self._fd, view):]

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def writable(self) -> bool:
        return True

    def __getattr__(self, name):  # buffer, reconfigure, ...: the stream's own (unprefixed)
        return getattr(self._stream, name)


def _lines(text: str) -> list[str]:
    """``text`` cut after each newline (only ``\\n`` ends a line; a carriage return does not)."""
    parts = text.split("\n")
    out = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


# -- sim: ranks are threads ------------------------------------------------------------------------

_sim = threading.local()  # .prefix: the prefix of the rank this thread runs, when it is one
_install = threading.Lock()


def enter_sim_rank(rank: int, world: int) -> None:
    """First thing in a sim rank thread: what this thread prints starts with ``[rank r]`` (when wanted)."""
    if not prefix_wanted(world):
        return
    _sim.prefix = prefix_of(rank)
    with _install:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, ThreadTagged):
                setattr(sys, name, ThreadTagged(stream))


class ThreadTagged:
    """A text stream in front of ``stream``: the lines of sim rank threads get their rank's prefix.

    Text from any other thread passes through unchanged. When a rank thread's line on this stream is
    unfinished and another thread writes, or a rank thread writes while another thread's line is unfinished,
    that line is ended first, so lines never mix.
    """

    def __init__(self, stream):
        self._stream = stream
        self._open: tuple[int, bool] | None = None  # the thread whose line is unfinished; whether it is a rank
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:
            return 0
        me = threading.get_ident()
        prefix = getattr(_sim, "prefix", None)
        with self._lock:
            out = []
            if self._open is not None and self._open[0] != me and (self._open[1] or prefix is not None):
                out.append("\n")
                self._open = None
            if prefix is None:
                out.append(text)
            else:
                at_start = self._open is None or self._open[0] != me
                for piece in _lines(text):
                    out.append(prefix + piece if at_start else piece)
                    at_start = piece.endswith("\n")
            self._open = None if text.endswith("\n") else (me, prefix is not None)
            self._stream.write("".join(out))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


# -- mpi: every process of the job raises the same error; one prints its report --------------------------

_REPORT = "_ptodist_report"  # on an exception: (this process, the process that prints its report)


def report_once(error: BaseException, process: int, reporter: int = 0) -> BaseException:
    """Mark ``error``, which every process of an MPI job raises alike, as reported by process ``reporter``.

    Each process would otherwise print the same report, and a launcher forwarding their output as it comes
    interleaves them; the others print :func:`report_pointer`'s line instead. Returns ``error``.
    """
    setattr(error, _REPORT, (process, reporter))
    return error


def report_pointer(error: BaseException) -> str | None:
    """The one line this process prints instead of ``error``'s report (None: this process prints the report)."""
    mark = getattr(error, _REPORT, None)
    if mark is None or mark[0] == mark[1]:
        return None
    process, reporter = mark
    return (f"ptodist: rank {process}: {type(error).__name__}, raised alike in every process of the MPI job: "
            f"see the report printed by rank {reporter}")


def write_report(text: str) -> None:
    """Write ``text`` to stderr as whole lines, after everything Python held back, in writes of whole lines.

    Under a launcher that forwards each process's output as it comes, a report then never starts or ends in
    the middle of another process's line.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: what it held is lost either way
            pass
    if sys.stderr is None:
        return
    out = RankStream(sys.stderr, "")  # whole lines, in writes of at most PIPE_BUF bytes
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def job_excepthook(kind, error, tb, previous=sys.__excepthook__) -> None:
    """``sys.excepthook`` of an MPI job's process: an error every process raised is reported by one process
    (the others print a pointer to it); every other error as ``previous`` reports it."""
    line = report_pointer(error) if isinstance(error, BaseException) else None
    if line is not None:
        write_report(line)
    elif previous is sys.__excepthook__:
        import traceback

        write_report("".join(traceback.format_exception(kind, error, tb)))
    else:
        previous(kind, error, tb)
