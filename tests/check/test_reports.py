"""Reports say what they promise: the pitfall index they point at, a bug in ptodist told from the program's,
the traceback of a rank's error, what a rank that died was doing, fixes for the cause found.

* ``docs/pitfalls.md`` has a section per SPEC §8 row; findings name it (``docs``), the terminal shows it; its
  ``# check:`` blocks give, under the checker, exactly the findings shown below them (``tests/cli/test_docs.py``
  runs its ``# raises:`` blocks).
* An exception raised in ptodist's own code by mistake is a ``RankInternalError`` (also a
  ``PtodistInternalError``) with the whole traceback, never the program's ``rank_error``; the rule
  (``ptodist.rank.failures.ptodist_bug``) leaves errors ptodist raises on purpose, and errors of the program's own
  code or of libraries it called, to the program.
* ``ptodist check`` prints a rank's traceback under its ``rank_error`` finding.
* The status board keeps the last communication operation of every rank and its line.
"""

from __future__ import annotations

import inspect
import json
import linecache
import re
import runpy
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
from conftest import PACKAGE_DIR, marker_line, on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, HangError, PtodistInternalError, RankError, RunConfig, cli
from ptodist.backends import base
from ptodist.check import explore, findings, hang
from ptodist.errors import INTERNAL_NOTE, KernelIndexError, RankInternalError
from ptodist.rank import failures, status

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "pitfalls.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)
NR = pl.dynamic("NR")
SIZE = 8


def _line(marker: str) -> str:
    return f"{__file__}:{marker_line(__file__, marker)}"


# -- the pitfall index -------------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors() -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", PAGE.read_text()), re.M)}


def test_the_pitfall_index_has_a_section_for_every_row_reports_name():
    anchors = _anchors()
    rows = [*findings.PITFALL_ANCHORS.values(), *findings.STEP_ANCHORS.values()]
    assert len(rows) == 6 + 4 + 16  # SPEC §8.1's rows, §8.2's bullets, §8.3's steps
    missing = [a for a in rows if a not in anchors]
    assert not missing, f"docs/pitfalls.md has no section for {missing}"


@pytest.mark.parametrize("pitfall, anchor", [
    ("8.1 all ranks hang", "all-ranks-hang"),
    ("8.1 signal never reaches expected; 8.3 step 04", "signal-never-reaches-expected"),
    ("8.1 shape mismatch at compile time; 8.3 step 07", "shape-mismatch-at-compile-time"),
    ("8.1 TypeError at dispatch; 8.2 missing .share_memory_()", "typeerror-at-dispatch"),
    ("8.2 alloc_window_buffer(NR)", "a-rank-count-as-the-window-size"),
    ("8.2 dispatch loop trip count != len(device_ids)", "dispatch-loop-does-not-cover-every-rank"),
    ("8.2 scalar before tensor; 8.3 step 01", "scalar-parameter-before-a-tensor-parameter"),
    ("8.3 steps 05, 06, 08 (data race)", "step-05-rma-before-the-ordering-barrier"),
    ("8.3 step 09 (stale signal)", "step-09-two-barriers-reuse-one-signal-row"),
    ("8.3 steps 11, 16", "step-11-signal-shape-vs-collective-mode"),
])
def test_a_pitfall_row_maps_to_its_section(pitfall, anchor):
    assert findings.pitfall_docs(pitfall) == f"docs/pitfalls.md#{anchor}"
    assert anchor in _anchors()


def test_every_error_class_with_a_pitfall_names_a_section():
    import ptodist.errors as errors

    classes = [c for c in vars(errors).values() if isinstance(c, type) and getattr(c, "pitfall", None)]
    assert len(classes) >= 10
    for c in classes:
        assert findings.pitfall_docs(c.pitfall), f"{c.__name__}.pitfall {c.pitfall!r} names no section"


