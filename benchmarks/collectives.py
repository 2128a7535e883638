"""Collective throughput: ptodist host collectives (on shm and on MPI) vs. torch.distributed (gloo) vs. MPI (mpi4py).

For each collective (allreduce Sum FP32, broadcast, allgather, reduce_scatter,
all_to_all), each rank count P and each size, every contender runs K calls back
to back and reports the time per call.  Contenders are interleaved per
repetition (their order rotates), so machine drift hits all alike; the table
shows medians over the repetitions.

* **ptodist** (the ``shm`` backend): a host orchestrator that warms up with one
  builtin collective, dispatches a timer kernel (``time.perf_counter_ns()`` into
  an INT64 output) to every rank, K builtin collectives on windows with an
  explicit signal (a host loop), then the timer kernel again.  Per-call time =
  max over ranks of (t1 - t0) / K, so process start-up and planning are not
  measured.  The program's first call, untimed, starts the rank group its later
  calls use (as the other contenders' processes are started before they are
  timed): a newly forked rank is slower while it first touches the pages it
  shares with the driver.
* **ptodist-mpi**: the same program on the ``mpi`` backend: ``mpirun -n P``
  (the options below) running this file with ``--ptodist-mpi-worker``; each
  measurement is one call of the compiled program (windows are MPI RMA windows).
* **gloo**: P forked processes in ``init_process_group("gloo",
  init_method="tcp://127.0.0.1:<free port>")`` (TCP over loopback); a warm-up
  call, a barrier, K calls; max over ranks.
* **MPI**: ``mpirun -n P`` (Open MPI: ``--mca pml ob1 --mca btl self,vader``, or
  ``self,sm`` from Open MPI 5: shared memory only) running this file with
  ``--mpi-worker``; a warm-up call, ``Barrier``, K calls; max over ranks.

The gloo, MPI and ptodist-mpi processes are started once per P and take
commands through pipes (FIFOs for the MPI jobs), blocking in the kernel while
idle, so they use no CPU while the other contenders run.  A contender that is
not installed, or fails, shows "n/a" and the reason is listed under the table.

Sizes are bytes of the largest per-rank buffer (the nccl-tests convention):
allreduce/broadcast: the buffer; allgather: the gathered output (each rank
contributes size/P); reduce_scatter: the input (each rank keeps size/P);
all_to_all: the send buffer (= receive buffer).  algbw = size / time;
busbw = algbw x 2(P-1)/P (allreduce), (P-1)/P (allgather, reduce_scatter,
all_to_all), 1 (broadcast).  All buffers hold FP32 zeros, written before timing
(MPI's too: an unwritten numpy buffer reads the kernel's zero page, not memory).

Run: ``python benchmarks/collectives.py [--quick] [--ops allreduce,...] [--sizes 4K,1M]
[--ps 2,4] [--repeat 5] [--out FILE]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import gloo_group  # benchmarks/gloo_group.py, beside this script

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "all_to_all")
SIZES = ("4K", "64K", "1M", "16M", "64M")
CONTENDERS = ("ptodist", "ptodist-mpi", "gloo", "MPI")
MPI_JOBS = {"MPI": "--mpi-worker", "ptodist-mpi": "--ptodist-mpi-worker"}  # contender -> worker flag
RATIOS = (("ptodist", "gloo"), ("ptodist", "MPI"), ("ptodist-mpi", "MPI"), ("ptodist-mpi", "ptodist"))
QUICK = {"ops": "allreduce", "sizes": "4K,1M,16M", "ps": "2", "repeat": 3}
COMMAND_TIMEOUT_S = 300.0  # one measurement of one contender


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 4K, 64K, 1M, 16M, 64M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def size_label(nbytes: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def bus_factor(op: str, p: int) -> float:
    if op == "allreduce":
        return 2 * (p - 1) / p
    if op == "broadcast":
        return 1.0
    return (p - 1) / p


def iterations(nbytes: int, budget: int, kmin: int, kmax: int) -> int:
    """Calls per measurement: about ``budget`` bytes of traffic, within [kmin, kmax]."""
    return max(kmin, min(kmax, budget // nbytes))


# ---------------------------------------------------------------------------------------------
# The collectives, as each contender spells them.  ``n`` = FP32 elements of the size.

def _gloo_call(dist, torch, op: str, n: int, p: int):
    """Return a zero-argument function doing one call of ``op`` with gloo."""
    if op == "allreduce":
        buf = torch.zeros(n)
        return lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    if op == "broadcast":
        buf = torch.zeros(n)
        return lambda: dist.broadcast(buf, src=0)
    if op == "allgather":
        out, inp = torch.zeros(n), torch.zeros(n // p)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(out, inp)
    if op == "reduce_scatter":
        out, inp = torch.zeros(n // p), torch.zeros(n)
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: fn(out, inp)
    if op == "all_to_all":
        out, inp = torch.zeros(n), torch.zeros(n)
        return lambda: dist.all_to_all_single(out, inp)
    raise ValueError(op)


def _mpi_call(MPI, np, comm, op: str, n: int, p: int):
    """Return a zero-argument function doing one call of ``op`` with mpi4py.

    The buffers are written once (with zeros) before use: a large ``np.zeros`` is untouched memory
    that reads from the kernel's shared zero page, always in cache, so a send buffer never written
    would be read at no memory cost, unlike every other contender's data (torch's zeros are written;
    ptodist's windows are shared memory, whose pages are real once touched).
    """
    def buf(k: int):
        b = np.empty(k, np.float32)
        b.fill(0.0)
        return b

    if op == "allreduce":
        send, recv = buf(n), buf(n)
        return lambda: comm.Allreduce(send, recv, op=MPI.SUM)
    if op == "broadcast":
        data = buf(n)
        return lambda: comm.Bcast(data, root=0)
    if op == "allgather":
        send, recv = buf(n // p), buf(n)
        return lambda: comm.Allgather(send, recv)
    if op == "reduce_scatter":
        send, recv = buf(n), buf(n // p)
        return lambda: comm.Reduce_scatter_block(send, recv, op=MPI.SUM)
    if op == "all_to_all":
        send, recv = buf(n), buf(n)
        return lambda: comm.Alltoall(send, recv)
    raise ValueError(op)


# ---------------------------------------------------------------------------------------------
# ptodist

_PTO = {}


def _ptodist_functions():
    """The timer kernel and its per-device wrapper (defined once, on first use)."""
    if not _PTO:
        import ptodist.language as pl
        import ptodist.language.distributed as pld

        @pl.jit.incore
        def stamp(t: pl.Out[pl.Tensor[[1], pl.INT64]]):
            pl.write(t, [0], time.perf_counter_ns())
            return t

        @pl.jit
        def clock(t: pl.Out[pl.Tensor[[1], pl.INT64]]):
            return stamp(t)

        _PTO.update(pl=pl, pld=pld, clock=clock, NR=pl.dynamic("NR"))
    return _PTO


def ptodist_program(op: str, p: int, n: int, k: int, output_dir: str, backend: str | None = None):
    """Compile the timed host program: warm-up call, t0 stamps, K builtin ``op`` calls, t1 stamps."""
    f = _ptodist_functions()
    pl, pld, clock, NR = f["pl"], f["pld"], f["clock"], f["NR"]
    from ptodist import DistributedConfig, RunConfig

    cols = n // p

    def windows():
        """Allocate this op's windows and return one call of it (the host plans K of them)."""
        sig = pld.window(pld.alloc_window_buffer([p, 1], dtype=pl.INT32), [p, 1], dtype=pl.INT32)
        if op in ("allreduce", "broadcast"):
            data = pld.window(pld.alloc_window_buffer([1, n], dtype=pl.FP32), [1, n], dtype=pl.FP32)
            if op == "allreduce":
                return lambda: pld.tensor.allreduce(data, sig, op=pld.ReduceOp.Sum)
            return lambda: pld.tensor.broadcast(data, sig, root=0)
        if op == "reduce_scatter":
            data = pld.window(pld.alloc_window_buffer([p, cols], dtype=pl.FP32), [p, cols], dtype=pl.FP32)
            return lambda: pld.tensor.reduce_scatter(data, sig, op=pld.ReduceOp.Sum)
        if op == "allgather":
            local = pld.window(pld.alloc_window_buffer([1, cols], dtype=pl.FP32), [1, cols], dtype=pl.FP32)
            out = pld.window(pld.alloc_window_buffer([p, cols], dtype=pl.FP32), [p, cols], dtype=pl.FP32)
            return lambda: pld.tensor.allgather(local, out, sig)
        if op == "all_to_all":
            src = pld.window(pld.alloc_window_buffer([p, cols], dtype=pl.FP32), [p, cols], dtype=pl.FP32)
            dst = pld.window(pld.alloc_window_buffer([p, cols], dtype=pl.FP32), [p, cols], dtype=pl.FP32)
            return lambda: pld.tensor.all_to_all(src, dst, sig)
        raise ValueError(op)

    @pl.jit.host
    def bench(t0: pl.Out[pl.Tensor[[NR, 1], pl.INT64]], t1: pl.Out[pl.Tensor[[NR, 1], pl.INT64]]):
        call = windows()
        call()  # warm-up: faults the windows in; ends with a barrier, so the ranks start t0 together
        for r in pl.range(pld.world_size()):
            clock(t0[r], device=r)
        for _ in pl.range(k):
            call()
        for r in pl.range(pld.world_size()):
            clock(t1[r], device=r)
        return t0, t1

    import numpy as np

    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=list(range(p))), output_dir=output_dir,
                    backend=backend)
    t0, t1 = np.zeros((p, 1), np.int64), np.zeros((p, 1), np.int64)
    return bench.compile(t0, t1, config=cfg)


