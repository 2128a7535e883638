"""The README's tour program and its main command stay true."""

from __future__ import annotations

import re
import runpy

import pytest
from conftest import REPO, load_example


@pytest.mark.usefixtures("torch")  # the tour program uses torch
def test_readme_tour_program_runs(tmp_path):
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    script = tmp_path / "tour.py"
    script.write_text(blocks[0])
    runpy.run_path(str(script), run_name="__main__")  # ends with its own golden assert


def test_readme_main_job_runs(capsys):
    text = (REPO / "README.md").read_text()
    assert "ptodist run examples/allreduce.py -d 0,1,2,3" in text
    assert load_example("allreduce").main(["-d", "0,1,2,3"]) == 0
    assert "OK: allreduce over 4 ranks" in capsys.readouterr().out
