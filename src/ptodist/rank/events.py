"""The per-rank event log: what one rank did during one dispatch, on one clock.

Off by default; the rank context records into it only when a diagnostic
output asks for it (``RunConfig(enable_chip_swimlane=...)`` and friends) or
``ptodist check`` runs, so a plain run pays one ``is None`` test per operation.
The DFX writers (``ptodist/dfx/``) and the happens-before checker
(``ptodist/check/hb.py``) are its readers.  Times are ``time.monotonic_ns()``:
CLOCK_MONOTONIC, the same clock in every rank process of a machine.

A log given a ``clock`` (an iterator shared by all ranks) is the checker's:
it stamps each record with ``seq`` from it, which gives one global order (the
``sim`` backend runs one rank at a time, so that order is the order things
happened), and also records every access to window memory, in
:attr:`EventLog.accesses`, apart from the timed records.

Under the checker each record also names its *actor*: what runs concurrently
with what on a device.  Actor 0 is the rank's orchestration (the code outside
tasks); each task run, each block of a ``pl.spmd`` task and each half of a
mixed kernel is an actor of its own (:meth:`EventLog.fork`, described in
:attr:`EventLog.actors`).  ``fork`` and ``join`` records, in the same stream
as the accesses, are the edges the task graph adds between them.
"""

from __future__ import annotations

import time

now_ns = time.monotonic_ns


