"""What the mode markers' descriptions (pyproject.toml) promise about selecting tests holds.

``-m MODE`` selects the tests that run a mode (the suite checks each test ran only the modes it is marked
with). Where a marker's description also promises that ``-k MODE`` selects the same tests, the two
selections must be equal: a user choosing either gets the same run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conformance import forked

from reference.config import MODES

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference


def _descriptions(pytestconfig) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in pytestconfig.getini("markers") if ": " in line)


def _promises_k(description: str, mode: str) -> bool:
    return bool(re.search(rf"-m {mode} and -k {mode} select|-m / -k {mode} select", description))


def _selected(*selection: str) -> set[str]:
    # a collection runs no assert: nothing for pytest to rewrite
    cmd = [sys.executable, "-m", "pytest", "conformance", "--collect-only", "-q", "-p", "no:cacheprovider",
           "--assert=plain", *selection]  # fmt: skip
    proc = forked.run(cmd, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    return {line for line in out.splitlines() if "::" in line}


@pytest.mark.slow
# ids with hyphens: an id naming a mode would be selected by -k itself
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.replace("_", "-"))
def test_a_marker_that_promises_k_selects_what_m_selects(mode, pytestconfig):
    if not _promises_k(_descriptions(pytestconfig)[mode], mode):
        pytest.skip(f"the {mode} marker promises nothing of -k")
    by_marker, by_keyword = _selected("-m", mode), _selected("-k", mode)
    assert by_marker and by_marker == by_keyword, sorted(by_marker ^ by_keyword)[:10]


def test_the_inductor_free_mode_keeps_the_promise(pytestconfig):
    """The promise that matters most (README: the tests that run eager FX code + CUDA graphs) stays made."""
    mode = "no_" + "inductor"  # spelled so that this test's own name does not say it
    assert _promises_k(_descriptions(pytestconfig)[mode], mode)
