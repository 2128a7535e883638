"""Accepting a dispatch: the checks before it, binding its arguments and planning it (``_Dispatch``).

All of it runs in the caller's thread, before the dispatch is queued (``Engine.accept``), and all of it
can fail: a dispatch that fails here was never accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import backends, dfx
from ...backends.base import died
from ...compiler.state import stale_message, state_of
from ...config import RunConfig
from ...errors import ConfigError, DispatchStateError, DispatchValueError, RankError
from ...language.types import Direction
from ..program import note_dispatch
from .binding import Arena, _Bound
from .handles import RunHandle
from .plans import Planner, _PlanEntry


@dataclass(eq=False)
class _Dispatch:
    handle: RunHandle
    compiled: object
    entry: _PlanEntry
    args: list
    values: list
    config: RunConfig
    dfx: object
    arena_key: int | None
    cursor: int = 0
    published: bool = False
    arena: Arena | None = None
    residents: set = field(default_factory=set)  # serials of the resident files it uses
    carried: int | None = None  # persistent windows not zeroed: the dispatch whose windows it starts from


class Intake:
    """Makes a queued dispatch of a call: the state the ranks started with, the bound arguments, the plan."""

    def __init__(self, engine, programs: list, callbacks: dict, persistent: bool, group):
        self.engine = engine
        encode = None if group.in_process else (lambda plan, bounds: group.encode_plan((plan, bounds)))
        self.planner = Planner(callbacks, persistent, encode or (lambda plan, bounds: None))
        self.last_bound: dict = {}   # program index -> _Bound of its last dispatch
        # What the programs' code reads, as the ranks were started with it: a dispatch runs only while the
        # driver's state is the same (compiler.state).
        self.program_state = state_of([f for c in programs for f in (c.host, *c.extra_functions)])
        self.started_with = self.program_state.stamp()

    def check_ranks(self) -> None:
        """With nothing in flight: raise RankError when a rank died while the worker was idle."""
        engine = self.engine
        dead = engine.group.reap() if not engine.queue else []
        if dead:
            engine.group.kill()
            notes = engine.group.death_notes
            engine.broken = (f"rank {dead[0].rank} (device {dead[0].device_id}) died while the worker was idle "
                             f"({notes[dead[0].rank]})")
            for f in dead:
                f.task = None  # its status row still names the last task of an earlier dispatch
                f.message = (died(notes[f.rank], ", while the worker was idle between dispatches")
                             + "; the worker stopped its other ranks. Close it and prepare a new one.")
            raise RankError(dead)

    def stale(self) -> list[str]:
        """What of the Python state the programs read is no longer what the ranks were started with."""
        state = self.program_state
        if state.unchanged(self.started_with):  # the quick check, every dispatch
            return []
        now = state.stamp()
        changed = self.started_with.changed(now)
        if not changed:  # values rebound to equal ones: the ranks hold equal values; check against these now
            self.started_with = now
        return changed

    def check_state(self, compiled) -> None:
        """Raise DispatchStateError when the Python state the programs read is no longer what the ranks
        were started with."""
        changed = self.stale()
        if changed:
            raise DispatchStateError(stale_message(self.program_state, changed, compiled.name))

    def prepare(self, worker, index: int, compiled, args: tuple, config: RunConfig | None) -> _Dispatch:
        """Bind ``args`` and plan the dispatch: all of accepting it that can fail (numbers are taken after)."""
        engine = self.engine
        self.check_ranks()
        self.check_state(compiled)  # before planning: a plan made under other values would be kept
        cfg = config or engine.config
        if config is not None:
            if config.distributed_config is not None and list(config.distributed_config.device_ids) != \
                    engine.device_ids:
                raise DispatchValueError(f"{compiled.name}: called with device_ids "
                                         f"{config.distributed_config.device_ids} but the worker runs on "
                                         f"{engine.device_ids}; prepare another worker for other devices")
            name = backends.name_for(config)
            if name != engine.backend:
                raise ConfigError(f"{compiled.name}: this dispatch's config selects the '{name}' backend, but the "
                                  f"worker's ranks run on '{engine.backend}'; a worker keeps the backend it was "
                                  "prepared on. Prepare another worker with that config.")
        with engine.state:  # binding registers memory the engine thread also reads
            last = self.last_bound.get(index) if config is None else None
            if last is not None and last.matches(args, engine.binding):
                values, hosts, entry = last.values, last.hosts, last.entry  # the same arguments as last time
            elif last is not None and last.same_layout(args):
                # New tensors laid out as last time's (and outputs made like its): bound anew (memory, staging),
                # checked and planned as those.
                values, entry = last.values, last.entry
                hosts = self._rebind(compiled, args, last)
                last = self.last_bound[index] = _Bound.of(args, values, _kept(compiled, hosts, last.created), entry,
                                                          last.created)
            else:
                note_dispatch(compiled, engine.backend)
                values, hosts, created = compiled.bind(args, adapt=lambda v, n: engine.binding.adapt(v, n, compiled),
                                                       new_output=engine.binding.new_output)
                entry = self.planner.plan_for(index, compiled, values, hosts)
                self.planner.check_args(compiled, entry, hosts)
                last = self.last_bound[index] = _Bound.of(args, values, _kept(compiled, hosts, created), entry, created)
            residents = last.residents if last is not None else None
            if residents is None:
                residents = {h.resident._file.serial for h in hosts if h is not None and h.resident is not None}
                if last is not None:
                    last.residents = residents
            arena_key = None
            if entry.heap:
                arena_key = index if engine.persistent else 0
                if engine.persistent:
                    self.planner.check_layout(index, compiled, entry)
            on = cfg.with_dfx_setting()  # what PTODIST_DFX (ptodist run --dfx) adds to the config's own outputs
            request = dfx.request_for(on, lambda: compiled.output_dir, -1, job=engine.job) \
                if on.enable_chip_swimlane or on.enable_dep_gen or on.enable_scope_stats else None
            if any(t.index >= len(hosts) for t in entry.plan.host_tensors):
                # pl.create_tensor in the host: fresh zeroed intermediates, after every parameter (scalars too)
                hosts = hosts + self._intermediates(compiled, entry, len(hosts))
            handle = RunHandle(worker, compiled.name, -1)
            return _Dispatch(handle, compiled, entry, hosts, values, cfg, request, arena_key, residents=residents)

    def _rebind(self, compiled, args: tuple, last) -> list:
        """The hosts of ``args``, laid out as ``last``'s: each tensor adapted, each output made as last time."""
        binding, hosts, it = self.engine.binding, [], iter(args)
        for p, h in zip(compiled.host.params, last.hosts):
            if last.created and p.direction is Direction.OUT:
                value = binding.new_output(p, h.shape, h.is_torch)
            else:
                value = next(it)
                if h is None:
                    hosts.append(None)
                    continue
            hosts.append(binding.adapt(value, p.name, compiled))
        return hosts

    def _intermediates(self, compiled, entry, first: int) -> list:
        """The host intermediates of a dispatch (``pl.create_tensor`` in the host): zeroed, bound like arguments."""
        out = []
        for spec in sorted(entry.plan.host_tensors, key=lambda t: t.index):
            if spec.index >= first:
                value = self.engine.binding.new_intermediate(spec.shape, spec.dtype)
                out.append(self.engine.binding.adapt(value, spec.name, compiled))
        return out


class _Made:
    """An output the inputs-only form made, as the next dispatch's binding remembers it: how to make the next one
    (the output itself is the caller's, not kept alive by the worker)."""

    __slots__ = ("shape", "is_torch", "kind", "resident")

    def __init__(self, h):
        self.shape, self.is_torch, self.kind, self.resident = h.shape, h.is_torch, "made", None


def _kept(compiled, hosts: list, created: bool) -> list:
    """``hosts`` as a dispatch's binding keeps them: in the inputs-only form, the outputs made as ``_Made``."""
    if not created:
        return hosts
    return [_Made(h) if p.direction is Direction.OUT else h for p, h in zip(compiled.host.params, hosts)] + \
        hosts[len(compiled.host.params):]
