"""The story of a failing schedule: its interleaving as a few numbered steps in the user's lines.

A schedule's records (each rank's window accesses, notifies, waits and tasks,
stamped with the checker's global clock, and the scheduler's decisions) are
grouped into steps: one per contiguous run of one rank (or of one task actor
of a rank, when the records name one), with the lines it ran.  The story ends
at the finding: the two accesses of a race (or the lines another finding
names), or the wait each rank is blocked in when nothing can run (a
deadlock).  ``ptodist check`` tells the story of the smallest failing
schedule it finds (:mod:`ptodist.check.explore` shrinks it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_RANK = re.compile(r"rank (\d+)")
_ACCESS = re.compile(r"([\w.]+) \((read|write|atomic add) of ")  # "pl.store (write of 'y')": a race's access
_ACTOR = re.compile(r"(?:block (\d+) of )?task '([^']+)'")  # "block 1 of task 'partial'", "task 'fill'"


@dataclass
class Item:
    """One thing a rank did, as the story needs it: when (``seq``), who, what, at which user line."""

    seq: float
    rank: int
    actor: str          # the task actor of the rank that did it ("" when the records name none)
    what: str           # "read", "write", "atomic", "blocked", or the record's kind ("task", "notify", "wait", ...)
    name: str           # the operation (pl.store, pld.system.wait, ...)
    where: str          # the user's file:line


@dataclass
class RunRecord:
    """What one scheduler run (a dispatch, or one segment of a worker's dispatch) left for the story."""

    scheduler: int       # its number in the session (the first field of its decisions' keys)
    dispatch: int        # which dispatch of the session it belongs to (segments of one dispatch share it)
    logs: list           # the dispatch's event logs (EventLog or None per rank), read only if a story is told
    since: int           # this run's records are those stamped in [since, until)
    until: int
    findings: list       # the checker's findings of this run
    deadlock: bool = False
    stalled: bool = False  # stopped for no progress by the wall clock (not a certain deadlock)

    def items(self) -> list[Item]:
        """The story's items in this run's records (a later segment of the dispatch adds to the same logs)."""
        out: list[Item] = []
        lo, hi = self.since, self.until
        for log in self.logs:
            if log is None:
                continue
            actors = getattr(log, "actors", None) or []
            for rec in log.records:
                seq = rec.get("seq", -1)
                if lo <= seq < hi and rec.get("where"):
                    out.append(Item(seq, log.rank, _actor(actors, rec.get("actor")), rec["kind"], rec["name"],
                                    rec["where"]))
            for a in log.accesses:
                if lo <= a["seq"] < hi and a.get("where") and "write" in a:  # not the task graph's fork/join records
                    what = "atomic" if a["atomic"] else ("write" if a["write"] else "read")
                    out.append(Item(a["seq"], log.rank, _actor(actors, a.get("actor")), what, a["name"],
                                    a["where"]))
        return out


def _actor(actors: list, actor) -> str:
    """How the story names a rank's actor (a task run, a pl.spmd block, a mixed kernel's half); "" for the
    orchestration (actor 0) or when the records name none."""
    if not actor or not 0 < actor < len(actors):
        return ""
    info = actors[actor]
    name, kind = info.get("name", "?"), info.get("kind")
    if kind == "block":
        return f"block {info.get('block')} of '{name}'"
    if kind == "half":
        return f"'{name}'"
    return f"task '{name}'"


def signature(finding) -> tuple:
    """What makes two findings the same for shrinking: the kind and the lines (the ranks may differ)."""
    return finding.kind, frozenset(finding.locations)


@dataclass
class Story:
    """A schedule told as numbered steps; ``steps`` counts the ranks' runs in it, ``preemptions`` its switches
    away from a rank that could have gone on (and tasks picked out of program order)."""

    lines: list[str] = field(default_factory=list)
    steps: int = 0
    preemptions: int = 0


def tell(runs: list[RunRecord], decisions: list, finding) -> Story:
    """Tell the schedule of ``runs`` (one session's) that ended with ``finding``, up to that finding.

    ``decisions``: the session's :class:`~ptodist.backends.schedule.Decision` records, for where ranks blocked and
    which switches were preemptions.
    """
    if not runs:
        return Story()
    sig = signature(finding)
    checked = next((i for i, r in enumerate(runs) if any(signature(f) == sig for f in r.findings)), None)
    last = checked if checked is not None else len(runs) - 1
    chosen = [r for r in runs[:last + 1] if r.dispatch == runs[last].dispatch]
    schedulers = {r.scheduler for r in chosen}
    items = sorted((it for r in chosen for it in r.items()), key=lambda it: it.seq)
    blocks = [Item(d.seq - 0.5, d.key[2], "", "blocked", "", d.blocked)
              for d in decisions if d.blocked and d.key[0] in schedulers]
    items = sorted(items + blocks, key=lambda it: it.seq)
    _with_their_task(items)
    ending, end_seq = _ending(finding, items, checked is None and chosen[-1].deadlock, blocks)
    if end_seq is not None:
        items = [it for it in items if it.seq <= end_seq]
    steps = _steps(items)
    lines = [f"{i}. {_step_text(step)}" for i, step in enumerate(steps, 1)]
    lines.append(f"{len(steps) + 1}. {ending}")
    preempts = sum(1 for d in decisions if d.preempt and d.key[0] in schedulers
                   and (end_seq is None or d.seq <= end_seq))
    return Story(lines, len(steps), preempts)


def _with_their_task(items: list[Item]) -> None:
    """Tell a task's own record (its call or pl.submit line, stamped as the task begins, by the actor that
    starts it) with the actor that runs the task: the one that acts next on that rank."""
    after: dict[int, str] = {}
    for it in reversed(items):
        if it.what == "task" and after.get(it.rank):
            it.actor = after[it.rank]
        elif it.what not in ("task", "blocked"):
            after[it.rank] = it.actor


def _steps(items: list[Item]) -> list[list[Item]]:
    """Contiguous runs of one rank (one actor of it)."""
    out: list[list[Item]] = []
    for it in items:
        if out and (out[-1][-1].rank, out[-1][-1].actor) == (it.rank, it.actor) and out[-1][-1].what != "blocked":
            out[-1].append(it)
        else:
            out.append([it])
    return out


def _who(rank: int, actor: str) -> str:
    return f"rank {rank}" + (f" ({actor})" if actor else "")


def _line(where: str) -> str:
    return where.rpartition(":")[2]


def _step_text(step: list[Item]) -> str:
    who = _who(step[0].rank, step[0].actor)
    ran = [it for it in step if it.what != "blocked"]
    blocked = step[-1] if step[-1].what == "blocked" else None
    parts = []
    if ran:
        wheres = list(dict.fromkeys(it.where for it in ran))  # in the order first run
        end = ran[-1]
        files = {w.rpartition(":")[0] for w in wheres}
        if len(wheres) == 1:
            parts.append(f"runs line {_line(end.where)} ({end.where}, {end.name})")
        elif len(files) == 1 and all(_line(w).isdigit() for w in wheres):
            parts.append(f"runs lines {_spans([int(_line(w)) for w in wheres])} (to {end.where}, {end.name})")
        else:
            parts.append(f"runs {', '.join(wheres)} (to {end.where}, {end.name})")
    if blocked is not None:
        parts.append(f"waits at line {_line(blocked.where)} ({blocked.where}) and blocks" if blocked.where
                     else "lets the others run (it polls)")
    return f"{who} " + ", then ".join(parts)


def _spans(nums: list[int]) -> str:
    """Line numbers in the order they ran, each rising stretch as ``a–b``: ``[26, 20, 21]`` is ``26, 20–21``."""
    out: list[list[int]] = []
    for n in nums:
        if out and n > out[-1][-1]:
            out[-1].append(n)
        else:
            out.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}\u2013{r[-1]}" for r in out)


