"""A DistributedWorker whose sub-worker callback fails: the dispatch fails, the worker goes on.

A callback's exception of any kind (SystemExit and KeyboardInterrupt too) fails its own dispatch and
is what ``result()`` raises, on every backend.  On mpi every process of the job drives its own copy of
the worker: a callback (or the binding of a dispatch's arguments) that fails in one process fails that
dispatch in every process, and the next dispatch is right everywhere.

This file is also the program the mpi tests run: ``python tests/worker/test_worker_failures.py MODE OUT_DIR``
runs a scenario in every process of an ``mpirun -n 2`` job and writes each process's outcomes, one per
dispatch, to ``OUT_DIR/process<r>.json``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
from test_mpi import _leftovers, _mpirun, needs_mpi

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, ir

NR = pl.dynamic("NR")
THIS = Path(__file__).resolve()


@pl.program
class Faulty:
    @pl.function(type=pl.FunctionType.InCore)
    def kernel(self, x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        return pl.store(pl.mul(pl.load(x, [0, 0], [1, 4]), 2.0), [0, 0], y)

    @pl.function(type=pl.FunctionType.Orchestration)
    def chip(self, x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        return self.kernel(x, y)

    @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
    def inspect(self, y: pl.Tensor[[NR, 1, 4], pl.FP32]):
        ...

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, x: pl.InOut[pl.Tensor[[NR, 1, 4], pl.FP32]], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            self.chip(x[r], y[r], device=r)  # y = 2x
        self.inspect(y)
        for r in pl.range(pld.world_size()):
            self.chip(y[r], x[r], device=r)  # x = 4x


@pl.program
class Astray:
    """Calls its sub-worker in MPI process 1 only: a host orchestrator whose control flow depends on the process."""

    @pl.function(type=pl.FunctionType.Orchestration)
    def chip(self, x: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        return Faulty.kernel(x, y)

    @pl.function(level=pl.Level.HOST, role=pl.Role.SubWorker)
    def inspect(self, y: pl.Tensor[[NR, 1, 4], pl.FP32]):
        ...

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, x: pl.Tensor[[NR, 1, 4], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            self.chip(x[r], y[r], device=r)
        if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
            self.inspect(y)


def inputs(v: float, shape=(2, 1, 4)):
    """A dispatch's host tensors: x filled with ``v``; the callback sees y = 2v, and x ends as 4v."""
    x = ptodist.shared_array(shape, pl.FP32)
    x[...] = v
    return x, ptodist.shared_array(shape, pl.FP32)


def failing(what: dict, process: int = 0):
    """A callback that raises ``what[v]`` (an exception, or a callable making one) in the dispatch of x = v, in
    process ``process`` of an mpi job (the only process elsewhere)."""
    me = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))

    def inspect(args):
        raise_ = what.get(float(args.tensor(0)[0, 0, 0]) / 2) if me == process else None
        if raise_ is not None:
            raise raise_() if callable(raise_) else raise_

    return inspect


# =============================================================================================
# Every backend in one process: shm and sim

@pytest.fixture
def worker(local_backend):
    def prepare(callback):
        compiled = ir.compile(Faulty, distributed_config=DistributedConfig(device_ids=[0, 1]))
        rt = compiled.prepare(RunConfig(backend=local_backend), callbacks={"inspect": callback})
        return compiled, rt

    return prepare


def test_systemexit_in_a_callback_is_its_dispatchs_result_on_every_backend(worker):
    exit_ = SystemExit(5)
    compiled, rt = worker(failing({1.0: exit_}))
    with rt:
        # Three submitted: the third waits for the first, whose callback exits. Nothing escapes submit(), and
        # the first's result() raises the callback's SystemExit (which ends a script that does not catch it).
        (x1, y1), (x2, y2), (x3, y3) = inputs(1.0), inputs(2.0), inputs(3.0)
        first = rt.submit(compiled, x1, y1)
        second = rt.submit(compiled, x2, y2)
        third = rt.submit(compiled, x3, y3)
        while not first.done:  # polling does not raise it either
            pass
        with pytest.raises(SystemExit) as got:
            first.result()
        assert got.value is exit_ and got.value.code == 5
        assert got.value.__notes__ == [f"raised by sub-worker callback 'inspect' (called at {Faulty.host.file}:"
                                       f"{line_of(Faulty.host, 'self.inspect(y)')}) in dispatch 0 of 'Faulty'"]
        # The other dispatches ran, and the worker goes on.
        second.result()
        third.result()
        assert float(x2[0, 0, 0]) == 8.0 and float(x3[0, 0, 0]) == 12.0
        with pytest.raises(SystemExit):
            rt(*inputs(1.0))
        x, y = inputs(4.0)
        rt(x, y)
        assert float(y[1, 0, 3]) == 8.0 and float(x[1, 0, 3]) == 16.0


