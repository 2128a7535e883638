"""What the machine allows a run: memory for its windows, descriptors for its ranks, and why a rank was killed.

Backends ask here before they allocate or fork, so a run that cannot fit fails up front with
an error that names the resource, what the run asked for and the limit, instead of a raw
``OSError`` from ``mmap`` or ``pipe`` — and after a rank died of SIGKILL, whether the kernel's
OOM killer was at work.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import signal
import sys

from ..errors import ResourceError

_CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes (empty where there is none)."""
    out = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * 1024
    return out


def _cgroup_files(v2_name: str, v1_name: str) -> list[str]:
    """Candidate paths of a memory-controller file of this process's cgroup (v2, then v1)."""
    paths = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        hier, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hier == "0" and controllers == "":
            paths += [f"{_CGROUP_ROOT}{path.rstrip('/')}/{v2_name}", f"{_CGROUP_ROOT}/{v2_name}"]
        elif "memory" in controllers.split(","):
            paths += [f"{_CGROUP_ROOT}/memory{path.rstrip('/')}/{v1_name}", f"{_CGROUP_ROOT}/memory/{v1_name}"]
    return paths


@functools.lru_cache(maxsize=1)
def memory_limit() -> tuple[int, str]:
    """The memory a run can have at most, in bytes, and what sets it (RAM + swap, or a cgroup's limit).

    Read once per process: it bounds every one-shot call and worker arena, and does not change.
    """
    info = _meminfo()
    limit = info.get("MemTotal", 0) + info.get("SwapTotal", 0)
    what = "the machine's memory and swap"
    for path in _cgroup_files("memory.max", "memory.limit_in_bytes"):
        text = (_read(path) or "").strip()
        if text.isdigit() and 0 < int(text) < (limit or 1 << 62):
            limit, what = int(text), f"the memory limit of this process's cgroup ({path})"
            break
    return limit, what


def oom_kills() -> int | None:
    """How many processes of this cgroup the OOM killer has killed so far (None where it cannot be read)."""
    for path in _cgroup_files("memory.events", "memory.oom_control"):
        for line in (_read(path) or "").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def check_windows(program: str, windows, world: int, extra_bytes: int = 0) -> None:
    """Refuse a run whose symmetric windows (``world`` copies of each) cannot fit in memory at all."""
    total = sum(w.nbytes for w in windows) * world + extra_bytes
    limit, what = memory_limit()
    if limit and total > limit:
        raise ResourceError(f"{program}: the run needs {_needs(windows, world, total)}, but {what} allows "
                            f"{_size(limit)}. {_SHRINK}")


def no_memory(program: str, windows, world: int, total: int, e: OSError) -> ResourceError:
    """The error for an allocation of ``total`` bytes that the kernel refused (``e``)."""
    limit, what = memory_limit()
    avail = _meminfo().get("MemAvailable")
    now = f", {_size(avail)} of it available now" if avail is not None else ""
    return ResourceError(f"{program}: the kernel refused the {_size(total)} of shared memory the run needs "
                         f"({e.strerror}): {_needs(windows, world, total)}; {what} allows {_size(limit)}{now}. "
                         f"{_SHRINK}")


_SHRINK = ("Shrink the windows (pld.alloc_window_buffer takes bytes, or a shape and a dtype), use fewer ranks, "
           "or run on a machine with more memory.")


def _needs(windows, world: int, total: int) -> str:
    biggest = sorted(windows, key=lambda w: w.nbytes, reverse=True)[:3]
    named = ", ".join(f"'{w.name}' {_size(w.nbytes)}" for w in biggest) or "none"
    return (f"{_size(total)} of shared memory ({world} rank(s) x its window buffers, the largest {named}; "
            "and its host tensors)")


def ensure_descriptors(program: str, needed: int) -> None:
    """Make room for ``needed`` more open files: raise the soft limit toward the hard one, or refuse."""
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = open_now + needed + 16
    if soft == resource.RLIM_INFINITY or want <= soft:
        return
    if hard == resource.RLIM_INFINITY or want <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else max(want, soft),
                                                    hard))
        return
    raise ResourceError(
        f"{program}: the run needs {needed} more open files (two per rank: its channel and the "
        "file where it leaves its stack if it dies) but this process has "
        f"{open_now} open and may have at most {hard} (RLIMIT_NOFILE). Raise the limit (`ulimit -n {want}` "
        "as root or in limits.conf), or use fewer ranks.")


