"""`ptodist trace DIR --html FILE`: one self-contained HTML report, checked as text and in a real browser.

The browser test drives the system's Chromium (Debian's ``chromium`` package, /usr/bin/chromium) with
Playwright's Python API; Playwright's own browser downloads are not used. CI installs both (.ci/run).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import load_example, on_every_rank, ptodist_cli

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig
from ptodist.errors import HangError

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
NR = pl.dynamic("NR")


def config(out: Path, ids, **flags) -> RunConfig:
    return RunConfig(distributed_config=DistributedConfig(device_ids=list(ids)), output_dir=str(out),
                     enable_chip_swimlane=True, **flags)


def html_report(out: Path, report: Path, *args) -> subprocess.CompletedProcess:
    p = ptodist_cli("trace", out, "--html", report, *args)
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip().endswith(f"HTML report: {report} (one self-contained file: open it in any browser, "
                                      "offline)")
    assert p.stdout.startswith("ptodist trace: ")  # the terminal summary comes first, as without --html
    return p


# -- a 2-rank run that succeeds: examples/allreduce.py ------------------------------------------------------------

@pytest.fixture(scope="module")
def allreduce_report(tmp_path_factory):
    base = tmp_path_factory.mktemp("html_allreduce")
    x = np.random.default_rng(0).standard_normal((2, 1, 256)).astype(np.float32)
    y = load_example("allreduce").allreduce.compile(x, config=config(base / "out", [4, 7]))(x)
    np.testing.assert_allclose(y, np.broadcast_to(x.sum(axis=0, keepdims=True), y.shape), rtol=1e-5, atol=1e-5)
    report = base / "report.html"
    html_report(base / "out", report)
    return report, {0: 4, 1: 7}


# -- a 3-rank run that hangs: the last round's wait never comes ------------------------------------------------------

@pl.jit.incore
def ring(sig: pl.InOut[pld.DistributedTensor[[NR, 1], pl.INT32]]):
    ctx = pld.get_comm_ctx(sig)
    me, n = pld.rank(ctx), pld.nranks(ctx)
    for rnd in pl.range(2):
        pld.system.notify(sig, (me + 1) % n, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)
        pld.system.wait(sig, [(me + n - 1) % n, 0], rnd + 1 if rnd == 0 else 50, cmp=pld.WaitCmp.Ge)
    return sig


ring_host = on_every_rank(ring)


@pytest.fixture(scope="module")
def hang_report(tmp_path_factory):
    base = tmp_path_factory.mktemp("html_hang")
    x = np.zeros((3, 1), np.float32)
    with pytest.raises(HangError):
        ring_host.compile(x, config=config(base / "out", [0, 2, 5], hang_timeout_s=30))(x)
    report = base / "hang.html"
    html_report(base / "out", report, "--top", "3")
    return report, {0: 0, 1: 2, 2: 5}


# -- the file itself -----------------------------------------------------------------------------------------------

EXTERNAL = re.compile(r"""(?:src|href|action|xlink:href)\s*=\s*["']?(?!data:|#)[^"'\s>]*:|@import|url\((?!#)""", re.I)


def check_self_contained(text: str) -> None:
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert not re.search(r"https?://", text), "the report refers to the network"
    assert not EXTERNAL.search(text), EXTERNAL.search(text)
    assert "<script src" not in text and "<link rel=\"stylesheet\"" not in text


def test_the_report_is_one_self_contained_file(allreduce_report, hang_report):
    for report, devices in (allreduce_report, hang_report):
        text = report.read_text()
        check_self_contained(text)
        for r, d in devices.items():
            for section in ("rank-label", "rank"):
                assert f'<g class="{section}" data-rank="{r}">' in text
            assert f"rank {r} (device {d})" in text
        for section in ("findings", "ranks", "timeline-section", "matrix", "waits", "critical-path"):
            assert f'<section id="{section}">' in text


def test_the_report_of_a_good_run(allreduce_report):
    text = allreduce_report[0].read_text()
    assert "No error was recorded for this dispatch" in text
    # who waited on whom: every wait of the barrier was released by a notify of the rank named by its cell
    assert len(re.findall(r'<td data-waiter="\d" data-notifier="\d" style=', text)) == 4
    assert 'data-notifier="none" style=' not in text and 'data-notifier="pending" style=' not in text
    assert text.count('class="k-wait') == 4 and text.count('class="flow vec"') == 4
    assert text.count('<g class="cell"') == 4  # one counter row per signal cell: sig_buf[r,0] on rank o
    assert "sig_buf[1,0] on rank 0" in text and '<polyline class="critical vec"' in text


def test_the_report_of_a_hanging_run(hang_report):
    text = hang_report[0].read_text()
    assert "The dispatch ended with HangError (error)." in text
    assert '<div class="finding" data-kind="hang">' in text and "ranks 0, 1, 2" in text
    assert "fix:</b>" in text
    assert text.count('class="k-wait pending vec"') == 3  # every rank's wait that never came
    for r in range(3):
        assert f'<td data-waiter="{r}" data-notifier="pending" style=' in text
    assert text.count("still waiting when the run was stopped") == 3 + 3  # the waits table and the tooltips
    assert "Longest waits (3 of 6)" in text
    assert re.search(r"<tr data-rank=\"\d\"><td class=\"l\">rank \d \(device \d\)</td>(<td>[^<]*</td>){7}"
                     r"<td class=\"l\">stopped</td>", text)


def test_the_report_names_a_rank_without_records(tmp_path, hang_report):
    """A rank killed before it wrote its records still has its row (the merged trace names every rank)."""
    out = tmp_path / "copy"
    run = hang_report[0].parent / "out" / "dfx_outputs"
    import shutil

    shutil.copytree(run, out)
    shutil.rmtree(out / "rank1")
    from ptodist.dfx import html

    text = html.render(out)
    check_self_contained(text)
    assert '<g class="rank" data-rank="1">' in text and "rank 1 (device 2)" in text and ">no records<" in text


def test_trace_html_errors(tmp_path):
    p = ptodist_cli("trace", tmp_path, "--html", tmp_path / "r.html", timeout=60)
    assert p.returncode == 2 and "no DFX outputs" in p.stderr and not (tmp_path / "r.html").exists()


# -- in a real browser ---------------------------------------------------------------------------------------------

def _browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install -y chromium), "
                    "as .ci/run does")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is missing: pip install -e '.[dev]' (no `playwright install` "
                    "needed: the test uses /usr/bin/chromium)")
    return sync_playwright