def test_a_finding_shows_its_section_instead_of_the_spec_row():
    f = findings.Finding("race", "data race on ...", [0, 1], ["prog.py:7"], "8.3 steps 05, 06, 08 (data race)",
                         "Order the two accesses.")
    assert f.docs == "docs/pitfalls.md#step-05-rma-before-the-ordering-barrier"
    assert f.render().splitlines()[0] == "[race] ranks 0, 1 (see docs/pitfalls.md#step-05-rma-before-the-ordering-barrier)"
    assert f.summary().splitlines()[0] == ("ptodist: finding race (see docs/pitfalls.md#step-05-rma-before-the-"
                                           "ordering-barrier) on ranks 0, 1")
    assert "SPEC" not in f.render() + f.summary()
    doc = f.to_json()
    assert doc["pitfall"] == "8.3 steps 05, 06, 08 (data race)"  # kept for compatibility
    assert doc["docs"] == "docs/pitfalls.md#step-05-rma-before-the-ordering-barrier" and doc["traceback"] == ""
    assert findings.Finding("rank_error", "x").docs is None


def _check_blocks():
    text = PAGE.read_text()
    found = [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]
    out = []
    for i, (lang, body, line) in enumerate(found):
        if lang == "python" and body.startswith("# check:"):
            assert found[i + 1][0] == "text", f"pitfalls.md:{line}: a ```text block must follow"
            out.append(pytest.param(body, found[i + 1][1].rstrip("\n"), id=f"pitfalls.md:{line}"))
    return out


def _preamble() -> str:
    return next(m.group(2) for m in FENCE.finditer(PAGE.read_text())
                if m.group(1) == "python" and m.group(2).startswith("# preamble"))


def _normalise(message: str) -> str:
    return re.sub(r"\d+\.\d+", "#", message)


def test_the_pitfall_index_has_check_blocks():
    assert len(_check_blocks()) >= 6


@pytest.mark.parametrize("body, expected", _check_blocks())
def test_check_block(body, expected, tmp_path, monkeypatch):
    kind = body.splitlines()[0].split(":", 1)[1].strip()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    linecache.clearcache()
    (tmp_path / "preamble.py").write_text(_preamble())
    namespace = runpy.run_path("preamble.py")
    (tmp_path / "prog.py").write_text(body)
    # What `ptodist check` reports for the schedule: the checker's findings or, when the program then fails, the
    # cause the session suspects (an output read before its result()); the program's own error follows those.
    outcome = explore.run_checked(lambda: runpy.run_path("prog.py", init_globals=namespace, run_name="__main__"), 0)
    assert outcome.failed and (outcome.error is None or outcome.session.suspects), outcome.traceback
    shown = [*outcome.session.findings, *(outcome.session.suspects if outcome.error is not None else [])]
    assert kind in [f.kind for f in shown]
    bug = next(i for i, t in enumerate(body.splitlines(), 1) if "# BUG" in t)
    assert any(f"prog.py:{bug}" in f.locations for f in shown if f.kind == kind)
    got = "\n".join(f.render() for f in shown)
    assert _normalise(got) == _normalise(expected)


# -- a bug in ptodist is not the program's error ------------------------------------------------------------------

def _raised(fn, *args):
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("nothing was raised")


def _user_raises():
    raise RuntimeError("the program's own error")


def _user_calls_numpy():
    return np.reshape(np.zeros(12), (5, 2))


def _in_ptodists_file(expression: str):
    """A function whose code claims to be on line 2 of a ptodist file (a line without ``raise``)."""
    namespace: dict = {}
    exec(compile(f"\ndef f():\n    return {expression}\n", base.__file__, "exec"), namespace)
    return namespace["f"]


def test_errors_ptodist_raises_on_purpose_or_the_program_raises_are_not_ptodist_bugs():
    from ptodist.compiler import checks
    from ptodist.language import Scalar

    on_purpose = [
        _raised(checks.bind_shape, "x", (4,), (2,), {}, 2),                                # a PtodistError
        _raised(pl.add, pl.full([2, 3], dtype=pl.FP32, value=0.0), pl.full([2, 2], dtype=pl.FP32, value=0.0)),
        _raised(lambda: Scalar(1, pl.INT32) / 0),                                           # a builtin, raised
        _raised(_user_raises),                                                              # the program's code
        _raised(_user_calls_numpy),                                                         # numpy, called by it
        _raised(_in_ptodists_file("[0] * (1 << 62)")),                                      # the machine's limits
        _raised(_in_ptodists_file("open('/nonexistent/ptodist/file')")),
    ]
    assert isinstance(on_purpose[1], ValueError) and isinstance(on_purpose[2], ZeroDivisionError)
    assert isinstance(on_purpose[-2], MemoryError) and isinstance(on_purpose[-1], OSError)
    for e in on_purpose:
        assert failures.ptodist_bug(e) is None, "".join(traceback.format_exception(e))


