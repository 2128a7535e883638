"""The exported surface: every name upstream PyPTO exports is in ptodist, or absent for a recorded reason.

``NOT_YET`` lists the names ptodist still lacks without a reason (the work list). It may only shrink:
a name absent with neither a reason in ``src/ptodist/compat_surface.json`` nor an entry here fails the
test, and an entry whose name now exists is reported so the list gets trimmed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

NOT_YET = {
    "pypto.language": """
        MemRef PrefetchAsyncContext Ptr RUNTIME optimizations prefetch
    """,
    "pypto.language.tile": """
        gather_compare
    """,
    "pypto.language.tensor": """
        quant_mx
    """,
}


def _not_yet() -> set[str]:
    return {f"{module}.{name}" for module, names in NOT_YET.items() for name in names.split()}


def _run(flag: str) -> str:
    done = subprocess.run([sys.executable, "-m", "ptodist.compat", flag], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def test_every_absent_name_has_a_reason_or_is_not_yet():
    missing = set(_run("--missing").split())
    unexplained = sorted(missing - _not_yet())
    trimmed = sorted(_not_yet() - missing)
    if trimmed:
        warnings.warn(f"these names now exist in ptodist; delete them from NOT_YET in {__file__}: "
                      + " ".join(trimmed), stacklevel=1)
    assert not unexplained, (
        f"{len(unexplained)} upstream names are absent from ptodist with no reason: {' '.join(unexplained)}\n"
        f"add each to ptodist (or, if ptodist deliberately lacks it, a reason to src/ptodist/compat_surface.json)"
        + (f"\n(also, these NOT_YET names now exist: {' '.join(trimmed)})" if trimmed else ""))


def test_every_reason_still_explains_an_absent_name():
    """A reason whose names ptodist now has is stale: reported, so the table gets trimmed."""
    from fnmatch import fnmatchcase

    from ptodist import compat

    reasons = json.loads((Path(compat.__file__).parent / "compat_surface.json").read_text(encoding="utf-8"))["reasons"]
    absent = [f"{module}.{name}" for module, _names, missing in compat.surface() for name in missing]
    unused = [pattern for pattern in reasons if not any(fnmatchcase(q, pattern) for q in absent)]
    if unused:
        warnings.warn("these reasons in src/ptodist/compat_surface.json match no absent name any more; delete them: "
                      + " ".join(unused), stacklevel=1)
    assert len(unused) < len(reasons)


def test_surface_prints_the_figure_per_module_and_in_total():
    out = _run("--surface")
    lines = out.splitlines()
    assert lines[0].startswith("pypto.language: ") and lines[0].endswith(" names")
    assert "pypto.ir: " in out and "pypto.language.distributed.tensor: " in out
    # a deliberately absent name is listed with its reason
    assert ("  absent IRBuilder: an IR construction class; ptodist runs the program's Python functions "
            "and has no IR to build, visit or rewrite") in lines
    have, _, total = lines[-1].removeprefix("total: ").removesuffix(" names").partition(" / ")
    per_module = [line.rpartition(": ")[2].removesuffix(" names").split(" / ")
                  for line in lines if not line.startswith(" ") and not line.startswith("total")]
    assert int(have) == sum(int(h) for h, _ in per_module)
    assert int(total) == sum(int(t) for _, t in per_module)
    assert int(have) <= int(total)


def test_bad_arguments_print_the_usage():
    done = subprocess.run([sys.executable, "-m", "ptodist.compat"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python -m ptodist.compat --surface | --missing\n")
