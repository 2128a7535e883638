"""The rank side: what runs inside one rank, whatever backend started it.

``context`` (RankContext: the semantics of every memory, RMA and signal op, one concern per module:
``task_calls``, ``memory_calls``, ``signal_calls``, ``waiting``, ``rma_calls``, ``collective_calls``,
``sites``), ``events`` (the EventLog of one dispatch) and ``tensors`` (RankTensor, WindowTensor), and
``body`` (``run_rank``, the one rank body every backend calls).  Nothing here imports a backend or the
driver side (``runtime/``).
"""
