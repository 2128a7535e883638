"""Control flow and program-structure constructs: ``pl.while_`` / ``pl.cond``, ``pl.pipeline``, ``pl.inline`` /
``pl.InlineFunction``, programs from text (``pl.parse``, ``pl.loads``, ``pl.parse_program``, ``pl.loads_program``)
and task ids (``pl.TASK_ID`` arrays, ``pl.TaskId``) — complete programs on both local backends, numbers checked
against numpy, and the errors a misuse gets."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from conftest import on_every_rank, source_line

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import RunConfig
from ptodist.errors import ProgramSyntaxError, ProgramValueError, RankError

# ---------------------------------------------------------------------------
# pl.while_
# ---------------------------------------------------------------------------


@pl.jit.incore
def geometric(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]],
              limit: pl.Scalar[pl.INT32]):
    t = pl.load(x, [0, 0], [2, 8])
    for (i, acc) in pl.while_(init_values=(0, t)):
        pl.cond(i < limit)
        i_out, acc_out = pl.yield_(i + 1, pl.add(pl.mul(acc, 2.0), t))
    pl.store(acc_out, [0, 0], out)
    return out


@pl.jit
def geometric_entry(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]],
                    limit: pl.Scalar[pl.INT32]):
    return geometric(x, out, limit)


@pytest.mark.parametrize("limit", [0, 1, 4])
def test_while_runs_its_body_while_the_condition_holds(backend, limit):
    x = np.arange(16, dtype=np.float32).reshape(2, 8) - 4
    out = np.zeros_like(x)
    geometric_entry(x, out, limit, config=RunConfig(backend=backend))
    want = x.copy()
    for _ in range(limit):
        want = want * 2 + x
    np.testing.assert_array_equal(out, want)  # limit 0: the loop never ran, the yield_ name holds the initial value


@pl.jit
def tasks_in_a_while(x: pl.Tensor[[4, 8], pl.FP32], out: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
                     rows: pl.Out[pl.Tensor[[1, 1], pl.INT32]]):
    for (r,) in pl.while_(init_values=(0,)):
        pl.cond(pl.read(x, [r, 0]) >= 0.0)  # stop at the first row whose first element is negative
        with pl.at(level=pl.Level.CORE_GROUP):
            out[r:r + 1, :] = pl.add(pl.load(x, [r, 0], [1, 8]), 100.0)
        done = pl.yield_(r + 1)
    pl.write(rows, [0, 0], done)
    return out, rows


def test_a_while_loop_in_an_orchestration_submits_a_task_per_iteration(backend):
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    x[2, 0] = -1.0
    out, rows = np.zeros_like(x), np.zeros((1, 1), np.int32)
    tasks_in_a_while(x, out, rows, config=RunConfig(backend=backend))
    want = np.zeros_like(x)
    want[:2] = x[:2] + 100
    np.testing.assert_array_equal(out, want)
    assert rows.tolist() == [[2]]


@pl.jit.incore
def no_init(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    for (i,) in pl.while_():
        pl.cond(i < 3)
    return out


@pl.jit.incore
def cond_not_first(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    for (i,) in pl.while_(init_values=(0,)):
        i = i + 1
        pl.cond(i < 3)
        i_out = pl.yield_(i)  # noqa: F841
    return out


@pl.jit.incore
def stray_cond(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    for i in pl.range(2):
        pl.cond(i < 1)
    return out


def _run(fn, backend="sim"):
    x = np.zeros((2, 8), np.float32)
    fn(x, np.zeros_like(x), config=RunConfig(backend=backend))


def test_while_needs_init_values():
    line = source_line(no_init, "pl.while_()")
    with pytest.raises(RankError, match=rf"OperationValueError: pl.while_\(\) at .*test_control_surface.py:{line}: "
                                        r"while_\(\) requires init_values to be specified: the loop carries its "
                                        r"state in them; write `for \(x,\) in pl.while_\(init_values=\(x0,\)\):`"):
        _run(no_init)


def test_the_condition_must_be_the_first_statement_of_the_body():
    loop, first = source_line(cond_not_first, "pl.while_("), source_line(cond_not_first, "i = i + 1")
    with pytest.raises(RankError, match=rf"the pl.while_ loop at .*test_control_surface.py:{loop}: the first "
                                        r"statement of its body must be pl.cond\(<condition>\), which decides "
                                        rf"whether the loop goes on; found `i = i \+ 1` at line {first}\."):
        _run(cond_not_first)


def test_cond_outside_a_while_loop_is_refused():
    line = source_line(stray_cond, "pl.cond(")
    with pytest.raises(RankError, match=rf"pl.cond\(...\) at .*test_control_surface.py:{line}: pl.cond is the "
                                        r"condition of a pl.while_ loop and may only be the first statement of a "
                                        r"`for ... in pl.while_\(...\)` body; for a branch write a plain `if`"):
        _run(stray_cond)


# ---------------------------------------------------------------------------
# pl.pipeline
# ---------------------------------------------------------------------------


@pl.jit.incore
def running_sum(x: pl.Tensor[[8, 8], pl.FP32], out: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
    acc = pl.full([1, 8], dtype=pl.FP32, value=0.0)
    for i, (carried,) in pl.pipeline(0, 8, 1, stage=3, init_values=(acc,)):
        nxt = pl.add(carried, pl.load(x, [i, 0], [1, 8]))
        pl.store(nxt, [i, 0], out)  # row i: the sum of rows 0..i
        total = pl.yield_(nxt)  # noqa: F841  (upstream names the loop's result)
    return out


@pl.jit
def pipelined_tasks(x: pl.Tensor[[8, 8], pl.FP32], out: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
    for i in pl.pipeline(8, stage=2):
        with pl.at(level=pl.Level.CORE_GROUP):  # each reads the row the previous task wrote
            prev = pl.load(out, [(i + 7) % 8, 0], [1, 8])
            out[i:i + 1, :] = pl.add(pl.load(x, [i, 0], [1, 8]), prev)
    return out


def test_pipeline_computes_what_the_plain_loop_does(backend):
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    out = np.zeros_like(x)
    running_sum(x, out, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(out, np.cumsum(x, axis=0))
    out2 = np.zeros_like(x)
    pipelined_tasks(x, out2, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(out2, np.cumsum(x, axis=0))  # the tasks ran in the loop's order


@pl.jit.incore
def pipeline_no_stage(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    for _i in pl.pipeline(4):
        pass
    return out


@pl.jit.incore
def pipeline_stage_zero(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    for _i in pl.pipeline(4, stage=0):
        pass
    return out


@pl.jit.incore
def pipeline_runtime_stage(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    n = pl.get_block_num() + 1
    for _i in pl.pipeline(4, stage=n):
        pass
    return out


@pl.jit.incore
def range_with_stage(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    for _i in pl.range(4, stage=2):
        pass
    return out


@pytest.mark.parametrize("fn, text, message", [
    (pipeline_no_stage, "pl.pipeline(4)",
     r"OperationTypeError: pl.pipeline\(\) at .*:{line} requires stage=: the number of times the body is "
     r"replicated per outer iteration \(typically 2 to 4\); write `pl.pipeline\(n, stage=2\)`"),
    (pipeline_stage_zero, "stage=0",
     r"OperationValueError: pl.pipeline\(\) at .*:{line}: stage must be >= 1, got 0; stage=1 pipelines without "
     r"replicating the body"),
    (pipeline_runtime_stage, "stage=n",
     r"OperationTypeError: pl.pipeline\(\) at .*:{line}: stage must be a compile-time constant \(a Python int\), "
     r"got the runtime value"),
    (range_with_stage, "stage=2",
     r"OperationTypeError: pl.range\(..., stage=2\) at .*:{line}: stage= is only supported on pl.pipeline; write "
     r"`for i in pl.pipeline\(..., stage=N\):` to pipeline the loop"),
])
def test_pipeline_stage_errors(fn, text, message):
    with pytest.raises(RankError, match=message.format(line=source_line(fn, text))):
        _run(fn)


# ---------------------------------------------------------------------------
# pl.inline
# ---------------------------------------------------------------------------


@pl.inline
def axpy(a, x, y):
    return pl.add(pl.mul(x, a), y)


@pl.inline
def reads_past_the_end(t):
    return pl.load(t, [0, 0], [4, 8])


@pl.jit.incore
def axpy_kernel(x: pl.Tensor[[2, 8], pl.FP32], y: pl.Tensor[[2, 8], pl.FP32],
                out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    pl.store(axpy(3.0, pl.load(x, [0, 0], [2, 8]), pl.load(y, [0, 0], [2, 8])), [0, 0], out)
    return out


@pl.jit
def axpy_twice(x: pl.Tensor[[2, 8], pl.FP32], y: pl.Tensor[[2, 8], pl.FP32],
               out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    out = axpy_kernel(x, y, out)
    with pl.at(level=pl.Level.CORE_GROUP):
        out[:, :] = axpy(0.5, pl.load(out, [0, 0], [2, 8]), pl.load(x, [0, 0], [2, 8]))
    return out


@pl.jit
def inline_error(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        out[:, :] = reads_past_the_end(x)
    return out


def test_an_inline_function_runs_in_kernels_and_orchestrations(backend):
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    y = np.full_like(x, 0.25)
    out = np.zeros_like(x)
    axpy_twice(x, y, out, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(out, (3 * x + y) * 0.5 + x)
    assert isinstance(axpy, pl.InlineFunction)
    assert axpy.param_names == ["a", "x", "y"]
    assert axpy.func_def.name == "axpy" and axpy.col_offset == 0
    assert axpy.line_offset + 2 == source_line(axpy, "def axpy")  # the decorator is the first line


def test_an_error_in_an_inline_body_names_its_line():
    line = source_line(reads_past_the_end, "pl.load(t")
    with pytest.raises(RankError, match=rf"pl.load at .*test_control_surface.py:{line}: out of bounds on tensor "
                                        r"'x' \[2, 8\] FP32"):
        _run(inline_error)


# ---------------------------------------------------------------------------
# Programs from text
# ---------------------------------------------------------------------------

SCALE_TEXT = '''\
@pl.jit
def scale(x: pl.Tensor[[M, 8], pl.FP32], out: pl.Out[pl.Tensor[[M, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        for (i, acc) in pl.while_(init_values=(0, pl.load(x, [0, 0], [2, 8]))):
            pl.cond(i < 3)
            i2, acc2 = pl.yield_(i + 1, pl.mul(acc, 2.0))
        pl.store(acc2, [0, 0], out)
    return out
'''

PROGRAM_TEXT = '''\
@pl.program
class Triple:
    @pl.function(type=pl.FunctionType.InCore)
    def kernel(self, x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
        pl.store(pl.mul(pl.load(x, [0, 0], [2, 8]), 3.0), [0, 0], out)
        return out

    @pl.function(type=pl.FunctionType.Orchestration)
    def main(self, x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
        return self.kernel(x, out)
'''


def test_a_function_from_text_runs_like_one_from_a_file(backend):
    scale = pl.parse(SCALE_TEXT)
    assert re.fullmatch(r"<string:[0-9a-f]{8}>:2", scale.location)  # a name of its own, the `def` line
    x = np.arange(16, dtype=np.float32).reshape(2, 8)  # M = 2: an undefined annotation name is a dynamic dim
    out = np.zeros_like(x)
    scale(x, out, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(out, 8 * x)


def test_a_program_from_text_runs(backend):
    from ptodist import ir

    prog = pl.parse_program(PROGRAM_TEXT)
    assert isinstance(prog, pl.Program) and prog.name == "Triple"
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    out = np.zeros_like(x)
    ir.compile(prog, platform="a2a3sim")(x, out, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(out, 3 * x)


def test_loads_reads_a_file_and_errors_name_its_lines(tmp_path):
    path = tmp_path / "dir with space" / "kernel text.py"
    path.parent.mkdir()
    path.write_text(SCALE_TEXT.replace("pl.load(x, [0, 0], [2, 8])", "pl.load(x, [0, 0], [3, 8])"))
    scale = pl.loads(str(path))
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(RankError, match=rf"pl.load at {re.escape(str(path))}:4: out of bounds on tensor 'x'"):
        scale(x, np.zeros_like(x), config=RunConfig(backend="sim"))
    with pytest.raises(ProgramValueError, match=rf"Expected @pl.program but found @pl.function in "
                                                rf"{re.escape(str(path))} \(scale at {re.escape(str(path))}:2\)\. "
                                                r"Use pl.parse\(\) for "
                                                r"auto-detection or ensure your code contains @pl.program\."):
        pl.loads_program(str(path))


def test_an_error_inside_a_text_names_the_texts_line():
    text = SCALE_TEXT.replace("pl.mul(acc, 2.0)", "pl.mul(acc, pl.load(x, [0, 0], [5, 8]))")
    scale = pl.parse(text, filename="scale_text")
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(RankError, match=r"pl.load at scale_text:6: out of bounds on tensor 'x' \[2, 8\] FP32") as e:
        scale(x, np.zeros_like(x), config=RunConfig(backend="sim"))
    assert 'File "scale_text", line 6, in __pl_region_L3' in str(e.value)  # the text's frame is the program's


@pytest.mark.parametrize("text, error, message", [
    ("x = 1\n", ProgramValueError,
     r"No @pl.function or @pl.program found in <string:[0-9a-f]{8}>\. Make sure the text defines a function "
     r"decorated with @pl.function \(or @pl.jit, @pl.jit.incore, ...\) or a class decorated with @pl.program\."),
    (PROGRAM_TEXT + "\n\n" + PROGRAM_TEXT.replace("Triple", "Other"), ProgramValueError,
     r"Multiple functions/programs found in <string:[0-9a-f]{8}>: Triple, Other\. pl.parse\(\) can only parse "
     r"code containing a single function or program"),
    ("@pl.function(type=pl.FunctionType.Kernel)\ndef f(x):\n    return x\n", ProgramSyntaxError,
     r"Unknown FunctionType value: Kernel at <string:[0-9a-f]{8}>:1 \(type= of @pl.function on f\); valid "
     r"values: AIC, AIV, Graph, Group, InCore, Inline, Opaque, Orchestration"),
    ("def f(:\n    pass\n", ProgramSyntaxError,
     r"Failed to compile code from <string:[0-9a-f]{8}>: invalid syntax at <string:[0-9a-f]{8}>:1; fix the "
     r"text's Python syntax"),
    ("\nLIMIT = undefined_name + 1\n", ProgramSyntaxError,
     r"NameError: name 'undefined_name' is not defined at <string:[0-9a-f]{8}>:2 \(while the text defined its "
     r"objects\)"),
])
def test_text_errors(text, error, message):
    with pytest.raises(error, match=message):
        pl.parse(text)


def test_parse_program_wants_a_program():
    with pytest.raises(ProgramValueError, match=r"Expected @pl.program but found @pl.function in <string> "
                                                r"\(scale at <string:[0-9a-f]{8}>:2\)"):
        pl.parse_program(SCALE_TEXT)


# ---------------------------------------------------------------------------
# Task ids: pl.TASK_ID arrays and pl.TaskId
# ---------------------------------------------------------------------------


@pl.inline
def after(tid: pl.TaskId, out: pl.Tensor):
    with pl.at(level=pl.Level.CORE_GROUP, deps=[tid]):
        out[3:4, :] = pl.add(pl.load(out, [0, 0], [1, 8]), pl.load(out, [2, 0], [1, 8]))


@pl.jit
def fan_in(x: pl.Tensor[[4, 8], pl.FP32], out: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    tids = pl.array.create(4, pl.TASK_ID)
    with pl.manual_scope():
        for b in pl.range(3):
            with pl.at(level=pl.Level.CORE_GROUP) as tid:
                out[b:b + 1, :] = pl.mul(pl.load(x, [b, 0], [1, 8]), 2.0)
            tids[b] = tid
        with pl.at(level=pl.Level.CORE_GROUP, deps=[tids]) as last:  # waits for the three ids stored
            out[3:4, :] = pl.load(out, [1, 0], [1, 8])
        after(last, out)
    return out


def test_task_id_arrays_and_task_id_parameters_feed_deps(backend):
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = np.zeros_like(x)
    compiled = fan_in.compile(x, out, config=RunConfig(backend=backend, enable_dep_gen=True))
    compiled(x, out)
    want = 2 * x
    want[3] = want[0] + want[2]
    np.testing.assert_array_equal(out, want)
    deps = json.loads(next(compiled.output_dir.rglob("deps.json")).read_text())
    explicit = sorted((e["pred"], e["succ"]) for e in deps["edges"] if e["source"] == "explicit")
    assert explicit == [(0, 3), (1, 3), (2, 3), (3, 4)]  # unset TASK_ID entries name no task
    assert pl.TaskId == pl.Scalar[pl.TASK_ID]


# ---------------------------------------------------------------------------
# Every construct in one distributed program, on every backend and path
# ---------------------------------------------------------------------------

LOOPS_TEXT = '''\
@pl.program
class Loops:
    @pl.function(type=pl.FunctionType.InCore)
    def grow(self, x: pl.Tensor[[1, 8], pl.FP32], out: pl.Out[pl.Tensor[[1, 8], pl.FP32]], r: pl.Scalar[pl.INT32]):
        t = pl.load(x, [0, 0], [1, 8])
        for (i, acc) in pl.while_(init_values=(0, t)):
            pl.cond(i <= r)
            i2, acc2 = pl.yield_(i + 1, pl.add(acc, t))
        for k, (s,) in pl.pipeline(0, 4, stage=2, init_values=(acc2,)):
            s2 = pl.yield_(pl.add(s, 1.0))
        pl.store(s2, [0, 0], out)
        return out

    @pl.function(type=pl.FunctionType.Orchestration)
    def chip(self, x: pl.Tensor[[1, 8], pl.FP32], out: pl.Out[pl.Tensor[[1, 8], pl.FP32]], r: pl.Scalar[pl.INT32]):
        tids = pl.array.create(2, pl.TASK_ID)
        out, t0 = pl.submit(self.grow, x, out, r)
        tids[0] = t0
        with pl.at(level=pl.Level.CORE_GROUP, deps=[tids]):
            out[:, :] = pl.mul(pl.load(out, [0, 0], [1, 8]), 2.0)
        return out

    @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
    def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], out: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
        for r in pl.range(pld.world_size()):
            self.chip(x[r], out[r], r, device=r)
'''


def loops_golden(x: np.ndarray) -> np.ndarray:
    """Rank r: x added r + 1 times to x, then 4 added (the pipeline), then doubled."""
    return np.stack([(x[r] * (r + 2) + 4) * 2 for r in range(len(x))])


def test_a_parsed_distributed_program_on_one_shot_calls_and_a_worker(backend, torch):
    from ptodist import DistributedConfig, ir

    prog = pl.parse(LOOPS_TEXT)
    dc = DistributedConfig(device_ids=[0, 1])
    compiled = ir.compile(prog, platform="a2a3sim", distributed_config=dc)
    cfg = RunConfig(distributed_config=dc, backend=backend)
    x = torch.arange(16, dtype=torch.float32).reshape(2, 1, 8).share_memory_()
    out = torch.zeros_like(x).share_memory_()
    compiled(x, out, config=cfg)
    torch.testing.assert_close(out.numpy(), loops_golden(x.numpy()), rtol=0, atol=0)
    out.zero_()
    with compiled.prepare(cfg) as worker:
        worker(x, out)
        worker(x, out)
    torch.testing.assert_close(out.numpy(), loops_golden(x.numpy()), rtol=0, atol=0)


MPI_SCRIPT = '''\
import sys

import numpy as np
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, ir

prog = pl.parse({text!r})
x = np.arange(16, dtype=np.float32).reshape(2, 1, 8)
out = np.zeros_like(x)
ir.compile(prog, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=[0, 1]))(x, out)
want = np.stack([(x[r] * (r + 2) + 4) * 2 for r in range(2)])
result = "same" if np.array_equal(out, want) else f"differs: {{out.ravel().tolist()}}"
sys.stdout.write(f"RESULT {{result}}\\n")  # one write: the two processes share the pipe
sys.stdout.flush()
'''


def test_the_parsed_program_on_mpi(tmp_path):
    from test_mpi import _mpirun, needs_mpi

    if needs_mpi.args[0]:
        pytest.skip(needs_mpi.kwargs["reason"])
    script = tmp_path / "loops on mpi.py"
    script.write_text(MPI_SCRIPT.format(text=LOOPS_TEXT))
    job = _mpirun(2, [sys.executable, str(script)], timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("RESULT same") == 2, job.stdout[-3000:]


# ---------------------------------------------------------------------------
# The checker sees the iterations of a pipelined loop in order
# ---------------------------------------------------------------------------


def _ring_rows(waits: bool):
    @pl.jit.incore
    def rows(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
             data: pl.InOut[pld.DistributedTensor[[4, 8], pl.FP32]],
             sig: pl.InOut[pld.DistributedTensor[[2, 1], pl.INT32]]):
        ctx = pld.get_comm_ctx(data)
        me, n = pld.rank(ctx), pld.nranks(ctx)
        prev, nxt = (me + n - 1) % n, (me + 1) % n
        for i in pl.pipeline(4, stage=2):
            data = pl.store(pl.add(pl.load(x, [0, 0], [1, 8]), pl.cast(i, pl.FP32)), [i, 0], data)
            pld.system.notify(sig, nxt, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
            if waits:
                pld.system.wait(sig, [prev, 0], i + 1, cmp=pld.WaitCmp.Ge)
            y = pl.store(pld.tile.remote_load(data, prev, [i, 0], [1, 8]), [i, 0], y)  # @pipelined_pull
        return y

    return on_every_rank(rows)


@pytest.mark.parametrize("waits", [True, False])
def test_the_checker_orders_a_pipelined_loops_iterations(waits):
    from ptodist import DistributedConfig
    from ptodist.check import explore
    from ptodist.errors import CheckError

    host = _ring_rows(waits)
    x = np.arange(16, dtype=np.float32).reshape(2, 1, 8)
    for seed in range(4):
        y = np.zeros((2, 4, 8), np.float32)
        compiled = host.compile(x, y, config=RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1])))
        with explore.checking(seed) as session:
            try:
                compiled(x, y)
            except CheckError:
                pass
        kinds = [f.kind for f in session.findings]
        if waits:
            assert kinds == [], [f.render() for f in session.findings]
            want = np.stack([x[(r + 1) % 2, 0] + np.arange(4, dtype=np.float32)[:, None] for r in range(2)])
            np.testing.assert_array_equal(y, want)
        else:
            assert "race" in kinds
            line = source_line(_ring_rows, "# @pipelined_pull")
            race = next(f for f in session.findings if f.kind == "race")
            assert any(loc.endswith(f"test_control_surface.py:{line}") for loc in race.locations), race.render()


# ---------------------------------------------------------------------------
# pl.func_attr, pl.adir, pl.JITFunction, pl.parser
# ---------------------------------------------------------------------------


@pl.jit.incore
def attributed(x: pl.Tensor[[2, 8], pl.FP32], w: pl.Tensor[[2, 8], pl.FP32],
               out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    """A docstring may come first."""
    pl.func_attr({"stationary": w})
    pl.func_attr({"split": pl.SplitMode.UP_DOWN})
    pl.store(pl.add(pl.load(x, [0, 0], [2, 8]), pl.load(w, [0, 0], [2, 8])), [0, 0], out)
    return out


@pl.jit
def directed(x: pl.Tensor[[2, 8], pl.FP32], w: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    return attributed(pl.adir.input(x), pl.adir.no_dep(w), pl.adir.inout(out))


@pl.jit.incore
def late_attr(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    t = pl.load(x, [0, 0], [2, 8])
    pl.func_attr({"stationary": x})
    pl.store(t, [0, 0], out)
    return out


@pl.jit.incore
def twice_attr(x: pl.Tensor[[2, 8], pl.FP32], out: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
    pl.func_attr({"stationary": x})
    pl.func_attr({"stationary": out})
    return out


def test_func_attr_and_call_site_directions(backend):
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    w = np.full_like(x, 0.5)
    out = np.zeros_like(x)
    directed(x, w, out, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(out, x + w)
    assert isinstance(directed, pl.JITFunction) and isinstance(attributed, pl.JITFunction)
    assert pl.parser.parse is pl.parse and pl.parser.loads_program is pl.loads_program


def test_func_attr_goes_first_and_names_each_key_once():
    line = source_line(late_attr, "pl.func_attr(")
    with pytest.raises(RankError, match=rf"pl.func_attr at .*test_control_surface.py:{line}: it must precede every "
                                        r"other statement of late_attr\(\) \(it describes the whole function\); "
                                        r"move it to the top of the body"):
        _run(late_attr)
    first, second = source_line(twice_attr, '"stationary": x'), source_line(twice_attr, '"stationary": out')
    with pytest.raises(RankError, match=rf"pl.func_attr at .*test_control_surface.py:{second}: the attribute "
                                        rf"'stationary' of twice_attr\(\) is declared twice \(first at line {first}\); "
                                        r"declare each attribute once"):
        _run(twice_attr)


# ---------------------------------------------------------------------------
# pl.ManualDep: an argument left out of a task's automatic dependencies
# ---------------------------------------------------------------------------


def _held_then_peeked(manual: bool):
    """``hold`` writes ``out`` and stays incomplete until ``release`` (later in program order) notifies; ``peek``
    reads ``out`` in between. Tracked, ``peek`` waits for ``hold`` to complete, which never happens before
    ``release``: a hang. Annotated ``pl.ManualDep``, it runs at once (``release`` leaves the signal it shares
    with ``hold`` out of its dependencies in both)."""
    OutT = pl.Tensor[[1, 8], pl.FP32, pl.ManualDep] if manual else pl.Tensor[[1, 8], pl.FP32]
    Sig = pld.DistributedTensor[[1, 1], pl.INT32]

    @pl.jit.incore
    def hold(out: pl.Out[pl.Tensor[[1, 8], pl.FP32]], sig: pl.InOut[Sig]):
        pl.store(pl.full([1, 8], dtype=pl.FP32, value=7.0), [0, 0], out)
        pld.system.defer_wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)
        return out

    @pl.jit.incore
    def peek(out: OutT, seen: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
        return pl.store(pl.load(out, [0, 0], [1, 8]), [0, 0], seen)

    @pl.jit.incore
    def release(sig: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32, pl.ManualDep]]):  # the signal: in both
        pld.system.notify(sig, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)

    @pl.jit
    def chip(out: pl.Out[pl.Tensor[[1, 8], pl.FP32]], seen: pl.Out[pl.Tensor[[1, 8], pl.FP32]], sig: pl.InOut[Sig]):
        pl.submit(hold, out, sig)
        peek(out, seen)
        release(sig)

    @pl.jit.host
    def host(out: pl.Out[pl.Tensor[[1, 1, 8], pl.FP32]], seen: pl.Out[pl.Tensor[[1, 1, 8], pl.FP32]]):
        sbuf = pld.alloc_window_buffer([1, 1], dtype=pl.INT32)
        chip(out[0], seen[0], pld.window(sbuf, [1, 1], dtype=pl.INT32), device=0)

    return host


def test_a_manual_dep_argument_does_not_wait_for_the_tasks_that_touch_it(backend):
    from ptodist import DistributedConfig
    from ptodist.errors import HangError

    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0]), backend=backend, hang_timeout_s=20)
    out, seen = np.zeros((1, 1, 8), np.float32), np.zeros((1, 1, 8), np.float32)
    _held_then_peeked(manual=True)(out, seen, config=cfg)
    assert (out == 7.0).all() and (seen == 7.0).all()
    if backend == "sim":  # the tracked twin: certain deadlock, found exactly
        with pytest.raises(HangError):
            _held_then_peeked(manual=False)(out, seen, config=cfg)
    assert pl.Tensor[[1, 8], pl.FP32, pl.ManualDep].manual_dep and not pl.Tensor[[1, 8], pl.FP32].manual_dep


# ---------------------------------------------------------------------------
# Graph regions (pl.graph, @pl.jit.graph) and @pl.jit.opaque
# ---------------------------------------------------------------------------


@pl.jit.graph
def layer(h: pl.InOut[pl.Tensor[[2, 8], pl.FP32]], w: pl.Tensor[[2, 8], pl.FP32]):
    with pl.at(level=pl.Level.CORE_GROUP):
        h[:, :] = pl.add(pl.mul(pl.load(h, [0, 0], [2, 8]), 2.0), pl.load(w, [0, 0], [2, 8]))


@pl.jit.opaque
def bias(h: pl.InOut[pl.Tensor[[2, 8], pl.FP32]]):
    for _ in pl.range(2):
        with pl.at(level=pl.Level.CORE_GROUP):
            h[:, :] = pl.add(pl.load(h, [0, 0], [2, 8]), 1.0)


@pl.jit
def decode(w: pl.Tensor[[2, 8], pl.FP32], h: pl.InOut[pl.Tensor[[2, 8], pl.FP32]]):
    for _ in pl.range(3):
        layer(h, w)  # recorded once, replayed: the same tasks each time
    with pl.graph("tail"):
        bias(h)
    return h


@pl.jit
def nested_graphs(w: pl.Tensor[[2, 8], pl.FP32], h: pl.InOut[pl.Tensor[[2, 8], pl.FP32]]):
    with pl.graph("outer"):
        layer(h, w)
    return h


@pl.jit
def graph_in_a_task(w: pl.Tensor[[2, 8], pl.FP32], h: pl.InOut[pl.Tensor[[2, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        with pl.graph("inner"):
            h[:, :] = pl.load(w, [0, 0], [2, 8])
    return h


def test_graph_regions_and_opaque_functions_run_their_tasks(backend):
    w = np.full((2, 8), 0.5, np.float32)
    h = np.arange(16, dtype=np.float32).reshape(2, 8)
    want = h.copy()
    for _ in range(3):
        want = want * 2 + w
    decode(w, h, config=RunConfig(backend=backend))
    np.testing.assert_array_equal(h, want + 2)
    assert isinstance(layer, pl.JITFunction) and layer.options["type"] is pl.FunctionType.Graph


def test_graph_region_rules():
    w, h = np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32)
    outer, inner = source_line(nested_graphs, 'pl.graph("outer")'), source_line(nested_graphs, "layer(h, w)")
    with pytest.raises(RankError, match=rf"pl.graph\('layer'\) at .*test_control_surface.py:{inner}: a graph region "
                                        rf"may not nest inside another \(pl.graph\('outer'\) at .*:{outer}\)"):
        nested_graphs(w, h, config=RunConfig(backend="sim"))
    line = source_line(graph_in_a_task, 'pl.graph("inner")')
    with pytest.raises(RankError, match=rf"pl.graph\('inner'\) at .*test_control_surface.py:{line}: a graph region "
                                        r"records a topology of tasks, so it may not sit inside pl.at / pl.spmd / "
                                        r"pl.cluster \(one task\) or a kernel"):
        graph_in_a_task(w, h, config=RunConfig(backend="sim"))
    with pytest.raises(TypeError, match=r"pl.graph\(...\) at .*: the name is required, a non-empty str"):
        pl.graph("")
