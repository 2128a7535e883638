"""Rooms sized to one job: no module over 700 lines, no class over 400, a rank context of few parts, every
module on docs/architecture.md's map, and no backend named outside ``backends/`` and ``config.py``.

The limits are the house's, read from the source: a module that outgrows them is split by concern (see
docs/architecture.md, Module layout), not exempted here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "ptodist"
MODULES = sorted(SRC.rglob("*.py"))
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 400
MAX_CONTEXT_ATTRIBUTES = 25


def _rel(p: Path) -> str:
    return p.relative_to(SRC).as_posix()


def _classes():
    for p in MODULES:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                yield p, node


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_a_module_is_at_most_700_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_rel(path)} has {lines} lines: split it by concern"


def test_no_class_is_over_400_lines():
    big = [f"{_rel(p)}:{c.lineno} {c.name} ({c.end_lineno - c.lineno + 1} lines)" for p, c in _classes()
           if c.end_lineno - c.lineno + 1 > MAX_CLASS_LINES]
    assert not big, big


def test_the_rank_context_sets_at_most_25_attributes_in_init():
    tree = ast.parse((SRC / "rank" / "context.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RankContext")
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    attrs = {t.attr for n in ast.walk(init) for t in ([n] if isinstance(n, ast.Attribute) else [])
             if isinstance(t.ctx, ast.Store) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert len(attrs) <= MAX_CONTEXT_ATTRIBUTES, sorted(attrs)


def test_every_module_is_on_the_architecture_map():
    text = (REPO / "docs" / "architecture.md").read_text()
    layout = text.split("## Module layout", 1)[1].split("\n## ", 1)[0]
    # The map is an indented tree: a folder line ("  rank/") opens a folder; a file line names one module or
    # several ("elementwise.py compare.py ..."); a package's __init__ is described by its folder's line.
    listed, folders = set(), []
    for line in layout.split("```")[1].splitlines()[1:]:
        m = re.match(r"( *)(\S+)", line)
        if not m or not re.fullmatch(r"\w+(\.py|/)", m.group(2)):
            continue  # a description's continuation line
        folders = folders[:(len(m.group(1)) - 2) // 2]
        if m.group(2).endswith("/"):
            folders.append(m.group(2).rstrip("/"))
            continue
        for name in re.match(r"((?:\w+\.py ?)+)", line.strip()).group(1).split():
            listed.add("/".join([*folders, name]))
    missing = [_rel(p) for p in MODULES if p.name != "__init__.py" and _rel(p) not in listed]
    assert not missing, f"modules missing from docs/architecture.md's Module layout: {missing}"


def test_no_backend_is_named_outside_backends_and_config():
    # Callers ask a backend's capabilities (backends.capabilities_for), never its name.
    names = re.compile(r"""["'](shm|sim|mpi)["']""")
    found = []
    for p in MODULES:
        rel = _rel(p)
        if rel.startswith("backends/") or rel == "config.py":
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if names.search(line.split("#", 1)[0]):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, found
