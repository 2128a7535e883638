"""Automatic mixed kernels: ``pl.split_aiv`` regions, ``pl.split`` / ``pl.cross_core_slot``, ``pl.cluster``,
``pl.system.syncall``.

Upstream compiles a core-group region that mixes cube and vector work into an AIC kernel and an AIV kernel
joined by a cross-core pipe.  On the CPU the arithmetic needs no such split, so:

- ``pl.split(mode)`` / ``pl.cross_core_slot(slot_num=n)`` in ``pl.at(..., optimizations=[...])`` are recorded
  on the region (``Region.options["split"]`` / ``["slot_num"]``); a core group started inside the region
  takes them as its split mode and as the depth of a pipe set up without ``slot_num``.
- ``for aiv_id in pl.split_aiv(2, mode=...)`` runs its body once per AIV lane, lane 0 then lane 1, each as
  that lane (``pl.get_subblock_idx()``, ``pl.aiv_shard``, ``pl.aic_gather`` see it); the code around the
  region is the cube's.  A side effect in the body happens once per lane, as on the device.
- Upstream's static rules for a function that opens a region (cube ops stay out of regions, vector ops stay
  in them, every crossing is named, all crossings agree on split vs no-split) are checked on the source
  when the first region of a function runs.
- ``pl.system.syncall`` is a barrier across the running core group's halves (AIC and AIV functions run as
  threads by :mod:`ptodist.language.core_group`).  Outside a core group everything before the call has already run
  in program order, so it holds at once; inside a region (whose lanes run one after the other) it cannot be
  met and is an error.
- ``with pl.cluster():`` co-schedules the AIC and AIV functions called in the block: they run together as
  one core group (one task) when the block ends, as the halves of a ``pl.FunctionType.Group`` function do.
  Other calls in the block (SPMD or mixed InCore kernels) run as they are made: on the CPU every kernel
  already has a whole "cluster" to itself.
"""

from __future__ import annotations

import ast
import enum
import functools
import linecache
import os
import sys
import threading
import types
import warnings
from dataclasses import dataclass

from .. import context
from ..errors import ProgramError, TileTypeError, TileValueError
from ..source import user_frame
from . import dtypes as dt
from .halves import Half, current_half, enter_half
from .ops import pipes as _pipes
from .ops.registry import REGISTRY, is_tensor
from .scalar import Scalar


class SplitMode(enum.IntEnum):
    """How a ``pl.split_aiv`` region divides its tiles between the two AIV lanes (the value is the split code)."""

    NONE = 0  # both lanes see every tile whole
    UP_DOWN = 1  # each lane gets half of the rows
    LEFT_RIGHT = 2  # each lane gets half of the columns


class KernelType(enum.Enum):
    """The cores a ``pl.system.syncall`` (and upstream's per-lane system ops) apply to."""

    AIC = "aic"
    AIV = "aiv"
    MIX = "mix"


class SyncAllMode(enum.Enum):
    """``pl.system.syncall`` implementation: FFTS hardware signal (HARD) or GM polling (SOFT)."""

    HARD = "hard"
    SOFT = "soft"


def site(skip: int = 2) -> str:
    """``file:line`` of the innermost user frame."""
    f = user_frame(skip)
    return f"{f[0]}:{f[1]}" if f else "<unknown>"


# -- pl.at(..., optimizations=[...]) ---------------------------------------------------------------------
class Optimization:
    """An entry of ``pl.at(..., optimizations=[...])``."""


@dataclass(frozen=True)
class Split(Optimization):
    """``pl.split(mode)``: the region is a mixed kernel whose vector work is divided by ``mode``."""

    mode: SplitMode
    slot_num: int | None = None


@dataclass(frozen=True)
class CrossCoreSlot(Optimization):
    """``pl.cross_core_slot(slot_num=n)``: the ring depth of the region's cross-core pipe."""

    slot_num: int


