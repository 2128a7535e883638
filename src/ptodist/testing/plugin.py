"""ptodist's pytest plugin (registered on install as the ``ptodist`` entry point of ``pytest11``).

* ``@pytest.mark.ranks(2, 3, 4)`` runs a test once per rank count ``P`` (ids ``P2``, ``P3``, ...),
  with the ``device_ids`` fixture set to ``[0, ..., P-1]``;
* the ``device_ids`` fixture is ``[0, 1]`` in a test without the marker;
* every test's ptodist outputs go under its ``tmp_path``: ``PTODIST_OUTPUT_ROOT`` is
  ``tmp_path / "build_output"`` while the test runs (and is restored after it);
* :func:`ptodist.testing.check` called in a test knows the test: it defaults to the test's
  ``device_ids`` and names the test in its replay command;
* ``import pypto.language as pl`` (any ``pypto.*``) resolves to ptodist, as under ``ptodist run``,
  unless a real PyPTO is installed: then it is PyPTO's.

Disable it with ``-p no:ptodist``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from .. import compat
from . import _set_current_test, _Test

OUTPUT_ENV = "PTODIST_OUTPUT_ROOT"
DEFAULT_DEVICE_IDS = (0, 1)


def _alias_pypto() -> None:
    """Make ``pypto.*`` imports resolve to ptodist for the session, unless a real PyPTO is importable.

    Done when pytest loads the plugin, before any conftest or test module is imported, so that tests written
    as PyPTO's (``import pypto.language as pl``) run under plain pytest; a real PyPTO is never shadowed.
    """
    if importlib.util.find_spec("pypto") is None:
        compat.install()


_alias_pypto()


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "ranks(*counts): run the test once per rank count P, its device_ids fixture [0, ..., P-1] "
                   "(ptodist.testing)")


def pytest_generate_tests(metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("ranks")
    if marker is None:
        return
    where = f"@pytest.mark.ranks on {metafunc.definition.nodeid}"
    counts = list(marker.args)
    if marker.kwargs or not counts or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in counts):
        pytest.fail(f"{where}: takes rank counts, positive integers (e.g. @pytest.mark.ranks(2, 3, 4)), got "
                    f"{_call_text(marker)}", pytrace=False)
    if len(set(counts)) != len(counts):
        pytest.fail(f"{where}: a rank count is repeated in {_call_text(marker)}", pytrace=False)
    if "device_ids" not in metafunc.fixturenames:
        if not any(m.name == "ranks" for m in metafunc.definition.own_markers):
            return  # the marker of a class or module: it applies to the tests there that use device_ids
        pytest.fail(f"{where}: the test does not use the device_ids fixture the marker sets; add a device_ids "
                    "parameter", pytrace=False)
    metafunc.parametrize("device_ids", [list(range(p)) for p in counts], ids=[f"P{p}" for p in counts],
                         indirect=True)


def _call_text(marker) -> str:
    parts = [repr(a) for a in marker.args] + [f"{k}={v!r}" for k, v in marker.kwargs.items()]
    return f"ranks({', '.join(parts)})"


@pytest.fixture
def device_ids(request) -> list[int]:
    """The devices the test runs on: ``[0, ..., P-1]`` under ``@pytest.mark.ranks(..., P, ...)``, else ``[0, 1]``."""
    return list(getattr(request, "param", DEFAULT_DEVICE_IDS))


@pytest.fixture(autouse=True)
def _ptodist_test(request):
    """Point ptodist's outputs at the test's tmp_path, and tell ptodist.testing.check which test runs."""
    saved = os.environ.get(OUTPUT_ENV)
    root = _output_root(request)
    if root is not None:
        os.environ[OUTPUT_ENV] = root
    _set_current_test(_Test(request, request.node.nodeid, Path(str(request.config.rootpath))))
    try:
        yield
    finally:
        _set_current_test(None)
        if root is not None:
            if saved is None:
                os.environ.pop(OUTPUT_ENV, None)
            else:
                os.environ[OUTPUT_ENV] = saved


def _output_root(request) -> str | None:
    """``tmp_path / "build_output"``, or None where there is no usable tmp_path (``-p no:tmpdir``, an override)."""
    if not request.config.pluginmanager.has_plugin("tmpdir"):
        return None
    try:
        return os.fspath(Path(os.fspath(request.getfixturevalue("tmp_path"))) / "build_output")
    except Exception:  # noqa: BLE001 - a test's own tmp_path fixture that is not a path: leave the outputs alone
        return None
