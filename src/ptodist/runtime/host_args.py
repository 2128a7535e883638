"""A call's host arguments bound to a program's parameters: ``HostArguments``, the part of ``CompiledProgram``
that binds them (tensors adapted and checked against the annotations, scalars fitted to their dtype, outputs
created in the inputs-only form) and keys plans by them; ``HostTensor``, a host tensor argument as numpy.
"""

from __future__ import annotations

import numpy as np

from ..compiler import checks
from ..compiler.plan import HostTensorSpec
from ..errors import DispatchTypeError, DispatchValueError, ShapeError, classified
from ..language import dtypes as dt
from ..language.functions import EntryFunction
from ..language.scalar import Scalar, scalar_value
from ..language.types import Direction, DynDim, DynExpr, ParamSpec, TensorType

# What a dtype ptodist lacks is best converted to: its numpy name -> (pl dtype, torch method, numpy dtype).
_CONVERT = {"float64": ("FP32", "float()", "float32")}


def _unbound(message: str) -> ShapeError:
    """An output whose shape no input binds: a shape error, but not the shape mismatch of SPEC §8."""
    e = ShapeError(message)
    e.pitfall = None
    return e


def unsupported_dtype(name: str, dtype, is_torch: bool) -> DispatchTypeError:
    """The error for host tensor ``name`` of a dtype ptodist lacks: what it got, what it takes, how to convert."""
    got = str(dtype)
    if is_torch:
        supported = [f"torch.{n}" for n in dt._TORCH_NAMES]
        kind = "torch dtype"
    else:
        supported = list(dict.fromkeys(d.np_dtype.name for d in dt.ALL))
        kind = "numpy dtype"
    target = _CONVERT.get(got.removeprefix("torch."))
    if target is None:
        fix = f"Convert it first to a supported dtype, e.g. {name}." + \
              ("to(torch.float32)" if is_torch else "astype(np.float32)") + "."
    else:
        pl_name, method, np_name = target
        fix = f"Convert it first: {name}.{method if is_torch else f'astype(np.{np_name})'} " \
              f"({got.removeprefix('torch.')} -> {pl_name}"
        fix += f"; the same as {name}.to(torch.{np_name}))." if is_torch else ")."
    return DispatchTypeError(f"host tensor '{name}' has {kind} {got}, which ptodist does not support (it supports "
                             f"{', '.join(supported[:-1])} and {supported[-1]}). {fix}")


def _declared_dtype(param: ParamSpec, given: dt.DataType) -> dt.DataType:
    """The dtype a host tensor has in the ranks: its own, or HF8 / HF4 where the parameter declares one and the
    array holds its bits (uint8: numpy has no such type), so that the ranks never read those bits as numbers."""
    declared = param.ttype.dtype if isinstance(param.ttype, TensorType) else None
    return declared if declared in dt.RAW_BITS and declared.np_dtype == given.np_dtype else given


class HostTensor:
    """A host tensor argument as a numpy array, with what it takes to write results back."""

    def __init__(self, value, name: str):
        self.value = value
        self.is_torch = type(value).__module__.startswith("torch")
        if self.is_torch:
            self.dtype = dt.from_torch(value.dtype)
            if self.dtype is None:
                raise unsupported_dtype(name, value.dtype, True)
            if value.device.type != "cpu":
                raise DispatchTypeError(f"host tensor '{name}' is on {value.device}; pass a CPU tensor")
            t = value.detach()
            self.shared = t.is_contiguous()
            t = t if self.shared else t.contiguous()
            self.array = dt.torch_as_numpy(t, self.dtype)
        elif isinstance(value, np.ndarray):
            self.dtype = dt.from_numpy(value.dtype)
            if self.dtype is None:
                raise unsupported_dtype(name, value.dtype, False)
            self.shared = value.flags.c_contiguous and value.flags.writeable
            self.array = value if self.shared else np.ascontiguousarray(value)
        else:
            from .worker import DeviceTensor, StackedDeviceTensor

            if isinstance(value, (DeviceTensor, StackedDeviceTensor)):
                raise DispatchTypeError(f"parameter '{name}' is a {type(value).__name__}: resident tensors live in "
                                        "the ranks of the DistributedWorker that allocated them. Dispatch through "
                                        "that worker (rt(...) or rt.run(compiled, ...)), or copy the data to a host "
                                        "tensor with rt.copy_from(...).")
            raise DispatchTypeError(f"parameter '{name}' is a tensor parameter; got {type(value).__name__}. "
                                    "Pass a torch tensor or a numpy array.")
        self.shape = tuple(self.array.shape)

    def write_back(self) -> None:
        """Copy results into the caller's tensor when we had to work on a copy."""
        if self.shared:
            return
        if self.is_torch:
            import torch

            src = dt.numpy_as_torch(self.array, self.dtype)
            with torch.no_grad():  # as a contiguous output is written through its memory, whatever its autograd
                self.value.copy_(src)
        else:
            self.value[...] = self.array


