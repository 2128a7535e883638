"""A finding's kind, pitfall link and fix match the error it reports.

Each program below has one bug; it runs as a user's script (its own file, so every location is the user's), and
the finding ptodist makes of the error it raises must name what the error is: its ``kind``, its section of
docs/pitfalls.md (``docs``, None where no pitfall matches) and a ``fix`` for that error, never another pitfall's
or the generic "Correct the argument named in the message." where the message states its own fix.
"""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ptodist.check import findings
from ptodist.errors import NOTIFY_OP_FIX

REPO = Path(__file__).resolve().parents[2]
PITFALLS = (REPO / "docs" / "pitfalls.md").read_text(encoding="utf-8")

PREAMBLE = '''
import numpy as np

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

NR = pl.dynamic("NR")
CFG = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), backend=BACKEND, hang_timeout_s=10)
X = np.arange(16, dtype=np.float32).reshape(2, 1, 8)
T = pl.Tensor[[1, 8], pl.FP32]
W = pld.DistributedTensor[[1, 8], pl.FP32]
S = pld.DistributedTensor[[NR, 1], pl.INT32]


def run(kernel, x=X):
    """Run kernel(x, y, win, sig) on both ranks: x, y are [1, 8] slices, win and sig windows."""
    @pl.jit
    def per_rank(x: T, y: pl.Out[T], win: pl.InOut[W], sig: pl.InOut[S]):
        return kernel(x, y, win, sig)

    @pl.jit.host
    def host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
        win_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
        sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
        for r in pl.range(pld.world_size()):
            per_rank(x[r], y[r], pld.window(win_buf, [1, 8], dtype=pl.FP32),
                     pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)

    return host(x, config=CFG)
'''


def kernel(body: str, params: str = "x: T, y: pl.Out[T], win: pl.InOut[W], sig: pl.InOut[S]") -> str:
    """A program whose kernel runs ``body`` (the line marked ``# BUG``), dispatched by ``run``."""
    return f"@pl.jit.incore\ndef kernel({params}):\n    {body}  # BUG\n\n\nrun(kernel)\n"


STEP03 = "docs/pitfalls.md#step-03-distributedtensor-used-as-tensor"

