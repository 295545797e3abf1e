"""Values computed once per test session and shared by every xdist worker.

Some rules rest on an expensive run: a ``torchrun`` launch per model (conformance/test_tensor_parallel.py),
transformers' greedy oracle and each mode's generation of the real model (conformance/test_real_gemma3.py).
This is xdist's recipe for a session-wide value, and it holds under any ``-n`` and ``--dist``: the first
worker that needs the value computes it under a file lock in the session's shared temporary folder and
saves it there; the others wait for the lock and read the file. So that they rarely wait, the suite hands
the tests that read one value to one worker together (conformance/work_units.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from filelock import FileLock

_read: dict[Path, Any] = {}  # this process's copies of what it computed or read


def shared_folder(request: pytest.FixtureRequest) -> Path:
    """The session's temporary folder that every xdist worker of it sees (each worker's own is below it).
    A worker is told by its ``workerinput`` (xdist's recipe), never by the environment: a pytest run that a
    test starts inherits ``PYTEST_XDIST_WORKER`` without being a worker, and the folder above its own is
    shared by every session of the user."""
    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


def saved_file(request: pytest.FixtureRequest, key: str) -> Path:
    """Where ``computed_once`` keeps ``key``'s value (``once-<sha256 of key, 16 hex>.pt`` in the shared folder);
    its partial write, before the rename, is the same name with the suffix ``.partial``."""
    return shared_folder(request) / f"once-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


def computed_once(request: pytest.FixtureRequest, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s value, computed by one process of the session and read by the rest.

    Args:
        request: any test's or fixture's ``request`` (it names the session).
        key: names the value within the session (any text; hashed into a file name).
        compute: returns something ``torch.save`` can write (tensors, lists, dicts, dataclasses).
    An exception of ``compute`` or of saving its value is raised in the process that ran it and keeps
    nothing: the next process that needs the value runs ``compute`` again.
    """
    path = saved_file(request, key)
    if path not in _read:
        with FileLock(f"{path}.lock"):
            if path.exists():
                _read[path] = torch.load(path, weights_only=False)
            else:
                value = compute()
                partial = path.with_suffix(".partial")
                try:
                    torch.save(value, partial)
                    os.replace(partial, path)
                finally:
                    partial.unlink(missing_ok=True)
                _read[path] = value
    return _read[path]