def _zeros(shape: list[int], dtype: dt.DataType, like_torch: bool):
    if like_torch:
        import torch

        return torch.zeros(shape, dtype=dt.to_torch(dtype))
    return np.zeros(shape, dtype=dtype.np_dtype)


class HostArguments:
    """How a program takes its host arguments (a mixin of ``CompiledProgram``: reads its ``host``, ``name``,
    ``world``)."""

    def bind(self, args: tuple, adapt=HostTensor, new_output=None) -> tuple[list, list, bool]:
        """Bind ``args`` to the host parameters; tensors become ``adapt(value, name)`` objects.

        ``adapt`` must give ``.dtype`` (a pl dtype), ``.shape``, ``.is_torch`` and ``.value``;
        ``new_output(param, shape, like_torch)`` makes an output in the inputs-only form.
        """
        params = self.host.params
        n_in = sum(1 for p in params if p.direction is not Direction.OUT)
        if len(args) == len(params):
            created = False
        elif len(args) == n_in and n_in < len(params):
            created = True
        else:
            names = ", ".join(p.name for p in params)
            raise DispatchTypeError(
                f"{self.name}: got {len(args)} arguments; pass all {len(params)} ({names}) or the {n_in} inputs "
                "(outputs are then created and returned)")
        it = iter(args)
        values: list = []
        hosts: list[HostTensor | None] = []
        bindings: dict = {}
        pending_out = []
        for i, p in enumerate(params):
            if created and p.direction is Direction.OUT:
                values.append(None)
                hosts.append(None)
                pending_out.append(i)
                continue
            v = next(it)
            if p.kind == "tensor" or (p.kind == "any" and not isinstance(v, (int, float, Scalar, np.generic))):
                h = adapt(v, p.name)
                self._check_host(p, h, bindings)
                if p.direction is not Direction.IN:
                    self._check_writable(p, v)
                values.append(getattr(h, "array", None))
                hosts.append(h)
            else:
                values.append(self._scalar_arg(p, v))
                hosts.append(None)
        if self.host.params and any(p.ttype is not None and getattr(p.ttype, "shape", None) for p in params):
            checks.finish_bindings(bindings)
        like_torch = any(h is not None and h.is_torch for h in hosts)
        for i in pending_out:
            shape = self._output_shape(params[i], bindings)
            value = new_output(params[i], shape, like_torch) if new_output is not None else \
                _zeros(shape, params[i].ttype.dtype, like_torch)
            hosts[i] = adapt(value, params[i].name)
            values[i] = getattr(hosts[i], "array", None)
        return values, hosts, created

    def _scalar_arg(self, p: ParamSpec, v):
        """The exact value scalar parameter ``p`` takes from ``v`` (its dtype's rule), or a DispatchError.

        No upstream rule: a value its dtype cannot hold would be wrapped or truncated on the device (checks.py's
        ``scalar_argument``, docs/errors.md's table of checks)."""
        if type(v) is int and p.ttype is None:  # the usual case: a plain int, no dtype to fit
            return v
        where = checks.LazyText(lambda: checks.param_where(self.host, p))
        dtype = p.ttype.dtype if p.ttype is not None else None
        return scalar_value(v, dtype, where, DispatchTypeError, DispatchValueError)

    def _check_host(self, p: ParamSpec, h: HostTensor, bindings: dict) -> None:
        # Upstream: a parameter's annotation fixes its dtype and shape ("shape mismatch at compile time",
        # 04-debugging.md); pl.dynamic dims bind from the arguments.
        where = checks.LazyText(lambda: checks.param_where(self.host, p))
        if p.ttype is None or p.ttype.shape is None:
            return
        if p.ttype.dtype is not None and h.dtype.np_dtype != p.ttype.dtype.np_dtype:
            raise classified(DispatchTypeError(f"{where}: the host tensor is {h.dtype.name}, the annotation says "
                                               f"{p.ttype.dtype.name}"), kind="type_mismatch",
                             fix=f"Pass a {p.ttype.dtype.name} tensor as '{p.name}' (convert it on the host), or "
                                 f"annotate the parameter pl.{h.dtype.name}.")
        checks.bind_shape(where, p.ttype.shape, tuple(h.shape), bindings, self.world)

    def _check_writable(self, p: ParamSpec, value) -> None:
        """An output (``pl.Out``/``pl.InOut``) must take the results: refuse it now, not after the run.

        No upstream rule: an output that cannot hold the results would leave a silent wrong answer."""
        if isinstance(value, np.ndarray):
            kind, shape, strides = "numpy array", value.shape, value.strides
            if not value.flags.writeable:
                self._refuse_output(p, f"the {kind} is read-only (its flags.writeable is False)",
                                    f"a writable array, e.g. {p.name}.copy()")
        elif type(value).__module__.startswith("torch") and hasattr(value, "stride"):
            kind, shape, strides = "torch tensor", tuple(value.shape), value.stride()
        else:
            return  # resident tensors of a DistributedWorker are written in the ranks
        for dim, (n, stride) in enumerate(zip(shape, strides)):
            if n > 1 and stride == 0:
                self._refuse_output(
                    p, f"the {kind} repeats one element along dimension {dim} (stride 0, as "
                       f"{'expand()' if kind == 'torch tensor' else 'np.lib.stride_tricks.as_strided()'} makes), so its {n} entries "
                       "there share memory and cannot hold different results",
                    f"a tensor with memory of its own, e.g. {p.name}.clone()" if kind == "torch tensor" else
                    f"an array with memory of its own, e.g. {p.name}.copy()")

    def _refuse_output(self, p: ParamSpec, what: str, fix: str) -> None:
        role = "pl.InOut" if p.direction is Direction.INOUT else "pl.Out"
        raise DispatchTypeError(
            f"{checks.param_where(self.host, p)}: {what}, "
            f"but '{p.name}' is an output ({role}) that the run writes its results into. Nothing was run. "
            f"Pass {fix}.")

    def _output_shape(self, p: ParamSpec, bindings: dict) -> list[int]:
        if p.ttype is None or p.ttype.shape is None or p.ttype.dtype is None:
            raise DispatchTypeError(f"{self.name}: cannot create output '{p.name}' without a shape and dtype in its "
                                    "annotation; pass it explicitly")
        shape = []
        env = {k: v[0] for k, v in bindings.items() if isinstance(v, tuple)}
        for d in p.ttype.shape:
            if isinstance(d, (DynDim, DynExpr)):
                missing = [n for n in d.names() if n not in env]
                if missing:
                    names = ", ".join(f"pl.dynamic('{n}')" for n in missing)
                    used = "" if isinstance(d, DynDim) else f" (in its dimension {d})"
                    raise _unbound(f"{self.name}: output '{p.name}' uses {names}{used}, which no input binds; "
                                  "pass the output explicitly (all arguments), or annotate a dimension of an "
                                  f"input with {missing[0]} so its shape binds it (the output is declared at "
                                  f"{checks.param_location(self.host, p.name)})")
                shape.append(d.evaluate(env))
            else:
                shape.append(d)
        return shape

    def host_specs(self, hosts: list) -> list[HostTensorSpec]:
        return [HostTensorSpec(i, p.name, tuple(h.shape), _declared_dtype(p, h.dtype), p.direction,
                               p.ttype.layout.name if isinstance(p.ttype, TensorType) else "ND", self._declared(p))
                for i, (p, h) in enumerate(zip(self.host.params, hosts)) if h is not None]

    def _declared(self, p: ParamSpec) -> str:
        """How a rank's messages name host parameter ``p``: the function the user wrote and the line of ``p``."""
        host = self.host
        what = f"{host.called.kind.value} '{host.name}'" if isinstance(host, EntryFunction) else \
            f"host orchestrator '{host.name}'"
        return f"parameter '{p.name}' of {what} ({checks.param_location(host, p.name)}), declared {p.type_name}"

    @staticmethod
    def plan_key(values: list, hosts: list) -> tuple:
        """What a plan is found by: each tensor's shape and dtype, each scalar's kind (int or float).  The values of
        the scalars the host orchestrator used select among its plans (``compiler.scalars.PlanCache``)."""
        return tuple((tuple(h.shape), h.dtype.name) if h is not None else type(v).__name__
                     for h, v in zip(hosts, values))

    @staticmethod
    def scalar_values(values: list, hosts: list) -> tuple:
        """A dispatch's scalar arguments by host parameter (None for a tensor): what ``ScalarArg``s of its plan take.
        Empty when it has none."""
        out = tuple(v if h is None else None for v, h in zip(values, hosts))
        return out if any(h is None for h in hosts[:len(values)]) else ()
