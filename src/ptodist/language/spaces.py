"""On-chip memory spaces (``pl.MemorySpace``, also ``pl.Mem``) and the rules for moving tiles between them.

The spaces are separate buffers of an AI core.  A load from DDR lands only in ``Vec`` (the default) or
``Mat``; the matmul operand buffers ``Left`` / ``Right``, the ``Bias`` buffer and the MX scale buffers are
filled only by ``pl.move`` from ``Mat``; nothing moves data into ``Acc``: only a cube op writes it.

A tile records where it is (``Tile.space``).  ``None`` means the program never placed it: a plain
``pl.load`` or a vector op's result.  Such a tile counts as ``Vec``, and a cube op takes it as an operand,
because upstream's compiler places it or inserts the moves.  A placed operand is accepted wherever some
chain of moves leads from its space to the one the operand is read from (the compiler inserts them);
explicit loads and moves must each be legal on their own.
"""

from __future__ import annotations

import enum

from ..errors import TileTypeError


class MemorySpace(enum.Enum):
    """Where a tensor or tile lives: ``DDR`` off chip, the rest on the AI core."""

    DDR = 0
    Vec = 1
    Mat = 2
    Left = 3
    Right = 4
    Acc = 5
    Bias = 6
    ScalarLocal = 7
    LeftScale = 8
    RightScale = 9

    def __repr__(self) -> str:
        return f"pl.MemorySpace.{self.name}"


Mem = MemorySpace

# The single-instruction moves some target implements (source -> destinations).  Vec -> Mat exists on A5
# only; it is kept because a program is not tied to one target here.
LEGAL_MOVES: dict[MemorySpace, tuple[MemorySpace, ...]] = {
    MemorySpace.Mat: (MemorySpace.Left, MemorySpace.Right, MemorySpace.Bias, MemorySpace.LeftScale,
                      MemorySpace.RightScale),
    MemorySpace.Vec: (MemorySpace.Vec, MemorySpace.Mat),
    MemorySpace.Acc: (MemorySpace.Mat, MemorySpace.Vec),
}
LOAD_TARGETS = (MemorySpace.Vec, MemorySpace.Mat)

# The space each cube operand slot reads from.
OPERAND_SPACES: dict[str, MemorySpace] = {
    "lhs": MemorySpace.Left,
    "rhs": MemorySpace.Right,
    "bias": MemorySpace.Bias,
    "acc": MemorySpace.Acc,
    "lhs_scale": MemorySpace.LeftScale,
    "rhs_scale": MemorySpace.RightScale,
}


def reachable(src: MemorySpace, dst: MemorySpace) -> bool:
    """Whether some chain of legal moves leads from ``src`` to ``dst`` (``src`` itself included)."""
    seen, todo = {src}, [src]
    while todo:
        for nxt in LEGAL_MOVES.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return dst in seen


def _names(spaces) -> str:
    return ", ".join(s.name for s in spaces)


def as_space(value, op: str, what: str = "target_memory") -> MemorySpace:
    """``value`` as a MemorySpace (the enum or its name), or TileTypeError naming ``op``."""
    if isinstance(value, MemorySpace):
        return value
    if isinstance(value, str) and value in MemorySpace.__members__:
        return MemorySpace[value]
    raise TileTypeError(f"{op}: {what}={value!r} is not a memory space; pass one of pl.MemorySpace."
                        f"{{{_names(MemorySpace)}}}")


def check_load_target(space: MemorySpace) -> None:
    """A DDR load lands only in Vec or Mat."""
    if space not in LOAD_TARGETS:
        raise TileTypeError(
            f"pl.load: target_memory=pl.MemorySpace.{space.name} is not reachable from DDR: a load lands only "
            "in Vec (the default) or Mat. Load into Mat, then pl.move(tile, target_memory=pl.MemorySpace."
            f"{space.name})" + ("" if space in LEGAL_MOVES[MemorySpace.Mat] else
                                f"; {space.name} is not reachable by any move either"))


def check_move(src: MemorySpace, dst: MemorySpace) -> None:
    """Raise unless some target implements the move ``src -> dst``."""
    legal = LEGAL_MOVES.get(src, ())
    if dst in legal:
        return
    if dst is MemorySpace.DDR:
        why = "DDR is off chip: write a tile to DDR with pl.store(tile, offsets, tensor)"
    elif dst is MemorySpace.Acc:
        why = ("nothing moves data into Acc, only a cube op (pl.matmul and family) writes it: start an "
               "accumulator with pl.matmul, then pl.matmul_acc into it")
    else:
        sources = [s.name for s, ds in LEGAL_MOVES.items() if dst in ds]
        why = (f"{dst.name} is reached only from {' or '.join(sources)}" if sources else
               f"no move reaches {dst.name}")
        if MemorySpace.Mat.name in sources and src is MemorySpace.Vec:
            why += "; load the data with pl.load(..., target_memory=pl.MemorySpace.Mat) and move that"
    where = f"from {src.name} a tile moves only to {_names(legal)}" if legal else f"nothing moves out of {src.name}"
    raise TileTypeError(f"pl.move: {src.name} -> {dst.name} is not a legal move ({where}): {why}")


def check_operand(op: str, slot: str, tile) -> None:
    """Raise if ``tile`` was placed where no chain of moves can bring it to cube operand ``slot`` of ``op``.

    As upstream: a placed operand in another space is fine when moves can bridge it (the compiler inserts
    them, across cores if need be); what cannot be bridged is an error: nothing moves out of Left, Right,
    Bias or the scale buffers, and nothing moves into Acc.
    """
    space = getattr(tile, "space", None)
    need = OPERAND_SPACES[slot]
    if space is None or reachable(space, need):  # unplaced: the compiler places it
        return
    if need is MemorySpace.Acc:
        fix = ("nothing moves data into Acc, only a cube op writes it: pass the result of a cube op "
               "(pl.matmul, pl.gemv, ...) as the accumulator"
               + (", or drop a pre-zeroed accumulator and pass init_cond=True on the first step"
                  if op in ("matmul_acc", "gemv_acc") else ""))
    else:
        fix = (f"nothing moves out of {space.name}, so it can feed only the {space.name} operand; load the "
               f"{slot} into Mat and pl.move it to {need.name}")
    raise TileTypeError(f"pl.{op}: {slot} is in {space.name}, but the {slot} operand is read from {need.name}; {fix}")
