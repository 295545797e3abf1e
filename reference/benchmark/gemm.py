"""A model's decode GEMMs and how to time one as the model meets it: the weight shapes, and a CUDA graph over
enough distinct weights that each is read from memory, not from L2 (perf/NOTES.md, "Small-M GEMMs").

Used by ``python -m reference.tune_gemm`` (the small-M kernel's configs) and ``perf/test_gemm_latency.py``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from reference.compilation.cuda_graph import collection_paused
from reference.models import registry
from reference.models.llama import head_dim

MAX_COPIES = 256  # a tiny preset's weights would need thousands of copies to pass L2; their GEMMs are launch-bound


@dataclass(frozen=True)
class GemmShape:
    """One GEMM of a decoder: ``name`` (qkv, o, gate_up, down, lm_head), its weight [n, k], or [2n, k] with gate
    and up rows where ``gated`` (gate_up, whose gated activation halves the output); and how the model calls
    the small-M kernel for it with every GEMM fusion on (reference.ops.fused_linear): ``norm``, the RMSNorm
    prologue (qkv, gate_up), and ``epilogue`` (``'residual'`` for o and down, the gated activation for gate_up).
    The LM head has neither: it stays on cuBLAS."""

    name: str
    n: int
    k: int
    gated: bool = False
    norm: bool = False
    epilogue: str = "none"

    @property
    def weight_rows(self) -> int:
        return 2 * self.n if self.gated else self.n

    @property
    def fused(self) -> bool:
        """Whether the model runs this GEMM on the small-M kernel (with the fusions on)."""
        return self.norm or self.epilogue != "none"


def decode_gemms(model: str) -> list[GemmShape]:
    """The GEMMs of one decode step of ``model`` (a preset, pretrained name or checkpoint): per layer qkv, o,
    gate_up and down, and the LM head, with one rank's whole weights.

    Raises:
        ValueError: an unknown model (:func:`reference.models.registry.model_config`).
    """
    config = registry.model_config(model)
    hidden, d = config.hidden_size, head_dim(config)
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    activation = "gelu_tanh_and_mul" if "gemma" in config.model_type else "silu_and_mul"
    return [
        GemmShape("qkv", q + 2 * kv, hidden, norm=True),
        GemmShape("o", hidden, q, epilogue="residual"),
        GemmShape("gate_up", config.intermediate_size, hidden, gated=True, norm=True, epilogue=activation),
        GemmShape("down", hidden, config.intermediate_size, epilogue="residual"),
        GemmShape("lm_head", config.vocab_size, hidden),
    ]


def weight_copies(weight_bytes: int, device: torch.device) -> int:
    """How many distinct weights of ``weight_bytes`` a timed graph cycles through so that together they pass 4x
    the device's L2 cache (at least 2, at most ``MAX_COPIES``); 2 on a CPU."""
    if device.type != "cuda":
        return 2
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return min(MAX_COPIES, max(2, math.ceil(4 * l2 / weight_bytes)))


def captured(run: Callable[[], None], device: torch.device) -> torch.cuda.CUDAGraph:
    """``run`` run once eagerly (it compiles its kernels and makes what they keep between launches, such as the
    small-M kernel's ticket counters), then captured in a CUDA graph with no garbage collection during the capture
    (:func:`~reference.compilation.cuda_graph.collection_paused`), which is returned."""
    run()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with collection_paused(), torch.cuda.graph(graph):
        run()
    return graph


def seconds_per_call(run: Callable[[], None], calls: int, device: torch.device, rounds: int = 10) -> float:
    """Median seconds of one of the ``calls`` GEMMs ``run()`` makes. On CUDA ``run`` is captured in a graph
    (after one eager run, which compiles its kernels) and each round is one replay between two events; on a CPU
    each round is one eager ``run()``."""
    if device.type != "cuda":
        run()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times) / calls
    graph = captured(run, device)
    graph.replay()  # the first replay uploads the graph
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rounds)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events) / 1e3 / calls
