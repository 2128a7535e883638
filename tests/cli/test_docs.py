"""The docs stay true: links resolve, and the code blocks that say so run (and fail) as shown.

Python blocks in ``docs/*.md`` are executed when their first line is a marker:

* ``# runnable``: a complete program; it must run without error.
* ``# preamble``: run before every other marked block of the same page, as ``preamble.py``.
* ``# raises: NAME`` / ``# warns: NAME``: must raise exception ``NAME`` (``RankError(X)``: a
  ``RankError`` whose ``original`` is an ``X``) or emit warning ``NAME``; the ```` ```text ```` block
  that follows holds the message as ``NAME: str(error)``, which must match.

Each block runs as ``prog.py`` in a fresh directory, so the file names and line numbers in messages
are those of the block itself.
"""

from __future__ import annotations

import linecache
import re
import runpy
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
MARKERS = ("# runnable", "# raises:", "# warns:")


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """Return the fenced blocks of ``page`` as (language, body, line number of the fence)."""
    text = page.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


# -- links ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_at_existing_files_and_headings(page):
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))  # code is not links
    assert DOCS, "docs/ has no pages"
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not bad, "\n".join(bad)


# -- code blocks ----------------------------------------------------------------------------------

def marked_blocks():
    out = []
    for page in DOCS:
        found = blocks(page)
        for i, (lang, body, line) in enumerate(found):
            if lang == "python" and body.startswith(MARKERS):
                expected = None
                if body.startswith(("# raises:", "# warns:")):
                    nxt = found[i + 1] if i + 1 < len(found) else ("", "", 0)
                    assert nxt[0] == "text", f"{page.name}:{line}: a ```text block must follow"
                    expected = nxt[1].rstrip("\n")
                out.append(pytest.param(page, body, expected, id=f"{page.name}:{line}"))
    return out


def preamble(page: Path) -> str | None:
    return next((b for lang, b, _ in blocks(page) if lang == "python" and b.startswith("# preamble")), None)


def run_block(page: Path, body: str, directory: Path, monkeypatch) -> None:
    monkeypatch.chdir(directory)
    linecache.clearcache()  # every block is "prog.py": never show a previous block's lines
    namespace: dict = {}
    pre = preamble(page)
    if pre is not None:
        (directory / "preamble.py").write_text(pre)
        namespace = runpy.run_path("preamble.py")
    (directory / "prog.py").write_text(body)
    runpy.run_path("prog.py", init_globals=namespace, run_name="__main__")


def normalise(message: str) -> str:
    # Timings vary, and how many ranks fail alike within the grace period can too.
    message = re.sub(r"\d+\.\d+", "#", message)
    return re.sub(r"(rank \d+ \(device \d+\))(, rank \d+ \(device \d+\))+", r"\1", message)


def test_there_are_marked_blocks():
    assert len(marked_blocks()) >= 10


@pytest.mark.parametrize("page, body, expected", marked_blocks())
def test_doc_block(page, body, expected, tmp_path, monkeypatch):
    marker = body.splitlines()[0]
    if marker.startswith("# runnable"):
        run_block(page, body, tmp_path, monkeypatch)
        return
    kind, want = (s.strip() for s in marker[2:].split(":", 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "warns":
            run_block(page, body, tmp_path, monkeypatch)
            got = [w for w in caught if w.category.__name__ == want]
            assert got, f"no {want} was emitted"
            message = f"{want}: {got[0].message}"
        else:
            with pytest.raises(Exception) as info:
                run_block(page, body, tmp_path, monkeypatch)
            e = info.value
            name = type(e).__name__
            if name == "RankError":
                name = f"RankError({type(e.original).__name__})"
            assert name == want, f"raised {name}: {e}"
            message = f"{type(e).__name__}: {e}"
    if "--- traceback" not in expected:
        message = message.split("\n--- traceback")[0]
    assert normalise(message) == normalise(expected)


# -- the runnable examples, checked and traced ----------------------------------------------------

def dispatching_blocks():
    """The runnable blocks that dispatch a distributed program (the rest are plain Python)."""
    return [p for p in marked_blocks() if p.values[1].startswith("# runnable") and "pld.world_size()" in p.values[1]]


def test_there_are_dispatching_blocks():
    assert len(dispatching_blocks()) >= 5


@pytest.mark.parametrize("page, body, expected", dispatching_blocks())
def test_runnable_block_passes_ptodist_check(page, body, expected, tmp_path, monkeypatch):
    from ptodist.check import explore

    outcome = explore.run_checked(lambda: run_block(page, body, tmp_path, monkeypatch), seed=0)
    assert outcome.session.dispatches, "the example made no dispatch"
    assert not outcome.failed, "\n".join([outcome.traceback, *(f.render() for f in outcome.findings)])


@pytest.mark.parametrize("page, body, expected", dispatching_blocks())
def test_runnable_block_runs_with_every_diagnostic_output_on(page, body, expected, tmp_path, monkeypatch):
    from ptodist import RunConfig

    init = RunConfig.__init__

    def all_on(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.enable_chip_swimlane = self.enable_dep_gen = self.enable_scope_stats = True

    monkeypatch.setattr(RunConfig, "__init__", all_on)
    run_block(page, body, tmp_path, monkeypatch)
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"chip_swimlane_records.json", "deps.json", "scope_stats.jsonl"} <= written, sorted(written)