def death_note(status: int, kills_before: int | None) -> str:
    """Say how a rank process ended (``status`` from waitpid) and, for SIGKILL, whether memory ran out."""
    if not os.WIFSIGNALED(status):
        return f"exited with status {os.waitstatus_to_exitcode(status)}"
    sig = os.WTERMSIG(status)
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    text = f"was killed by signal {sig} ({name})"
    if sig != signal.SIGKILL:
        return text
    now = oom_kills()
    if kills_before is not None and now is not None and now > kills_before:
        return (text + f": the kernel's OOM killer killed {now - kills_before} process(es) of this cgroup during "
                "the run, so it most likely ran out of memory")
    return text + ": by the kernel's OOM killer if memory ran out (see `dmesg`), or by a `kill -9`"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


_BLAS_PREFIXES = ("scipy_openblas", "openblas")  # numpy's bundled OpenBLAS, and a system one
_BLAS_SUFFIXES = ("64_", "")


_blas_found: tuple = (-1, [])  # (len(sys.modules) when looked, what was found): a new import may load one


def _blas_calls() -> list[tuple]:
    """``(get_num_threads, set_num_threads, blas_thread_shutdown_ or None)`` of every OpenBLAS already loaded
    into this process."""
    global _blas_found
    if _blas_found[0] != len(sys.modules):  # reading /proc/self/maps costs a millisecond with torch loaded
        _blas_found = (len(sys.modules), _find_blas())
    return _blas_found[1]


def _find_blas() -> list[tuple]:
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            # address perms offset dev inode path: the path is the rest of the line (it may hold spaces)
            paths = {parts[5] for line in f if ".so" in line and "openblas" in line.lower()
                     if len(parts := line.rstrip("\n").split(maxsplit=5)) == 6}
    except OSError:
        return []
    calls = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        for prefix in _BLAS_PREFIXES:
            for suffix in _BLAS_SUFFIXES:
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    calls.append((get, put, getattr(lib, "blas_thread_shutdown_", None)))
                    break
            else:
                continue
            break
    return calls


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order: its affinity (``taskset``, a container's cpuset), which
    ``os.cpu_count()`` ignores."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # a platform without CPU affinity
        return list(range(os.cpu_count() or 1))


def pin_rank(rank: int, world: int) -> None:
    """In a rank process, when the ranks outnumber the CPUs: keep rank r on CPU r mod n of them.

    Left free, the scheduler now and then stacks three of four ranks on one of two CPUs and leaves them
    there for a while: on a 2-core machine a 1 MiB all_to_all at P = 4 then took 250-300 µs a call instead
    of 160-190, a 4 KiB allreduce 32 µs instead of 22, in stretches of hundreds of calls.  Pinned, every CPU
    holds its share of the ranks all the time.  When every rank has a CPU nothing is pinned: the scheduler's
    placement is as good, and it can move a rank away from other work.
    """
    cpus = usable_cpus()
    if world > len(cpus) and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):  # the CPU set changed meanwhile: the scheduler places the rank
            os.sched_setaffinity(0, {cpus[rank % len(cpus)]})


def one_blas_thread() -> None:
    """In a rank process: make the BLAS numpy loaded (OpenBLAS) and torch's intra-op pool use one thread.

    Ranks are the parallelism: several ranks each running a multi-threaded matmul on the same few cores make
    OpenBLAS's threads spin for cores the other ranks hold (a 64x128x128 product took 6 ms instead of 0.03 ms
    on a 2-core machine). torch's pool must also go to one thread because a rank is a fork: a driver that ran
    a parallel torch op before forking leaves the child an OpenMP pool whose threads do not exist, and the
    rank's first parallel op would wait for them forever. Only libraries already loaded are touched;
    nothing is loaded for this.

    Setting OpenBLAS's thread count starts its thread pool (a fork leaves the child none), whose worker then
    spins for work for about 0.1 s, taking the CPU from the rank: on a 2-core machine every dispatch of a new
    rank group took 4 ms instead of 0.1-0.3 ms for that long.  With one thread OpenBLAS needs no pool, so it
    is shut down again at once.
    """
    for _get, put, shutdown in _blas_calls():
        put(1)
        if shutdown is not None:
            shutdown()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(1)


@contextlib.contextmanager
def blas_on_one_thread():
    """While the block runs (ranks as threads of this process: ``sim``), one BLAS thread; then what it was."""
    calls = _blas_calls()
    before = [get() for get, _put, _shutdown in calls]
    for _get, put, _shutdown in calls:
        put(1)
    try:
        yield
    finally:
        for (_get, put, _shutdown), n in zip(calls, before):
            put(n)
