"""The rank side: what runs inside one rank, whatever backend started it.

``context`` (RankContext: the semantics of every memory, RMA and signal op), ``events`` (the EventLog
of one dispatch) and ``tensors`` (RankTensor, WindowTensor), and ``body`` (``run_rank``, the one rank
body every backend calls).  Nothing here imports a backend or the driver side (``runtime/``).
"""
