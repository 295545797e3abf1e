"""What a fault is: an id, a kind, the patches that plant it, the tests expected to catch it.

A fault is planted with ``unittest.mock.patch`` on the reference's own modules, patched where the
reference looks the name up (``reference.compilation.backend.compile_piece``, not the function's home
module), and is active only while a test runs: :class:`FaultImplementation` is the reference whose
``activate()`` (entered by the suite around every test) enters the patches.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager

from conformance.implementation import ReferenceImplementation

KINDS = {
    "compile": "a piece is compiled other than the config says",
    "capture": "Dynamo capture or CUDA-graph capture and replay",
    "split": "the graph is cut at the wrong places",
    "config": "a setting is resolved wrongly",
    "runner": "static buffers, padding, slot mapping or the gather of the outputs",
    "attention": "the attention op: masks, heads, cache rows",
    "ops": "a custom op or its native form",
    "model": "a model's own arithmetic",
    "sampling": "the sampler or the request's generator",
    "engine": "the engine's scheduling of requests: rows, contexts, stopping",
    "parallel": "tensor parallelism: how weights are sharded and the collectives that join the shards",
    "cache": "the compile cache: the factors of its key, and how its entries are written and read",
}


@dataclass(frozen=True)
class Fault:
    """One planted fault.

    Attributes:
        id: short, unique, kebab-case; ``--impl fault:<id>`` selects it.
        kind: what breaks, a key of ``KINDS``.
        description: what the fault breaks, in one sentence, as a bug report would state it.
        plant: returns the context manager (usually ``mock.patch``-es) that plants it.
        tests: ``-k`` expression of the tests expected to catch it, narrow enough to run in seconds.
        device: ``cpu`` (visible on CPU, run in CI) or ``cuda`` (needs a GPU to show: only gpu-marked
            tests can catch it).
        bug: URL or name of the public report it imitates, if any.
        alone: its tests measure the whole device (free memory from ``torch.cuda.mem_get_info``), so it runs
            after the others, with no other fault's process on the GPU.
    """

    id: str
    kind: str
    description: str
    plant: Callable[[], ContextManager]
    tests: str
    device: str = "cpu"
    bug: str | None = None
    alone: bool = False


class FaultImplementation(ReferenceImplementation):
    """The reference with ``fault`` planted while each test runs."""

    reached_only_through_impl = False  # the plant reaches every test, with or without the impl fixture

    def __init__(self, fault: Fault):
        self.fault = fault
        self.name = f"fault:{fault.id}"

    def activate(self) -> ContextManager:
        return self.fault.plant()


def patches(*planted: ContextManager) -> Callable[[], ContextManager]:
    """A plant entering every patch given (``mock.patch`` objects, reusable one activation after another)."""

    @contextlib.contextmanager
    def plant():
        with contextlib.ExitStack() as stack:
            for patch in planted:
                stack.enter_context(patch)
            yield

    return plant
