"""The op catalog's one registry.

Each op is written once, at tile level, as pure numpy over :class:`Tile` s.  The
registry derives the rest from that one definition:

- ``pl.tile.<name>``: the definition, with its dtype rule checked;
- ``pl.tensor.<name>``: the same op on whole tensors: each tensor argument is
  loaded as one tile (through the running context, so the checker and the
  traces see the read), the result is stored into a fresh private tensor;
- ``pl.<name>``: a dispatcher on argument types (tensor arguments select the
  tensor level, tiles the tile level; a Python number on the right selects
  the scalar-operand form), or the tile op itself for the tile-only
  re-exports upstream marks "(t)".

The generated op table in ``docs/language.md`` is read from :data:`REGISTRY`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import TileTypeError
from .. import dtypes as dt
from ..scalar import Scalar
from ..tile_ops import Tile

FLOATS = (dt.FP32, dt.FP16, dt.BF16)
SIGNED_INTS = (dt.INT8, dt.INT16, dt.INT32, dt.INT64)
INTS = (*SIGNED_INTS, dt.UINT8)
NUMERIC = (*FLOATS, *INTS)
ANY = None  # no dtype rule


@dataclass
class OpDef:
    """One catalog op: its tile-level definition and how it is reached."""

    name: str
    family: str
    fn: Callable  # tile level, dtype-checked
    reach: str  # "pl" (dispatcher), "pl(t)" (tile-only re-export), "tile", "tensor", "array", "system"
    dtypes: tuple | None  # element types each Tile argument may have (None: any)
    scalar: str | None = None  # the scalar-operand companion selected by a Python number on the right
    tensor_only: tuple = ()  # keywords meaningful only at tensor level
    tile_only: tuple = ()  # keywords meaningful only at tile level
    tensor_fn: Callable | None = None  # tensor level written by hand (None: lifted from ``fn``)
    scalar_fn: Callable | None = None  # what ``pl.<name>`` does when every operand is a scalar
    levels: tuple = field(default=("tile", "tensor"))

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


REGISTRY: dict[str, OpDef] = {}


def dtype_names(dtypes) -> str:
    return "any" if dtypes is None else ", ".join(d.name for d in dtypes)


def _check_dtypes(name: str, dtypes: tuple, args) -> None:
    for i, a in enumerate(args):
        if isinstance(a, Tile) and a.dtype not in dtypes:
            raise TileTypeError(
                f"pl.tile.{name}: argument {i + 1} is a {a.dtype.name} tile, but {name} takes "
                f"{dtype_names(dtypes)} tiles; convert it first with pl.cast(tile, target_type=pl.<dtype>)")


def op(name: str, *, family: str, reach: str = "pl", dtypes: tuple | None = NUMERIC, scalar: str | None = None,
       tensor_only: tuple = (), tile_only: tuple = (), levels: tuple = ("tile", "tensor"),
       scalar_fn: Callable | None = None):
    """Register the decorated tile-level function as catalog op ``name``; return it dtype-checked."""

    def register(fn: Callable) -> Callable:
        if dtypes is None:
            checked = fn
        else:
            @functools.wraps(fn)
            def checked(*args, **kwargs):
                for a in args:
                    if type(a) is Tile and a.dtype not in dtypes:
                        _check_dtypes(name, dtypes, args)  # raises, naming the argument
                return fn(*args, **kwargs)

        if name in REGISTRY:
            raise AssertionError(f"op {name!r} registered twice")
        REGISTRY[name] = OpDef(name, family, checked, reach, dtypes, scalar, tuple(tensor_only), tuple(tile_only),
                               None, scalar_fn, tuple(levels))
        return checked

    return register


def tensor_impl(name: str):
    """Register the decorated function as the hand-written tensor level of op ``name``."""

    def register(fn: Callable) -> Callable:
        REGISTRY[name].tensor_fn = fn
        return fn

    return register


# -- levels ----------------------------------------------------------------------------------------------
def is_tensor(x) -> bool:
    """A tensor as a rank sees it (a host slice, a private tensor, a window): shaped, typed, not a tile."""
    return hasattr(x, "array") and hasattr(x, "dtype") and not isinstance(x, Tile)


def _any(pred, args) -> bool:
    for a in args:
        if isinstance(a, (list, tuple)):
            if _any(pred, a):
                return True
        elif pred(a):
            return True
    return False


def _whole(x):
    """A tensor argument as one tile (read through the context); anything else as it is."""
    from ..memory_ops import load

    if isinstance(x, (list, tuple)):
        return type(x)(_whole(a) for a in x)
    if is_tensor(x):
        return load(x, [0] * len(x.shape), list(x.shape))
    return x


def _fresh(x):
    """A tile result as a fresh private tensor (written through the context); anything else as it is."""
    from ..memory_ops import create_tensor, store

    if isinstance(x, tuple):
        return tuple(_fresh(a) for a in x)
    if isinstance(x, Tile):
        t = create_tensor(x.shape, x.dtype)
        store(x, [0] * len(x.shape), t)
        return t
    return x


def lift(d: OpDef) -> Callable:
    """The tensor level of ``d``: tensors in, the tile op on their whole contents, fresh tensors out."""
    if d.tensor_fn is not None:
        return d.tensor_fn

    @functools.wraps(d.fn)
    def tensor_level(*args, **kwargs):
        bad = [k for k in kwargs if k in d.tile_only]
        if bad:
            raise TileTypeError(f"pl.tensor.{d.name}: keyword '{bad[0]}' is tile-level only; "
                                f"spell it pl.tile.{d.name}(..., {bad[0]}=...) on tiles")
        return _fresh(d.fn(*_whole(args), **{k: _whole(v) for k, v in kwargs.items()}))

    return tensor_level


def _is_number(x) -> bool:
    return isinstance(x, (int, float, Scalar)) and not isinstance(x, bool)


def dispatcher(d: OpDef, tile_fn: Callable, tensor_fn: Callable) -> Callable:
    """``pl.<name>``: forward to the tensor or the tile level by argument type (upstream adds no semantics)."""

    @functools.wraps(d.fn)
    def unified(*args, **kwargs):
        if not kwargs and len(args) == 2 and type(args[0]) is Tile and type(args[1]) is Tile:
            return tile_fn(*args)  # the common call, decided without walking the arguments
        everything = (*args, *kwargs.values())
        if _any(is_tensor, everything):
            return tensor_fn(*args, **kwargs)
        if _any(lambda a: isinstance(a, Tile), everything):
            bad = [k for k in kwargs if k in d.tensor_only]
            if bad:
                raise TileTypeError(f"pl.{d.name}: keyword '{bad[0]}' is tensor-level only and the operands are "
                                    f"tiles; drop it, or call pl.tensor.{d.name} on tensors")
            if d.scalar and len(args) >= 2 and _is_number(args[1]) and d.scalar in REGISTRY:
                return REGISTRY[d.scalar].fn(*args, **kwargs)
            return tile_fn(*args, **kwargs)
        if d.scalar_fn is not None and args and all(_is_number(a) for a in args):
            return d.scalar_fn(*args, **kwargs)
        kinds = " and ".join(type(a).__name__ for a in args) or "no arguments"
        what = "tensors, tiles or scalars" if d.scalar_fn is not None else "tensors or tiles"
        raise TileTypeError(f"pl.{d.name} takes {what}, got {kinds}: pass tensors (pl.tensor level), tiles "
                            "(pl.tile level; pl.load a region of a tensor into a tile)"
                            + (", or numbers" if d.scalar_fn is not None else ""))

    unified.__name__ = d.name
    return unified