def _ending(finding, items: list[Item], deadlock: bool, blocks: list[Item]) -> tuple[str, float | None]:
    """The story's last line, and the clock value where the story ends (None: at the run's end).

    ``deadlock``: the finding is the deadlock the run ended in (not a checker finding of its records).
    """
    if deadlock:
        waiting: dict[int, Item] = {}
        for b in blocks:
            waiting[b.rank] = b  # the latest block of each rank: where it is stuck now
        for it in items:
            if it.what != "blocked" and it.rank in waiting and it.seq > waiting[it.rank].seq:
                del waiting[it.rank]  # it went on after that block (and ended)
        if waiting:
            stuck = ", ".join(f"rank {r} waits at line {_line(b.where)} ({b.where})" for r, b in sorted(waiting.items()))
            return f"deadlock ({finding.kind}): {stuck}; no rank can run", None
    found = _located(finding, items)
    if not found:
        where = f" at {', '.join(finding.locations)}" if finding.locations else ""
        return f"{finding.kind}{where}", None
    found.sort(key=lambda it: it.seq)
    verb = {"read": "reads", "write": "writes", "atomic": "adds atomically", "notify": "notifies", "wait": "waits"}
    descs = [f"{_who(it.rank, it.actor)} {verb.get(it.what, it.what)} at line {_line(it.where)} "
             f"({it.where}, {it.name})" for it in found]
    tail = _TAILS.get((finding.kind, len(found)), "")
    return f"{finding.kind}: " + " before ".join(descs) + tail, found[-1].seq


