"""``--impl``: every spelling that cannot give an implementation is one line naming it, never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance import forked
from conformance.selection import load_implementation

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference


def _raises():
    raise RuntimeError("no GPU here")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("os:path", r"^--impl 'os:path': path in os is not callable \(a module\)"),  # was a pytest INTERNALERROR
        ("reference.config:MODES", r"^--impl 'reference.config:MODES': MODES in reference.config is not callable"),
        ("conformance.test_selection:_raises", r"^--impl .*_raises\(\) raised RuntimeError: no GPU here$"),
        ("no_such_module:Factory", r"^--impl 'no_such_module:Factory': cannot load Factory from no_such_module"),
        ("os:no_such_factory", r"^--impl 'os:no_such_factory': cannot load no_such_factory from os"),
        ("builtins:object", r"^--impl 'builtins:object': the object lacks \['name', 'capabilities'"),
        ("torch-native-typo", r"^--impl: expected 'reference', 'torch-native', 'fault:ID' or 'MODULE:FACTORY'"),
    ],
)
def test_an_impl_that_gives_no_implementation_is_one_line_naming_it(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        load_implementation(spec)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_pytest_refuses_such_an_impl_with_a_usage_error():
    cmd = [sys.executable, "-m", "pytest", "conformance/test_config.py", "-q", "-p", "no:cacheprovider"]
    cmd += ["--impl", "os:path"]
    proc = forked.run(cmd, cwd=REPO)
    assert proc.returncode == 4 and "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert "--impl 'os:path': path in os is not callable" in proc.stderr