def test_an_error_raised_in_ptodists_code_without_a_raise_statement_is_a_ptodist_bug():
    from ptodist.compiler import checks

    not_iterable = _raised(checks._decl, 5)               # TypeError: 'int' object is not iterable, in checks.py
    frame = failures.ptodist_bug(not_iterable)
    assert frame is not None and frame.filename == checks.__file__ and frame.name == "_decl"
    # A numpy error inside ptodist's call of numpy: the innermost frame that is not library code is ptodist's.
    bad_view = _raised(lambda: status.StatusBoard(np.zeros(3, np.uint8), 1))
    assert isinstance(bad_view, ValueError) and failures.ptodist_bug(bad_view).filename == status.__file__
    tb = failures.user_traceback(not_iterable)
    assert f'File "{checks.__file__}"' in tb  # every frame kept, ptodist's included


def _signal_program(body):
    """A one-kernel program on an ``[NR, 1]`` signal window; the kernel runs ``body(y, sig, me, n)``."""
    @pl.jit.incore
    def kernel(y: pl.Out[pl.Tensor[[1, SIZE], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
        ctx = pld.get_comm_ctx(sig)
        body(y, sig, pld.rank(ctx), pld.nranks(ctx))
        return y

    return on_every_rank(kernel, name="host")


def _notify_next(y, sig, me, n) -> None:
    pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @planted


def _cfg(backend: str, **kw) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=backend, hang_timeout_s=10, **kw)


@pytest.mark.parametrize("backend", ["sim", "shm"])
def test_a_bug_in_ptodist_inside_a_rank_is_a_ptodist_internal_error(backend, monkeypatch):
    import ptodist.rank.memory_calls as rank_mod

    monkeypatch.setattr(rank_mod, "_index", None)  # a bug planted in ptodist: its peer check calls None
    with pytest.raises(RankError) as info:
        _signal_program(_notify_next)(np.zeros((2, 1, SIZE), np.float32), config=_cfg(backend))
    e = info.value
    assert isinstance(e, RankInternalError) and isinstance(e, PtodistInternalError) and e.internal
    assert all(f.internal for f in e.failures) and isinstance(e.original, TypeError)
    text = str(e)
    head = text.split("\n--- traceback")[0]
    assert head.endswith("failed in task 'kernel': TypeError: 'NoneType' object is not callable\n" + INTERNAL_NOTE)
    assert f'File "{rank_mod.__file__}"' in text and "in _peer" in text  # ptodist's own frames, where it broke
    assert f'File "{__file__}"' in text                                     # and the program's, above them
    (f,) = findings.from_exception(e)
    assert f.kind == "internal_error" and f.ranks == [0, 1]
    assert f.fix == findings.FIXES["internal_error"] and "bug in ptodist" in f.fix
    assert f.locations[0] == _line("planted")
    assert "in _peer" in f.traceback
    rendered = f.render()
    assert "  --- traceback of rank 0 ---" in rendered and "in _peer" in rendered


def _user_bug(y, sig, me, n) -> None:
    if me == 1:
        raise RuntimeError("user bug on rank one")  # @user_raise


def test_an_error_in_the_program_is_its_rank_error_and_check_shows_its_traceback():
    with explore.checking(0) as session:
        with pytest.raises(RankError) as info:
            _signal_program(_user_bug)(np.zeros((2, 1, SIZE), np.float32), config=_cfg("sim"))
    e = info.value
    assert type(e) is RankError and not e.internal and not isinstance(e, PtodistInternalError)
    assert INTERNAL_NOTE not in str(e) and session.findings == []
    (f,) = findings.from_exception(e)
    assert f.kind == "rank_error" and f.fix == "Fix the error raised in the rank (see its traceback)."
    assert f.locations[0] == _line("user_raise")
    lines = f.render().splitlines()
    assert lines[:3] == ["[rank_error] ranks 1",
                         "  rank 1 (device 1) in task 'kernel': RuntimeError: user bug on rank one",
                         "  --- traceback of rank 1 ---"]
    assert f'    File "{__file__}", line {_line("user_raise").rsplit(":", 1)[1]}, in _user_bug' in lines
    assert lines[-3] == "  RuntimeError: user bug on rank one"
    assert PACKAGE_DIR not in f.traceback  # the program's frames only
    assert json.loads(json.dumps(f.to_json()))["traceback"] == f.traceback


def test_a_ptodist_error_in_a_rank_carries_no_traceback_in_its_finding():
    def out_of_bounds(y, sig, me, n):
        pl.load(y, [0, 4], [1, SIZE])

    with pytest.raises(RankError) as info:
        _signal_program(out_of_bounds)(np.zeros((2, 1, SIZE), np.float32), config=_cfg("sim"))
    assert isinstance(info.value.original, KernelIndexError) and not info.value.internal
    found = findings.from_exception(info.value)
    assert found and all(f.kind == "out_of_bounds" and f.traceback == "" for f in found)


def _cli_reports_internal_errors() -> bool:
    return "RankInternalError" in inspect.getsource(cli)


PLANTED = '''
import numpy as np
import ptodist.language as pl
import ptodist.language.distributed as pld
import ptodist.rank.memory_calls
from ptodist import DistributedConfig, RunConfig

ptodist.rank.memory_calls._index = None  # a bug planted in ptodist (it converts a Scalar peer)


@pl.jit.incore
def kernel(sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
    pld.system.notify(sig, pl.const(0, pl.INT32), [0, 0], 1, op=pld.NotifyOp.AtomicAdd)


@pl.jit
def per_rank(sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
    kernel(sig)


@pl.jit.host
def host(x: pl.Tensor[[2, 1], pl.FP32]):
    buf = pld.alloc_window_buffer([2, 1], dtype=pl.INT32)
    for r in pl.range(pld.world_size()):
        per_rank(pld.window(buf, [2, 1], dtype=pl.INT32), device=r)


host(np.zeros((2, 1), np.float32), config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
'''


@pytest.mark.skipif(not _cli_reports_internal_errors(),
                    reason="cli.py does not yet report RankInternalError (the change is in the report)")
def test_ptodist_run_exits_3_for_a_bug_in_ptodist(tmp_path, capsys, monkeypatch):
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    monkeypatch.setattr(sys, "path", list(sys.path))
    import ptodist.rank.memory_calls as rank_mod

    monkeypatch.setattr(rank_mod, "_index", rank_mod._index)  # undone after the test
    rc = cli.main(["run", "--report-json", str(tmp_path / "r.json"), str(script)])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "ptodist: RankInternalError: " in err and INTERNAL_NOTE in err
    assert "ptodist: this is a bug in ptodist, not in your program; please report it." in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and [f["kind"] for f in report["findings"]] == ["internal_error"]


# -- what a rank was doing: the status board's last operation -----------------------------------------------------

def _doing() -> str:
    """What this rank's status board says it is doing (read in the rank, on the sim backend)."""
    from ptodist import context

    ctx = context.current()
    return base.last_activity(ctx.status, ctx.rank)


def _seen(me, what: str) -> None:
    # Printed, as a user observes a rank: what a rank's code changes in Python state is refused.
    print(f"SEEN|{int(me)}|{what}|{_doing()}", flush=True)


def _each_op(y, sig, me, n) -> None:
    _seen(me, "start")
    pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @op_notify
    _seen(me, "notify")
    pld.system.wait(sig, [(me - 1 + n) % n, 0], 1, cmp=pld.WaitCmp.Ge)  # @op_wait
    _seen(me, "wait")
    pld.tensor.barrier(sig)  # @op_barrier
    _seen(me, "barrier")  # its own notifies and waits are the collective's
    pl.store(pl.load(y, [0, 0], [1, SIZE]), [0, 0], y)
    _seen(me, "store")  # a local operation changes nothing


def test_the_status_board_keeps_each_ranks_last_communication_and_its_line(capsys):
    _signal_program(_each_op)(np.zeros((2, 1, SIZE), np.float32), config=_cfg("sim"))
    seen = [line.split("SEEN|", 1)[1].split("|", 2) for line in capsys.readouterr().out.splitlines()
            if "SEEN|" in line]
    want = {
        "start": "; it was running 'kernel', and it had made no communication operation yet",
        "notify": f"; it was running 'kernel', and its last operation was pld.system.notify at {_line('op_notify')}",
        "wait": f"; it was running 'kernel', and its last operation was pld.system.wait at {_line('op_wait')}",
        "barrier": f"; it was running 'kernel', and its last operation was pld.tensor.barrier at {_line('op_barrier')}",
    }
    want["store"] = want["barrier"]
    for me in (0, 1):
        assert {what: said for r, what, said in seen if r == str(me)} == want


def test_last_activity_of_a_rank_that_never_started_is_empty():
    board = status.StatusBoard(np.zeros(status.StatusBoard.nbytes(2), np.uint8), 2)
    assert base.last_activity(board, 1) == ""
    assert board.last_op(1) == ("", "")


def _shm_names_the_last_operation() -> bool:
    from ptodist.backends.shm import group

    return "last_activity" in inspect.getsource(group)


def _notify_then_exit(y, sig, me, n) -> None:
    import os

    pld.system.notify(sig, 0, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)  # @before_exit
    if me == 1:
        os._exit(3)  # @exit_call
    pld.system.wait(sig, [1, 0], 1, cmp=pld.WaitCmp.Ge)


@pytest.mark.skipif(not _shm_names_the_last_operation(),
                    reason="backends/shm.py does not yet call base.last_activity (the change is in the report)")
def test_a_rank_that_dies_without_a_traceback_names_its_kernel_and_last_operation():
    with pytest.raises(RankError) as info:
        _signal_program(_notify_then_exit)(np.zeros((2, 1, SIZE), np.float32), config=_cfg("shm"))
    e = info.value
    assert e.failures[0].error_type == "RankDied" and e.rank == 1
    assert str(e).splitlines()[0] == (
        "rank 1 (device 1) failed in task 'kernel': RankDied: the rank process called os._exit(3) at "
        f"{_line('exit_call')} in _notify_then_exit (its last Python line), which ends a process at once, without "
        f"reporting a result; its last communication was pld.system.notify at {_line('before_exit')}")
    (f,) = findings.from_exception(e)
    assert f.kind == "rank_died" and f.locations[:2] == [_line("exit_call"), _line("before_exit")]


# -- fixes for the cause found -------------------------------------------------------------------------------------

def _wait_first(y, sig, me, n) -> None:
    for src in range(n):
        pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)
    for peer in range(n):
        pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)


