"""The ``shm`` backend: rank processes over shared memory.

A ``RankGroup`` forks one process per rank; each serves one command after another
(``_serve``, whose rank body is ``rank.body.run_rank``): the driver writes a command
into a frame of the group's control mapping and rings a doorbell word, the ranks run
it and count themselves into a ``finished`` word, and a ``CommandWatch`` turns
failures and stalls into exceptions (``_Monitor``, the one stall rule).

* A ``DistributedWorker``'s group is started once.  Host tensors, resident tensors and
  window heaps are shared files whose descriptors reach the ranks over a unix socket
  (``SCM_RIGHTS``), so memory made after the fork is seen in place.
* A one-shot call (``ShmBackend.run``) is a group used once: one anonymous mapping
  holds the host tensors (copied in, outputs copied out after success) and the window
  heaps (``world`` rows); the group is forked with the command already published, so
  the ranks inherit the mapping and start at once.

An anonymous ``MAP_SHARED`` mapping vanishes with the last process that maps it,
and the files are memfds, so no shared-memory segment can leak.  Ranks ask the
kernel to kill them if the driver dies, and the driver kills and reaps every
rank on any ending it cannot recover from: error, hang or Ctrl-C.

The modules, one job each: ``memory`` (WindowHeap, ShmMemory), ``wire`` (the control mapping's layout,
commands and plans as they travel), ``watch`` (CommandWatch: failures and stalls), ``group`` (RankGroup:
forking, commands, reaping), ``server`` (the rank side), ``kept`` (one-shot groups kept between calls)
and ``backend`` (ShmBackend).
"""

from ..base import GRACE_S
from .backend import ShmBackend
from .kept import close_kept_groups

__all__ = ["GRACE_S", "ShmBackend", "close_kept_groups"]
