"""The HTML report's timeline (``ptodist trace DIR --html FILE``): a row for every signal cell that was waited on,
labels that zooming and scrolling never move out of view, notify→wait arrows drawn over everything."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest
from conftest import on_every_rank

import ptodist.language as pl
import ptodist.language.distributed as pld
from ptodist import DistributedConfig, RunConfig, shared_array
from ptodist.dfx import html
from ptodist.errors import HangError


@pl.jit.incore
def wrong_peer(sig: pl.InOut[pld.DistributedTensor[[pl.dynamic("NR"), 1], pl.INT32]]):
    me = pld.rank(pld.get_comm_ctx(sig))
    pld.system.notify(sig, 1 - me, [me, 0], 1, op=pld.NotifyOp.AtomicAdd)  # round 1: each notifies the other
    pld.system.wait(sig, [1 - me, 0], 1, cmp=pld.WaitCmp.Ge)
    if me == 1:
        pld.system.notify(sig, 1, [0, 0], 1, op=pld.NotifyOp.AtomicAdd)  # meant for rank 0: notifies itself
    else:
        pld.system.wait(sig, [0, 0], 1, cmp=pld.WaitCmp.Ge)  # so this cell of rank 0 is never notified
    return sig


wrong_peer_host = on_every_rank(wrong_peer)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("html") / "out"
    x = shared_array((2, 1), np.float32)
    cfg = RunConfig(distributed_config=DistributedConfig(device_ids=[0, 1]), output_dir=str(out),
                    enable_chip_swimlane=True, hang_timeout_s=30)
    with pytest.raises(HangError):  # a certain hang: rank 1 ended, rank 0 waits; found after 0.5 s of stillness
        wrong_peer_host.compile(x, config=cfg)(x)
    return html.render(out)


class Elements(HTMLParser):
    """Every element's tag, attributes and the ids of the elements around it."""

    VOID = {"meta", "link", "br", "input", "rect", "line", "circle", "polyline", "path"}

    def __init__(self, text: str):
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.found: list[tuple[str, dict, list[str]]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.found.append((tag, attrs, [i for _, i in self.stack if i]))
        if tag not in self.VOID:
            self.stack.append((tag, attrs.get("id")))

    def handle_startendtag(self, tag, attrs):
        self.found.append((tag, dict(attrs), [i for _, i in self.stack if i]))

    def handle_endtag(self, tag):
        while self.stack and tag not in self.VOID:
            if self.stack.pop()[0] == tag:
                break

    def with_class(self, name: str) -> list[tuple[dict, list[str]]]:
        return [(a, around) for _, a, around in self.found if name in (a.get("class") or "").split()]


def test_every_cell_waited_on_has_a_row_even_if_never_notified(report):
    cells = {a["data-cell"]: a["data-owner"] for a, _ in Elements(report).with_class("cell")}
    # round 1's cells, the cell rank 1 notified by mistake (its own), and the one rank 0 waited on in vain
    assert cells == {"sig_buf[0,0] on rank 1": "1", "sig_buf[1,0] on rank 0": "0", "sig_buf[0,0] on rank 0": "0"}
    label = report[report.index('<g class="cell-label" data-cell="sig_buf[0,0] on rank 0">'):]
    assert label[:label.index("</g>")].endswith('class="never">waited on, never notified</text>')
    assert report.count("waited on, never notified") == 1
    assert "<title>rank 0 waited here at " in report
    assert "Ge 1, still waiting at the stop (the cell held 0)</title>" in report


def test_the_labels_stay_outside_the_zoomed_and_scrolled_plot(report):
    found = Elements(report)
    for name in ("rank-label", "cell-label"):
        placed = found.with_class(name)
        assert placed and all("timeline-labels" in around and "timeline-box" not in around for _, around in placed)
    for name in ("rank", "cell", "flow", "critical"):
        assert all(around[-3:] == ["timeline-box", "timeline", "plot"] for _, around in found.with_class(name))
    (plot,) = [a for tag, a, _ in found.found if a.get("id") == "plot"]
    assert plot["transform"] == "translate(6,0)"  # zooming rescales x coordinates: no transform stretches the marks
    assert "plot.setAttribute('transform'" not in report and "scale(" not in report


def test_arrows_are_drawn_last_with_a_halo_and_fixed_heads(report):
    flows = [i for i in range(len(report)) if report.startswith('<line class="flow vec"', i)]
    assert len(flows) == 2  # round 1: each rank's wait, released by the other's notify
    assert report.count('<line class="flow-halo vec"') == 2
    assert min(flows) > report.rindex('class="k-') and min(flows) > report.index('class="critical vec"')
    assert min(flows) > report.rindex('<g class="cell"')
    assert ('<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" '
            'markerWidth="9" markerHeight="9"') in report
