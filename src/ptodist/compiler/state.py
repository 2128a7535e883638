"""What a program's code reads from its process, as stamps that two moments can be compared by.

A rank runs the program's Python code (kernels, per-device functions and the helpers they call), so
what it computes can depend on Python state: module globals, closure cells, module attributes,
a global random generator.  ptodist's rule is that **each dispatch's ranks see the driver's state as
it is when the dispatch starts**, and **state a rank's code changes lasts only for that dispatch**.
A freshly forked rank gets that by construction; ranks kept between one-shot calls, a worker's ranks
started at ``prepare()``, and ranks that share the driver's memory (sim threads, the mpi process)
do not, so they compare stamps: the shm backend forks afresh when a kept group's stamp is no longer
the driver's, a worker refuses a dispatch when the driver's state changed since ``prepare()``, and a
rank whose code changed the state fails its dispatch (``KernelStateError``), the same on every backend.

What is read is found from the code's instructions, once per program: every global name a function's
code (and its nested code: regions, comprehensions, lambdas) loads or stores, its closure cells, the
attribute chains it looks up on them (``np.random.rand``: the module ``numpy.random``, and numpy's
global generator), and the user's own helper functions it reaches (not library code: the standard
library, installed packages, ptodist).  A stamp holds each value by identity (kept alive by the
stamp, so an address is never reused under it) plus what can change in place: the content of
numbers, strings, containers, numpy arrays and the user's own objects, a torch tensor's version
counter, a random generator's state.  A dispatch first makes the quick check
(:meth:`ProgramState.unchanged`: every lookup gives the same object, and only what changes in place
is read again); the value-by-value comparison runs only when that fails.
"""

from __future__ import annotations

import argparse
import array
import collections
import dataclasses
import dis
import functools
import itertools
import operator
import random
import sys
import types
import zlib

import numpy as np

from ..language.functions import Function, Kind
from ..source import is_library, is_ptodist
from .checks import reachable_functions

_MISSING = object()
_NO_PATHS: dict = {}
# Kinds of values that change in place, which a quick check reads again (the rest it compares by identity).
_VOLATILE = frozenset({"items", "dict", "buffer", "ndarray", "tensor", "rng", "method", "object"})
_BUDGET = 4096          # values a stamp looks into, at most; beyond, containers count by identity and length
_DEPTH = 4              # how deep a stamp looks into nested values and module attributes
# torch functions that draw from (or seed) its global generator: a program naming one reads that state.
_TORCH_RANDOM = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "bernoulli",
    "multinomial", "poisson", "manual_seed", "seed", "dropout", "random", "get_rng_state", "set_rng_state"})


class _Reader:
    """One stamp's reading: what it may still look into, the values it holds by identity, and where it read
    them (for :meth:`ProgramState.unchanged`)."""

    __slots__ = ("budget", "keep", "modules", "spaces", "names", "values", "cells", "volatile")

    def __init__(self):
        self.budget = _BUDGET
        self.keep: list = []      # held, so that no id in the stamp is reused while the stamp lives
        self.modules: set = set()  # modules already read (a module's attributes are read once a stamp)
        # Each dict lookup made (a global, a module attribute) and the value it gave, as three columns.
        self.spaces: list = []
        self.names: list = []
        self.values: list = []
        self.cells: list = []     # (closure cell, the value it held)
        self.volatile: list = []  # (value, its paths, its key): values that change in place, read again

    def same(self, v) -> int:
        self.keep.append(v)
        return id(v)

    def looked_up(self, space: dict, name: str, v, paths: dict, key) -> None:
        self.spaces.append(space)
        self.names.append(name)
        self.values.append(v)
        if _KINDS.get(type(v)) in _VOLATILE or (type(v) is types.ModuleType and _draws(v, paths)):
            self.volatile.append((v, paths, key))


