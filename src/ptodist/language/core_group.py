"""Running a mixed kernel: one cube half (AIC) and its vector lanes (AIV), concurrently, on the CPU.

Each half runs in its own thread, but only one at a time: a half runs until a pipe op must wait (a
full ring, an empty one, a peer's buffer not yet reserved) or until it ends, and then hands the turn
to the next half that can go on.  The run is thus deterministic, the rank's context sees one caller at
a time, and a producer that pushes more tiles than the ring holds simply waits for the consumer.  When
no half can go on, the kernel has deadlocked: :class:`CoreGroup` raises an error naming what each half
waits in.

A ``pl.FunctionType.Group`` function calls its AIC and AIV functions one after the other; they must run
together, so while a group function runs those calls are collected (:func:`collecting`,
:func:`defer_half`) and run as one :class:`CoreGroup` when it returns (:func:`kernel_body`).
"""

from __future__ import annotations

import threading

from .. import context
from ..errors import KernelDeadlockError, KernelValueError, ProgramError
from . import mixed
from .halves import GroupState, Half, Pending, enter_half

LANES = 2  # AIV lanes per cube on Ascend A2/A3 (the 1:2 core group)
_SPLIT_CODES = {"NONE": 0, "UP_DOWN": 1, "LEFT_RIGHT": 2}


class _Abort(BaseException):
    """Unwinds a half when its group stops (another half failed, or the group deadlocked)."""


def _split_code(split) -> int | None:
    if split is None or isinstance(split, int):
        return split
    name = getattr(split, "name", None) or getattr(split, "value", None) or str(split)
    code = _SPLIT_CODES.get(str(name).upper())
    if code is None:
        raise ProgramError(f"core group split={split!r}: use pl.SplitMode.NONE, UP_DOWN or LEFT_RIGHT (or 0, 1, 2)")
    return code


def _name(fn) -> str:
    return getattr(fn, "name", None) or getattr(fn, "__name__", None) or repr(fn)


def _invoke(fn, args, kwargs):
    invoke = getattr(fn, "invoke", None)  # a program Function: run its body (its dynamic dims in scope)
    return invoke(*args, **kwargs) if invoke is not None else fn(*args, **kwargs)