def ptodist_measure(compiled, p: int, k: int) -> float:
    import numpy as np

    t0, t1 = np.zeros((p, 1), np.int64), np.zeros((p, 1), np.int64)
    compiled(t0, t1)
    return float((t1 - t0).max()) / k * 1e-9


# ---------------------------------------------------------------------------------------------
# gloo: P forked workers, one Pipe each

def _gloo_worker(rank: int, p: int, port: int, conn) -> None:
    try:
        import torch

        dist = gloo_group.join(rank, p, port)
        conn.send(("ready", None))
    except BaseException as e:  # noqa: BLE001 - reported to the driver
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        op, n, k = cmd
        try:
            call = _gloo_call(dist, torch, op, n, p)
            call()  # warm-up
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                call()
            dt = time.perf_counter() - t0
            del call
            conn.send(("ok", dt / k))
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


class GlooPool(gloo_group.Workers):
    """P gloo processes, alive for one P; ``measure`` runs one command on all of them."""

    def __init__(self, p: int):
        super().__init__(p, _gloo_worker)

    def measure(self, op: str, n: int, k: int) -> float:
        self.send((op, n, k))
        replies = self.collect(COMMAND_TIMEOUT_S)
        errors = [v for s, v in replies if s != "ok"]
        if errors:
            raise RuntimeError(errors[0])
        return max(v for _, v in replies)