def _slot_num(api: str, slot_num) -> int:
    if isinstance(slot_num, bool) or not isinstance(slot_num, int) or slot_num <= 0:
        raise TileValueError(f"{api}: slot_num={slot_num!r} must be a positive int (the number of tiles the "
                             "cross-core ring holds)")
    return slot_num


def _split_mode(api: str, mode) -> SplitMode:
    if not isinstance(mode, SplitMode):
        raise TileTypeError(f"{api}: mode={mode!r} is not a split mode; pass pl.SplitMode.NONE, "
                            "pl.SplitMode.UP_DOWN or pl.SplitMode.LEFT_RIGHT")
    return mode


def split(mode: SplitMode, *, slot_num: int | None = None) -> Split:
    """The ``optimizations=`` entry that makes a ``pl.at`` region a mixed kernel split by ``mode``."""
    mode = _split_mode("pl.split", mode)
    if slot_num is not None:
        _slot_num("pl.split", slot_num)
        warnings.warn("pl.split(slot_num=...) is deprecated upstream: write optimizations=[pl.split(mode), "
                      "pl.cross_core_slot(slot_num=n)] instead", DeprecationWarning, stacklevel=2)
    return Split(mode, slot_num)


def cross_core_slot(*, slot_num: int) -> CrossCoreSlot:
    """The ``optimizations=`` entry that sets the ring depth (slots) of the region's cross-core pipe."""
    return CrossCoreSlot(_slot_num("pl.cross_core_slot", slot_num))


def region_options(optimizations, api: str = "pl.at") -> dict:
    """The region options an ``optimizations=[...]`` list stands for: ``split`` and ``slot_num`` (when given)."""
    if optimizations is None:
        return {}
    if not isinstance(optimizations, (list, tuple)):
        raise TileTypeError(f"{api}: optimizations={optimizations!r} must be a list of pl.split(...) / "
                            "pl.cross_core_slot(...) entries")
    out: dict = {"optimizations": list(optimizations)}
    for e in optimizations:
        if not isinstance(e, Optimization):
            raise TileTypeError(f"{api}: optimizations entry {e!r} is not an optimization; use pl.split(mode) or "
                                "pl.cross_core_slot(slot_num=n)")
        key, value = ("split", e.mode) if isinstance(e, Split) else ("slot_num", e.slot_num)
        if key in out:
            raise TileValueError(f"{api}: optimizations= has two {'pl.split' if key == 'split' else 'pl.cross_core_slot'} "
                                 "entries; give each once")
        out[key] = value
        if isinstance(e, Split) and e.slot_num is not None:
            out.setdefault("slot_num", e.slot_num)
    return out


# -- the running region's options ------------------------------------------------------------------------
_scopes = threading.local()


def current_options() -> dict:
    """The ``split`` / ``slot_num`` options of the innermost running ``pl.at`` region ({} outside one)."""
    st = getattr(_scopes, "stack", None)
    return st[-1] if st else {}


def _own_options(region) -> dict:
    return {k: region.options[k] for k in ("split", "slot_num") if region.options.get(k) is not None}


def enter_region(region) -> None:
    """Make ``region``'s options the running ones (until :func:`exit_region`); a region without any runs
    as part of the enclosing one, with its options."""
    st = getattr(_scopes, "stack", None)
    if st is None:
        st = _scopes.stack = []
    st.append(_own_options(region) or (st[-1] if st else {}))


def exit_region() -> None:
    """Undo the last :func:`enter_region`."""
    _scopes.stack.pop()


class _Scoped:
    """A region's outlined body that runs with the region's options as the running ones.

    It passes for the body itself (name, code, signature): the contexts read the parameter names of the
    body they are given.
    """

    def __init__(self, region, body):
        functools.update_wrapper(self, body)
        self.__code__ = body.__code__
        self._region, self._body = region, body

    def __call__(self, *args, **kwargs):
        enter_region(self._region)
        try:
            return self._body(*args, **kwargs)
        finally:
            exit_region()


def scoped(region, body):
    """``body``, run with ``region``'s options as the running ones whenever the region's task runs (``body``
    itself when the region has none)."""
    return _Scoped(region, body) if _own_options(region) else body