class CoreGroup:
    """One run of a mixed kernel: an AIC function and an AIV function run on ``lanes`` lanes."""

    def __init__(self, name: str, aic=None, aiv=None, *, lanes: int = LANES, split=None, slot_num: int | None = None):
        """``aic``/``aiv``: ``(function, args, kwargs)`` or None; ``split``: the split region's mode, if any;
        ``slot_num``: the ring depth of a pipe set up without one.  Both default to those of the enclosing
        ``pl.at(..., optimizations=[pl.split(mode), pl.cross_core_slot(slot_num=n)])`` region."""
        if lanes < 1:
            raise ProgramError(f"core group '{name}': lanes={lanes}; a core group has at least one AIV lane")
        self.name = name
        region = mixed.current_options()
        self.state = GroupState(lanes, _split_code(region.get("split") if split is None else split),
                                region.get("slot_num") if slot_num is None else slot_num)
        self.halves: list[Half] = []
        self._work: dict[int, tuple] = {}
        if aic is not None:
            self._add(Half(self, "AIC", 0, _name(aic[0])), aic)
        if aiv is not None:
            for lane in range(lanes):
                self._add(Half(self, "AIV", lane, _name(aiv[0])), aiv)
        self._cond = threading.Condition()
        self._turn: Half | None = None
        self._abort = False
        self._error: BaseException | None = None
        self.results: dict[int, object] = {}
        # Under ptodist check each half is an actor of its own (concurrent on a device, ordered only by its
        # pipes and barriers): the context's hooks, and the actor of each half by its id.
        self._ctx = None
        self._actors: dict[int, int] | None = None

    def _add(self, half: Half, work) -> None:
        fn, args, kwargs = (tuple(work) + ((), {}))[:3]
        self._work[id(half)] = (fn, tuple(args), dict(kwargs or {}))
        self.halves.append(half)

    # -- running --------------------------------------------------------------------------------------
    def run(self) -> tuple:
        """Run every half to its end; return ``(AIC result, [AIV lane results])``; raise what went wrong."""
        ctx = context.current()
        fork = getattr(ctx, "hb_halves", None)
        forked = fork([h.label for h in self.halves]) if fork is not None else None
        if forked is not None:
            self._ctx, (parent, actors) = ctx, forked
            self._actors = {id(h): a for h, a in zip(self.halves, actors)}
        threads = [threading.Thread(target=self._main, args=(h, ctx), daemon=True,
                                    name=f"ptodist-{self.name}-{h.role}{h.lane}") for h in self.halves]
        with self._cond:
            self._turn = self.halves[0] if self.halves else None
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if forked is not None:
            ctx.hb_rejoin(parent, actors)  # the kernel is complete when all its halves are
        if self._error is not None:
            raise self._error
        problem = self.state.leftovers()
        if problem is not None:
            raise KernelValueError(f"mixed kernel '{self.name}': {problem}")
        aic = next((self.results.get(id(h)) for h in self.halves if h.role == "AIC"), None)
        return aic, [self.results.get(id(h)) for h in self.halves if h.role == "AIV"]

    def _main(self, half: Half, ctx) -> None:
        fn, args, kwargs = self._work[id(half)]
        with context.using(ctx):
            enter_half(half)
            try:
                with self._cond:
                    while self._turn is not half and not self._abort:
                        self._cond.wait()
                    if self._abort:
                        return
                self._acting(half)
                self.results[id(half)] = _invoke(fn, args, kwargs)
            except _Abort:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the thread that runs the group
                with self._cond:
                    if self._error is None:
                        self._error = e
                    self._abort = True
                    self._cond.notify_all()
            finally:
                enter_half(None)
                with self._cond:
                    half.done = True
                    if not self._abort and self._turn is half:
                        self._hand_on(half)
                    self._cond.notify_all()

    def _acting(self, half: Half) -> None:
        """Under ptodist check: what the context records from now on is ``half``'s (it has the turn)."""
        if self._actors is not None:
            self._ctx.hb_act(self._actors[id(half)])

    def _runnable(self, h: Half) -> bool:
        return not h.done and (h.pending is None or h.ready())

    def _hand_on(self, half: Half) -> bool:
        """Give the turn to the next half (after ``half``) that can go on; False when none can (under the lock)."""
        n = len(self.halves)
        start = self.halves.index(half)
        for k in range(1, n + 1):
            h = self.halves[(start + k) % n]
            if h is not half and self._runnable(h):
                self._turn = h
                self._cond.notify_all()
                return True
        if any(not h.done for h in self.halves if h is not half) or (not half.done and half.pending is not None):
            self._error = self._deadlock()
            self._abort = True
        self._turn = None
        self._cond.notify_all()
        return False

    def wait_until(self, half: Half, ready, pending: Pending) -> None:
        """Block ``half`` (the running one) until ``ready()``; the other halves run meanwhile."""
        with self._cond:
            if ready():
                return
            half.pending, half.ready = pending, ready
            try:
                while True:
                    if self._abort:
                        raise _Abort
                    if ready() and self._turn is half:
                        self._acting(half)
                        return
                    if self._turn is half and not self._hand_on(half):
                        raise _Abort
                    while self._turn is not half and not self._abort:
                        self._cond.wait()
            finally:
                half.pending, half.ready = None, None

    # -- reports --------------------------------------------------------------------------------------
    def _deadlock(self) -> KernelDeadlockError:
        """The error for a kernel whose halves wait for one another: the message says what each half waits in;
        ``locations`` and ``fix`` name the line that causes it (a pop never freed, a push the pops do not match)."""
        blocked = [h for h in self.halves if not h.done and h.pending is not None]
        # A pop whose producers have all ended waits for a tile that was never pushed.
        for h in blocked:
            p = h.pending
            producers = [x for x in self.halves if x.role != h.role]
            if p.pop and producers and all(x.done for x in producers):
                pipe = p.pipe
                who = " and ".join(dict.fromkeys(x.label for x in producers))
                return _deadlock_error(
                    f"mixed kernel '{self.name}': {p.op} at {p.site} on {h.label} pops a tile that was never pushed: "
                    f"{pipe.desc} is empty and {who} ended after {pipe.pushes} push(es) on it. Push one more tile "
                    "on the producer side, or remove this pop.", [p.site],
                    f"Match the pushes to the pops: {who} pushed {pipe.pushes} tile(s) on {pipe.desc}, and {p.op} at "
                    f"{p.site} pops one more. Push once per pop (a push and its pop in loops of the same trip "
                    "count), or remove this pop.")
        for h in blocked:
            cause = self._full_ring(h)
            if cause is not None:
                locations, fix = cause
                return _deadlock_error(self._deadlock_text(), locations, fix)
        return _deadlock_error(
            self._deadlock_text(), [h.pending.site for h in blocked],
            "Make every push meet a pop on the other side, free every popped tile before the producer needs its "
            "slot again (a producer runs at most slot_num tiles ahead of its consumer), and have every lane reach "
            "each pl.system.syncall.")

    def _deadlock_text(self) -> str:
        lines = []
        for h in self.halves:
            if h.done:
                lines.append(f"{h.label} has ended")
            elif h.pending is not None:
                lines.append(f"{h.label} waits in {h.pending.op} at {h.pending.site} ({h.pending.what()})")
            else:
                lines.append(f"{h.label} has not started")
        return (f"mixed kernel '{self.name}' deadlocked: no half can go on. " + "; ".join(lines) + ". Every push "
                "needs a pop on the other side, every popped tile a tfree before the producer needs its slot again; "
                "a producer may run at most slot_num tiles ahead of its consumer.")

    def _full_ring(self, h: Half) -> tuple[list[str], str] | None:
        """Why the push ``h`` waits in finds its ring full, as ``(locations, fix)``: popped tiles never freed, or
        more pushes than the consumer pops (None when ``h`` waits in something else)."""
        p = h.pending
        pipe = p.pipe
        if p.pop or pipe is None:
            return None
        depth = self.state.depth(pipe.id)
        c2v = pipe.direction == "C2V"
        pop, free = ("pl.tpop_from_aic", "pl.tfree_to_aic") if c2v else ("pl.tpop_from_aiv", "pl.tfree_to_aiv")
        lanes = range(len(pipe.rings)) if c2v else [h.lane]
        lane = next((i for i in lanes if pipe.rings[i].taken >= depth), None)
        if lane is None:
            return None
        ring = pipe.rings[lane]
        consumer = next((x for x in self.halves if x.role != h.role and (not c2v or x.lane == lane)), None)
        if ring.held:
            pop_site = ring.held[0][1]
            return [pop_site, p.site], (
                f"Free each popped tile once it is consumed: call {free}(tile) after the {pop} at {pop_site}, in "
                f"the same loop iteration, so that the {p.op} at {p.site} finds a free slot ({pipe.desc} has "
                f"{depth} slots: a producer runs at most {depth} tiles ahead of its consumer).")
        state = "ended" if consumer is None or consumer.done else f"waits in {consumer.pending.op} at " \
            f"{consumer.pending.site}" if consumer.pending is not None else "has not started"
        pops = pipe.pushes - len(ring.ready) if c2v else None
        popped = f" after {pops} pop(s)" if pops is not None else ""
        who = consumer.label if consumer is not None else "the consumer"
        return [p.site], (
            f"Match the pushes to the pops: the {p.op} at {p.site} runs more often than {who} pops ({state}"
            f"{popped}, {len(ring.ready)} pushed tile(s) unpopped). Push once per tile the consumer pops: a push "
            "inside a loop whose pop is outside it pushes every iteration (move it after the loop), or pop in a "
            "loop of the same trip count.")