class Stamp:
    """The values a program's code reads, at one moment: ``(label, key)`` pairs, compared pairwise.

    A key holds values by identity (their ids, the values themselves kept in ``keep``) and by content
    where they change in place.  ``reader`` keeps where each value was read, for the quick check.
    """

    __slots__ = ("entries", "keep", "reader", "path")

    def __init__(self, entries: list, reader: _Reader, path: list):
        self.entries = entries
        self.keep = reader.keep
        self.reader = reader
        self.path = path

    def __eq__(self, other) -> bool:
        return other is self or isinstance(other, Stamp) and self.entries == other.entries

    def __hash__(self) -> int:  # stamps are compared, never used as keys
        return len(self.entries)

    def changed(self, later: Stamp) -> list[str]:
        """The labels of the values that differ in ``later`` (everything, when the two read different sites)."""
        if len(self.entries) != len(later.entries):
            return sorted({label for label, _ in self.entries} ^ {label for label, _ in later.entries}) or ["?"]
        return [a[0] for a, b in zip(self.entries, later.entries) if a != b]


class _Site:
    """One place a value is read from: a global of a module, or a closure cell of a function."""

    __slots__ = ("label", "space", "name", "cell", "paths")

    def __init__(self, label: str, paths: dict, space: dict | None = None, name: str = "", cell=None):
        self.label = label
        self.space = space
        self.name = name
        self.cell = cell
        self.paths = paths  # the attribute chains the code looks up on the value, as a trie {name: {name: ...}}

    def value(self):
        if self.cell is not None:
            try:
                return self.cell.cell_contents
            except ValueError:  # an empty cell
                return _MISSING
        return self.space.get(self.name, _MISSING)


class ProgramState:
    """The sites a program's code reads; ``stamp()`` reads them now."""

    def __init__(self, functions):
        self.sites: list[_Site] = []
        self._where: dict[str, str] = {}  # a site's label -> the function (file:line) that reads it
        self._walk(functions)

    # -- finding the sites, once -----------------------------------------------------------------
    def _walk(self, functions) -> None:
        seen_fn: set[int] = set()
        seen_site: set = set()
        programs = [f for f in functions if isinstance(f, Function)]
        if programs:  # every program function they reach (class-form methods, an L2 entry's orchestration)
            functions = [*reachable_functions(programs[0], programs[1:]),
                         *(f for f in functions if not isinstance(f, Function))]
        # A sub-worker function runs in the driver between a dispatch's segments, as any driver code does.
        functions = [f for f in functions if getattr(f, "kind", None) is not Kind.SUBWORKER]
        todo = [fn for fn in (_python_function(f) for f in functions) if fn is not None]
        while todo:
            fn = todo.pop()
            if id(fn) in seen_fn:
                continue
            seen_fn.add(id(fn))
            globals_, cells = _paths(fn.__code__)
            where = f"{fn.__qualname__} ({fn.__code__.co_filename}:{fn.__code__.co_firstlineno})"
            space = fn.__globals__
            module = space.get("__name__", "?")
            for name, paths in globals_.items():
                if name not in space or name.startswith("__"):
                    continue
                key = (id(space), name)
                if key not in seen_site:
                    seen_site.add(key)
                    label = f"{module}.{name}"
                    self.sites.append(_Site(label, paths, space=space, name=name))
                    self._where.setdefault(label, where)
                todo.extend(_reached(space[name]))
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                key = (id(cell), name)
                if key not in seen_site:
                    seen_site.add(key)
                    label = f"{name} (a variable {fn.__qualname__} closes over)"
                    self.sites.append(_Site(label, cells.get(name, {}), cell=cell))
                    self._where.setdefault(label, where)
                try:
                    todo.extend(_reached(cell.cell_contents))
                except ValueError:
                    pass

    # -- reading them --------------------------------------------------------------------------
    def stamp(self) -> Stamp:
        r = _Reader()
        entries = []
        for site in self.sites:
            value = site.value()
            try:
                key = _key(value, site.paths, r, 0)
            except Exception:  # noqa: BLE001 - a value that cannot be looked into is compared by identity
                key = r.same(value)
            if site.cell is not None:
                r.cells.append((site.cell, value))
            else:
                r.looked_up(site.space, site.name, value, site.paths, key)
            entries.append((site.label, key))
        path = list(sys.path)
        entries.append(("sys.path", tuple(path)))
        return Stamp(entries, r, path)

    def unchanged(self, stamp: Stamp) -> bool:
        """Whether what the code reads is still ``stamp``'s: the quick check of every dispatch.

        Every lookup must give the very object it gave (one pass in C over the lookups), the values that
        change in place must read as they did, and ``sys.path`` must be equal.  False may still be a value
        rebound to an equal one: :meth:`changed_since` then compares by value.
        """
        r = stamp.reader
        if sys.path != stamp.path:
            return False
        if not all(map(operator.is_, map(dict.get, r.spaces, r.names, itertools.repeat(_MISSING)), r.values)):
            return False
        for cell, value in r.cells:
            try:
                if cell.cell_contents is not value:
                    return False
            except ValueError:  # an empty cell
                if value is not _MISSING:
                    return False
        for value, paths, key in r.volatile:
            try:
                if _key(value, paths, _Reader(), 0) != key:
                    return False
            except Exception:  # noqa: BLE001 - as stamp() does: such a value counts by identity only
                continue
        return True

    def changed_since(self, stamp: Stamp) -> list[str]:
        """The labels of what the code reads that is no longer as in ``stamp`` (empty when nothing is)."""
        return [] if self.unchanged(stamp) else stamp.changed(self.stamp())

    def where(self, label: str) -> str:
        """The function (and its file:line) that reads the site ``label``."""
        return self._where.get(label, "the program")


