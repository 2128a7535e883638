"""The mpi backend's shared numbers: the control window's byte layout, and how often a rank looks around."""

from __future__ import annotations

from ...rank.status import OTHER_DTYPE, OTHER_WAITS, STATUS_DTYPE, StatusBoard

ALIGN = 64
CHECK_S = 0.02          # how often a waiting or finished rank looks at the abort word and the other ranks
# How long a finished rank polls for the others before it sleeps between polls, when every rank has a core: the
# others are usually microseconds behind, and a sleep costs at least 100 us.
FINISH_SPIN_S = 200e-6
PULSE_S = 0.01          # how often a rank runs MPI progress (and looks at its own progress) while it computes
BUSY_AFTER_S = 0.5      # a running rank without progress this long (at most half the hang timeout) is sampled
RESAMPLE_S = 0.1        # and sampled again this often while it stays so
RESULT_BYTES = 1 << 16  # room for a rank's pickled result in its control window
MERGE_BLOCK = 4096      # host tensor bytes are exchanged in blocks of this size
MAX_CHUNK = 1 << 30     # MPI counts are C ints: larger contiguous transfers go in pieces
TYPE_CACHE = 512        # derived datatypes kept per run (one per distinct region shape)
# After a failure, how long the other ranks get to stop before the job is ended with MPI_Abort:
# as long as the hang timeout, within these bounds.
STOP_WAIT_MIN_S, STOP_WAIT_MAX_S = 2.0, 10.0
END_WAIT_S = 0.5  # how long a process that ends the job waits for the peers to be told who ends it
# A peer gone this long without the rank thread reporting it (the rank computes, or is stuck in an MPI call
# to the dead peer): the pulse thread reports it.
PULSE_REPORT_S = 0.25
PEEK_DEAD_S = 0.2  # how long to try reading a dead peer's status row (its window may have died with it)

# The control window (byte offsets).  ABORT, LOCK, HANG and ENDER are touched only by MPI atomics; the
# rest is written by its owner with plain stores and read by the others with Get.
CTL_ABORT = 0
CTL_LOCK = 4
CTL_HANG = 8    # on rank 0 only: rank + 1 of the rank that reported a hang
CTL_ARRIVED = 16
CTL_RESULT_LEN = 24
# One INT32 accumulate, by a process that reported and ends the job with MPI_Abort: its rank + 1, then a
# bit mask of the ranks it found vanished (ranks below ENDER_RANKS).  A process read it without MPI calls.
CTL_ENDER = 32
ENDER_WORDS = 8
ENDER_RANKS = 32 * (ENDER_WORDS - 1)
CTL_BOARD = 64
# What a watcher reads of each rank, from CTL_ARRIVED: its status row and its other waits (they follow the row).
CTL_PEEK_END = CTL_BOARD + STATUS_DTYPE.itemsize + OTHER_DTYPE.itemsize * OTHER_WAITS
CTL_RESULT = -(-(CTL_BOARD + StatusBoard.nbytes(1)) // ALIGN) * ALIGN
CTL_BYTES = CTL_RESULT + RESULT_BYTES
