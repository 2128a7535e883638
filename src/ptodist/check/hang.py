"""Explain a hang: every rank's state, what each blocked cell received, the wait-for cycle, the likely cause.

Inputs are the driver's snapshot of the status board (``states``: one dict per
rank; blocked ranks carry their cell, expected and current value, and a rank
blocked until any of several deferred waits holds carries the others in
``others``) and every rank's recent sent notifies (``sent``: buffer, owner rank,
cell offset, op, value, resulting value, source line).
"""

from __future__ import annotations

import re
import time

from ..compiler.plan import WindowView
from ..errors import HangError
from ..rank.status import DONE, HISTORY, OTHER_WAITS, RUNNING, STATE_NAMES, WAIT_CMPS, WAITING, cell_holds

_SYMBOLS = {"Eq": "==", "Ge": ">=", "Ne": "!=", "Lt": "<", "Le": "<=", "Gt": ">"}


def received(state: dict, sent: list[dict]) -> list[dict]:
    """The notifies that reached the cell ``state`` waits on, in each sender's order."""
    return [e for e in sent if e["buffer"] == state["buffer_id"] and e["owner"] == state["rank"]
            and e["offset"] == state["offset"]]


def waits(state: dict) -> list[dict]:
    """Every wait a blocked rank's ``state`` names: its own, then the others it waits on at the same time."""
    return [state, *state.get("others", ())]


def wait_for_cycle(states: list[dict]) -> list[int]:
    """A cycle of blocked ranks, each waiting on a cell whose first index names the next (empty if none).

    The first index of a signal cell is, by convention in these programs, the rank expected
    to notify it (``[sender, 0]``); that makes an edge ``waiter -> sender``.
    """
    blocked = {s["rank"]: s for s in states if s["state"] == "waiting"}
    edges = {r: s["cell0"] for r, s in blocked.items() if s.get("cell0", -1) in blocked and s["cell0"] != r}
    for start in edges:
        path, r = [], start
        while r in edges and r not in path:
            path.append(r)
            r = edges[r]
        if r in path:
            return path[path.index(r):] + [r]
    return []


# The fix for each cause diagnose_hang names (a report's ``fix``; the generic one when no cause is known).
FIX_WAIT_FIRST = ("Put the notify loop before the wait loop: notify every peer, then wait for every peer. If the "
                  "send is in another task than the wait, order it first with pl.submit(..., deps=[send_task]).")
FIX_ZERO_NOTIFY = "Notify with a positive value: an AtomicAdd of 0 never moves a counter toward the expected value."
FIX_EQ_PASSED = ("Wait with WaitCmp.Ge on a threshold that grows each phase, or give each phase its own signal row "
                 "(or reset the cell after each wait): counters only grow.")
FIX_PEER_SKIPPED = ("Make the finished rank notify the cell the waiting rank waits on: check that notify's peer "
                    "index and any condition that skips it.")
FIX_WRONG_CELLS = ("Make each notify's peer and offsets name the cell its receiver waits on (e.g. notify (r + 1) % n "
                   "at [r, 0] when the right neighbour waits on [left, 0]).")
FIX_WRONG_PEER = ("Pass the waiting rank as the notify's peer: pld.system.notify(sig, peer, offsets, ...) changes the "
                  "cell on rank peer, so peer must be the rank whose pld.system.wait counts the notify (the rank the "
                  "report asks 'Did you mean to notify rank ...?' about).")
FIX_WRONG_INDEX = ("Make the notify's offsets name the cell its peer waits on: pld.system.notify(sig, peer, offsets, ...) "
                   "and the peer's pld.system.wait(sig, offsets, ...) must address the same cell (e.g. notify [me, 0] "
                   "when the peer waits on [src, 0] for each src).")
FIX_SHORT_COUNT = ("Wait for the number of notifies the program sends (n - 1 when a rank does not notify itself), or "
                   "add the notify that is missing: every rank that notifies the cell has finished or already did.")
FIX_ORDER = ("Submit the chip task that notifies before the chip task that waits for it, or give the two no host "
             "tensor in common: the host starts a chip task only once the earlier-submitted chip tasks it shares "
             "host tensors with are complete.")
FIX_OVERLAP_EDGE = ("Keep the task that would satisfy the deferred wait out of the waiting task's implicit edge: "
                    "pass the signal to it as pl.no_dep(sig) (a signal is not data the tasks exchange), or submit "
                    "the tasks in a pl.manual_scope() with deps= only where one needs another's results.")
FIX_BUSY = ("End the loop that never ends, or wait on signals with pld.system.wait instead of polling with pl.read; "
            "if the rank is legitimately computing for longer, raise RunConfig(hang_timeout_s=...) or "
            "PTODIST_HANG_TIMEOUT.")


