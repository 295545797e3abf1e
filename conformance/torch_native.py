"""``--impl torch-native``: torch's own piecewise CUDA graphs, as a second subject of the suite.

The compile function is :func:`reference.peers.compile_torch_native` (its module doc says how a config
maps onto Inductor's graph partition and CUDA graph trees, and what is :class:`Unsupported`); the
benchmark CLI's ``torch-native`` baseline runs the same one.

What torch does not have, the adapter does not declare (see ``capabilities``): the project's counters,
split pieces to inspect, address checks, tracing once for every size (torch recompiles under guards).
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from torch import nn

from reference.config import CompilationConfig
from reference.compilation.replays import ReplayTally
from reference.peers import compile_torch_native
from reference.peers.torch_native import graph_tree_replays


class TorchNativeImplementation:
    name = "torch-native"
    capabilities = frozenset({"levels", "replays"})
    reached_only_through_impl = True
    # What the suite found torch to break (README, "torch-native"): strict xfails.
    findings = {
        "test_structure.py::test_an_unregistered_splitting_op_is_refused_when_the_model_is_compiled": (
            f"torch {torch.__version__}: an unknown op name in custom_should_partition_ops is ignored without a word"
        ),
    }

    def compile(self, model: nn.Module, config: CompilationConfig) -> Callable:
        return compile_torch_native(model, config)

    def activate(self) -> ContextManager:
        return contextlib.nullcontext()

    def replay_probe(self) -> ContextManager[ReplayTally]:
        return graph_tree_replays()