def run_as_task(name: str, fn, args=()):
    """Run ``fn()`` as one task of the running rank that touches ``args`` (in place inside a task)."""
    from .regions import Region

    return context.current().region(Region("at", None, None, (), name), lambda *_: fn(), tuple(args)).values


def cluster():
    """Co-schedule the AIC and AIV functions called in the ``with`` block as one core group (one task)."""
    from .core_group import cluster as _cluster  # core_group imports this module

    return _cluster()


# -- pl.split_aiv -----------------------------------------------------------------------------------------
class _SplitAiv:
    """What ``pl.split_aiv(2, mode=...)`` returns: iterating it runs the loop body once per AIV lane."""

    def __init__(self, n: int, mode: SplitMode, frame):
        self.n, self.mode = n, mode
        self._frame = frame  # the caller: where the region's source (and its names' module) is found

    def __iter__(self):
        return self._lanes()

    def _lanes(self):
        frame, self._frame = self._frame, None  # held no longer than needed: it pins the caller's locals
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"
        outer = current_half()
        if outer is not None:
            inside = "another pl.split_aiv region" if getattr(outer.group, "sequential", False) else \
                "a function of a core group"
            raise ProgramError(f"pl.split_aiv at {where}: opened inside {inside} ({outer.label}), which already "
                               "runs on one lane; open regions only in the function (or pl.at(level="
                               "pl.Level.CORE_GROUP) block) that also holds the cube work")
        if frame is not None:
            _check_function(frame, self.mode)
        del frame
        group = _pipes.LaneGroup(f"split_aiv@{os.path.basename(where)}", int(self.mode), self.n,
                                 current_options().get("slot_num"))
        try:
            for lane in range(self.n):
                enter_half(Half(group, "AIV", lane, group.name))
                try:
                    yield Scalar(lane, dt.INDEX)
                finally:
                    enter_half(None)
            group.finish(where)
        finally:
            enter_half(outer)


