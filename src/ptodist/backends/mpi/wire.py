"""Host tensors between the processes: process 0's inputs for every process, every rank's outputs and DFX
files for every process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...dfx import finish_run
from ...language.types import Direction
from .agree import _exchange
from .layout import MAX_CHUNK, MERGE_BLOCK
from .session import _Session

if TYPE_CHECKING:
    from .run import _MpiRun


def _byte_view(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _bcast_bytes(comm, MPI, buf: np.ndarray, root: int) -> None:
    for lo in range(0, buf.size, MAX_CHUNK):
        piece = buf[lo:lo + MAX_CHUNK]
        comm.Bcast([piece, piece.size, MPI.BYTE], root=root)


def _sync_host_tensors(s: _Session, host_arrays: list) -> None:
    """Give every process process 0's host tensors, so all ranks start from the same inputs.

    Each process made its own (for instance with unseeded ``torch.randn``); the golden a script computes
    after the call then agrees with what the ranks computed.
    """
    for i, a in enumerate(host_arrays):
        if a is None or a.size == 0:
            continue
        if s.rank == 0:
            _bcast_bytes(s.comm, s.MPI, _byte_view(np.ascontiguousarray(a)), 0)
            continue
        got = np.empty(a.shape, a.dtype)
        _bcast_bytes(s.comm, s.MPI, _byte_view(got), 0)
        if np.array_equal(_byte_view(got), _byte_view(np.ascontiguousarray(a))):
            continue
        if a.flags.writeable and a.flags.c_contiguous:
            a[...] = got
        else:
            host_arrays[i] = got  # a read-only input: the ranks read process 0's values


def merge_outputs(run: _MpiRun, views: list) -> BaseException | None:
    """Give every process every rank's writes: exchange the changed blocks, apply the changed bytes.

    All processes start from the same host tensors, so the bytes a rank changed are those that differ
    from the original; they are applied rank by rank, in the same order everywhere.  Returns the error
    every process raises when finding its changes failed in one of them.
    """
    B = MERGE_BLOCK
    meta: dict[int, np.ndarray] = {}
    payload = []
    padded = {}
    failed = None
    try:
        if run.plan.edges:
            _reset_stale(run.plan.transfers.stale[run.rank], views, run.host_arrays)
        for spec in run.plan.host_tensors:
            if spec.direction is Direction.IN:
                continue
            orig = _byte_view(run.host_arrays[spec.index])
            new = _byte_view(views[spec.index])
            if orig.size == 0:
                continue
            nb = -(-orig.size // B)
            o, n = np.zeros(nb * B, np.uint8), np.zeros(nb * B, np.uint8)
            o[:orig.size], n[:new.size] = orig, new
            padded[spec.index] = o.reshape(nb, B)
            blocks = np.flatnonzero((o != n).reshape(nb, B).any(axis=1))
            if blocks.size:
                meta[spec.index] = blocks
                payload.append(n.reshape(nb, B)[blocks].reshape(-1))
        mine = np.concatenate(payload) if payload else np.zeros(0, np.uint8)
        results = {i: o.copy() for i, o in padded.items()}
    except Exception as e:  # noqa: BLE001 - e.g. no memory for the copies: every process fails the call
        failed = e
    failed, everyone = _exchange(run.session, run.plan.device_ids, "outputs", run.what, failed, meta)
    if failed is not None:
        return failed
    for p, theirs in enumerate(everyone):
        size = sum(b.size for b in theirs.values()) * B
        if size == 0:
            continue
        data = mine if p == run.rank else np.empty(size, np.uint8)
        _bcast_bytes(run.session.comm, run.MPI, data, p)
        at = 0
        for index in sorted(theirs):
            blocks = theirs[index]
            new = data[at:at + blocks.size * B].reshape(-1, B)
            at += blocks.size * B
            out = results[index]
            out[blocks] = np.where(new != padded[index][blocks], new, out[blocks])
    for index, out in results.items():
        target = _byte_view(run.host_arrays[index])
        target[:] = out.reshape(-1)[:target.size]
    return None


def _reset_stale(ops: list, views: list, originals: list) -> None:
    """Give back the original bytes of the regions another rank wrote after this rank's copy of them was current
    (``ops``: ``HostTransfers.stale`` of this rank), so that only copies holding a byte's latest write count as
    changing it in the merge."""
    depth: dict = {}
    for tensor, index, _ in ops:
        depth[tensor] = max(depth.get(tensor, 0), len(index))
    masks = {t: np.zeros(views[t].shape[:d], bool) for t, d in depth.items()
             if views[t] is not None and views[t].flags.writeable}
    for tensor, index, fresh in ops:
        if tensor in masks:
            masks[tensor][index] = not fresh
    for tensor, mask in masks.items():
        if mask.any():
            views[tensor][mask] = originals[tensor][mask]


def share_dfx(run: _MpiRun) -> tuple[BaseException | None, tuple[list, bool] | None]:
    """Every rank's DFX files, for every process, and whether this process merges the swimlanes; or the
    error every process raises when reading them failed in one."""
    failed, mine, key = None, {}, None
    try:
        d = run.dfx.rank_dir(run.rank)
        if d.is_dir():
            for p in sorted(d.rglob("*")):
                if p.is_file():
                    mine[str(p.relative_to(d))] = p.read_bytes()
        # One merge per output directory: processes that share one (same host, same path) elect the lowest.
        key = (run.session.host, str(Path(run.dfx.root).resolve()))
    except Exception as e:  # noqa: BLE001 - an unreadable file: every process fails the call
        failed = e
    failed, everyone = _exchange(run.session, run.plan.device_ids, "dfx", run.what, failed, (mine, key))
    if failed is not None:
        return failed, None
    return None, ([files for files, _ in everyone], [k for _, k in everyone].index(key) == run.rank)


def write_dfx(run: _MpiRun, everyone: list, merger: bool) -> BaseException | None:
    """Write the other ranks' DFX files (and merge them); return the error every process raises when that
    failed in one (a full disk, a folder it may not write)."""
    failed = None
    try:
        for r, files in enumerate(everyone):
            d = run.dfx.rank_dir(r)
            for rel, data in files.items():
                path = d / rel
                if path.exists():
                    continue  # written by its own rank into a directory this process shares
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, path)
        if merger:
            finish_run(run.dfx, run.world, run.plan.device_ids)
    except Exception as e:  # noqa: BLE001 - every process fails the call with it
        failed = e
    return _exchange(run.session, run.plan.device_ids, "dfx written", run.what, failed)[0]
