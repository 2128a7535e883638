"""Cross-core transfer: the pipes between a core group's cube half (AIC) and its vector lanes (AIV).

A mixed kernel runs as one AIC half and ``lanes`` AIV halves (two on Ascend), concurrently; the
scheduler that runs them is :mod:`ptodist.language.core_group`; what the halves share (the rings, the
pipe set-ups, the reserved buffers) is :mod:`ptodist.language.halves`.  This module holds the ops on it.

A pipe (one ``id``, one direction) is a ring of ``slot_num`` slots per AIV lane.  A push takes a free
slot (blocking while every slot is full), a pop takes the oldest filled slot (blocking while none is),
and the slot stays taken until the consumer releases it with ``tfree``.  ``split`` divides a cube tile
between the two lanes (1/3: by rows, 2/4: by columns; 3/4 for an odd extent); 0 sends it whole to
each lane, and on the way back takes lane 0's tile.

The lanes of a ``pl.split_aiv`` region (:mod:`ptodist.language.mixed`) are halves of a :class:`LaneGroup`
instead: they run one after the other, and meet only at ``pl.aic_gather``.  :func:`barrier` is what
``pl.system.syncall`` waits in.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ... import context
from ...errors import ProgramError, TileTypeError, TileValueError
from ...source import user_frame
from .. import dtypes as dt
from ..dtypes import DataType
from ..halves import DIRS, GroupState, Half, Pending, Pipe, PipeSetup, Slot, current_half, hb_order, hb_token
from ..scalar import Scalar
from ..tile_ops import Tile
from .registry import ANY, _fresh, _whole, is_tensor, op

AUTO: int = -1  # reserve_buffer(base=AUTO) / a consumer buffer: let the implementation choose the address

_XFER = "Cross-core transfer"
_SPLITS = {0: "none", 1: "up-down", 2: "left-right", 3: "up-down (odd extent)", 4: "left-right (odd extent)"}
_BUF_ALIGN = 32  # bytes: where AUTO places the next reserved buffer of a function


def _site() -> str:
    f = user_frame(1)
    return f"{f[0]}:{f[1]}" if f else "<unknown>"


def _need_half(op_name: str, role: str | None) -> Half:
    """The running half, checked to be of ``role`` (None: either)."""
    half = current_half()
    want = {"AIC": "an AIC (cube) function", "AIV": "an AIV (vector) function", None: "an AIC or AIV function"}[role]
    if half is not None and getattr(half.group, "sequential", False):
        raise ProgramError(
            f"pl.{op_name} at {_site()}: explicit cross-core pipes and buffers do not mix with a pl.split_aiv "
            f"region ({half.label}); a region crosses the AIC/AIV boundary with pl.aiv_shard / pl.aic_gather. "
            "Use those, or write the kernel as AIC and AIV functions of a pl.FunctionType.Group function.")
    if half is None:
        raise ProgramError(
            f"pl.{op_name} at {_site()}: called outside a mixed kernel; it runs only in {want} of a core group "
            "(a pl.FunctionType.Group function calling its AIC and AIV functions, or "
            "ptodist.language.core_group.run_core_group). Move the call into that function.")
    if role is not None and half.role != role:
        other = {"tpush_to_aiv": "tpush_to_aic", "tpush_to_aic": "tpush_to_aiv", "tpop_from_aic": "tpop_from_aiv",
                 "tpop_from_aiv": "tpop_from_aic", "tfree_to_aic": "tfree_to_aiv", "tfree_to_aiv": "tfree_to_aic",
                 "aic_initialize_pipe": "aiv_initialize_pipe",
                 "aiv_initialize_pipe": "aic_initialize_pipe"}.get(op_name)
        raise ProgramError(
            f"pl.{op_name} at {_site()}: runs in {want}, but {half.label} called it"
            + (f"; on this side use pl.{other}" if other else "") + ".")
    return half


# -- splitting a tile between the lanes ------------------------------------------------------------------
def _check_split(op_name: str, split) -> int:
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or int(split) not in _SPLITS:
        codes = ", ".join(f"{k}={v}" for k, v in _SPLITS.items())
        raise TileValueError(f"pl.{op_name}: split={split!r} is not a split code; use one of {codes}")
    return int(split)


def _pid(op_name: str, pid) -> int:
    if pid is None:
        return 0
    if isinstance(pid, bool) or not isinstance(pid, (int, np.integer, Scalar)) or int(pid) < 0:
        raise TileValueError(f"pl.{op_name}: id={pid!r} is not a pipe id; pass a non-negative int (omit it for 0)")
    return int(pid)


def _bound(op_name: str, tile: Tile, split: int, lane_stride) -> tuple[int, int]:
    """(axis, the first index of lane 1 along it) for a split tile."""
    if tile.data.ndim != 2:
        raise TileValueError(f"pl.{op_name}: split={split} ({_SPLITS[split]}) divides a 2-D tile, got shape "
                             f"{tile.shape}; reshape it to 2-D first or send it whole with split=0")
    axis = 0 if split in (1, 3) else 1
    n = tile.data.shape[axis]
    if lane_stride is not None:
        ls = int(lane_stride)
        if not 0 < ls < n:
            raise TileValueError(f"pl.{op_name}: lane_stride={lane_stride} must lie inside the split axis "
                                 f"(0 < lane_stride < {n}) of a {tile.shape} tile")
        return axis, ls
    if split in (1, 2) and n % 2:
        raise TileValueError(f"pl.{op_name}: split={split} ({_SPLITS[split]}) halves axis {axis} of a {tile.shape} "
                             f"tile, but its extent {n} is odd; use split={split + 2} for an odd extent")
    return axis, (n + 1) // 2


def _lane_parts(op_name: str, tile: Tile, split: int, lanes: int, lane_stride=None) -> list[Tile]:
    """The tile each lane receives (copies: the slot holds the data, not the producer's buffer)."""
    if split == 0:
        return [Tile(tile.data.copy(), tile.dtype, tile.valid_shape) for _ in range(lanes)]
    if lanes != 2:
        raise TileValueError(f"pl.{op_name}: split={split} divides the tile between two AIV lanes, but this core "
                             f"group has {lanes}; send it whole with split=0")
    axis, b = _bound(op_name, tile, split, lane_stride)
    n, v = tile.data.shape[axis], tile.valid_shape[axis]
    parts = []
    for lo, hi in ((0, b), (b, n)):
        sl = [slice(None)] * 2
        sl[axis] = slice(lo, hi)
        valid = list(tile.valid_shape)
        valid[axis] = max(0, min(v, hi) - lo)
        parts.append(Tile(tile.data[tuple(sl)].copy(), tile.dtype, valid))
    return parts


def _join(op_name: str, parts: list[Tile], split: int) -> Tile:
    """The cube's tile from the lanes' ones (the inverse of :func:`_lane_parts`)."""
    dtypes = {p.dtype for p in parts}
    if len(dtypes) > 1:
        names = ", ".join(f"lane {i}: {p.dtype.name}" for i, p in enumerate(parts))
        raise TileTypeError(f"pl.{op_name}: the lanes pushed tiles of different dtypes ({names}); push the same "
                            "dtype from every lane")
    if split == 0 or len(parts) == 1:
        p = parts[0]  # both lanes share the one slot: the cube sees one of them (lane 0's, here)
        return Tile(p.data.copy(), p.dtype, p.valid_shape)
    axis = 0 if split in (1, 3) else 1
    a, b = parts
    if a.data.ndim != 2 or b.data.ndim != 2 or a.data.shape[1 - axis] != b.data.shape[1 - axis]:
        raise TileValueError(f"pl.{op_name}: split={split} ({_SPLITS[split]}) joins the lanes' tiles along axis "
                             f"{axis}, but they are {a.shape} and {b.shape}; push 2-D halves that agree on the "
                             "other axis")
    valid = [min(x, y) for x, y in zip(a.valid_shape, b.valid_shape)]
    full = a.valid_shape[axis] == a.data.shape[axis]
    valid[axis] = a.data.shape[axis] + b.valid_shape[axis] if full else a.valid_shape[axis]
    return Tile(np.concatenate([a.data, b.data], axis=axis), a.dtype, valid)


def _check_received(op_name: str, tile: Tile, shape, dtype) -> None:
    if shape is not None and list(shape) != tile.shape:
        raise TileValueError(f"pl.{op_name}: shape={list(shape)} but the tile in the slot is {tile.shape}; "
                             "declare the shape the producer pushed (halved along the split axis for a split push)")
    if dtype is not None and dtype != tile.dtype:
        raise TileTypeError(f"pl.{op_name}: dtype={getattr(dtype, 'name', dtype)} but the tile in the slot is "
                            f"{tile.dtype.name}; declare the dtype the producer pushed")


def _check_slot_size(op_name: str, state: GroupState, pid: int, tile: Tile) -> None:
    s = state.setup(pid)
    if s is not None and tile.data.nbytes > s.slot_size:
        raise TileValueError(f"pl.{op_name}: the tile {tile.shape} {tile.dtype.name} is {tile.data.nbytes} bytes, "
                             f"more than the {s.slot_size}-byte slots pipe {pid} was set up with at {s.site}; "
                             "raise slot_size or push a smaller tile")


def _check_direction(op_name: str, state: GroupState, pid: int, direction: str) -> None:
    s = state.setup(pid)
    bit = 1 if direction == "C2V" else 2
    if s is not None and not s.dir_mask & bit:
        raise TileValueError(f"pl.{op_name}: pipe {pid} was set up at {s.site} with dir_mask={s.dir_mask}, which "
                             f"leaves out the {DIRS[direction]} direction (bit {bit}); set it up with "
                             f"dir_mask={s.dir_mask | bit}")


def _tile_arg(op_name: str, tile) -> Tile:
    if not isinstance(tile, Tile):
        raise TileTypeError(f"pl.{op_name}: takes a tile, got {type(tile).__name__}; pl.load the data into a tile "
                            "first")
    return tile


def _room(state: GroupState, pipe: Pipe, lanes) -> Callable[[], bool]:
    depth = state.depth(pipe.id)
    return lambda: all(pipe.rings[i].taken < depth for i in lanes)


def _full_reason(state: GroupState, pipe: Pipe, lanes) -> str:
    depth = state.depth(pipe.id)
    i = next((i for i in lanes if pipe.rings[i].taken >= depth), lanes[0])
    r = pipe.rings[i]
    return (f"{pipe.desc}, lane {i}: all {depth} slots are taken ({len(r.ready)} pushed and not popped, "
            f"{len(r.held)} popped and not released)")


# -- the ops ---------------------------------------------------------------------------------------------
def tpush_to_aiv(tile: Tile, *, split: int, lane_stride: int | None = None, id: int | None = None) -> None:
    """Push a tile from the cube (AIC) into the cross-core pipe to the vector lanes, split between them."""
    half = _need_half("tpush_to_aiv", "AIC")
    tile, split, pid = _tile_arg("tpush_to_aiv", tile), _check_split("tpush_to_aiv", split), _pid("tpush_to_aiv", id)
    state = half.group.state
    _check_direction("tpush_to_aiv", state, pid, "C2V")
    parts = _lane_parts("tpush_to_aiv", tile, split, state.lanes, lane_stride)
    for part in parts:
        _check_slot_size("tpush_to_aiv", state, pid, part)
    pipe, site, lanes = state.pipe("C2V", pid), _site(), list(range(state.lanes))
    half.group.wait_until(half, _room(state, pipe, lanes),
                          Pending("pl.tpush_to_aiv", site, lambda: _full_reason(state, pipe, lanes), pipe=pipe))
    for ring in pipe.rings:  # a slot the consumer freed is reused after what it did before the free
        hb_order(ring.freed)
        ring.freed.clear()
    token = hb_token()
    for lane, part in enumerate(parts):
        pipe.rings[lane].ready.append(Slot(part, split, site, token))
    pipe.pushes += 1


def tpush_to_aic(tile: Tile, *, split: int, id: int | None = None) -> None:
    """Push a tile from this vector lane (AIV) into the cross-core pipe to the cube."""
    half = _need_half("tpush_to_aic", "AIV")
    tile, split, pid = _tile_arg("tpush_to_aic", tile), _check_split("tpush_to_aic", split), _pid("tpush_to_aic", id)
    state = half.group.state
    _check_direction("tpush_to_aic", state, pid, "V2C")
    _check_slot_size("tpush_to_aic", state, pid, tile)
    pipe, site = state.pipe("V2C", pid), _site()
    half.group.wait_until(half, _room(state, pipe, [half.lane]),
                          Pending("pl.tpush_to_aic", site, lambda: _full_reason(state, pipe, [half.lane]),
                                  pipe=pipe))
    ring = pipe.rings[half.lane]
    hb_order(ring.freed)
    ring.freed.clear()
    ring.ready.append(Slot(Tile(tile.data.copy(), tile.dtype, tile.valid_shape), split, site, hb_token()))
    pipe.pushes += 1


def _split_mismatch(op_name: str, push: str, slot: Slot, split: int) -> TileValueError:
    return TileValueError(f"pl.{op_name}: split={split} ({_SPLITS[split]}), but the tile was pushed with "
                          f"split={slot.split} ({_SPLITS[slot.split]}) by pl.{push} at {slot.site}; the split code "
                          "must match on both sides")


def tpop_from_aic(*, shape: list[int] | None = None, dtype: DataType | None = None, split: int = 0,
                  lane_stride: int | None = None, id: int | None = None) -> Tile:
    """Pop the next tile the cube pushed to this vector lane (blocks while the ring is empty)."""
    half = _need_half("tpop_from_aic", "AIV")
    split, pid = _check_split("tpop_from_aic", split), _pid("tpop_from_aic", id)
    state = half.group.state
    _check_direction("tpop_from_aic", state, pid, "C2V")
    pipe, ring, site = state.pipe("C2V", pid), state.pipe("C2V", pid).rings[half.lane], _site()
    half.group.wait_until(half, lambda: bool(ring.ready),
                          Pending("pl.tpop_from_aic", site, lambda: f"{pipe.desc}, lane {half.lane}: the ring is "
                                  "empty", pop=True, pipe=pipe))
    slot = ring.ready[0]
    if slot.split != split:
        raise _split_mismatch("tpop_from_aic", "tpush_to_aiv", slot, split)
    _check_received("tpop_from_aic", slot.tile, shape, dtype)
    hb_order([slot.order])
    ring.ready.popleft()
    ring.held.append((slot.tile, site))
    return slot.tile


def tpop_from_aiv(*, shape: list[int] | None = None, dtype: DataType | None = None, split: int = 0,
                  id: int | None = None) -> Tile:
    """Pop the next tile the vector lanes pushed to the cube, joined across the lanes (blocks until all pushed)."""
    half = _need_half("tpop_from_aiv", "AIC")
    split, pid = _check_split("tpop_from_aiv", split), _pid("tpop_from_aiv", id)
    state = half.group.state
    _check_direction("tpop_from_aiv", state, pid, "V2C")
    pipe, site = state.pipe("V2C", pid), _site()

    def missing() -> str:
        lanes = [i for i, r in enumerate(pipe.rings) if not r.ready]
        return f"{pipe.desc}: nothing pushed yet by AIV lane(s) {', '.join(map(str, lanes))}"

    half.group.wait_until(half, lambda: all(r.ready for r in pipe.rings),
                          Pending("pl.tpop_from_aiv", site, missing, pop=True, pipe=pipe))
    slots = [r.ready[0] for r in pipe.rings]
    for s in slots:
        if s.split != split:
            raise _split_mismatch("tpop_from_aiv", "tpush_to_aic", s, split)
    tile = _join("tpop_from_aiv", [s.tile for s in slots], split)
    _check_received("tpop_from_aiv", tile, shape, dtype)
    hb_order([s.order for s in slots])
    for r, s in zip(pipe.rings, slots):
        r.ready.popleft()
        r.held.append((s.tile, site))  # each lane's slot stays taken until the cube releases the joined tile
    pipe.joined.append((tile, [s.tile for s in slots], site))
    return tile


def _free_pid(op_name: str, id, found: int, pop: str) -> None:
    if id is not None and _pid(op_name, id) != found:
        raise TileValueError(f"pl.{op_name}: id={id} but the tile was popped from pipe {found} by pl.{pop}; omit "
                             "id= (it is taken from the pop) or pass the pop's id")


def tfree_to_aic(tile: Tile, span=None, *, split: int | None = None, id: int | None = None) -> None:
    """Release the ring slot of a tile popped with tpop_from_aic back to the cube producer."""
    half = _need_half("tfree_to_aic", "AIV")
    tile = _tile_arg("tfree_to_aic", tile)
    for (direction, pid), pipe in half.group.state.pipes.items():
        ring = pipe.rings[half.lane]
        for k, (t, _) in enumerate(ring.held):
            if direction == "C2V" and t is tile:
                _free_pid("tfree_to_aic", id, pid, "tpop_from_aic")
                del ring.held[k]
                ring.freed.append(hb_token())
                return
    raise TileValueError(f"pl.tfree_to_aic at {_site()}: this {tile.shape} {tile.dtype.name} tile holds no slot of "
                         f"AIV lane {half.lane}: it was not returned by pl.tpop_from_aic there, or it was released "
                         "already. Pass the tile pl.tpop_from_aic returned, once.")


def tfree_to_aiv(tile: Tile, span=None, *, split: int | None = None, id: int | None = None) -> None:
    """Release the ring slots of a tile popped with tpop_from_aiv back to the vector producers."""
    half = _need_half("tfree_to_aiv", "AIC")
    tile = _tile_arg("tfree_to_aiv", tile)
    for (direction, pid), pipe in half.group.state.pipes.items():
        for k, (t, _, _) in enumerate(pipe.joined):
            if direction == "V2C" and t is tile:
                _free_pid("tfree_to_aiv", id, pid, "tpop_from_aiv")
                _, parts, _ = pipe.joined.pop(k)
                token = hb_token()
                for ring, part in zip(pipe.rings, parts):
                    ring.held = [h for h in ring.held if h[0] is not part]
                    ring.freed.append(token)
                return
    raise TileValueError(f"pl.tfree_to_aiv at {_site()}: this {tile.shape} {tile.dtype.name} tile holds no slot: it "
                         "was not returned by pl.tpop_from_aiv, or it was released already. Pass the tile "
                         "pl.tpop_from_aiv returned, once.")


def _initialize(op_name: str, role: str, c2v_consumer_buf, v2c_consumer_buf, dir_mask, slot_size, slot_num,
                local_slot_num, id) -> None:
    half = _need_half(op_name, role)
    for what, v in (("c2v_consumer_buf", c2v_consumer_buf), ("v2c_consumer_buf", v2c_consumer_buf)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer, Scalar)):
            raise TileTypeError(f"pl.{op_name}: {what}={v!r} is not a buffer address; pass an int, pl.AUTO or the "
                                "Scalar pl.reserve_buffer / pl.import_peer_buffer returned")
    if dir_mask not in (1, 2, 3):
        raise TileValueError(f"pl.{op_name}: dir_mask={dir_mask!r} names no direction; use 1 (cube->vector), "
                             "2 (vector->cube) or 3 (both)")
    if isinstance(slot_size, bool) or not isinstance(slot_size, (int, np.integer)) or slot_size <= 0:
        raise TileValueError(f"pl.{op_name}: slot_size={slot_size!r} must be a positive number of bytes (the "
                             "size of the tile that crosses)")
    if slot_num is not None and (isinstance(slot_num, bool) or not isinstance(slot_num, (int, np.integer))
                                 or slot_num <= 0):
        raise TileValueError(f"pl.{op_name}: slot_num={slot_num!r} must be a positive slot count (omit it for "
                             "the default: 8, or 4 per direction when dir_mask=3)")
    state = half.group.state
    if slot_num is None:
        slot_num = state.slot_num  # the enclosing region's pl.cross_core_slot, if any
    setup = PipeSetup(int(dir_mask), int(slot_size), None if slot_num is None else int(slot_num),
                       None if local_slot_num is None else int(local_slot_num), _site())
    if setup.local_slot_num is not None and not 0 < setup.local_slot_num <= setup.depth:
        raise TileValueError(f"pl.{op_name}: local_slot_num={local_slot_num} must be between 1 and the ring's "
                             f"{setup.depth} slots")
    pid = _pid(op_name, id)
    known = state.setups.setdefault(pid, {})
    if (half.role, half.lane) in known:
        raise TileValueError(f"pl.{op_name} at {setup.site}: pipe {pid} was set up already on {half.label} at "
                             f"{known[(half.role, half.lane)].site}; set up each pipe once per side (use id= for "
                             "another pipe)")
    for other in known.values():
        mine = (setup.dir_mask, setup.slot_size, setup.depth)
        theirs = (other.dir_mask, other.slot_size, other.depth)
        if mine != theirs:
            raise TileValueError(
                f"pl.{op_name} at {setup.site}: pipe {pid} is set up with (dir_mask, slot_size, slot_num) = {mine}, "
                f"but the other side set it up with {theirs} at {other.site}; both sides must agree")
    known[(half.role, half.lane)] = setup


