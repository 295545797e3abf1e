"""Shared pytest setup: the `gpu` marker skips without CUDA; compiled state is reset between tests.

``REFERENCE_REQUIRE_CUDA=1`` (set by ``tox -e gpu``) turns a missing CUDA device into an error at the
start of the run: on the GPU machine, a torch that cannot see the device (a CPU build picked up by
mistake, a hidden device) would otherwise skip every gpu test and still pass.

``REFERENCE_ALLOW_EMPTY_SELECTION=1`` (also set by ``tox -e gpu``, which runs the suite in two selections:
the device-memory tests apart) lets a run that selects no test pass, so a ``-k`` given to both may empty one.

The compile cache is off for every test (``REFERENCE_DISABLE_COMPILE_CACHE=1``, inherited by the processes
tests start): a test's counters and timings must be its own start's, not an entry another test or an
earlier run left. conformance/test_compile_cache.py turns it on, each test in a folder of its own.
"""

import logging
import os

import pytest
import torch

from hypothesis import Phase, settings

from conformance import cores

os.environ["REFERENCE_DISABLE_COMPILE_CACHE"] = "1"
# The fault catalogue's runs (conformance/faults/run.py) ask whether some test fails, not for the smallest
# example that fails: hypothesis's shrinking of a planted fault's first failure was most of those runs (22 s of
# row-handed-out-in-its-last-step's on a 2-core AMD EPYC). ``--hypothesis-profile=faults`` leaves it out, and
# keeps no example database: a fault's verdict must not hang on the examples that earlier runs (of other faults,
# or of the reference) saved; on CI's fresh clone there are none.
settings.register_profile(
    "faults", database=None, phases=[p for p in Phase if p not in (Phase.shrink, Phase.explain)]
)
cores.refuse_bad_counts("pytest")  # before anything imports Inductor; a conftest cannot raise UsageError yet
from conformance.report import IMPLEMENTATION, ConformanceReport
from conformance.selection import check_impl_tests_only, load_implementation


def pytest_addoption(parser):
    """The conformance suite's options (conformance/conftest.py uses them); here, so that a run without
    path arguments (testpaths) knows them too."""
    group = parser.getgroup("conformance", "the implementation under test (conformance/)")
    group.addoption(
        "--impl",
        default="reference",
        help="implementation to check: reference (default), torch-native, fault:ID or MODULE:FACTORY",
    )
    group.addoption(
        "--impl-tests-only",
        action="store_true",
        help="run only the tests that take the implementation under test (the impl fixture), and those with a "
        "finding about it; for an implementation that declares reached_only_through_impl (reference, "
        "torch-native), whose code the other tests never run, so a peer's run of them repeats the reference's",
    )
    group.addoption("--conformance-report", default=None, metavar="PATH", help="write the per-rule summary as JSON")
    group.addoption(
        "--conformance-table",
        action="store_true",
        help="print every rule's counts at the end (default: the rules that failed, and the totals)",
    )


def pytest_configure(config):
    # torch's structured-trace logger writes empty DEBUG records while Dynamo compiles, and pytest's capture
    # handlers end up on it, so every failure's report held a hundred blank log lines. Without TORCH_TRACE
    # (which asks for those records) nothing reads them: raise the logger's level past them.
    if not os.environ.get("TORCH_TRACE"):
        logging.getLogger("torch.__trace").setLevel(logging.CRITICAL)
    try:
        config.stash[IMPLEMENTATION] = load_implementation(config.getoption("impl"))
        if config.getoption("impl_tests_only"):
            check_impl_tests_only(config.stash[IMPLEMENTATION])
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    report = config.getoption("conformance_report")
    if report:  # checked now: a path found wrong at the end would lose the whole run's report
        if not os.path.isdir(os.path.dirname(os.path.abspath(report))):
            raise pytest.UsageError(f"--conformance-report {report}: its folder does not exist")
        if os.path.isdir(report):
            raise pytest.UsageError(f"--conformance-report {report}: is a folder; give a file path")
        try:
            open(report, "a").close()  # creates it if missing, changes nothing of an existing file
        except OSError as err:
            raise pytest.UsageError(f"--conformance-report {report}: cannot write it ({err.strerror or err})") from None
    config.pluginmanager.register(ConformanceReport(config), "conformance-report")
    # Under pytest-xdist every worker, and every process its tests start, would size itself for all of the
    # machine's cores; on CI's two cores two workers would run four busy threads. Each takes its share.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores.take_share(max(1, torch.get_num_threads() // workers))
    if os.environ.get("REFERENCE_REQUIRE_CUDA", "0") not in ("0", "") and not torch.cuda.is_available():
        raise pytest.UsageError(
            f"REFERENCE_REQUIRE_CUDA={os.environ['REFERENCE_REQUIRE_CUDA']} but torch {torch.__version__} "
            f"(from {os.path.dirname(torch.__file__)}, CUDA build: {torch.version.cuda}) sees no CUDA device; "
            "run on a GPU machine with a CUDA build of torch, or set REFERENCE_REQUIRE_CUDA=0 to let gpu tests skip"
        )


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; optional: a run without xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n`` (``--dist load``, or ``loadgroup``): conformance/scheduling.py's scheduling. Imported here:
    a run without xdist installed never calls this, and must not import xdist."""
    from conformance.scheduling import REPLACES, SharedRunScheduling

    return SharedRunScheduling(config, log) if config.getvalue("dist") in REPLACES else None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; run `tox -e gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and os.environ.get("REFERENCE_ALLOW_EMPTY_SELECTION") == "1":
        session.exitstatus = pytest.ExitCode.OK


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test traces its own models: Dynamo's caches must not carry compiled code between tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
