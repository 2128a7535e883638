"""Run PyPTO scripts unmodified: make ``pypto.*`` imports resolve to ``ptodist.*``.

The alias lives only in the running process (``ptodist run`` installs it);
no ``pypto`` package is ever installed, so a real PyPTO stays untouched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


def target_of(fullname: str) -> str:
    """Return the ptodist module that stands for PyPTO module ``fullname`` (the same path under ``ptodist``)."""
    return "ptodist" + fullname[len("pypto"):]


class _Loader(importlib.abc.Loader):
    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "pypto" and not fullname.startswith("pypto."):
            return None
        try:
            module = importlib.import_module(target_of(fullname))
        except ModuleNotFoundError:
            return None
        spec = importlib.util.spec_from_loader(fullname, _Loader(module))
        if hasattr(module, "__path__"):
            spec.submodule_search_locations = list(module.__path__)
        return spec


_FINDER = _AliasFinder()


def install() -> None:
    """Make ``import pypto...`` resolve to ptodist in this process (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
