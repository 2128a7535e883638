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
