"""A rank's TaskGraph schedules in time linear in its tasks, whatever the shape, with the same semantics.

The graph runs here under a stand-in for the rank context: a deferred wait is a name for a cell of one
signal buffer (a numpy array), and it holds once its cell is 1: when the test says so, or when the rank
blocks and a peer's notify arrives (the oldest pending wait's, unless the test gives the peer an order).
Work is counted, not timed: the lines of ``rank/tasks.py`` and ``rank/deferred.py`` the graph executes, a
deterministic measure that a quadratic rescan of the pending tasks exceeds within a few hundred tasks.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest

from ptodist.rank import deferred as deferred_mod
from ptodist.rank import tasks as tasks_mod
from ptodist.rank.tasks import Task, TaskGraph, overlap

N = 2000
MANY = 10_000  # deferred waits pending at once, satisfied one at a time
ROW = 64
LINES_PER_TASK = 250  # the shapes below take 35 to 150


class Rank:
    """The graph's owner: ``condition_holds`` polls a condition, ``watched`` names its cell,
    ``block_until_any`` waits until some pending condition holds (a peer notifies while the rank blocks)."""

    def __init__(self):
        self.cells = np.zeros(1 << 15, np.int32)  # the signal buffer (id 0); a condition holds once its cell is 1
        self.index: dict = {}  # condition -> its cell
        self.blocked_on: list = []  # per block (a call that found nothing holding): what held when it returned
        self.peers = True  # a wait not yet satisfied is satisfied while the rank blocks (False: it hangs)
        self.order: list | None = None  # the conditions the peer satisfies, one per block (None: the oldest)

    def cell(self, cond) -> int:
        i = self.index.get(cond)
        if i is None:
            i = self.index[cond] = len(self.index)
        return i

    def hold(self, *conds) -> None:
        for c in conds:
            self.cells[self.cell(c)] = 1

    def condition_holds(self, cond) -> bool:
        return bool(self.cells[self.cell(cond)])

    def watched(self, cond):
        return 0, self.cell(cond), 1, True

    def block_until_any(self, pending) -> list:
        held = pending.holding(lambda buffer_id: self.cells)
        if held:
            return held  # something holds already: no block
        while not held:
            assert self.peers, f"the rank hangs in a wait for {[d.cond for d in pending.oldest(4)]!r}"
            self.hold(self.order.pop() if self.order else pending.oldest(1)[0].cond)
            held = pending.holding(lambda buffer_id: self.cells)
        self.blocked_on.append([d.cond for d in held])
        return held


class Program:
    """Submits tasks to a TaskGraph and records the order they ran in."""

    def __init__(self):
        self.rank = Rank()
        self.graph = TaskGraph(self.rank)
        self.ran: list[int] = []
        self.next_tid = 0

    def task(self, deps=(), rows=(), ranges=(), manual=False, conds=(), on_run=None) -> bool:
        tid = self.next_tid
        self.next_tid += 1

        def run():
            self.ran.append(tid)
            if on_run is not None:
                on_run(tid)
            return list(conds)

        buffers = frozenset([*((r * ROW, (r + 1) * ROW) for r in rows), *ranges])
        return self.graph.submit(Task(tid, f"t{tid}", run, list(deps), buffers, manual))


def _shape(p: Program, shape: str, n: int) -> None:
    whole = (0, ROW * (n + 2))
    if shape == "behind a deferred task (deps)":
        p.task(conds=["c"])
        for _ in range(n):
            p.task(deps=[0])
    elif shape == "behind a deferred task (tensor)":
        p.task(ranges=[whole], conds=["c"])
        for i in range(n):
            p.task(rows=[i])
    elif shape == "chain (deps)":
        p.task(conds=["c"])
        for i in range(n):
            p.task(deps=[i])
    elif shape == "chain (tensor)":
        p.task(rows=[0], conds=["c"])
        for i in range(n):
            p.task(ranges=[(i * ROW, (i + 2) * ROW)])
    elif shape == "fan-out":
        p.task(ranges=[whole], conds=["c"])
        for i in range(n):
            p.task(deps=[0], rows=[i])
    elif shape == "fan-in":
        p.task(conds=["c"])
        for i in range(n):
            p.task(deps=[0], rows=[i])
        p.task(deps=list(range(1, n + 1)), ranges=[whole])
    elif shape == "one tensor":
        p.task(ranges=[whole], conds=["c"])
        for _ in range(n):
            p.task(ranges=[whole])
    elif shape == "independent of the deferred task":
        p.task(rows=[0], conds=["c"])
        for i in range(1, n + 1):
            assert p.task(rows=[i])
    elif shape == "deferred tasks nothing waits for":
        for i in range(n):
            p.task(rows=[i], conds=[f"c{i}"])
    p.graph.wait_for()


SHAPES = ["behind a deferred task (deps)", "behind a deferred task (tensor)", "chain (deps)", "chain (tensor)",
          "fan-out", "fan-in", "one tensor", "independent of the deferred task", "deferred tasks nothing waits for"]


def _many_pending(p: Program, n: int, dependants: str) -> None:
    """``n`` tasks whose deferred waits are all pending at once, each with a dependant (``deps``: it names the
    task; ``tensor``: it shares the task's row) or none; then the rank waits for all of them."""
    for i in range(n):
        p.task(rows=[i], conds=[f"c{i}"])
        if dependants != "none":
            p.task(deps=[2 * i] if dependants == "deps" else (), rows=[i] if dependants == "tensor" else ())
    p.graph.wait_for()


class _OverBudget(Exception):
    pass


def _count_lines(fn, budget: int) -> int:
    """Run ``fn()`` and return how many lines of rank/tasks.py and rank/deferred.py it executed; stop once past
    ``budget``."""
    paths, count = {tasks_mod.__file__, deferred_mod.__file__}, 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise _OverBudget
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename in paths else None

    saved = sys.gettrace()
    sys.settrace(calls)
    try:
        fn()
    except _OverBudget:
        pass
    finally:
        sys.settrace(saved)
    return count


@pytest.mark.parametrize("shape", SHAPES)
def test_scheduling_work_grows_linearly_with_the_tasks(shape):
    p = Program()
    budget = LINES_PER_TASK * N
    lines = _count_lines(lambda: _shape(p, shape, N), budget)
    assert lines <= budget, f"{shape}: more than {LINES_PER_TASK} lines of rank/tasks.py per task ({N} tasks)"
    assert sorted(p.ran) == list(range(p.next_tid)) and p.graph.idle
    if shape != "deferred tasks nothing waits for":
        assert p.ran == sorted(p.ran)  # behind one task, the queue runs in submission order
        assert p.rank.blocked_on == [["c"]]


def _peer_order(n: int, order: str) -> list:
    """The conditions of ``_many_pending`` in the order a peer satisfies them (popped from the end)."""
    conds = [f"c{i}" for i in range(n)]
    if order == "oldest first":
        conds.reverse()
    elif order == "random":
        random.Random(7).shuffle(conds)
    return conds


@pytest.mark.parametrize("dependants", ["deps", "tensor", "none"])
@pytest.mark.parametrize("order", ["oldest first", "youngest first", "random"])
def test_many_pending_deferred_waits_satisfied_one_at_a_time_schedule_in_linear_work(order, dependants):
    """10,000 deferred waits pending at once, each satisfied alone while the rank blocks, in any order: the
    rank looks at every pending wait's cell at once when it blocks, so the work per wait stays bounded."""
    p = Program()
    p.rank.order = _peer_order(MANY, order)
    tasks = MANY if dependants == "none" else 2 * MANY
    budget = LINES_PER_TASK * tasks
    lines = _count_lines(lambda: _many_pending(p, MANY, dependants), budget)
    assert lines <= budget, f"{order}, {dependants}: more than {LINES_PER_TASK} lines per task ({tasks} tasks)"
    assert p.graph.idle and sorted(p.ran) == list(range(tasks))
    assert len(p.rank.blocked_on) == MANY and all(len(held) == 1 for held in p.rank.blocked_on)
    assert [held[0] for held in p.rank.blocked_on] == _peer_order(MANY, order)[::-1]
    if dependants != "none":  # each dependant runs as soon as its task completed, before the next block
        assert [f"c{t // 2}" for t in p.ran if t % 2] == _peer_order(MANY, order)[::-1]


# -- the semantics, on small programs ----------------------------------------------------------------

def test_a_task_runs_at_once_unless_something_it_needs_is_unfinished():
    p = Program()
    assert p.task(rows=[0], conds=["c"])       # 0: ran, incomplete
    assert not p.task(rows=[0])                # 1: shares row 0 with 0
    assert p.task(rows=[1])                    # 2: independent
    assert not p.task(deps=[1])                # 3: names 1
    assert p.task(rows=[0], manual=True)       # 4: a manual scope ignores the overlap
    assert not p.task(ranges=[(ROW // 2, 3 * ROW)])  # 5: part of row 0, row 1 and row 2
    assert p.ran == [0, 2, 4]
    p.rank.hold("c")
    p.graph.wait_for([3])
    assert p.ran == [0, 2, 4, 1, 3, 5]
    assert p.rank.blocked_on == []  # the condition held when polled: no block


def test_a_task_overlapping_a_row_of_a_waiting_whole_tensor_task_waits_for_it():
    p = Program()
    p.task(conds=["c"])                          # 0
    p.task(deps=[0], ranges=[(0, 4 * ROW)])      # 1: the whole tensor, waits for 0
    p.task(rows=[2])                             # 2: a row of it: waits for 1
    p.task(ranges=[(ROW, 2 * ROW + 1)])          # 3: row 1 and a byte of row 2: waits for 1 and 2
    p.task(rows=[5])                             # 4: outside it: runs
    assert p.ran == [0, 4]
    p.graph.wait_overlapping(frozenset([(2 * ROW, 2 * ROW + 8)]))
    assert p.ran == [0, 4, 1, 2, 3]


def test_wait_overlapping_returns_at_once_when_nothing_unfinished_overlaps():
    p = Program()
    p.task(rows=[0], conds=["c"])
    p.graph.wait_overlapping(frozenset([(ROW, 2 * ROW)]))
    assert p.rank.blocked_on == [] and not p.graph.idle


def test_a_younger_deferred_wait_that_holds_is_found_before_the_rank_blocks_on_the_oldest():
    # 0 waits for a condition that only 2 can bring about; 1's condition holds already; 2 waits for 1.
    # Blocking on 0's (the oldest) first would hang: the rank polls 1's, runs 2, then 0 completes.
    p = Program()
    p.rank.peers = False
    p.task(conds=["after 2"])
    p.task(conds=["now"])
    p.task(deps=[1], on_run=lambda tid: p.rank.hold("after 2"))
    p.rank.hold("now")
    p.graph.wait_for()
    assert p.ran == [0, 1, 2] and p.graph.idle


def test_ready_tasks_run_in_submission_order_when_one_completion_makes_several_ready():
    p = Program()
    p.task(conds=["a"])                          # 0
    p.task(deps=[0], rows=[0])                   # 1
    p.task(rows=[1], conds=["b"])                # 2: runs
    p.task(deps=[2])                             # 3
    p.task(deps=[0])                             # 4
    p.task(rows=[0])                             # 5: behind 1
    p.rank.hold("a", "b")
    p.graph.wait_for()
    assert p.ran == [0, 2, 1, 3, 4, 5]


def _random_program(rng: random.Random, p: Program, log: list) -> None:
    """Submit a random program: deps, byte ranges, manual scopes, deferred waits; waits between the tasks."""
    manual = False
    spontaneous: dict = {}  # a condition that comes true after this many more task runs (a notify arriving)

    def tick(tid):
        for c in list(spontaneous):
            spontaneous[c] -= 1
            if spontaneous[c] <= 0:
                p.rank.hold(c)
                del spontaneous[c]

    for i in range(rng.randrange(1, 40)):
        if rng.random() < 0.1:
            manual = not manual
        deps = sorted(rng.sample(range(i), min(i, rng.choice([0, 0, 1, 2]))))
        ranges = []
        for _ in range(rng.choice([0, 1, 1, 2])):
            lo = rng.randrange(0, 96)
            ranges.append((lo, lo + rng.choice([0, 1, 4, 8, 16, 64])))
        conds = [f"c{i}.{k}" for k in range(rng.choice([0, 0, 0, 1, 2]))]
        for c in conds:
            if rng.random() < 0.5:
                spontaneous[c] = rng.randrange(0, 6)
        log.append(("task", deps, frozenset(ranges), manual, conds))
        p.task(deps=deps, ranges=ranges, manual=manual, conds=conds, on_run=tick)
        r = rng.random()
        if r < 0.05:
            log.append(("wait_for", None))
            p.graph.wait_for()
        elif r < 0.15:
            lo = rng.randrange(0, 96)
            span = frozenset([(lo, lo + rng.choice([1, 8, 32]))])
            log.append(("wait_overlapping", span))
            p.graph.wait_overlapping(span)
        elif r < 0.2:
            tids = sorted(rng.sample(range(i + 1), min(i + 1, 2)))
            log.append(("wait_for", tids))
            p.graph.wait_for(tids)
    log.append(("wait_for", None))
    p.graph.wait_for()


@pytest.mark.parametrize("seed", range(300))
def test_random_programs_keep_the_task_graph_rules(seed):
    """Every task runs once, after its deps and the earlier tasks it overlaps (outside a manual scope) are
    complete; a queued task runs before no older one that was ready; a wait returns with what it waits for
    complete; the rank blocks only when nothing is ready, watching every pending deferred wait, and comes
    back with every one that holds, oldest first."""
    rng = random.Random(seed)
    p = Program()
    tasks: list = []   # (deps, ranges, manual, conds) by tid
    seen: set = set()  # conditions the graph has seen hold: the graph knows these tasks' waits are over
    ran_order: list = []

    def known_complete(tid: int) -> bool:
        return tid in ran_order and all(c in seen for c in tasks[tid][3])

    def ready(tid: int) -> bool:
        deps, ranges, manual, _ = tasks[tid]
        return all(known_complete(d) for d in deps) and (manual or all(
            known_complete(u) for u in range(tid) if overlap(tasks[u][1], ranges)))

    rank = p.rank
    holds, blocks = rank.condition_holds, rank.block_until_any

    def condition_holds(c):
        ok = holds(c)
        if ok:
            seen.add(c)
        return ok

    def block_until_any(pending):
        waiting = [t for t in range(len(tasks)) if t not in ran_order]
        assert not [t for t in waiting if ready(t)], "blocked while a task was ready"
        # The graph watches every pending wait, oldest first: the tasks in the order they ran, each one's in order.
        unseen = [c for t in ran_order for c in tasks[t][3] if c not in seen]
        assert [d.cond for d in pending.oldest(len(pending))] == unseen
        held = blocks(pending)
        assert [d.cond for d in held] == [c for c in unseen if holds(c)]
        seen.update(d.cond for d in held)
        return held

    rank.condition_holds, rank.block_until_any = condition_holds, block_until_any
    submitting: list = []

    def checked(tid):
        assert tid not in ran_order
        assert ready(tid), f"task {tid} ran before what it waits for was complete"
        queued = tid not in submitting
        if queued:  # from the queue: no older queued task was ready
            assert not [t for t in range(tid) if t not in ran_order and t not in submitting and ready(t)]
        ran_order.append(tid)

    log: list = []
    original_task = p.task

    def task(deps=(), ranges=(), manual=False, conds=(), on_run=None):
        tid = p.next_tid
        tasks.append((list(deps), frozenset(ranges), manual, list(conds)))
        submitting.append(tid)

        def both(t):
            checked(t)
            on_run(t)

        try:
            return original_task(deps=deps, ranges=ranges, manual=manual, conds=conds, on_run=both)
        finally:
            submitting.remove(tid)

    p.task = task
    original_wait_for, original_wait_overlapping = p.graph.wait_for, p.graph.wait_overlapping

    def wait_for(tids=None):
        original_wait_for(tids)
        assert all(known_complete(t) for t in (range(len(tasks)) if tids is None else tids))
        if tids is None:
            assert p.graph.idle

    def wait_overlapping(span):
        original_wait_overlapping(span)
        assert all(known_complete(t) for t in range(len(tasks)) if overlap(tasks[t][1], span))

    p.graph.wait_for, p.graph.wait_overlapping = wait_for, wait_overlapping
    _random_program(rng, p, log)
    assert sorted(ran_order) == list(range(len(tasks)))