def split_aiv(n: int, *, mode: SplitMode) -> _SplitAiv:
    """``for aiv_id in pl.split_aiv(2, mode=...)``: run the body on each AIV lane, its tiles split by ``mode``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TileTypeError(f"pl.split_aiv: n={n!r} must be the int 2 (the AIV lanes of a core group)")
    if n != 2:
        raise TileValueError(f"pl.split_aiv: n={n}, but a core group has 2 AIV lanes; write pl.split_aiv(2, ...)")
    return _SplitAiv(n, _split_mode("pl.split_aiv", mode), sys._getframe(1))


# -- pl.system.syncall and friends --------------------------------------------------------------------------
def _kernel_type(api: str, core_type) -> KernelType:
    if isinstance(core_type, str) and core_type.lower() in ("aic", "aiv", "mix"):
        return KernelType(core_type.lower())
    if not isinstance(core_type, KernelType):
        raise TileTypeError(f"{api}: core_type={core_type!r} is not a core type; pass pl.KernelType.MIX, "
                            "pl.KernelType.AIC or pl.KernelType.AIV")
    return core_type


def syncall(*, core_type: KernelType = KernelType.MIX, mode: SyncAllMode = SyncAllMode.HARD, gm_workspace=None,
            used_cores: int | Scalar | None = None) -> None:
    """Barrier: wait until every core of ``core_type`` in the running core group has reached this call."""
    api = "pl.system.syncall"
    kind = _kernel_type(api, core_type)
    if not isinstance(mode, SyncAllMode):
        raise TileTypeError(f"{api}: mode={mode!r} is not a sync mode; pass pl.SyncAllMode.HARD or "
                            "pl.SyncAllMode.SOFT")
    if mode is SyncAllMode.HARD:
        if gm_workspace is not None or used_cores is not None:
            raise TileValueError(f"{api}: mode=SyncAllMode.HARD takes no gm_workspace / used_cores; pass "
                                 "mode=pl.SyncAllMode.SOFT for the GM-polling barrier")
    else:
        if gm_workspace is None or not is_tensor(gm_workspace):
            raise TileTypeError(f"{api}: mode=SyncAllMode.SOFT needs gm_workspace=<a zero-initialised INT32 GM "
                                f"tensor>, got {type(gm_workspace).__name__}")
        if used_cores is None:
            raise TileValueError(f"{api}: mode=SyncAllMode.SOFT needs used_cores=<the number of participating "
                                 "cores> (0: all of the launch)")
        count = used_cores.value if isinstance(used_cores, Scalar) else used_cores
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2 ** 31:
            raise TileValueError(f"{api}: used_cores={used_cores!r} must be an int in [0, 2**31)")
    _pipes.barrier(api, kind.name)


def cacheinvalid(tensor=None, shapes=None, offsets=None) -> None:
    """Invalidate cached GM lines (all of GM, or the line at a tensor region's base); coherent here."""
    api = "pl.system.cacheinvalid"
    if tensor is None:
        if shapes is not None or offsets is not None:
            raise TileValueError(f"{api}: the whole-GM form takes no shapes/offsets; pass (tensor, shapes, "
                                 "offsets) for the region form")
        return
    if not is_tensor(tensor):
        raise TileTypeError(f"{api}: takes a tensor, got {type(tensor).__name__}")
    if shapes is None or offsets is None or len(shapes) != len(tensor.shape) or len(offsets) != len(tensor.shape):
        raise TileValueError(f"{api}: the region form needs shapes and offsets of one entry per dimension of the "
                             f"{list(tensor.shape)} tensor")


def fence() -> None:
    """Wait until this core's earlier GM writes are visible to the other cores (they always are here)."""


# -- the static rules of a function that opens a region -----------------------------------------------------
_CUBE_FAMILY = "Linear algebra"
_VECTOR_FAMILIES = {"Elementwise arithmetic", "Math", "Activations", "Broadcast and expand", "Reductions"}
_trees: dict = {}
_checked: set = set()
_passed: set = set()  # (code, line, mode) of regions whose function passed: a region in a loop is checked once
_lock = threading.Lock()


def _tree(filename: str):
    lines = linecache.getlines(filename)
    if not lines:
        return None
    key = (filename, len(lines), hash(lines[0]))
    with _lock:
        if key not in _trees:
            try:
                tree = ast.parse("".join(lines))
            except SyntaxError:
                tree = None
            parents = {}
            if tree is not None:
                for node in ast.walk(tree):
                    for child in ast.iter_child_nodes(node):
                        parents[child] = node
            _trees[key] = (tree, parents)
        return _trees[key]


def _is_language(mod) -> bool:
    return getattr(mod, "__name__", None) in ("ptodist.language", "pypto.language", __name__)


def _op_of(call, names) -> str | None:
    """``'matmul'`` for ``pl.matmul(...)`` / ``pl.tile.matmul(...)`` / ``pl.tensor.matmul(...)``, else None."""
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return None
    v = call.func.value
    if isinstance(v, ast.Attribute) and v.attr in ("tile", "tensor", "system"):
        v = v.value
    if isinstance(v, ast.Name) and _is_language(names.get(v.id)):
        return call.func.attr
    return None


def _is_region_with(node, names) -> bool:
    return isinstance(node, (ast.With, ast.AsyncWith)) and any(
        _op_of(item.context_expr, names) in ("at", "spmd") for item in node.items)


def _is_split_loop(node, names) -> bool:
    return isinstance(node, ast.For) and _op_of(node.iter, names) == "split_aiv"


def _own_nodes(scope, names):
    """The nodes of ``scope`` that belong to it (not to nested functions or nested pl.at regions)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if _is_region_with(n, names):
            continue
        todo.extend(ast.iter_child_nodes(n))


def _mode_name(loop, names, running: tuple) -> str | None:
    """The loop's split mode by name (from its source; the running loop's from its value), or None."""
    if loop is running[0]:
        return running[1].name
    for kw in loop.iter.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Attribute) and kw.value.attr in SplitMode.__members__:
            return kw.value.attr
    return None


def _check_function(frame, mode: SplitMode) -> None:
    """Raise what upstream's verifier would for the function (or pl.at block) running this region."""
    filename, line = frame.f_code.co_filename, frame.f_lineno
    fast = (frame.f_code, line, mode)
    if fast in _passed:
        return
    got = _tree(filename)
    if got is None or got[0] is None:
        return  # no source (exec'd code): nothing to check against
    tree, parents = got
    names = dict(frame.f_builtins) if isinstance(frame.f_builtins, dict) else {}
    names.update(frame.f_globals)
    names.update((k, v) for k, v in frame.f_locals.items() if isinstance(v, types.ModuleType))  # a local import
    loop = next((n for n in ast.walk(tree) if _is_split_loop(n, names)
                 and n.iter.lineno <= line <= (n.iter.end_lineno or n.iter.lineno)), None)
    if loop is None:
        return
    scope = parents.get(loop)
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
            and not _is_region_with(scope, names):
        scope = parents.get(scope)
    if scope is None:
        scope = tree
    key = (filename, getattr(scope, "lineno", 0), getattr(scope, "col_offset", 0), loop.lineno, mode.name)
    if key not in _checked:
        _Rules(filename, scope, parents, names, (loop, mode)).check()
        _checked.add(key)
    _passed.add(fast)