# What the story's last line adds for a kind (and how many of the finding's items it names).
_TAILS = {
    ("race", 2): "; nothing orders the two",
    ("uninitialized_read", 1): ", and no rank had written those bytes before it",
    ("set_clobber", 2): "; the second Set overwrote the first before a wait saw it",
}


def _located(finding, items: list[Item]) -> list[Item]:
    """The items the finding is about (two at most; an unwritten read's one): each ``rank N ... at file:line``
    its message names, the first such item of the run; else the first item at each of its lines on one of its
    ranks."""
    most = 1 if finding.kind == "uninitialized_read" else 2  # the other lines it names are nearby writes
    pairs: list[tuple[int, str, tuple | None, str | None]] = []
    rank = None  # the rank named last: a line about two tasks of one rank names it once, above them
    for text in finding.message.splitlines():
        hits = sorted((i, loc) for loc in finding.locations for i in _find_all(text, f"at {loc}"))
        actor = _ACTOR.match(text.strip())  # a line about one of a rank's tasks starts with it
        prev = 0
        for i, loc in hits:
            named = _RANK.findall(text[prev:i])
            access = _ACCESS.findall(text[prev:i])
            prev = i
            rank = int(named[-1]) if named else rank
            op = (access[-1][0], access[-1][1].split()[0]) if access else None  # (name, "read" | "write" | "atomic")
            who = None
            if actor is not None and op is not None:
                who = f"block {actor.group(1)} of '{actor.group(2)}'" if actor.group(1) else f"task '{actor.group(2)}'"
            if rank is not None and (rank, loc, op, who) not in pairs:
                pairs.append((rank, loc, op, who))
        named = _RANK.findall(text[prev:])
        rank = int(named[-1]) if named else rank
    if not pairs:
        pairs = [(r, loc, None, None) for loc in finding.locations for r in finding.ranks]
    out: list[Item] = []
    for rank, loc, op, who in pairs:
        hit = next((it for it in items if it.where == loc and it.rank == rank and it.what not in ("blocked", "task")
                    and (op is None or (it.name, it.what) == op) and (who is None or it.actor == who)
                    and it not in out), None)
        if hit is not None and hit not in out:
            out.append(hit)
        if len(out) == most:
            break
    return out


def _find_all(text: str, needle: str) -> list[int]:
    out, i = [], text.find(needle)
    while i >= 0:
        out.append(i)
        i = text.find(needle, i + 1)
    return out