# (name, program, kind, docs, fix); the program's line marked "# BUG" is one of the finding's locations, and
# "{decl}" in a fix stands for the line marked "# DECL".
CASES = [
    ("output_without_pl_out", kernel("pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)",
                                     "x: T, y: T, win: pl.InOut[W], sig: pl.InOut[S]"),
     "read_only", None, findings.FIXES["read_only"]),
    ("tile_dtype_is_not_the_tensors", kernel(
        "pl.store(pl.cast(pl.load(x, [0, 0], [1, 8]), target_type=pl.FP16), [0, 0], y)"),
     "type_mismatch", None, "Convert with pl.cast(tile, target_type=pl.FP32)"),
    ("notify_on_a_plain_tensor", kernel("pld.system.notify(x, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)"),
     "type_mismatch", STEP03, "Pass pld.window(buf, shape, dtype=...)."),
    ("comm_ctx_of_a_plain_tensor", kernel("pld.rank(pld.get_comm_ctx(x))"),
     "type_mismatch", STEP03, "Pass a window (pld.window(buf, shape, dtype=...)) to pld.get_comm_ctx."),
    ("notify_op_a_string", kernel("pld.system.notify(sig, 0, [0, 0], 1, op='add')"),
     "type_mismatch", None, NOTIFY_OP_FIX),
    ("wait_cmp_a_string", kernel("pld.system.wait(sig, [0, 0], 1, cmp='>=')"),
     "type_mismatch", None, "Pass cmp=pld.WaitCmp.Ge (the cell reaches the value) or cmp=pld.WaitCmp.Eq (the cell "
                            "equals it) to pld.system.wait."),
    ("signal_on_a_float_window", kernel("pld.system.notify(win, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)"),
     "type_mismatch", None, "Use a separate INT32 window for signals."),
    ("tile_op_on_a_string", kernel("pl.add('x', 1)"),
     "invalid_argument", None, "Pass tensors (pl.tensor level), tiles (pl.tile level; pl.load a region of a tensor "
                               "into a tile), or numbers."),
    ("load_out_of_bounds", kernel("pl.load(x, [0, 4], [1, 8])"),
     "out_of_bounds", None, findings.FIXES["out_of_bounds"]),
    ("users_own_error_in_a_rank", kernel("raise RuntimeError('the kernel gave up')"),
     "rank_error", None, findings.FIXES["rank_error"]),
    ("typo_in_a_pl_name", kernel("pl.laod(x, [0, 0], [1, 8])"),
     "unknown_name", None, "Did you mean pl.load? Write it instead of pl.laod."),
    ("short_form_pld_lacks", kernel("pld.notify(sig, 0, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)"),
     "unknown_name", None, "Did you mean pld.system.notify? Write it instead of pld.notify."),
    ("notify_without_op", kernel("pld.system.notify(sig, 0, [0, 0], 1)"),
     "invalid_argument", None, NOTIFY_OP_FIX),
    ("rma_call_missing_an_argument", kernel("pld.tile.remote_load(win, 0, [0, 0])"),
     "rank_error", None, "Call pld.tile.remote_load as it is declared: "
                         "pld.tile.remote_load(target, peer, offsets, shape, valid_shape=None)."),
    ("window_without_dtype", '''
@pl.jit.host
def host(x: pl.Tensor[[NR, 1, 8], pl.FP32]):
    buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
    pld.window(buf, [1, 8])  # BUG


host(X, config=CFG)
''', "invalid_argument", None, "Call pld.window as it is declared: pld.window(buf, shape, *, dtype)."),
    ("tensor_annotation_without_a_shape", "@pl.jit.incore\ndef k(x: pl.Tensor[None, pl.FP32]):  # BUG\n    pass\n",
     "invalid_argument", None, "Write pl.Tensor[[d0, d1, ...], dtype] with each dimension an int or pl.dynamic(...)"),
    ("window_for_a_pl_tensor", '''
@pl.jit
def per_rank(x: T, y: pl.Out[T]):
    pass


@pl.jit.host
def host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
    buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
    for r in pl.range(pld.world_size()):
        per_rank(pld.window(buf, [1, 8], dtype=pl.FP32), y[r], device=r)  # BUG


host(X, config=CFG)
''', "type_mismatch", STEP03,
     "Annotate 'x' as pld.DistributedTensor[...] (pl.InOut[...] if the kernel writes it), or pass a host tensor "
     "slice instead of the window."),
    ("host_tensor_of_another_dtype", kernel("pass").replace("  # BUG", "").replace("run(kernel)", "")
     + "run(kernel, X.astype(np.float16))\n",
     "type_mismatch", None, "Pass a FP32 tensor as 'x' (convert it on the host), or annotate the parameter pl.FP16."),
    ("output_shape_no_input_binds", '''
N = pl.dynamic("N")


@pl.jit.incore
def copy(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, N], pl.FP32]]):  # DECL
    return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)


x = np.ones((1, 8), np.float32)
copy.compile(x, np.zeros((1, 8), np.float32), config=CFG)(x)
''', "shape_mismatch", None,
     "Pass the output explicitly (all arguments), or annotate a dimension of an input with N so its shape binds it "
     "(the output is declared at {decl})"),
]


def _run(tmp_path: Path, program: str, backend: str = "sim"):
    script = tmp_path / "prog.py"
    script.write_text(PREAMBLE.replace("BACKEND", repr(backend)) + textwrap.dedent(program), encoding="utf-8")
    with pytest.raises(Exception) as info:
        runpy.run_path(str(script), run_name="__main__")
    return script, findings.from_exception(info.value)


