"""Values computed once per test session and shared by every xdist worker.

Some rules rest on an expensive run: a ``torchrun`` launch per model (conformance/test_tensor_parallel.py),
transformers' greedy oracle and each mode's generation of the real model (conformance/test_real_gemma3.py).
This is xdist's recipe for a session-wide value, and it holds under any ``-n`` and ``--dist``: the first
worker that needs the value computes it under a file lock in the session's shared temporary folder and
saves it there; the others wait for the lock and read the file. So that they rarely wait, the suite hands
each module that reads such values to one worker whole (conformance/scheduling.py).
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


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temporary folder that every xdist worker sees (each worker's own is below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def computed_once(tmp_path_factory: pytest.TempPathFactory, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s value, computed by one process of the session and read by the rest.

    Args:
        key: names the value within the session (any text; hashed into a file name).
        compute: returns something ``torch.save`` can write (tensors, lists, dicts, dataclasses).
    An exception of ``compute`` is raised in the process that ran it and saves nothing: the next process
    that needs the value runs it again.
    """
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = shared_folder(tmp_path_factory) / f"once-{name}.pt"
    if path not in _read:
        with FileLock(f"{path}.lock"):
            if path.exists():
                _read[path] = torch.load(path, weights_only=False)
            else:
                _read[path] = compute()
                torch.save(_read[path], f"{path}.partial")
                os.replace(f"{path}.partial", path)
    return _read[path]
