"""The op table of ``docs/language.md``, generated from :data:`registry.REGISTRY`.

``python -m ptodist.language.ops.table`` prints it; ``--write`` replaces the part of ``docs/language.md``
between the ``<!-- op-table:begin -->`` and ``<!-- op-table:end -->`` markers with it (appending an
"Op catalog" section with the markers where the page has none); ``--check`` exits with status 1 when
that part is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .registry import FLOATS, INTS, NUMERIC, REGISTRY, SIGNED_INTS, OpDef, dtype_names

BEGIN = "<!-- op-table:begin -->"
END = "<!-- op-table:end -->"
DOCS_PAGE = Path(__file__).resolve().parents[4] / "docs" / "language.md"
REGENERATE = "python -m ptodist.language.ops.table --write"

# The family order of upstream's op catalog; a family not listed here follows them, by name.
FAMILIES = (
    "Creation",
    "Data movement",
    "Elementwise arithmetic",
    "Math",
    "Comparison and selection",
    "Activations",
    "Bitwise",
    "Reductions",
    "Broadcast and expand",
    "Shape and layout",
    "Linear algebra",
    "Gather, scatter, sort",
    "Block identity",
    "Cross-core transfer",
    "Tasks and dependencies",
    "Arrays",
    "Synchronization",
)


def spellings(d: OpDef) -> list[str]:
    """Every name op ``d`` is reached by, the shortest first (the same rules as ``ops.namespaces``)."""
    if "." in d.name:  # pl.array.create & co. live in their namespace only
        return [f"pl.{d.name}"]
    has_tile = "tile" in d.levels
    has_tensor = "tensor" in d.levels
    out = []
    if d.reach in ("pl", "pl(t)", "system") and (has_tile or has_tensor):
        out.append(f"pl.{d.name}")
    if has_tile:
        out.append(f"pl.tile.{d.name}")
    if has_tensor:
        out.append(f"pl.tensor.{d.name}")
    if d.reach == "system":
        out.append(f"pl.system.{d.name}")
    return out


def _family_key(family: str) -> tuple:
    return (FAMILIES.index(family), "") if family in FAMILIES else (len(FAMILIES), family)


def ordered() -> list[OpDef]:
    """The registered ops, grouped by family (catalog order), by name inside a family."""
    return sorted(REGISTRY.values(), key=lambda d: (_family_key(d.family), d.name))


# dtype rules that are one of the registry's groups are named by the group (the table's legend spells them out).
GROUPS = (("numeric", NUMERIC), ("floats", FLOATS), ("ints", INTS), ("signed ints", SIGNED_INTS))


def _dtypes(dtypes) -> str:
    for word, group in GROUPS:
        if dtypes is not None and set(dtypes) == set(group):
            return word
    return dtype_names(dtypes)


def _cell(text: str) -> str:
    # A bare "|" would end the table cell, also inside a code span.
    return text.replace("|", "\\|")


def _reach(d: OpDef) -> str:
    names = [f"`{s}`" for s in spellings(d)]
    if "." not in d.name and d.reach == "pl" and "tile" in d.levels and "tensor" in d.levels:
        names[0] += " (dispatch)"
    elif "." not in d.name and d.reach == "pl(t)" and "tile" in d.levels:
        names[0] += " (tile re-export)"
    return " · ".join(names)


def markdown() -> str:
    """The op table: one row per registered op, grouped by family."""
    legend = "; ".join(f"*{word}*: {dtype_names(group)}" for word, group in GROUPS)
    rows = [f"dtypes: the element types each tile argument may have ({legend}; *any*: no rule).", "",
            "| op | family | reached as | dtypes | description |", "|---|---|---|---|---|"]
    for d in ordered():
        rows.append(f"| `{d.name}` | {d.family} | {_reach(d)} | {_cell(_dtypes(d.dtypes))} | "
                    f"{_cell(d.doc) or '—'} |")
    return "\n".join(rows) + "\n"


def section(page_text: str) -> str | None:
    """The text between the op-table markers of ``page_text`` (without them), or None without markers."""
    start = page_text.find(BEGIN)
    end = page_text.find(END)
    if start < 0 or end < start:
        return None
    return page_text[start + len(BEGIN):end].strip("\n") + "\n"


def with_table(page_text: str) -> str:
    """``page_text`` with its op-table section replaced by :func:`markdown` (appended where it has none)."""
    block = f"{BEGIN}\n{markdown()}{END}"
    start = page_text.find(BEGIN)
    end = page_text.find(END)
    if start < 0 or end < start:
        return page_text.rstrip("\n") + f"\n\n## Op catalog\n\n{block}\n"
    return page_text[:start] + block + page_text[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ptodist.language.ops.table",
                                 description="Print the op table (Markdown), or write it into docs/language.md.")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"replace the op-table section of {DOCS_PAGE}")
    mode.add_argument("--check", action="store_true", help="exit with status 1 if that section is out of date")
    ap.add_argument("--page", type=Path, default=DOCS_PAGE, help="the page --write and --check read")
    args = ap.parse_args(argv)
    if not (args.write or args.check):
        sys.stdout.write(markdown())
        return 0
    if not args.page.is_file():
        print(f"{ap.prog}: no such page: {args.page}", file=sys.stderr)
        return 2
    text = args.page.read_text()
    if args.check:
        if section(text) == markdown():
            return 0
        print(f"{ap.prog}: the op table in {args.page} is out of date with the registry; regenerate it with: "
              f"{REGENERATE}", file=sys.stderr)
        return 1
    new = with_table(text)
    if new != text:
        args.page.write_text(new)
    print(f"{ap.prog}: {args.page}: {len(REGISTRY)} ops" + ("" if new != text else " (unchanged)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
