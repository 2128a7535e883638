"""Parameter annotations: ``pl.Tensor[...]``, ``pl.Out``/``pl.InOut``, ``pl.Scalar[...]``, ``pl.dynamic``.

An annotation becomes a :class:`ParamSpec`, which the compiler checks against
the values a function is given (kind, dtype, shape with dynamic binding).
"""

from __future__ import annotations

import abc
import inspect
import threading
from dataclasses import dataclass
from enum import Enum

from ..errors import DeclarationError, ProgramValueError, ShapeError
from ..source import user_location
from .dtypes import DataType
from .scalar import Scalar

_PREC = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


def _c_floordiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("integer division by zero in a pl.dynamic expression")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": _c_floordiv,
        "%": lambda a, b: a - b * _c_floordiv(a, b)}


def _operand(x):
    """An int, an integer Scalar (as its int) or a dim; None for anything else."""
    if isinstance(x, _Dim):
        return x
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, Scalar) and not x.dtype.is_float:
        return x.value
    return None


class _Dim(abc.ABC):
    """What a ``pl.dynamic`` dimension and arithmetic on it have in common.

    Arithmetic (``+ - * // %`` with ints and other dims) builds a :class:`DynExpr`; using one where Python
    wants an int (``__index__``: ``pl.range(NR)``, a window's shape, a byte count) evaluates it with the
    values bound from the argument shapes of the functions running now (see :func:`value_of`).
    """

    __slots__ = ()

    def _make(self, op, other, reverse=False):
        o = _operand(other)
        if o is None:
            return NotImplemented
        return DynExpr(op, o, self) if reverse else DynExpr(op, self, o)

    def __add__(self, o):
        return self._make("+", o)

    def __radd__(self, o):
        return self._make("+", o, True)

    def __sub__(self, o):
        return self._make("-", o)

    def __rsub__(self, o):
        return self._make("-", o, True)

    def __mul__(self, o):
        return self._make("*", o)

    def __rmul__(self, o):
        return self._make("*", o, True)

    def __floordiv__(self, o):
        return self._make("//", o)

    def __rfloordiv__(self, o):
        return self._make("//", o, True)

    def __mod__(self, o):
        return self._make("%", o)

    def __rmod__(self, o):
        return self._make("%", o, True)

    def __index__(self) -> int:
        return value_of(self)

    def __int__(self) -> int:
        return value_of(self)

    @abc.abstractmethod
    def names(self) -> list[str]:
        """The dynamic names the dimension is made of."""

    @abc.abstractmethod
    def evaluate(self, env: dict) -> int:
        """The value with ``env`` (name -> int); KeyError(name) for a name ``env`` lacks."""


class DynDim(_Dim):
    """A named dimension bound at dispatch from the actual shapes (``pl.dynamic("NR")``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise DeclarationError(f"pl.dynamic() needs a non-empty name string, got {name!r}")
        self.name = name

    def __repr__(self) -> str:
        return f"pl.dynamic({self.name!r})"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self):
        return (DynDim, (self.name,))

    def names(self) -> list[str]:
        return [self.name]

    def evaluate(self, env: dict) -> int:
        return env[self.name]


class DynExpr(_Dim):
    """Arithmetic on ``pl.dynamic`` dimensions (``NR * SIZE``, ``M * 2``): evaluated once they are bound."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a, b):
        self.op, self.a, self.b = op, a, b

    def __reduce__(self):
        return (DynExpr, (self.op, self.a, self.b))

    def names(self) -> list[str]:
        out: list[str] = []
        for x in (self.a, self.b):
            if isinstance(x, _Dim):
                out += [n for n in x.names() if n not in out]
        return out

    def evaluate(self, env: dict) -> int:
        a = self.a.evaluate(env) if isinstance(self.a, _Dim) else self.a
        b = self.b.evaluate(env) if isinstance(self.b, _Dim) else self.b
        return _OPS[self.op](a, b)

    def _side(self, x, right: bool) -> str:
        if isinstance(x, DynExpr) and (_PREC[x.op] < _PREC[self.op] or
                                       (right and _PREC[x.op] == _PREC[self.op] and self.op not in "+*")):
            return f"({x})"
        return str(x)

    def __str__(self) -> str:
        return f"{self._side(self.a, False)} {self.op} {self._side(self.b, True)}"

    def __repr__(self) -> str:
        return f"<pl.dynamic expression {self}>"


def dynamic(name: str) -> DynDim:
    """Return a named dynamic dimension for annotations."""
    return DynDim(name)


