"""Findings: one model for everything ptodist diagnoses, shared by exceptions, the CLI and the JSON report.

A finding has a ``kind`` (one of :data:`KINDS`), a ``message``, the ``ranks``
involved, the user ``locations`` (``file:line``, root cause first), the SPEC §8
``pitfall`` row it matches (or None), ``docs`` (that row's section of
``docs/pitfalls.md``, as ``docs/pitfalls.md#anchor``), a ``fix`` and, for an
error a rank raised, the rank's ``traceback``.  :func:`from_exception` turns any
error ptodist raised into findings.
"""

from __future__ import annotations

import inspect
import os
import re
import traceback
from dataclasses import asdict, dataclass, field

from .. import language as pl
from ..errors import CheckError, HangError, PtodistError, PtodistInternalError, RankError
from ..language import distributed as pld
from ..source import is_internal, is_library

KINDS = ("hang", "race", "uninitialized_read", "set_clobber", "stale_signal", "peer_out_of_range", "out_of_bounds",
         "shape_mismatch", "type_mismatch", "read_only", "task_args_order", "dispatch_coverage", "window_too_small",
         "not_shared", "collective_in_loop", "signal_layout", "aliasing", "invalid_argument", "unknown_name",
         "state_changed", "resource", "script_error", "rank_error", "rank_died", "internal_error")

PITFALLS_PAGE = "docs/pitfalls.md"

# SPEC §8's rows, as the ``pitfall`` texts name them, and their sections (anchors) of docs/pitfalls.md.
PITFALL_ANCHORS = {
    "8.1 all ranks hang": "all-ranks-hang",
    "8.1 silent data corruption": "silent-data-corruption",
    "8.1 signal never reaches expected": "signal-never-reaches-expected",
    "8.1 shape mismatch": "shape-mismatch-at-compile-time",
    "8.1 typeerror at dispatch": "typeerror-at-dispatch",
    "8.1 allreduce rejected in a loop": "allreduce-rejected-in-a-loop",
    "8.2 missing .share_memory_()": "missing-share_memory_",
    "8.2 alloc_window_buffer(nr)": "a-rank-count-as-the-window-size",
    "8.2 dispatch loop": "dispatch-loop-does-not-cover-every-rank",
    "8.2 scalar before tensor": "scalar-parameter-before-a-tensor-parameter",
}
STEP_ANCHORS = {
    "01": "step-01-scalar-before-tensor",
    "02": "step-02-rank-identity-outside-the-dispatch-loop",
    "03": "step-03-distributedtensor-used-as-tensor",
    "04": "step-04-set-on-a-shared-cell-barrier",
    "05": "step-05-rma-before-the-ordering-barrier",
    "06": "step-06-put-without-notify-and-wait",
    "07": "step-07-hard-coded-rank-count",
    "08": "step-08-missing-barrier",
    "09": "step-09-two-barriers-reuse-one-signal-row",
    "10": "step-10-negative-left-neighbour",
    "11": "step-11-signal-shape-vs-collective-mode",
    "12": "step-12-broadcast-from-your-own-slice",
    "13": "step-13-gather-into-the-wrong-slot",
    "14": "step-14-own-row-left-out-of-the-reduction",
    "15": "step-15-one-window-as-source-and-result",
    "16": "step-16-one-signal-window-two-layouts",
}
_STEP = re.compile(r"8\.3 steps? (\d\d)")


def pitfall_docs(pitfall: str | None) -> str | None:
    """The section of docs/pitfalls.md for a ``pitfall`` text (its first row): ``docs/pitfalls.md#anchor``."""
    if not pitfall:
        return None
    first = pitfall.split(";")[0].strip()
    low = first.lower()
    for row, anchor in PITFALL_ANCHORS.items():
        if low.startswith(row):
            return f"{PITFALLS_PAGE}#{anchor}"
    m = _STEP.match(first)
    if m and m.group(1) in STEP_ANCHORS:
        return f"{PITFALLS_PAGE}#{STEP_ANCHORS[m.group(1)]}"
    return None

