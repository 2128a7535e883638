"""DistributedWorker: start the ranks once, dispatch many times.

``compiled.prepare()`` (or ``DistributedWorker(compiled)``) forks the rank
processes once (``backends.shm.RankGroup``).  A dispatch then:

1. binds the arguments in the caller's thread: host tensors must be shared
   memory (torch ``.share_memory_()``, or :func:`shared_array` for numpy);
   resident tensors (:class:`DeviceTensor`, :class:`StackedDeviceTensor`) live
   in shared files the worker owns;
2. plans (cached per program and argument signature; the host's sub-worker
   calls split the plan into segments, with a Python callback between two);
3. is queued: at most two dispatches are accepted at a time.  The driver
   publishes one command per segment to the ranks, watches it with the shm
   backend's failure and hang watch, runs the callbacks, and completes the
   dispatch's :class:`RunHandle`.

Whoever waits drives: ``result()`` (and ``done``) advance the queue in the
caller's thread; after the first ``submit()``, a background thread also does,
so accepted dispatches run while the caller does other work.  Memory reaches
the ranks as file descriptors (memfds, torch's shared-memory files), mapped
once per rank and unmapped when the tensor is freed or garbage collected.
"""

from __future__ import annotations

import ast
import bisect
import inspect
import itertools
import math
import mmap
import os
import textwrap
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .. import context, dfx
from ..backends import resources
from ..backends.shm import ALIGN, CommandWatch, RankGroup, WindowHeap, died
from ..compiler import checks
from ..compiler.plan import DispatchPlan, HostTensorRef, WindowView, _arg_json
from ..compiler.planner import PlanningContext
from ..errors import (
    ConfigError,
    DispatchTypeError,
    DispatchValueError,
    NotSharedError,
    ProgramError,
    ProgramTypeError,
    RankError,
)
from ..language import dtypes as dt
from ..language.functions import Function, Kind
from ..language.scalar import Scalar
from ..language.types import Direction
from ..source import user_location
from .config import RunConfig
from .program import unsupported_dtype

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds

DEFAULT_STARTUP_TIMEOUT_S = 60.0
MAX_IN_FLIGHT = 2
DRIVE_SLICE_S = 0.05     # the background thread hands the engine back this often
PLANS_KEPT_BY_RANKS = 256

_serials = itertools.count(1)


# -- shared memory the ranks can map ---------------------------------------------------------

def _memfd(name: str, size: int) -> int:
    """Return a descriptor of a new anonymous shared file of ``size`` bytes (never in /dev/shm)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:  # no memfd: an unlinked file in /dev/shm, gone as soon as nothing maps it
        import tempfile

        fd, path = tempfile.mkstemp(prefix="ptodist-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class _SharedFile:
    """A shared file the driver maps and the ranks map too (resident tensors, window heaps)."""

    def __init__(self, size: int, name: str):
        self.size = max(int(size), ALIGN)  # a mapping cannot be empty
        self.serial = next(_serials)
        self.fd = _memfd(name, self.size)
        self.mm = mmap.mmap(self.fd, self.size)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> None:
        self.bytes = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still referenced; the GC unmaps it
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _SharedMapping(mmap.mmap):
    """The memory of a :func:`shared_array`: its array's ``base``; the file closes with it."""


_SHARED: list[tuple[int, int, int, weakref.ref]] = []  # (start, end, serial, mapping) of shared arrays, sorted
_SHARED_LOCK = threading.Lock()


def shared_array(shape, dtype=np.float32) -> np.ndarray:
    """Return a zero-filled numpy array in shared memory, usable as a host tensor of a DistributedWorker.

    Args:
        shape: the array's shape (an int or a sequence of ints).
        dtype: a numpy dtype or a pl dtype (``pl.BF16`` gives an ``ml_dtypes.bfloat16`` array).

    The memory is an anonymous shared file: the worker's rank processes map it in place
    (no copy per dispatch), whether it was made before or after ``prepare()``.  It is
    freed when the array and every view of it are gone.
    """
    np_dtype = dtype.np_dtype if isinstance(dtype, dt.DataType) else np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shared_array(shape={list(shape)}): dimensions must be >= 0")
    nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
    size = max(nbytes, ALIGN)
    fd = _memfd("ptodist-array", size)
    try:
        mm = _SharedMapping(fd, size)
    except BaseException:
        os.close(fd)
        raise
    mm.fd, mm.size, mm.serial = fd, size, next(_serials)
    start = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    mm.address = start
    with _SHARED_LOCK:
        bisect.insort(_SHARED, (start, start + size, mm.serial, weakref.ref(mm)))
    weakref.finalize(mm, _shared_gone, mm.serial, fd)
    return np.ndarray(shape, dtype=np_dtype, buffer=mm)


def _shared_gone(serial: int, fd: int) -> None:
    with _SHARED_LOCK:
        _SHARED[:] = [e for e in _SHARED if e[2] != serial]
    os.close(fd)


def _shared_mapping(lo: int, hi: int) -> _SharedMapping | None:
    """Return the live shared_array memory that holds bytes ``[lo, hi)``, if any."""
    with _SHARED_LOCK:
        i = bisect.bisect_right(_SHARED, (lo, math.inf)) - 1
        if i >= 0:
            start, end, _, ref = _SHARED[i]
            mm = ref()
            if mm is not None and start <= lo and hi <= end:
                return mm
    return None


# -- resident tensors ------------------------------------------------------------------------

class DeviceTensor:
    """A tensor resident in a worker's ranks: a dispatch uses it in place, with no copy.

    Made by ``rt.alloc_tensor`` (or ``stacked[i]`` for one shard of a stacked tensor);
    ``shape`` and ``dtype`` (a pl dtype) describe it.  Read and write it from the host with
    ``rt.copy_from`` / ``rt.copy_to``; release it with ``rt.free_tensor``.
    """

    def __init__(self, core: _Core, file: _SharedFile, offset: int, shape: tuple, dtype: dt.DataType,
                 parent: StackedDeviceTensor | None = None, index: int | None = None):
        self._core = core
        self._file = file
        self._offset = offset
        self.shape = tuple(shape)
        self.dtype = dtype
        self._parent = parent
        self._index = index

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.get_byte()

    @property
    def freed(self) -> bool:
        """True once the tensor (or, for a shard, its stacked tensor) was freed or its worker closed."""
        return self._file is None or (self._parent is not None and self._parent.freed)

    def _array(self) -> np.ndarray:
        return np.ndarray(self.shape, dtype=self.dtype.np_dtype, buffer=self._file.bytes, offset=self._offset)

    def describe(self) -> str:
        what = f"shard {self._index} of a StackedDeviceTensor" if self._parent is not None else "DeviceTensor"
        return f"{what} {list(self.shape)} {self.dtype.name}"

    def __repr__(self) -> str:
        return f"<{self.describe()}{' (freed)' if self.freed else ''}>"


class StackedDeviceTensor:
    """A tensor sharded over the ranks along dim 0: ``obj[i]`` (a DeviceTensor) is rank i's shard.

    Made by ``rt.alloc_stacked_tensor(host)``; ``shape`` is the whole stacked shape
    ``[world, ...]``.  Passed to a host parameter ``x``, the host orchestrator gives rank
    ``r`` its own shard as ``x[r]``.
    """

    def __init__(self, core: _Core, file: _SharedFile, shape: tuple, dtype: dt.DataType):
        self._core = core
        self._file = file
        self.shape = tuple(shape)
        self.dtype = dtype
        shard = tuple(shape[1:])
        step = int(np.prod(shard, dtype=np.int64)) * dtype.get_byte()
        self._shards = [DeviceTensor(core, file, i * step, shard, dtype, self, i) for i in range(shape[0])]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.get_byte()

    @property
    def freed(self) -> bool:
        return self._file is None

    def __len__(self) -> int:
        return len(self._shards)

    def __getitem__(self, i: int) -> DeviceTensor:
        try:
            return self._shards[i.__index__()]
        except (AttributeError, TypeError):
            raise TypeError(f"StackedDeviceTensor indices are rank numbers (ints), got {i!r}") from None
        except IndexError:
            raise IndexError(f"StackedDeviceTensor {list(self.shape)} has {len(self._shards)} shards "
                             f"(one per rank); index {i} is out of range") from None

    def _array(self) -> np.ndarray:
        return np.ndarray(self.shape, dtype=self.dtype.np_dtype, buffer=self._file.bytes)

    def describe(self) -> str:
        return f"StackedDeviceTensor {list(self.shape)} {self.dtype.name}"

    def __repr__(self) -> str:
        return f"<{self.describe()}{' (freed)' if self.freed else ''}>"