# Upstream's names: pl.DynVar is the type pl.dynamic returns; pl.IntLike what an integer argument may be
# (an int, an integer Scalar, or a dynamic dimension or arithmetic on one).
DynVar = DynDim
IntLike = int | Scalar | _Dim


def solve(dim: _Dim, actual: int, env: dict):
    """Match a declared dim against an actual size with the names bound in ``env`` (name -> int).

    Returns ``("ok",)`` (it agrees), ``("bound", name, value)`` (it gives one name its value),
    ``("mismatch", expected)``, or ``("open", names)``: the names it still needs (several unbound, or one
    that this size does not determine, e.g. ``M // 2``).
    """
    missing = [n for n in dim.names() if n not in env]
    if not missing:
        try:
            value = dim.evaluate(env)
        except ZeroDivisionError:
            return ("open", dim.names())
        return ("ok",) if value == actual else ("mismatch", value)
    if len(missing) > 1:
        return ("open", missing)
    name = missing[0]
    if isinstance(dim, DynDim):
        return ("bound", name, actual)
    try:  # one unknown: solve it when the expression is affine in it (M * 2, NR * 16 + 4, ...)
        f0, f1, f2 = (dim.evaluate({**env, name: v}) for v in (0, 1, 2))
    except ZeroDivisionError:
        return ("open", missing)
    slope = f1 - f0
    if slope == 0 or f2 - f1 != slope or (actual - f0) % slope:
        return ("open", missing)  # not determined here: another argument may bind the name
    value = (actual - f0) // slope
    try:
        if dim.evaluate({**env, name: value}) != actual:
            return ("open", missing)
    except ZeroDivisionError:
        return ("open", missing)
    return ("bound", name, value)


def bind_values(pairs: list, env: dict) -> list:
    """Bind names from ``(declared dim, actual size)`` pairs into ``env``, solving expressions as names become
    known; mismatches are ignored (the checks report them).  Returns the pairs left open."""
    todo = list(pairs)
    progress = True
    while todo and progress:
        progress = False
        left = []
        for d, a in todo:
            r = solve(d, a, env)
            if r[0] == "bound":
                env[r[1]] = r[2]
                progress = True
            elif r[0] == "open":
                left.append((d, a))
        todo = left
    return todo


# -- the values of pl.dynamic names while a function runs --------------------------------------
# Every program function pushes a frame (the function and its arguments) while it runs; a dim used where
# Python wants an int takes its names' values from the argument shapes of the running functions, the
# innermost first.  The bindings are computed only when a dim is evaluated.

_scopes = threading.local()


def push_scope(fn, args, kwargs) -> list:
    st = getattr(_scopes, "stack", None)
    if st is None:
        st = _scopes.stack = []
    frame = [fn, args, kwargs, None]
    st.append(frame)
    return st


def _frame_env(frame) -> dict:
    if frame[3] is None:
        fn, args, kwargs = frame[0], frame[1], frame[2]
        env: dict = {}
        try:
            params = fn.params
            values = fn.bind_arguments(args, kwargs) if kwargs else list(args)
        except Exception:  # noqa: BLE001 - a function whose signature cannot be read binds nothing
            params, values = [], []
        pairs = []
        for p, v in zip(params, values):
            shape = getattr(v, "shape", None)
            tt = p.ttype
            if isinstance(tt, TensorType) and tt.shape is not None and shape is not None and \
                    len(tt.shape) == len(shape):
                pairs += [(d, int(a)) for d, a in zip(tt.shape, shape) if isinstance(d, _Dim)]
        bind_values(pairs, env)
        frame[3] = env
    return frame[3]


def value_of(dim: _Dim) -> int:
    """The value of a dim for the functions running now; ShapeError naming a name nothing binds."""
    st = getattr(_scopes, "stack", None) or []
    env: dict = {}
    for frame in st:  # outermost first: inner functions' bindings win
        env.update(_frame_env(frame))
    try:
        return dim.evaluate(env)
    except KeyError:
        pass
    from ..source import user_location

    missing = [n for n in dim.names() if n not in env]
    loc = user_location(3)
    what = f"pl.dynamic('{missing[0]}')" if len(missing) == 1 else \
        "pl.dynamic names " + ", ".join(f"'{n}'" for n in missing)
    used = "" if isinstance(dim, DynDim) else f" (in {dim})"
    if not st:
        raise ShapeError(f"{what}{used} used at {loc} has no value: outside a program function nothing binds it. "
                         "A pl.dynamic dimension takes its value from the argument shapes of the program function "
                         "whose annotations use it; use it inside that function.")
    fn = st[-1][0]
    callers = [f[0] for f in st[:-1]]
    scope = f"{fn.kind.value} '{fn.name}' ({fn.location})"
    if callers:
        scope += " or of the functions that called it (" + ", ".join(f"'{f.name}'" for f in callers) + ")"
    name = missing[0]
    raise ShapeError(
        f"{what}{used} used at {loc} cannot be bound: no tensor parameter of {scope} has "
        f"{'it' if len(missing) == 1 else 'them'} in its annotation, so no argument's shape gives "
        f"{'it' if len(missing) == 1 else 'them'} a value. Annotate a tensor parameter of {fn.name}() with "
        f"{name} (e.g. pl.Tensor[[{name}, ...], ...]), or pass the size as a pl.Scalar parameter.")


