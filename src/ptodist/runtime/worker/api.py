"""DistributedWorker: start the ranks once, dispatch many times (``compiled.prepare()``).

Once ``prepare_checks`` has checked prepare()'s arguments, the worker starts a group of ranks on its
backend (``Backend.start``: shm rank processes, sim threads, or this process's rank of an MPI job)
and hands everything else to its engine
(``engine.Engine``): binding, plans, the queue, callbacks.  A dispatch binds its arguments in the
caller's thread (on shm, host tensors must be shared memory: torch ``.share_memory_()`` or
:func:`shared_array`), is planned (cached per program and argument signature; the host's
sub-worker calls split the plan into segments, with a Python callback between two), and is queued:
at most two are accepted at a time.
"""

from __future__ import annotations

import weakref

import numpy as np

from ... import backends, dfx
from ...compiler import checks
from ...config import RunConfig
from ...errors import ConfigError, DispatchTypeError, DispatchValueError, UsageError
from ...language import dtypes as dt
from .base import Worker
from .callbacks import in_callback
from .engine import Engine
from .handles import (
    DeviceTensor,
    RegistrationHandle,
    RunHandle,
    StackedDeviceTensor,
    as_dtype,
    as_shape,
    check_same,
    copy_out,
    host_array,
)
from .memory import SharedFile
from .prepare_checks import (
    check_callbacks,
    check_inherited,
    check_options,
    check_programs,
    coalesce_callbacks,
)

MAX_IN_FLIGHT = 2


def _emergency_stop(engine: Engine) -> None:
    engine.release()