class EventLog:
    """Records of tasks, communication operations and scopes, in the order they happened."""

    def __init__(self, rank: int, device_id: int, dispatch: int, *, clock=None, dump_args: int = 0):
        self.rank = rank
        self.dump_args = dump_args  # RunConfig.enable_dump_args: which tasks' tensors to copy into `dumps`
        self.dumps: list[dict] = []  # {task_id, task, arg, array}: tensors as a task left them
        self._clock = clock              # an iterator of global sequence numbers, or None
        self.record_accesses = clock is not None  # the checker's log: window reads and writes too
        self.accesses: list[dict] = []   # those reads and writes; not slices, so kept apart from records
        self.findings: list[tuple] = []  # (seq, Finding): what the rank found itself while it ran (the checker's)
        self.device_id = device_id
        self.dispatch = dispatch
        self.records: list[dict] = []   # slices: tasks and communication operations
        self.tasks: list[dict] = []     # per task: its arguments and explicit deps (for deps.json)
        self.scopes: list[dict] = []    # scope begin/end lines (for scope_stats.jsonl)
        self.start_ns = now_ns()
        self._depth = 0
        self.max_depth = 0
        self.local_bytes = 0
        self.max_local_bytes = 0
        self.stopped = False  # True when the dispatch was cut short (a hang, an interrupt, a failure elsewhere)
        # The checker's actors: the one running now, and what each is (index: its id; 0 the orchestration).
        self.actor = 0
        self.actors: list[dict] = [{"kind": "orchestration", "parent": None}]
        self._tokens = 0  # release tokens handed out
        self.keep: list = []  # memory a recorded access names by address, kept alive so no other takes its place

    # -- tasks and scopes ---------------------------------------------------------
    def task_begin(self, task_id: int, name: str, kind: str, where: str, lane: int, args: list, deps: list) -> dict:
        """Open a task slice; return it (closed by :meth:`task_end`)."""
        rec = {"id": len(self.records), "kind": kind, "name": name, "task_id": task_id, "lane": lane,
               "start": now_ns(), "end": None, "where": where}
        if self._clock is not None:
            rec["seq"] = next(self._clock)
        self.records.append(rec)
        self.tasks.append({"task_id": task_id, "name": name, "kind": kind, "where": where, "args": args,
                           "deps": list(deps)})
        self._depth += 1
        self.max_depth = max(self.max_depth, self._depth)
        self.scope("begin", "task", name, task_id, rec["start"])
        return rec

    def task_end(self, rec: dict) -> None:
        rec["end"] = now_ns()
        self.scope("end", "task", rec["name"], rec["task_id"], rec["end"])  # at the depth its begin line had
        self._depth -= 1

    def scope(self, event: str, kind: str, name: str, scope_id, t: int | None = None) -> None:
        self.scopes.append({"event": event, "scope": kind, "name": name, "id": scope_id, "depth": self._depth,
                            "t": t if t is not None else now_ns(), "local_bytes": self.local_bytes})

    def allocated(self, nbytes: int) -> None:
        """Count a tensor the orchestration allocated (``pl.create_tensor``)."""
        self.local_bytes += nbytes
        self.max_local_bytes = max(self.max_local_bytes, self.local_bytes)

    # -- communication operations ------------------------------------------------------
    def op(self, kind: str, name: str, start: int, task_id: int | None, lane: int, where: str, **args) -> dict:
        """Record one communication operation (a closed slice).

        A wait also records the ``pl.range`` loops it ran in: ``iteration``, the innermost loop's index
        (None outside loops), and ``loops``, every enclosing loop's index, outermost first.
        """
        end = now_ns()
        if kind == "wait":
            from ..language.control import loop_indices

            loops = loop_indices()
            args["iteration"] = loops[-1] if loops else None
            args["loops"] = loops
        rec = {"id": len(self.records), "kind": kind, "name": name, "task_id": task_id, "lane": lane,
               "start": start, "end": end, "where": where, "args": args}
        if self._clock is not None:
            rec["seq"] = next(self._clock)
            rec["actor"] = self.actor
        self.records.append(rec)
        return rec

    # -- the checker's actors --------------------------------------------------------------
    def fork(self, **info) -> int:
        """A new actor that starts from where the running one is now (a task submitted, a block, a core half).

        ``info`` describes it for reports (``kind``, ``name``, ``task_id``, ``where``: the line that made it,
        ``deps``, ``manual``, ``block``).  Returns its id; the running actor stays the running one.
        """
        actor = len(self.actors)
        info["parent"] = self.actor
        self.actors.append(info)
        self.accesses.append({"kind": "fork", "actor": actor, "parent": self.actor, "seq": next(self._clock)})
        return actor

    def release(self) -> int:
        """A token for where the running actor is now (a pipe push): an :meth:`acquire` of it orders after this
        point, not after what the actor does later."""
        token = self._tokens
        self._tokens += 1
        self.accesses.append({"kind": "release", "actor": self.actor, "token": token, "seq": next(self._clock)})
        return token

    def acquire(self, tokens) -> None:
        """The running actor goes on after the points ``tokens`` (from :meth:`release`) mark."""
        self.accesses.append({"kind": "acquire", "actor": self.actor, "tokens": list(tokens),
                              "seq": next(self._clock)})

    def join(self, actors) -> None:
        """The running actor goes on only after ``actors`` are complete (a dependency, a wait for tasks)."""
        actors = [a for a in actors if a != self.actor]
        if actors:
            self.accesses.append({"kind": "join", "actor": self.actor, "from": actors, "seq": next(self._clock)})

    def access(self, name: str, write: bool, atomic: bool, owner: int, buffer_id, offset: int,
               shape: tuple, strides: tuple, itemsize: int, dtype: str, tensor: str, where: str,
               memory: tuple | None = None) -> None:
        """Record a read or write of window memory: rank ``owner``'s copy of buffer ``buffer_id``.

        The bytes touched are those of an array with ``shape``/``strides``/``itemsize`` whose first
        element sits ``offset`` bytes into the buffer; ``dtype`` is the pl dtype name it was accessed as.
        Memory of this rank outside windows (a host tensor, a ``pl.create_tensor`` tensor) has
        ``buffer_id`` None and ``memory`` ``(kind, low, high)``: ``"host"`` or ``"local"`` and the root
        buffer's addresses, which ``offset`` counts from.
        """
        self.accesses.append({"kind": "access", "name": name, "rank": self.rank,
                              "seq": next(self._clock), "actor": self.actor,
                              "write": write, "atomic": atomic, "owner": owner, "buffer_id": buffer_id,
                              "offset": offset, "shape": shape, "strides": strides, "itemsize": itemsize,
                              "dtype": dtype, "tensor": tensor, "where": where, "memory": memory})

    def finding(self, finding) -> None:
        """Keep a finding the rank made while it ran (a padding read); the checker reports it with its own."""
        self.findings.append((next(self._clock), finding))

    def to_json(self) -> dict:
        data = {"rank": self.rank, "device_id": self.device_id, "dispatch": self.dispatch,
                "clock": "CLOCK_MONOTONIC, nanoseconds", "start": self.start_ns, "end": now_ns(),
                "records": self.records}
        if self.stopped:
            data["stopped"] = True
        return data
