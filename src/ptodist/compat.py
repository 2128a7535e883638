"""Run PyPTO scripts unmodified: make ``pypto.*`` imports resolve to ``ptodist.*``.

The alias lives only in the running process (``ptodist run`` installs it, and the pytest plugin where no
real PyPTO is importable); no ``pypto`` package is ever installed, so a real PyPTO stays untouched.
"""

from __future__ import annotations

import functools
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


# --- the exported surface: which of upstream's names ptodist has -----------------------------------

_SURFACE_FILE = "compat_surface.json"


@functools.cache  # read once: a typo's message consults it, and its callers only read it
def _load_surface() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / _SURFACE_FILE).read_text(encoding="utf-8"))


def _reason(qualified: str, reasons: dict[str, str]) -> str | None:
    """The recorded reason ptodist lacks upstream's ``qualified`` name (its first matching pattern), or None."""
    from fnmatch import fnmatchcase

    return next((why for pattern, why in reasons.items() if fnmatchcase(qualified, pattern)), None)


def why_absent(module: str, name: str) -> str | None:
    """Why ptodist lacks ``name`` of upstream module ``module`` (``pypto.language``), or None when upstream's
    module does not export it either."""
    data = _load_surface()
    if name not in data["modules"].get(module, ()):
        return None
    return _reason(f"{module}.{name}", data["reasons"]) or "not yet in ptodist"


def _home_of(module: str):
    """Return ptodist's object for PyPTO module ``module``: the module itself, or a namespace attribute."""
    target = target_of(module)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError:
        # pl.tile, pl.tensor, pld.system... are namespaces of their parent, not modules
        parent, _, last = module.rpartition(".")
        return getattr(_home_of(parent), last, None)


def surface() -> list[tuple[str, list[str], dict[str, str | None]]]:
    """Compare upstream's exported names with ptodist's.

    Returns:
        One ``(module, names, absent)`` per upstream module: its sorted names, and each name
        ptodist lacks mapped to the recorded reason (``None`` where none is recorded).
    """
    data = _load_surface()
    reasons = data["reasons"]
    report = []
    for module, names in data["modules"].items():
        home = _home_of(module)
        absent: dict[str, str | None] = {}
        for name in names:
            if home is not None and hasattr(home, name):
                continue
            absent[name] = _reason(f"{module}.{name}", reasons)
        report.append((module, names, absent))
    return report


def _main(argv: list[str]) -> int:
    """``python -m ptodist.compat --surface | --missing``: print the exported-surface inventory."""
    if argv not in (["--surface"], ["--missing"]):
        print("usage: python -m ptodist.compat --surface | --missing\n"
              "  --surface  per PyPTO module, how many of its exported names ptodist has, and why each other is absent\n"
              "  --missing  only the absent names with no recorded reason (one module.name a line)", file=sys.stderr)
        return 2
    report = surface()
    if argv == ["--missing"]:
        for module, _names, absent in report:
            for name, why in absent.items():
                if why is None:
                    print(f"{module}.{name}")
        return 0
    have = total = 0
    for module, names, absent in report:
        have += len(names) - len(absent)
        total += len(names)
        print(f"{module}: {len(names) - len(absent)} / {len(names)} names")
        for name, why in absent.items():
            print(f"  absent {name}: {why or 'not yet in ptodist'}")
    print(f"total: {have} / {total} names")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
