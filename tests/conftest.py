"""Shared test fixtures: every test runs in its own output directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


@pytest.fixture(autouse=True)
def _isolated_output(tmp_path, monkeypatch):
    # Plans and DFX outputs go under the test's tmp dir, never into the checkout.
    monkeypatch.setenv("PTODIST_OUTPUT_ROOT", str(tmp_path / "build_output"))
    yield


def python_exe() -> str:
    return sys.executable


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def children() -> list[int]:
    """Return the live (non-zombie) child processes of this process."""
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            out.append(int(pid))
    return out
