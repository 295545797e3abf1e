"""Shared pytest setup: the `gpu` marker skips without CUDA; compiled state is reset between tests."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; run `tox -e gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test traces its own models: Dynamo's caches must not carry compiled code between tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
