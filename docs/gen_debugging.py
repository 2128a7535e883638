"""Generate docs/debugging.md from real runs of the bug zoo.

Each entry of :data:`ZOO` is a complete PyPTO-style script with one bug of SPEC §8
on the line marked ``# BUG`` (two entries, a clean run and the build-time
flags, have none).  :func:`run` writes it as ``prog.py`` into a
directory and runs ``python -m ptodist run --report-json report.json prog.py``
with ``PTODIST_HANG_TIMEOUT=5``; :func:`render` turns the programs and what
ptodist printed on stderr (:func:`normalise`d: the directory dropped from paths,
timings such as ``0.53 s`` shown as ``N s``) into the markdown page.
``tests/check/test_bug_zoo.py`` runs every entry, checks its finding, and compares the
output with the committed page, so the page stays true.

Usage: ``python docs/gen_debugging.py`` (rewrites docs/debugging.md),
``python docs/gen_debugging.py --check`` (exit 1 when the page is out of date) or
``python docs/gen_debugging.py --measure`` (runs :data:`FEATURES`, the bugs of the new execution model, and
their fixed twins under ``ptodist check --schedules 20`` and prints how many are located: :func:`measure`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ptodist import commands

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "debugging.md"
HANG_TIMEOUT = "5"
BUG_MARK = "# BUG"

HEADER = """\
import numpy as np

import pypto.language as pl
import pypto.language.distributed as pld
from pypto import ir
from pypto.ir.distributed_compiled_program import DistributedConfig
"""


@dataclass(frozen=True)
class Bug:
    """One zoo program and what ptodist must report for it.

    ``kinds``: the accepted finding kinds (empty: the program is correct and the run must be clean);
    ``ranks``: the finding's ranks; ``pitfall``: text the finding's SPEC §8 row must contain (None: no row
    applies); the finding's locations must hold the line marked ``# BUG``.
    """

    name: str
    title: str
    source: str
    kinds: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    pitfall: str | None = None
    before: str = ""   # prose above the program
    after: str = ""    # prose below the output
    env: dict = field(default_factory=dict)
    level: int = 3     # the heading level of its section
    # Known ptodist shortcomings, by check ("location", "pitfall", ...): the test expects that check to fail
    # (and fails when it passes, so the entry is removed once ptodist is fixed).
    issues: dict = field(default_factory=dict)
    command: str = "run"  # "check": run under `ptodist check` (bugs that a single run does not show)
    # The feature of the execution model the program exercises (task graphs, deferred waits, pipes, ...): set for
    # the entries of FEATURES, which are measured (``--measure``) rather than rendered into the page.
    feature: str = ""
    # (old, new) replacements of the program's text that fix the bug: the fixed twin, which must run clean.
    twin: tuple = ()

    @property
    def program(self) -> str:
        return HEADER + "\n" + textwrap.dedent(self.source).lstrip("\n")

    @property
    def fixed(self) -> Bug:
        """The fixed twin: the same program with :attr:`twin`'s replacements made, expected to run clean."""
        text = textwrap.dedent(self.source).lstrip("\n")
        for old, new in self.twin:
            if text.count(old) != 1:
                raise ValueError(f"{self.name}: the twin's text {old!r} occurs {text.count(old)} times, not once")
            text = text.replace(old, new)
        return Bug(self.name + ".fixed", self.title + " (fixed)", text, command=self.command, env=self.env,
                   feature=self.feature)

    @property
    def bug_line(self) -> int | None:
        """The 1-based line of the ``# BUG`` marker, or None for a correct program."""
        for i, line in enumerate(self.program.splitlines(), 1):
            if BUG_MARK in line:
                return i
        return None


def _bug(name, title, source, kinds=(), ranks=(), pitfall=None, before="", after="", **kw) -> Bug:
    if isinstance(kinds, str):
        kinds = (kinds,)
    return Bug(name, title, source, tuple(kinds), tuple(ranks), pitfall, textwrap.dedent(before).strip(),
               textwrap.dedent(after).strip(), **kw)