def _deadlock_error(message: str, locations: list[str], fix: str) -> KernelDeadlockError:
    error = KernelDeadlockError(message)
    error.locations = [loc for loc in dict.fromkeys(locations) if loc]
    error.fix = fix
    return error


def run_core_group(aic, aiv, *args, lanes: int = LANES, split=None, name: str | None = None, **kwargs) -> tuple:
    """Run ``aic(*args)`` and ``aiv(*args)`` (on ``lanes`` lanes) as one mixed kernel; return their results.

    Either function may be None.  ``split`` (0/1/2 or a SplitMode name) is the split mode ``pl.aiv_shard``
    and ``pl.aic_gather`` use.  Returns ``(AIC result, [AIV lane results])``.
    """
    group = CoreGroup(name or _name(aic if aic is not None else aiv),
                      None if aic is None else (aic, args, kwargs), None if aiv is None else (aiv, args, kwargs),
                      lanes=lanes, split=split)
    return group.run()


# -- a pl.FunctionType.Group function -----------------------------------------------------------------------
_collecting = threading.local()


def _type_of(fn) -> str | None:
    t = getattr(fn, "options", {}).get("type")
    return getattr(t, "value", t)


def _attr_split(fn):
    """The split mode a function declares (``@pl.function(..., attrs={"split": pl.SplitMode.X})``), or None."""
    attrs = getattr(fn, "options", {}).get("attrs") or {}
    return attrs.get("split") if isinstance(attrs, dict) else None


