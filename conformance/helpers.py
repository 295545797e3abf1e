"""Shared pieces of the conformance tests: modes, devices, small models, static inputs, error measures.

Model modes (the names test ids, the CLI and the docs use) are ``reference.config.MODES``:

* ``eager``: ``enforce_eager``, i.e. level 0, no CUDA graphs; custom ops default to all.
* ``breakable``: level 0 with piecewise graphs: the eager model captured into segments broken at attention.
* ``no_inductor``: level 3, ``use_inductor=False``, ``custom_ops=['all']``: the pieces stay eager FX code
  and are captured into piecewise CUDA graphs.
* ``inductor``: level 3, ``use_inductor=True`` (custom ops default to none): Inductor compiles the pieces,
  which are captured into piecewise CUDA graphs.
* ``no_inductor_full`` / ``inductor_full``: the same plus a full graph per decode size (runner steps only).
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from torch import nn
from transformers import LlamaConfig

from conformance.implementation import Implementation
from conformance.implementation import make_runner as runner_for
from reference.config import MODES as MODE_FIELDS
from reference.config import CompilationConfig, mode_config
from reference.engine import ModelRunner
from reference.engine.llm import LLM
from reference.models.llama import LlamaForCausalLM
from reference.models.presets import LLAMA_TINY
from reference.models.weights import init_random_weights
from reference.ops import CustomOpSelection, RMSNorm

MODES = tuple(MODE_FIELDS)
COMPILED_MODES = tuple(m for m in MODES if m != "eager")  # every mode with CUDA graphs
# The two Dynamo-traced piecewise modes. Tests that call a compiled model directly (no runner: no dispatch,
# so no full graph is ever used) take these; the full variants would only repeat them.
TRACED_MODES = ("no_inductor", "inductor")
# The device axis of every test that runs on both; the cuda cases need a GPU (tox -e gpu).
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def small_llama_config(**overrides) -> LlamaConfig:
    """The ``llama-tiny`` preset's config (2 layers, H=64, 4 heads of 16, 2 KV heads, vocab 256, llama3
    RoPE scaling in all three bands) with ``overrides``: CPU-cheap."""
    return LlamaConfig(**{**copy.deepcopy(LLAMA_TINY), **overrides})


def perturb_norms(model: nn.Module, seed: int, scale: float = 0.3) -> nn.Module:
    """Move every RMSNorm weight off its identity by ``scale`` x N(0, 1) noise, in place.

    Random init puts norm weights at the identity (1 for Llama/Qwen, 0 for Gemma's ``1 + w``), where a
    norm that applies its weight wrongly, or ignores Gemma's offset, computes the right answer anyway.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                noise = torch.randn(module.weight.shape, generator=generator)
                module.weight.add_(scale * noise.to(module.weight.device, module.weight.dtype))
    return model


def build_llama(
    hf_config: LlamaConfig,
    config: CompilationConfig,
    *,
    device="cpu",
    dtype=torch.float32,
    seed: int = 0,
    weights_rounded_to: torch.dtype | None = None,
) -> LlamaForCausalLM:
    """A :class:`LlamaForCausalLM` with the presets' seeded random weights and perturbed norms.

    Built in float32 on CPU, then moved, so the same ``seed`` gives the same weights whatever ``config``,
    device or dtype, and models of different modes can be compared. ``weights_rounded_to`` rounds the
    parameters through that dtype first, so that a float32 reference model holds exactly the weights of
    the bf16 model it is the reference for.
    """
    model = LlamaForCausalLM(hf_config, CustomOpSelection(config))
    init_random_weights(model, seed)
    perturb_norms(model, seed + 1)
    if weights_rounded_to is not None:
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(weights_rounded_to))
    return model.to(device=device, dtype=dtype).eval()


def make_runner(
    impl: Implementation,
    mode: str,
    hf_config: LlamaConfig,
    *,
    device="cpu",
    dtype=torch.float32,
    max_num_seqs: int = 4,
    max_model_len: int = 64,
    max_num_batched_tokens: int | None = None,
    weights_rounded_to: torch.dtype | None = None,
    **config_overrides,
) -> ModelRunner:
    """The project's runner over ``impl``'s compiled :func:`build_llama` (seed 0) in model mode ``mode``."""
    config = mode_config(mode, **config_overrides)
    model = build_llama(hf_config, config, device=device, dtype=dtype, weights_rounded_to=weights_rounded_to)
    return runner_for(
        impl,
        model,
        config,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
    )


class StaticTokens:
    """Static ``input_ids`` / ``positions`` buffers for calling a compiled model directly.

    CUDA graphs read their inputs from the addresses they had at capture, so a test that replays graphs
    must feed slices of one buffer (as the runner does), never fresh tensors.
    """

    def __init__(self, max_tokens: int, device="cpu"):
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)

    def __call__(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Load ``ids`` (one causal sequence starting at position 0); returns ``(input_ids[T], positions[T])``."""
        n = len(ids)
        self.input_ids[:n].copy_(torch.tensor(ids))
        self.positions[:n].copy_(torch.arange(n))
        return self.input_ids[:n], self.positions[:n]


def max_abs_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |actual - reference|`` computed in float64 (so the measure adds no rounding of its own)."""
    return (actual.double() - reference.double()).abs().max().item()


def token_ids(count: int, vocab_size: int, seed: int) -> list[int]:
    """``count`` pseudo-random token ids in ``[0, vocab_size)``, reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (count,), generator=generator).tolist()


def assert_error_within_twice_eager(actual: torch.Tensor, eager: torch.Tensor, reference: torch.Tensor) -> None:
    """``|actual - reference| <= 2 |eager - reference| + eps`` (max over elements), FlashAttention's test rule.

    ``reference`` is the same model in higher precision; ``eager`` is eager mode in the tested dtype. A
    mode may round differently from eager (other kernels, other GEMM shapes, fused reductions), but it
    must not be much *less accurate* than eager. ``eps`` (8 float32 ulps of the largest reference value)
    only matters when eager happens to be (nearly) exact.
    """
    eps = 8 * torch.finfo(torch.float32).eps * reference.abs().max().item()
    mode_error, eager_error = max_abs_error(actual, reference), max_abs_error(eager, reference)
    assert mode_error <= 2 * eager_error + eps, (
        f"error vs reference {mode_error:.3g} exceeds 2 x eager's error {eager_error:.3g} + eps {eps:.3g}"
    )


def points_at(warning: warnings.WarningMessage, filename: str) -> bool:
    """Whether a caught warning names ``filename`` (a test's ``__file__``) as where it was raised, i.e. its
    ``stacklevel`` reaches the test's line. Always True under mutmut (``MUTANT_UNDER_TEST`` is set, from its
    stats run on): there every mutated function is called through a trampoline in mutmut's own file, so how
    many frames lie between the test and the warning depends on which functions the module mutates, and a
    lost ``stacklevel`` is seen only by the plain suite."""
    return "MUTANT_UNDER_TEST" in os.environ or warning.filename == filename


def tiny_eager_llm(**engine_args) -> LLM:
    """``LLM('llama-tiny')`` in eager mode on the CPU, without progress bars; ``engine_args`` are the
    engine's (``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``, ``scheduling``)."""
    return LLM("llama-tiny", enforce_eager=True, device="cpu", use_tqdm=False, **engine_args)