def diagnose_hang(states: list[dict], sent: list[dict]) -> dict:
    """Name the likely cause of a hang: ``kind`` (``set_clobber`` or ``hang``), ``cause``, ``culprits``, ``cycle``,
    and, when the cause is known, its ``fix`` (and the SPEC §8 ``pitfall`` row when it is not "all ranks hang")."""
    blocked = [s for s in states if s["state"] == "waiting"]
    by_rank = {s["rank"]: s for s in states}
    for s in blocked:
        sets = [e for e in received(s, sent) if e["op"] == "Set"]
        writers = sorted({e["rank"] for e in sets})
        if len(writers) > 1:
            return {"kind": "set_clobber", "culprits": _lines(sets), "cycle": wait_for_cycle(states),
                    "cause": f"NotifyOp.Set from ranks {writers} on one cell ('{s['buffer']}' on rank {s['rank']}): "
                             "each Set overwrote the arrivals before it, so the count never reaches "
                             f"{s['expected']}. Use NotifyOp.AtomicAdd with WaitCmp.Ge for a cell with several "
                             "writers.",
                    "fix": "Use NotifyOp.AtomicAdd with WaitCmp.Ge on a cell that several ranks notify; Set is for "
                           "1:1 exchanges."}
    running = [s for s in states if s["state"] == "running"]
    if running:
        return _running_cause(running, blocked, states)
    for s in blocked:
        producer = by_rank.get(s.get("cell0", -1)) if s.get("order") else None
        if producer is not None and producer["state"] == "waiting" and not producer.get("order"):
            return {"kind": "hang", "culprits": [producer["where"]], "cycle": wait_for_cycle(states), "fix": FIX_ORDER,
                    "cause": f"rank {s['rank']} waits, by the host's order of chip tasks, for rank {producer['rank']} "
                             "to complete an earlier-submitted chip task that shares host tensors with its next one, "
                             f"and that task is blocked at {producer['where']} waiting for a notify that only a chip "
                             "task submitted after it would send. Submit the notifying chip task first, or give "
                             "the two tasks no host tensor in common."}
    edged = [s for s in blocked if s.get("edge")]
    if edged:
        return {"kind": "hang", "culprits": [edged[0]["edge"]["where"]], "cycle": wait_for_cycle(states),
                "fix": FIX_OVERLAP_EDGE,
                "cause": f"on rank {edged[0]['rank']}, {edged[0]['edge']['text']}. If that task is what satisfies the "
                         "wait (its notify, or a peer's that answers it), the two wait for each other: the queued "
                         "task for the deferred wait, the deferred wait for the queued task. Pass the signal to the "
                         "queued task as pl.no_dep(sig), or submit both in a pl.manual_scope()."}
    # The notifies the ranks sent are the evidence: ones on cells nobody waits on name the wrong peer or index,
    # and a cell every other rank already notified says the count is short; only without either does a rank
    # waiting before it notifies explain the hang.
    at_lines = [s for s in blocked if not s.get("order")]  # (a wait for the host's order of chip tasks: no line)
    evidence = next(filter(None, (cause(states, by_rank, at_lines, sent)
                                  for cause in (_misdirected, _short_count, _left_alone, _unreached))), None)
    if evidence:
        return evidence
    # "Waits before it notifies" is about ranks that wait for one another: not when a rank waits on a finished one.
    waits_on_finished = any(by_rank.get(s.get("cell0", -1), {}).get("state") in ("finished", "failed")
                            and s.get("cell0") != s["rank"] for s in blocked)
    if blocked and not waits_on_finished and not any(e["rank"] in {s["rank"] for s in blocked} for e in sent):
        return {"kind": "hang", "culprits": [], "cycle": wait_for_cycle(states), "fix": FIX_WAIT_FIRST,
                "cause": "no blocked rank had notified anyone before it began to wait: every rank waits before "
                         "it notifies. Put the notify loop before the wait loop (or, if the send is in another "
                         "task, order it first with pl.submit(..., deps=[send_task]))."}
    for s in (w for b in blocked for w in waits(b)):
        zeros = [e for e in received(s, sent) if e["op"] == "AtomicAdd" and e["value"] == 0]
        if zeros and s["current"] < s["expected"]:
            return {"kind": "hang", "culprits": _lines(zeros), "cycle": wait_for_cycle(states), "fix": FIX_ZERO_NOTIFY,
                    "cause": f"the cell rank {s['rank']} waits on received AtomicAdd notifies of value 0 (from ranks "
                             f"{sorted({e['rank'] for e in zeros})}): adding 0 never moves a counter toward "
                             f"{s['expected']}. Notify with a positive value (a tag of 0 counts nothing)."}
        if s["cmp"] == "Eq" and s["current"] > s["expected"]:
            return {"kind": "hang", "culprits": _lines(received(s, sent)), "cycle": wait_for_cycle(states),
                    "fix": FIX_EQ_PASSED, "pitfall": "8.3 step 09 (a reused signal row)",
                    "cause": f"rank {s['rank']} waits for == {s['expected']} but the cell already holds "
                             f"{s['current']}: counters only grow (a reused row keeps older arrivals). Wait with "
                             "WaitCmp.Ge on a per-phase threshold, or give each phase its own row."}
    for s in blocked:
        peer = by_rank.get(s.get("cell0", -1))
        if peer is not None and peer["rank"] != s["rank"] and peer["state"] in ("finished", "failed") and \
                not any(e["rank"] == peer["rank"] for e in received(s, sent)):
            elsewhere = [e for e in sent if e["rank"] == peer["rank"] and e["buffer"] == s["buffer_id"]
                         and e["owner"] == s["rank"]]
            went = ""
            if elsewhere:
                cells = sorted({e["offset"] for e in elsewhere})
                went = (f"; its notifies on '{s['buffer']}' to rank {s['rank']} went to byte offset(s) "
                        f"{', '.join(map(str, cells))} (the wait's is {s['offset']}), from "
                        f"{', '.join(_lines(elsewhere))}")
            return {"kind": "hang", "culprits": _lines(elsewhere), "cycle": [], "fix": FIX_PEER_SKIPPED,
                    "cause": f"rank {peer['rank']} {peer['state']} without notifying the cell rank {s['rank']} "
                             f"waits on (cell {s['wait'].rsplit('cell ', 1)[-1]}){went}: check the peer index and "
                             "cell of its notify (a rank or index of another comm domain?), or a condition that "
                             "skipped it."}
    if blocked and not any(received(w, sent) for s in blocked for w in waits(s)):
        senders = [e for e in sent if e["rank"] in {s["rank"] for s in blocked}]
        return {"kind": "hang", "culprits": _lines(senders), "cycle": wait_for_cycle(states), "fix": FIX_WRONG_CELLS,
                "cause": "the blocked ranks did notify, but none of their notifies reached a cell that a blocked "
                         "rank waits on: the notifies' peer or cell index does not match the waits (e.g. "
                         "notifying the left neighbour while it waits for a notify from its left). Check each "
                         "notify's peer and offsets against the matching wait."}
    return {"kind": "hang", "culprits": [], "cycle": wait_for_cycle(states), "cause": ""}


