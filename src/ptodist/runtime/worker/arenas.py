"""The window arenas of a worker: the heaps its dispatches' windows live in, and what each dispatch finds there.

One arena is shared by every program, or (``persistent``) each program keeps its own, whose windows keep
their bytes from one dispatch to the next unless ``reset``.  An arena too small for a plan is replaced by a
larger one (the ranks drop the old one with the command that brings the new).
"""

from __future__ import annotations

from ...backends import resources
from .binding import Arena
from .intake import _Dispatch


class _Agreed(Exception):
    """A step's failure every process of an mpi job already agreed on: fail the dispatch with ``error``."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class Arenas:
    """A worker's window arenas: made, grown and zeroed as each dispatch's first segment needs."""

    def __init__(self, binding, world: int, persistent: bool, reset: bool, agree):
        self.binding = binding
        self.world = world
        self.persistent = persistent
        self.reset = reset
        self.agree = agree  # the engine's: in an mpi job, every process's error for a step
        self.by_key: dict = {}  # 0 (shared by every program), or a program's index when persistent
        self.last_on_arena: dict = {}  # per arena the last dispatch that ran on it (whose counters a next one keeps)

    def needs_new(self, d: _Dispatch) -> bool:
        """Whether publishing ``d``'s first segment makes a new window arena (none yet, or one too small)."""
        if d.arena_key is None or d.published:
            return False
        arena = self.by_key.get(d.arena_key)
        return arena is None or arena.stride < d.entry.heap

    def arena_for(self, d: _Dispatch, first: bool) -> Arena:
        """The window heap for ``d``, zeroed as its first segment needs (later segments keep it)."""
        heap = d.entry.heap
        arena = self.by_key.get(d.arena_key)
        if not first:
            return arena
        if self.needs_new(d):
            error = None
            try:
                resources.check_windows(d.compiled.name, d.entry.plan.windows, self.world)
            except Exception as e:  # noqa: BLE001 - raised once the processes agree on it
                error = e
            # In an mpi job a new arena is a collective allocation: every process makes it, or none.
            error = self.agree(error, "windows", f"dispatch {d.handle.number} of '{d.compiled.name}'")
            if error is not None:
                raise _Agreed(error)
            old = arena
            stride = heap if self.persistent else max(heap, 2 * arena.stride if arena else heap)
            arena = self.by_key[d.arena_key] = self.binding.new_arena(stride)
            if old is not None:  # too small: the ranks drop it with this command
                if self.persistent and old.used:
                    # The program's windows keep their layout; the heap grew by the host's chip-task order
                    # signal (a plan with edges after one without): the windows keep their bytes.
                    arena.rows[:, :old.stride] = old.rows
                    arena.used = True
                self.binding.drop_arena(old)
        if self.persistent:
            if arena.used and self.reset:
                arena.rows[:] = 0
            elif arena.used:
                d.carried = self.last_on_arena.get(d.arena_key)
            self.last_on_arena[d.arena_key] = d.handle.number
        else:
            arena.rows[:, :heap] = 0  # windows start zeroed in every dispatch; only the part this plan uses
        order = d.entry.plan.order_signal
        if order is not None:  # its tokens start at zero, whatever a failed dispatch before left in kept windows
            arena.rows[:, order.offset:order.offset + order.nbytes] = 0
        arena.used = True
        return arena

    def drop_all(self) -> None:
        """Drop every arena (the worker closes)."""
        for arena in self.by_key.values():
            self.binding.drop_arena(arena)
        self.by_key.clear()