# The roots' ids -> (the roots, their ProgramState): the most recent programs' worth.
_STATES: collections.OrderedDict = collections.OrderedDict()


def state_of(functions) -> ProgramState:
    """The ``ProgramState`` of the program whose code starts at ``functions`` (ptodist Functions or plain
    functions), made once and kept for the most recent programs."""
    roots = tuple(functions)
    key = tuple(id(f) for f in roots)
    hit = _STATES.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], roots)):
        _STATES.move_to_end(key)
        return hit[1]
    state = ProgramState(roots)
    _STATES[key] = (roots, state)  # the roots are held, so their ids stay theirs
    while len(_STATES) > 64:
        _STATES.popitem(last=False)
    return state


def _python_function(f):
    """The Python function behind a ptodist Function (or a plain function), else None."""
    fn = getattr(f, "fn", f)
    return fn if isinstance(fn, types.FunctionType) else None


def _reached(value) -> list:
    """The functions whose code a value leads the program into: ptodist Functions (and an L2 entry's
    orchestration), and the user's own plain functions; never library code, nor a sub-worker function
    (driver code)."""
    if getattr(value, "kind", None) is Kind.SUBWORKER:
        return []
    out = []
    inner = getattr(value, "orchestration", None)
    if inner is not None and _python_function(inner) is not None:
        out.append(_python_function(inner))
    fn = value.__func__ if isinstance(value, types.MethodType) else value
    if type(fn).__module__.startswith("ptodist.") and _python_function(fn) is not None:
        fn = _python_function(fn)
    if isinstance(fn, types.FunctionType) and not is_library(fn.__code__.co_filename) \
            and not is_ptodist(fn.__code__.co_filename):
        out.append(fn)
    return out


_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_CELL_LOADS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF", "STORE_DEREF"})
_ATTRS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


@functools.lru_cache(maxsize=4096)  # by code object: a rank forked from the driver finds the driver's reading
def _paths(code) -> tuple[dict, dict]:
    """The global names and the free variables ``code`` and its nested code load or store, each with the
    attribute chains looked up on it, as tries: ``np.random.rand()`` gives ``{"np": {"random": {"rand": {}}}}``."""
    globals_: dict = {}
    cells: dict = {}
    todo = [code]
    while todo:
        c = todo.pop()
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        node = None
        for ins in dis.get_instructions(c):
            if ins.opname in _ATTRS and node is not None:
                node = node.setdefault(ins.argval, {})
            elif ins.opname in _LOADS:
                node = globals_.setdefault(ins.argval, {})
            elif ins.opname in _CELL_LOADS:
                node = cells.setdefault(ins.argval, {})
            else:
                node = None
    return globals_, cells


