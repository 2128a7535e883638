"""Shared test fixtures and helpers.

The tests are grouped by what they cover, one folder each (language, collectives, worker, backends, check,
dfx, cli, upstream, house), so a failure's path says what broke.  Some test modules double as the program
a subprocess runs or lend helpers to another folder's tests (``test_mpi``'s launcher); every folder is put
on ``sys.path`` and on ``PYTHONPATH`` (for the subprocesses) here, with ``programs/`` (whole programs the
tests import or run), so ``import test_mpi`` works whichever file pytest is given and wherever the program runs.

* Every test runs in its own output directory.
* ``torch``: the torch module, for the tests that need it (skipped where torch is not installed, so
  ``pip install -e .[dev]`` alone still collects and runs the rest of the suite).
* ``backend`` (``local_backend``): the test runs once per local backend, shm and sim; pass it as
  ``RunConfig(backend=...)``.  ``backend_env`` selects it through ``PTODIST_BACKEND`` instead (as a user
  does; subprocesses inherit it).  The mpi backend needs ``mpirun`` and is test_mpi.py's.
* Examples: ``load_example`` imports ``examples/<stem>.py``, ``run_example`` runs its ``main``,
  ``ptodist_cli`` runs ``python -m ptodist ...`` in a subprocess.
* ``on_every_rank(kernel)``: the host program that runs a kernel on every rank (its tensors stacked per rank
  on the host, its windows allocated); ``signal_program(body)``: a kernel on a signal window, on every rank;
  ``window_program(nr, body)``: the class-form program whose kernel runs
  ``body(w)`` with a data and a signal window; ``run_in_rank(body, *arrays)`` runs a body on one rank.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import ptodist.language as pl
import ptodist.language.distributed as pld

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PROGRAMS = TESTS / "programs"  # whole programs that tests import and run as scripts, none a test module
TEST_FOLDERS = sorted(d for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py")))
sys.path[:0] = [str(d) for d in [TESTS, PROGRAMS, *TEST_FOLDERS] if str(d) not in sys.path]
os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(PROGRAMS), *map(str, TEST_FOLDERS)]
                                           + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
# ptodist's own files: where the package is, never a guess from a path's name (a checkout is usually
# cloned into a folder named ptodist, which holds the tests and the user's programs too).
PACKAGE_DIR = str(Path(pl.__file__).resolve().parent.parent) + os.sep
EXAMPLES = REPO / "examples"
LOCAL_BACKENDS = ["shm", "sim"]
NR = pl.dynamic("NR")


@pytest.fixture(autouse=True)
def _isolated_output(tmp_path, monkeypatch):
    # Plans and DFX outputs go under the test's tmp dir, never into the checkout.
    monkeypatch.setenv("PTODIST_OUTPUT_ROOT", str(tmp_path / "build_output"))
    # Rank groups kept alive for another test's one-shot calls are not this test's children.
    from ptodist.backends.shm import close_kept_groups

    close_kept_groups()
    yield
    close_kept_groups()


# -- optional dependencies, backends ------------------------------------------------------------

@pytest.fixture(scope="session")
def torch():
    """The torch module; the test is skipped where torch is not installed."""
    return pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[torch]')")


@pytest.fixture(params=LOCAL_BACKENDS)
def local_backend(request) -> str:
    """Each local backend in turn: the same program must give the same result on shm and on sim."""
    return request.param


@pytest.fixture
def backend(local_backend) -> str:
    """The backend a test runs on, for ``RunConfig(backend=...)``: the local ones (mpi runs are test_mpi.py's)."""
    return local_backend


@pytest.fixture
def backend_env(backend, monkeypatch) -> str:
    """``backend``, selected through ``PTODIST_BACKEND`` (so a program's own RunConfig and subprocesses use it)."""
    monkeypatch.setenv("PTODIST_BACKEND", backend)
    return backend


# -- processes ----------------------------------------------------------------------------------

def python_exe() -> str:
    return sys.executable


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def children() -> list[int]:
    """Return the live (non-zombie) child processes of this process."""
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            out.append(int(pid))
    return out


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (it no longer exists, or only as a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def ptodist_cli(*args, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m ptodist ARGS`` (the environment of this process) and return what it did."""
    return subprocess.run([sys.executable, "-m", "ptodist", *map(str, args)], cwd=cwd, env=child_env(),
                          capture_output=True, text=True, timeout=timeout)


# -- examples -------------------------------------------------------------------------------------

_loaded: dict = {}


def load_example(stem: str):
    """Import ``examples/<stem>.py`` as a module (once per test session); ``stem`` may name a subfolder.

    The examples use torch: where it is not installed, the test is skipped.
    """
    if stem not in _loaded:
        spec = importlib.util.spec_from_file_location(f"ptodist_example_{stem.replace('/', '_')}",
                                                      EXAMPLES / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            pytest.skip(f"examples/{stem}.py needs torch, which is not installed")
        _loaded[stem] = module
    return _loaded[stem]


def run_example(capsys, stem: str, *argv: str) -> None:
    """Run the example's ``main(argv)``: it must return 0 and print OK (its golden check passed)."""
    rc = load_example(stem).main(list(argv))
    out = capsys.readouterr().out
    assert rc == 0
    assert "OK" in out.split(), out


# -- source lines ---------------------------------------------------------------------------------

def marker_line(path, marker: str) -> int:
    """Return the number of the one line of file ``path`` that ends with the comment ``# @marker``."""
    hits = [i for i, text in enumerate(Path(path).read_text().splitlines(), 1) if text.rstrip().endswith(f"# @{marker}")]
    assert len(hits) == 1, f"marker @{marker} is on {len(hits)} lines of {path}, not one"
    return hits[0]


def source_line(fn, text: str) -> int:
    """Return the source line number of the first line of ``fn`` (a program function too) containing ``text``."""
    lines, start = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    raise AssertionError(f"{text!r} not in {fn}")


# -- small programs -------------------------------------------------------------------------------

def _source_file(name: str, source: str) -> str:
    """Return a file holding ``source``, in this user's temporary directory: the path a generated program's code
    names.  ptodist reads a program's lines from its file (a window buffer is named after the variable its line
    assigns), and some tests clear linecache, so the text must be on disk; the name is the text's digest, so
    every process (forked ranks, MPI processes, subprocesses) finds the same file."""
    folder = Path(tempfile.gettempdir()) / f"ptodist-tests-{os.getuid()}"
    path = folder / f"{name}_{hashlib.sha256(source.encode()).hexdigest()[:16]}.py"
    if not path.is_file():
        folder.mkdir(exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(source)
        os.replace(partial, path)  # whole or absent, whoever writes it
    return str(path)


def on_every_rank(kernel, name: str | None = None):
    """Return the host program that runs ``kernel`` on every rank, built from the kernel's parameters.

    The scaffold most distributed tests need and none is about: a per-device function ``<kernel>_rank``
    (``<name>_rank`` when ``name`` is given) that calls ``kernel`` (a ``@pl.jit.incore`` function), and the
    host orchestrator ``name`` (default ``<kernel>_host``) that calls it on every rank.  Per kernel parameter:

    * ``pl.Tensor[S, dt]`` (``pl.Out``/``pl.InOut`` too): the host's parameter of the same name and
      direction, ``pl.Tensor[[NR, *S], dt]``; rank ``r`` gets row ``r``;
    * ``pld.DistributedTensor[S, dt]``: a window of the buffer ``<param>_buf``, with every
      ``pl.dynamic`` dimension of ``S`` the world size (a signal ``[NR, 1]`` has a row per rank);
    * ``pl.Scalar[dt]``: the rank's index ``r``.

    A kernel without a plain tensor parameter gets the host parameter ``x: pl.Tensor[[NR, 1], pl.FP32]``,
    which says how many ranks there are (its rows are not used).
    """
    from ptodist.language.types import Direction

    host_params, rank_params, args, windows = [], [], [], []
    scope = {"pl": pl, "pld": pld, "NR": NR, "kernel": kernel}
    for i, spec in enumerate(kernel.params):
        t = spec.ttype
        wrap = {Direction.OUT: "pl.Out[{}]", Direction.INOUT: "pl.InOut[{}]"}.get(spec.direction, "{}")
        if spec.kind == "scalar":
            scope[f"S{i}"] = t
            rank_params.append(f"{spec.name}: S{i}")
            args.append("r")
            continue
        scope[f"T{i}"] = (pld.DistributedTensor if t.distributed else pl.Tensor)[list(t.shape), t.dtype]
        scope[f"D{i}"] = t.dtype
        rank_params.append(f"{spec.name}: {wrap.format(f'T{i}')}")
        if t.distributed:
            dims = ", ".join(str(d) if isinstance(d, int) else "pld.world_size()" for d in t.shape)
            windows.append(f"    {spec.name}_buf = pld.alloc_window_buffer([{dims}], dtype=D{i})\n")
            args.append(f"pld.window({spec.name}_buf, [{dims}], dtype=D{i})")
        else:
            scope[f"H{i}"] = pl.Tensor[[NR, *t.shape], t.dtype]
            host_params.append(f"{spec.name}: {wrap.format(f'H{i}')}")
            args.append(f"{spec.name}[r]")
    rank = f"{name or kernel.name}_rank"
    name = name or f"{kernel.name}_host"
    # Written out as source: ptodist reads a program function's parameters from its signature.
    source = (f"def {rank}({', '.join(rank_params)}):\n"
              f"    return kernel({', '.join(spec.name for spec in kernel.params)})\n"
              f"def {name}({', '.join(host_params or ['x: pl.Tensor[[NR, 1], pl.FP32]'])}):\n{''.join(windows)}"
              f"    for r in pl.range(pld.world_size()):\n        {rank}({', '.join(args)}, device=r)\n")
    exec(compile(source, _source_file(name, source), "exec"), scope)
    scope[rank] = pl.jit(scope[rank])
    return pl.jit.host(scope[name])


def signal_program(body, cols: int = 1, size: int = 4):
    """Return the host program ``host(y)`` whose kernel ``kernel`` runs ``body(sig, me, n)`` on every rank.

    ``sig`` is an ``[NR, cols]`` INT32 signal window (buffer ``sig_buf``), ``me``/``n`` the rank and the rank
    count; ``y`` (``[NR, 1, size]`` FP32, an output the kernel leaves alone) says how many ranks there are.
    """

    @pl.jit.incore
    def kernel(y: pl.Out[pl.Tensor[[1, size], pl.FP32]], sig: pl.InOut[pld.DistributedTensor[[NR, cols], pl.INT32]]):
        ctx = pld.get_comm_ctx(sig)
        body(sig, pld.rank(ctx), pld.nranks(ctx))
        return y

    return on_every_rank(kernel, name="host")


def window_program(nr: int, body, size: int = 8):
    """The ``@pl.program`` class ``P`` whose one kernel runs ``body(w)`` on each of ``nr`` ranks.

    ``w`` has the rank's ``x`` (in) and ``y`` (out), ``[1, size]`` FP32 rows of the host's
    ``[nr, 1, size]`` tensors, its windows ``data`` (``[1, size]`` FP32, buffer ``data_buf``) and
    ``sig`` (``[nr, 1]`` INT32, buffer ``sig_buf``), and ``me``/``n``, the rank and the rank count.
    """
    from types import SimpleNamespace

    @pl.program
    class P:
        @pl.function(type=pl.FunctionType.InCore)
        def k(self, x: pl.Tensor[[1, size], pl.FP32], y: pl.Out[pl.Tensor[[1, size], pl.FP32]],
              data: pl.InOut[pld.DistributedTensor[[1, size], pl.FP32]],
              sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            ctx = pld.get_comm_ctx(data)
            body(SimpleNamespace(x=x, y=y, data=data, sig=sig, me=pld.rank(ctx), n=pld.nranks(ctx)))
            return y

        @pl.function(type=pl.FunctionType.Orchestration)
        def chip(self, x: pl.Tensor[[1, size], pl.FP32], y: pl.Out[pl.Tensor[[1, size], pl.FP32]],
                 data: pl.InOut[pld.DistributedTensor[[1, size], pl.FP32]],
                 sig: pl.InOut[pld.DistributedTensor[[nr, 1], pl.INT32]]):
            return self.k(x, y, data, sig)

        @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
        def host(self, x: pl.Tensor[[nr, 1, size], pl.FP32], y: pl.Out[pl.Tensor[[nr, 1, size], pl.FP32]]):
            data_buf = pld.alloc_window_buffer([1, size], dtype=pl.FP32)
            sig_buf = pld.alloc_window_buffer([nr, 1], dtype=pl.INT32)
            for r in pl.range(pld.world_size()):
                self.chip(x[r], y[r], pld.window(data_buf, [1, size], dtype=pl.FP32),
                          pld.window(sig_buf, [nr, 1], dtype=pl.INT32), device=r)
            return y

    return P


def run_in_rank(body, *arrays, backend: str = "sim"):
    """Run ``body(*tensors)`` inside a kernel on one rank; return the arrays (written back: every one is InOut).

    ``arrays`` are numpy arrays; inside ``body`` they are the rank's tensors, so ``pl.tensor.*`` ops and
    ``pl.load``/``pl.store`` work on them as in any program.
    """
    import numpy as np

    from ptodist import RunConfig

    names = [f"a{i}" for i in range(len(arrays))]
    params = ", ".join(f"{n}: pl.InOut[pl.Tensor]" for n in names)
    args = ", ".join(names)
    scope = {"pl": pl, "body": body}
    exec(f"def kernel({params}):\n    body({args})\n"
         f"def orch({params}):\n    kernel({args})\n"
         f"def host({params}):\n    orch({args}, device=0)\n", scope)
    kernel = pl.jit.incore(scope["kernel"])
    scope["kernel"] = kernel
    scope["orch"] = pl.jit(scope["orch"])
    host = pl.jit.host(scope["host"])
    tensors = [np.array(a, copy=True) for a in arrays]
    host.compile(*tensors, config=RunConfig(backend=backend))(*tensors)
    return tensors