def _as_dtype(dtype, where: str) -> dt.DataType:
    if isinstance(dtype, dt.DataType):
        return dtype
    if type(dtype).__module__ == "torch":
        found = dt.from_torch(dtype)
    else:
        try:
            found = dt.from_numpy(np.dtype(dtype))
        except TypeError:
            found = None
    if found is None:
        raise DispatchTypeError(f"{where}: dtype={dtype!r} is not a dtype ptodist supports; give a pl dtype "
                                "(pl.FP32, ...), a torch dtype or a numpy dtype")
    return found


def _host_array(value, where: str, writable: bool = False) -> np.ndarray:
    """Return a numpy view of a CPU host tensor (torch or numpy), for the staged copies."""
    if type(value).__module__.startswith("torch"):
        import torch

        if not isinstance(value, torch.Tensor):
            raise DispatchTypeError(f"{where}: expected a host tensor, got {type(value).__name__}")
        if value.device.type != "cpu":
            raise DispatchTypeError(f"{where}: the tensor is on {value.device}; pass a CPU tensor")
        if dt.from_torch(value.dtype) is None:
            raise DispatchTypeError(f"{where}: torch dtype {value.dtype} is not supported by ptodist")
        t = value.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(dt.BF16.np_dtype)
        return t.numpy()
    if isinstance(value, np.ndarray):
        if dt.from_numpy(value.dtype) is None:
            raise DispatchTypeError(f"{where}: numpy dtype {value.dtype} is not supported by ptodist")
        if writable and not value.flags.writeable:
            raise DispatchTypeError(f"{where}: the numpy array is read-only")
        return value
    raise DispatchTypeError(f"{where}: expected a host tensor (torch tensor or numpy array), got "
                            f"{type(value).__name__}")


# -- handles ---------------------------------------------------------------------------------

class RunHandle:
    """One accepted dispatch: ``result(timeout)`` (alias ``wait``) waits for it, ``done`` asks.

    ``result`` returns what a one-shot call would (the host's ``pl.Out``/``pl.InOut``
    tensors) or raises the dispatch's error; every call raises the same exception object.
    """

    def __init__(self, worker: DistributedWorker, program: str, number: int):
        self._worker = worker  # keeps the worker (and its ranks) alive while the handle is
        self._core = worker._core
        self.program = program
        self.number = number  # this worker's dispatch count when it was accepted
        self._event = threading.Event()
        self._finished = False
        self._value = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        """True once the dispatch has finished (successfully or not); never blocks for long."""
        if not self._finished:
            self._core.poke()
        return self._finished

    def result(self, timeout: float | None = None):
        """Wait for the dispatch; return its outputs or raise its error.

        Raises:
            TimeoutError: it did not finish within ``timeout`` seconds (it keeps running).
        """
        if not self._finished:
            deadline = None if timeout is None else time.monotonic() + max(float(timeout), 0.0)
            self._core.drive(self, deadline)
            if not self._finished:
                raise TimeoutError(f"dispatch {self.number} of '{self.program}' did not finish within {timeout:g} s; "
                                   "it is still running: call result() again to keep waiting")
        if self._error is not None:
            raise self._error
        return self._value

    wait = result

    def _complete(self, value=None, error: BaseException | None = None) -> None:
        if self._finished:
            return
        self._value, self._error = value, error
        self._finished = True
        self._event.set()

    def __repr__(self) -> str:
        state = "running" if not self._finished else ("failed" if self._error is not None else "done")
        return f"<RunHandle dispatch {self.number} of '{self.program}' ({state})>"


DistributedRunHandle = RunHandle


# -- planning: the host orchestrator, with its sub-worker calls --------------------------------

@dataclass
class _HostCall:
    """A sub-worker call the host orchestrator made: it runs in the driver between two segments."""

    seq: int
    function: Function
    args: list
    location: str


class _WorkerPlanningContext(PlanningContext):
    """Planning on a worker: sub-worker calls are recorded (they run as callbacks), not refused."""

    def __init__(self, *args):
        super().__init__(*args)
        self.host_calls: list[_HostCall] = []

    def call_function(self, fn, args, kwargs, device):
        if fn.kind is not Kind.SUBWORKER:
            return super().call_function(fn, args, kwargs, device)
        loc = user_location(2)
        if device is not None:
            raise ProgramError(f"{fn.name}(..., device=...) at {loc}: '{fn.name}' is a sub-worker function "
                               "(pl.Role.SubWorker): it runs once per dispatch on the host, as a callback. "
                               "Call it without device=.")
        values = fn.bind_arguments(args, kwargs)
        for spec, v in zip(fn.params, values):
            if isinstance(v, WindowView):
                raise ProgramTypeError(f"{fn.name}() at {loc}: parameter '{spec.name}' is given a window; windows "
                                       "live in the ranks, a sub-worker callback runs on the host. Pass a host "
                                       "tensor (copy the window into one in a kernel first).")
        self.host_calls.append(_HostCall(self._seq, fn, values, str(loc)))
        self._seq += 1
        return None


@dataclass
class _PlanEntry:
    """A plan as the worker uses it: the plan, its callbacks, and how it travels to the ranks."""

    id: int
    plan: DispatchPlan
    host_calls: list
    blob: bytes
    steps: list          # ("segment", j) and ("call", _HostCall), in host order
    layout: tuple        # (name, nbytes, offset) of each window buffer
    heap: int            # bytes of window heap per rank
    refs: dict = field(default_factory=dict)  # host param index -> [(rank, index, location)]


def _steps(plan: DispatchPlan, calls: list[_HostCall]) -> list:
    bounds = [c.seq for c in calls]
    steps = []
    for j in range(len(calls) + 1):
        lo = bounds[j - 1] if j else -1
        hi = bounds[j] if j < len(bounds) else math.inf
        if any(lo < t.seq < hi for ts in plan.tasks for t in ts):
            steps.append(("segment", j))
        if j < len(calls):
            steps.append(("call", calls[j]))
    return steps


def _host_refs(plan: DispatchPlan) -> dict:
    refs: dict = {}

    def visit(a, rank, loc):
        if isinstance(a, HostTensorRef):
            refs.setdefault(a.tensor.index, []).append((rank, a.index, loc))
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x, rank, loc)

    for r, tasks in enumerate(plan.tasks):
        for t in tasks:
            visit(t.args, r, t.location)
    return refs