def _key(v, paths: dict, r: _Reader, depth: int):
    """What of ``v`` can tell a change: its value for plain data, else its identity plus what changes in place."""
    r.budget -= 1
    t = type(v)
    kind = _KINDS.get(t) or _kind_of(t)
    if kind == "same":
        return r.same(v)
    if kind == "plain":
        return (t, v)  # by type too: True is not 1
    if kind == "float":
        return (float, v.hex())  # -0.0 is not 0.0, and a NaN equals itself
    if kind == "complex":
        return (complex, v.real.hex(), v.imag.hex())
    if v is _MISSING:
        return "<unbound>"
    if r.budget <= 0 or depth > _DEPTH:
        return (r.same(v), len(v)) if kind in ("items", "dict") else r.same(v)
    if kind == "items":
        return (t, r.same(v), tuple(_key(x, _NO_PATHS, r, depth + 1) for x in v))
    if kind == "dict":
        return (t, r.same(v), tuple((_key(k, _NO_PATHS, r, depth + 1), _key(x, _NO_PATHS, r, depth + 1))
                                    for k, x in v.items()))
    if kind == "buffer":
        return (t, r.same(v), bytes(v))
    if kind == "module":
        return _module_key(v, paths, r, depth)
    if kind == "ndarray":
        return (r.same(v), v.shape, v.dtype.str, _digest(v, r))
    if kind == "npscalar":
        return (t, v.tobytes())
    if kind == "tensor":  # changed in place: its version counter moves
        return (r.same(v), v._version, tuple(v.shape), str(v.dtype), _data_ptr(v))
    if kind == "rng":
        return (r.same(v), _rng_state(v))
    if kind == "method":  # a generator's bound method (``from random import random``) reads its state
        owner = getattr(v, "__self__", None)
        rng = _rng_state(owner) if owner is not None else None
        return (r.same(v), rng)
    state = getattr(v, "__dict__", None)  # "object": the program's own data
    return (r.same(v), _key(state, _NO_PATHS, r, depth + 1) if isinstance(state, dict) else None)


_KINDS: dict = {type(None): "plain", bool: "plain", int: "plain", str: "plain", bytes: "plain", float: "float",
                complex: "complex", tuple: "items", list: "items", set: "items", frozenset: "items", dict: "dict"}


def _kind_of(t: type) -> str:
    """How ``_key`` reads a value of type ``t`` (worked out once per type)."""
    torch = sys.modules.get("torch")
    if issubclass(t, dict):  # Counter, defaultdict, OrderedDict: containers too
        kind = "dict"
    elif issubclass(t, (list, tuple, set, frozenset, collections.deque)):
        kind = "items"
    elif issubclass(t, (bytearray, array.array)):
        kind = "buffer"
    elif issubclass(t, types.ModuleType):
        kind = "module"
    elif issubclass(t, np.ndarray):
        kind = "ndarray"
    elif issubclass(t, np.generic):
        kind = "npscalar"
    elif torch is not None and issubclass(t, torch.Tensor):
        kind = "tensor"
    elif issubclass(t, (random.Random, np.random.RandomState, np.random.Generator)) or \
            (t.__module__ == "torch" and t.__name__ == "Generator"):
        kind = "rng"
    elif issubclass(t, (types.BuiltinMethodType, types.MethodType)):
        kind = "method"
    elif t.__module__.startswith("ptodist") or issubclass(t, (types.FunctionType, types.BuiltinFunctionType, type)):
        kind = "same"
    else:
        kind = "object" if _user_object(t) else "same"
    _KINDS[t] = kind
    return kind


def _module_key(m: types.ModuleType, paths: dict, r: _Reader, depth: int):
    """A module by identity, plus the attributes the code looks up on it (a module attribute replaced by a
    monkeypatch shows), plus the global random state it draws from (``random``, ``numpy.random``, and
    ``torch`` when the code calls a random function of it)."""
    if m in r.modules and not paths:
        return r.same(m)
    r.modules.add(m)
    space = m.__dict__
    attrs = []
    for name, sub in paths.items():
        x = space.get(name, _MISSING)
        if _KINDS.get(type(x)) == "same":  # most attributes (functions, classes): inline, they are many
            r.keep.append(x)
            key = id(x)
        else:
            key = _key(x, sub, r, depth + 1)
        r.looked_up(space, name, x, sub, key)
        attrs.append(key)
    rng = None
    if _draws(m, paths):
        if m is random:
            rng = hash(random.getstate())
        elif m.__name__ == "numpy.random":
            rng = _rng_state(np.random.mtrand._rand)
        else:
            rng = zlib.crc32(m.random.get_rng_state().numpy().tobytes())
    return (r.same(m), tuple(attrs), rng)


def _draws(m: types.ModuleType, paths: dict) -> bool:
    """Whether code that looks up ``paths`` on module ``m`` reads a global random generator's state."""
    return m is random or m.__name__ == "numpy.random" or \
        (m.__name__ == "torch" and not _TORCH_RANDOM.isdisjoint(paths))