def _zero_notify(y, sig, me, n) -> None:
    pld.system.notify(sig, (me + 1) % n, [me, 0], 0, op=pld.NotifyOp.AtomicAdd)  # @zero
    pld.system.wait(sig, [(me - 1 + n) % n, 0], 1, cmp=pld.WaitCmp.Ge)


@pytest.mark.parametrize("body, fix", [(_wait_first, hang.FIX_WAIT_FIRST), (_zero_notify, hang.FIX_ZERO_NOTIFY)],
                         ids=["wait first", "zero notify"])
def test_a_hang_gets_the_fix_for_its_cause(body, fix):
    with pytest.raises(HangError) as info:
        _signal_program(body)(np.zeros((2, 1, SIZE), np.float32), config=_cfg("sim"))
    (f,) = findings.from_exception(info.value)
    assert f.kind == "hang" and f.fix == fix
    assert f.docs == "docs/pitfalls.md#all-ranks-hang"


def test_a_peer_past_the_world_gets_its_own_fix():
    def past(y, sig, me, n):
        pld.system.notify(sig, n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)

    with pytest.raises(RankError) as info:
        _signal_program(past)(np.zeros((2, 1, SIZE), np.float32), config=_cfg("sim"))
    (f,) = findings.from_exception(info.value)
    assert f.kind == "peer_out_of_range"
    assert f.fix == ("Keep peers in [0, world): a peer is a rank index, not a device id; write the right neighbour "
                     "as (r + 1) % n.")
    assert f.docs == "docs/pitfalls.md#step-10-negative-left-neighbour"


def test_a_location_in_a_folder_with_a_space_is_named_whole(tmp_path):
    # A checkout cloned under such a folder: a finding's locations are files, not the tail after the space.
    program = tmp_path / "with space" / "prog.py"
    program.parent.mkdir()
    program.write_text("x = 1\n")
    other = tmp_path / "other.py"
    other.write_text("y = 2\n")
    error = KernelIndexError(f"pl.load at {program}:1: out of bounds; the window was made at {other}:1")
    (f,) = findings.from_exception(error)
    assert f.locations == [f"{program}:1", f"{other}:1"]