def aic_initialize_pipe(c2v_consumer_buf: int | Scalar = 0, v2c_consumer_buf: int | Scalar = 0, *, dir_mask: int,
                        slot_size: int, slot_num: int | None = None, local_slot_num: int | None = None,
                        id: int | None = None) -> None:
    """Set up a cross-core pipe on the cube (AIC) side: its directions, slot size and ring depth."""
    _initialize("aic_initialize_pipe", "AIC", c2v_consumer_buf, v2c_consumer_buf, dir_mask, slot_size, slot_num,
                local_slot_num, id)


def aiv_initialize_pipe(c2v_consumer_buf: int | Scalar = 0, v2c_consumer_buf: int | Scalar = 0, *, dir_mask: int,
                        slot_size: int, slot_num: int | None = None, local_slot_num: int | None = None,
                        id: int | None = None) -> None:
    """Set up a cross-core pipe on the vector (AIV) side: its directions, slot size and ring depth."""
    _initialize("aiv_initialize_pipe", "AIV", c2v_consumer_buf, v2c_consumer_buf, dir_mask, slot_size, slot_num,
                local_slot_num, id)


def get_subblock_idx() -> Scalar:
    """This vector lane's index inside its core group (0 or 1); 0 on the cube and outside a mixed kernel."""
    half = current_half()
    return Scalar(half.lane if half is not None and half.role == "AIV" else 0, dt.INDEX)