# The fix for each kind, for reports; messages carry the specifics.
FIXES = {
    "hang": "Notify before you wait (put the notify loop before the wait loop); order a wait after the send it "
            "needs with pl.submit(..., deps=[send_task]); use AtomicAdd + WaitCmp.Ge on cells with several writers.",
    "race": "Order the two accesses: the writer notifies after its write and the reader waits for that notify "
            "before it reads (a barrier between the phases); for reads of a peer's data, wait until the peer says "
            "it is written; before overwriting data peers read, wait until they say they are done.",
    "uninitialized_read": "Make the read match a write: the same peer, offsets and shape the writer used (a "
                          "gather writes slot r of every peer; a load reads the slot the peer filled).",
    "stale_signal": "Give each barrier its own signal row (or cell), or wait for the next count (WaitCmp.Ge with "
                    "a threshold that grows each phase), or consume the tokens after each wait.",
    "set_clobber": "Use NotifyOp.AtomicAdd with WaitCmp.Ge on a cell that several ranks notify; Set is for 1:1 "
                   "exchanges.",
    "peer_out_of_range": "Keep peers in [0, world): write the left neighbour as (r - 1 + n) % n.",
    "out_of_bounds": "Make offsets + shape fit inside the tensor or window (see the bounds in the message).",
    "shape_mismatch": "Make the argument's shape match the annotation; use pl.dynamic(\"NR\") for the rank count.",
    "type_mismatch": "Pass a value of the kind and dtype that the parameter or operation named in the message "
                     "takes, or change the parameter's annotation.",
    "read_only": "Annotate the parameter the message names pl.Out[...] (pl.InOut[...] if it is also read) where it "
                 "is declared, or write to an output instead.",
    "unknown_name": "Correct the name: use one the module has (python -c \"import ptodist.language as pl; "
                    "print(dir(pl))\" lists them).",
    "task_args_order": "Put every tensor parameter of the dispatched function before every scalar parameter (and the arguments likewise).",
    "dispatch_coverage": "Dispatch every rank exactly as `for r in pl.range(pld.world_size()): f(..., device=r)`.",
    "window_too_small": "alloc_window_buffer takes bytes: use pld.alloc_window_buffer(shape, dtype=...).",
    "collective_in_loop": "Pass an explicit signal window to the allreduce, or hoist it out of the loop.",
    "signal_layout": "Give each collective layout its own signal window, shaped for its mode ([NR, 1] mesh, "
                     "[2*(NR-1), NR] ring).",
    "aliasing": "Use separate windows for the collective's source, result and signal.",
    "invalid_argument": "Correct the argument named in the message.",
    "state_changed": "Pass values a kernel needs as arguments (scalars, tensors) instead of changing module state "
                     "between dispatches; keep what must outlive a dispatch in a tensor or window, and draw random "
                     "numbers in the driver (or with pl.random).",
    "rank_error": "Fix the error raised in the rank (see its traceback).",
    "internal_error": "Nothing to fix in your program: this is a bug in ptodist. Please report it, with the "
                      "traceback and, if you can, the program.",
    "rank_died": "The rank process ended without reporting, so there is no traceback: look for os._exit, a "
                 "native crash, an outside kill, or (killed by signal 9 when memory ran short) the OOM killer.",
    "resource": "Ask for less (smaller windows, fewer ranks) or raise the limit the message names.",
}

# A reduction's identity: the pad value that makes its padding change nothing (a product's, 1, is no pad mode).
_PAD_IDENTITY = {"sum": "pl.PadValue.zero", "prod": None, "max": "pl.PadValue.min", "argmax": "pl.PadValue.min",
                 "min": "pl.PadValue.max", "argmin": "pl.PadValue.max"}