class DistributedWorker(Worker):
    """Rank processes started once and dispatched many times (``compiled.prepare()``).

    Args:
        compiled: the program (or a list of programs, the first being the primary one).
        config: a RunConfig for the worker's dispatches (default: the primary program's).
        extra_compiled: more programs this worker runs (``rt.run(program, ...)``).
        persistent: keep window buffers across dispatches (one layout per program).
        reset_persistent_windows: zero persistent windows before each dispatch (default: on
            when ``persistent``); ``True`` needs ``persistent=True``.
        callbacks: ``{name: fn}`` for the host orchestrators' sub-worker functions
            (``pl.Role.SubWorker``).  A callback that accepts one positional argument is called
            as ``fn(args)`` with a :class:`MappedArgs` (``args.tensor(i)``, ``args.scalar(i)``), as
            PyPTO does; one that cannot, as ``fn(*values)`` with the call's arguments.
        sub_worker_overrides: deprecated alias of ``callbacks`` (a DeprecationWarning); merged
            with it, ``callbacks`` winning on a name both give.
        inherited_host_tensors: host tensors the caller declares visible to the ranks for the
            worker's lifetime (PyPTO: uploads from them skip staging).  ptodist's uploads and
            read-backs take any host tensor, so listing one changes no result; the worker keeps
            a reference to each until ``release_inherited_host_tensor_refs()`` or ``close()``.
        startup_timeout_s: how long the ranks may take to start (default 60 s).

    Raises:
        RankError: a rank died or did not come up in time; nothing is left running.
    """

    def __init__(self, compiled, config: RunConfig | None = None, *, extra_compiled=(), persistent: bool = False,
                 reset_persistent_windows: bool | None = None, callbacks: dict | None = None,
                 sub_worker_overrides: dict | None = None, inherited_host_tensors=None,
                 startup_timeout_s: float | None = None):
        programs, cfg = check_programs(compiled, extra_compiled, config)
        head = programs[0]
        timeout = check_options(persistent, reset_persistent_windows, startup_timeout_s)
        callbacks = coalesce_callbacks(callbacks, sub_worker_overrides)
        inherited = check_inherited(inherited_host_tensors)
        checked = check_callbacks(programs, callbacks)
        backend = backends.for_config(cfg)
        cfg.announce_platform(backend.name, local=not backends.capabilities(backend.name).multi_node)
        dfx.notice_build_time_switches()
        reset = persistent if reset_persistent_windows is None else reset_persistent_windows
        objects: dict = {}
        for c in programs:
            for f in checks.reachable_functions(c.host, c.extra_functions):
                objects[id(f.fn)] = f
                if f.bound_self is not None:
                    objects[id(f.bound_self)] = f.bound_self
        group = backend.start(list(head.device_ids), objects, float(timeout))
        self._core = Engine(programs, cfg, persistent, reset, checked, group, backend.name)
        self._inherited = inherited
        self._finalizer = weakref.finalize(self, _emergency_stop, self._core)

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
        return self._accept(self._core.programs[0], args, config, "__call__() (rt(...))", publish=False).result()

    def run(self, compiled, *args, config: RunConfig | None = None):
        """Dispatch ``compiled`` (one of the worker's programs) once and wait for it; return its outputs."""
        return self._accept(compiled, args, config, "run()", publish=False).result()

    def submit(self, compiled, *args, config: RunConfig | None = None) -> RunHandle:
        """Accept a dispatch of ``compiled`` and return at once; at most two are in flight.

        A third ``submit`` first waits for the oldest.  Overlapping dispatches need distinct
        output tensors; do not change their arguments before ``result()`` returns.
        """
        handle = self._accept(compiled, args, config, "submit()")
        self._core.start_thread()
        return handle

    def _accept(self, compiled, args: tuple, config, call: str, publish: bool = True) -> RunHandle:
        """Accept a dispatch; with ``publish``, hand it to idle ranks at once.

        A caller that waits for the dispatch right away leaves publishing to ``result()``: the ranks then
        start when the driver is about to sleep, not while it still runs on a core they need.
        """
        core = self._core
        core.check_usable(call)
        index = next((i for i, c in enumerate(core.programs) if c is compiled), None)
        if index is None:
            from ..program import CompiledProgram

            if not isinstance(compiled, CompiledProgram):
                raise DispatchTypeError(f"DistributedWorker.{call}: the first argument is the program to run "
                                        f"(a compiled program), got {type(compiled).__name__}")
            names = ", ".join(f"'{c.name}'" for c in core.programs)
            raise DispatchValueError(f"DistributedWorker.{call}: program '{compiled.name}' was not registered when "
                                     f"this worker was prepared (prepare() was not given it); this worker runs "
                                     f"{names}. Register it with prepare(extra_compiled=[...]).")
        while True:
            with core.state:
                oldest = core.queue[0].handle if len(core.queue) >= MAX_IN_FLIGHT else None
            if oldest is None:
                break
            core.drive(oldest, None)
        handle = core.accept(self, index, compiled, args, config, call)
        if publish:
            core.poke(watch=False)
        return handle

    def register(self, compiled) -> RegistrationHandle:
        """Return a callable handle for one of the worker's programs: ``handle(*args)`` is ``rt.run(compiled, *args)``.

        The handle stops working (UsageError, a RuntimeError) after ``handle.unregister()`` or the
        worker's ``close()``.
        """
        core = self._core
        core.check_usable("register()")
        if not any(c is compiled for c in core.programs):
            from ..program import CompiledProgram

            if not isinstance(compiled, CompiledProgram):
                raise DispatchTypeError(f"DistributedWorker.register(): expects one of the worker's compiled "
                                        f"programs, got {type(compiled).__name__}")
            names = ", ".join(f"'{c.name}'" for c in core.programs)
            raise DispatchValueError(f"DistributedWorker.register(): program '{compiled.name}' was not registered "
                                     f"when this worker was prepared (prepare() was not given it); this worker runs "
                                     f"{names}. Prepare the worker with extra_compiled=[...] to run it.")
        return RegistrationHandle(self, compiled)

    @property
    def inherited_host_tensors(self) -> tuple:
        """The host tensors given to ``prepare(inherited_host_tensors=...)`` and not yet released."""
        return self._inherited

    def release_inherited_host_tensor_refs(self) -> None:
        """Drop the worker's references to ``inherited_host_tensors`` (resident tensors made from them stay valid)."""
        self._core.check_usable("release_inherited_host_tensor_refs()")
        self._inherited = ()

    # -- resident tensors -------------------------------------------------------------------------
    def alloc_tensor(self, shape, dtype, *, init=None) -> DeviceTensor:
        """Allocate a zero-filled tensor resident in the ranks; ``init`` (a host tensor) fills it once."""
        core = self._core
        core.check_usable("alloc_tensor()")
        dtype = as_dtype(dtype, "alloc_tensor()")
        shape = as_shape(shape, "alloc_tensor()")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.get_byte()
        t = DeviceTensor(core, SharedFile(nbytes, "ptodist-tensor"), 0, shape, dtype)
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

    def alloc_stacked_tensor(self, host, *, worker_ids=None) -> StackedDeviceTensor:
        """Upload ``host`` ([B, ...]) as a stacked tensor: shard i (``host[i]``) on rank ``worker_ids[i]``.

        ``worker_ids`` (default ``range(B)``) are distinct ranks in ``[0, world)``, one per shard;
        the host orchestrator must give rank ``worker_ids[i]`` the shard ``x[i]``.
        """
        core = self._core
        core.check_usable("alloc_stacked_tensor()")
        array = host_array(host, "alloc_stacked_tensor(host)")
        dtype = dt.from_numpy(array.dtype)
        if worker_ids is None:
            if array.ndim == 0 or array.shape[0] != core.world:
                raise DispatchValueError(f"alloc_stacked_tensor(host): host has shape {list(array.shape)}; its "
                                         f"first dimension must be the rank count ({core.world}): shard i goes to "
                                         "rank i. To place fewer shards, or elsewhere, pass worker_ids=[...]: shard "
                                         "i goes to rank worker_ids[i]")
            ids = tuple(range(core.world))
        else:
            ids = self._check_worker_ids(array, worker_ids)
        t = StackedDeviceTensor(core, SharedFile(array.nbytes, "ptodist-tensor"), array.shape, dtype, ids)
        t._array()[...] = array
        with core.state:
            core.residents[t._file.serial] = t
        return t

    def _check_worker_ids(self, array: np.ndarray, worker_ids) -> tuple:
        world = self._core.world
        call = f"alloc_stacked_tensor(host, worker_ids={worker_ids!r})"
        try:
            ids = tuple(w.__index__() for w in worker_ids)
        except (AttributeError, TypeError):
            raise DispatchTypeError(f"{call}: worker_ids must be a sequence of ints (rank numbers), one per shard "
                                    "of host") from None
        if array.ndim == 0:
            raise DispatchValueError(f"{call}: host is a 0-d tensor; its first dimension is the shard dimension")
        if len(ids) != array.shape[0]:
            raise DispatchValueError(f"{call}: worker_ids has {len(ids)} entries but host's first dimension is "
                                     f"{array.shape[0]} (shape {list(array.shape)}); give one rank per shard: shard "
                                     "i (host[i]) goes to rank worker_ids[i]")
        seen = [w for i, w in enumerate(ids) if w in ids[:i]]
        if seen:
            raise DispatchValueError(f"{call}: worker_ids must be distinct (one shard per rank); rank {seen[0]} "
                                     "appears more than once")
        bad = [w for w in ids if not 0 <= w < world]
        if bad:
            raise DispatchValueError(f"{call}: worker id {bad[0]} is out of range [0, {world}): the worker has "
                                     f"{world} ranks, one per device in device_ids {self._core.device_ids}")
        return ids

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
        core.wait_unused(t)
        with core.state:
            d = in_callback()
            if d is not None and t._file is not None and t._file.serial in d.residents:
                raise UsageError(f"{call}: {t.describe()} is used by the dispatch whose sub-worker callback is "
                                 "running; free it after that dispatch's result()")
            if t._file is None:
                return
            core.residents.pop(t._file.serial, None)
            core.binding.forget_file(t._file)
            t._file = None

    def copy_to(self, dst: DeviceTensor, src, nbytes: int | None = None, *, worker_id: int = 0) -> None:
        """Copy host tensor ``src`` into resident tensor ``dst`` (same shape and dtype).

        PyPTO's pointer form, ``copy_to(dst_dev_ptr, src_host_ptr, nbytes)``, copies ``nbytes`` bytes from the
        host address into the resident tensor that holds ``dst_dev_ptr`` (a ``DeviceTensor.data_ptr``, plus an
        offset).  Waits first for the accepted dispatches that use ``dst``.
        """
        if nbytes is not None or isinstance(dst, int):
            return self._copy_bytes("copy_to", dst, src, nbytes, worker_id, into_resident=True)
        target = self._resident(dst, "copy_to(dst, src)", "dst", "copy_from(dst, src)")
        array = host_array(src, "copy_to(dst, src): src")
        check_same(dst, array, "copy_to(dst, src)", "src")
        target[...] = array

    def copy_from(self, dst, src: DeviceTensor, nbytes: int | None = None, *, worker_id: int = 0) -> None:
        """Copy resident tensor ``src`` into host tensor ``dst`` (same shape and dtype).

        PyPTO's pointer form, ``copy_from(dst_host_ptr, src_dev_ptr, nbytes)``, copies ``nbytes`` bytes of the
        resident tensor that holds ``src_dev_ptr`` to the host address.  Waits first for the accepted dispatches
        that use ``src``.
        """
        if nbytes is not None or isinstance(src, int):
            return self._copy_bytes("copy_from", src, dst, nbytes, worker_id, into_resident=False)
        source = self._resident(src, "copy_from(dst, src)", "src", "copy_to(dst, src)")
        copy_out(dst, source, src, "copy_from(dst, src)")

    def _copy_bytes(self, call: str, device_ptr, host_ptr, nbytes, worker_id, into_resident: bool) -> None:
        """PyPTO's pointer forms of copy_to / copy_from: ``nbytes`` between a host address and resident bytes."""
        import ctypes

        form = f"{call}({'dst_dev_ptr, src_host_ptr' if into_resident else 'dst_host_ptr, src_dev_ptr'}, nbytes)"
        self._core.check_usable(f"{call}()")
        if worker_id != 0:
            raise ConfigError(f"{form}: worker_id={worker_id!r}: ptodist's resident tensors are reached from worker 0")
        for name, v in (("device pointer", device_ptr), ("host pointer", host_ptr), ("nbytes", nbytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise DispatchTypeError(f"{form}: the {name} must be a non-negative int (a DeviceTensor's data_ptr, "
                                        f"a host tensor's data_ptr(), a byte count), got {v!r}; or pass the tensors "
                                        f"themselves: {call}({'device_tensor, host' if into_resident else 'host, device_tensor'})")
        with self._core.state:
            residents = list(self._core.residents.values())
        for t in residents:
            arr = t._array()
            start = arr.ctypes.data
            if start <= device_ptr and device_ptr + nbytes <= start + arr.nbytes:
                self._wait_for(t)
                if into_resident:
                    ctypes.memmove(device_ptr, host_ptr, nbytes)
                else:
                    ctypes.memmove(host_ptr, device_ptr, nbytes)
                return
        raise DispatchValueError(f"{form}: no resident tensor of this worker holds the {nbytes} bytes at device "
                                 f"pointer {device_ptr:#x}; give a DeviceTensor's data_ptr (alloc_tensor(...)) and at "
                                 "most its nbytes")

    def copy_stacked_from(self, stacked: StackedDeviceTensor, host_out) -> None:
        """Copy every shard of ``stacked`` into ``host_out`` ([world, ...], same dtype)."""
        core = self._core
        core.check_usable("copy_stacked_from()")
        if not isinstance(stacked, StackedDeviceTensor):
            raise DispatchTypeError(f"copy_stacked_from(stacked, host_out): stacked must be a StackedDeviceTensor, "
                                    f"got {type(stacked).__name__}")
        core.check_resident(stacked, "copy_stacked_from(stacked, host_out)")
        self._wait_for(stacked)
        copy_out(host_out, stacked._array(), stacked, "copy_stacked_from(stacked, host_out)")

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
        self._core.wait_unused(t)

    # -- closing ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the accepted dispatches (in order), then stop the ranks and free everything.

        Safe to call again; every later call on the worker raises UsageError (a RuntimeError).
        """
        core = self._core
        if core.closed:
            return
        if in_callback() is not None:
            raise UsageError("DistributedWorker.close(): called from inside a sub-worker callback; close the "
                             "worker after the dispatch's result() returns")
        try:
            with core.state:
                core.closing = True
                core.wakeup.notify_all()
            core.drain()
        finally:
            self._inherited = ()
            self._finalizer()

    def __enter__(self) -> DistributedWorker:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


