"""What a worker hands its caller: resident tensors (DeviceTensor, StackedDeviceTensor), RunHandle,
and the host-side checks of the copies between host tensors and resident ones."""

from __future__ import annotations

import threading
import time

import numpy as np

from ...errors import DispatchIndexError, DispatchTypeError, DispatchValueError, UsageError
from ...language import dtypes as dt


class DeviceTensor:
    """A tensor resident in a worker's ranks: a dispatch uses it in place, with no copy.

    Made by ``rt.alloc_tensor`` (or ``stacked[i]`` for one shard of a stacked tensor);
    ``shape`` and ``dtype`` (a pl dtype) describe it.  Read and write it from the host with
    ``rt.copy_from`` / ``rt.copy_to``; release it with ``rt.free_tensor``.
    """

    def __init__(self, core, file, offset: int, shape: tuple, dtype: dt.DataType,
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
    def data_ptr(self) -> int:
        """The address of the tensor's bytes in this process (upstream's device pointer; ptodist's calls take the
        tensor itself, never the address)."""
        if self.freed:
            raise UsageError(f"{self.describe()}.data_ptr: the tensor was freed (or its worker closed); it has no "
                             "memory any more. Allocate a new one with rt.alloc_tensor(shape, dtype).")
        return self._array().ctypes.data

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

    def __init__(self, core, file, shape: tuple, dtype: dt.DataType, worker_ids: tuple | None = None):
        self._core = core
        self._file = file
        self.shape = tuple(shape)
        self.dtype = dtype
        shard = tuple(shape[1:])
        step = int(np.prod(shard, dtype=np.int64)) * dtype.get_byte()
        self._shards = [DeviceTensor(core, file, i * step, shard, dtype, self, i) for i in range(shape[0])]
        # worker_ids[i]: the rank that holds shard i (and whose dispatch must be given x[i])
        self.worker_ids = tuple(range(shape[0])) if worker_ids is None else tuple(worker_ids)

    @property
    def full_shape(self) -> tuple:
        """The whole stacked shape ``[B, ...]`` (PyPTO's name; the same as ``shape``)."""
        return self.shape

    @property
    def shards(self) -> list:
        """The shards in stack order: ``shards[i]`` is ``host[i]``, held by rank ``worker_ids[i]``."""
        return list(self._shards)

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
            raise DispatchTypeError(f"StackedDeviceTensor indices are rank numbers (ints), got {i!r}") from None
        except IndexError:
            raise DispatchIndexError(f"StackedDeviceTensor {list(self.shape)} has {len(self._shards)} shards "
                             f"(one per rank); index {i} is out of range") from None

    def _array(self) -> np.ndarray:
        return np.ndarray(self.shape, dtype=self.dtype.np_dtype, buffer=self._file.bytes)

    def describe(self) -> str:
        return f"StackedDeviceTensor {list(self.shape)} {self.dtype.name}"

    def __repr__(self) -> str:
        return f"<{self.describe()}{' (freed)' if self.freed else ''}>"


def as_dtype(dtype, where: str) -> dt.DataType:
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


def host_array(value, where: str, writable: bool = False) -> np.ndarray:
    """Return a numpy view of a CPU host tensor (torch or numpy), for the staged copies."""
    if type(value).__module__.startswith("torch"):
        import torch

        if not isinstance(value, torch.Tensor):
            raise DispatchTypeError(f"{where}: expected a host tensor, got {type(value).__name__}")
        if value.device.type != "cpu":
            raise DispatchTypeError(f"{where}: the tensor is on {value.device}; pass a CPU tensor")
        if dt.from_torch(value.dtype) is None:
            raise DispatchTypeError(f"{where}: torch dtype {value.dtype} is not supported by ptodist")
        return dt.torch_as_numpy(value.detach(), dt.from_torch(value.dtype))
    if isinstance(value, np.ndarray):
        if dt.from_numpy(value.dtype) is None:
            raise DispatchTypeError(f"{where}: numpy dtype {value.dtype} is not supported by ptodist")
        if writable and not value.flags.writeable:
            raise DispatchTypeError(f"{where}: the numpy array is read-only")
        return value
    raise DispatchTypeError(f"{where}: expected a host tensor (torch tensor or numpy array), got "
                            f"{type(value).__name__}")


# -- handles ---------------------------------------------------------------------------------

_EVENT_LOCK = threading.Lock()


class RunHandle:
    """One accepted dispatch: ``result(timeout)`` (alias ``wait``) waits for it, ``done`` asks.

    ``result`` returns what a one-shot call would (the host's ``pl.Out``/``pl.InOut``
    tensors) or raises the dispatch's error; every call raises the same exception object.
    """

    def __init__(self, worker, program: str, number: int):
        self._worker = worker  # keeps the worker (and its ranks) alive while the handle is
        self._core = worker._core
        self.program = program
        self.number = number  # this worker's dispatch count when it was accepted
        self._event: threading.Event | None = None  # made only for a thread that waits while another drives
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

    def _wait(self, timeout: float) -> None:
        """Sleep until the dispatch finishes (another thread drives it), at most ``timeout`` seconds."""
        event = self._event
        if event is None:
            with _EVENT_LOCK:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        # _complete sets _finished before it looks for the event: either it sees this event, or this
        # check sees _finished.
        if not self._finished:
            event.wait(timeout)

    def _complete(self, value=None, error: BaseException | None = None) -> None:
        if self._finished:
            return
        self._value, self._error = value, error
        self._finished = True
        event = self._event
        if event is not None:
            event.set()

    def __repr__(self) -> str:
        state = "running" if not self._finished else ("failed" if self._error is not None else "done")
        return f"<RunHandle dispatch {self.number} of '{self.program}' ({state})>"


DistributedRunHandle = RunHandle

def as_shape(shape, where: str) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(d.__index__() for d in shape)
    except (AttributeError, TypeError):
        raise DispatchTypeError(f"{where}: shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in out):
        raise DispatchValueError(f"{where}: shape {list(out)} has a negative dimension")
    return out


def check_same(t, array: np.ndarray, call: str, role: str) -> None:
    if tuple(array.shape) != t.shape:
        raise DispatchValueError(f"{call}: {role} has shape {list(array.shape)} but {t.describe()} has "
                                 f"{list(t.shape)}")
    got = dt.from_numpy(array.dtype)
    if got is not t.dtype and (got is None or got.np_dtype != t.dtype.np_dtype):
        raise DispatchTypeError(f"{call}: {role} is {got.name if got else array.dtype} but {t.describe()} is "
                                f"{t.dtype.name}; convert it first")


def copy_out(dst, source: np.ndarray, t, call: str) -> None:
    role = "host_out" if "stacked" in call else "dst"
    array = host_array(dst, f"{call}: {role}", writable=True)
    check_same(t, array, call, role)
    np.copyto(array, source)


class RegistrationHandle:
    """A program of a worker, bound to it: ``handle(*args, config=None)`` is ``rt.run(compiled, *args)``.

    Made by ``rt.register(compiled)``.  ``compiled`` is the program, ``closed`` whether the handle
    can no longer dispatch (after ``unregister()``, leaving its ``with`` block, or the worker's
    ``close()``); ``cid`` is 0, as in PyPTO's distributed worker, which has no per-program id.
    """

    cid = 0

    def __init__(self, worker, compiled):
        self._worker = worker
        self._compiled = compiled
        self._unregistered = False

    @property
    def compiled(self):
        return self._compiled

    @property
    def closed(self) -> bool:
        return self._unregistered or self._worker.closed

    def __call__(self, *args, config=None):
        """Dispatch the program on its worker and wait; returns what ``rt.run`` returns."""
        if self._worker.closed:
            raise UsageError(f"RegistrationHandle of '{self._compiled.name}': its DistributedWorker was closed "
                             "(close(), or leaving its with block), so it can dispatch nothing more. Prepare a new "
                             "worker with compiled.prepare() and register the program on it: rt.register(compiled).")
        if self._unregistered:
            raise UsageError(f"RegistrationHandle of '{self._compiled.name}' was unregistered (unregister(), or "
                             "leaving its with block), so it can dispatch nothing more. Get a fresh handle with "
                             "rt.register(compiled), or dispatch with rt.run(compiled, *args).")
        return self._worker.run(self._compiled, *args, config=config)

    def unregister(self) -> None:
        """Make this handle unusable; the worker and its other handles are unaffected. Idempotent."""
        self._unregistered = True

    def __enter__(self) -> RegistrationHandle:
        return self

    def __exit__(self, *exc) -> bool:
        self.unregister()
        return False

    def __repr__(self) -> str:
        return f"<RegistrationHandle of '{self._compiled.name}'{' (closed)' if self.closed else ''}>"
