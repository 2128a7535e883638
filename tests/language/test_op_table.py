"""The op table in docs/language.md is generated from the registry, and stays so."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, child_env

import ptodist.language as pl
from ptodist.language.ops import table
from ptodist.language.ops.registry import REGISTRY

PAGE = REPO / "docs" / "language.md"


def rows() -> dict[str, list[str]]:
    """The table's rows by op name: the cells of each row."""
    out = {}
    for line in table.markdown().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0].strip("`")] = cells
    return out


def test_the_docs_section_is_the_generated_table():
    section = table.section(PAGE.read_text())
    assert section is not None, (f"docs/language.md has no {table.BEGIN} ... {table.END} section; "
                                 f"add it with: {table.REGENERATE}")
    assert section == table.markdown(), (f"the op table in docs/language.md is out of date with the registry; "
                                         f"regenerate it with: {table.REGENERATE}")


def test_the_docs_section_is_the_last_one_op_catalog():
    text = PAGE.read_text()
    assert text.count(table.BEGIN) == 1 and text.count(table.END) == 1
    assert text.rindex("\n## ") == text.index("\n## Op catalog\n")


def test_every_registered_op_has_one_row():
    got = rows()
    assert sorted(got) == sorted(REGISTRY)
    assert len(got) == sum(1 for line in table.markdown().splitlines() if line.startswith("| `"))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_row_says_family_dtypes_and_the_first_docstring_line(name):
    d = REGISTRY[name]
    _, family, reach, dtypes, doc = rows()[name]
    assert family == d.family
    assert doc == d.doc.replace("|", "\\|") and doc, f"{name}: give the op a one-line docstring"
    assert dtypes == table._dtypes(d.dtypes)
    for spelling in table.spellings(d):
        assert f"`{spelling}`" in reach


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_spelling_in_the_table_resolves(name):
    d = REGISTRY[name]
    for spelling in table.spellings(d):
        obj = pl
        for part in spelling.split(".")[1:]:
            obj = getattr(obj, part, None)
            assert obj is not None, f"{spelling} is in the op table but not in ptodist.language"
        assert callable(obj), spelling
        if spelling.startswith("pl.tile.") or spelling.startswith("pl.array."):
            assert obj is d.fn, f"{spelling} is not the registered tile-level definition"


def test_rows_are_grouped_by_family_in_catalog_order():
    families = [cells[1] for cells in rows().values()]
    unknown = sorted(set(families) - set(table.FAMILIES))
    assert not unknown, f"families not in upstream's catalog: {unknown} (ops/table.py FAMILIES lists them)"
    order = [table.FAMILIES.index(f) for f in families]
    assert order == sorted(order)
    for family in set(families):
        names = [n for n, cells in rows().items() if cells[1] == family]
        assert names == sorted(names), family


@pytest.mark.parametrize("d, expected", [
    (REGISTRY["add"], ["pl.add", "pl.tile.add", "pl.tensor.add"]),
    (REGISTRY["relu"], ["pl.relu", "pl.tile.relu"]),
    (REGISTRY["create_tensor"], ["pl.create_tensor", "pl.tensor.create_tensor"]),
    (REGISTRY["array.create"], ["pl.array.create"]),
    (REGISTRY["tpush_to_aiv"], ["pl.tpush_to_aiv", "pl.tile.tpush_to_aiv", "pl.system.tpush_to_aiv"]),
], ids=lambda v: v.name if hasattr(v, "name") else "")
def test_spellings_follow_reach_and_levels(d, expected):
    assert table.spellings(d) == expected


def test_write_appends_a_section_to_a_page_without_one_then_replaces_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nText.\n")
    assert table.main(["--write", "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Title\n\nText.\n\n## Op catalog\n\n" + table.BEGIN + "\n")
    assert table.section(text) == table.markdown()
    page.write_text(text.replace("| `add` |", "| `old` |") + "\nAfter.\n")
    assert table.main(["--write", "--page", str(page)]) == 0
    assert page.read_text() == text + "\nAfter.\n"


def test_check_says_whether_the_section_is_current(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("# Title\n")
    assert table.main(["--check", "--page", str(page)]) == 1
    assert capsys.readouterr().err == (f"python -m ptodist.language.ops.table: the op table in {page} is out of "
                                       f"date with the registry; regenerate it with: {table.REGENERATE}\n")
    assert table.main(["--write", "--page", str(page)]) == 0
    assert table.main(["--check", "--page", str(page)]) == 0


def test_write_refuses_a_missing_page(tmp_path, capsys):
    assert table.main(["--write", "--page", str(tmp_path / "none.md")]) == 2
    assert capsys.readouterr().err == (f"python -m ptodist.language.ops.table: no such page: "
                                       f"{tmp_path / 'none.md'}\n")


def test_the_module_prints_the_table():
    proc = subprocess.run([sys.executable, "-m", "ptodist.language.ops.table"], env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == table.markdown()
