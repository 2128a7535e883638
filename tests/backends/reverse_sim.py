"""A backend the test suite registers: the sim backend with another scheduler, ranks taking turns in reverse order.

It is what a new backend is: this one file, and one ``backends.register(...)`` line (tests/backends/test_registry.py).
"""

from __future__ import annotations

from ptodist.backends.sim import Scheduler, SimBackend


class ReverseTurns(Scheduler):
    """At every operation the next lower rank that can run goes on (after rank 0, the highest that can).

    The seed plays no part: every run of a program takes the same turns.  ``made`` counts the schedulers made,
    so a test can tell that this backend, not the built-in sim, ran a dispatch.
    """

    made = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        type(self).made += 1

    def _seeded(self, cands: list[int]) -> int:
        last = self.world if self.running is None else self.running
        lower = [r for r in cands if r < last]
        return max(lower) if lower else max(cands)


class ReverseSimBackend(SimBackend):
    """The sim backend whose ranks take turns in reverse order (:class:`ReverseTurns`)."""

    name = "sim-reverse"
    scheduler = ReverseTurns
