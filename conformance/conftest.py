"""The conformance suite's set-up: the implementation under test, capability skips, mode markers.

* ``--impl NAME`` (registered in the root conftest.py) picks the implementation (conformance/implementation.py);
  every test that needs it takes the ``impl`` fixture, and ``impl.activate()`` is entered around every test.
  ``--impl-tests-only`` deselects the tests that neither take it nor carry a finding about it: for an
  implementation that declares ``reached_only_through_impl`` (its ``activate()`` changes nothing), they run
  the reference's code under any ``--impl``, so a peer's run of them repeats the reference's run.
* ``@pytest.mark.requires(capability, ...)``: skipped, with the reason, for an implementation without it.
  A config an implementation raises ``Unsupported`` for is a skip with its reason too.
* Mode markers (``eager``, ``breakable``, ``no_inductor``, ``inductor``, ``no_inductor_full``,
  ``inductor_full``): a test parametrized with ``mode`` is marked with its value, and a full-graph mode's
  test with its base mode's too (``no_inductor_full`` runs no_inductor's pieces, so ``-m no_inductor``
  selects it); other tests that run a mode carry the marker by hand. Under the reference every compiled
  model's mode is recorded, and a test that ran a mode it is not marked with errors at teardown, so
  ``-m no_inductor`` (and ``-k no_inductor``, which matches marker names) select exactly the tests that
  run it. A test id containing ``no_inductor`` without the marker is refused at collection.
* Order: the long units of work (conformance/work_units.py) first, then the other ``slow`` tests, then the
  rest, each group in collection order: xdist hands tests out in this order.
* At the end: a per-rule summary (conformance/report.py, registered by the root conftest.py so that the
  xdist controller has it too).
"""

from __future__ import annotations

import pytest

from conformance.implementation import CAPABILITIES, Unsupported
from conformance.report import IMPLEMENTATION, rule_of
from conformance.work_units import is_long, scope_of
from reference.compilation.capture import CompiledModel
from reference.config import BASE_MODE, MODES, mode_of


def pytest_collection_modifyitems(config, items):
    findings = getattr(config.stash[IMPLEMENTATION], "findings", {})
    for item in items:
        reason = findings.get(rule_of(item.nodeid))
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if params.get("mode") in MODES:
            item.add_marker(getattr(pytest.mark, params["mode"]))
            if params["mode"] in BASE_MODE:
                item.add_marker(getattr(pytest.mark, BASE_MODE[params["mode"]]))
        if "no_inductor" in item.nodeid.lower() and item.get_closest_marker("no_inductor") is None:
            raise pytest.UsageError(
                f"{item.nodeid}: its id says no_inductor but it is not marked no_inductor, so -k no_inductor would "
                "select a test that does not run the mode; rename it or mark it"
            )
    if config.getoption("impl_tests_only"):  # before the shard plugin (trylast) splits what is left
        kept = [
            "impl" in getattr(item, "fixturenames", ()) or rule_of(item.nodeid) in findings for item in items
        ]  # fmt: skip
        config.hook.pytest_deselected(items=[item for item, keep in zip(items, kept) if not keep])
        items[:] = [item for item, keep in zip(items, kept) if keep]
    # The long units first, then the other slow tests (a stable sort keeps the rest in order): xdist hands tests
    # out in this order, and a two-minute test handed out last would run alone at the end while the others idle.
    items.sort(key=lambda item: (not is_long(scope_of(item.nodeid)), item.get_closest_marker("slow") is None))


@pytest.fixture(scope="session")
def impl(pytestconfig):
    """The implementation under test (``--impl``)."""
    return pytestconfig.stash[IMPLEMENTATION]


@pytest.fixture(autouse=True)
def _implementation_under_test(request, monkeypatch):
    """Skip for missing capabilities; activate the implementation; check the modes the test ran."""
    impl = request.config.stash[IMPLEMENTATION]
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
        pytest.skip(f"{pyfuncitem.config.stash[IMPLEMENTATION].name}: {err}")