def _short(w: dict) -> bool:
    """Whether wait ``w`` (a blocked rank's, or one of its others) is not satisfied by the value its cell holds."""
    return not cell_holds(WAIT_CMPS.index(w["cmp"]), w["current"], w["expected"])


_WAIT_TEXT = re.compile(r" on '([^']*)' \(buffer '[^']*'\) cell (\[[-\d, ]*\]|-?\d+)$")


def _cell_text(w: dict, offset: int) -> str:
    """The cell at byte ``offset`` of the buffer wait ``w`` waits on, named as the wait names its own cell
    (``'sig' cell [1, 0]``), or by byte offset when the view's shape does not say which index it is."""
    m = _WAIT_TEXT.search(w.get("wait", ""))
    if m is None:
        return f"byte offset {offset} of buffer '{w['buffer']}'"
    view, cell = m.groups()
    if offset == w["offset"]:
        return f"'{view}' cell {cell}"
    shape = w.get("shape")
    if shape and offset % 4 == 0:
        def unravel(flat: int) -> list[int]:
            idx = []
            for size in reversed(shape):
                idx.append(flat % size)
                flat //= size
            return idx[::-1] if flat == 0 else []
        index, own = unravel(offset // 4), unravel(w["offset"] // 4)
        if index and own and str(own) == (cell if cell.startswith("[") else f"[{cell}]"):  # the view the wait names
            return f"'{view}' cell {index}"
    return f"byte offset {offset} of buffer '{w['buffer']}' (the wait's cell {cell} is at byte offset {w['offset']})"


def _ranks(ranks) -> str:
    """``rank 1``, ``ranks 1 and 2``, ``ranks 1, 2 and 3``."""
    ranks = [str(r) for r in ranks]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(ranks[:-1])} and {ranks[-1]}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _misdirected(states: list[dict], by_rank: dict[int, dict], blocked: list[dict], sent: list[dict]
                 ) -> dict | None:
    """The cause when notifies landed on cells nobody waits on while a wait on a cell like them is short: a wrong
    peer (the same cell on another rank) or a wrong index (another cell of the waiting rank's buffer)."""
    every = [w for s in blocked for w in waits(s)]
    waited = {(w["buffer_id"], w["rank"], w["offset"]) for w in every}
    short = [w for w in every if _short(w)]
    found: dict[int, tuple[dict, str, list[dict]]] = {}  # a short wait's position -> (the wait, how, its strays)
    for e in sent:
        target = by_rank.get(e["owner"])
        if (e["buffer"], e["owner"], e["offset"]) in waited or target is None or target["state"] == "running":
            continue  # (a running rank may still come to wait on it)
        peer = [i for i, w in enumerate(short) if w["buffer_id"] == e["buffer"] and w["offset"] == e["offset"]]
        # Another cell of the waiting rank counts only from a rank that finished: one still running may yet send
        # the right notify, and its stray may be an earlier phase's, consumed by a wait that returned.
        index = [i for i, w in enumerate(short) if w["buffer_id"] == e["buffer"] and w["rank"] == e["owner"]
                 and by_rank.get(e["rank"], {}).get("state") == "finished"]
        if peer or index:
            i = (peer or index)[0]
            found.setdefault(i, (short[i], "peer" if peer else "index", []))[2].append(e)
    if not found:
        return None
    w, how, strays = found[min(found)]
    groups: dict[tuple[int, int], list[int]] = {}  # (owner, offset) -> the ranks that notified it
    for e in strays:
        senders = groups.setdefault((e["owner"], e["offset"]), [])
        if e["rank"] not in senders:
            senders.append(e["rank"])
    clauses = [f"{_ranks(sorted(senders))} notified rank {owner}'s {_cell_text(w, offset)}"
               for (owner, offset), senders in sorted(groups.items(), key=lambda g: (min(g[1]), g[0]))]
    if len(clauses) > 3:
        clauses = [*clauses[:3], f"{len(clauses) - 3} more like them"]
    lines = _lines(strays)
    targets = sorted({owner for owner, _ in groups if owner != w["rank"]})
    finished = [r for r in targets if by_rank[r]["state"] in ("finished", "failed", "not started")]
    elsewhere = [r for r in targets if by_rank[r]["state"] == "waiting"]
    why = [f"{_ranks(finished)} {'finished' if all(by_rank[r]['state'] == 'finished' for r in finished) else 'ended'}"
           ] if finished else []
    if elsewhere:
        why.append(f"{_ranks(elsewhere)} {'waits on another cell' if len(elsewhere) == 1 else 'wait on other cells'}")
    one = len(groups) == 1
    meant = f"rank {w['rank']}" if how == "peer" else _cell_text(w, w["offset"])
    cause = (f"{'a notify' if len(strays) == 1 else 'notifies'} went to the wrong "
             f"{'peer' if how == 'peer' else 'cell'}: {_and(clauses)} at {_and(lines)}, where nobody waits on "
             f"{'it' if one else 'them'}{f' ({_and(why)})' if why else ''}; rank {w['rank']} waits on "
             f"{_cell_text(w, w['offset'])} at {w['where']} for {_SYMBOLS[w['cmp']]} {w['expected']} and holds "
             f"{w['current']}. Did you mean to notify {meant}?")
    rest = [e for i in sorted(found) if i != min(found) for e in found[i][2]]
    if rest:
        ranks = sorted({found[i][0]["rank"] for i in found if i != min(found)} - {w["rank"]})
        more = f"the waits of {_ranks(ranks)}" if ranks else f"rank {w['rank']}'s other waits"
        cause += (f" The same holds for {more}: {len(rest)} more notify(s) landed on cells nobody waits on, "
                  f"from {_and(_lines(rest))}.")
    return {"kind": "hang", "culprits": [*lines, *(c for c in _lines(rest) if c not in lines)],
            "cycle": wait_for_cycle(states), "fix": FIX_WRONG_PEER if how == "peer" else FIX_WRONG_INDEX,
            "cause": cause}