def unit_dims_reshape(declared: tuple, actual: tuple) -> tuple | None:
    """The shape ``actual`` takes under ``declared`` when they differ only by dimensions of size 1, else None.

    ``[SIZE]`` under ``[1, SIZE]`` is ``(1, SIZE)``; ``[1, SIZE]`` under ``[SIZE]`` is ``(SIZE,)``. A dynamic
    dimension of ``declared`` (``pl.dynamic``, or arithmetic on it) takes the matching size of ``actual``; it never
    stands for an inserted or dropped 1.
    """
    fixed = [None if isinstance(d, (DynDim, DynExpr)) else d.__index__() for d in declared]
    core = [a for a in actual if a != 1]
    slots = [i for i, d in enumerate(fixed) if d != 1]
    if len(core) != len(slots):
        return None
    shape = [1] * len(declared)
    for i, a in zip(slots, core):
        if fixed[i] is not None and fixed[i] != a:
            return None
        shape[i] = a
    return tuple(shape)


Dim = "int | DynDim"


class TensorLayout(Enum):
    """``pl.TensorLayout``: how a tensor's elements lie in memory (``pl.ND``, ``pl.DN``, ``pl.NZ``, ...)."""

    ND = "ND"  # row-major, the default
    DN = "DN"  # column-major: what a transposed view is
    NZ = "NZ"  # the cube's fractal tile layout (tiles only)
    MX_A_ZZ = "MX_A_ZZ"  # the GM scale tensor of an MX matmul's left operand
    MX_B_NN = "MX_B_NN"  # ... and of its right operand

    def __repr__(self) -> str:
        return f"pl.{self.name}"


class TileLayout(Enum):
    """``pl.TileLayout``: a tile's block (``blayout=``) and scatter (``slayout=``) layout in on-chip memory."""

    none_box = "none_box"
    row_major = "row_major"
    col_major = "col_major"

    def __repr__(self) -> str:
        return f"pl.TileLayout.{self.name}"


class CompactMode(Enum):
    """``pl.CompactMode``: ``normal`` marks a partly valid boxed tile sent in the packed transfer format."""

    null = "null"
    normal = "normal"

    def __repr__(self) -> str:
        return f"pl.CompactMode.{self.name}"


class ManualDep:
    """Marker ``pl.Tensor[[...], dtype, pl.ManualDep]``: a task leaves this argument out of its automatic
    dependencies (it neither waits for the unfinished tasks that touch it nor makes later ones wait); order it
    with ``deps=`` or by the kernel's own design."""


@dataclass(frozen=True)
class TensorType:
    """The type in ``pl.Tensor[[d0, ...], dtype]`` or ``pld.DistributedTensor[...]`` (optionally a layout)."""

    shape: tuple | None
    dtype: DataType | None
    distributed: bool
    # Recorded, not emulated: element values never depend on it (ND, and the MX scale markers, are
    # row-major data as the host passes it; DN and NZ are refused in annotations, as upstream does).
    layout: TensorLayout = TensorLayout.ND
    manual_dep: bool = False  # pl.ManualDep among the annotation's markers
    view: TensorView | None = None  # a pl.TensorView among them (recorded; its layout is ``layout``)

    @property
    def type_name(self) -> str:
        base = "pld.DistributedTensor" if self.distributed else "pl.Tensor"
        if self.shape is None:
            return base
        dims = ", ".join(str(d) for d in self.shape)
        marker = f", {self.view!r}" if self.view is not None else \
            "" if self.layout is TensorLayout.ND else f", {self.layout!r}"
        return f"{base}[[{dims}], {self.dtype!r}{marker}]"


def _view_text(name: str, fields: dict, defaults: dict) -> str:
    given = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v!r}" for k, v in fields.items() if v != defaults[k])
    return f"pl.{name}({given})"