ZOO: list[Bug] = [
    _bug("hang", "All ranks hang", '''
        P = 2
        NR = pl.dynamic("NR")
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Barrier:
            @pl.function(type=pl.FunctionType.InCore)
            def barrier(self, sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(sig)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)  # BUG: nobody has notified yet
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, sig: pl.InOut[Sig]):
                self.barrier(sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 8], pl.FP32]):
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


        compiled = ir.compile(Barrier, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 8), np.float32))
        ''', "hang", [0, 1], "8.1 all ranks hang",
         before="""
         Every rank waits for every peer's arrival before announcing its own, so
         no cell ever changes. On the device all ranks hang; under ptodist every
         unfinished rank is blocked in a wait whose cell cannot change, so the
         hang is certain and is reported within about a second (whatever
         `PTODIST_HANG_TIMEOUT` says).
         """,
         after="""
         Fix: move the notify loop before the wait loop. When a wait and the send
         it depends on are separate tasks, pin the order with
         `pl.submit(..., deps=[send_task])`. A hang where some rank is still
         computing (not blocked in a wait) is reported only after the hang
         timeout (`RunConfig(hang_timeout_s=...)`, `PTODIST_HANG_TIMEOUT`,
         default 60 s), as "no progress for ... s".
         """),
    _bug("set_clobber", "A signal cell never reaches its expected value", '''
        P = 4
        NR = pl.dynamic("NR")
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Barrier:
            @pl.function(type=pl.FunctionType.InCore)
            def barrier(self, sig: pl.InOut[Sig]):
                n = pld.nranks(pld.get_comm_ctx(sig))
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [0, 0], 1, op=pld.NotifyOp.Set)  # BUG: every rank Sets one cell
                pld.system.wait(sig, [0, 0], n, cmp=pld.WaitCmp.Eq)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, sig: pl.InOut[Sig]):
                self.barrier(sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 8], pl.FP32]):
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


        compiled = ir.compile(Barrier, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 8), np.float32))
        ''', ("hang", "set_clobber"), [0, 1, 2, 3], "8.1",
         before="""
         A barrier of four ranks on one shared cell: each arrival *sets* the
         cell to 1 instead of adding 1, so the cell never reaches 4 (SPEC §8.3
         step 04 is the same bug).
         """,
         after="""
         Fix: use `NotifyOp.AtomicAdd` with `WaitCmp.Ge` for a barrier with
         several writers; keep `Set` for a 1:1 exchange where one writer owns
         the cell.
         """),
    _bug("hardcoded_nr", "Shape mismatch at compile time", '''
        P = 4


        @pl.program
        class Copy:
            @pl.function(type=pl.FunctionType.InCore)
            def copy(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.copy(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[2, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[2, 1, 8], pl.FP32]]):  # BUG: 2 ranks
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], device=r)
                return y


        compiled = ir.compile(Copy, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "shape_mismatch", [], "8.3 step 07",
         before="""
         The program was written for two ranks and is now run on four: the host
         annotations still say 2 where they mean "the rank count" (SPEC §8.3
         step 07 is the same bug).
         """,
         after="""
         Fix: `NR = pl.dynamic("NR")` and `pl.Tensor[[NR, 1, 8], pl.FP32]`; the
         name binds to the argument's size at each call, and every use of it
         must agree.
         """),
    _bug("not_shared", "TypeError at dispatch: a host tensor not in shared memory", '''
        import torch

        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Double:
            @pl.function(type=pl.FunctionType.InCore)
            def double(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.mul(pl.load(x, [0, 0], [1, 8]), 2.0), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.double(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], device=r)
                return y


        compiled = ir.compile(Double, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = torch.ones(P, 1, 8)
        y = torch.zeros(P, 1, 8).share_memory_()
        with compiled.prepare() as rt:
            rt(x, y)  # BUG: x is not in shared memory
        ''', "not_shared", [], "8.1 TypeError at dispatch",
         before="""
         A `DistributedWorker` (`compiled.prepare()`) keeps its rank processes
         between dispatches, so host tensors reach them without a copy: they must
         be in shared memory. A one-shot call copies its arguments and has no
         such rule.
         """,
         after="""
         Fix: `x = torch.ones(P, 1, 8).share_memory_()` (before or after
         `prepare()`; for numpy, `ptodist.shared_array(shape, dtype)`), or copy
         the data in with `rt.alloc_tensor(..., init=x)` / `rt.copy_to` and pass
         the resident tensor.
         """),
    _bug("allreduce_in_loop", "allreduce rejected in a loop", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Steps:
            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 8], pl.FP32]):
                grad = pld.window(pld.alloc_window_buffer([1, 8], dtype=pl.FP32), [1, 8], dtype=pl.FP32)
                for step in pl.range(3):
                    grad = pld.tensor.allreduce(grad)  # BUG: no signal inside a loop


        compiled = ir.compile(Steps, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 8), np.float32))
        ''', "collective_in_loop", [], "8.1 allreduce rejected in a loop",
         before="""
         On the host orchestrator `pld.tensor.allreduce` may omit its signal:
         one is synthesised per call site. Inside a loop that one signal would
         serve every iteration at once, so the call is rejected before any rank
         starts.
         """,
         after="""
         Fix: allocate a signal window (`[NR, 1]` INT32 for mesh) outside the
         loop and pass it, or hoist the allreduce out of the loop.
         """),
    _bug("window_bytes", "alloc_window_buffer(NR): a rank count as the byte size", '''
        P = 2
        NR = pl.dynamic("NR")
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Signals:
            @pl.function(type=pl.FunctionType.InCore)
            def ping(self, sig: pl.InOut[Sig]):
                me = pld.rank(pld.get_comm_ctx(sig))
                pld.system.notify(sig, 0, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, sig: pl.InOut[Sig]):
                self.ping(sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 8], pl.FP32]):
                sig_buf = pld.alloc_window_buffer(pld.world_size())  # BUG: the size is in bytes
                for r in pl.range(pld.world_size()):
                    self.per_rank(pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)


        compiled = ir.compile(Signals, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 8), np.float32))
        ''', "window_too_small", [], "8.2 alloc_window_buffer",
         before="""
         `pld.alloc_window_buffer(n)` takes **bytes**; `NR` bytes hold a
         quarter of `NR` INT32 cells. The allocation warns (its size equals the
         world size) and the view, larger than its buffer, is an error.
         """,
         after="""
         Fix: the shape form, `pld.alloc_window_buffer([pld.world_size(), 1],
         dtype=pl.INT32)`.
         """),
    _bug("dispatch_range", "Dispatch loop trip count differs from len(device_ids)", '''
        P = 4


        @pl.program
        class Copy:
            @pl.function(type=pl.FunctionType.InCore)
            def copy(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.copy(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[4, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 1, 8], pl.FP32]]):  # BUG: see loop
                for r in pl.range(2):
                    self.per_rank(x[r], y[r], device=r)
                return y


        compiled = ir.compile(Copy, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "dispatch_coverage", [], "8.2 dispatch loop",
         before="""
         Four device ids, but the dispatch loop covers `range(2)`: ranks 2 and 3
         would never run. After planning, every rank in `[0, len(device_ids))`
         must have been dispatched; the error names the host function and the
         ranks left out.
         """,
         after="""
         Fix: `for r in pl.range(pld.world_size()):`, which always matches
         `len(device_ids)`.
         """),
    _bug("device_id_as_rank", "device= outside [0, world)", '''
        DEVICES = [4, 5]  # physical device ids, e.g. from --device 4,5


        @pl.program
        class Copy:
            @pl.function(type=pl.FunctionType.InCore)
            def copy(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.copy(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[2, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[2, 1, 8], pl.FP32]]):
                for r, dev in enumerate(DEVICES):
                    self.per_rank(x[r], y[r], device=dev)  # BUG: device= takes the rank index r
                return y


        compiled = ir.compile(Copy, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=DEVICES))
        compiled(np.zeros((2, 1, 8), np.float32))
        ''', "dispatch_coverage", [], "8.2 dispatch loop",
         before="""
         `device_ids` are physical device labels and need not start at 0;
         `device=` is always the logical rank index in `[0, world)`, mapped to
         `device_ids[r]` by the runtime.
         """,
         after="Fix: `device=r`.", level=4),
    _bug("scalar_first", "A scalar parameter before a tensor parameter", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Hello:
            @pl.function(type=pl.FunctionType.InCore)
            def add_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         r: pl.Scalar[pl.INT32]):
                return pl.store(pl.add(pl.load(x, [0, 0], [1, 8]), r), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, r: pl.Scalar[pl.INT32], x: pl.Tensor[[1, 8], pl.FP32],  # BUG: scalar first
                         y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.add_rank(x, y, r)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(r, x[r], y[r], device=r)
                return y


        compiled = ir.compile(Hello, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "task_args_order", [], "8.2 scalar before tensor",
         before="""
         The runtime packs the arguments of a function the host orchestrator
         dispatches as all tensors, then all scalars (`TaskArgs: cannot add tensor
         after scalar` on the device). ptodist checks every function the host
         dispatches when the program is compiled (SPEC §8.3 step 01 is the same bug);
         a kernel takes its parameters in any order.
         """,
         after="Fix: put the scalar parameters last, and the arguments likewise."),
    _bug("rank_on_host", "Step 02: rank identity read outside the dispatch loop", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Hello:
            @pl.function(type=pl.FunctionType.InCore)
            def add_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         r: pl.Scalar[pl.INT32]):
                return pl.store(pl.add(pl.load(x, [0, 0], [1, 8]), r), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         r: pl.Scalar[pl.INT32]):
                return self.add_rank(x, y, r)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                me = pld.rank(pld.get_comm_ctx(pld.window(buf, [1, 8], dtype=pl.FP32)))  # BUG: on the host
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], me, device=r)
                return y


        compiled = ir.compile(Hello, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "invalid_argument", [], "8.3 step 02",
         before="""
         The host orchestrator runs once, not once per rank, so a rank read
         there would give every rank the same value. In ptodist `pld.rank` and
         `pld.nranks` exist only inside a kernel: on the host (and in a
         per-device orchestration function) they are an error.
         """,
         after="""
         Fix: pass the loop variable `r` (`self.per_rank(x[r], y[r], r,
         device=r)`), or read `pld.rank(pld.get_comm_ctx(window))` in the
         kernel.

         Not detected: the other half of this step — a program that gets the
         rank some other wrong way and writes identical outputs on every rank.
         ptodist prints no warning about identical per-rank outputs; the run
         completes and only the program's golden check can fail.
         """),
    _bug("window_as_tensor", "Step 03: DistributedTensor used as Tensor, or the reverse", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Stage:
            @pl.function(type=pl.FunctionType.InCore)
            def stage(self, x: pl.Tensor[[1, 8], pl.FP32], data: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], data: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
                return self.stage(x, data)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32]):
                buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                for r in pl.range(pld.world_size()):
                    data = pld.window(buf, [1, 8], dtype=pl.FP32)
                    self.per_rank(x[r], data, device=r)  # BUG: 'data' is declared pl.Tensor


        compiled = ir.compile(Stage, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "type_mismatch", [], "8.3 step 03",
         before="""
         Every dispatch checks each argument's kind (tensor, window, scalar),
         dtype and shape against the per-device function's annotations.
         """,
         after="Fix: annotate the parameter `pl.InOut[pld.DistributedTensor[[1, 8], pl.FP32]]`."),
    _bug("tensor_as_window", "A host tensor where pld.DistributedTensor is declared", '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]


        @pl.program
        class Stage:
            @pl.function(type=pl.FunctionType.InCore)
            def stage(self, x: pl.Tensor[[1, 8], pl.FP32], data: pl.InOut[Win]):
                return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], data: pl.InOut[Win]):
                return self.stage(x, data)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], device=r)  # BUG: y[r] is host memory, not a window
                return y


        compiled = ir.compile(Stage, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "type_mismatch", [], "8.3 step 03", level=4,
         after="""
         Fix: pass `pld.window(buf, [1, 8], dtype=pl.FP32)` of a buffer from
         `pld.alloc_window_buffer`; RMA, signals and collectives reach only
         window memory.
         """),
    _bug("race", "Steps 05, 06, 08: data races", '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]


        @pl.program
        class Shift:
            @pl.function(type=pl.FunctionType.InCore)
            def shift(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], data: pl.InOut[Win]):
                ctx = pld.get_comm_ctx(data)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                data = pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)
                nxt = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, 8])  # BUG: no barrier since the store
                return pl.store(nxt, [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         data: pl.InOut[Win]):
                return self.shift(x, y, data)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(data_buf, [1, 8], dtype=pl.FP32), device=r)
                return y


        compiled = ir.compile(Shift, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(1, P * 8 + 1, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), np.roll(x, -1, axis=0)), "mismatch"
        ''', "race", [0, 1], "8.3 steps 05, 06, 08", command="check",
         before="""
         RMA before the ordering barrier (05), a `put` not paired with
         notify/wait (06), and a load racing the peer's store for want of a
         barrier (08) are data races: two ranks touch the same window bytes, at
         least one writes, and no notify/wait orders them. On the device, and
         under `ptodist run`, the result depends on timing: the golden check may
         pass at P = 2 and fail at P = 4, or pass on one run and fail on the
         next. `ptodist check` runs the ranks one at a time under a seeded
         schedule, records every window access, notify and wait, and reports
         the race from the happens-before relation — on its first schedule,
         whether or not that schedule made the result wrong
         ([check.md](check.md)). Here each rank pulls the next rank's row
         right after storing its own:
         """,
         after="""
         Fix: a barrier between the store and the pull (every rank notifies
         every peer, then waits for every peer), as in `examples/05_*.py`; for
         a `put`, notify the receiver after it and have the receiver wait
         before it reads (`examples/06_*.py`).
         """),
    _bug("stale_signal", "Step 09: stale signals", '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class TwoHops:
            @pl.function(type=pl.FunctionType.InCore)
            def hops(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                     a: pl.InOut[Win], b: pl.InOut[Win], sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(a)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                # Hop 1: stage x in a, barrier on row sig[:, 0], pull the next rank's a.
                a = pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], a)
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
                t = pld.tile.remote_load(a, (me + 1) % n, [0, 0], [1, 8])
                # Hop 2: stage it in b, barrier again, pull the next rank's b.
                b = pl.store(t, [0, 0], b)
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)  # BUG: the row still holds hop 1's
                return pl.store(pld.tile.remote_load(b, (me + 1) % n, [0, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         a: pl.InOut[Win], b: pl.InOut[Win], sig: pl.InOut[Sig]):
                return self.hops(x, y, a, b, sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                a_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                b_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(a_buf, [1, 8], dtype=pl.FP32),
                                  pld.window(b_buf, [1, 8], dtype=pl.FP32),
                                  pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
                return y


        compiled = ir.compile(TwoHops, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(1, P * 8 + 1, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), np.roll(x, -2, axis=0)), "mismatch"
        ''', "stale_signal", [0, 1], "8.3 step 09", command="check",
         before="""
         Two barriers that reuse one signal row with `WaitCmp.Ge` and the same
         threshold: the counters only grow, so the second barrier's waits are
         satisfied by the first barrier's arrivals and return at once, and
         what the second barrier was meant to order is a race. `ptodist check`
         reports a wait that was satisfied only by notifies its previous wait
         on the same cell had already consumed, although the rank had notified
         its peers since (a new round) — and the race it lets through:
         """,
         after="""
         Fix: give each barrier its own row (`sig` shaped `[NR, 2]`, cell
         `[me, hop]`), or wait for 2 the second time. With `WaitCmp.Eq` the
         counter can overshoot instead (a fast peer's second arrival lands
         before the wait looks) and the run hangs; the hang report names the
         reused row as the likely cause ("counters only grow").
         """),
    _bug("negative_neighbour", "Step 10: negative left neighbour under truncated modulo", '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class RingShift:
            @pl.function(type=pl.FunctionType.InCore)
            def shift(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                      data: pl.InOut[Win], sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(data)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                data = pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
                left = pld.tile.remote_load(data, (me - 1) % n, [0, 0], [1, 8])  # BUG: -1 on rank 0
                return pl.store(left, [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         data: pl.InOut[Win], sig: pl.InOut[Sig]):
                return self.shift(x, y, data, sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    data = pld.window(data_buf, [1, 8], dtype=pl.FP32)
                    sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
                    self.per_rank(x[r], y[r], data, sig, device=r)
                return y


        compiled = ir.compile(RingShift, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "peer_out_of_range", [0], "8.3 step 10",
         before="""
         Scalar arithmetic in a kernel follows the device's C semantics: `%`
         truncates toward zero, so on rank 0 `(0 - 1) % n` is `-1`, not
         `n - 1`. ptodist computes the same `-1` and rejects the peer.
         """,
         after="Fix: `(me - 1 + n) % n`."),
    _bug("ring_signal_shape", "Step 11: signal shape does not match the collective mode", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Reduce:
            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 8], pl.FP32]):
                data = pld.window(pld.alloc_window_buffer([1, 8], dtype=pl.FP32), [1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
                pld.tensor.allreduce(data, sig, mode="ring")  # BUG: ring needs [2*(NR-1), NR]


        compiled = ir.compile(Reduce, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 8), np.float32))
        ''', "signal_layout", [], "steps 11, 16",
         before="""
         Mesh collectives take an `[NR, 1]` signal, `mode="ring"` a
         `[2*(NR-1), NR]` one (one row per ring round). The check runs where the
         collective is called: on the host while planning, in a kernel before
         any cell is touched.
         """,
         after="Fix: shape the signal for the mode, or use `mode=\"mesh\"`."),
    _bug("gather_wrong_slot", "Step 13: gathering into the wrong slot", '''
        P = 2
        ROWS = 2
        NR = pl.dynamic("NR")
        Gathered = pld.DistributedTensor[[P * ROWS, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Allgather:
            @pl.function(type=pl.FunctionType.InCore)
            def gather(self, x: pl.Tensor[[ROWS, 8], pl.FP32], y: pl.Out[pl.Tensor[[P * ROWS, 8], pl.FP32]],
                       gathered: pl.InOut[Gathered], sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(gathered)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                block = pl.load(x, [0, 0], [ROWS, 8])
                for dst in pl.range(n):
                    pld.tile.remote_store(block, gathered, dst, [me, 0])  # BUG: slot me starts at row me * ROWS
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
                return pl.store(pl.load(gathered, [0, 0], [P * ROWS, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[ROWS, 8], pl.FP32], y: pl.Out[pl.Tensor[[P * ROWS, 8], pl.FP32]],
                         gathered: pl.InOut[Gathered], sig: pl.InOut[Sig]):
                return self.gather(x, y, gathered, sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, ROWS, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, P * ROWS, 8], pl.FP32]]):
                buf = pld.alloc_window_buffer([P * ROWS, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(buf, [P * ROWS, 8], dtype=pl.FP32),
                                  pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
                return y


        compiled = ir.compile(Allgather, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(1, P * ROWS * 8 + 1, dtype=np.float32).reshape(P, ROWS, 8)
        assert np.array_equal(compiled(x)[0], x.reshape(P * ROWS, 8)), "mismatch"
        ''', "race", [0, 1], "8.3 step", command="check",
         before="""
         A hand-rolled allgather pushes each rank's `[ROWS, 8]` block into slot
         `me` of every rank's gather window, but offsets `[me, 0]` instead of
         `[me * ROWS, 0]`: slots overlap (rank 0 and rank 1 both write row 1)
         and the last row is never written. `ptodist check` reports the
         overlapping writes as a race. (The row nobody wrote reads as zeros
         from the rank's own window; a rank reading its own zero-started
         window is not reported, since accumulating into one is a pattern.)
         """,
         after="Fix: offsets `[me * ROWS, 0]`."),
    _bug("all_to_all_in_place", "Step 15: one window as both source and result", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Exchange:
            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 8], pl.FP32]):
                buf = pld.alloc_window_buffer([pld.world_size(), 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                data = pld.window(buf, [pld.world_size(), 8], dtype=pl.FP32)
                sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
                pld.tensor.all_to_all(data, data, sig)  # BUG: source and result are one window


        compiled = ir.compile(Exchange, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 8), np.float32))
        ''', "aliasing", [], "8.3 step 15",
         before="""
         A peer's block would land on rows this rank has not sent yet. The
         builtin `allgather`, `all_to_all` and `all_to_all_v` reject one window
         as both operands.
         """,
         after="""
         Fix: separate windows for the source and the result.

         Not detected: the same aliasing in a hand-rolled exchange (notify,
         wait and `remote_store` written out) is a data race; ptodist has no
         race detector yet, so that run completes and only the golden check can
         fail.
         """),
    _bug("two_layouts", "Step 16: one signal window with two layouts", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Compose:
            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 8], pl.FP32]):
                nr = pld.world_size()
                data = pld.window(pld.alloc_window_buffer([nr, 8], dtype=pl.FP32), [nr, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([2 * (nr - 1), nr], dtype=pl.INT32)
                pld.tensor.allreduce(data, pld.window(sig_buf, [nr, 1], dtype=pl.INT32))
                ring = pld.window(sig_buf, [2 * (nr - 1), nr], dtype=pl.INT32)
                pld.tensor.allreduce(data, ring, mode="ring")  # BUG: sig_buf already serves the mesh layout


        compiled = ir.compile(Compose, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 8), np.float32))
        ''', "signal_layout", [], "steps 11, 16",
         before="""
         Collective signals clear themselves only within one layout: the mesh
         and ring protocols count in different cells, so a buffer shared by
         both would hand one protocol the other's counts. A signal buffer
         serves the layout (mode and shape) of the first collective that used
         it in the run.
         """,
         after="Fix: one signal window per layout."),
    _bug("load_out_of_bounds", "Silent data corruption", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Split:
            @pl.function(type=pl.FunctionType.InCore)
            def take(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]],
                     r: pl.Scalar[pl.INT32]):
                part = pl.load(x, [0, r * 8], [1, 4])  # BUG: the chunks are 4 wide, not 8
                return pl.store(part, [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]],
                         r: pl.Scalar[pl.INT32]):
                return self.take(x, y, r)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 4], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x, y[r], r, device=r)
                return y


        compiled = ir.compile(Split, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((1, 8), np.float32), np.zeros((P, 1, 4), np.float32))
        ''', "out_of_bounds", [1], None,
         before="""
         Each rank should take its 4-column half of `x`, but the offset steps by
         8: rank 0's region fits, rank 1's starts at column 8 and runs past the
         end. `pl.load`, `pl.store`, `pl.slice`, `pl.read`, `pl.write`,
         `pld.tile.remote_load` / `remote_store` and the region form of
         `pld.tensor.put` / `get` check their region against the tensor or
         window.
         """,
         after="""
         Fix: `[0, r * 4]`.

         A region that fits but is not the one the peer stored (offsets or
         shape that do not match the peer's `store`) passes the bounds check:
         see [the next section](#a-read-of-a-region-the-peer-did-not-write).
         """),
    _bug("wrong_region", "A read of a region the peer did not write", '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 16], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Exchange:
            @pl.function(type=pl.FunctionType.InCore)
            def exchange(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         data: pl.InOut[Win], sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(data)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                data = pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)  # columns 0..7
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
                other = pld.tile.remote_load(data, (me + 1) % n, [0, 8], [1, 8])  # BUG: the peer stored at [0, 0]
                return pl.store(other, [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         data: pl.InOut[Win], sig: pl.InOut[Sig]):
                return self.exchange(x, y, data, sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 16], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(data_buf, [1, 16], dtype=pl.FP32),
                                  pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
                return y


        compiled = ir.compile(Exchange, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(1, P * 8 + 1, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), np.roll(x, -1, axis=0)), "mismatch"
        ''', "uninitialized_read", [0, 1], "8.1 silent data corruption", command="check",
         before="""
         The region fits the window, so no bounds check fires: each rank stores
         its 8 values in columns 0..7 of its window and reads columns 8..15 of
         the peer's, which nobody wrote. On the device the data is silently
         wrong; under `ptodist run` the golden check fails with no hint.
         `ptodist check` records which bytes of each window every rank wrote and
         reports a read of bytes nobody wrote in the dispatch, with the writes
         that came nearest — here the peer's store at the other offsets.
         """,
         after="""
         Fix: read what the peer wrote — offsets `[0, 0]`. A write at these
         offsets of another rank's copy, listed as nearest, points at a wrong
         peer instead.
         """),
    _bug("python_error", "Any other error in a rank", '''
        P = 2
        NR = pl.dynamic("NR")
        SCALES = [1.0]  # one entry per rank (but only one rank was planned for)


        @pl.program
        class Scale:
            @pl.function(type=pl.FunctionType.InCore)
            def scale(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                      r: pl.Scalar[pl.INT32]):
                s = SCALES[r]  # BUG: IndexError on rank 1
                return pl.store(pl.mul(pl.load(x, [0, 0], [1, 8]), s), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         r: pl.Scalar[pl.INT32]):
                return self.scale(x, y, r)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], r, device=r)
                return y


        compiled = ir.compile(Scale, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        compiled(np.zeros((P, 1, 8), np.float32))
        ''', "rank_error", [1], None,
         before="""
         A plain Python exception raised in a kernel ends the run with a
         `RankError`: the rank, its device, the task, and the rank's traceback
         cut to the program's own frames. Ranks that fail the same way are
         reported once, as a group.
         """),
    _bug("correct", "A clean run", '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class RingShift:
            @pl.function(type=pl.FunctionType.InCore)
            def shift(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                      data: pl.InOut[Win], sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(data)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                data = pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
                left = pld.tile.remote_load(data, (me - 1 + n) % n, [0, 0], [1, 8])
                return pl.store(left, [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
                         data: pl.InOut[Win], sig: pl.InOut[Sig]):
                return self.shift(x, y, data, sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    data = pld.window(data_buf, [1, 8], dtype=pl.FP32)
                    sig = pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32)
                    self.per_rank(x[r], y[r], data, sig, device=r)
                return y


        compiled = ir.compile(RingShift, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), np.roll(x, 1, axis=0))
        print("OK")
        ''',
         before="""
         The ring shift of step 10 with `(me - 1 + n) % n`: the run succeeds, the
         report says `{"status": "ok", "findings": []}`, and stderr carries only
         the platform notice.
         """),
    _bug("build_flags", "Build-time flags", '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Copy:
            @pl.function(type=pl.FunctionType.InCore)
            def copy(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.copy(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], device=r)
                return y


        compiled = ir.compile(Copy, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.ones((P, 1, 8), np.float32)
        for _ in range(2):
            assert np.array_equal(compiled(x), x)
        print("OK")
        ''', level=2, env={"SIMPLER_HOST_STRACE": "1", "SIMPLER_DFX": "1"},
         before="""
         `SIMPLER_HOST_STRACE` and `SIMPLER_DFX` are compile-time switches (C
         preprocessor macros) of the simpler runtime, fixed when the runtime is
         built; setting them in the shell changes nothing, on the device or
         under ptodist. ptodist says so, once per process, when it sees them. The
         runtime variable `SIMPLER_DEVICE_STRACE_ENABLE=0` is honoured: the
         swimlane records then carry tasks and collectives only, without the
         per-operation slices.

         The program below calls the compiled program twice, with both build
         switches set (`SIMPLER_HOST_STRACE=1 SIMPLER_DFX=1`):
         """,
         after="""
         To get diagnostic outputs, use the `RunConfig` flags of
         [Diagnostic outputs](#diagnostic-outputs-dfx).
         """),
]