def _short_count(states: list[dict], by_rank: dict[int, dict], blocked: list[dict], sent: list[dict]
                 ) -> dict | None:
    """The cause when a wait counts more notifies than the program sends: every other rank notified its cell
    (and no notify on its buffer went to a cell nobody waits on), yet the count stays short."""
    waited = {(w["buffer_id"], w["rank"], w["offset"]) for s in blocked for w in waits(s)}
    for w in (w for s in blocked for w in waits(s)):
        if w["cmp"] not in ("Ge", "Eq") or w["current"] >= w["expected"]:
            continue
        got = received(w, sent)
        if not got or len(got) >= HISTORY or any(e["op"] != "AtomicAdd" or e["value"] <= 0 for e in got) \
                or sum(e["value"] for e in got) != w["current"]:
            continue  # (a cell this dispatch's notifies do not account for, or a ring that forgot some)
        senders = sorted({e["rank"] for e in got})
        others = [r for r in by_rank if r != w["rank"]]
        if any(r not in senders for r in others) or \
                any(e["buffer"] == w["buffer_id"] and (e["buffer"], e["owner"], e["offset"]) not in waited
                    for e in sent):
            continue
        ended = "finished" if all(by_rank[r]["state"] == "finished" for r in others) else "finished or is blocked"
        cell = _cell_text(w, w["offset"])
        return {"kind": "hang", "culprits": [w["where"], *_lines(got)], "cycle": wait_for_cycle(states),
                "fix": FIX_SHORT_COUNT,
                "cause": f"rank {w['rank']} waits on {cell} at {w['where']} for {_SYMBOLS[w['cmp']]} "
                         f"{w['expected']} and holds {w['current']}, but every other rank already notified it "
                         f"({_ranks(senders)}, at {_and(_lines(got))}) and {ended}, and no notify on "
                         f"'{w['buffer']}' went to a cell nobody waits on: it waits for "
                         f"{w['expected'] - w['current']} more than the program sends. Wait for "
                         f"{w['current']} (n - 1 when a rank does not notify itself), or add the missing notify."}
    return None