@dataclass(frozen=True)
class TensorView:
    """``pl.TensorView``: a tensor's strides, layout, valid shape and pad, stated in its annotation.

    Recorded, not emulated: a host tensor is read through its own strides (numpy's or torch's), so the
    annotation describes it and changes no value.
    """

    stride: tuple = ()
    layout: TensorLayout | None = None
    valid_shape: tuple = ()
    pad: object = None

    def __post_init__(self):
        object.__setattr__(self, "stride", tuple(self.stride or ()))
        object.__setattr__(self, "valid_shape", tuple(self.valid_shape or ()))
        if self.layout is None and (self.stride or self.valid_shape or self.pad is not None):
            raise ProgramValueError(f"{self!r} at {user_location(3)}: layout= is required when stride, valid_shape "
                                    f"or pad is given; add layout=pl.TensorLayout.ND for a row-major tensor")
        if self.layout is not None and not isinstance(self.layout, TensorLayout):
            raise DeclarationError(f"{self!r} at {user_location(3)}: layout= takes a pl.TensorLayout such as "
                                   f"pl.TensorLayout.ND, got {self.layout!r}")

    def __repr__(self) -> str:
        return _view_text("TensorView", vars(self), _TENSOR_VIEW_DEFAULTS)


_TENSOR_VIEW_DEFAULTS = {"stride": (), "layout": None, "valid_shape": (), "pad": None}


@dataclass(frozen=True)
class TileView:
    """``pl.TileView``: a tile's valid shape, strides and on-chip layouts, stated in its annotation (recorded)."""

    valid_shape: tuple = ()
    stride: tuple = ()
    start_offset: object = None
    blayout: TileLayout = TileLayout.row_major
    slayout: TileLayout = TileLayout.none_box
    fractal: int = 512
    pad: object = None
    compact: CompactMode = CompactMode.null

    def __post_init__(self):
        object.__setattr__(self, "valid_shape", tuple(self.valid_shape or ()))
        object.__setattr__(self, "stride", tuple(self.stride or ()))

    def __repr__(self) -> str:
        return _view_text("TileView", vars(self), _TILE_VIEW_DEFAULTS)


_TILE_VIEW_DEFAULTS = {"valid_shape": (), "stride": (), "start_offset": None, "blayout": TileLayout.row_major,
                       "slayout": TileLayout.none_box, "fractal": 512, "pad": None, "compact": CompactMode.null}


def _layout_of(extra: tuple, name: str, shape, dtype) -> TensorLayout:
    """The layout among an annotation's items after ``[shape, dtype]`` (other items change nothing)."""
    for item in extra:
        if isinstance(item, TensorView) and item.layout is not None:
            return item.layout  # a view states its strides, so any layout (DN too) describes real memory
        if item is TensorLayout.DN:
            raise DeclarationError(
                f"{name}[{list(shape)!r}, {dtype!r}, pl.DN] at {user_location(2)}: a tensor annotation takes no DN "
                f"marker (PyPTO refuses this shorthand too); annotate the source shape with no marker and "
                f"transpose where it is used, with pl.transpose(x, -2, -1) or pl.matmul(..., b_trans=True)")
        if item is TensorLayout.NZ:
            raise DeclarationError(
                f"{name}[{list(shape)!r}, {dtype!r}, pl.NZ] at {user_location(2)}: NZ is a tile layout, never a "
                f"tensor's; annotate the tensor with no marker (pl.ND, row-major, is the default)")
        if isinstance(item, TensorLayout):
            return item
    return TensorLayout.ND


@dataclass(frozen=True)
class ScalarType:
    dtype: DataType | None

    @property
    def type_name(self) -> str:
        return f"pl.Scalar[{self.dtype!r}]" if self.dtype else "pl.Scalar"


class Direction(str, Enum):
    IN = "in"
    OUT = "out"
    INOUT = "inout"


@dataclass(frozen=True)
class Directed:
    direction: Direction
    inner: TensorType