def padding_read(rank: int, op: str, where: str, shape: tuple, valid: tuple, axis: int,
                 origin: str | None) -> Finding:
    """A reduction at ``where`` that reads the undefined padding of a ``shape`` tile valid over ``valid``.

    ``origin``: where the padding came from (the ``pl.load`` with ``valid_shape``), when known.
    """
    pad = _PAD_IDENTITY[op.rsplit(".", 1)[-1].rsplit("_", 1)[-1]]
    part = "row" if axis == len(shape) - 1 else "column"
    made = f" (made by pl.load with valid_shape at {origin})" if origin else ""
    message = (f"rank {rank}: {op} at {where} reads the padding of a {list(shape)} tile whose valid shape is "
               f"{list(valid)}{made}. On a device a reduction reads the whole {part}, padding included, and "
               "nothing filled the padding (it is undefined until pl.fillpad fills it), so the device's result "
               "depends on whatever the buffer held; this run reduced the valid part only, so its numbers can "
               "differ from the device's.")
    if pad is None:
        fix = (f"No pad mode is a product's identity (1): before {op} at {where}, load a tile of the valid shape "
               "(pl.load with shapes equal to the valid region, no valid_shape), so the reduction reads no padding.")
    else:
        fix = (f"Fill the padding with the reduction's identity before {op} at {where}: "
               f"tile = pl.fillpad(tile, pad_value={pad}) (pl.PadValue.zero for a sum, pl.PadValue.min for a max, "
               "pl.PadValue.max for a min).")
    return Finding("uninitialized_read", message, [rank], [loc for loc in (where, origin) if loc],
                   "8.1 silent data corruption", fix)


def misplaced(message: str, locations: list[str]) -> Finding:
    """A chip call without ``device=`` that round-robin placement put on another rank's slice (the planner's note)."""
    return Finding("dispatch_coverage", message, [], locations, "8.2 dispatch loop", FIXES["dispatch_coverage"])


# Kinds whose fix in FIXES is general: where an error's message states its own fix, that fix is the finding's.
_STATED_FIX_FIRST = frozenset({"invalid_argument", "type_mismatch", "shape_mismatch", "out_of_bounds",
                               "unknown_name"})
# The verbs a message's fix starts with ("... got 'sum'. Pass op=pld.ReduceOp.Sum."), after a sentence, a
# semicolon or a colon, maybe behind "if/when ...," or "otherwise" / "or".
_FIX_VERBS = ("pass", "use", "annotate", "give", "put", "call", "make", "declare", "convert", "keep", "stage",
              "write", "add", "remove", "move", "allocate", "share", "hoist", "cast", "reshape", "dispatch",
              "change", "replace", "define", "compile", "create", "choose", "bind", "wrap", "install", "split",
              "load", "copy", "return", "run", "register", "import", "rename", "avoid", "start", "loop", "read",
              "did you mean")
_STATED_FIX = re.compile(r"(?<=[.;:]) (?P<fix>(?:(?:if|when)\b[^,;.]*,\s*|otherwise,?\s+|or\s+)?"
                         r"(?:" + "|".join(_FIX_VERBS) + r")\b(?!-).*)", re.I | re.S)


def stated_fix(message: str) -> str | None:
    """The fix a message states in its own words (its clauses from the first one that says what to do), or None.

    Only the message's first line counts (a rank error's traceback follows it)."""
    m = _STATED_FIX.search(message.split("\n", 1)[0])
    if m is None:
        return None
    fix = m.group("fix").strip()
    fix = fix[0].upper() + fix[1:]
    return fix if fix.endswith((".", "?", ")", "`")) else fix + "."


def classify(exc: PtodistError) -> tuple[str, str | None, str]:
    """The kind, SPEC §8 row and fix of a finding about ``exc``: the error's own fix (its class's or its
    cause's), else the one its message states where its kind's fix is general, else its kind's."""
    kind = exc.kind
    fix = exc.fix or (stated_fix(str(exc)) if kind in _STATED_FIX_FIRST else None) or FIXES.get(kind, "")
    return kind, exc.pitfall, fix


_LOCATION = re.compile(r"((?:/|\.{0,2}/)?[\w.\-/]+\.py):(\d+)")