def _left_alone(states: list[dict], by_rank: dict[int, dict], blocked: list[dict], sent: list[dict]
                ) -> dict | None:
    """The cause when a rank waits alone, every other rank finished, and some of them never notified its cell:
    nobody is left to send what it waits for (not a rank waiting before it notifies)."""
    if len(blocked) != 1 or any(s["state"] != "finished" for s in states if s is not blocked[0]):
        return None
    for w in (w for w in waits(blocked[0]) if _short(w)):
        got = received(w, sent)
        silent = [r for r in by_rank if r != w["rank"] and r not in {e["rank"] for e in got}]
        if not silent:
            continue
        came = (f"it received {len(got)} notify(s), from {_ranks(sorted({e['rank'] for e in got}))}"
                if got else "no notify reached it")
        return {"kind": "hang", "culprits": [w["where"]], "cycle": wait_for_cycle(states), "fix": FIX_PEER_SKIPPED,
                "cause": f"{_ranks(silent)} finished without notifying the cell rank {w['rank']} waits on "
                         f"({_cell_text(w, w['offset'])} at {w['where']}, for {_SYMBOLS[w['cmp']]} {w['expected']}, "
                         f"holding {w['current']}); {came}, and no rank is left to send more. Check the notify in "
                         "the code those ranks ran: a condition that skipped it, or a peer or index of another comm "
                         "domain; or, if they are not meant to notify it, wait for what the others send."}
    return None


def _unreached(states: list[dict], by_rank: dict[int, dict], blocked: list[dict], sent: list[dict]
               ) -> dict | None:
    """The cause when the ranks a short wait misses notified the same cell on other ranks only: their notify
    reaches one peer where several wait for it."""
    found = []  # (the wait, the ranks it misses, their notifies of its cell on other ranks)
    for w in (w for s in blocked for w in waits(s) if _short(w)):
        got = received(w, sent)
        missing = [s["rank"] for s in states if s["rank"] != w["rank"] and s["rank"] not in {e["rank"] for e in got}]
        there = [e for e in sent if e["rank"] in missing and e["buffer"] == w["buffer_id"]
                 and e["offset"] == w["offset"] and e["owner"] != w["rank"]]
        if missing and {e["rank"] for e in there} == set(missing):
            found.append((w, missing, there))
    if not found:
        return None
    w, missing, there = found[0]
    pairs = sorted({(e["rank"], e["owner"]) for e in there})
    on = (f"rank {pairs[0][1]}" if len(pairs) == 1 else
          "other ranks (" + _and([f"rank {a} on rank {b}" for a, b in pairs[:3]]
                                 + ([f"{len(pairs) - 3} more"] if len(pairs) > 3 else [])) + ")")
    got = received(w, sent)
    came = f" (from {_ranks(sorted({e['rank'] for e in got}))})" if got else ""
    cause = (f"{_ranks(missing)} notified {_cell_text(w, w['offset'])} on {on} at {_and(_lines(there))} but never "
             f"on rank {w['rank']}, which waits on it at {w['where']} for {_SYMBOLS[w['cmp']]} {w['expected']} and "
             f"holds {w['current']}{came}: a notify changes the cell on its peer only, so every rank that waits "
             f"needs its own. Did you mean to notify rank {w['rank']} as well?")
    if len(found) > 1:
        cause += f" The waits of {_ranks(sorted({f[0]['rank'] for f in found[1:]}))} miss notifies the same way."
    return {"kind": "hang", "culprits": [*_lines(there), w["where"]], "cycle": wait_for_cycle(states),
            "fix": FIX_WRONG_PEER, "cause": cause}