def _marked(script: Path, mark: str) -> str | None:
    """``file:line`` of the line of ``script`` that ends with ``mark``, if any."""
    lines = script.read_text(encoding="utf-8").splitlines()
    return next((f"{script}:{i}" for i, text in enumerate(lines, 1) if text.rstrip().endswith(mark)), None)


@pytest.mark.parametrize("name, program, kind, docs, fix", CASES, ids=[c[0] for c in CASES])
def test_the_finding_names_what_the_error_is(name, program, kind, docs, fix, tmp_path):
    script, found = _run(tmp_path, program)
    f = found[0]
    assert (f.kind, f.docs, f.fix) == (kind, docs, fix.replace("{decl}", str(_marked(script, "# DECL")))), f.render()
    assert f.kind in findings.KINDS
    mine = [loc for loc in f.locations if not loc.startswith(f"{__file__}:")]  # this test runs the script
    assert mine and all(loc.startswith(f"{script}:") for loc in mine), f.render()
    bug = _marked(script, "# BUG")
    assert bug is None or bug in f.locations, f.render()
    assert f.fix != findings.FIXES["invalid_argument"]


def test_every_pitfall_link_names_a_section_of_the_pitfalls_page():
    anchors = {a for a in re.findall(r"^#+ (.+)$", PITFALLS, re.M)}
    slugs = {re.sub(r"[^\w\- ]", "", a.lower()).replace(" ", "-") for a in anchors}
    links = {c[3] for c in CASES if c[3]} | {findings.pitfall_docs(p) for p in findings.PITFALL_ANCHORS} | {
        f"{findings.PITFALLS_PAGE}#{a}" for a in findings.STEP_ANCHORS.values()}
    for link in links:
        assert link.split("#", 1)[1] in slugs, link


def test_a_message_that_states_its_fix_is_not_followed_by_a_generic_one():
    assert findings.stated_fix("x at p.py:3: 3.5 has a fraction; pass an integer, or declare a float dtype") == \
        "Pass an integer, or declare a float dtype."
    assert findings.stated_fix("pl.slice at p.py:3: region at offsets [2, 3] is outside the [3, 4] tile.") is None
    assert findings.stated_fix("index 1 is out of range. Index 1 is past the end.") is None  # not an imperative


@pytest.mark.parametrize("backend", ["shm", "sim"])
def test_an_output_without_pl_out_is_a_read_only_finding_on_every_backend(backend, tmp_path):
    script, found = _run(tmp_path, CASES[0][1], backend)
    (f,) = found  # each rank wrote its own slice (y[0], y[1]): one bug, one finding
    assert (f.kind, f.docs, f.fix, f.ranks) == ("read_only", None, findings.FIXES["read_only"], [0, 1])
    assert f.locations[0] == _marked(script, "# BUG")