def _split_region(op_name: str) -> tuple[Half, int]:
    half = current_half()
    if half is None or half.group.state.split is None:
        raise ProgramError(f"pl.{op_name} at {_site()}: must be used inside a split_aiv region (the AIV lanes of a "
                           "core group run with a split mode), which supplies the split mode; outside one there "
                           "is no axis to split along")
    if half.role != "AIV":
        raise ProgramError(f"pl.{op_name} at {_site()}: runs on the AIV lanes of a split region, but "
                           f"{half.label} called it")
    return half, half.group.state.split


def aiv_shard(x: Tile) -> Tile:
    """This AIV lane's half of a cube-produced tile along the region's split axis (whole when the mode is NONE)."""
    half, split = _split_region("aiv_shard")
    if is_tensor(x):  # the @pl.jit form: a tensor in, a fresh tensor (this lane's part) out
        return _fresh(aiv_shard(_whole(x)))
    x = _tile_arg("aiv_shard", x)
    return _lane_parts("aiv_shard", x, split, half.group.state.lanes)[half.lane]


def aic_gather(x: Tile) -> Tile:
    """Rejoin the AIV lanes' halves of a tile along the region's split axis for the cube (waits for every lane)."""
    half, split = _split_region("aic_gather")
    if getattr(half.group, "sequential", False):
        return half.group.gather(half, x, split, _site())
    if is_tensor(x):
        return _fresh(aic_gather(_whole(x)))
    x = _tile_arg("aic_gather", x)
    state = half.group.state
    k = state.gather_count[half.lane]
    state.gather_count[half.lane] += 1
    box = state.gathers.setdefault(k, {})
    box[half.lane] = Tile(x.data.copy(), x.dtype, x.valid_shape)
    met = state.meetings.setdefault(("gather", k), [])
    met.append(hb_token())
    half.group.wait_until(half, lambda: len(box) == state.lanes,
                          Pending("pl.aic_gather", _site(), lambda: f"gather #{k}: lane(s) "
                                  f"{', '.join(str(i) for i in range(state.lanes) if i not in box)} not there yet"))
    hb_order(met)
    return _join("aic_gather", [box[i] for i in range(state.lanes)], split)