def _running_cause(running: list[dict], blocked: list[dict], states: list[dict]) -> dict:
    """The cause when some unfinished rank is not in a wait: it runs without communicating."""
    where = []
    for s in running:
        at = f" at {s['line'].rsplit(' in ', 1)[0]}" if s.get("line") else ""
        task = f" (kernel '{s['task']}')" if s.get("task") else ""
        where.append(f"rank {s['rank']}{at}{task}")
    lines = [s["line"].rsplit(" in ", 1)[0] for s in running if s.get("line")]
    one = len(running) == 1
    if blocked:
        head = (f"{'; '.join(where)} {'is' if one else 'are'} running, not waiting, and made no communication "
                f"progress, so the ranks that wait for {'it' if one else 'them'} never get "
                f"{'its' if one else 'their'} notifies: the signalling is not at fault. ")
    else:
        head = f"every unfinished rank runs without communicating: {'; '.join(where)}. "
    return {"kind": "hang", "culprits": lines, "cycle": wait_for_cycle(states), "fix": FIX_BUSY,
            "cause": head + "A rank that makes no notify, satisfied wait, RMA or new read for this long is in "
                            "a loop that never ends (a spin on a cell nobody writes, a condition that never "
                            "changes) or in a blocking call (a sleep, I/O, a lock). Wait on signals with "
                            "pld.system.wait instead of polling; if the rank is legitimately computing for "
                            "longer, raise RunConfig(hang_timeout_s=...) or PTODIST_HANG_TIMEOUT."}


def _lines(events: list[dict]) -> list[str]:
    out: list[str] = []
    for e in events:
        if e["where"] and e["where"] not in out:
            out.append(e["where"])
    return out


def rank_lines(states: list[dict]) -> list[str]:
    """Where each rank is, one report line each (and the lines under a blocked one): a hang report's body, and
    what an interrupted run says of its ranks."""
    lines: list[str] = []
    for s in states:
        who = f"  rank {s['rank']} (device {s['device_id']})"
        if s["state"] == "waiting" and s.get("order"):
            lines.append(f"{who}: blocked at {s['where']} by {s['wait']} (waiting {s['waiting_s']:.2f} s)")
        elif s["state"] == "waiting":
            sym = _SYMBOLS[s["cmp"]]
            task = f" in kernel '{s['task']}'" if s.get("task") else ""
            lines.append(f"{who}: blocked at {s['where']}{task}: {s['wait']} holds {s['current']}, "
                         f"needs {sym} {s['expected']} (waiting {s['waiting_s']:.2f} s)")
            _received_lines(s, lines)
            others = s.get("others")
            if others:
                n = 1 + len(others) + s.get("unlisted", 0)
                deferred = s["wait"].startswith("pld.system.defer_wait")
                if deferred:
                    lines.append(f"      it waits for whichever of its {n} pending deferred waits holds first; "
                                 "the others:")
                else:  # a wait of its own, its tasks' deferred waits completing beside it
                    lines.append(f"      beside it, its tasks' {n - 1} pending deferred wait(s), each completing its "
                                 "task when it holds:")
                for o in others:
                    sym = _SYMBOLS[o["cmp"]]
                    lines.append(f"    - at {o['where']}: {o['wait']} holds {o['current']}, needs {sym} "
                                 f"{o['expected']}")
                    if o.get("received"):  # (most received nothing: saying so for each would bury the rest)
                        _received_lines(o, lines)
                if s.get("unlisted"):
                    lines.append(f"    - and {s['unlisted']} more (only the {OTHER_WAITS + deferred} oldest are "
                                 "listed)")
        elif s["state"] == "running":
            task = f" task '{s['task']}'" if s.get("task") else ""
            if s.get("line"):
                lines.append(f"{who}: running{task} at {s['line']} (busy, not in a wait)")
            elif "line" in s:
                lines.append(f"{who}: running{task} (busy, not in a wait; its current line could not be read: "
                             "it is inside a native call)")
            else:
                lines.append(f"{who}: running{task} (not in a wait)")
        else:
            lines.append(f"{who}: {s['state']}")
    return lines


