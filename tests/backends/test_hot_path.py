"""The per-operation hot path: its native pieces, and that what they do not answer still reaches the full checks.

Every pld signal and RMA operation checks its region or cell with ``_atomics.region`` / ``_atomics.flat`` (plain
ints only), finds the program's line through a per-call-site cache (``_atomics.call_site``), and records itself in
the rank's status-board row with one ``Ledger`` call. These tests pin the contracts the Python side relies on, and
that indices of other kinds (numpy integers, Scalars, bools, out-of-bounds values) still get the full treatment.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from test_rma import N, compile_body

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import RankError, _atomics
from ptodist.errors import KernelIndexError
from ptodist.rank.status import LAST_OP_CODES, StatusBoard

# -- region / flat: the plain case only ------------------------------------------------------------------------

@pytest.mark.parametrize("offsets, shape, bounds, expected", [
    ([1, 2], [3, 4], (10, 10), (slice(1, 4), slice(2, 6))),
    ((0,), (5,), (5,), (slice(0, 5),)),
    ([], [], (), ()),
    ([0, 0, 0], [1, 2, 3], (1, 2, 3), (slice(0, 1), slice(0, 2), slice(0, 3))),
])
def test_region_gives_the_slices_of_a_plain_region(offsets, shape, bounds, expected):
    assert _atomics.region(offsets, shape, bounds) == expected


@pytest.mark.parametrize("offsets, shape, bounds", [
    ([1, 2], [3, 9], (10, 10)),                # past the end
    ([-1, 0], [1, 1], (10, 10)),               # negative offset
    ([0, 0], [-1, 1], (10, 10)),               # negative size
    ([0], [1, 1], (10, 10)),                   # lengths differ
    ([True, 0], [1, 1], (10, 10)),             # a bool is not an index here
    ([np.int64(1), 0], [1, 1], (10, 10)),      # numpy integers take the Python path
    ([0, 0], [1.0, 1], (10, 10)),
    ([0, 2**70], [1, 1], (10, 10)),            # does not fit: the Python path explains it
    (0, [1], (10,)),                           # not a sequence
])
def test_region_leaves_everything_else_to_the_full_checks(offsets, shape, bounds):
    assert _atomics.region(offsets, shape, bounds) is None


def test_flat_gives_the_row_major_index_or_minus_one():
    assert _atomics.flat([1, 2], (3, 4)) == 6
    assert _atomics.flat((0,), (3,)) == 0
    assert _atomics.flat([3, 0], (3, 4)) == -1
    assert _atomics.flat([0, -1], (3, 4)) == -1
    assert _atomics.flat([np.int32(0), 0], (3, 4)) == -1
    assert _atomics.flat(2, (3,)) == -1


def test_offsets_of_other_integer_kinds_still_load_the_right_region(backend):
    # numpy integers and Scalars are not plain ints: the Python path converts them.
    def body(x, y, win, sig, me, n):
        pl.store(pl.load(x, [0, 0], [1, N]), [0, 0], win)
        for p in pl.range(n):
            pld.system.notify(sig, p, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
        for p in pl.range(n):
            pld.system.wait(sig, [p, np.int64(0)], 1, cmp=pld.WaitCmp.Ge)
        other = (me + 1) % n
        t = pld.tile.remote_load(win, other, (np.int64(0), me * 0), [1, N])
        pl.store(t, [me, 0], y)

    x = np.arange(2 * 2 * N, dtype=np.float32).reshape(2, 2, N)
    y = compile_body(body, 2, backend=backend)(x)
    for r in range(2):
        np.testing.assert_array_equal(y[r, r], x[(r + 1) % 2, 0])


def test_an_out_of_bounds_plain_region_is_the_explained_error(backend):
    def body(x, y, win, sig, me, n):
        pld.tile.remote_load(win, 0, [1, 4], [1, N])  # the line the error names

    with pytest.raises(RankError) as info:
        compile_body(body, 2, backend=backend)(np.zeros((2, 2, N), np.float32))
    err = info.value.original
    assert isinstance(err, KernelIndexError)
    assert "out of bounds" in str(err) and "reach [4, 12) in dimension 1, whose bounds are [0, 8)" in str(err)
    assert f"test_hot_path.py:{body.__code__.co_firstlineno + 1}" in str(err)


# -- the ledger: one call per operation ------------------------------------------------------------------------

def board_and_ledger():
    raw = np.zeros(StatusBoard.nbytes(1), np.uint8)
    board = StatusBoard(raw, 1)
    return board, board.ledger(0)


def test_a_notify_updates_the_cell_and_records_itself():
    board, ledger = board_and_ledger()
    cells = np.zeros(4, np.int32)
    sleepers = np.zeros(1, np.int32)
    slot = board.site_slot(0, ("prog.py", 12))
    word = LAST_OP_CODES["pld.system.notify"] | (slot << 32)
    cells[1] = 2**31 - 1
    old = ledger.notify(cells.ctypes.data + 4, sleepers.ctypes.data, 1, 0, word, 7, 1, 4, slot)
    assert old == 2**31 - 1 and cells[1] == -2**31  # INT32 wraps, as on the device
    assert ledger.notify(cells.ctypes.data, sleepers.ctypes.data, 5, 1, 0, 7, 1, 0, -1) == 0 and cells[0] == 5
    assert int(board.rows[0]["progress"]) == 2
    assert board.last_op(0) == ("pld.system.notify", "prog.py:12")  # the Set passed word 0: left as it was
    sent = board.sent(0)
    assert [(e["buffer"], e["owner"], e["offset"], e["op"], e["value"], e["old"], e["new"], e["where"])
            for e in sent] == [(7, 1, 4, "AtomicAdd", 1, 2**31 - 1, -2**31, "prog.py:12"),
                               (7, 1, 0, "Set", 5, 0, 5, "")]


def test_the_ring_keeps_the_latest_notifies_in_order():
    board, ledger = board_and_ledger()
    for i in range(300):
        ledger.sent(1, 0, 0, 0, 1, i, -1)
    olds = [e["old"] for e in board.sent(0)]
    assert olds == list(range(300 - len(olds), 300)) and len(olds) == 256


def test_step_counts_and_keeps_the_last_operation_unless_zero():
    board, ledger = board_and_ledger()
    ledger.step(LAST_OP_CODES["pld.tensor.put"] | (board.site_slot(0, ("a.py", 3)) << 32))
    ledger.step(0)
    assert int(board.rows[0]["progress"]) == 2
    assert board.last_op(0) == ("pld.tensor.put", "a.py:3")


# -- call_site: the cache of the program's lines ------------------------------------------------------------

@pytest.mark.skipif(sys.version_info < (3, 11), reason="before 3.11 the Python side walks the stack itself")
def test_call_site_answers_from_the_cache_and_hands_back_what_it_lacks():
    cache: dict = {}

    def op():  # an "operation" one frame below its caller; also the caller's key as Python spells it
        caller_frame = sys._getframe(1)
        return _atomics.call_site(cache, 1), (id(caller_frame.f_code), caller_frame.f_lasti)

    def caller():
        return op()

    found, key = caller()  # not cached yet: the caller's frame comes back
    assert found.f_code is caller.__code__ and key[0] == id(caller.__code__)
    cache[key] = (caller.__code__, ("x.py", 1))
    assert caller()[0] == ("x.py", 1)
    cache[key] = (caller.__code__, None)  # a frame of ptodist's own: look further up, at this test's line
    above = caller()[0]
    assert above is not None and above.f_code is sys._getframe(0).f_code


# -- a kernel's collective is checked once per line and arguments ---------------------------------------------

def test_a_collective_in_a_loop_runs_every_time(backend):
    def body(x, y, win, sig, me, n):
        pl.store(pl.load(x, [0, 0], [n, N]), [0, 0], win)
        for _ in pl.range(3):  # checked at the first call, run at every one
            pld.tensor.allreduce(win, sig, op=pld.ReduceOp.Sum)
        pl.store(pl.load(win, [0, 0], [n, N]), [0, 0], y)

    x = np.random.default_rng(1).standard_normal((2, 2, N)).astype(np.float32)
    y = compile_body(body, 2, backend=backend)(x)
    for r in range(2):
        np.testing.assert_allclose(y[r], 4 * (x[0] + x[1]), rtol=1e-5)


def test_the_same_line_with_other_arguments_is_checked_again(backend):
    def body(x, y, win, sig, me, n):
        for s in (sig, sig, win):
            pld.tensor.allreduce(win, s, op=pld.ReduceOp.Sum)  # the third call's signal is the FP32 data window

    with pytest.raises(RankError) as info:
        compile_body(body, 2, backend=backend)(np.zeros((2, 2, N), np.float32))
    err = str(info.value.original)
    assert "the signal must be an INT32 window" in err
    assert f"test_hot_path.py:{body.__code__.co_firstlineno + 2}" in err


def test_a_put_between_dtypes_is_the_explained_error(backend):
    # Plain regions, but the dtypes differ: the inline copy steps aside for the full check.
    def body(x, y, win, sig, me, n):
        half = pl.create_tensor([1, N], pl.FP16)
        pld.tensor.put(win, 0, half, [0, 0], [0, 0], [1, N])  # the line the error names

    with pytest.raises(RankError) as info:
        compile_body(body, 2, backend=backend)(np.zeros((2, 2, N), np.float32))
    err = str(info.value.original)
    assert "have different dtypes" in err and "FP16" in err
    assert f"test_hot_path.py:{body.__code__.co_firstlineno + 2}" in err
