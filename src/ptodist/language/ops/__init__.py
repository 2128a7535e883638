"""The op catalog: one module per family, one registry, three ways in (``pl.tile``, ``pl.tensor``, ``pl.*``).

Importing this package registers every family; :func:`namespaces` builds the ``pl.tile``, ``pl.tensor``,
``pl.array`` and ``pl.system`` namespaces and the ``pl.*`` names from :data:`registry.REGISTRY`.
"""

from __future__ import annotations

import sys
import types

from . import (  # noqa: F401  (each registers its ops)
    bitwise,
    comm,
    compare,
    creation,
    elementwise,
    expand,
    gather,
    layout,
    linalg,
    movement,
    pipes,
    reduce,
    sort,
    sync,
)
from .registry import REGISTRY, dispatcher, lift

_NAMESPACE_DOCS = {
    "tile": "``pl.tile``: operations on tiles (on-chip buffers you placed).",
    "tensor": "``pl.tensor``: operations on whole tensors; each result is a fresh tensor.",
    "array": "``pl.array``: small on-core arrays.",
    "system": "``pl.system``: cross-core transfer, pipes and block identity.",
}


def namespaces(package: str) -> tuple[dict[str, types.ModuleType], dict]:
    """``({"tile": module, "tensor": ..., "array": ..., "system": ...}, {top-level name: callable})``.

    The namespaces are real modules (``import <package>.tile`` works too).
    """
    spaces = {}
    for name, doc in _NAMESPACE_DOCS.items():
        mod = sys.modules.get(f"{package}.{name}") or types.ModuleType(f"{package}.{name}", doc)
        sys.modules[mod.__name__] = mod
        spaces[name] = mod
    top: dict = {}
    for d in REGISTRY.values():
        space, _, short = d.name.rpartition(".")
        if space:  # pl.array.create & co.: only in their namespace
            setattr(spaces[space], short, d.fn)
            continue
        tile_fn = d.fn if "tile" in d.levels else None
        tensor_fn = (lift(d) if "tile" in d.levels else d.fn) if "tensor" in d.levels else None
        if tile_fn is not None:
            setattr(spaces["tile"], d.name, tile_fn)
        if tensor_fn is not None:
            setattr(spaces["tensor"], d.name, tensor_fn)
        if d.reach == "system":
            setattr(spaces["system"], d.name, d.fn)
        if d.reach in ("pl", "pl(t)", "system") and (tile_fn or tensor_fn) is not None:
            if tile_fn is not None and tensor_fn is not None and d.reach == "pl":
                top[d.name] = dispatcher(d, tile_fn, tensor_fn)
            else:
                top[d.name] = tile_fn or tensor_fn
    for space, extras in _EXTRAS.items():
        for name, value in extras.items():
            setattr(spaces[space], name, value)
    return spaces, top


# Names in a namespace that are not ops: the classes their arguments and results are made of.
_EXTRAS = {
    "tile": {"MaskPattern": gather.MaskPattern, "MemRefType": creation.MemRefType},
    "system": {"PipeType": sync.PipeType},
}