def hang_report(states: list[dict], certain: bool, idle_s: float | None, timeout_s: float,
                diagnosis: dict | None = None) -> str:
    """Return the HangError message: every rank's state, then the likely cause and fixes.

    ``idle_s`` is None when the deadlock was detected exactly (no rank could run), not by watching.
    """
    diagnosis = diagnosis or {}
    waiting = [s for s in states if s["state"] == "waiting"]
    if certain:
        head = ("deadlock: every unfinished rank is blocked in a wait that no running rank can satisfy "
                + (f"(nothing changed for {idle_s:.1f} s)." if idle_s is not None else
                   "(the sim scheduler had no rank left to run)."))
    else:
        head = (f"no progress for {idle_s:.1f} s (hang timeout {timeout_s:g} s): no rank notified, completed a "
                "wait or an RMA, started or finished a task, or read a changed value.")
    lines = [head, *rank_lines(states)]
    if diagnosis.get("cycle"):
        lines.append("Wait-for cycle: " + " -> ".join(f"rank {r}" for r in diagnosis["cycle"]))
    if diagnosis.get("cause"):
        lines.append(f"Likely cause: {diagnosis['cause']}")
    elif waiting:
        lines.append("Likely causes:")
        lines.append("  - a rank waits before it notifies: put the notify loop before the wait loop;")
        lines.append("  - a wait and the send it needs are in different tasks: order them with "
                     "pl.submit(..., deps=[send_task]);")
        lines.append("  - NotifyOp.Set on a cell with several writers overwrites earlier arrivals: use AtomicAdd "
                     "with WaitCmp.Ge for multi-party barriers;")
        lines.append("  - the expected value can never be reached (counters only grow; a reused row already "
                     "holds older arrivals), or a peer finished without notifying.")
    if not certain and "hang_timeout_s" not in diagnosis.get("cause", ""):
        lines.append("If a rank is legitimately computing for longer, raise RunConfig(hang_timeout_s=...) or "
                     "PTODIST_HANG_TIMEOUT.")
    return "\n".join(lines)


def _received_lines(s: dict, lines: list[str]) -> None:
    """The notifies the cell of wait ``s`` received, as report lines (nothing when they are not known)."""
    got = s.get("received")
    if got is None:
        return
    if got:
        shown = ", ".join(f"{'+' if e['op'] == 'AtomicAdd' else '='}{e['value']} from rank {e['rank']}"
                          + (f" at {e['where']}" if e["where"] else "") for e in got[-4:])
        more = f" (and {len(got) - 4} earlier)" if len(got) > 4 else ""
        lines.append(f"      received {len(got)} notify(s): {shown}{more}")
    else:
        lines.append("      received no notify")


def rank_state(plan, r: int, row, finished: bool, cell_load, line: str | None = None, asked: bool = False,
               others=()) -> dict:
    """What rank ``r``'s status row says, for a hang report: its state, and the wait it is blocked in.

    ``finished``: the rank already ended (its row may still say what it did last); ``cell_load(buffer_id,
    rank, offset)`` reads the cell a waiting rank waits on; ``line``: where a running rank was sampled
    (``asked``: it was asked, so a missing line means it did not answer); ``others``: the rank's rows of the
    board's other waits (a rank blocked until any of several deferred waits holds).
    """
    st = {"rank": r, "device_id": plan.device_ids[r], "state": STATE_NAMES.get(int(row["state"]), "unknown"),
          "task": row["task"].decode(errors="replace") or None}
    if finished:
        st["state"] = STATE_NAMES[DONE]
    elif int(row["state"]) == WAITING and not 0 <= int(row["wait_buffer"]) < len(plan.windows):
        st["state"] = STATE_NAMES[RUNNING]  # read while the rank was between two waits
    elif int(row["state"]) == WAITING:
        buffer_id, offset = int(row["wait_buffer"]), int(row["wait_offset"])
        st.update(wait=row["what"].decode(errors="replace"), where=row["where"].decode(errors="replace"),
                  buffer=plan.windows[buffer_id].name, buffer_id=buffer_id, offset=offset,
                  cell0=int(row["wait_cell0"]), expected=int(row["wait_expected"]),
                  cmp=WAIT_CMPS[int(row["wait_cmp"])], current=cell_load(buffer_id, r, offset),
                  waiting_s=round(time.time() - float(row["since"]), 3))
        shape = _view_shape(plan, buffer_id)
        if shape:
            st["shape"] = shape  # names the other cells of its buffer that notifies went to
        order = getattr(plan, "order_signal", None)
        if order is not None and buffer_id == order.id:
            st["order"] = True  # the host's order of chip tasks: the rank waits before a task, not at a program line
        edge = row["edge"].decode(errors="replace")
        if edge:
            st["edge"] = {"where": row["edge_where"].decode(errors="replace"), "text": edge}
        more = int(row["wait_others"])
        listed = [o for o in others[:min(more, OTHER_WAITS)] if 0 <= int(o["buffer"]) < len(plan.windows)]
        if listed:
            st["others"] = [{"rank": r, "wait": o["what"].decode(errors="replace"),
                             "where": o["where"].decode(errors="replace"), "buffer": plan.windows[int(o["buffer"])].name,
                             "buffer_id": int(o["buffer"]), "offset": int(o["offset"]), "cell0": int(o["cell0"]),
                             "expected": int(o["expected"]), "cmp": WAIT_CMPS[int(o["cmp"])],
                             "current": cell_load(int(o["buffer"]), r, int(o["offset"]))} for o in listed]
            st["unlisted"] = more - len(listed)
    if st["state"] == STATE_NAMES[RUNNING] and (asked or line):
        st["line"] = line  # None: asked, but the rank did not answer
    return st