def test_keyboardinterrupt_in_a_callback_leaves_the_call_and_the_worker_usable(worker):
    compiled, rt = worker(failing({1.0: KeyboardInterrupt}))
    with rt:
        with pytest.raises(KeyboardInterrupt) as got:
            rt(*inputs(1.0))
        assert got.value.__notes__[0].startswith("raised by sub-worker callback 'inspect'")
        handle = rt.submit(compiled, *inputs(1.0))
        with pytest.raises(KeyboardInterrupt):
            handle.result()
        # Ctrl-C in a callback stops the call, not the worker: no command was running.
        x, y = inputs(2.0)
        rt(x, y)
        assert float(y[0, 0, 0]) == 4.0 and float(x[0, 0, 0]) == 8.0


def line_of(fn, text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(fn.fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


# =============================================================================================
# The scenario every process of an mpi job runs

def _outcome(run) -> dict:
    try:
        x = run()
    except BaseException as e:  # noqa: BLE001 - recorded for the test
        tb = "".join(traceback.format_tb(e.__traceback__))
        return {"error": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else "",
                "notes": getattr(e, "__notes__", []), "own_traceback": "raise raise_()" in tb or
                "raise raise_ " in tb, "code": getattr(e, "code", None)}
    return {"x": float(np.asarray(x)[1, 0, 3])}


def scenario(mode: str, out: Path) -> int:
    from mpi4py import MPI

    me = MPI.COMM_WORLD.Get_rank()
    compiled = ir.compile(Faulty, distributed_config=DistributedConfig(device_ids=[0, 1]))
    record: list = []

    def save():
        (out / f"process{me}.json").write_text(json.dumps(record, indent=1))

    if mode == "die":  # process 1 ends in its callback, without Python
        with compiled.prepare(callbacks={"inspect": failing({1.0: lambda: os._exit(7)}, process=1)}) as rt:
            record.append(_outcome(lambda: rt(*inputs(2.0))[0]))
            save()
            record.append(_outcome(lambda: rt(*inputs(1.0))[0]))
            save()
        return 0
    if mode == "astray":  # process 1 runs a callback process 0 does not: the processes are out of step
        compiled = ir.compile(Astray, distributed_config=DistributedConfig(device_ids=[0, 1]))
        with compiled.prepare(callbacks={"inspect": lambda args: None}) as rt:
            for v in (1.0, 2.0):
                record.append(_outcome(lambda v=v: rt(*inputs(v))))  # returns y
                save()
        return 0
    if mode == "alone":  # process 1 stops alone in the middle of a command: it ends the job
        import ptodist.backends.mpi.group as mpi_backend

        sync = mpi_backend._sync_host_tensors

        def interrupted(s, arrays):
            if me == 1:
                raise KeyboardInterrupt
            sync(s, arrays)

        with compiled.prepare(callbacks={"inspect": lambda args: None}) as rt:
            record.append(_outcome(lambda: rt(*inputs(2.0))[0]))
            save()
            mpi_backend._sync_host_tensors = interrupted
            record.append(_outcome(lambda: rt(*inputs(1.0))[0]))
            save()
        return 0

    def local(key):
        class Local(KeyError):  # a class the other process cannot import: it gets the nearest one it can
            pass

        return Local(key)

    errors = {1.0: lambda: ValueError("no such file on this machine"), 5.0: KeyboardInterrupt,
              7.0: lambda: local("k"), 11.0: lambda: SystemExit(5)}
    with compiled.prepare(callbacks={"inspect": failing(errors, process=1)}) as rt:
        for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0):
            x, y = inputs(v, (2, 1, 5) if v == 3.0 and me == 1 else (2, 1, 4))  # v 3: binding fails in process 1
            record.append(_outcome(lambda x=x, y=y: rt(x, y)[0]))
            save()
        # Submitted, two in flight: the third submit runs the first, which fails in process 1.
        handles = [rt.submit(compiled, *inputs(v)) for v in (1.0, 9.0, 10.0)]
        for h in handles:
            record.append(_outcome(lambda h=h: h.result()[0]))
        save()
        record.append(_outcome(lambda: rt(*inputs(11.0))[0]))
        save()
        MPI.COMM_WORLD.Barrier()  # both recorded it: now exit as the callback asked
        if record[-1]["error"] == "SystemExit":
            raise SystemExit(record[-1]["code"])
    return 0


# =============================================================================================
# The mpi tests

def _job(mode: str, tmp_path: Path):
    out = tmp_path / mode
    out.mkdir()
    proc = _mpirun(2, [sys.executable, str(THIS), mode, str(out)], timeout=120)
    records = [json.loads(p.read_text()) if p.is_file() else None for p in (out / f"process{r}.json" for r in (0, 1))]
    assert not _leftovers(str(out)), _leftovers(str(out))
    return proc, records


def _other(note: str) -> str:
    """A note that names another process, without the traceback it carries."""
    return note.split(" Its traceback in process")[0]


@needs_mpi
def test_a_callback_that_fails_in_one_mpi_process_fails_the_dispatch_in_every_process(tmp_path):
    proc, (p0, p1) = _job("errors", tmp_path)
    log = f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.returncode == 5, log  # both processes exit as the callback asked, at the last dispatch
    assert p0 is not None and p1 is not None, log
    where = f"{Faulty.host.file}:{line_of(Faulty.host, 'self.inspect(y)')}"
    ok = [{"x": 4.0 * v} for v in (2.0, 4.0, 6.0, 9.0, 10.0)]
    for p, rec in enumerate((p0, p1)):
        # Dispatch 0's callback failed in process 1: both fail it with its error, naming process 1.
        assert rec[0]["error"] == "ValueError" and rec[0]["message"] == "no such file on this machine", rec[0]
        assert rec[0]["notes"][0] == f"raised by sub-worker callback 'inspect' (called at {where}) in dispatch 0 " \
                                     "of 'Faulty'"
        # The next dispatch is right everywhere.
        assert [rec[i] for i in (1, 3, 5, 8, 9)] == ok, rec
        # Binding failed in process 1 alone: both refuse the dispatch with its ShapeError.
        assert rec[2]["error"] == "ShapeError", rec[2]
        assert rec[2]["message"] == (f"host() parameter 'x' (declared pl.InOut[pl.Tensor[[NR, 1, 4], pl.FP32]] at "
                                     f"{Faulty.host.file}:{line_of(Faulty.host, 'def host')}): shape mismatch in "
                                     "dimension 2: the annotation [NR, 1, 4] fixes it at 4, the argument has 5 "
                                     "(shape [2, 1, 5]).")
        # Ctrl-C in process 1's callback: every process's call raises KeyboardInterrupt; the worker goes on.
        assert rec[4]["error"] == "KeyboardInterrupt", rec[4]
        # An exception of a class only process 1 has: process 0 raises its nearest importable class.
        assert rec[6]["error"] == ("KeyError" if p == 0 else "Local") and rec[6]["message"] == "'k'", rec[6]
        # Submitted: the first of three fails everywhere, the others are right.
        assert rec[7]["error"] == "ValueError" and "in dispatch 6 of 'Faulty'" in rec[7]["notes"][0], rec[7]
        assert rec[10]["error"] == "SystemExit" and rec[10]["code"] == 5, rec[10]
    # Process 1 raises its own exception, with its traceback; process 0 a copy that names process 1 and
    # carries that traceback.
    assert p1[0]["own_traceback"] and not p0[0]["own_traceback"]
    assert p1[0]["notes"][1] == "raised in MPI process 1 (rank 1, device 1). Every process of the MPI job fails " \
                                "dispatch 0 of 'Faulty'."
    assert _other(p0[0]["notes"][1]) == "raised in MPI process 1 (rank 1, device 1), not in this process (0). " \
                                        "Every process of the MPI job fails dispatch 0 of 'Faulty'."
    assert re.search(r"Its traceback in process 1:\nTraceback .*raise raise_\(\) if callable", p0[0]["notes"][1],
                     re.S), p0[0]["notes"][1]
    assert _other(p0[2]["notes"][-1]) == ("raised in MPI process 1 (rank 1, device 1), not in this process (0). "
                                          "Every process of the MPI job fails this dispatch of 'Faulty' (it is not "
                                          "accepted).")


@needs_mpi
def test_an_mpi_process_that_ends_in_a_callback_ends_the_job(tmp_path):
    proc, (p0, p1) = _job("die", tmp_path)
    assert proc.returncode != 0  # the launcher ends the job; process 0 does not wait for process 1 for ever
    assert p0 == [{"x": 8.0}] and p1 == [{"x": 8.0}], (p0, p1, proc.stderr[-3000:])


@needs_mpi
def test_an_mpi_process_that_stops_alone_in_a_command_ends_the_job(tmp_path):
    proc, (p0, p1) = _job("alone", tmp_path)
    assert proc.returncode != 0
    assert p0 == [{"x": 8.0}] and p1 == [{"x": 8.0}], (p0, p1, proc.stderr[-3000:])
    assert ("ptodist: MPI process 1 (rank 1, device 1) stopped running dispatch 1 of 'Faulty' alone "
            "(KeyboardInterrupt); the other processes would wait for it for ever in the next step they take "
            "together, so it ends the MPI job with MPI_Abort.") in proc.stderr, proc.stderr[-6000:]


@needs_mpi
def test_mpi_processes_that_make_different_calls_end_the_job_saying_where_each_was(tmp_path):
    proc, (p0, p1) = _job("astray", tmp_path)
    assert proc.returncode != 0
    assert ("ptodist: the processes of the MPI job are out of step (process 0 at binding and planning a dispatch, "
            "process 1 at a sub-worker callback): every process of the job must make the same calls on ptodist (the "
            "same dispatches and worker calls, in the same order), and here they did not, so the MPI job is ended "
            "with MPI_Abort.") in proc.stderr, proc.stderr[-6000:]
    assert p0 == [{"x": 2.0}] and p1 is None, (p0, p1)  # process 0 finished its first dispatch (y = 2x)


if __name__ == "__main__":
    sys.exit(scenario(sys.argv[1], Path(sys.argv[2])))
