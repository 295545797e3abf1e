"""The decode GEMMs of ``--perf-model`` on CUDA: the small-M Triton kernel (reference.ops.linear_kernels) against
cuBLAS per weight shape, and one decoder layer's GEMM chain as today's ops run it against the fused kernels.

Issue 24's targets: our GEMMs at least as fast as cuBLAS on every decode shape of the three models, and the
fusions paying for themselves. Both are timed as the model meets them, inside a CUDA graph, each weight
read from memory, not from L2: a shape's graph runs its GEMM over enough distinct weights to pass 4x the L2
cache (:func:`reference.benchmark.gemm.weight_copies`; perf/NOTES.md, "Small-M GEMMs", measured cuBLAS this
way), and the chain's graph runs every layer of the model with its own weights. One round is one replay and a
synchronize; the figure is per GEMM (per layer for the chain), next to its floor, the weight's bytes over the
bandwidth the decode floor uses.

The layer chain is Llama's order for every model (Gemma's extra norms around attention and the MLP, and the
q/k norms, RoPE and attention of every model, are left out; the attention output is a slice of the qkv
output): today (custom ops on, as ``no_inductor`` ran them before the fusions) ``fused_add_rms_norm``, qkv, o,
``fused_add_rms_norm``, gate_up, the gated activation, down; fused: norm + qkv, o + residual add, norm +
gate_up + activation, down + residual add.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference.benchmark.gemm import captured, decode_gemms, weight_copies
from reference.models import registry
from reference.models.llama import head_dim
from reference.ops.library import HAS_TRITON

ROUNDS, WARMUP = 30, 3
ROWS = (1, 8, 16, 64)  # decode tokens per step (issue 24: M = 1-16, and up to 64)


@pytest.fixture(scope="module")
def cuda_settings(perf_settings):
    if perf_settings.device.type != "cuda" or not HAS_TRITON:
        pytest.skip("the Triton GEMMs run on CUDA only")
    return perf_settings


def _layer(model: str) -> dict:
    """What the layer chain needs beside the weight shapes: layers, q width and the norms' eps and style (Gemma:
    ``1 + w``)."""
    config = registry.model_config(model).get_text_config()
    return dict(
        layers=config.num_hidden_layers,
        q=config.num_attention_heads * head_dim(config),
        eps=config.rms_norm_eps,
        offset=1.0 if "gemma" in config.model_type else 0.0,
    )


def _graphed(fn, device):
    """``fn`` captured (:func:`reference.benchmark.gemm.captured`), and a function that replays it and waits."""
    graph = captured(fn, device)

    def replay():
        graph.replay()
        torch.cuda.synchronize(device)

    return replay


def _time(benchmark, replay, per_round: int, weight_bytes: int, rows: int, bandwidth, perf_report):
    benchmark.extra_info.update(weight_bytes=weight_bytes, per_round=per_round)
    benchmark.pedantic(replay, rounds=ROUNDS, warmup_rounds=WARMUP)
    if benchmark.stats is None:  # --benchmark-disable: one untimed round
        perf_report(benchmark.name, None, benchmark.extra_info)
        return
    median = benchmark.stats.stats.median / per_round
    floor = weight_bytes / bandwidth.bytes_per_s
    benchmark.extra_info.update(
        tokens_per_s=rows / median,
        floor_ms=floor * 1e3,
        bandwidth_source=bandwidth.source,
        ratio_to_floor=median / floor,
        achieved_TBps=weight_bytes / median / 1e12,
    )
    perf_report(benchmark.name, median, benchmark.extra_info)


@pytest.mark.parametrize("impl", ["cublas", "triton"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("gemm", ["qkv", "o", "gate_up", "down", "lm_head"])
def test_gemm_latency(benchmark, cuda_settings, bandwidth, perf_report, gemm, rows, impl):
    """One weight shape, ``x W^T`` alone: cuBLAS (``F.linear``) or the small-M kernel with its default config."""
    from reference.ops.linear_kernels import small_m_linear

    device, dtype = cuda_settings.device, cuda_settings.dtype
    shape = next(g for g in decode_gemms(cuda_settings.model) if g.name == gemm)
    n, k = shape.weight_rows, shape.k  # the plain GEMM, on gate_up's whole [2I, K] weight too
    weight_bytes = n * k * dtype.itemsize
    copies = weight_copies(weight_bytes, device)
    weights = [torch.randn(n, k, device=device, dtype=dtype) * k**-0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device=device, dtype=dtype)
    linear = F.linear if impl == "cublas" else small_m_linear

    def run():
        for w in weights:
            linear(x, w)

    _time(benchmark, _graphed(run, device), copies, weight_bytes, rows, bandwidth, perf_report)


@pytest.mark.parametrize("impl", ["today", "fused"])
@pytest.mark.parametrize("rows", ROWS)
def test_layer_gemm_chain_latency(benchmark, cuda_settings, bandwidth, perf_report, rows, impl):
    """Every layer's norms, GEMMs and activation (module doc) over the model's own number of layers."""
    from reference.ops.activation import gelu_tanh_and_mul_op, silu_and_mul_op
    from reference.ops.layernorm import fused_add_rms_norm_op
    from reference.ops.linear_kernels import small_m_linear

    device, dtype = cuda_settings.device, cuda_settings.dtype
    d = _layer(cuda_settings.model)
    gemms = {g.name: g for g in decode_gemms(cuda_settings.model) if g.fused}
    shapes = {name: (g.weight_rows, g.k) for name, g in gemms.items()}
    gen = torch.Generator(device=device).manual_seed(0)

    def weight(name):
        n, k = shapes[name]
        return torch.randn(n, k, device=device, dtype=dtype, generator=gen) * k**-0.5

    layers = [{name: weight(name) for name in shapes} for _ in range(d["layers"])]
    hidden = shapes["o"][0]
    norm_w = torch.ones(hidden, device=device, dtype=dtype) * (0.0 if d["offset"] else 1.0)
    eps, offset, act = d["eps"], d["offset"], gemms["gate_up"].epilogue
    act_op = gelu_tanh_and_mul_op if act == "gelu_tanh_and_mul" else silu_and_mul_op
    x = torch.randn(rows, hidden, device=device, dtype=dtype)

    def today():
        hidden, residual = x, torch.zeros_like(x)
        for w in layers:
            h, residual = fused_add_rms_norm_op(hidden, residual, norm_w, eps, offset)
            attn = F.linear(h, w["qkv"])[:, : d["q"]]
            h, residual = fused_add_rms_norm_op(F.linear(attn, w["o"]), residual, norm_w, eps, offset)
            hidden = F.linear(act_op(F.linear(h, w["gate_up"])), w["down"])

    def fused():
        residual = x
        for w in layers:
            attn = small_m_linear(residual, w["qkv"], norm=(norm_w, eps, offset))[:, : d["q"]]
            residual = small_m_linear(attn, w["o"], epilogue="residual", residual=residual)
            h = small_m_linear(residual, w["gate_up"], norm=(norm_w, eps, offset), epilogue=act)
            residual = small_m_linear(h, w["down"], epilogue="residual", residual=residual)

    weight_bytes = sum(n * k for n, k in shapes.values()) * dtype.itemsize
    replay = _graphed(today if impl == "today" else fused, device)
    _time(benchmark, replay, d["layers"], weight_bytes, rows, bandwidth, perf_report)
