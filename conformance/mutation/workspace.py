"""A module's own mutmut directory: ``build/mutate/MODULE/``, with its own ``pyproject.toml`` and state.

mutmut reads its settings from ``[tool.mutmut]`` of the ``pyproject.toml`` in its working directory and keeps
its mutants and results in ``mutants/`` under it, one set per directory. Each module therefore gets a
directory of its own: links to the repository's package, tests and fixtures, and a ``pyproject.toml`` that is
the repository's (pytest reads its options from the copy mutmut makes) with the module's ``[tool.mutmut]``
table appended. Runs of two modules never share state, and a module's run can be resumed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conformance.mutation.modules import MODULES

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "mutate"
# what the tests need besides the package: mutmut copies these into its mutants/ directory (perf/: the results
# files and benchmarks the report's tests read and run; README.md: the CLI tests read its flag table)
LINKED = ("reference", "conformance", "conftest.py", "fixtures", "perf", "README.md")


def mutmut_settings(name: str) -> dict[str, object]:
    """The ``[tool.mutmut]`` settings of module ``name``."""
    module = MODULES[name]
    return {
        "source_paths": ["reference"],
        "only_mutate": list(module.sources),
        "also_copy": [path for path in LINKED if path != "reference"],
        "pytest_add_cli_args_test_selection": list(module.tests),
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
        # torch is not fork-safe once its thread pools ran: fork each mutant from a server that only collected
        "process_isolation": "forkserver",
        # the directory is not the repository's root; a fresh run needs no change detection
        "use_git_change_detection": False,
    }


def prepare(name: str, *, fresh: bool) -> Path:
    """Make (``fresh``: remake, dropping earlier results) module ``name``'s directory and return it."""
    work = WORK / name
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    for path in LINKED:
        link = work / path
        if not link.is_symlink():
            link.symlink_to(ROOT / path)
    # JSON strings, lists and booleans are TOML values too
    table = "".join(f"{key} = {json.dumps(value)}\n" for key, value in mutmut_settings(name).items())
    project = (ROOT / "pyproject.toml").read_text()
    (work / "pyproject.toml").write_text(f"{project}\n[tool.mutmut]\n{table}")
    return work
