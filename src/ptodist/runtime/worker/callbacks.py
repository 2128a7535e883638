"""Sub-worker callbacks: how a callback is called, and the arguments object PyPTO's form passes.

PyPTO calls a sub-worker callback as ``fn(args)``: one positional argument, an object whose
``tensor(i)`` / ``scalar(i)`` give the call's i-th tensor / scalar argument.  ptodist does the same
for every callback that accepts one positional argument, and keeps its own positional form,
``fn(*args)`` (the call's arguments in parameter order), for a callback that cannot take one
argument but takes exactly the sub-worker's parameters.

A callback runs in the thread that drives the worker's queue, between two commands of its dispatch
(:func:`run_callback`); :func:`in_callback` tells that thread's other calls they are inside one.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np

from ...compiler.plan import HostTensorRef
from ...errors import DispatchIndexError, DispatchTypeError
from ...language.scalar import Scalar
from .handles import DeviceTensor, StackedDeviceTensor

MAPPED = "mapped"
POSITIONAL = "positional"

_tls = threading.local()


def in_callback():
    """The dispatch whose sub-worker callback this thread is running, or None."""
    return getattr(_tls, "callback", None)


def _is_tensor(value) -> bool:
    if isinstance(value, (np.ndarray, DeviceTensor, StackedDeviceTensor)):
        return True
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


class MappedArgs:
    """The arguments of one sub-worker call, as a callback taking one parameter gets them.

    ``tensor(i)`` is the i-th tensor argument (the caller's own host tensor, indexed as in the
    call, or the resident tensor itself), ``scalar(i)`` the i-th scalar (a Python value), counted
    separately in parameter order; ``tensor_count()`` / ``scalar_count()`` say how many.  ptodist
    also offers ``args[i]`` / ``args["name"]`` (every argument in parameter order, or by parameter
    name), ``len(args)``, iteration, ``names`` and ``function`` (the sub-worker's name).
    """

    __slots__ = ("function", "names", "_values", "_tensors", "_scalars")

    def __init__(self, function: str, names: list[str], values: list, is_tensor: list[bool]):
        self.function = function
        self.names = tuple(names)
        self._values = tuple(values)
        self._tensors = [i for i, t in enumerate(is_tensor) if t]
        self._scalars = [i for i, t in enumerate(is_tensor) if not t]

    def tensor(self, i: int):
        """The i-th tensor argument of the call (0-based, tensors counted apart from scalars)."""
        return self._values[self._pick(i, self._tensors, "tensor", "scalar")]

    def scalar(self, i: int):
        """The i-th scalar argument of the call (0-based, scalars counted apart from tensors)."""
        return self._values[self._pick(i, self._scalars, "scalar", "tensor")]

    def tensor_count(self) -> int:
        return len(self._tensors)

    def scalar_count(self) -> int:
        return len(self._scalars)

    def _pick(self, i, positions: list[int], what: str, other: str) -> int:
        try:
            k = i.__index__()
        except (AttributeError, TypeError):
            raise DispatchTypeError(f"MappedArgs.{what}({i!r}): the index must be an int, counting the "
                                    f"{what} arguments of sub-worker '{self.function}' from 0") from None
        if not 0 <= k < len(positions):
            have = ", ".join(self.names[p] for p in positions) or "none"
            raise DispatchIndexError(
                f"MappedArgs.{what}({k}): sub-worker '{self.function}' was called with {len(positions)} {what} "
                f"argument(s) ({have}), so {what}(i) takes 0 <= i < {len(positions)}. Tensors and scalars are "
                f"counted separately: read the others with args.{other}(i), or all in parameter order with "
                "args[i].")
        return positions[k]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self):
        return iter(self._values)

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self.names:
                raise KeyError(f"MappedArgs['{key}']: sub-worker '{self.function}' has no parameter '{key}'; its "
                               f"parameters are {', '.join(self.names) or 'none'}")
            return self._values[self.names.index(key)]
        try:
            return self._values[key]
        except IndexError:
            raise DispatchIndexError(f"MappedArgs[{key}]: sub-worker '{self.function}' has {len(self._values)} "
                                     "argument(s)") from None

    def __repr__(self) -> str:
        return f"<MappedArgs of '{self.function}' ({', '.join(self.names)})>"


def calling_form(fn, n_params: int) -> str | None:
    """How ``fn`` is called: MAPPED (``fn(args)``), POSITIONAL (``fn(*values)``), or None (neither fits).

    PyPTO's rule comes first: a callback that accepts one positional argument gets the
    :class:`MappedArgs`; so does one whose signature cannot be read (a builtin).
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return MAPPED
    try:
        sig.bind(object())
        return MAPPED
    except TypeError:
        pass
    try:
        sig.bind(*([object()] * n_params))
        return POSITIONAL
    except TypeError:
        return None


def arity_error(name: str, where: str, fn, params: list[str], call: str) -> DispatchTypeError:
    try:
        sig = str(inspect.signature(fn))
    except (TypeError, ValueError):
        sig = "(?)"
    listed = ", ".join(params)
    return DispatchTypeError(
        f"{call}: callback for SubWorker '{name}' ({where}) must accept a single positional argument "
        f"fn(args: MappedArgs); got signature {sig}. PyPTO calls it with one object (args.tensor(i), "
        f"args.scalar(i)); ptodist also calls fn({listed}) with the sub-worker's {len(params)} argument(s) when "
        "fn cannot take one. Change the callback's parameters to one of these forms.")


def call_callback(fn, function: str, names: list[str], values: list, is_tensor: list[bool]):
    """Call a bound callback in the form its signature selects."""
    form = calling_form(fn, len(values))
    if form == POSITIONAL:
        return fn(*values)
    return fn(MappedArgs(function, names, values, is_tensor))


def is_tensor_value(value) -> bool:
    return _is_tensor(value)


def run_callback(d, call, callbacks: dict) -> BaseException | None:
    """Run sub-worker call ``call`` of dispatch ``d`` (its bound callback, or the function's own body).

    Returns what it raised, noted with the call and the dispatch; None when it returned.
    """
    error = None
    _tls.callback = d
    try:
        fn = callbacks.get(call.function.name)
        args = [_callback_arg(d, a) for a in call.args]
        if fn is not None:
            names = [p.name for p in call.function.params]
            tensors = [isinstance(a, HostTensorRef) or is_tensor_value(v) for a, v in zip(call.args, args)]
            call_callback(fn, call.function.name, names, args, tensors)
        else:
            call.function.invoke(*args)
    except BaseException as e:  # noqa: BLE001 - the dispatch fails with the callback's error
        e.add_note(f"raised by sub-worker callback '{call.function.name}' (called at {call.location}) in "
                   f"dispatch {d.handle.number} of '{d.compiled.name}'")
        error = e
    finally:
        _tls.callback = None
    return error


def _callback_arg(d, a):
    if isinstance(a, HostTensorRef):
        value = d.args[a.tensor.index].value
        if isinstance(value, StackedDeviceTensor):
            return value[a.index[0]] if a.index else value
        return value[a.index] if a.index else value
    if isinstance(a, Scalar):
        return a.value
    return a
