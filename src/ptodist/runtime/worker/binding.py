"""Binding a dispatch's arguments to memory its ranks can see, and making the command for a segment.

``SharedBinding`` serves ranks in other processes (the shm group): host tensors must be shared
memory (torch ``.share_memory_()``, ``shared_array``), found by address and sent to the ranks once
as file descriptors under a token; memory freed or garbage collected is dropped by token.
``LocalBinding`` serves ranks that see the driver's memory (sim threads, the mpi process itself):
any CPU tensor is used in place.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections import deque

import numpy as np

from ...backends.base import Command, HostView, SharedHeap
from ...errors import DispatchTypeError, NotSharedError
from ...language import dtypes as dt
from ...language.types import Direction
from ..host_args import unsupported_dtype
from .handles import DeviceTensor, StackedDeviceTensor, host_array
from .memory import SharedFile, SharedMapping, shared_mapping
from .outputs import OutputPool
from .staging import Staging, stageable

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds

PLANS_KEPT_BY_RANKS = 256


class _Arg:
    """A tensor argument of a dispatch, as the ranks will see it (the adapter ``_bind`` uses)."""

    __slots__ = ("value", "dtype", "shape", "is_torch", "kind", "map", "offset", "strides", "resident", "view",
                 "stage", "views", "__weakref__")

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
        self.view = None          # its HostView, made at its first command (arguments bound alike reuse it)
        self.stage = None         # staged (shm: staging.py): the (lo, hi, first) addresses of its span, element 0
        self.views = None         # shm: the views of a tensor bound before, by writability (kept with its binding)


class _Known:
    """A torch tensor a SharedBinding mapped: what it bound to, and the key that says it is unchanged."""

    __slots__ = ("ref", "key", "map", "offset", "strides", "dtype", "views")

    def __init__(self, ref, key: tuple, map_, offset: int, strides: tuple, dtype):
        self.ref, self.key = ref, key  # weakly the tensor; (data_ptr, shape, stride, torch dtype)
        self.map, self.offset, self.strides, self.dtype = map_, offset, strides, dtype
        self.views: dict = {}  # its HostViews by writability, made at its first commands


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


class _Bound:
    """The arguments of a program's last dispatch, bound: the same objects, unchanged, bind the same way.

    Tensors are held weakly (the worker must not keep the caller's memory alive) and checked
    for what binding depends on: address, shape, strides and dtype; other arguments by identity.
    """

    __slots__ = ("items", "values", "hosts", "entry", "bound", "residents", "created")

    def __init__(self, items, values, hosts, entry, created: bool = False):
        self.items, self.values, self.hosts, self.entry = items, values, hosts, entry
        self.created = created  # the inputs-only form: the outputs were made for that dispatch
        # The hosts whose memory can be forgotten or freed since: the only ones matches() looks at again.
        self.bound = [h for h in hosts if h is not None and h.kind != "empty"]
        self.residents: set | None = None  # serials of the resident files the arguments use (the engine's)

    @staticmethod
    def _array_key(a):
        return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype, a.flags.writeable)

    @staticmethod
    def _resident_key(a):
        return a._file

    @staticmethod
    def _torch_key(a):
        return (a.data_ptr(), a.shape, a.stride(), a.dtype)

    @classmethod
    def of(cls, args, values, hosts, entry, created: bool = False) -> _Bound | None:
        items = []
        for a in args:
            if isinstance(a, np.ndarray):
                key_of = cls._array_key
            elif isinstance(a, (DeviceTensor, StackedDeviceTensor)):
                key_of = cls._resident_key
            elif type(a).__module__.startswith("torch"):
                key_of = cls._torch_key
            else:
                items.append((None, a, None))
                continue
            try:
                items.append((weakref.ref(a), key_of(a), key_of))
            except TypeError:
                return None
        return cls(items, values, hosts, entry, created)

    def matches(self, args, binding) -> bool:
        """Whether ``args`` are the same objects, unchanged, as last time (every dispatch asks: kept cheap)."""
        items = self.items
        if len(args) != len(items) or self.created:
            return False
        for a, (ref, key, key_of) in zip(args, items):
            if ref is None:
                if a is not key:
                    return False
            elif ref() is not a or key_of(a) != key:
                return False
        # A resident tensor freed since, or memory forgotten since, binds differently (or not at all).
        for h in self.bound:
            if not binding.still_bound(h) or (h.resident is not None and h.resident.freed):
                return False
        return True

    def same_layout(self, args) -> bool:
        """Whether ``args`` bind as last time's do, tensors other than theirs included: the same other arguments,
        and host tensors of the same kind, shape, strides and dtype (so the same checks pass and the same plan
        serves); only where their memory lies differs."""
        items = self.items
        if len(args) != len(items):
            return False
        for a, (ref, key, key_of) in zip(args, items):
            if ref is None:  # not a tensor: the same object
                if a is not key:
                    return False
            elif key_of is _Bound._resident_key:  # a resident tensor: the same one
                if ref() is not a:
                    return False
            elif key_of is _Bound._array_key:
                if not isinstance(a, np.ndarray) or key_of(a)[1:] != key[1:]:
                    return False
            elif not type(a).__module__.startswith("torch") or not hasattr(a, "data_ptr") or key_of(a)[1:] != key[1:]:
                return False
        return all(h.resident is None or not h.resident.freed for h in self.bound)


class Arena:
    """A window heap kept across dispatches: ``stride`` bytes per rank; ``rows`` what this process zeroes."""

    def __init__(self, stride: int, rows: np.ndarray, owner):
        self.stride = stride
        self.rows = rows
        self.owner = owner   # the binding's own record of it (a shared file) or the group's arena
        self.used = False


def _resident_arg(value, where: str, engine) -> _Arg:
    engine.check_resident(value, where)
    kind = "stacked" if isinstance(value, StackedDeviceTensor) else "resident"
    offset = value._offset if isinstance(value, DeviceTensor) else 0
    itemsize = value.dtype.get_byte()
    strides = tuple(int(s) * itemsize for s in _c_strides(value.shape))
    return _Arg(value, value.dtype, value.shape, False, kind, None, offset, strides, value)


def _staged(value, dtype, is_torch: bool, strides, lo: int, hi: int, first: int) -> _Arg:
    a = _Arg(value, dtype, value.shape, is_torch, "host", None, 0, tuple(strides))
    a.stage = (lo, hi, first)
    return a


def _torch_span(t, strides, itemsize: int) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` a (non-empty) torch tensor with byte ``strides`` spans."""
    lo = t.data_ptr()
    return lo, lo + sum((d - 1) * s for d, s in zip(t.shape, strides)) + itemsize


def _span(a: _Arg) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` a host argument's caller memory spans."""
    if a.stage is not None:
        return a.stage[:2]
    return _torch_span(a.value, a.strides, a.dtype.get_byte()) if a.is_torch else byte_bounds(a.value)


def _c_strides(shape: tuple) -> tuple:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _where(compiled, name: str) -> str:
    return f"{compiled.host.name}() parameter '{name}'"


def _writable(d, i: int) -> bool:
    params = d.compiled.host.params
    return i >= len(params) or params[i].direction is not Direction.IN  # beyond the parameters: intermediates


class LocalBinding:
    """Ranks that see the driver's memory: every CPU tensor is bound in place."""

    def __init__(self, group, engine):
        self.group = group
        self.engine = engine

    def adapt(self, value, name: str, compiled) -> _Arg:
        if isinstance(value, (DeviceTensor, StackedDeviceTensor)):
            return _resident_arg(value, _where(compiled, name), self.engine)
        is_torch = type(value).__module__.startswith("torch")
        if not is_torch and not isinstance(value, np.ndarray):
            raise DispatchTypeError(f"parameter '{name}' is a tensor parameter; got {type(value).__name__}. Pass a "
                                    "torch tensor, a numpy array, or a DeviceTensor / StackedDeviceTensor of this "
                                    "worker.")
        dtype = dt.from_torch(value.dtype) if is_torch else dt.from_numpy(value.dtype)
        if dtype is None:
            raise unsupported_dtype(name, value.dtype, is_torch)
        if is_torch and value.device.type != "cpu":
            raise DispatchTypeError(f"host tensor '{name}' is on {value.device}; pass a CPU tensor")
        kind = "empty" if (value.numel() if is_torch else value.size) == 0 else "host"
        return _Arg(value, dtype, tuple(value.shape), is_torch, kind)

    @staticmethod
    def new_output(p, shape, like_torch: bool):
        if like_torch:
            import torch

            return torch.zeros(shape, dtype=dt.to_torch(p.ttype.dtype))
        return np.zeros(shape, dtype=p.ttype.dtype.np_dtype)

    @staticmethod
    def new_intermediate(shape, dtype):
        return np.zeros(shape, dtype=dtype.np_dtype)

    @staticmethod
    def still_bound(arg: _Arg) -> bool:
        return True

    def new_arena(self, stride: int) -> Arena:
        a = self.group.new_arena(stride)
        return Arena(stride, a.rows, a)

    @staticmethod
    def drop_arena(arena: Arena) -> None:
        close = getattr(arena.owner, "close", None)
        if close is not None:
            close()

    def command(self, d, segment: int) -> Command:
        hosts = []
        for i, a in enumerate(d.args):
            if a is None:
                hosts.append(None)
                continue
            w = _writable(d, i)
            if a.resident is not None:
                array = a.resident._array()
            elif a.is_torch:
                array = host_array(a.value, f"parameter {i}")
            else:
                array = a.value
            hosts.append(HostView(a.shape, a.dtype.name, w, array=array))
        e = d.entry
        return Command(d.handle.number, e.id, e.plan, e.boundaries, segment, hosts,
                       d.arena.owner if d.arena is not None else None, d.dfx, d.config.resolved_hang_timeout(),
                       scalars=d.compiled.scalar_values(d.values, d.args))

    def sent(self, command: Command) -> None:
        pass

    def returned(self) -> None:
        pass

    @staticmethod
    def forget_file(file: SharedFile) -> None:
        file.close()

    def release(self) -> None:
        pass


class SharedBinding:
    """Ranks in other processes: host tensors in shared memory, sent once as descriptors under a token."""

    def __init__(self, group, engine):
        self.group = group
        self.engine = engine
        self.maps: dict = {}         # key -> _Map
        self.by_token: dict = {}     # token -> key
        self.tensors: dict = {}      # id(torch tensor) -> its _Known: what binding one costs is paid once
        self.tokens = itertools.count(1)
        self.forgotten: deque = deque()  # tokens whose memory is gone (appended from finalizers too)
        self.drops: list[int] = []
        self.sent_plans: set[int] = set()
        self.forget_plans = False
        self.staging = Staging(self)
        self.outputs = OutputPool()  # the outputs and intermediates it makes, reused once the caller lets go

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

    def _mapped(self, key) -> bool:
        """Whether the ranks map the memory at ``key`` already (a tensor there costs them nothing new)."""
        m = self.maps.get(key)
        return m is not None and m.sent and (m.ref is None or m.ref() is not None)

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

    def array_map(self, mm: SharedMapping) -> _Map:
        return self._entry(("array", mm.serial), mm, lambda token: _Map(token, mm.size, mm.fd, False))

    def file_map(self, file: SharedFile) -> _Map:
        return self._entry(("file", file.serial), None, lambda token: _Map(token, file.size, file.fd, False))

    def forget_file(self, file: SharedFile) -> None:
        m = self.maps.pop(("file", file.serial), None)
        if m is not None:
            self._release(m)
        file.close()

    # -- binding ----------------------------------------------------------------------------
    def adapt(self, value, name: str, compiled, stage: bool = True) -> _Arg:
        """``value`` (parameter ``name``) as the ranks will see it: mapped, or staged (``stage``: when it is small
        and its memory not mapped yet, see staging.py)."""
        if type(value).__module__.startswith("torch"):  # the usual case first: every dispatch adapts its tensors
            import torch

            if isinstance(value, torch.Tensor):
                return self._torch_arg(value, name, compiled, stage)
        where = _where(compiled, name)
        if isinstance(value, (DeviceTensor, StackedDeviceTensor)):
            a = _resident_arg(value, where, self.engine)
            a.map = self.file_map(value._file)
            return a
        if isinstance(value, np.ndarray):
            dtype = dt.from_numpy(value.dtype)
            if dtype is None:
                raise unsupported_dtype(name, value.dtype, False)
            if value.size == 0:
                return _Arg(value, dtype, value.shape, False, "empty")
            lo, hi = byte_bounds(value)
            mm = shared_mapping(lo, hi)
            if mm is None:
                raise NotSharedError(
                    f"{where}: the numpy array is not in shared memory, so the worker's rank processes cannot see "
                    "it. Allocate it with ptodist.shared_array(shape, dtype) and fill it in place, or copy it to "
                    "the worker: rt.alloc_tensor(shape, dtype, init=array) (or rt.copy_to) and pass the "
                    "DeviceTensor.")
            first = value.__array_interface__["data"][0]
            if stage and stageable(lo, hi, value.strides) and not self._mapped(("array", mm.serial)):
                return _staged(value, dtype, False, value.strides, lo, hi, first)
            return _Arg(value, dtype, value.shape, False, "host", self.array_map(mm), first - mm.address,
                        value.strides)
        raise DispatchTypeError(f"parameter '{name}' is a tensor parameter; got {type(value).__name__}. Pass a torch "
                                "tensor, a numpy array, or a DeviceTensor / StackedDeviceTensor of this worker.")

    def _torch_arg(self, t, name: str, compiled, stage: bool) -> _Arg:
        known = self.tensors.get(id(t))
        if known is not None and known.ref() is t:  # bound before: unchanged, and its memory still the ranks'
            key = (t.data_ptr(), t.shape, t.stride(), t.dtype)
            if known.key == key and known.map.token in self.by_token:
                a = _Arg(t, known.dtype, key[1], True, "host", known.map, known.offset, known.strides)
                a.views = known.views
                return a
        dtype = dt.from_torch(t.dtype)
        if dtype is None:
            raise unsupported_dtype(name, t.dtype, True)
        if not t.is_cpu:
            raise DispatchTypeError(f"host tensor '{name}' is on {t.device}; pass a CPU tensor")
        if t.numel() == 0:
            return _Arg(t, dtype, t.shape, True, "empty")
        itemsize = dtype.get_byte()
        stride = t.stride()
        strides = tuple(s * itemsize for s in stride)
        lo, hi = _torch_span(t, strides, itemsize)
        stage = stage and stageable(lo, hi, strides)
        storage = t.untyped_storage()
        if storage.is_shared():
            at = storage.data_ptr()
            if stage and not self._mapped(("torch", at)):
                return _staged(t, dtype, True, strides, lo, hi, lo)
            m = self.torch_map(storage)
            offset = m.data_offset + lo - at
            tensors, ident = self.tensors, id(t)
            tensors[ident] = _Known(weakref.ref(t, lambda _: tensors.pop(ident, None)), (lo, t.shape, stride, t.dtype),
                                    m, offset, strides, dtype)
            return _Arg(t, dtype, t.shape, True, "host", m, offset, strides)
        mm = shared_mapping(lo, hi)  # e.g. torch.from_numpy(ptodist.shared_array(...))
        if mm is not None:
            if stage and not self._mapped(("array", mm.serial)):
                return _staged(t, dtype, True, strides, lo, hi, lo)
            return _Arg(t, dtype, t.shape, True, "host", self.array_map(mm), lo - mm.address, strides)
        raise NotSharedError(
            f"{_where(compiled, name)}: the torch tensor is not in shared memory, so the worker's rank processes "
            f"cannot see it. Call {name}.share_memory_() on it (before or after prepare()), or copy it to the "
            f"worker: rt.alloc_tensor(shape, dtype, init={name}) (or rt.copy_to) and pass the DeviceTensor.")

    def new_output(self, p, shape, like_torch: bool):
        pool = self.outputs
        return (pool.torch_zeros if like_torch else pool.array_zeros)(tuple(shape), p.ttype.dtype)

    def new_intermediate(self, shape, dtype):
        return self.outputs.array_zeros(tuple(shape), dtype)

    def still_bound(self, arg: _Arg) -> bool:
        return arg.stage is not None or arg.map.token in self.by_token

    # -- window heaps ---------------------------------------------------------------------------
    def new_arena(self, stride: int) -> Arena:
        world = self.group.world
        file = SharedFile(stride * world, "ptodist-windows")
        return Arena(stride, file.bytes[:stride * world].reshape(world, stride), (file, self.file_map(file)))

    def drop_arena(self, arena: Arena) -> None:
        self.forget_file(arena.owner[0])  # the ranks drop it with the next command

    # -- commands -------------------------------------------------------------------------------
    def command(self, d, segment: int) -> Command:
        """The command for segment ``segment`` of dispatch ``d``, with the memory its ranks do not have yet."""
        self._forgotten()
        entry = d.entry
        hosts, maps, staged = [], [], []
        if not d.published and any(a is not None and a.stage is not None for a in d.args):
            self._unstage(d)  # at a dispatch's first command: its ranks keep its arguments' views to its end
        for i, a in enumerate(d.args):
            if a is None or a.stage is not None:
                hosts.append(None)
                if a is not None:
                    staged.append((i, a))
                continue
            view = a.view
            if view is None:
                w = _writable(d, i)
                views = a.views
                view = views.get(w) if views is not None else None
                if view is None:
                    view = HostView(a.shape, a.dtype.name, w) if a.kind == "empty" else \
                        HostView(a.shape, a.dtype.name, w, a.map.token, a.offset, a.strides)
                    if views is not None:
                        views[w] = view
                a.view = view
            hosts.append(view)
            if a.kind != "empty" and not a.map.sent:
                maps.append(a.map)
        if staged:
            for (i, _), view in zip(staged, self.staging.views([(a, _writable(d, i)) for i, a in staged])):
                hosts[i] = view
            if not self.staging.map.sent:
                maps.append(self.staging.map)
        else:
            self.staging.idle()
        if d.arena is not None and not d.arena.owner[1].sent:
            maps.append(d.arena.owner[1])
        if len(maps) > 1:
            maps = list({id(m): m for m in maps}.values())
        if len(self.sent_plans) >= PLANS_KEPT_BY_RANKS and entry.id not in self.sent_plans:
            self.sent_plans.clear()
            self.forget_plans = True
        heap = None
        if d.arena is not None:
            file, m = d.arena.owner
            heap = SharedHeap(m.token, d.arena.stride, file.bytes)
        return Command(d.handle.number, entry.id, entry.plan, entry.boundaries, segment, hosts,
                       heap, d.dfx, d.config.resolved_hang_timeout(),
                       blob=entry.blob if entry.id not in self.sent_plans else None,
                       maps=maps, fds=[m.fd for m in maps], drops=self.drops, forget_plans=self.forget_plans,
                       scalars=d.compiled.scalar_values(d.values, d.args))

    def _unstage(self, d) -> None:
        """Map, rather than stage, an argument the last dispatch staged too (a tensor used again: mapped, it costs
        nothing more), and one whose memory a mapped argument of the dispatch shares (the two must see each
        other's writes)."""
        again = {id(a) for a in (ref() for ref in self.staging.last) if a is not None}
        for a in d.args:
            if a is not None and a.stage is not None and id(a) in again:
                self._map_staged(a, d)
        mapped = [_span(a) for a in d.args if a is not None and a.kind == "host" and a.stage is None]
        for a in d.args:
            if a is not None and a.stage is not None and any(lo < a.stage[1] and a.stage[0] < hi for lo, hi in mapped):
                self._map_staged(a, d)

    def _map_staged(self, a: _Arg, d) -> None:
        m = self.adapt(a.value, "", d.compiled, stage=False)
        a.map, a.offset, a.strides, a.stage, a.view, a.views = m.map, m.offset, m.strides, None, None, m.views

    def returned(self) -> None:
        """The command in flight is over: what the ranks wrote to staged arguments goes to the caller's memory."""
        self.staging.copy_back()

    def sent(self, command: Command) -> None:
        """The ranks have the command: its memory is theirs now, its drops done."""
        self.drops = []
        self.forget_plans = False
        self.sent_plans.add(command.plan_id)
        for m in command.maps:
            m.sent = True
            if m.owns_fd:
                os.close(m.fd)
                m.fd = -1

    def release(self) -> None:
        self.staging.close()
        self.outputs.clear()
        for m in self.maps.values():
            if m.finalizer is not None:
                m.finalizer.detach()
            if m.owns_fd and m.fd >= 0:
                os.close(m.fd)
        self.maps.clear()