def _tensor_type(item, distributed: bool) -> TensorType:
    if not isinstance(item, tuple) or len(item) < 2:
        name = "pld.DistributedTensor" if distributed else "pl.Tensor"
        raise DeclarationError(f"{name}[...] takes [shape, dtype] (and optionally a layout), got {item!r}")
    shape, dtype = item[0], item[1]
    if not isinstance(dtype, DataType):
        raise DeclarationError(f"the dtype in a tensor annotation must be a pl dtype such as pl.FP32, got {dtype!r}")
    try:
        shape = list(shape)
    except TypeError:  # a scalar or None where the dimensions go
        name = "pld.DistributedTensor" if distributed else "pl.Tensor"
        raise DeclarationError(f"{name}[shape, dtype]: the shape must be a list of dimensions, got {shape!r}; "
                               f"write {name}[[d0, d1, ...], dtype] with each dimension an int or "
                               "pl.dynamic(...)") from None
    dims = []
    for d in shape:
        if isinstance(d, _Dim):
            dims.append(d)
        else:
            try:
                dims.append(int(d.__index__()) if not isinstance(d, int) else d)
            except (AttributeError, TypeError):
                raise DeclarationError(f"a tensor dimension must be an int or pl.dynamic(...), got {d!r}") from None
    name = "pld.DistributedTensor" if distributed else "pl.Tensor"
    return TensorType(tuple(dims), dtype, distributed, _layout_of(item[2:], name, shape, dtype),
                      any(x is ManualDep for x in item[2:]),
                      next((x for x in item[2:] if isinstance(x, TensorView)), None))


class TensorValue:
    """A tensor as a rank holds it (``.shape``, ``.dtype``), as the compiler's checks see an argument.

    The rank side's tensors derive from it (a window's from :class:`WindowValue`), so the checks, below the rank
    side, tell a tensor from a window and from a scalar without importing it.
    """

    __slots__ = ()


class WindowValue(TensorValue):
    """A window-bound tensor (``pld.DistributedTensor``) as a rank holds it."""

    __slots__ = ()


class Tensor:
    """Annotation ``pl.Tensor[[d0, d1, ...], dtype]``: an input tensor."""

    def __class_getitem__(cls, item) -> TensorType:
        return _tensor_type(item, distributed=False)


class DistributedTensor:
    """Annotation ``pld.DistributedTensor[[...], dtype]``: a window-bound tensor."""

    def __class_getitem__(cls, item) -> TensorType:
        return _tensor_type(item, distributed=True)


def _directed(item, direction: Direction) -> Directed:
    if item is Tensor:
        item = TensorType(None, None, False)
    elif item is DistributedTensor:
        item = TensorType(None, None, True)
    if not isinstance(item, TensorType):
        name = direction.name.title().replace("Inout", "InOut")
        raise DeclarationError(f"pl.{name}[...] wraps a tensor annotation, got {item!r}")
    return Directed(direction, item)


class Out:
    """Annotation ``pl.Out[T]``: the parameter is written."""

    def __class_getitem__(cls, item) -> Directed:
        return _directed(item, Direction.OUT)


class InOut:
    """Annotation ``pl.InOut[T]``: the parameter is read and written."""

    def __class_getitem__(cls, item) -> Directed:
        return _directed(item, Direction.INOUT)


def _scalar_class_getitem(cls, dtype) -> ScalarType:
    if not isinstance(dtype, DataType):
        raise DeclarationError(f"pl.Scalar[...] takes a pl dtype such as pl.INT32, got {dtype!r}")
    return ScalarType(dtype)


Scalar.__class_getitem__ = classmethod(_scalar_class_getitem)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its name, kind (``tensor``/``scalar``/``any``), direction and type."""

    name: str
    kind: str
    direction: Direction
    ttype: TensorType | ScalarType | None

    @property
    def type_name(self) -> str:
        if self.ttype is None:
            return "unannotated"
        name = self.ttype.type_name
        if self.direction is Direction.OUT:
            return f"pl.Out[{name}]"
        if self.direction is Direction.INOUT:
            return f"pl.InOut[{name}]"
        return name


def spec_from_annotation(name: str, ann) -> ParamSpec:
    """Turn one evaluated annotation into a ParamSpec."""
    if ann is inspect.Parameter.empty or ann is None:
        return ParamSpec(name, "any", Direction.IN, None)
    if ann is Tensor:
        ann = TensorType(None, None, False)
    elif ann is DistributedTensor:
        ann = TensorType(None, None, True)
    elif ann is Scalar:
        ann = ScalarType(None)
    if isinstance(ann, Directed):
        return ParamSpec(name, "tensor", ann.direction, ann.inner)
    if isinstance(ann, TensorType):
        return ParamSpec(name, "tensor", Direction.IN, ann)
    if isinstance(ann, ScalarType):
        return ParamSpec(name, "scalar", Direction.IN, ann)
    if ann in (int, float, bool):
        return ParamSpec(name, "scalar", Direction.IN, None)
    return ParamSpec(name, "any", Direction.IN, None)
