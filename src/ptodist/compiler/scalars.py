"""Scalar arguments in plans: one plan serves every value of a scalar that the host orchestrator only passes on.

While the host orchestrator is planned, each of its scalar parameters is a :class:`ScalarSlot`: a stand-in that
behaves as its value (``isinstance(slot, int)`` holds for an int) and notes when the host *uses* it: any
operation (arithmetic, a comparison, ``if``, ``range``, an index, formatting) marks it used.  A slot that only
reaches the arguments of per-device functions leaves a :class:`~ptodist.compiler.plan.ScalarArg` in the plan; the
rank takes its value from the dispatch (``Command.scalars``), so the plan holds for every value.  A plan whose
host used a scalar holds for that value only: :class:`PlanCache` keys it by the exact value (its bits: ``-0.0``
is not ``0.0``, a NaN is itself) of the scalars the host used.  Both caches are bounded (least recently used
plans go first).
"""

from __future__ import annotations

import enum
import operator
import struct
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..language.dtypes import DataType
from ..language.scalar import Scalar
from . import checks
from .plan import BuiltinCall, DispatchPlan, HostTensorRef, ScalarArg, WindowView

PLANS_KEPT = 256  # plans a cache holds, all argument signatures and scalar values together


class ScalarSlot:
    """A host scalar argument while the host orchestrator is planned: its value, and whether the host used it."""

    __slots__ = ("_value", "index", "used")
    _ptodist_slot = True  # language.scalar reads the value of a slot it checks without using it

    def __init__(self, value, index: int):
        self._value = value
        self.index = index
        self.used = False

    def peek(self):
        """The value, without counting as a use (ptodist's own checks of an argument)."""
        return self._value

    @property
    def __class__(self):  # noqa: D105 - isinstance(slot, int) holds as for the value, and type() tells it apart
        return type(self._value)

    def use(self):
        self.used = True
        return self._value

    def __getattr__(self, name):  # n.bit_length(), x.real, ...: a use
        return getattr(self.use(), name)

    def __reduce__(self):  # copied or pickled: a plain value from then on, which the plan then depends on
        return type(self._value), (self.use(),)


def _value(x):
    return x.use() if type(x) is ScalarSlot else x


def used(a, leaf=None):
    """``a`` with every slot in it (in lists, tuples and dicts too) replaced by its value, which counts as used;
    ``leaf(x)``, when given, sees every other value found."""
    t = type(a)
    if t is ScalarSlot:
        return a.use()
    if t is list or t is tuple:
        return t(used(x, leaf) for x in a)
    if t is dict:
        return {k: used(x, leaf) for k, x in a.items()}
    if leaf is not None:
        leaf(a)
    return a


def _binary(fn, reflected: bool):
    if reflected:
        def method(self, other):
            return fn(_value(other), self.use())
    else:
        def method(self, other):
            return fn(self.use(), _value(other))
    return method


def _unary(fn):
    def method(self, *args):
        return fn(self.use(), *map(_value, args))
    return method


for _name, _fn in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv), ("mod", operator.mod),
                   ("divmod", divmod), ("pow", pow), ("lshift", operator.lshift), ("rshift", operator.rshift),
                   ("and", operator.and_), ("or", operator.or_), ("xor", operator.xor), ("matmul", operator.matmul)]:
    setattr(ScalarSlot, f"__{_name}__", _binary(_fn, False))
    setattr(ScalarSlot, f"__r{_name}__", _binary(_fn, True))
