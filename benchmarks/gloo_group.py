"""What the benchmarks' gloo contenders share: a free loopback port, and joining a gloo process group."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank: int, world: int, port: int):
    """Join rank ``rank`` of a ``world``-process gloo group over loopback; return ``torch.distributed``.

    One thread per process, so that P processes on few cores do not oversubscribe them further.
    """
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return dist


class Workers:
    """P forked processes running ``target(rank, P, port, conn)``, each answering ``(status, value)`` on a pipe.

    Every worker first answers once (``"ready"``, or ``"error"`` and why) after joining the group.
    """

    def __init__(self, p: int, target, timeout: float = 120.0):
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        port = free_port()
        self.conns, self.procs = [], []
        for r in range(p):
            a, b = ctx.Pipe()
            proc = ctx.Process(target=target, args=(r, p, port, b), daemon=True)
            proc.start()
            b.close()
            self.conns.append(a)
            self.procs.append(proc)
        errors = [v for s, v in self.collect(timeout) if s != "ready"]
        if errors:
            self.close()
            raise RuntimeError(errors[0])

    def send(self, command) -> None:
        for conn in self.conns:
            conn.send(command)

    def collect(self, timeout: float) -> list[tuple]:
        """Every worker's next answer, in rank order; RuntimeError if one exits or stays silent past ``timeout``."""
        import time

        out = []
        deadline = time.monotonic() + timeout
        for conn, proc in zip(self.conns, self.procs):
            while not conn.poll(0.2):
                if not proc.is_alive():
                    raise RuntimeError(f"a gloo process exited with status {proc.exitcode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"a gloo process gave no answer within {timeout:.0f} s")
            out.append(conn.recv())
        return out

    def close(self) -> None:
        """Tell every worker to leave (``None``), then reap it (killing one that does not)."""
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
