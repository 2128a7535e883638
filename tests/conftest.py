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