for _name, _fn in [("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt), ("le", operator.le),
                   ("gt", operator.gt), ("ge", operator.ge)]:
    setattr(ScalarSlot, f"__{_name}__", _binary(_fn, False))
for _name, _fn in [("neg", operator.neg), ("pos", operator.pos), ("abs", abs), ("invert", operator.invert),
                   ("int", int), ("float", float), ("complex", complex), ("index", operator.index), ("bool", bool),
                   ("hash", hash), ("repr", repr), ("str", str), ("format", format), ("round", round),
                   ("trunc", lambda v: v.__trunc__()), ("floor", lambda v: v.__floor__()),
                   ("ceil", lambda v: v.__ceil__())]:
    setattr(ScalarSlot, f"__{_name}__", _unary(_fn))


def slots_for(values: list, hosts: list) -> list:
    """The host's arguments with a :class:`ScalarSlot` for each scalar (``hosts[i]`` None and a number)."""
    return [ScalarSlot(v, i) if h is None and type(v) in (int, float) else v
            for i, (v, h) in enumerate(zip(values, hosts))]


# What a task's argument may be that cannot hide a slot inside it.
_PLAIN = (HostTensorRef, WindowView, Scalar, DataType, enum.Enum, str, bytes, int, float, bool, type(None))


@dataclass
class Finished:
    """What planning with slots found: the scalars the host used, and the checks a later value must pass."""

    used: frozenset                               # host parameter indices whose value the plan depends on
    checks: list = field(default_factory=list)    # (host index, per-device function, its parameter, called at)


def finish(plan: DispatchPlan, proxies: list, names: list[str], calls=()) -> Finished:
    """Replace ``plan``'s slots: a scalar its host only passed to per-device functions by a ``ScalarArg``, any other
    by its value (and count it used).  ``names``: the host's parameter names; ``calls``: the sub-worker calls (a
    callback takes the arguments the plan recorded)."""
    slots = [p for p in proxies if type(p) is ScalarSlot]
    if not slots:
        return Finished(frozenset())
    hidden = False  # an argument of the program's own kind, which could hold a slot out of our sight

    def note(a) -> None:
        nonlocal hidden
        if isinstance(a, np.ndarray) and a.dtype != object:
            return
        if not isinstance(a, _PLAIN) and not callable(a):
            hidden = True
        elif callable(a) and not isinstance(a, type):
            hidden = hidden or bool(getattr(a, "__closure__", None))  # a closure could hold a slot

    def unwrap(a):
        return used(a, note)

    for ts in plan.tasks:
        for t in ts:
            if isinstance(t.function, BuiltinCall):  # a collective's arguments shape its plan: used
                b = t.function
                b.args, b.kwargs = unwrap(b.args), unwrap(b.kwargs)
                t.args = unwrap(t.args)
            else:
                t.args = [a if type(a) is ScalarSlot else unwrap(a) for a in t.args]
    for c in calls:
        c.args = unwrap(c.args)
    if hidden:
        for s in slots:
            s.used = True
    found = []
    for ts in plan.tasks:
        for t in ts:
            if isinstance(t.function, BuiltinCall):
                continue
            params = t.function.params
            for j, a in enumerate(t.args):
                if type(a) is ScalarSlot:
                    if a.used:
                        t.args[j] = a.peek()
                        continue
                    spec = params[j] if j < len(params) else None
                    t.args[j] = ScalarArg(a.index, names[a.index])
                    if spec is not None and spec.kind == "scalar" and spec.ttype is not None \
                            and spec.ttype.dtype is not None:
                        found.append((a.index, t.function, spec, t.location))
    indices = frozenset(s.index for s in slots if s.used)
    seen, kept = set(), []
    for index, fn, spec, loc in found:  # one check per parameter a value reaches
        if (index, id(fn), spec.name) not in seen:
            seen.add((index, id(fn), spec.name))
            kept.append((index, fn, spec, loc))
    return Finished(indices, kept)


def check_values(done: Finished, values: list) -> None:
    """Check a dispatch's scalar values against the per-device parameters a plan made for other values gives them
    to (the checks planning made for the first value)."""
    for index, fn, spec, loc in done.checks:
        where = checks.LazyText(lambda fn=fn, spec=spec, loc=loc: f"{checks.param_where(fn, spec)}, called at {loc}")
        checks.scalar_argument(fn, spec, values[index], where)


def exact(v) -> object:
    """A key that tells scalar values apart exactly: an int by value, a float by its bits (``-0.0`` is not ``0.0``,
    a NaN matches itself)."""
    return struct.pack("<d", v) if type(v) is float else v


class PlanCache:
    """Plans by argument signature (tensor shapes and dtypes, the kind of each scalar), then by the exact values of
    the scalars the host used; at most ``limit`` plans, the least recently used dropped first."""

    def __init__(self, limit: int = PLANS_KEPT):
        self.limit = limit
        self._by_key: OrderedDict = OrderedDict()  # signature -> [used indices, OrderedDict(values -> item)]
        self._count = 0

    def get(self, key, values: list):
        """The cached item for a dispatch of signature ``key`` with these ``values``, or None."""
        entry = self._by_key.get(key)
        if entry is None:
            return None
        self._by_key.move_to_end(key)
        used, items = entry
        sub = tuple(exact(values[i]) for i in used)
        item = items.get(sub)
        if item is not None:
            items.move_to_end(sub)
        return item

    def put(self, key, values: list, used: frozenset, item) -> None:
        """Keep ``item``, planned for ``values``, whose plan depends on the scalars at ``used``."""
        entry = self._by_key.get(key)
        if entry is None:
            entry = self._by_key[key] = [tuple(sorted(used)), OrderedDict()]
        elif not used <= set(entry[0]):
            # The host used a scalar it had not before (a branch taken for this value): every plan of this
            # signature is keyed by all of them from now on; the ones keyed by fewer go.
            self._count -= len(entry[1])
            entry[0], entry[1] = tuple(sorted(used | set(entry[0]))), OrderedDict()
        self._by_key.move_to_end(key)
        sub = tuple(exact(values[i]) for i in entry[0])
        if sub not in entry[1]:
            self._count += 1
        entry[1][sub] = item
        while self._count > self.limit:
            oldest_key, (_, items) = next(iter(self._by_key.items()))
            items.popitem(last=False)
            self._count -= 1
            if not items:
                del self._by_key[oldest_key]

    def items(self) -> list:
        """Every cached item, least recently used first."""
        return [item for _, items in self._by_key.values() for item in items.values()]

    def clear(self) -> None:
        self._by_key.clear()
        self._count = 0

    def __len__(self) -> int:
        return self._count
