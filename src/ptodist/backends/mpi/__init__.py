"""The ``mpi`` backend: one MPI process per rank, windows as MPI-3 RMA windows.

``mpirun -n P python SCRIPT`` starts P copies of the program.  Every copy runs
the host orchestrator, so every process plans the same dispatch; process r of
``MPI_COMM_WORLD`` then runs rank r's tasks, and only those.

Two MPI windows per run, allocated collectively over the world and zeroed:

    heap      the window heap: every window buffer at its plan offset
    control   abort word | accumulate lock | hang claim | arrived | result length |
              who ends the job, and the ranks it found vanished |
              this rank's status board (state, the wait it is blocked in, the
              notifies it sent, the line it runs when it stalls) | its pickled
              result (read when the job is aborted)

Every process holds a passive-target epoch on both windows (``Lock_all``) for
the whole run.  Signal cells are touched only by MPI atomics (``Fetch_and_op``
with SUM, REPLACE or NO_OP), so they are atomic with respect to each other on
any transport.  A peer's window data moves with ``Get`` and ``Put``
(``Accumulate`` for atomic adds); every ``Put`` is completed at its target
before the next notify, so data is visible before the signal announcing it.

There is no driver process.  A rank that waits, and a rank that has finished,
watches the other ranks' status boards and diagnoses a hang itself, with the
stall rule every backend uses (``base.StallRule``: only communication is
progress, never CPU time).  Beside the rank's thread a helper thread (``_Pulse``)
runs MPI's progress engine and, when its rank runs without progress, publishes
the line the rank is at, so a hang report names where a busy rank spins.  A rank
that fails or finds a hang sets every rank's abort word; the others stop at
their next wait (after the grace period the ``shm`` driver gives), all processes
exchange their results and raise the same error.  Each process's rank writes
into private copies of the host tensors; at the end the bytes every rank
changed are exchanged, so each process returns with every rank's outputs.

A rank process that dies without Python (``os._exit``, a signal, the OOM killer)
cannot report.  Every process knows each peer's pid and machine; a watching
rank that finds a peer on its machine gone prints which rank vanished, tells
the others that it ends the job and which ranks vanished (the ender words) and
ends it with ``MPI_Abort``; beside a rank that does not watch (it computes, or
waits in an MPI call) the pulse thread does that.  A process that the launcher
terminates (SIGTERM, as Open MPI does once a process of the job exited) prints
the same report if the ender words name a vanished rank or its pulse thread
saw one gone before the signal came, or else says that the launcher ended it,
then dies of the signal.  Pids mean nothing across machines: there only the
launcher's message names the process that exited.

The package, one module per job (bottom up):

    layout    the control window's byte layout, and how often a rank looks around
    session   loading mpi4py; this process in the job (its communicator, where every peer runs)
    agree     every process takes each step together (``_exchange``), or the job ends
    wire      host tensors between the processes: process 0's inputs, every rank's outputs, DFX files
    remote    a peer's window memory (``RemoteArray``)
    memory    ``MpiMemory``: the RankMemory over MPI windows; a worker's window heap
    watch     the abort word, hangs, vanished peers, the launcher's SIGTERM, the pulse thread
    run       one command in this process (``_MpiRun``)
    group     ``MpiBackend`` and ``MpiGroup``
"""

from __future__ import annotations

from .agree import plan_digest
from .group import MpiBackend, MpiGroup
from .memory import MpiMemory
from .remote import RemoteArray, RemoteRegion
from .run import outcome
from .session import INSTALL_HINT, job_communicator, load_mpi

__all__ = ["INSTALL_HINT", "MpiBackend", "MpiGroup", "MpiMemory", "RemoteArray", "RemoteRegion", "job_communicator",
           "load_mpi", "outcome", "plan_digest"]