def is_group(fn) -> bool:
    """Is ``fn`` a ``pl.FunctionType.Group`` function (its AIC and AIV functions run together)?"""
    return _type_of(fn) == "Group"


def collecting(fn) -> bool:
    """Is ``fn`` an AIC or AIV function called by a running group function (to run with its peers)?"""
    return getattr(_collecting, "calls", None) is not None and _type_of(fn) in ("AIC", "AIV")


class _Result:
    """What a collected AIC/AIV call returns until its group has run: replaced by that function's result."""

    def __init__(self, role: str, name: str):
        self.role, self.name = role, name

    def __repr__(self) -> str:
        return f"<result of {self.role} function '{self.name}', known once its core group has run>"


def defer_half(fn, args, kwargs) -> _Result:
    """Collect the call of AIC/AIV function ``fn`` by the running group function."""
    calls = _collecting.calls
    role = _type_of(fn)
    first = next((w[0].name for r, w, _ in calls if r == role), None)
    if first is not None:
        raise ProgramError(f"a group function calls two {role} functions ('{first}' and '{fn.name}'); a core "
                           "group runs one AIC and one AIV function: merge them, or use two group functions")
    values = fn.bind_arguments(args, kwargs)
    calls.append((role, (fn, tuple(values), {}), None))
    return _Result(role, fn.name)


def _resolve(v, aic, aiv0):
    if isinstance(v, _Result):
        return aic if v.role == "AIC" else aiv0
    if isinstance(v, tuple):
        return tuple(_resolve(x, aic, aiv0) for x in v)
    return v


def kernel_body(fn, values: list, lanes: int = LANES):
    """What running kernel ``fn`` means: its body; for a group function, its collected halves run together."""
    if not is_group(fn):
        return lambda: fn.invoke(*values)

    def run_group():
        outer = getattr(_collecting, "calls", None)
        _collecting.calls = calls = []
        try:
            result = fn.invoke(*values)
        finally:
            _collecting.calls = outer
        work = {role: w for role, w, _ in calls}
        if not work:
            return result
        split = _attr_split(fn)
        for w in work.values():
            split = _attr_split(w[0]) if split is None else split
        aic, aiv = CoreGroup(fn.name, work.get("AIC"), work.get("AIV"), lanes=lanes, split=split).run()
        return _resolve(result, aic, aiv[0] if aiv else None)

    return run_group


# -- with pl.cluster(): ------------------------------------------------------------------------------------
class _Cluster:
    """``with pl.cluster():``: the AIC and AIV functions called in the block run together as one core group."""

    def __enter__(self):
        self._outer = getattr(_collecting, "calls", None)
        if self._outer is None:  # inside a group function the group's own collection goes on
            _collecting.calls = self._calls = []
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._outer is not None:
            return False
        _collecting.calls = None
        work = {role: w for role, w, _ in self._calls}
        if exc_type is not None or not work:  # nothing to pair: SPMD or mixed InCore kernels ran as called
            return False
        name = "+".join(w[0].name for w in work.values())
        split = next((_attr_split(w[0]) for w in work.values() if _attr_split(w[0]) is not None), None)
        touched = [v for w in work.values() for v in w[1]]  # the task's arguments: its dependencies
        mixed.run_as_task(f"cluster:{name}",
                          lambda: CoreGroup(name, work.get("AIC"), work.get("AIV"), split=split).run(), touched)
        return False


def cluster() -> _Cluster:
    """Co-schedule the AIC and AIV functions called in the ``with`` block as one core group (one task)."""
    return _Cluster()