@dataclass
class Finding:
    """One diagnosed problem.

    ``pitfall`` is the SPEC §8 row's text (kept for compatibility); ``docs`` names the row's section of
    docs/pitfalls.md, derived from ``pitfall`` when not given; ``traceback`` is the rank's traceback for
    an error a rank raised ("" otherwise).
    """

    kind: str
    message: str
    ranks: list[int] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)
    pitfall: str | None = None
    fix: str = ""
    docs: str | None = None
    traceback: str = ""

    def __post_init__(self) -> None:
        if self.docs is None:
            self.docs = pitfall_docs(self.pitfall)

    def to_json(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        """Return the finding as a person reads it on a terminal (with the rank's traceback, if any)."""
        head = f"[{self.kind}]"
        if self.ranks:
            head += f" ranks {', '.join(map(str, self.ranks))}"
        if self.docs:
            head += f" (see {self.docs})"
        lines = [head, *("  " + line for line in self.message.splitlines())]
        if self.traceback:
            rank = f" of rank {self.ranks[0]}" if self.ranks else ""
            lines.append(f"  --- traceback{rank} ---")
            lines.extend("  " + line for line in self.traceback.rstrip().splitlines())
        if self.locations:
            lines.append("  at " + ", ".join(self.locations))
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)

    def summary(self) -> str:
        """The short block ``ptodist run`` prints under an error: kind, pitfall section, ranks, locations, fix.

        (The error printed above it already holds any traceback.)
        """
        parts = [f"ptodist: finding {self.kind}"]
        if self.docs:
            parts.append(f"(see {self.docs})")
        if self.ranks:
            parts.append(f"on ranks {', '.join(map(str, self.ranks))}")
        text = " ".join(parts)
        if self.locations:
            text += "\n  at " + ", ".join(self.locations)
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


def _locations(text: str) -> list[str]:
    """The ``file:line`` locations a message names, in order (not ptodist's own files)."""
    out: list[str] = []
    for m in _LOCATION.finditer(text):
        path = _with_spaces(text, m.start(1), m.group(1))
        loc = f"{path}:{m.group(2)}"
        if not is_internal(path) and loc not in out:
            out.append(loc)
    return out


def _with_spaces(text: str, start: int, path: str) -> str:
    """``path``, found in ``text`` at ``start``, extended to the left when that makes the path of a file with a
    space in it (a checkout under a folder such as ``with space/``): the longest such path, else ``path``."""
    line_start = text.rfind("\n", 0, start) + 1
    for j in range(line_start, start):  # leftmost first: the longest candidate
        if text[j] in "/." and (j == line_start or text[j - 1] in " ('\"[") and " " in text[j:start]:
            candidate = text[j:start] + path
            if os.path.isfile(candidate):
                return candidate
    return path


def _user_frames(tb_text: str) -> list[str]:
    """Return the user frames of a formatted traceback, innermost first: the program's own, or, where none is
    the program's, the libraries' (a finding's lines are where to look, and numpy's or ctypes' are not)."""
    frames = [(f, n) for f, n in reversed(re.findall(r'File "([^"]+)", line (\d+)', tb_text)) if not is_internal(f)]
    own = [(f, n) for f, n in frames if not is_library(f)]
    return [f"{f}:{n}" for f, n in (own or frames)]


# Python's own TypeError for a call its arguments do not fit ("load() missing 1 required positional argument").
_BAD_CALL = re.compile(r"^(\w+)\(\) (?:missing \d+ required|got an unexpected keyword argument|got multiple values "
                       r"for argument|takes (?:from )?\d+ (?:to \d+ )?positional argument)")


def signature_fix(message: str, tb_text: str) -> str | None:
    """For a ``pl``/``pld`` operation called with arguments that do not fit it (Python's TypeError), the fix that
    shows what it takes: ``Call pld.tile.remote_load as it is declared: pld.tile.remote_load(target, peer, ...)``.

    The operation is found as the program's innermost line spells it (``pld.tile.remote_load(``)."""
    m = _BAD_CALL.match(message)
    if m is None:
        return None
    code = [c for f, c in re.findall(r'File "([^"]+)", line \d+, in [^\n]*\n +([^\n]*)', tb_text)
            if not is_internal(f)]
    if not code:
        return None
    spelled = re.search(rf"\b(pld?(?:\.\w+)*\.{m.group(1)})\(", code[-1])
    if spelled is None:
        return None
    head, *rest = spelled.group(1).split(".")
    obj = {"pl": pl, "pld": pld}[head]
    try:
        for part in rest:
            obj = getattr(obj, part)
        sig = inspect.signature(obj)
    except (AttributeError, TypeError, ValueError):
        return None
    return f"Call {spelled.group(1)} as it is declared: {spelled.group(1)}{sig}."