# ---------------------------------------------------------------------------------------------
# MPI: one mpirun per P running this file with --mpi-worker (or --ptodist-mpi-worker); one command FIFO per rank

def mpi_launcher() -> tuple[list[str] | None, str]:
    """Return (mpirun argv prefix without -n, description) or (None, why MPI is unavailable)."""
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        return None, "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    if importlib.util.find_spec("mpi4py") is None:
        return None, f"mpi4py is not installed in {sys.executable} (pip install mpi4py)"
    try:
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{mpirun} --version failed: {e}"
    m = re.search(r"Open MPI\)?\s*([\d.]+)", version)
    if m:
        major = int(m.group(1).split(".")[0])
        btl = "self,sm" if major >= 5 else "self,vader"
        argv = [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", btl,
                "--mca", "oob_tcp_if_include", "lo"]
        return argv, f"Open MPI {m.group(1)} (pml ob1, btl {btl})"
    first = version.strip().splitlines()[0] if version.strip() else "unknown MPI"
    return [mpirun], first


def _mpi_worker(fifo_dir: str) -> int:
    """Body of one MPI rank: read commands from fifo_dir/cmd.<rank>; rank 0 prints results."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    with open(os.path.join(fifo_dir, f"cmd.{rank}")) as cmds:
        for line in cmds:
            cmd = json.loads(line)
            if cmd is None:
                break
            op, n, k = cmd
            try:
                call = _mpi_call(MPI, np, comm, op, n, p)
                call()  # warm-up
                comm.Barrier()
                t0 = MPI.Wtime()
                for _ in range(k):
                    call()
                dt = (MPI.Wtime() - t0) / k
                del call
                result = {"ok": comm.reduce(dt, op=MPI.MAX, root=0)}
            except Exception as e:  # noqa: BLE001
                result = {"error": f"{type(e).__name__}: {e}"}
            if rank == 0:
                print("RESULT " + json.dumps(result), flush=True)
    return 0


def _ptodist_mpi_worker(fifo_dir: str) -> int:
    """Body of one rank of ptodist on the mpi backend: like _mpi_worker, measuring ptodist_program."""
    from ptodist.backends.mpi import load_mpi

    rank = load_mpi().COMM_WORLD.Get_rank()
    p = load_mpi().COMM_WORLD.Get_size()
    outdir = os.path.join(fifo_dir, f"plans.{rank}")
    compiled: dict = {}
    with open(os.path.join(fifo_dir, f"cmd.{rank}")) as cmds:
        for line in cmds:
            cmd = json.loads(line)
            if cmd is None:
                break
            op, n, k = cmd
            try:
                if (op, n, k) not in compiled:
                    compiled[(op, n, k)] = ptodist_program(op, p, n, k, outdir, backend="mpi")
                    ptodist_measure(compiled[(op, n, k)], p, k)  # untimed, as on shm
                result = {"ok": ptodist_measure(compiled[(op, n, k)], p, k)}
            except Exception as e:  # noqa: BLE001
                result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            if rank == 0:
                print("RESULT " + json.dumps(result), flush=True)
    return 0


class MpiPool:
    """``mpirun -n P`` workers, alive for one P; ``measure`` runs one command on all of them."""

    def __init__(self, launcher: list[str], p: int, worker: str = "--mpi-worker"):
        self.p = p
        self.dir = tempfile.mkdtemp(prefix="ptodist-bench-mpi-")
        self.fds: list[int] = []
        for r in range(p):
            os.mkfifo(os.path.join(self.dir, f"cmd.{r}"))
        argv = [*launcher, "-n", str(p), sys.executable, os.path.abspath(__file__), worker, self.dir]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.out = b""
        try:
            deadline = time.monotonic() + 120
            for r in range(p):
                path = os.path.join(self.dir, f"cmd.{r}")
                while True:
                    try:
                        self.fds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                        break
                    except OSError:  # ENXIO: the rank has not opened its end yet
                        if self.proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(self._failure("did not start")) from None
                        time.sleep(0.05)
        except BaseException:
            self.close()
            raise

    def _failure(self, what: str) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        _, err = self.proc.communicate()
        lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        return f"mpirun {what} (status {self.proc.returncode}): " + (" | ".join(lines[-3:]) or "no message")

    def _send(self, cmd) -> None:
        data = (json.dumps(cmd) + "\n").encode()
        for fd in self.fds:
            os.write(fd, data)  # short line: atomic, and a FIFO holds far more

    def measure(self, op: str, n: int, k: int) -> float:
        self._send([op, n, k])
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while b"\n" not in self.out or not self._result_line():
            if self.proc.poll() is not None:
                raise RuntimeError(self._failure("exited"))
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"MPI gave no answer within {COMMAND_TIMEOUT_S:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise RuntimeError(self._failure("closed its output"))
                self.out += chunk
        result = self._take_result()
        if "error" in result:
            raise RuntimeError(result["error"])
        return float(result["ok"])

    def _result_line(self) -> bool:
        return any(ln.startswith(b"RESULT ") for ln in self.out.split(b"\n")[:-1])

    def _take_result(self) -> dict:
        lines = self.out.split(b"\n")
        for i, ln in enumerate(lines[:-1]):
            if ln.startswith(b"RESULT "):
                self.out = b"\n".join(lines[i + 1:])
                return json.loads(ln[len(b"RESULT "):])
        raise AssertionError("no result line")

    def close(self) -> None:
        try:
            if self.fds and self.proc.poll() is None:
                self._send(None)
        except OSError:
            pass
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# the run

def _fmt_time(s: float | None) -> str:
    if s is None:
        return "n/a"
    us = s * 1e6
    return f"{us:,.0f}" if us >= 100 else f"{us:.1f}"


def _fmt_bw(nbytes: int, s: float | None, factor: float = 1.0) -> str:
    if s is None:
        return "n/a"
    gbs = nbytes / s / 1e9 * factor
    return f"{gbs:.2g}" if gbs < 0.1 else f"{gbs:.2f}"


def _fmt_ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "n/a"
    return f"{a / b:.2f}"


def render(results: dict, notes: list[str], header: list[str], ops, ps, sizes) -> str:
    out = list(header)
    for op in ops:
        bus = {"allreduce": "2(P-1)/P", "broadcast": "1"}.get(op, "(P-1)/P")
        out += ["", f"### {op}" + (" (Sum, FP32)" if op in ("allreduce", "reduce_scatter") else " (FP32)"), "",
                f"busbw = algbw x {bus}.  ptodist runs on shm, ptodist-mpi on the mpi backend.  Time ratio < 1: "
                "the first is faster.", "",
                "| P | size | K | " + " | ".join(f"{c} µs" for c in CONTENDERS) + " | "
                + " | ".join(f"{c} algbw GB/s" for c in CONTENDERS) + " | "
                + " | ".join(f"{c} busbw GB/s" for c in CONTENDERS) + " | "
                + " | ".join(f"{a}/{b}" for a, b in RATIOS) + " |",
                "|" + "---:|" * (3 + 3 * len(CONTENDERS) + len(RATIOS))]
        for p in ps:
            for size in sizes:
                row = results.get((op, p, size))
                if row is None:
                    continue
                med = {c: (statistics.median(row[c]) if row[c] else None) for c in CONTENDERS}
                f = bus_factor(op, p)
                out.append("| " + " | ".join([
                    str(p), size_label(size), str(row["k"]),
                    *(_fmt_time(med[c]) for c in CONTENDERS),
                    *(_fmt_bw(size, med[c]) for c in CONTENDERS),
                    *(_fmt_bw(size, med[c], f) for c in CONTENDERS),
                    *(_fmt_ratio(med[a], med[b]) for a, b in RATIOS),
                ]) + " |")
    if notes:
        out += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def measure_size(op: str, p: int, size: int, args, unavailable: dict, pools: dict, start_pool, outdir: str,
                 notes: list, samples: list) -> dict:
    """Measure one (op, P, size) for every available contender, interleaved; return the samples per contender."""
    n = size // 4
    k = iterations(size, args.budget, args.min_iters, args.max_iters)
    row: dict = {"k": k, **{c: [] for c in CONTENDERS}}
    compiled = None
    if "ptodist" not in unavailable:
        try:
            compiled = ptodist_program(op, p, n, k, outdir, backend="shm")  # planned once; each repetition runs
            ptodist_measure(compiled, p, k)  # untimed: starts the rank group the repetitions run on
        except Exception as e:  # noqa: BLE001
            notes.append(f"ptodist {op} P={p} {size_label(size)}: n/a — {type(e).__name__}: {e}")
    order = [c for c in CONTENDERS if (c == "ptodist" and compiled is not None) or c in pools]
    failed: set = set()
    for rep in range(args.repeat):
        rot = rep % max(len(order), 1)
        for c in order[rot:] + order[:rot]:  # rotate, so no contender always goes first
            if c in failed or (c != "ptodist" and c not in pools):
                continue
            try:
                value = ptodist_measure(compiled, p, k) if c == "ptodist" else pools[c].measure(op, n, k)
            except Exception as e:  # noqa: BLE001
                failed.add(c)
                row[c] = []
                notes.append(f"{c} {op} P={p} {size_label(size)}: n/a — "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
                if c in pools:  # the pool may be wedged: restart it for the next measurement
                    try:
                        pools[c].close()
                    except Exception:  # noqa: BLE001
                        pass
                    try:
                        pools[c] = start_pool(c, p)
                    except Exception as e2:  # noqa: BLE001
                        del pools[c]
                        notes.append(f"{c} P={p}: could not restart: {e2}")
                continue
            row[c].append(value)
            samples.append({"op": op, "P": p, "bytes": size, "k": k, "contender": c, "rep": rep,
                            "seconds_per_call": value})
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=None, help=f"comma-separated, from {','.join(OPS)} (default: all)")
    ap.add_argument("--sizes", default=None, help=f"comma-separated per-rank sizes (default: {','.join(SIZES)})")
    ap.add_argument("--ps", default=None, help="comma-separated rank counts (default: 2,4)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions per contender (default 5)")
    ap.add_argument("--budget", default="256M", type=parse_size,
                    help="bytes per measurement: K = budget / size, within [--min-iters, --max-iters]")
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--contenders", default=",".join(CONTENDERS),
                    help=f"comma-separated subset of {','.join(CONTENDERS)}")
    ap.add_argument("--quick", action="store_true",
                    help=f"a short run: --ops {QUICK['ops']} --sizes {QUICK['sizes']} --ps {QUICK['ps']} "
                         f"--repeat {QUICK['repeat']} (explicit options still win)")
    ap.add_argument("--out", help="also write the Markdown table to this file")
    ap.add_argument("--json", help="write every sample (seconds per call) to this JSON file")
    ap.add_argument("--mpi-worker", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--ptodist-mpi-worker", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mpi_worker:
        return _mpi_worker(args.mpi_worker)
    if args.ptodist_mpi_worker:
        return _ptodist_mpi_worker(args.ptodist_mpi_worker)

    defaults = {"ops": ",".join(OPS), "sizes": ",".join(SIZES), "ps": "2,4", "repeat": 5}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK[key] if args.quick else value)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"unknown op(s) {bad}; choose from {', '.join(OPS)}")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    ps = [int(x) for x in args.ps.split(",") if x.strip()]
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if set(contenders) - set(CONTENDERS):
        ap.error(f"--contenders: choose from {', '.join(CONTENDERS)}")
    for p in ps:
        for s in sizes:
            if p < 2 or s % (4 * p):
                ap.error(f"size {s} B must hold a whole number of FP32 elements per rank for P={p} (P >= 2)")

    notes: list[str] = []
    unavailable: dict[str, str] = {}
    if "gloo" in contenders:
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_gloo_available()):
                unavailable["gloo"] = "torch.distributed was built without gloo"
        except ImportError as e:
            unavailable["gloo"] = f"torch is not importable ({e})"
    wants_mpi = [c for c in MPI_JOBS if c in contenders]
    mpi_argv, mpi_desc = (mpi_launcher() if wants_mpi else (None, "not selected"))
    if mpi_argv is None:
        for c in wants_mpi:
            unavailable[c] = mpi_desc
    for c in CONTENDERS:
        if c not in contenders:
            unavailable.setdefault(c, "not selected (--contenders)")
    for c, why in unavailable.items():
        notes.append(f"{c}: n/a — {why}")

    versions = [f"Python {platform.python_version()}"]
    try:
        import torch

        versions.append(f"torch {torch.__version__} (gloo)")
    except ImportError:
        pass
    if mpi_argv is not None:
        import mpi4py

        versions.append(f"{mpi_desc}, mpi4py {mpi4py.__version__}")
    header = [f"## Collectives: ptodist (shm, mpi) vs gloo vs MPI — median time per call over {args.repeat} "
              f"interleaved repetitions", "",
              f"{os.cpu_count()} CPUs, {platform.machine()}, {'; '.join(versions)}.  Sizes are bytes of the "
              "largest per-rank buffer; algbw = size / time; K calls per measurement."]
    load_start = os.getloadavg()[0]

    results: dict = {}
    samples: list = []
    outdir = tempfile.mkdtemp(prefix="ptodist-bench-plans-")
    t_start = time.monotonic()

    def start_pool(name: str, p: int):
        return GlooPool(p) if name == "gloo" else MpiPool(mpi_argv, p, MPI_JOBS[name])

    try:
        for p in ps:
            pools: dict = {}
            for name in ("gloo", *MPI_JOBS):
                if name not in unavailable:
                    try:
                        pools[name] = start_pool(name, p)
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"{name} P={p}: n/a — could not start: {e}")
            try:
                for op in ops:
                    for size in sizes:
                        row = measure_size(op, p, size, args, unavailable, pools, start_pool, outdir, notes,
                                           samples)
                        results[(op, p, size)] = row
                        med = {c: (statistics.median(row[c]) if row[c] else None) for c in CONTENDERS}
                        print(f"  {op:14s} P={p} {size_label(size):>7s} K={row['k']:<3d} " +
                              "  ".join(f"{c} {_fmt_time(med[c])} µs" for c in CONTENDERS) +
                              f"  [{time.monotonic() - t_start:.0f} s]", file=sys.stderr, flush=True)
            finally:
                for pool in pools.values():
                    pool.close()
    except KeyboardInterrupt:
        notes.append("interrupted: the table holds the measurements made so far")
    finally:
        shutil.rmtree(outdir, ignore_errors=True)

    header[-1] += (f"  Load average (1 min) {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
                   f"{time.monotonic() - t_start:.0f} s.")
    table = render(results, notes, header, ops, ps, sizes)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(samples, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:
        raise SystemExit(1) from None