def test_ptodist_run_prints_the_read_only_finding(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PREAMBLE.replace("BACKEND", "'shm'") + CASES[0][1], encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "ptodist", "run", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    heads = [line for line in lines if line.startswith("ptodist: finding")]
    assert heads == ["ptodist: finding read_only on ranks 0, 1"], proc.stderr
    assert f"  fix: {findings.FIXES['read_only']}" in lines
    assert "step-03" not in proc.stderr and "Pass what the annotation asks for" not in proc.stderr


# -- names the language lacks ---------------------------------------------------------------------------------------

def test_a_typo_is_an_attribute_error_that_names_the_near_name():
    import ptodist.language as pl
    import ptodist.language.distributed as pld

    with pytest.raises(AttributeError) as info:
        pl.laod  # noqa: B018
    here = f"{__file__}:{info.tb.tb_lineno}"
    assert str(info.value) == (f"pl.laod at {here}: module 'ptodist.language' (pl) has no attribute 'laod'. "
                               "Did you mean pl.load?")
    assert info.value.name == "laod"
    with pytest.raises(AttributeError, match=r"Did you mean pl\.tile\.load\?$"):
        pl.tile.lod  # noqa: B018
    with pytest.raises(AttributeError, match=r"Did you mean pld\.system\.notify\?$"):
        pld.system.notfy  # noqa: B018
    with pytest.raises(AttributeError, match=r"has no attribute 'xyzzy'\.$"):  # nothing near: no suggestion
        pl.xyzzy  # noqa: B018
    # Upstream's names that ptodist lacks say so.
    with pytest.raises(AttributeError, match=r"upstream PyPTO has pl\.Ptr; ptodist does not have it yet\.$"):
        pl.Ptr  # noqa: B018
    # Probes keep working as Python's do.
    assert not hasattr(pl, "laod") and getattr(pld, "notfy", None) is None and hasattr(pl, "load")
    with pytest.raises(ImportError):
        from ptodist.language import laod  # noqa: F401


def test_notify_without_op_names_the_enum(tmp_path):
    script, found = _run(tmp_path, kernel("pld.system.notify(sig, 0, [0, 0], 1)"))
    (f,) = found
    assert f.message.endswith("OperationTypeError: pld.system.notify() at " + _marked(script, "# BUG") + ": missing "
                              "the keyword argument op=, which has no default: op= takes pld.NotifyOp.AtomicAdd (add "
                              "value to the cell) or pld.NotifyOp.Set (overwrite the cell).")


def test_ptodist_run_suggests_the_near_name_through_the_pypto_alias(tmp_path):
    script = tmp_path / "prog.py"
    program = PREAMBLE.replace("BACKEND", "'shm'").replace("import ptodist.language", "import pypto.language")
    script.write_text(program + kernel("pl.laod(x, [0, 0], [1, 8])"), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "ptodist", "run", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    bug = _marked(script, "# BUG")
    lines = proc.stderr.splitlines()
    assert f"ptodist.errors.UnknownNameError: pl.laod at {bug}: module 'ptodist.language' (pl) has no attribute " \
           "'laod'. Did you mean pl.load?" in lines, proc.stderr
    i = lines.index("ptodist: finding unknown_name on ranks 0, 1")
    assert lines[i + 1].startswith(f"  at {bug}")
    assert lines[i + 2] == "  fix: Did you mean pl.load? Write it instead of pl.laod."
    assert "Fix the error raised in the rank" not in proc.stderr


# -- the user's file and line ---------------------------------------------------------------------------------------

SINGLE = '''
import numpy as np

import ptodist.language as pl

N = pl.dynamic("N")


@pl.jit.incore
def kern(x: pl.Tensor[[1, 8], pl.FP32], y: YTYPE):  # DECL
    t = pl.load(x, [0, 0], [1, 8])
    return pl.store(t, [0, 0], y)


x = np.ones((1, 8), np.float32)
CALL  # BUG
'''

SINGLE_ERRORS = [  # (y's annotation, the call): a kernel called from plain Python, with an error in its outputs
    ("pl.Tensor[[1, 8], pl.FP32]", "kern(x, np.zeros((1, 8), np.float32))"),  # writes an input
    ("pl.Out[pl.Tensor[[1, 8], pl.FP32]]", "kern(x, np.zeros((1, 4), np.float32))"),  # the output's shape
    ("pl.Out[pl.Tensor[[1, 8], pl.FP32]]", "kern(x, np.zeros((1, 8), np.int32))"),  # the output's dtype
    ("pl.Out[pl.Tensor[[1, N], pl.FP32]]", "kern.compile(x, np.zeros((1, 8), np.float32))(x)"),  # unbound N
    ("pl.Out[pl.Tensor]", "kern(x, np.zeros((1, 4), np.float32))"),  # shape-free: out of bounds in the kernel
]


@pytest.mark.parametrize("ytype, call", SINGLE_ERRORS)
def test_a_kernel_called_from_python_names_the_users_lines_only(ytype, call, tmp_path):
    from conftest import PACKAGE_DIR

    script = tmp_path / "prog.py"
    script.write_text(SINGLE.replace("YTYPE", ytype).replace("CALL", call), encoding="utf-8")
    with pytest.raises(Exception) as info:
        runpy.run_path(str(script), run_name="__main__")
    text = str(info.value).split("\n--- traceback")[0]
    (f,) = findings.from_exception(info.value)
    assert PACKAGE_DIR not in text and str(script) in text, text
    assert f.locations and all(loc.startswith(f"{script}:") for loc in f.locations), f.locations


def test_an_input_a_kernel_called_from_python_writes_is_named_at_its_declaration(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(SINGLE.replace("YTYPE", "pl.Tensor[[1, 8], pl.FP32]")
                      .replace("CALL", "kern(x, np.zeros((1, 8), np.float32))"), encoding="utf-8")
    with pytest.raises(Exception) as info:
        runpy.run_path(str(script), run_name="__main__")
    decl = _marked(script, "# DECL")
    assert (f"tensor 'y' [1, 8] FP32 is read-only: it is parameter 'y' of kernel 'kern' ({decl}), declared "
            "pl.Tensor[[1, 8], pl.FP32], an input. If it is written") in str(info.value)
    assert "host orchestrator" not in str(info.value).split("\n--- traceback")[0]
    (f,) = findings.from_exception(info.value)
    assert decl in f.locations and f.kind == "read_only"


def test_an_input_of_the_host_a_kernel_writes_is_named_at_its_declaration(tmp_path):
    program = PREAMBLE + '''
@pl.jit.incore
def copy(x: T, y: pl.Out[T]):
    return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)  # BUG


@pl.jit
def per_rank(x: T, y: pl.Out[T]):
    return copy(x, y)


@pl.jit.host
def host(x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Tensor[[NR, 1, 8], pl.FP32]):  # DECL
    for r in pl.range(pld.world_size()):
        per_rank(x[r], y[r], device=r)


host(X, np.zeros_like(X), config=CFG)
'''
    script = tmp_path / "prog.py"
    script.write_text(program.replace("BACKEND", "'sim'"), encoding="utf-8")
    with pytest.raises(Exception) as info:
        runpy.run_path(str(script), run_name="__main__")
    decl = _marked(script, "# DECL")
    assert (f"tensor 'y[0]' [1, 8] FP32 is read-only: it is parameter 'y' of host orchestrator 'host' ({decl}), "
            "declared pl.Tensor[[NR, 1, 8], pl.FP32], an input.") in str(info.value)
    (f, *_) = findings.from_exception(info.value)
    assert f.locations[:2] == [_marked(script, "# BUG"), decl] and f.kind == "read_only"


def test_the_orchestration_of_a_kernel_called_from_python_is_located_at_the_kernel(tmp_path):
    # The one-kernel orchestration ptodist makes for a direct kernel call: every message that names it
    # (its declaration, a parameter's line) names the user's file, never ptodist's.
    from ptodist.compiler import checks
    from ptodist.language.functions import EntryFunction

    script = tmp_path / "prog.py"
    script.write_text(SINGLE.replace("YTYPE", "pl.Out[pl.Tensor[[1, 8], pl.FP32]]").replace("CALL", "pass"),
                      encoding="utf-8")
    kern = runpy.run_path(str(script))["kern"]
    orchestration = EntryFunction(kern).orchestration
    decl = _marked(script, "# DECL")
    assert orchestration.location == decl
    assert checks.param_where(orchestration, orchestration.params[1]) == (
        f"kern() parameter 'y' (declared pl.Out[pl.Tensor[[1, 8], pl.FP32]] at {decl})")


def test_ptodist_run_shows_what_a_misused_call_takes(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PREAMBLE.replace("BACKEND", "'shm'") + CASES[[c[0] for c in CASES].index("window_without_dtype")][1],
                      encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "ptodist", "run", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[-4:] == ["TypeError: window() missing 1 required keyword-only argument: 'dtype'",
                          "ptodist: finding invalid_argument",
                          f"  at {_marked(script, '# BUG')}, {script}:{len(script.read_text().splitlines())}",
                          "  fix: Call pld.window as it is declared: pld.window(buf, shape, *, dtype)."], proc.stderr