class _Rules:
    def __init__(self, filename, scope, parents, names, running):
        self.file, self.scope, self.parents, self.names, self.running = filename, scope, parents, names, running
        own = list(_own_nodes(scope, names))
        self.loops = sorted((n for n in own if _is_split_loop(n, names)), key=lambda n: (n.lineno, n.col_offset))
        inside = set()
        for lp in self.loops:
            for stmt in lp.body:
                inside.update(ast.walk(stmt))
        self.inside = inside
        self.outside = [n for n in own if n not in inside and not any(n is lp for lp in self.loops)]
        cube = {d.name for d in REGISTRY.values() if d.family == _CUBE_FAMILY}
        vector = {d.name for d in REGISTRY.values() if d.family in _VECTOR_FAMILIES}
        self.cube, self.vector = cube, vector

    def at(self, node) -> str:
        return f"{self.file}:{node.lineno}"

    def op(self, node) -> str | None:
        return _op_of(node, self.names)

    def check(self) -> None:
        for lp in self.loops:
            self.cube_inside(lp)
            self.unnamed_into(lp)
            self.unnamed_out_of(lp)
        self.vector_outside()
        self.crossings_agree()

    def cube_inside(self, lp) -> None:
        for stmt in lp.body:
            for n in ast.walk(stmt):
                if self.op(n) in self.cube:
                    raise ProgramError(
                        f"cube op 'pl.{self.op(n)}' at {self.at(n)} is inside the pl.split_aiv region at "
                        f"{self.at(lp)}: a region's body runs on the AIV (vector) lanes. Move the cube op out of "
                        "the region and read its result inside with pl.aiv_shard(...)")

    def _last_store_before(self, name: str, line: int, nodes):
        best = None
        for n in nodes:
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) and n.lineno < line:
                if best is None or (n.lineno, n.col_offset) > (best.lineno, best.col_offset):
                    best = n
        return best

    def _producer(self, store):
        """The op of the call whose value ``store`` (a Name target) receives, or None."""
        stmt = self.parents.get(store)
        while stmt is not None and not isinstance(stmt, ast.stmt):
            stmt = self.parents.get(stmt)
        value = getattr(stmt, "value", None)
        return self.op(value) if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) else None

    def unnamed_into(self, lp) -> None:
        body = [n for stmt in lp.body for n in ast.walk(stmt)]
        for n in sorted((x for x in body if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load)),
                        key=lambda x: (x.lineno, x.col_offset)):
            if any(isinstance(s, ast.Name) and s.id == n.id and isinstance(s.ctx, ast.Store)
                   and (s.lineno, s.col_offset) < (n.lineno, n.col_offset) for s in body):
                continue
            store = self._last_store_before(n.id, lp.lineno, self.outside)
            made = self._producer(store) if store is not None else None
            if made not in self.cube:
                continue
            call = self.parents.get(n)
            if isinstance(call, ast.keyword):  # pl.aiv_shard(x=mm)
                call = self.parents.get(call) if call.arg == "x" else None
            elif not (isinstance(call, ast.Call) and call.args and call.args[0] is n):
                call = None
            if call is not None and self.op(call) == "aiv_shard":
                continue
            raise ProgramError(
                f"'{n.id}' is produced on the cube (AIC) lane by pl.{made} at {self.at(store)} and read on the vector "
                f"(AIV) lane inside the pl.split_aiv region at {self.at(lp)} (line {n.lineno}) without naming the "
                f"crossing; read it as pl.aiv_shard({n.id}) at the top of the region")

    def unnamed_out_of(self, lp) -> None:
        body = [n for stmt in lp.body for n in ast.walk(stmt)]
        defined = {n.id for n in body if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        end = lp.end_lineno or lp.lineno
        for n in sorted((x for x in self.outside if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load)
                         and x.id in defined and x.lineno > end), key=lambda x: (x.lineno, x.col_offset)):
            later = self._last_store_before(n.id, n.lineno, self.outside)
            if later is not None and later.lineno > end:
                continue  # rebound on the cube side first
            reader, up = None, self.parents.get(n)
            while up is not None and not isinstance(up, ast.stmt):
                if self.op(up) in self.cube:
                    reader = up
                up = self.parents.get(up)
            if reader is None:
                continue
            last = self._last_store_before(n.id, end + 1, body)
            if last is not None and self._producer(last) == "aic_gather":
                continue
            raise ProgramError(
                f"'{n.id}' is defined inside the pl.split_aiv region at {self.at(lp)}, but pl.{self.op(reader)} at "
                f"{self.at(reader)} reads it on the cube (AIC) lane outside the region without naming the crossing; "
                f"gather it inside the region: {n.id} = pl.aic_gather({n.id})")

    def vector_outside(self) -> None:
        if not self.loops:
            return
        for n in sorted((x for x in self.outside if isinstance(x, ast.Call)), key=lambda x: (x.lineno, x.col_offset)):
            name = self.op(n)
            if name in self.vector:
                raise ProgramError(
                    f"vector op 'pl.{name}' at {self.at(n)} sits outside every pl.split_aiv region, but this "
                    f"function opens one at {self.at(self.loops[0])}: once a function opens a region, its vector "
                    "work runs only inside one. Wrap that phase in "
                    "`for _ in pl.split_aiv(2, mode=pl.SplitMode.NONE):`")

    def crossings_agree(self) -> None:
        first = None
        for lp in self.loops:
            cross = next((n for stmt in lp.body for n in ast.walk(stmt) if self.op(n) in ("aiv_shard", "aic_gather")),
                         None)
            mode = _mode_name(lp, self.names, self.running)
            if cross is None or mode is None:
                continue
            if first is None:
                first = (cross, mode)
                continue
            c0, m0 = first
            if (m0 == "NONE") != (mode == "NONE"):
                def said(c, m):
                    arg = ast.unparse(c.args[0]) if c.args else ""
                    kind = "no split" if m == "NONE" else "split"
                    return f"'pl.{self.op(c)}({arg})' at {self.at(c)}", f"SplitMode.{m} ({kind})"

                (w1, k1), (w0, k0) = said(cross, mode), said(c0, m0)
                raise ProgramError(
                    f"{w1} crosses the AIC/AIV boundary under {k1}, but {w0}, earlier in this function, crosses it "
                    f"under {k0}: every crossing of one function rides one cross-core pipe, which is either split or "
                    "unsplit. Make every crossing agree, drop the crossing from one region, or put the phases in "
                    "separate pl.at(level=pl.Level.CORE_GROUP) scopes")