def _view_shape(plan, buffer_id: int) -> list[int] | None:
    """The shape of the windows the host made of buffer ``buffer_id``, when they all have one (else None)."""
    shapes = {tuple(a.shape) for tasks in plan.tasks for t in tasks for a in t.args
              if isinstance(a, WindowView) and a.buffer.id == buffer_id}
    return [int(n) for n in shapes.pop()] if len(shapes) == 1 else None


def hang_from_states(states: list[dict], sent: list[dict], certain: bool, idle_s: float | None,
                     timeout_s: float) -> HangError:
    """The one translation of every rank's state (``rank_state``) and sent notifies into a HangError."""
    for st in states:
        if "buffer_id" in st:
            for w in waits(st):
                w["received"] = received(w, sent)
    diagnosis = diagnose_hang(states, sent)
    return HangError(hang_report(states, certain, idle_s, timeout_s, diagnosis), states, certain, diagnosis)


def hang_error(plan, board, cell_load, finished: set[int], certain: bool, idle_s: float | None, timeout_s: float,
               busy: dict[int, str] | None = None) -> HangError:
    """Return the HangError for a stall, read off one status board holding every rank's row (shm, sim).

    ``busy``: the line each running rank was sampled at (rank -> ``file:line in function``), when asked.
    """
    states = [rank_state(plan, r, board.rows[r], r in finished, cell_load,
                         busy.get(r) if busy is not None else None, busy is not None, board.others[r])
              for r in range(plan.world)]
    sent = [e for r in range(plan.world) for e in board.sent(r)]
    return hang_from_states(states, sent, certain, idle_s, timeout_s)


FIX_PERSISTENT = ("Start every dispatch from zeroed windows: prepare the worker with reset_persistent_windows=True "
                  "(its default with persistent=True), or drop persistent=True; to keep the counters on purpose, wait "
                  "for this dispatch's count instead (WaitCmp.Ge on a threshold that grows by one dispatch's "
                  "arrivals each dispatch).")


def carried_over(error: HangError, prepared_at: str, number: int, previous: int) -> HangError:
    """``error``, a hang of dispatch ``number`` of a worker prepared at ``prepared_at`` with persistent windows that
    are not zeroed between dispatches (they start from dispatch ``previous``'s): when a blocked wait's cell holds
    other than what this dispatch's notifies added, the counters carried over, and the option that keeps them is
    the cause (named first).  Otherwise ``error`` unchanged."""
    for s in error.ranks:
        if s["state"] != "waiting" or s.get("order"):
            continue
        for w in waits(s):
            got = w.get("received")
            if got is None or len(got) >= HISTORY or any(e["op"] != "AtomicAdd" for e in got):
                continue
            added = sum(e["value"] for e in got)
            if w["current"] == added:
                continue
            cause = (f"the worker prepared at {prepared_at} keeps its windows across dispatches (persistent=True) "
                     "and reset_persistent_windows=False leaves them as the last dispatch left them instead of "
                     f"zeroing them: in dispatch {number}, the cell rank {s['rank']} waits on ({w['wait']}) holds "
                     f"{w['current']}, of which this dispatch's notifies added {added}; the other "
                     f"{w['current'] - added} carried over from dispatch {previous}, so the wait for "
                     f"{_SYMBOLS[w['cmp']]} {w['expected']} {'never holds' if w['cmp'] == 'Eq' else 'counts stale arrivals'}. "
                     "Prepare the worker with reset_persistent_windows=True (or wait for a per-dispatch count).")
            diagnosis = dict(error.diagnosis, cause=cause, fix=FIX_PERSISTENT,
                             culprits=[prepared_at, *(c for c in error.diagnosis.get("culprits", ())
                                                      if c != prepared_at)])
            diagnosis.pop("pitfall", None)
            lines = str(error).splitlines()
            at = next((i for i, line in enumerate(lines) if line.startswith("Likely cause")), len(lines))
            rest = [line for line in lines[at:] if line.startswith("If a rank is legitimately")]
            message = "\n".join([*lines[:at], f"Likely cause: {cause}", *rest])
            return HangError(message, error.ranks, error.certain, diagnosis)
    return error