# -- a pl.split_aiv region: its lanes, one after the other -----------------------------------------------
class LaneGroup:
    """The AIV lanes of one run of a ``pl.split_aiv`` region, run one after the other on the calling thread.

    The body of such a region is a Python ``for`` loop, so its lanes cannot interleave: lane 0 runs to the
    end of the body, then lane 1.  That is one of the schedules the device allows, as long as the lanes do
    not wait for each other inside the region; what would (a pipe op, a barrier) is an error here.  A
    gather is the one meeting point: lane 0's call returns the cube's tile with its own part in place,
    and lane 1's call fills in the rest of that same tile (or tensor), so after the region the name bound
    to it holds the joined value.
    """

    sequential = True

    def __init__(self, name: str, split: int, lanes: int = 2, slot_num: int | None = None):
        self.name = name
        self.state = GroupState(lanes, split, slot_num)
        self.halves: list[Half] = []
        self._gathers: dict[int, tuple] = {}  # gather number -> (joined tile, lane 0's part, site, tensor)

    def wait_until(self, half: Half, ready, pending: Pending) -> None:
        if ready():
            return
        raise ProgramError(
            f"{pending.op} at {pending.site}: {half.label} of the pl.split_aiv region '{self.name}' would wait "
            f"({pending.what()}), but the lanes of a region run one after the other here, so nothing could "
            "release it. Keep lane-to-lane waits out of the region body.")

    def gather(self, half: Half, x, split: int, site: str):
        """Lane ``half.lane``'s part of gather number k (its k-th pl.aic_gather in this region)."""
        from ..memory_ops import store

        as_tensor = is_tensor(x)
        part = _whole(x) if as_tensor else _tile_arg("aic_gather", x)
        part = Tile(part.data.copy(), part.dtype, part.valid_shape)
        k = self.state.gather_count[half.lane]
        self.state.gather_count[half.lane] += 1
        if half.lane == 0:
            if split == 0 or self.state.lanes == 1:
                joined = Tile(part.data.copy(), part.dtype, part.valid_shape)
            else:
                axis = 0 if split in (1, 3) else 1
                if part.data.ndim != 2:
                    raise TileValueError(f"pl.aic_gather at {site}: split={split} ({_SPLITS[split]}) joins the "
                                         f"lanes' tiles along axis {axis}, but lane 0 gathers a {part.shape} "
                                         "tile; gather 2-D tiles")
                shape = list(part.data.shape)
                shape[axis] *= 2
                joined = Tile(np.zeros(shape, part.data.dtype), part.dtype, part.valid_shape)
                joined.data[tuple(slice(0, n) for n in part.data.shape)] = part.data
            tensor = _fresh(joined) if as_tensor else None
            self._gathers[k] = (joined, part, site, tensor)
            return tensor if as_tensor else joined
        entry = self._gathers.get(k)
        if entry is None:
            raise ProgramError(f"pl.aic_gather at {site}: AIV lane {half.lane} reaches gather #{k + 1} of the "
                               f"pl.split_aiv region '{self.name}', but lane 0 made only {k}; every lane must "
                               "reach every gather (the cube waits for all of them)")
        joined, first, site0, tensor = entry
        both = _join("aic_gather", [first, part], split)
        if both.shape != joined.shape:
            raise TileValueError(f"pl.aic_gather at {site}: AIV lane {half.lane} gathers a {part.shape} tile, but "
                                 f"lane 0 gathered a {first.shape} one at {site0}; both lanes must gather tiles of "
                                 "one shape")
        joined.data[...] = both.data
        joined.valid_shape = tuple(both.valid_shape)
        if tensor is not None:
            store(joined, [0] * joined.data.ndim, tensor)
            return tensor
        return joined

    def finish(self, site: str) -> None:
        """Check, once every lane has run, that the lanes met at every gather."""
        counts = self.state.gather_count
        if len(set(counts)) > 1:
            said = ", ".join(f"lane {i}: {n}" for i, n in enumerate(counts))
            raise ProgramError(f"pl.split_aiv region '{self.name}' at {site}: the lanes made different numbers of "
                               f"pl.aic_gather calls ({said}); every lane must reach every gather (the cube "
                               "waits for all of them), so keep aic_gather out of lane-dependent branches")


