"""What ranks print: ``[rank r]`` before each line, lines whole; the ranks' environment.

The ``shm`` tests run ``ptodist run`` in a subprocess on a script written into ``tmp_path`` and read what it
printed; ``sim`` runs in this process. Ranks run concurrently, so their lines are compared in sorted order;
each rank's own lines keep their order.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import child_env, on_every_rank

import ptodist.language as pl
from ptodist import ConfigError, DistributedConfig, RunConfig, rank_output

PRINTS = '''
import os
import sys

import numpy as np

import ptodist
import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig

NR = pl.dynamic("NR")
LINES = int(os.environ.get("LINES_PER_RANK", "0"))


@pl.jit.incore
def show(x: pl.Tensor[[1, 4], pl.FP32]):
    e = os.environ
    me = e.get("RANK")
    print("env", me, e.get("WORLD_SIZE"), e.get("LOCAL_RANK"), e.get("PTODIST_DEVICE_ID"))
    print("half", end="")                     # the rest of this line comes after a line on stderr
    print("to stderr", file=sys.stderr)
    print(" and the rest")
    for i in range(LINES):                    # many long lines from every rank at once
        print(f"line {i} of rank {me} " + "x" * 200)


@pl.jit
def per_rank(x: pl.Tensor[[1, 4], pl.FP32]):
    show(x)


@pl.jit.host
def host(x: pl.Tensor[[NR, 1, 4], pl.FP32]):
    for r in pl.range(pld.world_size()):
        per_rank(x[r], device=r)


cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[int(d) for d in sys.argv[1].split(",")]))
if sys.argv[2:] == ["worker"]:
    x = ptodist.shared_array((len(cfg.distributed_config.device_ids), 1, 4))
    with host.compile(x, config=cfg).prepare() as rt:
        rt(x)
        print("between the dispatches", flush=True)
        rt(x)
else:
    host(np.zeros((len(cfg.distributed_config.device_ids), 1, 4), np.float32), config=cfg)
print("driver", os.environ.get("RANK"))
'''


def run_prints(tmp_path, devices: str, *args: str, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "prints.py"
    script.write_text(PRINTS)
    return subprocess.run([sys.executable, "-m", "ptodist", "run", str(script), devices, *args], capture_output=True,
                          text=True, cwd=tmp_path, env=child_env(**env), timeout=120)


def rank_block(rank: int, device: int, world: int, prefix: bool = True) -> tuple[list[str], list[str]]:
    """What rank ``rank`` prints to stdout and to stderr in one dispatch."""
    p = f"[rank {rank}] " if prefix else ""
    return ([f"{p}env {rank} {world} {rank} {device}", f"{p}half and the rest"], [f"{p}to stderr"])


def test_shm_ranks_prefix_their_lines_and_get_their_environment(tmp_path):
    proc = run_prints(tmp_path, "4,7")
    assert proc.returncode == 0, proc.stderr
    out0, err0 = rank_block(0, 4, 2)
    out1, err1 = rank_block(1, 7, 2)
    assert sorted(proc.stdout.splitlines()) == sorted([*out0, *out1, "driver None"])
    assert proc.stdout.splitlines()[-1] == "driver None"  # the driver's own lines: no prefix, no RANK
    assert sorted(proc.stderr.splitlines()) == sorted([
        "ptodist: platform 'a2a3sim' runs on the local 'shm' backend (no NPU needed)", *err0, *err1])


def test_worker_ranks_prefix_their_lines_in_every_dispatch(tmp_path):
    proc = run_prints(tmp_path, "0,1", "worker")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    cut = lines.index("between the dispatches")
    one = sorted([*rank_block(0, 0, 2)[0], *rank_block(1, 1, 2)[0]])
    assert sorted(lines[:cut]) == one and sorted(lines[cut + 1:-1]) == one
    assert lines[-1] == "driver None"


def test_prefix_off_with_the_variable_and_with_one_rank(tmp_path):
    off = run_prints(tmp_path, "0,1", PTODIST_RANK_PREFIX=0)
    assert off.returncode == 0, off.stderr
    # Without the prefix the ranks write as Python does (every print() piece at once when PYTHONUNBUFFERED is
    # set): their lines may mix, so only the text is compared, character by character.
    expected = "\n".join([*rank_block(0, 0, 2, prefix=False)[0], *rank_block(1, 1, 2, prefix=False)[0],
                          "driver None"]) + "\n"
    assert sorted(off.stdout) == sorted(expected) and off.stdout.endswith("driver None\n")
    one = run_prints(tmp_path, "5")
    assert one.stdout.splitlines() == [*rank_block(0, 5, 1, prefix=False)[0], "driver None"]
    forced = run_prints(tmp_path, "5", PTODIST_RANK_PREFIX=1)
    assert forced.stdout.splitlines() == [*rank_block(0, 5, 1)[0], "driver None"]


def test_lines_of_concurrent_ranks_never_mix(tmp_path):
    n = 300
    proc = run_prints(tmp_path, "0,1,2,3", LINES_PER_RANK=n)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for r in range(4):
        mine = [line for line in lines if line.startswith(f"[rank {r}] line ")]
        assert mine == [f"[rank {r}] line {i} of rank {r} " + "x" * 200 for i in range(n)]
    others = [line for line in lines if " line " not in line or not line.startswith("[rank ")]
    assert sorted(others) == sorted([*(rank_block(r, r, 4)[0][0] for r in range(4)),
                                     *(rank_block(r, r, 4)[0][1] for r in range(4)), "driver None"])


def test_a_bad_prefix_setting_is_refused_before_any_rank_starts(tmp_path):
    proc = run_prints(tmp_path, "0,1", PTODIST_RANK_PREFIX="yes")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines()[0] == (
        "ptodist: ConfigError: PTODIST_RANK_PREFIX='yes': must be 0 (the ranks' output lines are not prefixed) or 1 "
        "(each line a rank prints starts with [rank r], even with one rank)")


# -- sim: ranks are threads of this process -----------------------------------------------------------------

NR = pl.dynamic("NR")


@pl.jit.incore
def sim_show(x: pl.Tensor[[1, 4], pl.FP32]):
    print("half", end="")
    print("to stderr", file=sys.stderr)
    print(" and the rest")


sim_host = on_every_rank(sim_show, name="sim_host")


def test_sim_rank_threads_prefix_their_lines(capsys, monkeypatch):
    monkeypatch.setenv("PTODIST_BACKEND", "sim")
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]))
    capsys.readouterr()
    sim_host(np.zeros((2, 1, 4), np.float32), config=cfg)
    print("driver")
    got = capsys.readouterr()
    assert sorted(got.out.splitlines()) == ["[rank 0] half and the rest", "[rank 1] half and the rest", "driver"]
    assert got.out.splitlines()[-1] == "driver"
    assert sorted(line for line in got.err.splitlines() if line.startswith("[rank")) == [
        "[rank 0] to stderr", "[rank 1] to stderr"]
    assert "RANK" not in os.environ  # threads share one environment: none is set


# -- the streams themselves ---------------------------------------------------------------------------------

def test_rank_stream_writes_whole_prefixed_lines_in_as_few_writes_as_fit():
    r, w = os.pipe()
    try:
        with os.fdopen(w, "w", closefd=False) as raw:
            stream = rank_output.RankStream(raw, "[rank 3] ")
            calls = []
            stream._os_write = lambda fd, data: calls.append(bytes(data)) or len(data)
            stream.write("a")
            stream.write("b\nc")
            assert calls == [b"[rank 3] ab\n"]
            stream.write("\n\nd\n")
            assert calls[1:] == [b"[rank 3] c\n[rank 3] \n[rank 3] d\n"]  # several lines: one write
            stream.write("half")
            stream.flush()                                             # an unfinished line goes out on flush
            stream.write(" rest\r\n")                                  # ... and its rest has no prefix
            assert calls[2:] == [b"[rank 3] half", b" rest\r\n"]
            long = ["y" * 1000 + "\n"] * 9                             # 9 KB of lines: batches up to PIPE_BUF
            del calls[:]
            stream.write("".join(long))
            assert b"".join(calls) == b"".join(b"[rank 3] " + x.encode() for x in long)
            assert all(len(c) <= rank_output.PIPE_BUF for c in calls) and len(calls) == 3
            assert all(c.endswith(b"\n") for c in calls)               # every write ends at a line's end
            huge = "z" * (2 * rank_output.PIPE_BUF) + "\n"
            del calls[:]
            stream.write("s\n" + huge)
            assert calls == [b"[rank 3] s\n", b"[rank 3] " + huge.encode()]  # a longer line: a write of its own
            with pytest.raises(TypeError, match="write\\(\\) argument must be str, not bytes"):
                stream.write(b"x")
    finally:
        os.close(r)
        os.close(w)


def test_rank_stream_without_a_file_descriptor_writes_to_the_stream():
    buf = io.StringIO()
    stream = rank_output.RankStream(buf, "[rank 0] ")
    print("one", file=stream)
    print("two", end="", file=stream)
    assert buf.getvalue() == "[rank 0] one\n"
    stream.flush()
    assert buf.getvalue() == "[rank 0] one\n[rank 0] two"


def test_prefix_setting_values(monkeypatch):
    from ptodist.config import rank_prefix_setting

    for value, wanted in (("", {1: False, 2: True}), ("0", {1: False, 2: False}), ("1", {1: True, 2: True})):
        monkeypatch.setenv("PTODIST_RANK_PREFIX", value)
        assert {w: rank_output.prefix_wanted(w) for w in (1, 2)} == wanted
    monkeypatch.setenv("PTODIST_RANK_PREFIX", "on")
    with pytest.raises(ConfigError) as info:
        rank_prefix_setting()
    assert str(info.value) == ("PTODIST_RANK_PREFIX='on': must be 0 (the ranks' output lines are not prefixed) or 1 "
                               "(each line a rank prints starts with [rank r], even with one rank)")
    assert rank_output.prefix_wanted(2) is True  # a rank, which the driver already checked, keeps the default


def test_rank_environment():
    assert rank_output.rank_environment(2, 4, 9) == {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2",
                                                     "PTODIST_DEVICE_ID": "9"}


def test_thread_tagged_passes_other_threads_through_and_ends_their_open_lines():
    import threading

    buf = io.StringIO()
    tagged = rank_output.ThreadTagged(buf)

    def rank_thread():
        rank_output._sim.prefix = "[rank 1] "
        tagged.write("partial")

    t = threading.Thread(target=rank_thread)
    t.start()
    t.join()
    tagged.write("driver\n")
    assert buf.getvalue() == "[rank 1] partial\ndriver\n"

    def plain_thread():  # neither is a rank: two threads' text passes through as it comes
        tagged.write("b\n")

    tagged.write("a")
    t = threading.Thread(target=plain_thread)
    t.start()
    t.join()
    assert buf.getvalue() == "[rank 1] partial\ndriver\nab\n"

