"""A rank's collective calls: a kernel's ``pld.tensor.<collective>`` and the host orchestrator's, run on this rank.

Each call is checked once per line and argument objects (its comm domain, signal layout and call site found
then), and runs the collective's algorithm (``collectives.run``) over its windows' comm domain; the notifies,
waits and RMA it is made of are the collective's own, not hand-rolled uses of its windows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .. import _atomics, collectives
from ..collectives import spec as coll_spec
from ..compiler.plan import BuiltinCall, domain_args
from ..errors import ProgramValueError
from ..source import call_site, user_location
from .events import now_ns
from .replay import Replay
from .status import LAST_OP_CODES
from .tensors import WindowTensor

_call_site = _atomics.call_site
KEPT_ENTRIES = 256  # host collectives a rank keeps for the next dispatches of one command


@dataclass
class CollectiveState:
    """What a rank keeps of its collective calls for the dispatch."""

    site: tuple = (None, 0, None)  # while a collective runs: its call site, as _here gives it
    layouts: dict = field(default_factory=dict)  # window buffer id -> the collective layout it serves
    builtins: dict = field(default_factory=dict)  # the host orchestrator's collectives, checked: see _run_builtin
    recording: object = None  # while a host collective's first run is recorded: its replay.Recording
    checked: dict = field(default_factory=dict)  # the kernels' collectives, checked: see collective()
    # The host collectives' entries (see _run_builtin) the same command's earlier dispatches made, by call and
    # scalar arguments (which a call's arguments may be made of): shared with them, replays included.
    carried: dict = field(default_factory=dict)


class CollectiveCalls(Replay):
    """The collective calls of :class:`~ptodist.rank.context.RankContext` (a part of it, with its state in
    ``self._coll``, a :class:`CollectiveState`)."""

    def _run_builtin(self, b: BuiltinCall) -> None:
        """Run a collective the host orchestrator called, as a task of this rank."""
        key = b.key
        entry = self._coll.builtins.get(key)
        if entry is None:
            entry = self._coll.builtins[key] = self._carried(key) or self._check_builtin(b, key)
        call, group, site, _ = entry
        coll_spec.check_hand_rolled(self.hand_signals, call)
        self._mark(LAST_OP_CODES.get(f"pld.tensor.{b.name}", 0), site[0])
        with call_site(b.loc):
            info = [self._tensor_info(role, "inout", t) for role, t in
                    (("source", call.source), ("target", call.target), ("signal", call.signal)) if t is not None] \
                if self.events is not None else None
            self._task_body(b.describe(), lambda: self._builtin_body(entry), kind="collective", where=str(b.loc),
                            info=info)

    def _check_builtin(self, b: BuiltinCall, key) -> list:
        """``[call, comm domain, site entry, replay]`` of a host collective, checked; the replay (rank/replay.py)
        None until recorded, False when it has none."""
        args = tuple(self._materialize(a, None) for a in b.args)
        kwargs = {k: self._materialize(v, None) for k, v in b.kwargs.items()}  # e.g. all_to_all_v's counts
        # It runs over its windows' comm domain: checked against, and run on, that group's ranks.
        group = self._call_group(b.describe(), args, kwargs, b.name, b.loc)
        call = coll_spec.check(b.name, args, kwargs, len(group), str(b.loc), host=True)
        coll_spec.check_layout(self._coll.layouts, call)
        site = self._site_entry((b.loc.file, b.loc.line) if b.loc else None)
        entry = [call, group, site, None if collectives.REGISTRY[b.name].fixed_schedule else False]
        self._carry(key, entry)
        return entry

    def _carried(self, key) -> list | None:
        """The entry of host collective ``key`` an earlier dispatch of the same command made with these scalar
        arguments (its checks passed with the same arguments; its replay, once recorded, addresses the same
        memory), its layout registered in this dispatch; None when there is none."""
        try:
            entry = self._coll.carried.get((key, self.scalars))
        except TypeError:  # a scalar argument that is not hashable: nothing kept for it
            return None
        if entry is not None:
            coll_spec.check_layout(self._coll.layouts, entry[0])
        return entry

    def _carry(self, key, entry: list) -> None:
        """Share ``entry`` with the next dispatches of this command."""
        carried = self._coll.carried
        if len(carried) >= KEPT_ENTRIES:  # a scalar that changes every dispatch (a step counter): start afresh
            carried.clear()
        try:
            carried[(key, self.scalars)] = entry
        except TypeError:
            pass

    def _builtin_body(self, entry: list) -> None:
        """Run a host orchestrator's collective: its replay once recorded, where a record is kept and may be
        replayed (no event log, no access checker watching); see rank/replay.py."""
        call, group, site, replay = entry
        if replay is False or self.events is not None or self.checking:
            self._run_collective(call, group, True, site)
        elif replay is None:
            entry[3] = self._recorded(call, group, site)
        else:
            self._run_collective(call, group, True, site, replay)

    def collective(self, name, args, kwargs):
        if not self._kernel_depth and (self._open_actors or not self.graph.idle):
            self._await_all()  # a collective of the orchestration runs after the tasks submitted before it
        # A call checked once is not checked again: per line, collective and argument objects, the checked call,
        # its comm domain and its line's site entry (a collective in a loop pays for its checks once).
        here = _call_site(self._call_sites, 1)  # collective <- pld.tensor.<name> <- the program
        if type(here) is not tuple:
            here = self._site_at(here, 1)
        key = _collective_key(name, here, args, kwargs)
        entry = self._coll.checked.get(key) if key is not None else None
        if entry is None:
            entry = self._check_collective(name, args, kwargs)
            if key is not None:
                if len(self._coll.checked) >= 1024:  # views made per call never hit again: let them go
                    self._coll.checked.clear()
                self._coll.checked[key] = entry
        call, group, site = entry[:3]
        coll_spec.check_hand_rolled(self.hand_signals, call)
        self._mark(LAST_OP_CODES.get(f"pld.tensor.{name}", 0), site[0])
        if self.events is None:
            return self._run_collective(call, group, False, site)
        # A slice around the collective, opened before the notifies, waits and RMA it is made of.
        t = call.target
        rec = self._log("collective", f"pld.tensor.{name}", now_ns(), target=t.buffer.name if t is not None else None,
                        signal=call.signal.buffer.name, bytes=int(t.array.nbytes) if t is not None else 0)
        try:
            return self._run_collective(call, group, False, site)
        finally:
            rec["end"] = now_ns()

    def _check_collective(self, name, args, kwargs) -> tuple:
        """``(call, comm domain, site entry, args)`` of a kernel's collective, checked (``args``: kept, so that
        their ids stay theirs while the entry is cached)."""
        loc = user_location(2)
        group = self._call_group(f"pld.tensor.{name}", args, kwargs, name, loc)
        call = coll_spec.check(name, args, kwargs, len(group), str(loc), host=False)
        coll_spec.check_layout(self._coll.layouts, call)
        return call, group, self._site_entry((loc.file, loc.line) if loc is not None else None), args

    def _run_collective(self, call, group: tuple, host: bool, site: tuple, replay=None):
        # Signal operations inside a collective are its own, not hand-rolled uses of the window.
        # It runs over the comm domain of its windows: this rank's group rank among the group's ranks.
        # Its notifies are attributed to the program's line that called it (``site``: that line's site entry; for a
        # host collective, the host's line), known here once rather than found per notify.
        outer = self._coll.site
        if not self._in_collective:
            self._coll.site = site
        self._in_collective += 1
        try:
            if replay is not None:  # its recorded operations, in one native call
                self._replayed(replay)
                return call.signal if call.target is None else call.target
            return collectives.run(call, group.index(self.rank), len(group), host=host)
        finally:
            self._in_collective -= 1
            self._coll.site = outer

    def _call_group(self, op: str, args, kwargs, name: str, loc) -> tuple:
        """The comm domain a collective runs over: that of its target and signal windows, which must agree.

        The input of allgather / all_to_all / all_to_all_v (and all_to_all_v's send_counts) is read on this rank
        only, and need not share it.
        """
        windows = [a for a in domain_args(name, args, kwargs) if isinstance(a, WindowTensor)]
        if not windows:
            return tuple(range(self.world))
        group = windows[0].group
        for w in windows:
            if w.group != group:
                raise ProgramValueError(
                    f"{op} at {loc}: {w.describe()} lives on ranks {w.group_text()} but "
                    f"{windows[0].describe()} on ranks {windows[0].group_text()}: a collective runs over one comm "
                    "domain, so its target and signal windows must be dispatched to the same ranks.")
        if self.rank not in group:
            raise ProgramValueError(self._outside_group_text(op, windows[0].describe(), group, loc))
        return group

    def _outside_group_text(self, op: str, what: str, group, loc=None) -> str:
        """The message for a window used on a rank outside its comm domain."""
        ranks = "{" + ", ".join(map(str, group)) + "}"
        return (f"{op} at {loc if loc is not None else user_location(2)}: {what} belongs to the comm domain of ranks "
                f"{ranks}, but rank {self.rank} is not in it. A window buffer lives on the ranks the host "
                "dispatched its windows to (device=r); dispatch it to this rank too, or use a window of this "
                "rank's domain.")

    def _hand_rolled(self, w: WindowTensor) -> None:
        """Remember a signal window used by the program's own notify/wait (not a collective's)."""
        if not self._in_collective and w.buffer.id not in self.hand_signals:
            self.hand_signals[w.buffer.id] = (tuple(w.shape), str(user_location(2)))


def _collective_key(name: str, here, args, kwargs) -> tuple | None:
    """What makes two calls of a kernel's collective the same checked call: its line, name, argument objects and
    options; None for a call not to be cached (no program line found; an option other than a plain constant, such
    as all_to_all_v's counts, which are data)."""
    if here is None:
        return None
    options = tuple(kwargs.items())
    for _, v in options:
        if not (v is None or type(v) in (int, str, bool) or isinstance(v, enum.Enum)):
            return None
    return (here[0], name, *map(id, args), *options)