def barrier(op_name: str, core_type: str) -> int:
    """Wait until every half of the running core group of ``core_type`` (MIX: all) has reached this barrier.

    Outside a core group the calling code is the only thing running and everything before the call in
    program order has finished: the barrier holds at once.  Returns how many halves took part.
    """
    half = current_half()
    if half is None:
        return 1
    group = half.group
    if getattr(group, "sequential", False):
        raise ProgramError(
            f"{op_name} at {_site()}: a barrier inside a pl.split_aiv region ({half.label}) cannot be met: the "
            "region's lanes run one after the other here. Put the barrier between the phases, outside the region, "
            "as upstream requires for barriers.")
    members = [h for h in group.halves if core_type == "MIX" or h.role == core_type]
    if half not in members:
        raise ProgramError(f"{op_name}(core_type={core_type}) at {_site()}: {half.label} is not one of the cores "
                           f"it synchronizes; call it from the {core_type} side only, or use core_type=MIX")
    state, key = group.state, (half.role, half.lane)
    n = state.barriers[key] = state.barriers.get(key, 0) + 1
    met = state.meetings.setdefault((core_type, n), [])
    met.append(hb_token())

    def missing() -> str:
        late = [h.label + (" (ended)" if h.done else "") for h in members
                if state.barriers.get((h.role, h.lane), 0) < n]
        return f"barrier #{n}: waiting for {', '.join(late)}"

    group.wait_until(half, lambda: all(state.barriers.get((h.role, h.lane), 0) >= n for h in members),
                     Pending(op_name, _site(), missing))
    hb_order(met)  # what every member did before the barrier is done
    return len(members)


