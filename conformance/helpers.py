"""Shared pieces of the core conformance tests: the model modes, small models, static inputs, error measures.

Model modes (the names test ids, the CLI and the docs use) are ``reference.config.MODES``:

* ``eager``: ``enforce_eager``, i.e. level 0, no CUDA graphs; custom ops default to all.
* ``no_inductor``: level 3, ``use_inductor=False``, ``custom_ops=['all']``: the pieces stay eager FX code
  and are captured into piecewise CUDA graphs.
* ``inductor``: level 3, ``use_inductor=True`` (custom ops default to none): Inductor compiles the pieces,
  which are captured into piecewise CUDA graphs.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from reference.config import MODES as MODE_FIELDS
from reference.config import CompilationConfig, mode_config
from reference.engine import ModelRunner
from reference.models.llama import LlamaForCausalLM
from reference.ops import CustomOpSelection

MODES = tuple(MODE_FIELDS)
COMPILED_MODES = tuple(m for m in MODES if m != "eager")


def small_llama_config(**overrides) -> LlamaConfig:
    """A tiny random-weight Llama (2 layers, H=64, 4 heads of 16, 2 KV heads, vocab 128): CPU-cheap."""
    fields = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def build_llama(
    hf_config: LlamaConfig,
    config: CompilationConfig,
    *,
    device="cpu",
    dtype=torch.float32,
    seed: int = 0,
    weights_rounded_to: torch.dtype | None = None,
) -> LlamaForCausalLM:
    """A :class:`LlamaForCausalLM` with seeded random weights (built on CPU, then moved).

    The same ``seed`` gives the same weights whatever ``config`` says, so models of different modes can
    be compared. Norm weights are perturbed from their all-ones init so that a norm applying its weight
    wrongly cannot hide. ``weights_rounded_to`` rounds the parameters through that dtype first, so that a
    float32 reference model holds exactly the weights of the bf16 model it is the reference for.
    """
    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config, CustomOpSelection(config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # input/post_attention layernorms and the final norm
                param.add_(0.1 * torch.randn_like(param))
            if weights_rounded_to is not None:
                param.copy_(param.to(weights_rounded_to))
    return model.to(device=device, dtype=dtype).eval()


def make_runner(
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
    """A :class:`ModelRunner` over :func:`build_llama` (seed 0) in model mode ``mode``."""
    config = mode_config(mode, **config_overrides)
    model = build_llama(hf_config, config, device=device, dtype=dtype, weights_rounded_to=weights_rounded_to)
    return ModelRunner(
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


def prefill_and_decode(
    runners: dict[str, ModelRunner], prompts: list[list[int]], num_decode: int, *, leader: str
) -> dict[str, list[torch.Tensor]]:
    """Run the same steps on every runner and return each runner's logits per step.

    Step 0 prefills ``prompts`` (sequence ``i`` in cache row ``i``, from position 0); then ``num_decode``
    greedy decode steps append one token per sequence. The tokens are the argmax of ``runners[leader]``'s
    logits, fed to all runners, so every runner sees identical inputs even where their logits differ.

    Returns:
        runner name -> list of ``1 + num_decode`` tensors ``[len(prompts), vocab]`` float32.
    """
    rows = list(range(len(prompts)))
    context = [0] * len(prompts)
    new_tokens = prompts
    logits: dict[str, list[torch.Tensor]] = {name: [] for name in runners}
    for _ in range(1 + num_decode):
        for name, runner in runners.items():
            logits[name].append(runner.step(new_tokens, context, rows))
        context = [c + len(t) for c, t in zip(context, new_tokens)]
        new_tokens = [[t] for t in logits[leader][-1].argmax(-1).tolist()]
    return logits


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
