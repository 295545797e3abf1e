"""Faulty implementations the suite must reject: the reference with one realistic fault planted.

Each :class:`Fault` plants its fault with patches that are active while a test runs (the suite enters
``impl.activate()`` around every test), so it reaches the reference wherever the tests do: through the
implementation interface, the runner, the engine or the ops. A fault names the tests expected to catch it
(a ``-k`` expression over the suite; the whole suite when empty) and, where one exists, the public bug
report it imitates. ``python -m conformance.faults`` runs them (see ``__main__.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager
from unittest import mock

import torch

from conformance.implementation import ReferenceImplementation
from reference.compilation import backend as backend_module
from reference.compilation import compile_piece as compile_piece_module
from reference.compilation.counters import compilation_counter


@dataclass(frozen=True)
class Fault:
    """One planted fault.

    Attributes:
        id: short, unique, kebab-case; ``--impl fault:<id>`` selects it.
        kind: what breaks: ``compile``, ``split``, ``capture``, ``runner``, ``attention``, ``ops``,
            ``model``, ``sampling`` or ``config``.
        description: the fault in one sentence, as a bug report would state it.
        plant: returns the context manager (usually ``mock.patch``-es) that plants it.
        tests: ``-k`` expression of the tests expected to catch it ('' = the whole suite).
        device: ``cpu`` (visible on CPU, run in CI) or ``cuda`` (needs a GPU to show).
        bug: URL or name of the public report it imitates, if any.
    """

    id: str
    kind: str
    description: str
    plant: Callable[[], ContextManager]
    tests: str = ""
    device: str = "cpu"
    bug: str | None = None


class FaultImplementation(ReferenceImplementation):
    """The reference with ``fault`` planted while each test runs."""

    def __init__(self, fault: Fault):
        self.fault = fault
        self.name = f"fault:{fault.id}"

    def activate(self) -> ContextManager:
        return self.fault.plant()


def _patches(*patches) -> Callable[[], ContextManager]:
    """A plant function entering every patch (``mock.patch(...)`` objects, or factories of them)."""

    @contextlib.contextmanager
    def plant():
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch() if callable(patch) and not hasattr(patch, "__enter__") else patch)
            yield

    return plant


# ---------------------------------------------------------------------- compile
_real_compile_piece = compile_piece_module.compile_piece


def _inductor_despite_use_inductor_false(module, config):
    """Counts an eager compile, as the branch that decides would, but compiles with Inductor."""
    if config.use_inductor:
        return _real_compile_piece(module, config)
    compilation_counter.num_backend_compilations += 1
    compilation_counter.num_eager_compiles += 1
    return torch._inductor.standalone_compile(
        module, compile_piece_module.example_inputs(module), dynamic_shapes="from_graph", options={"config_patches": {}}
    )


FAULTS: list[Fault] = [
    Fault(
        id="use-inductor-ignored",
        kind="compile",
        description="use_inductor=False still compiles every piece with Inductor, while the counters say eager",
        plant=_patches(
            lambda: mock.patch.object(backend_module, "compile_piece", _inductor_despite_use_inductor_false)
        ),
        tests="compiles_nothing_with_inductor",
    ),
]


def fault_implementation(fault_id: str) -> FaultImplementation:
    """The implementation of fault ``fault_id``.

    Raises:
        ValueError: no fault has that id (the message lists them).
    """
    for fault in FAULTS:
        if fault.id == fault_id:
            return FaultImplementation(fault)
    raise ValueError(f"--impl fault:{fault_id}: no such fault; known: {[f.id for f in FAULTS]}")