@pytest.mark.parametrize("which", ["allreduce_report", "hang_report"])
def test_the_report_in_chromium(which, request):
    sync_playwright = _browser()
    report, devices = request.getfixturevalue(which)
    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(report.resolve().as_uri())
            page.wait_for_load_state("load")
            assert page.title().startswith("ptodist trace: ")
            for r, d in devices.items():
                label = page.locator(f'g.rank-label[data-rank="{r}"]')
                assert label.count() == 1 and label.is_visible()
                assert f"rank {r} (device {d})" in label.text_content()
                assert page.locator(f'g.rank[data-rank="{r}"] rect').count() > 1  # its background and its bars
                assert page.locator(f'#ranks tr[data-rank="{r}"]').is_visible()
                assert page.locator(f'#matrix tr[data-rank="{r}"]').is_visible()
            assert page.locator("#critical-path table tr").count() > 2
            if which == "hang_report":
                assert page.locator('#findings .finding[data-kind="hang"]').is_visible()
                assert page.locator("rect.pending").count() == len(devices)
            # the controls work without errors
            width = float(page.locator("#timeline").get_attribute("width"))
            page.click("#zoom-in")
            assert float(page.locator("#timeline").get_attribute("width")) > width
            assert page.locator("#zoom-level").inner_text() == "2x"
            # zoomed in and scrolled to the end, the plot has moved; the row labels have not
            label = page.locator(f'g.rank-label[data-rank="{max(devices)}"] text')
            before = label.bounding_box()
            for _ in range(3):
                page.click("#zoom-in")
            page.evaluate("document.getElementById('timeline-box').scrollLeft = 1e9")
            assert page.evaluate("document.getElementById('timeline-box').scrollLeft") > 0
            assert label.bounding_box() == before and label.is_visible()
            page.click("#show-critical")
            assert "hide-critical" in page.locator("#timeline").get_attribute("class")
            page.locator(f'#ranks tr[data-rank="{max(devices)}"]').click()
            assert page.locator("tr.selected").count() >= 3
        finally:
            browser.close()
    assert problems == []
    assert [u for u in requests if not u.startswith("file://")] == [], "the page asked the network for something"
    assert json.dumps(requests).count("file://") == 1  # the page itself, nothing else