def _is_abstract(fn: Function) -> bool:
    """True when the function's body is ``...`` (after an optional docstring): a callback point."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        return False
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
            isinstance(body[0].value.value, str):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
        body[0].value.value is Ellipsis


# -- arguments ---------------------------------------------------------------------------------

class _Arg:
    """A tensor argument of a dispatch, as the ranks will see it (the adapter ``_bind`` uses)."""

    __slots__ = ("value", "dtype", "shape", "is_torch", "kind", "map", "offset", "strides", "resident")

    def __init__(self, value, dtype, shape, is_torch, kind, map_=None, offset=0, strides=None, resident=None):
        self.value = value
        self.dtype = dtype
        self.shape = tuple(shape)
        self.is_torch = is_torch
        self.kind = kind          # "host", "resident", "stacked" or "empty"
        self.map = map_           # the _Map of its memory
        self.offset = offset      # bytes from the start of that memory to element 0
        self.strides = strides    # in bytes
        self.resident = resident  # the DeviceTensor / StackedDeviceTensor


class _Map:
    """Memory the ranks map under ``token``: a torch storage, a shared array, a resident tensor, a heap."""

    __slots__ = ("token", "size", "fd", "owns_fd", "ref", "sent", "finalizer", "data_offset")

    def __init__(self, token: int, size: int, fd: int, owns_fd: bool):
        self.token = token
        self.size = size
        self.data_offset = 0    # where the owner's data starts in the file
        self.fd = fd            # to send on first use
        self.owns_fd = owns_fd  # close it once sent (or forgotten)
        self.ref = None         # weak reference to the memory's owner, when the worker does not own it
        self.sent = False
        self.finalizer = None   # queues the token for dropping when the owner dies


def _torch_file(token: int, fd: int, size: int, owns_fd: bool) -> _Map:
    """The map of a torch shared storage: its data may follow a header (a reference count) in the file."""
    total = os.fstat(fd).st_size
    m = _Map(token, total, fd, owns_fd)
    m.data_offset = total - size
    return m


class _Arena:
    """A window heap file: ``stride`` bytes per rank."""

    def __init__(self, stride: int, world: int, map_: _Map, file: _SharedFile):
        self.stride = stride
        self.world = world
        self.map = map_
        self.file = file
        self.layout: tuple | None = None
        self.used = False


class _Bound:
    """The arguments of a program's last dispatch, bound: the same objects, unchanged, bind the same way.

    Tensors are held weakly (the worker must not keep the caller's memory alive) and checked
    for what binding depends on: address, shape, strides and dtype; other arguments by identity.
    """

    __slots__ = ("items", "values", "hosts", "entry")

    def __init__(self, items, values, hosts, entry):
        self.items, self.values, self.hosts, self.entry = items, values, hosts, entry

    @staticmethod
    def _key(a):
        if isinstance(a, np.ndarray):
            return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype, a.flags.writeable)
        if isinstance(a, (DeviceTensor, StackedDeviceTensor)):
            return a._file
        return (a.data_ptr(), a.shape, a.stride(), a.dtype)

    @classmethod
    def of(cls, args, values, hosts, entry) -> _Bound | None:
        items = []
        for a in args:
            if isinstance(a, (np.ndarray, DeviceTensor, StackedDeviceTensor)) or type(a).__module__.startswith("torch"):
                try:
                    items.append((weakref.ref(a), cls._key(a)))
                except TypeError:
                    return None
            else:
                items.append((None, a))
        return cls(items, values, hosts, entry)

    def matches(self, args, by_token: dict) -> bool:
        if len(args) != len(self.items):
            return False
        for a, (ref, key) in zip(args, self.items):
            if ref is None:
                if a is not key:
                    return False
            elif ref() is not a or self._key(a) != key:
                return False
        # A resident tensor freed since, or memory forgotten since, binds differently (or not at all).
        return all(h is None or h.kind == "empty" or (h.map.token in by_token and
                                                      (h.resident is None or not h.resident.freed))
                   for h in self.hosts)


@dataclass(eq=False)
class _Dispatch:
    handle: RunHandle
    compiled: object
    entry: _PlanEntry
    args: list
    values: list
    config: RunConfig
    dfx: object
    arena_key: int | None
    cursor: int = 0
    published: bool = False
    residents: set = field(default_factory=set)  # serials of the resident files it uses


_tls = threading.local()


def _in_callback():
    return getattr(_tls, "callback", None)


# -- the engine -------------------------------------------------------------------------------

class _Core:
    """Everything a worker owns, and the engine that runs its queue (no reference to the facade)."""

    def __init__(self, programs: list, config: RunConfig, persistent: bool, reset: bool, callbacks: dict,
                 startup_timeout_s: float):
        self.programs = programs
        self.config = config
        self.device_ids = list(programs[0].device_ids)
        self.world = len(self.device_ids)
        self.persistent = persistent
        self.reset = reset
        self.callbacks = callbacks
        self.state = threading.RLock()
        self.engine = threading.Lock()
        self.wakeup = threading.Condition(self.state)
        self.queue: deque[_Dispatch] = deque()
        self.watch: CommandWatch | None = None
        self.watching: _Dispatch | None = None
        self.broken: str | None = None
        self.closing = False
        self.closed = False
        self.dispatches = 0
        self.maps: dict = {}         # key -> _Map
        self.by_token: dict = {}     # token -> key
        self.tensors: dict = {}      # id(torch tensor) -> (weakref, (data_ptr, shape, stride, dtype), map, offset,
        #                              strides): what binding one costs is paid once per tensor
        self.tokens = itertools.count(1)
        self.forgotten: deque = deque()  # tokens whose memory is gone (appended from finalizers too)
        self.drops: list[int] = []
        self.plans: dict = {}
        self.plan_ids = itertools.count()
        self.sent_plans: set[int] = set()
        self.forget_plans = False
        self.arenas: dict = {}       # 0 (shared by every program), or a program's index when persistent
        self.layouts: dict = {}      # program index -> persistent window layout
        self.residents: dict = {}    # serial -> DeviceTensor / StackedDeviceTensor
        self.thread: threading.Thread | None = None
        self.waiters = 0             # callers driving the queue themselves (in result())
        self.last_bound: dict = {}   # program index -> _Bound of its last dispatch
        objects: dict = {}
        for c in programs:
            for f in checks.reachable_functions(c.host, c._extra):
                objects[id(f.fn)] = f
                if f.bound_self is not None:
                    objects[id(f.bound_self)] = f.bound_self
        self.group = RankGroup(self.device_ids, objects, startup_timeout_s)

    # -- memory the ranks map --------------------------------------------------------------
    def _entry(self, key, owner, make) -> _Map:
        """Return the map of ``key``; a new one (new token) when ``owner`` is not the one it was made for."""
        m = self.maps.get(key)
        if m is not None and (m.ref is None or m.ref() is owner):
            return m
        if m is not None:  # the memory at this key died and was reused: its old token goes
            del self.maps[key]
            self._release(m)
        m = make(next(self.tokens))
        self.maps[key] = m
        self.by_token[m.token] = key
        if owner is not None:
            m.ref = weakref.ref(owner)
            m.finalizer = weakref.finalize(owner, self.forgotten.append, m.token)
        return m

    def _release(self, m: _Map) -> None:
        if m.finalizer is not None:
            m.finalizer.detach()
            m.finalizer = None
        self.by_token.pop(m.token, None)
        if m.sent:
            self.drops.append(m.token)
        elif m.owns_fd and m.fd >= 0:
            os.close(m.fd)
        m.fd = -1

    def _forgotten(self) -> None:
        """Drop the maps whose memory died (finalizers only queue their tokens)."""
        while self.forgotten:
            key = self.by_token.get(self.forgotten.popleft())
            if key is not None:
                self._release(self.maps.pop(key))

    def torch_map(self, storage) -> _Map:
        import torch.multiprocessing as tmp

        if tmp.get_sharing_strategy() == "file_system":
            _, name, size = storage._share_filename_cpu_()
            name = name.decode() if isinstance(name, bytes) else name

            def make(token):
                fd = os.open("/dev/shm/" + name.lstrip("/"), os.O_RDWR | os.O_CLOEXEC)
                return _torch_file(token, fd, size, True)
        else:
            fd, size = storage._share_fd_cpu_()  # torch's own descriptor, valid while the storage lives

            def make(token):
                return _torch_file(token, fd, size, False)
        return self._entry(("torch", storage.data_ptr()), storage, make)

    def array_map(self, mm: _SharedMapping) -> _Map:
        return self._entry(("array", mm.serial), mm, lambda token: _Map(token, mm.size, mm.fd, False))

    def file_map(self, file: _SharedFile) -> _Map:
        return self._entry(("file", file.serial), None, lambda token: _Map(token, file.size, file.fd, False))

    def forget_file(self, file: _SharedFile) -> None:
        m = self.maps.pop(("file", file.serial), None)
        if m is not None:
            self._release(m)
        file.close()

    # -- binding ----------------------------------------------------------------------------
    def adapt(self, value, name: str, compiled) -> _Arg:
        where = f"{compiled.host.name}() parameter '{name}'"
        if isinstance(value, (DeviceTensor, StackedDeviceTensor)):
            self.check_resident(value, where)
            kind = "stacked" if isinstance(value, StackedDeviceTensor) else "resident"
            file = value._file
            offset = value._offset if isinstance(value, DeviceTensor) else 0
            itemsize = value.dtype.get_byte()
            strides = tuple(int(s) * itemsize for s in _c_strides(value.shape))
            return _Arg(value, value.dtype, value.shape, False, kind, self.file_map(file), offset, strides, value)
        module = type(value).__module__
        if module.startswith("torch"):
            import torch

            if isinstance(value, torch.Tensor):
                return self._torch_arg(value, name, where)
        if isinstance(value, np.ndarray):
            dtype = dt.from_numpy(value.dtype)
            if dtype is None:
                raise unsupported_dtype(name, value.dtype, False)
            if value.size == 0:
                return _Arg(value, dtype, value.shape, False, "empty")
            lo, hi = byte_bounds(value)
            mm = _shared_mapping(lo, hi)
            if mm is None:
                raise NotSharedError(
                    f"{where}: the numpy array is not in shared memory, so the worker's rank processes cannot see "
                    "it. Allocate it with ptodist.shared_array(shape, dtype) and fill it in place, or copy it to "
                    "the worker: rt.alloc_tensor(shape, dtype, init=array) (or rt.copy_to) and pass the "
                    "DeviceTensor.")
            offset = value.__array_interface__["data"][0] - mm.address
            return _Arg(value, dtype, value.shape, False, "host", self.array_map(mm), offset, value.strides)
        raise DispatchTypeError(f"parameter '{name}' is a tensor parameter; got {type(value).__name__}. Pass a torch "
                                "tensor, a numpy array, or a DeviceTensor / StackedDeviceTensor of this worker.")

    def _torch_arg(self, t, name: str, where: str) -> _Arg:
        dtype = dt.from_torch(t.dtype)
        if dtype is None:
            raise unsupported_dtype(name, t.dtype, True)
        if t.device.type != "cpu":
            raise DispatchTypeError(f"host tensor '{name}' is on {t.device}; pass a CPU tensor")
        itemsize = dtype.get_byte()
        strides = tuple(int(s) * itemsize for s in t.stride())
        key = (t.data_ptr(), t.shape, t.stride(), dtype)
        hit = self.tensors.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == key and hit[2].token in self.by_token:
            return _Arg(t, dtype, key[1], True, "host", hit[2], hit[3], hit[4])
        if t.numel() == 0:
            return _Arg(t, dtype, t.shape, True, "empty")
        if t.is_shared():
            storage = t.untyped_storage()
            m = self.torch_map(storage)
            offset = m.data_offset + t.data_ptr() - storage.data_ptr()
            tensors, ident = self.tensors, id(t)
            tensors[ident] = (weakref.ref(t, lambda _: tensors.pop(ident, None)), key, m, offset, strides)
            return _Arg(t, dtype, t.shape, True, "host", m, offset, strides)
        lo = t.data_ptr()
        hi = lo + sum((d - 1) * s for d, s in zip(t.shape, strides)) + itemsize
        mm = _shared_mapping(lo, hi)  # e.g. torch.from_numpy(ptodist.shared_array(...))
        if mm is not None:
            return _Arg(t, dtype, t.shape, True, "host", self.array_map(mm), lo - mm.address, strides)
        raise NotSharedError(
            f"{where}: the torch tensor is not in shared memory, so the worker's rank processes cannot see it. "
            f"Call {name}.share_memory_() on it (before or after prepare()), or copy it to the worker: "
            f"rt.alloc_tensor(shape, dtype, init={name}) (or rt.copy_to) and pass the DeviceTensor.")

    def check_resident(self, t, where: str) -> None:
        if t._core is not self:
            raise DispatchValueError(f"{where}: {t.describe()} belongs to another DistributedWorker; a resident tensor "
                                     "lives in the ranks of the worker that allocated it. Allocate it on this "
                                     "worker, or move the data through the host (copy_from on the other, copy_to "
                                     "here).")
        if t.freed:
            raise DispatchValueError(f"{where}: {t.describe()} was freed (free_tensor / free_stacked_tensor); "
                                     "allocate a new one with alloc_tensor / alloc_stacked_tensor.")

    def new_output(self, p, shape, like_torch: bool):
        if like_torch:
            import torch

            return torch.zeros(shape, dtype=dt.to_torch(p.ttype.dtype)).share_memory_()
        return shared_array(shape, p.ttype.dtype)

    # -- planning -----------------------------------------------------------------------------
    def plan_for(self, index: int, compiled, values: list, hosts: list) -> _PlanEntry:
        key = (index, compiled._plan_key(values, hosts))
        entry = self.plans.get(key)
        if entry is not None:
            return entry
        specs = compiled._host_specs(hosts)
        ctx = _WorkerPlanningContext(compiled.name, compiled.device_ids, specs, compiled.host)
        proxies = list(values)
        for spec in specs:
            proxies[spec.index] = HostTensorRef(spec)
        with context.using(ctx):
            compiled.host.invoke(*proxies)
        plan = ctx.plan
        checks.check_coverage(plan, compiled.host)
        calls = ctx.host_calls
        for call in calls:
            if call.function.name not in self.callbacks and _is_abstract(call.function):
                raise ProgramError(f"{call.function.name}() at {call.location}: sub-worker function "
                                   f"'{call.function.name}' ({call.function.location}) has no body and no callback; "
                                   f"pass prepare(callbacks={{'{call.function.name}': fn}}).")
        try:
            blob = self.group.encode_plan((plan, [c.seq for c in calls]))
        except Exception as e:  # noqa: BLE001 - anything unpicklable in a task's arguments
            raise DispatchTypeError(
                f"{compiled.name}: the dispatch plan cannot be sent to the worker's ranks ({type(e).__name__}: {e}). "
                "Arguments of per-device functions must be tensors, windows, scalars or picklable values, and the "
                "functions must be reachable from the programs given to prepare().") from None
        heap = -(-plan.window_heap_bytes // ALIGN) * ALIGN
        entry = _PlanEntry(next(self.plan_ids), plan, calls, blob, _steps(plan, calls),
                           tuple((w.name, w.nbytes, w.offset) for w in plan.windows), heap, _host_refs(plan))
        self.plans[key] = entry
        out = plan.to_json()
        if calls:
            out["sub_worker_calls"] = [{"seq": c.seq, "function": c.function.name, "called_at": c.location,
                                        "args": [_arg_json(a) for a in c.args]} for c in calls]
        compiled._write_plan(out)
        return entry

    # -- accepting a dispatch -------------------------------------------------------------------
    def accept(self, worker: DistributedWorker, index: int, compiled, args: tuple, config: RunConfig | None,
               call: str) -> RunHandle:
        self.check_ranks()
        cfg = config or self.config
        if config is not None:
            if config.distributed_config is not None and list(config.distributed_config.device_ids) != \
                    self.device_ids:
                raise DispatchValueError(f"{compiled.name}: called with device_ids "
                                         f"{config.distributed_config.device_ids} but the worker runs on "
                                         f"{self.device_ids}; prepare another worker for other devices")
            _check_backend(config)
        with self.state:  # binding registers memory the engine thread also reads
            last = self.last_bound.get(index) if config is None else None
            if last is not None and last.matches(args, self.by_token):
                values, hosts, entry = last.values, last.hosts, last.entry  # the same arguments as last time
            else:
                values, hosts, created = compiled._bind(args, adapt=lambda v, n: self.adapt(v, n, compiled),
                                                        new_output=self.new_output)
                entry = self.plan_for(index, compiled, values, hosts)
                self._check_args(compiled, entry, hosts)
                self.last_bound[index] = _Bound.of(args, values, hosts, entry) if not created else None
            arena_key = None
            if entry.heap:
                arena_key = index if self.persistent else 0
                if self.persistent:
                    self._check_layout(index, compiled, entry)
            number = self.dispatches
            self.dispatches += 1
            handle = RunHandle(worker, compiled.name, number)
            request = dfx.request_for(cfg, lambda: compiled.output_dir, compiled._dispatches) \
                if cfg.enable_chip_swimlane or cfg.enable_dep_gen or cfg.enable_scope_stats else None
            compiled._dispatches += 1
            d = _Dispatch(handle, compiled, entry, hosts, values, cfg, request, arena_key)
            d.residents = {h.map.token for h in hosts if h is not None and h.kind in ("resident", "stacked")}
            self.queue.append(d)
            if self.persistent and entry.heap and index not in self.layouts:
                self.layouts[index] = entry.layout
        return handle

    def _check_args(self, compiled, entry: _PlanEntry, hosts: list) -> None:
        for i, h in enumerate(hosts):
            if h is None or h.kind != "stacked":
                continue
            name = compiled.host.params[i].name
            for rank, idx, loc in entry.refs.get(i, ()):
                if not idx or idx[0] != rank:
                    given = f"{name}[{', '.join(map(str, idx))}]" if idx else name
                    raise DispatchValueError(
                        f"{compiled.name}() parameter '{name}' is a StackedDeviceTensor: shard i lives on rank i, but "
                        f"the dispatch to rank {rank} at {loc} is given {given}. Give each rank its own shard: "
                        f"{name}[r] in the dispatch loop.")
            for call in entry.host_calls:
                for a in call.args:
                    if isinstance(a, HostTensorRef) and a.tensor.index == i and len(a.index) > 1:
                        raise DispatchValueError(
                            f"{call.function.name}() at {call.location}: a sub-worker callback gets a "
                            f"StackedDeviceTensor whole or one shard ({name}[i]), not {a.name}")
        for call in entry.host_calls:
            for a in call.args:
                if isinstance(a, HostTensorRef) and hosts[a.tensor.index].kind == "resident" and a.index:
                    name = compiled.host.params[a.tensor.index].name
                    raise DispatchValueError(
                        f"{call.function.name}() at {call.location}: a sub-worker callback gets a DeviceTensor "
                        f"whole ({name}), not a part of it ({a.name}); read parts with rt.copy_from.")

    def _check_layout(self, index: int, compiled, entry: _PlanEntry) -> None:
        before = self.layouts.get(index)
        if before is not None and before != entry.layout:
            raise DispatchValueError(
                f"{compiled.name}: this dispatch allocates windows {_layout_text(entry.layout)}, but the worker's "
                f"persistent windows were laid out as {_layout_text(before)} by the program's first dispatch. "
                "Persistent windows keep one layout for the worker's lifetime: allocate the same window buffers "
                "(names and sizes, in the same order) on every dispatch, or prepare the worker without "
                "persistent=True.")

    def check_ranks(self) -> None:
        """With nothing in flight: raise RankError when a rank died while the worker was idle."""
        dead = self.group.reap() if not self.queue else []
        if dead:
            self.group.kill()
            notes = self.group.death_notes
            self.broken = (f"rank {dead[0].rank} (device {dead[0].device_id}) died while the worker was idle "
                           f"({notes[dead[0].rank]})")
            for f in dead:
                f.task = None  # its status row still names the last task of an earlier dispatch
                f.message = (died(notes[f.rank], ", while the worker was idle between dispatches")
                             + "; the worker stopped its other ranks. Close it and prepare a new one.")
            raise RankError(dead)

    def check_usable(self, call: str) -> None:
        """Raise RuntimeError when the worker is closed or broken, or ``call`` is refused in a callback."""
        if self.closed or self.closing:
            raise RuntimeError(f"DistributedWorker.{call}: the worker is closed. Prepare a new one with "
                               "compiled.prepare().")
        if _in_callback() is not None and call.startswith(("run", "submit", "__call__", "close")):
            raise RuntimeError(f"DistributedWorker.{call}: called from inside a sub-worker callback, which runs "
                               "while its own dispatch is in progress; dispatch after result() returns instead.")
        if self.broken is not None and call.startswith(("run", "submit", "__call__")):
            raise RuntimeError(f"DistributedWorker.{call}: the worker cannot run more dispatches: {self.broken}. "
                               "Close it and prepare a new one.")

    # -- driving ----------------------------------------------------------------------------------
    def _try_step(self, until: RunHandle | None, deadline: float | None) -> bool:
        """Advance the queue one step unless another thread is driving it; return whether this one did."""
        if not self.engine.acquire(blocking=False):
            return False
        try:
            self._step(until, deadline)
        finally:
            self.engine.release()
        return True

    def drive(self, until: RunHandle, deadline: float | None) -> None:
        """Advance the queue until ``until`` has finished or ``deadline`` passes."""
        if _in_callback() is not None:
            raise RuntimeError("RunHandle.result(): called from inside a sub-worker callback, whose own dispatch "
                               "cannot finish until the callback returns; wait after the dispatch instead.")
        with self.state:
            self.waiters += 1  # the background thread stays out of the way of a caller that drives itself
        try:
            while not until._finished:
                if not self._try_step(until, deadline):
                    wait = 0.002 if deadline is None else max(min(0.002, deadline - time.monotonic()), 0.0)
                    until._event.wait(wait)
                if deadline is not None and time.monotonic() >= deadline:
                    return
        finally:
            with self.state:
                self.waiters -= 1
                if self.thread is not None:
                    self.wakeup.notify_all()

    def poke(self, watch: bool = True) -> None:
        """Advance the queue without waiting: publish what can be; with ``watch``, also look at the ranks."""
        if _in_callback() is None and self.engine.acquire(blocking=False):
            try:
                self._step(None, time.monotonic(), watch)
            finally:
                self.engine.release()

    def _step(self, until: RunHandle | None, deadline: float | None, watch: bool = True) -> None:
        """Run the queue (engine held): publish, watch, run callbacks, complete handles.

        Anything that escapes (Ctrl-C, or a bug) may leave a command without its watch, so
        the worker stops its ranks, as a one-shot run does, and fails what it had accepted.
        """
        try:
            if watch:
                self._advance(until, deadline)
            else:
                self._kick()
        except BaseException as e:
            why = "interrupted (KeyboardInterrupt)" if isinstance(e, KeyboardInterrupt) else \
                f"its driver failed ({type(e).__name__}: {e})"
            self._abandon(why)
            raise

    def _abandon(self, why: str) -> None:
        self.broken = self.broken or why
        self.group.kill()
        self.watch = self.watching = None
        with self.state:
            for d in list(self.queue):
                d.handle._complete(None, RuntimeError(f"dispatch {d.handle.number} of '{d.compiled.name}' did not "
                                                      f"finish: the worker stopped, {why}. Close it and prepare "
                                                      "a new one."))
            self.queue.clear()
            self.wakeup.notify_all()

    def _advance(self, until: RunHandle | None, deadline: float | None) -> None:
        while True:
            self._kick()
            if self.watch is None or (until is not None and until._finished):
                return
            left = DRIVE_SLICE_S if deadline is None else deadline - time.monotonic()
            over = self.watch.poll(max(min(left, DRIVE_SLICE_S), 0.0))
            if over:
                self._command_over()
            elif deadline is not None and time.monotonic() >= deadline:
                return
            elif until is None:
                return  # the background thread: hand the engine back now and then

    def _kick(self) -> None:
        """Publish the head dispatch's next segment, running callbacks and completing handles on the way."""
        while self.watch is None:
            with self.state:
                if not self.queue:
                    return
                d = self.queue[0]
            if self.broken is not None:
                self._fail(d, RuntimeError(f"dispatch {d.handle.number} of '{d.compiled.name}' did not run: "
                                           f"{self.broken}. Close the worker and prepare a new one."))
                continue
            if d.cursor == len(d.entry.steps):
                self._finish(d)
                continue
            kind, what = d.entry.steps[d.cursor]
            if kind == "call":
                self._callback(d, what)
                continue
            try:
                self._publish(d, what)
            except Exception as e:  # noqa: BLE001 - a dispatch that cannot be published fails alone
                self._fail(d, e)

    def _publish(self, d: _Dispatch, segment: int) -> None:
        entry = d.entry
        with self.state:
            self._forgotten()
            heap = None
            arena_token = None
            if d.arena_key is not None:
                arena = self._arena_for(d, first=not d.published)
                arena_token = (arena.map.token, arena.stride)
                heap = WindowHeap.for_plan(arena.file.bytes, 0, arena.stride, entry.plan)
            hosts = []
            maps = []
            for i, a in enumerate(d.args):
                if a is None:
                    hosts.append(None)
                    continue
                writable = d.compiled.host.params[i].direction is not Direction.IN
                if a.kind == "empty":  # nothing to map: the rank makes its own empty array
                    hosts.append((-1, 0, a.shape, None, a.dtype.name, writable))
                    continue
                hosts.append((a.map.token, a.offset, a.shape, a.strides, a.dtype.name, writable))
                if not a.map.sent:
                    maps.append(a.map)
            if d.arena_key is not None and not arena.map.sent:
                maps.append(arena.map)
            maps = list({id(m): m for m in maps}.values())
            if len(self.sent_plans) >= PLANS_KEPT_BY_RANKS and entry.id not in self.sent_plans:
                self.sent_plans.clear()
                self.forget_plans = True
            command = {
                "plan_id": entry.id,
                "plan": entry.blob if entry.id not in self.sent_plans else None,
                "segment": segment, "dispatch_id": d.handle.number, "hosts": hosts,
                "heap": arena_token, "maps": [(m.token, m.size) for m in maps], "drop": self.drops,
                "dfx": d.dfx, "forget_plans": self.forget_plans,
            }
            # Everything but the doorbell first: a woken rank should find the driver asleep, not busy.
            watch = CommandWatch(self.group, self.group.sent, entry.plan, heap, d.config.resolved_hang_timeout())
            try:
                self.group.send(command, [m.fd for m in maps])
            except BaseException as e:
                # Some ranks may hold part of the command: they cannot be trusted with the next one.
                self._abandon(f"a command could not be sent to the ranks ({type(e).__name__}: {e})")
                raise
            self.watch, self.watching = watch, d
            self.drops = []
            self.forget_plans = False
            self.sent_plans.add(entry.id)
            d.published = True
            for m in maps:
                m.sent = True
                if m.owns_fd:
                    os.close(m.fd)
                    m.fd = -1

    def _arena_for(self, d: _Dispatch, first: bool) -> _Arena:
        """The window heap for ``d``, zeroed as its first segment needs (later segments keep it)."""
        heap = d.entry.heap
        arena = self.arenas.get(d.arena_key)
        if not first:
            return arena
        if arena is None or arena.stride < heap:
            if arena is not None:  # too small: the ranks drop it with this command
                self.forget_file(arena.file)
            stride = heap if self.persistent else max(heap, 2 * arena.stride if arena else heap)
            resources.check_windows(d.compiled.name, d.entry.plan.windows, self.world)
            file = _SharedFile(stride * self.world, "ptodist-windows")
            arena = self.arenas[d.arena_key] = _Arena(stride, self.world, self.file_map(file), file)
        if self.persistent:
            if arena.used and self.reset:
                arena.file.bytes[:] = 0
        else:
            # Windows start zeroed in every dispatch; only the part this plan uses is cleared.
            rows = arena.file.bytes[:arena.stride * self.world].reshape(self.world, arena.stride)
            rows[:, :heap] = 0
        arena.used = True
        return arena

    def _command_over(self) -> None:
        watch, d = self.watch, self.watching
        self.watch = self.watching = None
        if watch.broken is not None:
            self.broken = watch.broken
        if watch.error is not None:
            self._fail(d, watch.error)
            return
        d.cursor += 1

    def _callback(self, d: _Dispatch, call: _HostCall) -> None:
        fn = self.callbacks.get(call.function.name)
        args = [self._callback_arg(d, a) for a in call.args]
        _tls.callback = d
        try:
            if fn is not None:
                fn(*args)
            else:
                call.function.invoke(*args)
        except BaseException as e:  # noqa: BLE001 - the dispatch fails with the callback's error
            e.add_note(f"raised by sub-worker callback '{call.function.name}' (called at {call.location}) in "
                       f"dispatch {d.handle.number} of '{d.compiled.name}'")
            self._fail(d, e)
            if not isinstance(e, Exception):
                raise
            return
        finally:
            _tls.callback = None
        d.cursor += 1

    @staticmethod
    def _callback_arg(d: _Dispatch, a):
        if isinstance(a, HostTensorRef):
            value = d.args[a.tensor.index].value
            if isinstance(value, StackedDeviceTensor):
                return value[a.index[0]] if a.index else value
            return value[a.index] if a.index else value
        if isinstance(a, Scalar):
            return a.value
        return a

    def _finish(self, d: _Dispatch) -> None:
        error = None
        if d.dfx is not None:
            try:
                dfx.finish_run(d.dfx, self.world, self.device_ids)
            except Exception as e:  # noqa: BLE001 - the dispatch fails with the merge's error
                error = e
        if error is not None:
            self._complete(d, None, error)
            return
        outs = [a.value for p, a in zip(d.compiled.host.params, d.args) if a is not None and
                p.direction is not Direction.IN]
        value = None if not outs else outs[0] if len(outs) == 1 else tuple(outs)
        self._complete(d, value, None)

    def _fail(self, d: _Dispatch, error: BaseException) -> None:
        if d.dfx is not None and d.published:
            try:
                dfx.finish_run(d.dfx, self.world, self.device_ids, error=error)
            except Exception:  # noqa: BLE001 - the dispatch's own error is the one to report
                pass
        self._complete(d, None, error)

    def _complete(self, d: _Dispatch, value, error) -> None:
        with self.state:
            if self.queue and self.queue[0] is d:
                self.queue.popleft()
            d.handle._complete(value, error)
            if self.thread is not None:
                self.wakeup.notify_all()

    # -- the background thread ---------------------------------------------------------------------
    def start_thread(self) -> None:
        with self.state:
            if self.thread is None and not self.closed:
                self.thread = threading.Thread(target=self._run_thread, name="ptodist-worker", daemon=True)
                self.thread.start()
            self.wakeup.notify_all()

    def _run_thread(self) -> None:
        try:
            self._thread_loop()
        except BaseException:  # noqa: BLE001 - _step has failed every handle already; nothing to report to
            pass

    def _thread_loop(self) -> None:
        while True:
            with self.state:
                while (not self.queue or self.waiters) and not self.closing and not self.closed:
                    self.wakeup.wait()
                if self.closed or (self.closing and not self.queue):
                    return
            if not self._try_step(None, None):
                with self.state:
                    self.wakeup.wait(0.005)

    # -- waiting for resident tensors to be unused ------------------------------------------------
    def wait_unused(self, token: int | None) -> None:
        """Wait for the accepted dispatches that use the memory ``token`` (none inside a callback)."""
        if token is None or _in_callback() is not None:
            return
        while True:
            with self.state:
                users = [d for d in self.queue if token in d.residents]
            if not users:
                return
            self.drive(users[-1].handle, None)

    # -- closing ----------------------------------------------------------------------------------
    def drain(self) -> None:
        while True:
            with self.state:
                if not self.queue:
                    return
                last = self.queue[-1].handle
            self.drive(last, None)

    def release(self) -> None:
        """Stop the ranks and free everything (no draining); safe to call again."""
        with self.state:
            if self.closed:
                return
            self.closed = True
            self.wakeup.notify_all()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.group.close()
        with self.state:
            for d in list(self.queue):
                d.handle._complete(None, RuntimeError(f"dispatch {d.handle.number} of '{d.compiled.name}' did "
                                                      "not run: the worker was closed"))
            self.queue.clear()
            for m in self.maps.values():
                if m.finalizer is not None:
                    m.finalizer.detach()
                if m.owns_fd and m.fd >= 0:
                    os.close(m.fd)
            self.maps.clear()
            for arena in self.arenas.values():
                arena.file.close()
            self.arenas.clear()
            for t in self.residents.values():
                if t._file is not None:
                    t._file.close()
                    t._file = None
            self.residents.clear()


def _c_strides(shape: tuple) -> tuple:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _layout_text(layout: tuple) -> str:
    return "[" + ", ".join(f"'{n}' {b} bytes at {o}" for n, b, o in layout) + "]"


def _check_backend(config: RunConfig) -> None:
    from ..check import explore

    if explore.active() is not None:
        raise ConfigError("DistributedWorker: ptodist check runs one-shot calls only (each on the sim backend); a "
                          "worker's ranks are shm processes it cannot schedule. Check the program through one-shot "
                          "calls (compiled(*args)), and run the worker with ptodist run or python.")
    name = config.resolved_backend()
    if name != "shm":
        raise ConfigError(f"DistributedWorker runs on the 'shm' backend only; here dispatches would run on '{name}' "
                          "(RunConfig.backend or PTODIST_BACKEND decide). Use one-shot calls "
                          "(compiled(*args)) there, or RunConfig(backend='shm').")


def _emergency_stop(core: _Core) -> None:
    core.release()


# -- the public worker ---------------------------------------------------------------------------

class DistributedWorker:
    """Rank processes started once and dispatched many times (``compiled.prepare()``).

    Args:
        compiled: the program (or a list of programs, the first being the primary one).
        config: a RunConfig for the worker's dispatches (default: the primary program's).
        extra_compiled: more programs this worker runs (``rt.run(program, ...)``).
        persistent: keep window buffers across dispatches (one layout per program).
        reset_persistent_windows: zero persistent windows before each dispatch (default: on
            when ``persistent``); ``True`` needs ``persistent=True``.
        callbacks: ``{name: fn}`` for the host orchestrators' sub-worker functions
            (``pl.Role.SubWorker``); ``fn(*args)`` gets the call's arguments.
        startup_timeout_s: how long the ranks may take to start (default 60 s).

    Raises:
        RankError: a rank died or did not come up in time; nothing is left running.
    """

    def __init__(self, compiled, config: RunConfig | None = None, *, extra_compiled=(), persistent: bool = False,
                 reset_persistent_windows: bool | None = None, callbacks: dict | None = None,
                 startup_timeout_s: float | None = None):
        from .program import CompiledProgram

        primary = list(compiled) if isinstance(compiled, (list, tuple)) else [compiled]
        programs: list = []
        for c in [*primary, *extra_compiled]:
            if not isinstance(c, CompiledProgram):
                raise DispatchTypeError(f"DistributedWorker: expected compiled programs (from compile()), got "
                                        f"{type(c).__name__}")
            if not any(c is p for p in programs):
                programs.append(c)
        if not programs:
            raise ConfigError("DistributedWorker: at least one compiled program is needed")
        head = programs[0]
        for c in programs[1:]:
            if c.device_ids != head.device_ids:
                raise ConfigError(f"DistributedWorker: programs must run on the same devices; '{head.name}' is "
                                  f"compiled for device_ids {head.device_ids}, '{c.name}' for {c.device_ids}. "
                                  "Compile them with one DistributedConfig.")
        cfg = config or head.config
        if config is not None and config.distributed_config is not None and \
                list(config.distributed_config.device_ids) != head.device_ids:
            raise ConfigError(f"DistributedWorker: config has device_ids {config.distributed_config.device_ids} but "
                              f"'{head.name}' is compiled for {head.device_ids}; compile again for other devices")
        if not isinstance(persistent, bool):
            raise ConfigError(f"prepare(persistent={persistent!r}): must be True or False")
        if reset_persistent_windows is not None and not isinstance(reset_persistent_windows, bool):
            raise ConfigError(f"prepare(reset_persistent_windows={reset_persistent_windows!r}): must be True, False "
                              "or None")
        if reset_persistent_windows and not persistent:
            raise ConfigError("prepare(reset_persistent_windows=True) needs persistent=True: without it windows "
                              "live for one dispatch and always start zeroed. Pass persistent=True, or drop "
                              "reset_persistent_windows.")
        timeout = DEFAULT_STARTUP_TIMEOUT_S if startup_timeout_s is None else startup_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ConfigError(f"prepare(startup_timeout_s={startup_timeout_s!r}): must be a positive, finite number "
                              "of seconds")
        _check_backend(cfg)
        checked = self._check_callbacks(programs, callbacks)
        cfg.announce_platform()
        dfx.notice_build_time_switches()
        reset = persistent if reset_persistent_windows is None else reset_persistent_windows
        self._core = _Core(programs, cfg, persistent, reset, checked, float(timeout))
        self._finalizer = weakref.finalize(self, _emergency_stop, self._core)
        try:
            self._core.group.start()
        except BaseException:
            self._finalizer()
            raise

    @staticmethod
    def _check_callbacks(programs: list, callbacks) -> dict:
        if callbacks is None:
            callbacks = {}
        if not isinstance(callbacks, dict):
            raise DispatchTypeError(f"prepare(callbacks=...): expects a dict {{name: function}}, got "
                                    f"{type(callbacks).__name__}")
        subs: dict[str, Function] = {}
        for c in programs:
            for f in checks.reachable_functions(c.host, c._extra):
                if f.kind is Kind.SUBWORKER:
                    subs.setdefault(f.name, f)
        for name, fn in callbacks.items():
            if name not in subs:
                known = ", ".join(sorted(subs)) or "none"
                raise ConfigError(f"prepare(callbacks=...): no sub-worker function is called '{name}' in the "
                                  f"worker's programs (sub-worker functions: {known})")
            if not callable(fn):
                raise DispatchTypeError(f"prepare(callbacks=...): the callback for '{name}' must be callable, got "
                                        f"{type(fn).__name__}")
        for name, f in subs.items():
            if name not in callbacks and _is_abstract(f):
                raise ConfigError(f"prepare(): sub-worker function '{name}' ({f.location}) has no body ('...'): it is "
                                  f"a callback point. Bind it with prepare(callbacks={{'{name}': fn}}).")
        return dict(callbacks)

    # -- identity ---------------------------------------------------------------------------------
    @property
    def programs(self) -> list:
        """The compiled programs this worker runs (the primary one first)."""
        return list(self._core.programs)

    @property
    def device_ids(self) -> list[int]:
        return list(self._core.device_ids)

    @property
    def world(self) -> int:
        return self._core.world

    @property
    def persistent(self) -> bool:
        return self._core.persistent

    @property
    def closed(self) -> bool:
        return self._core.closed

    def __repr__(self) -> str:
        names = ", ".join(c.name for c in self._core.programs)
        state = "closed" if self._core.closed else f"{self.world} ranks"
        return f"<DistributedWorker [{names}] ({state})>"

    # -- dispatch ---------------------------------------------------------------------------------
    def __call__(self, *args, config: RunConfig | None = None):
        """Dispatch the worker's program once and wait for it (``rt(*args)``)."""
        if len(self._core.programs) > 1:
            self._core.check_usable("__call__() (rt(...))")
            names = ", ".join(f"'{c.name}'" for c in self._core.programs)
            raise DispatchTypeError(f"rt(*args) is ambiguous: this worker runs {len(self._core.programs)} programs "
                                    f"({names}). Dispatch with rt.run(compiled, *args).")
        return self._accept(self._core.programs[0], args, config, "__call__() (rt(...))").result()

    def run(self, compiled, *args, config: RunConfig | None = None):
        """Dispatch ``compiled`` (one of the worker's programs) once and wait for it; return its outputs."""
        return self._accept(compiled, args, config, "run()").result()

    def submit(self, compiled, *args, config: RunConfig | None = None) -> RunHandle:
        """Accept a dispatch of ``compiled`` and return at once; at most two are in flight.

        A third ``submit`` first waits for the oldest.  Overlapping dispatches need distinct
        output tensors; do not change their arguments before ``result()`` returns.
        """
        handle = self._accept(compiled, args, config, "submit()")
        self._core.start_thread()
        return handle

    def _accept(self, compiled, args: tuple, config, call: str) -> RunHandle:
        core = self._core
        core.check_usable(call)
        index = next((i for i, c in enumerate(core.programs) if c is compiled), None)
        if index is None:
            from .program import CompiledProgram

            if not isinstance(compiled, CompiledProgram):
                raise DispatchTypeError(f"DistributedWorker.{call}: the first argument is the program to run "
                                        f"(a compiled program), got {type(compiled).__name__}")
            names = ", ".join(f"'{c.name}'" for c in core.programs)
            raise DispatchValueError(f"DistributedWorker.{call}: program '{compiled.name}' was not given to "
                                     f"prepare(); this worker runs {names}. Register it with "
                                     "prepare(extra_compiled=[...]).")
        while True:
            with core.state:
                oldest = core.queue[0].handle if len(core.queue) >= MAX_IN_FLIGHT else None
            if oldest is None:
                break
            core.drive(oldest, None)
        handle = core.accept(self, index, compiled, args, config, call)
        core.poke(watch=False)  # publish at once when the ranks are idle
        return handle

    # -- resident tensors -------------------------------------------------------------------------
    def alloc_tensor(self, shape, dtype, *, init=None) -> DeviceTensor:
        """Allocate a zero-filled tensor resident in the ranks; ``init`` (a host tensor) fills it once."""
        core = self._core
        core.check_usable("alloc_tensor()")
        dtype = _as_dtype(dtype, "alloc_tensor()")
        shape = _as_shape(shape, "alloc_tensor()")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.get_byte()
        t = DeviceTensor(core, _SharedFile(nbytes, "ptodist-tensor"), 0, shape, dtype)
        with core.state:
            core.residents[t._file.serial] = t
        if init is not None:
            try:
                self.copy_to(t, init)
            except BaseException:
                self.free_tensor(t)
                raise
        return t

    def free_tensor(self, tensor: DeviceTensor) -> None:
        """Free a resident tensor (after the accepted dispatches that use it); freeing twice does nothing."""
        core = self._core
        core.check_usable("free_tensor()")
        if isinstance(tensor, StackedDeviceTensor):
            raise DispatchTypeError("free_tensor(): got a StackedDeviceTensor; free it with free_stacked_tensor()")
        if not isinstance(tensor, DeviceTensor):
            raise DispatchTypeError(f"free_tensor(): expects a DeviceTensor, got {type(tensor).__name__}")
        if tensor._parent is not None:
            raise DispatchValueError(f"free_tensor(): {tensor.describe()} is a shard, part of its stacked tensor; "
                                     "free the whole StackedDeviceTensor with free_stacked_tensor()")
        self._free(tensor, "free_tensor()")

    def alloc_stacked_tensor(self, host) -> StackedDeviceTensor:
        """Upload ``host`` ([world, ...]) as a stacked tensor: shard i (``host[i]``) on rank i."""
        core = self._core
        core.check_usable("alloc_stacked_tensor()")
        array = _host_array(host, "alloc_stacked_tensor(host)")
        dtype = dt.from_numpy(array.dtype)
        if array.ndim == 0 or array.shape[0] != core.world:
            raise DispatchValueError(f"alloc_stacked_tensor(host): host has shape {list(array.shape)}; its first "
                                     f"dimension must be the rank count ({core.world}): shard i goes to rank i")
        t = StackedDeviceTensor(core, _SharedFile(array.nbytes, "ptodist-tensor"), array.shape, dtype)
        t._array()[...] = array
        with core.state:
            core.residents[t._file.serial] = t
        return t

    def free_stacked_tensor(self, stacked: StackedDeviceTensor) -> None:
        """Free every shard of a stacked tensor; freeing twice does nothing."""
        core = self._core
        core.check_usable("free_stacked_tensor()")
        if not isinstance(stacked, StackedDeviceTensor):
            raise DispatchTypeError(f"free_stacked_tensor(): expects a StackedDeviceTensor, got "
                                    f"{type(stacked).__name__}")
        self._free(stacked, "free_stacked_tensor()")

    def _free(self, t, call: str) -> None:
        core = self._core
        if t._core is not core:
            raise DispatchValueError(f"{call}: {t.describe()} was allocated by another DistributedWorker; free it "
                                     "with that worker")
        if t._file is None:
            return
        m = core.maps.get(("file", t._file.serial))
        core.wait_unused(m.token if m is not None else None)
        with core.state:
            d = _in_callback()
            if d is not None and m is not None and m.token in d.residents:
                raise RuntimeError(f"{call}: {t.describe()} is used by the dispatch whose sub-worker callback is "
                                   "running; free it after that dispatch's result()")
            if t._file is None:
                return
            core.residents.pop(t._file.serial, None)
            core.forget_file(t._file)
            t._file = None

    def copy_to(self, dst: DeviceTensor, src) -> None:
        """Copy host tensor ``src`` into resident tensor ``dst`` (same shape and dtype).

        Waits first for the accepted dispatches that use ``dst``.
        """
        target = self._resident(dst, "copy_to(dst, src)", "dst", "copy_from(dst, src)")
        array = _host_array(src, "copy_to(dst, src): src")
        _check_same(dst, array, "copy_to(dst, src)", "src")
        target[...] = array

    def copy_from(self, dst, src: DeviceTensor) -> None:
        """Copy resident tensor ``src`` into host tensor ``dst`` (same shape and dtype).

        Waits first for the accepted dispatches that use ``src``.
        """
        source = self._resident(src, "copy_from(dst, src)", "src", "copy_to(dst, src)")
        _copy_out(dst, source, src, "copy_from(dst, src)")

    def copy_stacked_from(self, stacked: StackedDeviceTensor, host_out) -> None:
        """Copy every shard of ``stacked`` into ``host_out`` ([world, ...], same dtype)."""
        core = self._core
        core.check_usable("copy_stacked_from()")
        if not isinstance(stacked, StackedDeviceTensor):
            raise DispatchTypeError(f"copy_stacked_from(stacked, host_out): stacked must be a StackedDeviceTensor, "
                                    f"got {type(stacked).__name__}")
        core.check_resident(stacked, "copy_stacked_from(stacked, host_out)")
        self._wait_for(stacked)
        _copy_out(host_out, stacked._array(), stacked, "copy_stacked_from(stacked, host_out)")

    def _resident(self, t, call: str, role: str, other: str) -> np.ndarray:
        core = self._core
        core.check_usable(call.split("(")[0] + "()")
        if not isinstance(t, DeviceTensor):
            hint = f"; did you mean {other}?" if not isinstance(t, StackedDeviceTensor) else \
                " (for a StackedDeviceTensor index a shard, stacked[i], or use copy_stacked_from)"
            raise DispatchTypeError(f"{call}: {role} must be a DeviceTensor of this worker, got "
                                    f"{type(t).__name__}{hint}")
        core.check_resident(t, call)
        self._wait_for(t)
        return t._array()

    def _wait_for(self, t) -> None:
        core = self._core
        file = t._file
        m = core.maps.get(("file", file.serial))
        core.wait_unused(m.token if m is not None else None)

    # -- closing ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the accepted dispatches (in order), then stop the ranks and free everything.

        Safe to call again; every later call on the worker raises RuntimeError.
        """
        core = self._core
        if core.closed:
            return
        if _in_callback() is not None:
            raise RuntimeError("DistributedWorker.close(): called from inside a sub-worker callback; close the "
                               "worker after the dispatch's result() returns")
        try:
            with core.state:
                core.closing = True
                core.wakeup.notify_all()
            core.drain()
        finally:
            self._finalizer()

    def __enter__(self) -> DistributedWorker:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def _as_shape(shape, where: str) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(d.__index__() for d in shape)
    except (AttributeError, TypeError):
        raise DispatchTypeError(f"{where}: shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in out):
        raise DispatchValueError(f"{where}: shape {list(out)} has a negative dimension")
    return out


def _check_same(t, array: np.ndarray, call: str, role: str) -> None:
    if tuple(array.shape) != t.shape:
        raise DispatchValueError(f"{call}: {role} has shape {list(array.shape)} but {t.describe()} has "
                                 f"{list(t.shape)}")
    got = dt.from_numpy(array.dtype)
    if got is not t.dtype and (got is None or got.np_dtype != t.dtype.np_dtype):
        raise DispatchTypeError(f"{call}: {role} is {got.name if got else array.dtype} but {t.describe()} is "
                                f"{t.dtype.name}; convert it first")


def _copy_out(dst, source: np.ndarray, t, call: str) -> None:
    role = "host_out" if "stacked" in call else "dst"
    array = _host_array(dst, f"{call}: {role}", writable=True)
    _check_same(t, array, call, role)
    np.copyto(array, source)
