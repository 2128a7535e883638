"""The import layering of docs/architecture.md: every import points down, no circle crosses folders, and no
module-level cycle.

Every import of every ``ptodist`` module is read from the source, at module level and inside functions alike
(a lazy import runs up the layers as surely as any other, only later), with the parent packages an import also
runs.  What a lower layer needs from a higher one is handed in (a callable registered at import, a protocol
class it defines), not imported.  The package root ``ptodist`` is the public facade over every layer and is
left out: nothing inside imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "ptodist"

# Layers, bottom up: a module may import its own layer and the ones below, never one above.
LAYERS = [
    ("errors", "source", "context", "compat", "config", "rank_output", "backend", "commands"),
    ("language",),
    ("compiler", "collectives"),
    # check's analyses (findings, hang, hb; its session, explore, sits on top) and the status board ranks
    # publish and drivers read
    ("dfx", "check", "rank.status"),
    ("rank",),
    ("backends",),
    ("runtime", "ir"),
    ("check.explore", "testing", "cli", "__main__"),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p  # "" is the package root
    return mods


# Upward imports that stay, each with its reason (at most two: anything else moves to its room or is handed in).
ALLOWED_UP: dict[tuple[str, str], str] = {}


def _imports(name: str, path: Path, mods: dict, everywhere: bool) -> set[str]:
    """The ptodist modules ``name`` imports (at module level only, unless ``everywhere``), and the packages above
    each."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = [p for p in package if p]
    found = set()
    tree = ast.parse(path.read_text())
    if everywhere:
        body = list(ast.walk(tree))
    else:
        body = []
        for node in tree.body:
            body += node.body + [h for hh in node.handlers for h in hh.body] if isinstance(node, ast.Try) else [node]
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in mods else target)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found |= {n.removeprefix("ptodist").lstrip(".") for n in names if n.split(".")[0] == "ptodist"}
    out = set()
    for t in found:
        while t and t not in mods:
            t = t.rpartition(".")[0]
        parts = t.split(".")
        # Importing a.b.c runs a and a.b first; a package whose __init__ imports nothing cannot matter.
        out |= {".".join(parts[:i]) for i in range(1, len(parts))
                if _imports_anything(mods[".".join(parts[:i])])} | {t}
    return {t for t in out if t and t != name and not name.startswith(t + ".")}


def _imports_anything(path: Path) -> bool:
    """Whether a package's ``__init__`` imports any ptodist module at module level."""
    for n in ast.parse(path.read_text()).body:
        if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("ptodist")):
            return True
        if isinstance(n, ast.Import) and any(a.name.startswith("ptodist") for a in n.names):
            return True
    return False


def _layer(name: str) -> int:
    best, level = -1, None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    assert level is not None, f"module ptodist.{name} is in no layer of LAYERS: add it"
    return level


GRAPH = {name: _imports(name, path, _modules(), everywhere=False) for name, path in _modules().items() if name}
EVERY_IMPORT = {name: _imports(name, path, _modules(), everywhere=True) for name, path in _modules().items() if name}


@pytest.mark.parametrize("name", sorted(EVERY_IMPORT))
def test_a_module_imports_only_its_layer_and_the_ones_below(name):
    up = sorted(t for t in EVERY_IMPORT[name] if _layer(t) > _layer(name) and (name, t) not in ALLOWED_UP)
    assert not up, (f"ptodist.{name} (layer {_layer(name)}) imports {up} from a layer above (inside a function "
                    "counts too): move what it needs down, or have the layer above hand it in")


def test_the_allowed_upward_imports_are_few_and_still_needed():
    assert len(ALLOWED_UP) <= 2, "at most two upward imports may stay; move the rest to their rooms"
    for (name, target), reason in ALLOWED_UP.items():
        assert reason.strip(), f"ALLOWED_UP[{name!r}, {target!r}] gives no reason"
        assert target in EVERY_IMPORT.get(name, ()) and _layer(target) > _layer(name), \
            f"ptodist.{name} no longer imports ptodist.{target} from above: drop it from ALLOWED_UP"


def _folder(name: str) -> str:
    return name.split(".")[0]


def test_no_import_circle_crosses_folders():
    """Every import counted, the modules that reach each other (strongly connected) share one folder."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    crossing = []

    def connect(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(EVERY_IMPORT.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            circle = []
            while not circle or circle[-1] != v:
                circle.append(stack.pop())
            if len({_folder(m) for m in circle}) > 1:
                crossing.append(sorted(circle))

    for m in sorted(EVERY_IMPORT):
        if m not in index:
            connect(m)
    assert not crossing, "import circles across folders (every import counted): " + "; ".join(
        " <-> ".join(c) for c in crossing)


def test_no_module_level_import_cycle():
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(t):], t]))
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
