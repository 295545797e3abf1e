"""The conformance suite's set-up: the implementation under test, capability skips, mode markers, the report.

* ``--impl NAME`` picks the implementation (conformance/implementation.py); every test that needs it takes
  the ``impl`` fixture, and ``impl.activate()`` is entered around every test.
* ``@pytest.mark.requires(capability, ...)``: skipped, with the reason, for an implementation without it.
  A config an implementation raises ``Unsupported`` for is a skip with its reason too.
* Mode markers ``eager``, ``no_inductor``, ``inductor``: a test parametrized with ``mode`` is marked with
  its value; other tests that run a mode carry the marker by hand. Under the reference every compiled
  model's mode is recorded, and a test that ran a mode it is not marked with errors at teardown, so
  ``-m no_inductor`` (and ``-k no_inductor``, which matches marker names) select exactly the tests that
  run it. A test id containing ``no_inductor`` without the marker is refused at collection.
* At the end: a per-rule summary (rule = test function) for the implementation, and with
  ``--conformance-report PATH`` the same as JSON.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
import torch

from conformance.implementation import CAPABILITIES, Unsupported
from conformance.selection import load_implementation
from reference.compilation.capture import CompiledModel
from reference.config import MODES

_IMPL = pytest.StashKey[object]()


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "the implementation under test (conformance/)")
    group.addoption(
        "--impl",
        default="reference",
        help="implementation to check: reference (default), torch-native, fault:ID or MODULE:FACTORY",
    )
    group.addoption("--conformance-report", default=None, metavar="PATH", help="write the per-rule summary as JSON")


def pytest_configure(config):
    try:
        config.stash[_IMPL] = load_implementation(config.getoption("impl"))
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    config.pluginmanager.register(ConformanceReport(config), "conformance-report")


def mode_of(config) -> str | None:
    """The model mode a compiled config runs (see reference.config.MODES); None for levels 1-2."""
    if config.level == 0:
        return "eager"
    if config.level == 3:
        return "inductor" if config.use_inductor else "no_inductor"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if params.get("mode") in MODES:
            item.add_marker(getattr(pytest.mark, params["mode"]))
        if "no_inductor" in item.nodeid.lower() and item.get_closest_marker("no_inductor") is None:
            raise pytest.UsageError(
                f"{item.nodeid}: its id says no_inductor but it is not marked no_inductor, so -k no_inductor would "
                "select a test that does not run the mode; rename it or mark it"
            )


@pytest.fixture(scope="session")
def impl(pytestconfig):
    """The implementation under test (``--impl``)."""
    return pytestconfig.stash[_IMPL]


@pytest.fixture(autouse=True)
def _implementation_under_test(request, monkeypatch):
    """Skip for missing capabilities; activate the implementation; check the modes the test ran."""
    impl = request.config.stash[_IMPL]
    for marker in request.node.iter_markers("requires"):
        missing = [c for c in marker.args if c not in impl.capabilities]
        if missing:
            pytest.skip(f"{impl.name} lacks {', '.join(missing)}: {'; '.join(CAPABILITIES[c] for c in missing)}")
    ran: set[str] = set()
    original_init = CompiledModel.__init__

    def recording_init(self, model, config, **kwargs):
        ran.add(mode_of(config))
        original_init(self, model, config, **kwargs)

    monkeypatch.setattr(CompiledModel, "__init__", recording_init)
    with impl.activate():
        yield
    unmarked = sorted(m for m in ran - {None} if request.node.get_closest_marker(m) is None)
    if unmarked:
        pytest.fail(
            f"this test ran mode(s) {unmarked} but is not marked with them: add @pytest.mark.<mode> (or a 'mode' "
            "parameter) so that -m/-k select every test of a mode",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    try:
        return (yield)
    except Unsupported as err:
        pytest.skip(f"{pyfuncitem.config.stash[_IMPL].name}: {err}")


def _rule(nodeid: str) -> str:
    """``module.py::test_name`` without its parameters: one rule of the suite."""
    return nodeid.split("[", 1)[0].removeprefix("conformance/")


class ConformanceReport:
    """Collects every test's outcome (on the xdist controller too) and prints / writes the per-rule table."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = report.outcome
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes[report.nodeid] = "failed"

    def pytest_terminal_summary(self, terminalreporter):
        if not self.outcomes or hasattr(self.config, "workerinput"):
            return
        impl = self.config.stash[_IMPL]
        rules: dict[str, Counter] = defaultdict(Counter)
        for nodeid, outcome in self.outcomes.items():
            rules[_rule(nodeid)][outcome] += 1
        terminalreporter.section(f"conformance: {impl.name}, per rule (passed / failed / skipped)")
        for rule in sorted(rules):
            c = rules[rule]
            terminalreporter.write_line(f"{c['passed']:4d} {c['failed']:4d} {c['skipped']:4d}  {rule}")
        path = self.config.getoption("conformance_report")
        if path:
            doc = {
                "implementation": impl.name,
                "capabilities": sorted(impl.capabilities),
                "torch": torch.__version__,
                "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "rules": {rule: dict(rules[rule]) for rule in sorted(rules)},
                "tests": dict(sorted(self.outcomes.items())),
            }
            with open(path, "w") as f:
                json.dump(doc, f, indent=2)
            terminalreporter.write_line(f"conformance report: {path}")
