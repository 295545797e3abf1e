"""The suite against its second subject: ``pytest conformance --impl torch-native`` passes on this machine.

A rule only the reference can meet is a capability the peer does not declare (skipped with the reason) or
a finding about the peer (a strict xfail, ``findings`` in conformance/torch_native.py), never a red run.
This runs the suite against torch-native in a fresh process and asks for exit 0 and some rules passed: on
the CPU the fast subset (gpu and slow tests deselected: the slow ones time the tools, torchrun's process
groups and the CLIs, whose peer-specific parts the fast subset and the GPU run cover, and they would add
minutes to CI's 2 cores), or, where torch sees a GPU, everything but the device-memory tests (they must
have the device to themselves, which a run inside the suite cannot promise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.requires("components")  # once, under the reference: it starts the run of the peer itself
def test_the_suite_passes_against_torch_native(tmp_path):
    report = tmp_path / "torch-native.json"
    cmd = [sys.executable, "-m", "pytest", "conformance", "-q", "-p", "no:cacheprovider", "--impl", "torch-native",
           f"--ignore={Path(__file__).relative_to(REPO)}", "--ignore=conformance/test_faults.py",
           f"--conformance-report={report}"]  # fmt: skip
    if torch.cuda.is_available():
        cmd += ["-m", "not device_memory", "-n", "4"]
    else:
        cmd += ["-m", "not gpu and not slow", "-p", "no:xdist"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
    assert run.returncode == 0, f"pytest conformance --impl torch-native exited {run.returncode}:\n{tail}"
    rules = json.loads(report.read_text())["rules"]
    assert sum(rule.get("passed", 0) for rule in rules.values()) > 0, tail