def reserve_buffer(*, name: str, size: int, base: int = AUTO) -> Scalar:
    """Reserve a named local buffer of size bytes for cross-core use; return its base address (INT32)."""
    half = _need_half("reserve_buffer", None)
    if not isinstance(name, str) or not name:
        raise TileTypeError(f"pl.reserve_buffer: name={name!r} must be a non-empty string (the peer imports it by "
                            "that name)")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise TileValueError(f"pl.reserve_buffer: size={size!r} must be a positive number of bytes")
    if isinstance(base, bool) or not isinstance(base, (int, np.integer)) or (base < 0 and base != AUTO):
        raise TileValueError(f"pl.reserve_buffer: base={base!r} must be a non-negative address or pl.AUTO")
    state = half.group.state
    lanes = state.buffers.setdefault((half.name, name), {})
    if half.lane in lanes:
        raise TileValueError(f"pl.reserve_buffer at {_site()}: {half.label} reserved buffer '{name}' already; "
                             "reserve each name once per function")
    key = (half.name, half.lane)
    if base == AUTO:
        base = state.next_base.get(key, 0)
    state.next_base[key] = max(state.next_base.get(key, 0),
                               -(-(int(base) + int(size)) // _BUF_ALIGN) * _BUF_ALIGN)
    lanes[half.lane] = (int(size), int(base))
    return Scalar(int(base), dt.INT32)


def import_peer_buffer(*, name: str, peer_func: str) -> Scalar:
    """The base address of the buffer a peer function of the same core group reserved under name (INT32)."""
    half = _need_half("import_peer_buffer", None)
    peer = getattr(peer_func, "name", None) or getattr(peer_func, "__name__", None) or peer_func
    group = half.group
    names = [h.name for h in group.halves]
    if peer not in names or peer == half.name:
        others = ", ".join(f"'{n}'" for n in dict.fromkeys(names) if n != half.name) or "none"
        raise TileValueError(f"pl.import_peer_buffer at {_site()}: peer_func={peer_func!r} is not a peer of "
                             f"{half.label} in this core group (its peers: {others}); name the function that "
                             "calls pl.reserve_buffer")
    peers = [h for h in group.halves if h.name == peer]
    state = group.state
    # Every lane has its own buffer at the same address: a lane's copy will do.
    ready = lambda: (peer, name) in state.buffers or all(h.done for h in peers)  # noqa: E731
    group.wait_until(half, ready, Pending("pl.import_peer_buffer", _site(),
                                          lambda: f"buffer '{name}' of '{peer}': not reserved yet"))
    lanes = state.buffers.get((peer, name))
    if not lanes:
        raise TileValueError(f"pl.import_peer_buffer at {_site()}: '{peer}' finished without reserving a buffer "
                             f"named '{name}'; reserve it there with pl.reserve_buffer(name='{name}', size=...)")
    return Scalar(next(iter(lanes.values()))[1], dt.INT32)


_PIPE_OPS = (tpush_to_aiv, tpush_to_aic, tpop_from_aic, tpop_from_aiv, tfree_to_aic, tfree_to_aiv,
             aic_initialize_pipe, aiv_initialize_pipe)
for _fn in _PIPE_OPS:
    op(_fn.__name__, family=_XFER, reach="system", dtypes=ANY, levels=("tile",))(_fn)
op("aiv_shard", family=_XFER, reach="pl(t)", dtypes=ANY, levels=("tile",))(aiv_shard)
op("aic_gather", family=_XFER, reach="pl(t)", dtypes=ANY, levels=("tile",))(aic_gather)
op("get_subblock_idx", family="Block identity", reach="pl(t)", dtypes=ANY)(get_subblock_idx)


def get_block_idx() -> Scalar:
    """This block's index under ``pl.spmd`` (0 outside); ``pl.get_block_idx`` at tile and tensor level."""
    return context.current().block_idx()


def get_block_num() -> Scalar:
    """The block count of the running ``pl.spmd`` (1 outside); ``pl.get_block_num`` at tile and tensor level."""
    return context.current().block_num()


for _fn in (get_block_idx, get_block_num):
    op(_fn.__name__, family="Block identity", reach="tile", dtypes=ANY)(_fn)


# The core geometry of an a2a3 chip (upstream's runtime platform config: 24 blocks of 1 AIC + 2 AIV).
A2A3_CLUSTERS, AIV_PER_CLUSTER = 24, 2


@op("available_cluster_count", family="Block identity", reach="system", dtypes=ANY, levels=())
def available_cluster_count() -> Scalar:
    """The chip's AIC / cube-and-vector cluster count (24 on a2a3), an INT32 Scalar: a mixed pl.spmd's core_num."""
    return Scalar(A2A3_CLUSTERS, dt.INT32)


@op("available_aiv_count", family="Block identity", reach="system", dtypes=ANY, levels=())
def available_aiv_count() -> Scalar:
    """The chip's standalone AIV count (48 on a2a3), an INT32 Scalar: a vector-only pl.spmd's core_num."""
    return Scalar(A2A3_CLUSTERS * AIV_PER_CLUSTER, dt.INT32)
op("reserve_buffer", family="Data movement", reach="system", dtypes=ANY, levels=("tile",))(reserve_buffer)
op("import_peer_buffer", family="Data movement", reach="system", dtypes=ANY, levels=("tile",))(import_peer_buffer)