def from_exception(exc: BaseException) -> list[Finding]:
    """Turn an exception ptodist raised (or any exception) into findings."""
    if isinstance(exc, RankError):
        return _from_rank_error(exc)
    if isinstance(exc, HangError):
        return _from_hang(exc)
    if isinstance(exc, CheckError):
        return list(exc.findings)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, PtodistError):
        kind, pitfall, fix = classify(exc)
        locations = list(exc.locations or [])
        locations += [loc for loc in _locations(str(exc)) if loc not in locations]
        if not locations:  # an error that names no line (a prepare() option): the user's call that raised it
            locations = [loc for loc in _user_frames(tb) if not loc.startswith("<")][:1]
        return [Finding(kind, str(exc), [], locations, pitfall, fix)]
    if isinstance(exc, PtodistInternalError):
        return [Finding("internal_error", f"{type(exc).__name__}: {exc}", [], _user_frames(tb), None,
                        FIXES["internal_error"], traceback=tb)]
    fix = (isinstance(exc, TypeError) and signature_fix(str(exc), tb)) or ""
    return [Finding("invalid_argument", f"{type(exc).__name__}: {exc}", [], _user_frames(tb), None, fix)]


def _from_rank_error(exc: RankError) -> list[Finding]:
    # Ranks that failed the same way make one finding.
    groups: dict[tuple, Finding] = {}
    for f in exc.failures:
        original = f.exception
        internal = getattr(f, "internal", False)
        if isinstance(original, PtodistError):
            kind, pitfall, fix = classify(original)
        elif internal:
            kind, pitfall, fix = "internal_error", None, FIXES["internal_error"]
        elif f.error_type == "RankDied":
            kind, pitfall, fix = "rank_died", None, FIXES["rank_died"]
        else:
            kind, pitfall = "rank_error", None
            fix = (f.error_type == "TypeError" and signature_fix(f.message, f.traceback)) or FIXES["rank_error"]
        message = f"{f.error_type}: {f.message}"
        # The same error on each rank's own slice ('y[0]' on rank 0, 'y[1]' on rank 1) is one bug too.
        same = re.sub(rf"'([^'\s]*)\[{f.rank}\]'", r"'\1[?]'", f.message.replace(f"rank {f.rank}", "rank ?"))
        key = (kind, f.error_type, same)
        if key in groups:
            groups[key].ranks.append(f.rank)
            continue
        locations = _locations(f.message)
        for loc in _user_frames(f.traceback):
            if loc not in locations:
                locations.append(loc)
        where = f" in task '{f.task}'" if f.task else ""
        first = getattr(original, "locations", None)
        if first:
            locations = [*first, *(loc for loc in locations if loc not in first)]
        # The traceback goes with the finding: `ptodist check` prints findings alone. A PtodistError's
        # message says all (its traceback is only the user's call chain, listed in ``locations``).
        tb = "" if isinstance(original, PtodistError) else f.traceback
        groups[key] = Finding(kind, f"rank {f.rank} (device {f.device_id}){where}: {message}", [f.rank], locations,
                              pitfall, fix, traceback=tb)
    return list(groups.values())


def _from_hang(exc: HangError) -> list[Finding]:
    blocked = [s for s in exc.ranks if s["state"] == "waiting"]
    diagnosis = exc.diagnosis
    # Root cause first: the clobbering Set notifies, when that is the cause; then the blocked waits.
    locations = list(diagnosis.get("culprits", []))
    for s in blocked:
        for w in (s, *s.get("others", ())):  # a rank waiting for any of several deferred waits: each one's line
            if w.get("where") and w["where"] not in locations:
                locations.append(w["where"])
    kind = diagnosis.get("kind", "hang")
    pitfall = "8.1 signal never reaches expected; 8.3 step 04" if kind == "set_clobber" else HangError.pitfall
    pitfall = diagnosis.get("pitfall", pitfall)  # a cause that is another row of SPEC §8
    fix = diagnosis.get("fix") or FIXES.get(kind, FIXES["hang"])
    return [Finding(kind, str(exc), [s["rank"] for s in blocked], locations, pitfall, fix)]


def report(status: str, findings: list[Finding]) -> dict:
    """The ``--report-json`` document."""
    return {"status": status, "findings": [f.to_json() for f in findings]}