def _rng_state(v):
    """A digest of a random generator's state (random.Random, numpy RandomState/Generator, torch.Generator),
    else None."""
    if isinstance(v, random.Random):
        return hash(v.getstate())
    if isinstance(v, (np.random.RandomState, np.random.Generator)):
        bits = v._bit_generator if isinstance(v, np.random.RandomState) else v.bit_generator
        return _state_digest(bits.state)
    t = type(v)
    if t.__module__ == "torch" and t.__name__ == "Generator":
        return zlib.crc32(v.get_state().numpy().tobytes())
    return None


def _state_digest(state) -> int:
    if isinstance(state, dict):
        return hash(tuple((k, _state_digest(x)) for k, x in state.items()))
    if isinstance(state, np.ndarray):
        return zlib.crc32(np.ascontiguousarray(state).tobytes())
    return hash(state)


def _digest(a: np.ndarray, r: _Reader):
    if a.dtype.hasobject:
        return r.same(a)  # Python objects inside: compared by identity only
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1)) if a.size else 0


def _data_ptr(t) -> int:
    try:
        return t.data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (meta, some subclasses): its version tells
        return 0


def _user_object(t: type) -> bool:
    """Whether instances of ``t`` are the program's own data, whose attributes a stamp looks into: a class
    defined in the user's code, a dataclass, a namespace of settings; a library object's internals (caches
    and the like) are not."""
    if issubclass(t, (types.SimpleNamespace, argparse.Namespace)) or dataclasses.is_dataclass(t):
        return True
    module = sys.modules.get(t.__module__)
    path = getattr(module, "__file__", None)
    return path is not None and not is_library(path) and not is_ptodist(path)


# (id(plan), rank) -> (the plan, its rank's ProgramState or None).
_PLANS: collections.OrderedDict = collections.OrderedDict()


def rank_state(plan, rank: int) -> ProgramState | None:
    """The ``ProgramState`` of the functions ``rank`` runs in ``plan`` (None when it runs no program function)."""
    key = (id(plan), rank)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    roots = []
    for task in plan.tasks[rank]:
        if isinstance(task.function, Function) and all(task.function is not f for f in roots):
            roots.append(task.function)
    state = state_of(roots) if roots else None
    _PLANS[key] = (plan, state)  # the plan is held, so its id stays its own
    while len(_PLANS) > 64:
        _PLANS.popitem(last=False)
    return state


def changed_message(state: ProgramState, labels: list[str], what: str) -> str:
    """Why a change of the state at ``labels`` is refused; ``what`` says who changed it."""
    shown = ", ".join(f"'{label}' (read by {state.where(label)})" for label in labels[:4])
    more = f" and {len(labels) - 4} more" if len(labels) > 4 else ""
    return (f"{what} changed Python state the program reads: {shown}{more}. Each dispatch's ranks see the "
            "driver's state as it is when the dispatch starts, and what a rank changes there lasts only for that "
            "dispatch, whatever the backend: a rank forked afresh would not see the change, a rank kept from an "
            "earlier call would, and ranks that share the driver's memory (sim threads, the mpi process) would "
            "carry it into the driver, so results would depend on the backend and on timing. Pass what a kernel "
            "needs as arguments, keep what must outlive a dispatch in a tensor or window, and draw random numbers "
            "in the driver (or with pl.random).")


def stale_message(state: ProgramState, labels: list[str], program: str) -> str:
    """Why a worker refuses a dispatch after the state at ``labels`` changed since ``prepare()``."""
    shown = ", ".join(f"'{label}' (read by {state.where(label)})" for label in labels[:4])
    more = f" and {len(labels) - 4} more" if len(labels) > 4 else ""
    return (f"{program}: dispatch refused: Python state the program reads changed since prepare() started the "
            f"worker's ranks: {shown}{more}. A worker's ranks run with the state they were started with, so "
            "they would compute with values the driver no longer has (on sim and mpi, whose ranks share the "
            "driver's memory, with the new ones): the result would depend on the backend. Set such values "
            "before prepare(), pass them as arguments (scalars, tensors), or close this worker and prepare a "
            "new one; restoring the old value makes this worker usable again.")