# -- the new execution model -----------------------------------------------------------------------------------
# One realistic bug per feature of the execution model (task graphs, deferred waits, comm domains, valid shapes,
# cross-core pipes, all_to_all_v, workers, chip placement, L2 programs), written as upstream's docs teach, each with
# its fixed twin. ``# BUG`` marks the root line: where the fix belongs (the task's pl.submit / deps= line, the
# dispatch, the prepare() option), not where the bug shows. ``python docs/gen_debugging.py --measure`` prints how
# many ptodist locates.

FEATURES: list[Bug] = [
    _bug('tg_at_no_deps', 'task graph: a pl.at region in a manual scope with no deps= on its writer', '''
        @pl.jit
        def two_stage(x: pl.Tensor[[4, 8], pl.FP32], scratch: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
                      out: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
            with pl.manual_scope():
                with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage1") as first:
                    scratch = pl.assemble(scratch, pl.add(x, x), [0, 0])
                with pl.at(level=pl.Level.CORE_GROUP, name_hint="stage2"):  # BUG: no deps=[first]
                    out = pl.assemble(out, pl.add(scratch, scratch), [0, 0])
            return scratch, out


        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        scratch, out = np.zeros_like(x), np.zeros_like(x)
        two_stage(x, scratch, out)
        assert np.array_equal(out, 4 * x), "mismatch"
        print("OK")
        ''', ('race',), feature='task graph', command='check',
         twin=(('name_hint="stage2"):  # BUG: no deps=[first]', 'name_hint="stage2", deps=[first]):'),)),
    _bug('tg_no_deps', 'task graph: a reader in a manual scope with no deps= on its writer', '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class TwoStage:
            @pl.function(type=pl.FunctionType.InCore)
            def scale(self, x: pl.Tensor[[4, 8], pl.FP32], scratch: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
                return pl.store(pl.mul(pl.load(x, [0, 0], [4, 8]), 2.0), [0, 0], scratch)

            @pl.function(type=pl.FunctionType.InCore)
            def shift(self, scratch: pl.Tensor[[4, 8], pl.FP32], out: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
                return pl.store(pl.add(pl.load(scratch, [0, 0], [4, 8]), 1.0), [0, 0], out)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[4, 8], pl.FP32], scratch: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
                         out: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
                with pl.manual_scope():
                    scratch, t_scale = pl.submit(self.scale, x, scratch)
                    out, _ = pl.submit(self.shift, scratch, out)  # BUG: no deps=[t_scale]
                return out

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 4, 8], pl.FP32], scratch: pl.Out[pl.Tensor[[NR, 4, 8], pl.FP32]],
                     out: pl.Out[pl.Tensor[[NR, 4, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], scratch[r], out[r], device=r)
                return out


        compiled = ir.compile(TwoStage, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 32, dtype=np.float32).reshape(P, 4, 8)
        scratch, out = np.zeros_like(x), np.zeros_like(x)
        compiled(x, scratch, out)
        assert np.array_equal(out, 2 * x + 1), "mismatch"
        print("OK")
        ''', ('race',), feature='task graph', command='check',
         twin=(('out, _ = pl.submit(self.shift, scratch, out)  # BUG: no deps=[t_scale]',
           'out, _ = pl.submit(self.shift, scratch, out, deps=[t_scale])'), )),
    _bug('tg_wrong_deps', 'task graph: deps= names the wrong task', '''
        P = 2
        NR = pl.dynamic("NR")
        Mat = pl.Tensor[[4, 8], pl.FP32]


        @pl.program
        class Normalize:
            @pl.function(type=pl.FunctionType.InCore)
            def fill(self, t: pl.Out[Mat], value: pl.Scalar[pl.FP32]):
                return pl.store(pl.full([4, 8], dtype=pl.FP32, value=value), [0, 0], t)

            @pl.function(type=pl.FunctionType.InCore)
            def scale(self, x: Mat, s: pl.Out[Mat]):
                return pl.store(pl.mul(pl.load(x, [0, 0], [4, 8]), 0.5), [0, 0], s)

            @pl.function(type=pl.FunctionType.InCore)
            def combine(self, s: Mat, bias: Mat, out: pl.Out[Mat]):
                return pl.store(pl.add(pl.load(s, [0, 0], [4, 8]), pl.load(bias, [0, 0], [4, 8])), [0, 0], out)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: Mat, s: pl.Out[Mat], bias: pl.Out[Mat], out: pl.Out[Mat]):
                with pl.manual_scope():
                    bias, t_bias = pl.submit(self.fill, bias, 1.0)
                    s, t_scale = pl.submit(self.scale, x, s)
                    out, _ = pl.submit(self.combine, s, bias, out, deps=[t_bias])  # BUG: also reads s: deps=[t_bias, t_scale]
                return out

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 4, 8], pl.FP32], s: pl.Out[pl.Tensor[[NR, 4, 8], pl.FP32]],
                     bias: pl.Out[pl.Tensor[[NR, 4, 8], pl.FP32]], out: pl.Out[pl.Tensor[[NR, 4, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], s[r], bias[r], out[r], device=r)
                return out


        compiled = ir.compile(Normalize, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 32, dtype=np.float32).reshape(P, 4, 8)
        s, bias, out = np.zeros_like(x), np.zeros_like(x), np.zeros_like(x)
        compiled(x, s, bias, out)
        assert np.array_equal(out, 0.5 * x + 1), "mismatch"
        print("OK")
        ''', ('race',), feature='task graph', command='check',
         twin=(('deps=[t_bias])  # BUG: also reads s: deps=[t_bias, t_scale]',
           'deps=[t_bias, t_scale])'), )),
    _bug('tg_last_tid', 'task graph: a consumer waits only on the last producer of a loop', '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Blocks:
            @pl.function(type=pl.FunctionType.InCore)
            def produce(self, x: pl.Tensor[[4, 8], pl.FP32], i: pl.Scalar[pl.INDEX], parts: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
                return pl.store(pl.mul(pl.load(x, [i, 0], [1, 8]), 2.0), [i, 0], parts)

            @pl.function(type=pl.FunctionType.InCore)
            def consume(self, parts: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.col_sum(pl.load(parts, [0, 0], [4, 8])), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[4, 8], pl.FP32], parts: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
                         y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                with pl.manual_scope():
                    for i in pl.range(4):
                        parts, tid = pl.submit(self.produce, x, i, parts)
                    y, _ = pl.submit(self.consume, parts, y, deps=[tid])  # BUG: waits for the last producer only
                return y

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 4, 8], pl.FP32], parts: pl.Out[pl.Tensor[[NR, 4, 8], pl.FP32]],
                     y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], parts[r], y[r], device=r)
                return y


        compiled = ir.compile(Blocks, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 32, dtype=np.float32).reshape(P, 4, 8)
        parts, y = np.zeros_like(x), np.zeros((P, 1, 8), np.float32)
        compiled(x, parts, y)
        assert np.array_equal(y, 2 * x.sum(axis=1, keepdims=True)), "mismatch"
        print("OK")
        ''', ('race',), feature='task graph', command='check',
         twin=(('            for i in pl.range(4):\n                parts, tid = pl.submit(self.produce, x, i, parts)\n            y, _ = pl.submit(self.consume, parts, y, deps=[tid])  # BUG: waits for the last producer only',
           '            tids = pl.array.create(4, pl.TASK_ID)\n            for i in pl.range(4):\n                parts, tid = pl.submit(self.produce, x, i, parts)\n                tids[i] = tid\n            y, _ = pl.submit(self.consume, parts, y, deps=[tids])'), )),
    _bug('tg_spmd_row', 'task graph: the blocks of a pl.spmd_submit all update one row', '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class RowSums:
            @pl.function(type=pl.FunctionType.InCore)
            def partial(self, x: pl.Tensor[[16, 8], pl.FP32], total: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
                b = pl.get_block_idx()
                part = pl.col_sum(pl.load(x, [b * 4, 0], [4, 8]))
                acc = pl.load(total, [0, 0], [1, 8])
                return pl.store(pl.add(acc, part), [0, 0], total)  # BUG: every block read-modify-writes row 0

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[16, 8], pl.FP32], total: pl.InOut[pl.Tensor[[1, 8], pl.FP32]]):
                total, _ = pl.spmd_submit(self.partial, x, total, core_num=4)
                return total

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 16, 8], pl.FP32], total: pl.InOut[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], total[r], device=r)
                return total


        compiled = ir.compile(RowSums, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 128, dtype=np.float32).reshape(P, 16, 8)
        total = np.zeros((P, 1, 8), np.float32)
        compiled(x, total)
        assert np.array_equal(total, x.sum(axis=1, keepdims=True)), "mismatch"
        print("OK")
        ''', ('race',), feature='task graph', command='check',
         twin=(('        acc = pl.load(total, [0, 0], [1, 8])\n        return pl.store(pl.add(acc, part), [0, 0], total)  # BUG: every block read-modify-writes row 0',
           '        return pl.store(part, [0, 0], total, atomic=pl.AtomicType.Add)'), )),
    _bug('tg_spmd_block', 'task graph: the blocks of a pl.spmd region share one scratch row', '''
        @pl.jit
        def two_pass(x: pl.Tensor[[4, 8], pl.FP32], scratch: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
                     out: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
            with pl.spmd(4):
                b = pl.get_block_idx()
                pl.store(pl.mul(pl.load(x, [b, 0], [1, 8]), 2.0), [0, 0], scratch)  # BUG: every block stages in row 0
                pl.store(pl.add(pl.load(scratch, [0, 0], [1, 8]), 1.0), [b, 0], out)
            return out


        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        scratch, out = np.zeros_like(x), np.zeros_like(x)
        two_pass(x, scratch, out)
        assert np.array_equal(out, 2 * x + 1), "mismatch"
        print("OK")
        ''', ('race',), feature='task graph', command='check',
         twin=(('pl.store(pl.mul(pl.load(x, [b, 0], [1, 8]), 2.0), [0, 0], scratch)  # BUG: every block stages in row 0',
               'pl.store(pl.mul(pl.load(x, [b, 0], [1, 8]), 2.0), [b, 0], scratch)'),
              ('pl.load(scratch, [0, 0], [1, 8])', 'pl.load(scratch, [b, 0], [1, 8])'))),
    _bug('tg_no_dep', 'task graph: no_dep_args= on regions that are not disjoint', '''
        @pl.jit
        def halves(x: pl.Tensor[[4, 8], pl.FP32], out: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
            with pl.at(level=pl.Level.CORE_GROUP, no_dep_args=[out]):  # the two halves are disjoint: no edge needed
                pl.store(pl.mul(pl.load(x, [0, 0], [2, 8]), 2.0), [0, 0], out)
            with pl.at(level=pl.Level.CORE_GROUP, no_dep_args=[out]):  # BUG: this half starts at row 1: it overlaps
                pl.store(pl.mul(pl.load(x, [1, 0], [3, 8]), 2.0), [1, 0], out)
            return out


        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        out = np.zeros_like(x)
        halves(x, out)
        assert np.array_equal(out, 2 * x), "mismatch"
        print("OK")
        ''', ('race',), feature='task graph', command='check',
         issues=dict.fromkeys(("found", "kind", "location", "root_first"),
                             "both regions also read x, and ptodist's overlap map orders any two tasks that share "
                             "a buffer (upstream's orders a reader only after writers): the regions never run "
                             "concurrently here"),
         twin=(('with pl.at(level=pl.Level.CORE_GROUP, no_dep_args=[out]):  # BUG: this half starts at row 1: it overlaps',
               'with pl.at(level=pl.Level.CORE_GROUP, no_dep_args=[out]):'), ('pl.store(pl.mul(pl.load(x, [1, 0], [3, 8]), 2.0), [1, 0], out)',
               'pl.store(pl.mul(pl.load(x, [2, 0], [2, 8]), 2.0), [2, 0], out)'))),
    _bug('defer_overlap', "deferred wait: the send task shares the waiter's signal, an implicit edge", '''
        P = 2
        NR = pl.dynamic("NR")
        Row = pl.Tensor[[1, 8], pl.FP32]
        Win = pld.DistributedTensor[[NR, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Ring:
            @pl.function(type=pl.FunctionType.InCore)
            def arrive(self, sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(sig)
                left = (pld.rank(ctx) + pld.nranks(ctx) - 1) % pld.nranks(ctx)
                pld.system.defer_wait(sig, [left, 0], 1, cmp=pld.WaitCmp.Ge)  # completes once the left rank sent

            @pl.function(type=pl.FunctionType.InCore)
            def send(self, x: Row, data: pl.InOut[Win], sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(sig)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                pld.tile.remote_store(pl.load(x, [0, 0], [1, 8]), data, (me + 1) % n, [me, 0])
                pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.InCore)
            def take(self, data: pl.InOut[Win], y: pl.Out[Row]):
                ctx = pld.get_comm_ctx(data)
                left = (pld.rank(ctx) + pld.nranks(ctx) - 1) % pld.nranks(ctx)
                return pl.store(pl.load(data, [left, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig]):
                _, arrived = pl.submit(self.arrive, sig)
                pl.submit(self.send, x, data, sig)  # BUG: shares sig with the waiting task, so it runs after it
                pl.submit(self.take, data, y, deps=[arrived])
                return y

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([pld.world_size(), 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(data_buf, [pld.world_size(), 8], dtype=pl.FP32),
                                  pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
                return y


        compiled = ir.compile(Ring, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), np.roll(x, 1, axis=0)), "mismatch"
        print("OK")
        ''', ('hang*',), feature='deferred wait', command='run',
         twin=(('pl.submit(self.send, x, data, sig)  # BUG: shares sig with the waiting task, so it runs after it',
           'pl.submit(self.send, x, data, pl.no_dep(sig))'), )),
    _bug('defer_no_deps', 'deferred wait: the consumer depends on the send, not on the arrival', '''
        P = 2
        NR = pl.dynamic("NR")
        Row = pl.Tensor[[1, 8], pl.FP32]
        Win = pld.DistributedTensor[[NR, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Ring:
            @pl.function(type=pl.FunctionType.InCore)
            def arrive(self, sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(sig)
                left = (pld.rank(ctx) + pld.nranks(ctx) - 1) % pld.nranks(ctx)
                pld.system.defer_wait(sig, [left, 0], 1, cmp=pld.WaitCmp.Ge)  # completes once the left rank sent

            @pl.function(type=pl.FunctionType.InCore)
            def send(self, x: Row, data: pl.InOut[Win], sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(sig)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                pld.tile.remote_store(pl.load(x, [0, 0], [1, 8]), data, (me + 1) % n, [me, 0])
                pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.InCore)
            def take(self, data: pl.InOut[Win], y: pl.Out[Row]):
                ctx = pld.get_comm_ctx(data)
                left = (pld.rank(ctx) + pld.nranks(ctx) - 1) % pld.nranks(ctx)
                return pl.store(pl.load(data, [left, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig]):
                with pl.manual_scope():
                    _, arrived = pl.submit(self.arrive, sig)
                    _, sent = pl.submit(self.send, x, data, sig)
                    pl.submit(self.take, data, y, deps=[sent])  # BUG: the data comes from the left rank: deps=[arrived]
                return y

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([pld.world_size(), 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(data_buf, [pld.world_size(), 8], dtype=pl.FP32),
                                  pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
                return y


        compiled = ir.compile(Ring, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), np.roll(x, 1, axis=0)), "mismatch"
        print("OK")
        ''', ('race',), feature='deferred wait', command='check',
         twin=(('deps=[sent])  # BUG: the data comes from the left rank: deps=[arrived]',
           'deps=[arrived])'), )),
    _bug('domain_peer', 'comm domain: a world rank given as a peer', '''
        P = 4
        NR = pl.dynamic("NR")
        Row = pl.Tensor[[1, 8], pl.FP32]
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[1], pl.INT32]


        @pl.program
        class Pairs:
            @pl.function(type=pl.FunctionType.InCore)
            def swap(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig], partner: pl.Scalar[pl.INT32]):
                pld.tile.remote_store(pl.load(x, [0, 0], [1, 8]), data, partner, [0, 0])
                pld.system.notify(sig, partner, [0], 1, op=pld.NotifyOp.AtomicAdd)
                pld.system.wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)
                return pl.store(pl.load(data, [0, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig], partner: pl.Scalar[pl.INT32]):
                return self.swap(x, y, data, sig, partner)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for pair in pl.range(2):  # ranks {0, 1} and {2, 3} swap rows, each pair in its own comm domain
                    data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                    sig_buf = pld.alloc_window_buffer([1], dtype=pl.INT32)
                    for r in pl.range(2 * pair, 2 * pair + 2):
                        data, sig = pld.window(data_buf, [1, 8], dtype=pl.FP32), pld.window(sig_buf, [1], dtype=pl.INT32)
                        self.per_rank(x[r], y[r], data, sig, r ^ 1, device=r)  # BUG: r ^ 1 is a world rank; a peer is a rank of the domain
                return y


        compiled = ir.compile(Pairs, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), x[[1, 0, 3, 2]]), "mismatch"
        print("OK")
        ''', ('peer_out_of_range',), feature='comm domain', command='run',
         issues=dict.fromkeys(("location", "root_first"),
                             'the report names the remote_store, not the dispatch that passes a world rank as the peer'),
         twin=(('r ^ 1, device=r)  # BUG: r ^ 1 is a world rank; a peer is a rank of the domain',
           '(r ^ 1) % 2, device=r)'), )),
    _bug('domain_slot', "comm domain: a slot index taken from another window's domain", '''
        P = 4
        NR = pl.dynamic("NR")
        Row = pl.Tensor[[1, 8], pl.FP32]
        Parts = pld.DistributedTensor[[P, 8], pl.FP32]
        Sig = pld.DistributedTensor[[P, 1], pl.INT32]
        Local = pld.DistributedTensor[[1, 8], pl.FP32]


        @pl.program
        class Gather:
            @pl.function(type=pl.FunctionType.InCore)
            def contribute(self, x: Row, parts: pl.InOut[Parts], sig: pl.InOut[Sig], local: pl.InOut[Local]):
                local = pl.store(pl.mul(pl.load(x, [0, 0], [1, 8]), 2.0), [0, 0], local)  # scratch of the workers' domain
                me = pld.rank(pld.get_comm_ctx(local))  # BUG: a rank of the workers' domain {1, 2, 3}, not of parts' world
                pld.tile.remote_store(pl.load(local, [0, 0], [1, 8]), parts, 0, [me, 0])
                pld.system.notify(sig, 0, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.InCore)
            def total(self, parts: pl.InOut[Parts], sig: pl.InOut[Sig], y: pl.Out[Row]):
                acc = pl.full([1, 8], dtype=pl.FP32, value=0.0)
                for src in pl.range(1, P):
                    pld.system.wait(sig, [src, 0], 1, cmp=pld.WaitCmp.Ge)
                    acc = pl.add(acc, pl.load(parts, [src, 0], [1, 8]))
                return pl.store(acc, [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def worker(self, x: Row, parts: pl.InOut[Parts], sig: pl.InOut[Sig], local: pl.InOut[Local]):
                self.contribute(x, parts, sig, local)

            @pl.function(type=pl.FunctionType.Orchestration)
            def root(self, parts: pl.InOut[Parts], sig: pl.InOut[Sig], y: pl.Out[Row]):
                return self.total(parts, sig, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                parts_buf = pld.alloc_window_buffer([P, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([P, 1], dtype=pl.INT32)
                local_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                parts, sig = pld.window(parts_buf, [P, 8], dtype=pl.FP32), pld.window(sig_buf, [P, 1], dtype=pl.INT32)
                for r in pl.range(1, P):  # ranks 1..3 contribute; their scratch windows form the domain {1, 2, 3}
                    self.worker(x[r], parts, sig, pld.window(local_buf, [1, 8], dtype=pl.FP32), device=r)
                self.root(parts, sig, y, device=0)
                return y


        compiled = ir.compile(Gather, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        assert np.array_equal(compiled(x), 2 * x[1:].sum(axis=0)), "mismatch"
        print("OK")
        ''', ('hang*',), feature='comm domain', command='run',
         issues=dict.fromkeys(("location", "root_first"),
                             "the hang names the notify that uses the index, not the line that takes it from another domain's rank"),
         twin=(("me = pld.rank(pld.get_comm_ctx(local))  # BUG: a rank of the workers' domain {1, 2, 3}, not of parts' world",
               'me = pld.rank(pld.get_comm_ctx(parts))'),)),
    _bug('pad_reduce', 'valid_shape: a reduction over padding without pl.fillpad', '''
        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class RowMax:
            @pl.function(type=pl.FunctionType.InCore)
            def row_max(self, x: pl.Tensor[[4, 5], pl.FP32], y: pl.Out[pl.Tensor[[4, 1], pl.FP32]]):
                t = pl.load(x, [0, 0], [4, 8], valid_shape=[4, 5])  # an 8-wide tile, 5 valid columns
                return pl.store(pl.row_max(t), [0, 0], y)  # BUG: reduces the padding too: pl.fillpad(t, pl.PadValue.min) first

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[4, 5], pl.FP32], y: pl.Out[pl.Tensor[[4, 1], pl.FP32]]):
                return self.row_max(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 4, 5], pl.FP32], y: pl.Out[pl.Tensor[[NR, 4, 1], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], device=r)
                return y


        compiled = ir.compile(RowMax, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = -np.arange(1, P * 20 + 1, dtype=np.float32).reshape(P, 4, 5)
        assert np.array_equal(compiled(x), x.max(axis=2, keepdims=True)), "mismatch"
        print("OK")
        ''', ('uninitialized_read',), feature='valid_shape', command='check',
         twin=(('        return pl.store(pl.row_max(t), [0, 0], y)  # BUG: reduces the padding too: pl.fillpad(t, pl.PadValue.min) first',
           '        return pl.store(pl.row_max(pl.fillpad(t, pl.PadValue.min)), [0, 0], y)'), )),
    _bug('pad_peer', 'valid_shape: a peer reads past the valid region', '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Tail:
            @pl.function(type=pl.FunctionType.InCore)
            def exchange(self, x: pl.Tensor[[1, 5], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], data: pl.InOut[Win],
                         sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(data)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                t = pl.load(x, [0, 0], [1, 8], valid_shape=[1, 5])  # a tail tile: 5 valid columns of 8
                data = pl.store(t, [0, 0], data)  # writes the 5 valid columns
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Ge)
                got = pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, 8])  # BUG: reads all 8 columns; valid_shape=[1, 5]
                return pl.store(got, [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 5], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], data: pl.InOut[Win],
                         sig: pl.InOut[Sig]):
                return self.exchange(x, y, data, sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 5], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(data_buf, [1, 8], dtype=pl.FP32),
                                  pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
                return y


        compiled = ir.compile(Tail, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(1, P * 5 + 1, dtype=np.float32).reshape(P, 1, 5)
        y = compiled(x)
        assert np.array_equal(y[:, :, :5], np.roll(x, -1, axis=0)), "mismatch"
        print("OK")
        ''', ('uninitialized_read',), feature='valid_shape', command='check',
         twin=(('[0, 0], [1, 8])  # BUG: reads all 8 columns; valid_shape=[1, 5]',
           '[0, 0], [1, 8], valid_shape=[1, 5])'), )),
    _bug('pipe_no_tfree', 'pipes: a tpop with no tfree on a 2-slot pipe', '''
        P = 2
        NR = pl.dynamic("NR")
        M, N = 8, 8
        Mat = pl.Tensor[[M, N], pl.FP32]


        @pl.program
        class Mixed:
            @pl.function(type=pl.FunctionType.AIC)
            def producer(self, x: Mat, out: pl.Out[Mat]):
                pl.aic_initialize_pipe(dir_mask=1, slot_size=M * N * 4, slot_num=2)
                for k in pl.range(4):
                    pl.tile.tpush_to_aiv(pl.tile.add(pl.load(x, [0, 0], [M, N]), float(k)), split=1)

            @pl.function(type=pl.FunctionType.AIV)
            def consumer(self, x: Mat, out: pl.Out[Mat]):
                pl.aiv_initialize_pipe(dir_mask=1, slot_size=M * N * 4, slot_num=2)
                acc = pl.full([M // 2, N], dtype=pl.FP32, value=0.0)
                for k in pl.range(4):
                    t = pl.tile.tpop_from_aic(shape=[M // 2, N], dtype=pl.FP32, split=1)  # BUG: never pl.system.tfree_to_aic(t)
                    acc = pl.tile.add(acc, t)
                return pl.store(acc, [int(pl.get_subblock_idx()) * (M // 2), 0], out)

            @pl.function(type=pl.FunctionType.Group)
            def fused(self, x: Mat, out: pl.Out[Mat]):
                self.producer(x, out)
                return self.consumer(x, out)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: Mat, out: pl.Out[Mat]):
                return self.fused(x, out)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, M, N], pl.FP32], out: pl.Out[pl.Tensor[[NR, M, N], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], out[r], device=r)
                return out


        compiled = ir.compile(Mixed, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * M * N, dtype=np.float32).reshape(P, M, N)
        assert np.array_equal(compiled(x), 4 * x + 6), "mismatch"
        print("OK")
        ''', ('hang*',), feature='cross-core pipe', command='run',
         twin=(('            t = pl.tile.tpop_from_aic(shape=[M // 2, N], dtype=pl.FP32, split=1)  # BUG: never pl.system.tfree_to_aic(t)\n            acc = pl.tile.add(acc, t)',
           '            t = pl.tile.tpop_from_aic(shape=[M // 2, N], dtype=pl.FP32, split=1)\n            acc = pl.tile.add(acc, t)\n            pl.system.tfree_to_aic(t)'), )),
    _bug('pipe_push_k', 'pipes: a tpush inside the K loop', '''
        P = 2
        NR = pl.dynamic("NR")
        M, K, N = 8, 32, 8


        @pl.program
        class MatmulRelu:
            @pl.function(type=pl.FunctionType.AIC)
            def mm(self, a: pl.Tensor[[M, K], pl.FP32], b: pl.Tensor[[K, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
                pl.aic_initialize_pipe(dir_mask=1, slot_size=M * N * 4, slot_num=2)
                acc = pl.full([M, N], dtype=pl.FP32, value=0.0)
                for k in pl.range(0, K, 8):
                    acc = pl.add(acc, pl.matmul(pl.load(a, [0, k], [M, 8]), pl.load(b, [k, 0], [8, N])))
                    pl.tile.tpush_to_aiv(acc, split=1)  # BUG: inside the K loop: push once, after it

            @pl.function(type=pl.FunctionType.AIV)
            def relu(self, a: pl.Tensor[[M, K], pl.FP32], b: pl.Tensor[[K, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
                pl.aiv_initialize_pipe(dir_mask=1, slot_size=M * N * 4, slot_num=2)
                t = pl.tile.tpop_from_aic(shape=[M // 2, N], dtype=pl.FP32, split=1)
                r = pl.maximum(t, pl.full([M // 2, N], dtype=pl.FP32, value=0.0))
                pl.system.tfree_to_aic(t)
                return pl.store(r, [int(pl.get_subblock_idx()) * (M // 2), 0], out)

            @pl.function(type=pl.FunctionType.Group)
            def fused(self, a: pl.Tensor[[M, K], pl.FP32], b: pl.Tensor[[K, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
                self.mm(a, b, out)
                return self.relu(a, b, out)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, a: pl.Tensor[[M, K], pl.FP32], b: pl.Tensor[[K, N], pl.FP32], out: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
                return self.fused(a, b, out)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, a: pl.Tensor[[NR, M, K], pl.FP32], b: pl.Tensor[[NR, K, N], pl.FP32],
                     out: pl.Out[pl.Tensor[[NR, M, N], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(a[r], b[r], out[r], device=r)
                return out


        compiled = ir.compile(MatmulRelu, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        rng = np.random.default_rng(0)
        a = rng.integers(-3, 4, (P, M, K)).astype(np.float32)
        b = rng.integers(-3, 4, (P, K, N)).astype(np.float32)
        assert np.array_equal(compiled(a, b), np.maximum(a @ b, 0)), "mismatch"
        print("OK")
        ''', ('hang*',), feature='cross-core pipe', command='run',
         twin=(('            pl.tile.tpush_to_aiv(acc, split=1)  # BUG: inside the K loop: push once, after it',
           '        pl.tile.tpush_to_aiv(acc, split=1)'), )),
    _bug('a2av', 'all_to_all_v: blocks read at the running count instead of their slots', '''
        P = 2
        NR = pl.dynamic("NR")
        B = 4  # rows a rank may send each peer: the target holds P blocks of B rows
        Win = pld.DistributedTensor[[P * B, 8], pl.FP32]
        Counts = pld.DistributedTensor[[P, 1], pl.INT32]


        @pl.program
        class Dispatch:
            @pl.function(type=pl.FunctionType.InCore)
            def stage(self, x: pl.Tensor[[P * B, 8], pl.FP32], send: pl.InOut[Win]):
                pl.store(pl.load(x, [0, 0], [P * B, 8]), [0, 0], send)

            @pl.function(type=pl.FunctionType.InCore)
            def compact(self, recv: pl.InOut[Win], y: pl.Out[pl.Tensor[[2 * 2, 8], pl.FP32]]):
                # every rank sends 2 rows to every peer: P * 2 rows arrive
                for src in pl.range(P):
                    rows = pl.load(recv, [src * 2, 0], [2, 8])  # BUG: block src starts at row src * B, not at the running count
                    pl.store(rows, [src * 2, 0], y)
                return y

            @pl.function(type=pl.FunctionType.Orchestration)
            def pre(self, x: pl.Tensor[[P * B, 8], pl.FP32], send: pl.InOut[Win]):
                self.stage(x, send)

            @pl.function(type=pl.FunctionType.Orchestration)
            def post(self, recv: pl.InOut[Win], y: pl.Out[pl.Tensor[[2 * 2, 8], pl.FP32]]):
                return self.compact(recv, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, P * B, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 2 * 2, 8], pl.FP32]]):
                send_buf = pld.alloc_window_buffer([P * B, 8], dtype=pl.FP32)
                recv_buf = pld.alloc_window_buffer([P * B, 8], dtype=pl.FP32)
                send = pld.window(send_buf, [P * B, 8], dtype=pl.FP32)
                recv = pld.window(recv_buf, [P * B, 8], dtype=pl.FP32)
                for r in pl.range(pld.world_size()):
                    self.pre(x[r], send, device=r)
                counts = [[2] * P for _ in range(P)]
                recv = pld.all_to_all_v(send, recv, counts, counts, nranks=P)
                for r in pl.range(pld.world_size()):
                    self.post(recv, y[r], device=r)
                return y


        compiled = ir.compile(Dispatch, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * P * B * 8, dtype=np.float32).reshape(P, P * B, 8)
        y = compiled(x)
        want = np.stack([np.concatenate([x[src, r * B:r * B + 2] for src in range(P)]) for r in range(P)])
        assert np.array_equal(y, want), "mismatch"
        print("OK")
        ''', ('uninitialized_read',), feature='all_to_all_v', command='check',
         issues=dict.fromkeys(("kind", "location", "root_first"),
                             "an unwritten read of the rank's own window copy is not reported (windows start zeroed)"),
         twin=(('rows = pl.load(recv, [src * 2, 0], [2, 8])  # BUG: block src starts at row src * B, not at the running count',
           'rows = pl.load(recv, [src * B, 0], [2, 8])'), )),
    _bug('worker_early', 'worker: an output read before result()', '''
        import torch

        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Scale:
            @pl.function(type=pl.FunctionType.InCore)
            def scale(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.mul(pl.load(x, [0, 0], [1, 8]), 3.0), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.scale(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], device=r)
                return y


        compiled = ir.compile(Scale, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = torch.arange(P * 8, dtype=torch.float32).reshape(P, 1, 8).share_memory_()
        y = torch.zeros(P, 1, 8).share_memory_()
        with compiled.prepare() as rt:
            handle = rt.submit(compiled, x, y)
            total = float(y.sum())  # BUG: reads y before handle.result()
            handle.result()
        assert total == 3 * float(x.sum()), f"mismatch: {total}"
        print("OK")
        ''', ('race',), feature='DistributedWorker', command='check',
         twin=(('    total = float(y.sum())  # BUG: reads y before handle.result()\n    handle.result()',
           '    handle.result()\n    total = float(y.sum())'), )),
    _bug('worker_early_np', 'worker: an output read before result(), numpy host arrays', '''
        import ptodist

        P = 2
        NR = pl.dynamic("NR")


        @pl.program
        class Scale:
            @pl.function(type=pl.FunctionType.InCore)
            def scale(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.mul(pl.load(x, [0, 0], [1, 8]), 3.0), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.scale(x, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], device=r)
                return y


        compiled = ir.compile(Scale, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = ptodist.shared_array((P, 1, 8), np.float32)
        x[...] = np.arange(P * 8).reshape(P, 1, 8)
        y = ptodist.shared_array((P, 1, 8), np.float32)
        with compiled.prepare() as rt:
            handle = rt.submit(compiled, x, y)
            total = float(y.sum())  # BUG: reads y before handle.result()
            handle.result()
        assert total == 3 * float(x.sum()), f"mismatch: {total}"
        print("OK")
        ''', ('race',), feature='DistributedWorker', command='check',
         twin=(('    total = float(y.sum())  # BUG: reads y before handle.result()\n    handle.result()',
               '    handle.result()\n    total = float(y.sum())'),)),
    _bug('worker_persistent', 'worker: persistent windows whose counters carry over', '''
        import torch

        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[NR, 1], pl.INT32]


        @pl.program
        class Shift:
            @pl.function(type=pl.FunctionType.InCore)
            def shift(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], data: pl.InOut[Win],
                      sig: pl.InOut[Sig]):
                ctx = pld.get_comm_ctx(data)
                me, n = pld.rank(ctx), pld.nranks(ctx)
                data = pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)
                for peer in pl.range(n):
                    pld.system.notify(sig, peer, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
                for peer in pl.range(n):
                    pld.system.wait(sig, [peer, 0], 1, cmp=pld.WaitCmp.Eq)  # one arrival per dispatch
                return pl.store(pld.tile.remote_load(data, (me + 1) % n, [0, 0], [1, 8]), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def per_rank(self, x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]], data: pl.InOut[Win],
                         sig: pl.InOut[Sig]):
                return self.shift(x, y, data, sig)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([pld.world_size(), 1], dtype=pl.INT32)
                for r in pl.range(pld.world_size()):
                    self.per_rank(x[r], y[r], pld.window(data_buf, [1, 8], dtype=pl.FP32),
                                  pld.window(sig_buf, [pld.world_size(), 1], dtype=pl.INT32), device=r)
                return y


        compiled = ir.compile(Shift, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = torch.arange(P * 8, dtype=torch.float32).reshape(P, 1, 8).share_memory_()
        y = torch.zeros(P, 1, 8).share_memory_()
        with compiled.prepare(persistent=True, reset_persistent_windows=False) as rt:  # BUG: the counters carry over
            for step in range(2):
                rt(x, y)
                assert torch.equal(y, torch.roll(x, -1, 0)), "mismatch"
                x += 1
        print("OK")
        ''', ('hang*',), feature='DistributedWorker', command='run',
         twin=(('compiled.prepare(persistent=True, reset_persistent_windows=False) as rt:  # BUG: the counters carry over',
           'compiled.prepare(persistent=True) as rt:'), )),
    _bug('chip_rr', 'chip calls: a call without device= placed round-robin', '''
        P = 2
        NR = pl.dynamic("NR")
        Win = pld.DistributedTensor[[1, 8], pl.FP32]


        @pl.program
        class Stage:
            @pl.function(type=pl.FunctionType.InCore)
            def fill(self, total: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.full([1, 8], dtype=pl.FP32, value=0.0), [0, 0], total)

            @pl.function(type=pl.FunctionType.InCore)
            def put_local(self, x: pl.Tensor[[1, 8], pl.FP32], data: pl.InOut[Win]):
                pl.store(pl.load(x, [0, 0], [1, 8]), [0, 0], data)

            @pl.function(type=pl.FunctionType.InCore)
            def get_local(self, data: pl.InOut[Win], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return pl.store(pl.mul(pl.load(data, [0, 0], [1, 8]), 2.0), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def clear(self, total: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.fill(total)

            @pl.function(type=pl.FunctionType.Orchestration)
            def stage(self, x: pl.Tensor[[1, 8], pl.FP32], data: pl.InOut[Win]):
                self.put_local(x, data)

            @pl.function(type=pl.FunctionType.Orchestration)
            def unstage(self, data: pl.InOut[Win], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                return self.get_local(data, y)

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]],
                     total: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                self.clear(total)  # no device=: the first round-robin call, on chip 0
                for r in pl.range(pld.world_size()):
                    self.stage(x[r], pld.window(data_buf, [1, 8], dtype=pl.FP32), device=r)
                for r in pl.range(pld.world_size()):
                    self.unstage(pld.window(data_buf, [1, 8], dtype=pl.FP32), y[r])  # BUG: no device=r: round-robin from chip 1
                return y


        compiled = ir.compile(Stage, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        y, total = np.zeros_like(x), np.zeros((1, 8), np.float32)
        compiled(x, y, total)
        assert np.array_equal(y, 2 * x), "mismatch"
        print("OK")
        ''', ('*',), feature='chip placement', command='run',
         twin=(('y[r])  # BUG: no device=r: round-robin from chip 1',
           'y[r], device=r)'), )),
    _bug('l2_multi', 'L2 program: several orchestrations called without choosing one', '''
        Mat = pl.Tensor[[4, 8], pl.FP32]


        @pl.program
        class Model:
            @pl.function(type=pl.FunctionType.InCore)
            def scale(self, x: Mat, y: pl.Out[Mat], s: pl.Scalar[pl.FP32]):
                return pl.store(pl.mul(pl.load(x, [0, 0], [4, 8]), s), [0, 0], y)

            @pl.function(type=pl.FunctionType.Orchestration)
            def prefill(self, x: Mat, y: pl.Out[Mat]):
                return self.scale(x, y, 2.0)

            @pl.function(type=pl.FunctionType.Orchestration)
            def decode(self, x: Mat, y: pl.Out[Mat]):
                return self.scale(x, y, 3.0)


        compiled = ir.compile(Model, platform="a2a3sim")
        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        y = np.zeros_like(x)
        compiled(x, y)  # BUG: two orchestrations: call compiled["prefill"](x, y) or compiled["decode"](x, y)
        assert np.array_equal(y, 2 * x), "mismatch"
        print("OK")
        ''', ('invalid_argument',), feature='L2 program', command='run',
         twin=(('compiled(x, y)  # BUG: two orchestrations: call compiled["prefill"](x, y) or compiled["decode"](x, y)',
           'compiled["prefill"](x, y)'), )),
    _bug('defer_any_order', 'deferred wait: an older wait that holds only after a younger one', '''
        P = 2
        NR = pl.dynamic("NR")
        Row = pl.Tensor[[1, 8], pl.FP32]
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[2], pl.INT32]  # [0]: data sent, [1]: hello / request


        @pl.program
        class Request:
            @pl.function(type=pl.FunctionType.InCore)
            def expect(self, sig: pl.InOut[Sig], cell: pl.Scalar[pl.INDEX]):
                pld.system.defer_wait(sig, [cell], 1, cmp=pld.WaitCmp.Ge)

            @pl.function(type=pl.FunctionType.InCore)
            def request(self, sig: pl.InOut[Sig]):
                pld.system.notify(sig, 1, [1], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.InCore)
            def consume(self, data: pl.InOut[Win], y: pl.Out[Row]):
                return pl.store(pl.mul(pl.load(data, [0, 0], [1, 8]), 2.0), [0, 0], y)

            @pl.function(type=pl.FunctionType.InCore)
            def serve(self, x: Row, data: pl.InOut[Win], sig: pl.InOut[Sig]):
                pld.system.notify(sig, 0, [1], 1, op=pld.NotifyOp.AtomicAdd)  # hello
                pld.system.wait(sig, [1], 1, cmp=pld.WaitCmp.Ge)  # the request
                pld.tile.remote_store(pl.load(x, [0, 0], [1, 8]), data, 0, [0, 0])
                pld.system.notify(sig, 0, [0], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.Orchestration)
            def client(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig]):
                with pl.manual_scope():
                    _, data_in = pl.submit(self.expect, sig, 0)   # older: needs the request the younger one leads to
                    _, hello = pl.submit(self.expect, sig, 1)     # younger
                    pl.submit(self.request, sig, deps=[hello])
                    pl.submit(self.consume, data, y, deps=[data_in])
                return y

            @pl.function(type=pl.FunctionType.Orchestration)
            def server(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig]):
                self.serve(x, data, sig)
                return y

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([2], dtype=pl.INT32)
                data, sig = pld.window(data_buf, [1, 8], dtype=pl.FP32), pld.window(sig_buf, [2], dtype=pl.INT32)
                self.client(x[0], y[0], data, sig, device=0)
                self.server(x[1], y[1], data, sig, device=1)
                return y


        compiled = ir.compile(Request, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        y = compiled(x)
        assert np.array_equal(y[0], 2 * x[1]), "mismatch"
        print("OK")
        ''', feature='deferred wait', command='check'),
    _bug('defer_then_wait', 'deferred wait: a blocking wait that needs a pending deferred wait to complete first', '''
        P = 2
        NR = pl.dynamic("NR")
        Row = pl.Tensor[[1, 8], pl.FP32]
        Win = pld.DistributedTensor[[1, 8], pl.FP32]
        Sig = pld.DistributedTensor[[2], pl.INT32]  # [0]: hello, [1]: request
        Done = pld.DistributedTensor[[1], pl.INT32]  # the data was sent


        @pl.program
        class Handshake:
            @pl.function(type=pl.FunctionType.InCore)
            def hello_seen(self, sig: pl.InOut[Sig]):
                pld.system.defer_wait(sig, [0], 1, cmp=pld.WaitCmp.Ge)

            @pl.function(type=pl.FunctionType.InCore)
            def request(self, sig: pl.InOut[Sig]):
                pld.system.notify(sig, 1, [1], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.InCore)
            def take(self, data: pl.InOut[Win], done: pl.InOut[Done], y: pl.Out[Row]):
                pld.system.wait(done, [0], 1, cmp=pld.WaitCmp.Ge)  # needs the request, which waits for the hello
                return pl.store(pl.mul(pl.load(data, [0, 0], [1, 8]), 2.0), [0, 0], y)

            @pl.function(type=pl.FunctionType.InCore)
            def serve(self, x: Row, data: pl.InOut[Win], sig: pl.InOut[Sig], done: pl.InOut[Done]):
                pld.system.notify(sig, 0, [0], 1, op=pld.NotifyOp.AtomicAdd)  # hello
                pld.system.wait(sig, [1], 1, cmp=pld.WaitCmp.Ge)  # the request
                pld.tile.remote_store(pl.load(x, [0, 0], [1, 8]), data, 0, [0, 0])
                pld.system.notify(done, 0, [0], 1, op=pld.NotifyOp.AtomicAdd)

            @pl.function(type=pl.FunctionType.Orchestration)
            def client(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig], done: pl.InOut[Done]):
                with pl.manual_scope():
                    _, seen = pl.submit(self.hello_seen, sig)
                    pl.submit(self.request, sig, deps=[seen])
                self.take(data, done, y)
                return y

            @pl.function(type=pl.FunctionType.Orchestration)
            def server(self, x: Row, y: pl.Out[Row], data: pl.InOut[Win], sig: pl.InOut[Sig], done: pl.InOut[Done]):
                self.serve(x, data, sig, done)
                return y

            @pl.function(level=pl.Level.HOST, role=pl.Role.Orchestrator)
            def host(self, x: pl.Tensor[[NR, 1, 8], pl.FP32], y: pl.Out[pl.Tensor[[NR, 1, 8], pl.FP32]]):
                data_buf = pld.alloc_window_buffer([1, 8], dtype=pl.FP32)
                sig_buf = pld.alloc_window_buffer([2], dtype=pl.INT32)
                done_buf = pld.alloc_window_buffer([1], dtype=pl.INT32)
                data, sig = pld.window(data_buf, [1, 8], dtype=pl.FP32), pld.window(sig_buf, [2], dtype=pl.INT32)
                done = pld.window(done_buf, [1], dtype=pl.INT32)
                self.client(x[0], y[0], data, sig, done, device=0)
                self.server(x[1], y[1], data, sig, done, device=1)
                return y


        compiled = ir.compile(Handshake, platform="a2a3sim", distributed_config=DistributedConfig(device_ids=list(range(P))))
        x = np.arange(P * 8, dtype=np.float32).reshape(P, 1, 8)
        y = compiled(x)
        assert np.array_equal(y[0], 2 * x[1]), "mismatch"
        print("OK")
        ''', feature='deferred wait', command='check'),
]

BY_NAME = {bug.name: bug for bug in ZOO + FEATURES}


# -- running ----------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One zoo program's run: exit status, stderr (raw and normalised), the --report-json document."""

    bug: Bug
    script: Path
    returncode: int
    stdout: str
    stderr: str
    output: str
    report: dict


def run(bug: Bug, workdir: Path, timeout: float = 60, command: str | None = None, args: tuple = ()) -> Run:
    """Write ``bug``'s program as ``workdir/prog.py`` and run it under ``ptodist run --report-json``
    (``ptodist check`` for a ``check`` entry; ``command`` and ``args`` override the subcommand and add options)."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "prog.py"
    script.write_text(bug.program)
    report = workdir / "report.json"
    env = dict(os.environ)
    for name in ("SIMPLER_HOST_STRACE", "SIMPLER_DFX", "SIMPLER_DEVICE_STRACE_ENABLE"):
        env.pop(name, None)
    env.pop("PYTHONWARNINGS", None)
    env.update({"PTODIST_HANG_TIMEOUT": HANG_TIMEOUT, "PTODIST_OUTPUT_ROOT": str(workdir / "build_output")})
    env.update(bug.env)
    argv = [sys.executable, "-m", "ptodist", command or bug.command, *args, "--report-json", str(report), str(script)]
    proc = subprocess.run(argv,
                          capture_output=True, text=True, cwd=workdir, env=env, timeout=timeout)
    doc = json.loads(report.read_text()) if report.exists() else {}
    return Run(bug, script, proc.returncode, proc.stdout, proc.stderr, normalise(proc.stderr, workdir), doc)


# -- the new-feature entries: what each run must show ----------------------------------------------------------

# The checks a FEATURES entry is judged by, in order; an entry's ``issues`` names those that fail today.
CHECKS = ("found", "kind", "location", "root_first", "twin")
# Kinds that say only that something failed, not which bug it is ("*" in an entry's kinds: any kind but these).
GENERIC_KINDS = ("script_error", "rank_error", "invalid_argument", "internal_error")
TWIN_SCHEDULES = "20"
NO_SHRINK = ("--no-shrink",)  # the findings are judged, not the story of the smallest schedule: skip its search


def accepts(bug: Bug, kind: str) -> bool:
    """Whether a finding of ``kind`` is of the kind ``bug`` expects: ``"hang*"`` is any deadlock or hang kind,
    ``"*"`` any kind that names a bug (not one of :data:`GENERIC_KINDS`)."""
    for want in bug.kinds:
        if want == kind or (want == "hang*" and ("hang" in kind or "deadlock" in kind)) or \
                (want == "*" and kind not in GENERIC_KINDS):
            return True
    return False


def twin_args(bug: Bug, measure: bool = False) -> tuple[str, tuple] | None:
    """The command a fixed twin runs under: ``check --schedules 20`` for a checker bug and for the figure; None
    (not run) for a bug a plain run shows, outside the figure: its twin's outcome does not depend on a schedule,
    and ``--measure`` checks it."""
    if measure or bug.command == "check":
        return "check", ("--schedules", TWIN_SCHEDULES)
    return None


def clean(r: Run) -> bool:
    """Whether a run ended clean: exit status 0, status ``ok``, no findings."""
    return r.returncode == 0 and r.report.get("status") == "ok" and not r.report.get("findings")


def judge(bug: Bug, r: Run, twin: Run | None = None) -> dict[str, str]:
    """The :data:`CHECKS` that a FEATURES entry's run ``r`` (and its fixed twin's, when given) fail, each with what
    was expected. A correct entry (no kinds) fails ``found`` when its run is not clean."""
    if not bug.kinds:
        return {} if clean(r) else {"found": f"a clean run, got status {r.report.get('status')!r}, findings "
                                             f"{[f['kind'] for f in r.report.get('findings', [])]}"}
    failed = {}
    findings = r.report.get("findings", []) if r.returncode != 0 else []
    root = f"{r.script}:{bug.bug_line}"
    if not findings:
        failed["found"] = f"a finding, got exit status {r.returncode}, status {r.report.get('status')!r}"
    right = [f for f in findings if accepts(bug, f["kind"])]
    if not right:
        failed["kind"] = f"a finding of kind {' or '.join(bug.kinds)}, got {[f['kind'] for f in findings]}"
    named = right or findings
    if not any(root in f["locations"] for f in named):
        failed["location"] = f"{root} (the root line) among the locations, got {[f['locations'] for f in named]}"
    if not any(f["locations"][:1] == [root] for f in named):
        failed["root_first"] = f"{root} as the first location, got {[f['locations'][:1] for f in named]}"
    if twin is not None and not clean(twin):
        failed["twin"] = (f"the fixed twin clean, got exit status {twin.returncode}, findings "
                          f"{[f['kind'] for f in twin.report.get('findings', [])]}")
    return failed


def run_features(root: Path, jobs: int = 2, measure: bool = False, bugs: list[Bug] | None = None):
    """Run every FEATURES entry and, for the buggy ones, its fixed twin, ``jobs`` at a time, each in
    ``root/<name>``; return ``{name: (run, twin run or None)}``. ``measure`` (the figure): a checker bug under
    ``ptodist check --schedules 20`` and every twin under ``ptodist check --schedules 20``; else as the test runs
    them: each bug under its command, only a checker bug's twin (:func:`twin_args`)."""
    bugs = FEATURES if bugs is None else bugs
    root = Path(root)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = {}
        for bug in bugs:
            args = ("--schedules", TWIN_SCHEDULES) if measure and bug.command == "check" else ()
            args += NO_SHRINK if bug.command == "check" else ()
            runs[bug.name] = pool.submit(run, bug, root / bug.name, 120, None, args)
        twins = {}
        for bug in bugs:
            how = twin_args(bug, measure) if bug.kinds else None
            if how:
                twins[bug.name] = pool.submit(run, bug.fixed, root / (bug.name + ".fixed"), 120, how[0],
                                              how[1] + NO_SHRINK)
        return {bug.name: (runs[bug.name].result(), twins[bug.name].result() if bug.name in twins else None)
                for bug in bugs}


def measure(root: Path, jobs: int = 2) -> str:
    """The figure: for each buggy FEATURES entry, whether ptodist found it, with the right kind, naming the root
    line (among the locations, and first), and whether its fixed twin is clean under ``check --schedules 20``."""
    results = run_features(root, jobs, measure=True)
    buggy = [bug for bug in FEATURES if bug.kinds]
    rows, totals = [], dict.fromkeys(CHECKS, 0)
    for bug in buggy:
        r, twin = results[bug.name]
        failed = judge(bug, r, twin)
        marks = []
        for check in CHECKS:
            ok = check not in failed
            totals[check] += ok
            marks.append("yes" if ok else "no")
        kinds = ", ".join(sorted({f["kind"] for f in r.report.get("findings", [])})) or "-"
        rows.append(f"| {bug.name} | {bug.feature} | {bug.command} | {' | '.join(marks)} | {kinds} |")
    clean_ok = [bug.name for bug in FEATURES if not bug.kinds and not judge(bug, results[bug.name][0])]
    n = len(buggy)
    lines = ["| program | feature | command | " + " | ".join(CHECKS) + " | reported kinds |",
             "|---|---|---|" + "---|" * len(CHECKS) + "---|", *rows, "",
             "found {found}/{n}, right kind {kind}/{n}, root line named {location}/{n} (first {root_first}/{n}), "
             "fixed twin clean {twin}/{n}".format(n=n, **totals),
             f"correct programs clean: {len(clean_ok)}/{len(FEATURES) - n}"]
    return "\n".join(lines)


_TIMING = re.compile(r"\b\d+\.\d+ s\b")
_WALL_TIME = re.compile(r'("wall_time_s": )\d+(\.\d+)?')
_STAMP = re.compile(r"_\d{8}_\d{6}_\d{6}\b")  # an output directory's time stamp


def normalise(text: str, workdir: Path) -> str:
    """Drop ``workdir`` from paths (the script becomes ``prog.py``); show timings as ``N s``, time stamps as such,
    and the ``ptodist`` printed commands name (this interpreter's, by its path) as a checkout's ``.venv`` has it."""
    text = text.replace(str(Path(workdir).resolve()) + os.sep, "").replace(str(workdir) + os.sep, "")
    text = text.replace(commands.ptodist() + " ", ".venv/bin/ptodist ")
    text = _TIMING.sub("N s", text)
    text = _WALL_TIME.sub(r"\1N", text)
    text = _STAMP.sub("_<YYYYmmdd_HHMMSS_ffffff>", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


# -- rendering --------------------------------------------------------------------------------------------------

COMMAND = f"PTODIST_HANG_TIMEOUT={HANG_TIMEOUT} ptodist {{command}} --report-json report.json prog.py"
_BLOCK = re.compile(r"^<!-- begin (\S+) -->\n(.*?)^<!-- end \1 -->\n", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (as tests/cli/test_docs.py computes it)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def link(name: str) -> str:
    """A markdown link to zoo entry ``name``'s section."""
    title = BY_NAME[name].title
    return f"[{title}](#{slug(title)})"


def output_block(r: Run) -> str:
    """The generated part of a zoo entry's section: how it was run, the exit status and stderr."""
    env = "".join(f"{k}={v} " for k, v in r.bug.env.items())
    command = COMMAND.format(command=r.bug.command)
    lines = [f"`{env}{command}` exits with status {r.returncode}; stderr:", "", "```text", r.output, "```"]
    if r.bug.kinds:
        found = ", ".join(f"`{f['kind']}`" for f in r.report.get("findings", [])) or "none"
        lines += ["", f"`report.json`: status `{r.report.get('status')}`, findings: {found}."]
    elif r.report:
        lines += ["", f"`report.json`: `{normalise(json.dumps(r.report, separators=(', ', ': ')), r.script.parent)}`"]
    return "\n".join(lines)


def report_block(r: Run) -> str:
    """A whole --report-json document, paths and timings normalised like the stderr."""
    text = normalise(json.dumps(r.report, indent=2, ensure_ascii=False), r.script.parent)
    return "\n".join(["```json", text, "```"])


def blocks_of(runs: dict[str, Run]) -> dict[str, str]:
    """Every generated block of the page, by block name."""
    out = {name: output_block(r) for name, r in runs.items()}
    out["hang.report"] = report_block(runs["hang"])
    return out


def _wrap(block_name: str, text: str) -> str:
    return f"<!-- begin {block_name} -->\n{text}\n<!-- end {block_name} -->\n"


def section(name: str, blocks: dict[str, str]) -> str:
    bug = BY_NAME[name]
    parts = ["#" * bug.level + " " + bug.title, ""]
    if bug.before:
        parts += [bug.before, ""]
    parts += ["```python", bug.program.rstrip("\n"), "```", "", _wrap(name, blocks[name])]
    if bug.after:
        parts += [bug.after, ""]
    return "\n".join(parts)


def parse(page: str) -> dict[str, str]:
    """The generated blocks of a rendered page, by block name."""
    return {m.group(1): m.group(2).rstrip("\n") for m in _BLOCK.finditer(page)}


def _md(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def features_section() -> str:
    """The page's list of the :data:`FEATURES` programs (their runs are measured, not shown: see :func:`measure`)."""
    rows = [f"| `{bug.name}` | {bug.feature} | {bug.title.split(': ', 1)[-1]} | `ptodist {bug.command}` |"
            for bug in FEATURES]
    return "\n".join([_md("""
        ## The execution model, measured

        A second set of programs, `FEATURES` in
        [`docs/gen_debugging.py`](gen_debugging.py), holds one realistic bug per
        feature of the execution model (task graphs, deferred waits, comm
        domains, valid shapes, cross-core pipes, `all_to_all_v`, workers, chip
        placement, L2 programs), each with its fixed twin, and two correct
        programs whose deferred waits hold in another order than they were
        submitted in (a device's scheduler waits for any of them). Each
        program's `# BUG` marks the root line, where the fix belongs (the task's
        `deps=`, the dispatch, the `prepare()` option), which is not always
        where the bug shows. `tests/check/test_bug_zoo.py` runs them (and the twins
        of the bugs found under `ptodist check`, with 20 schedules) and records,
        per program, which of these checks ptodist does not pass yet: found,
        the right kind, the root line among the locations, the root line
        first, the fixed twin clean.
        `python docs/gen_debugging.py --measure` prints the figure: each program
        under its command (20 schedules under `ptodist check`), each twin under
        `ptodist check --schedules 20`. The pitfalls ptodist finds have sections in
        [pitfalls.md](pitfalls.md#pitfalls-of-the-execution-model).
        """), "| Program | Feature | Bug | Run under |", "|---|---|---|---|", *rows]) + "\n"


def render(blocks: dict[str, str]) -> str:
    """The whole page from its generated blocks (see :func:`blocks_of` and :func:`parse`)."""
    s = lambda name: section(name, blocks)  # noqa: E731
    parts = [
        _md("""
        # Debugging distributed programs

        Distributed bugs rarely leave a local stack trace: the symptom shows on
        one rank, the cause sits on another, and on the device the usual result
        is a hang or silently wrong data. ptodist turns each pitfall of the
        PyPTO *Debugging and Pitfalls* index (SPEC §8) into a report that names
        the rank(s), the source line(s), the cell or region, and the fix —
        or, for the pitfalls it cannot see yet, this page says so.

        Every program below is complete; each faulty one has exactly one bug,
        on the line marked `# BUG`. Each was run as `prog.py` with the command shown (the rank
        count is `P` in the program); the text under it is what ptodist printed
        on stderr, with the run's directory dropped from paths and timings
        shown as `N s`. This page is generated by
        [`docs/gen_debugging.py`](gen_debugging.py) from real runs, and
        `tests/check/test_bug_zoo.py` runs every program again and compares.
        [errors.md](errors.md) lists every check with its message.
        """),
        _md("""
        ## Reading a report

        `ptodist run SCRIPT` runs a PyPTO script (`pypto.*` imports resolve to
        ptodist). When ptodist stops the run it prints, on stderr:

        - `ptodist: ErrorType: message` — the message names what is wrong and
          where (`prog.py:LINE`); for a rank error it is followed by each
          failing rank's traceback, cut to the program's own frames;
        - `raised by FILE:LINE in FUNCTION: SOURCE` — the innermost line of the
          script in the driver's traceback (for errors inside ranks and hangs,
          the call of the compiled program);
        - one `ptodist: finding KIND (see docs/pitfalls.md#ANCHOR) on ranks R` block per finding,
          with `at` (the source locations, the root cause first) and `fix`.

        The exit status is 0 for a clean run and 1 when ptodist stopped it (3
        for a bug in ptodist itself).

        Bugs that a single run does not show (data races, stale signals, reads
        of bytes nobody wrote) are run under `ptodist check SCRIPT`
        ([check.md](check.md)): it prints one line per schedule, then each
        finding as `[KIND] ranks R (see docs/pitfalls.md#ANCHOR)`, its message, `at` and `fix`,
        and the command that replays the schedule.
        `--report-json PATH` writes the same findings as JSON whatever ends the
        run: `status` (`"ok"` or `"error"`), what ran (program, backend, device
        ids, output_dir, wall time, ptodist version, exit status) and
        `findings`, each with `kind`, `message`, `ranks`, `locations`,
        `pitfall` (the SPEC §8 row, or `null`), `docs` (its section of
        [pitfalls.md](pitfalls.md)), `fix` and, for a rank's error, its
        `traceback`. For the first program below:
        """),
        _wrap("hang.report", blocks["hang.report"]),
        _md("""
        Errors found before any rank starts (types, shapes, the dispatch plan,
        collective arguments on the host) have no ranks. Errors inside a rank
        and hangs list the ranks involved.

        ## Chapter-level failure modes (SPEC §8.1)
        """),
        s("hang"),
        s("load_out_of_bounds"),
        s("wrong_region"),
        s("set_clobber"),
        s("hardcoded_nr"),
        s("not_shared"),
        s("allreduce_in_loop"),
        _md("""
        ## Fatal pitfalls (SPEC §8.2)

        ### Missing .share_memory_()

        See [TypeError at dispatch](#typeerror-at-dispatch-a-host-tensor-not-in-shared-memory).
        """),
        s("window_bytes"),
        s("dispatch_range"),
        s("device_id_as_rank"),
        s("scalar_first"),
        _md(f"""
        ## Per-step pitfalls (SPEC §8.3)

        The sixteen steps of the tutorial ladder (`examples/01_*.py` …
        `16_*.py`), each with the pitfall its page warns about:

        | Step | Pitfall | What ptodist does today |
        |---|---|---|
        | 01 | scalar parameter before a tensor parameter | `TaskArgsError` before running: {link("scalar_first")} |
        | 02 | rank identity read outside the dispatch loop | error on the host and in the orchestration: {link("rank_on_host")}; no warning on identical per-rank outputs |
        | 03 | DistributedTensor used as Tensor, or the reverse | `ProgramTypeError` at the dispatch: {link("window_as_tensor")} |
        | 04 | `Set`/`Eq` on a shared-cell barrier | the hang, diagnosed as `set_clobber`: {link("set_clobber")} |
        | 05 | RMA before the ordering barrier | `race` under `ptodist check`: {link("race")} |
        | 06 | put without notify/wait | `race` under `ptodist check`: {link("race")} |
        | 07 | hard-coded rank count in host shapes | `ShapeError`: {link("hardcoded_nr")} |
        | 08 | missing barrier: load races store | `race` under `ptodist check`: {link("race")} |
        | 09 | two barriers reuse one signal row | `stale_signal` under `ptodist check`: {link("stale_signal")} |
        | 10 | negative left neighbour | `PeerRangeError` in the rank: {link("negative_neighbour")} |
        | 11 | signal shape does not match the collective mode | `SignalLayoutError` before running: {link("ring_signal_shape")} |
        | 12 | broadcast from the own slice instead of root's | not detected ([logic bugs](#steps-12-and-14-logic-bugs)) |
        | 13 | gather into the wrong slot | `race` under `ptodist check`: {link("gather_wrong_slot")} |
        | 14 | own row left out of the reduction | not detected ([logic bugs](#steps-12-and-14-logic-bugs)) |
        | 15 | one window as both source and result | `AliasingError` for the builtins: {link("all_to_all_in_place")}; hand-rolled, a `race` under `ptodist check` (as in {link("race")}) |
        | 16 | one signal window with two layouts | `SignalLayoutError` before running: {link("two_layouts")} |

        Steps 01, 04 and 07 are the chapter-level rows above.
        """),
        s("rank_on_host"),
        s("window_as_tensor"),
        s("tensor_as_window"),
        s("race"),
        s("stale_signal"),
        s("negative_neighbour"),
        s("ring_signal_shape"),
        _md("""
        ### Steps 12 and 14: logic bugs

        Broadcasting from the rank's own slice instead of the root's (12) and
        leaving the own row out of a reduction (14) run without any error, under
        `ptodist run` and `ptodist check` alike: every access is ordered, only
        the arithmetic is wrong. ptodist does not compare per-rank outputs or
        note broadcast results that differ from the root's; the program's golden
        check is what fails.
        """),
        s("gather_wrong_slot"),
        s("all_to_all_in_place"),
        s("two_layouts"),
        _md("""
        ## Other failures
        """),
        s("python_error"),
        s("correct"),
        features_section(),
        _md("""
        ## Diagnostic outputs (DFX)

        When a run completes but is slow or wrong, the diagnostic outputs show
        what each rank did. They are switched on in the `RunConfig` the program
        is compiled or called with, e.g.
        `compiled(x, config=RunConfig(platform="a2a3sim", distributed_config=cfg, enable_chip_swimlane=True))`
        (`from pypto.runtime import RunConfig`), and written under the
        compiled program's `output_dir`, per rank and per call (`d0`, `d1`, …):

        - **Swimlane** — `RunConfig(enable_chip_swimlane=True)`:
          `dfx_outputs/rank{r}/d{k}/chip_swimlane_records.json` (per-task
          timing), and per call a merged Chrome-trace / Perfetto file
          `dfx_outputs/merged_swimlane_*.json`: one process per rank, a slice
          per task and per communication op, and flow arrows from each notify
          to the wait it released.
        - **Scope statistics** — `RunConfig(enable_scope_stats=True)`:
          `dfx_outputs/rank{r}/d{k}/scope_stats/scope_stats.jsonl`, with the
          task-window, heap and tensormap high-water marks.
        - **Dependency graph** — `RunConfig(enable_dep_gen=True)`:
          `dfx_outputs/rank{r}/d{k}/deps.json`, the tasks, tensors and
          dependency edges the scheduler saw.

        `ptodist trace OUTPUT_DIR` summarises a call's swimlane: per-rank busy,
        waiting and communicating time, the longest waits and what released
        them, and the critical path. [dfx.md](dfx.md) describes the files and
        the command in full.
        """),
        s("build_flags"),
    ]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)


# -- main -------------------------------------------------------------------------------------------------------


def run_all(root: Path, jobs: int = 2) -> dict[str, Run]:
    """Run every zoo program, each in ``root/<name>``."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {bug.name: pool.submit(run, bug, Path(root) / bug.name) for bug in ZOO}
        return {name: f.result() for name, f in futures.items()}


def main(argv: list[str]) -> int:
    if "--measure" in argv:
        with tempfile.TemporaryDirectory(prefix="ptodist-features-") as root:
            print(measure(Path(root)))
        return 0
    check = "--check" in argv
    with tempfile.TemporaryDirectory(prefix="ptodist-zoo-") as root:
        page = render(blocks_of(run_all(Path(root))))
    if check:
        if PAGE.exists() and PAGE.read_text() == page:
            return 0
        print(f"{PAGE} is out of date: run python docs/gen_debugging.py", file=sys.stderr)
        return 1
    PAGE.write_text(page)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
