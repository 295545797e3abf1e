"""Our Llama against transformers' ``LlamaForCausalLM`` (the oracle), then every model mode against ours.

A batch of prompts of different lengths (one of them a single token) is prefilled in one step through
:class:`~reference.engine.ModelRunner`, then decoded greedily for a few steps, so both the varlen
prefill path and the batched decode path of the attention op (KV cache, per-sequence lengths) are
checked, along with RoPE with llama3 scaling at every position reached.

The oracle recomputes each sequence from scratch with transformers at every step (no cache, one
sequence at a time), so it shares nothing with our runner but the weights. Both models run in float32.

Tolerance (``ORACLE_ATOL``): the two implementations do the same float32 arithmetic in a different order
(fused q/k/v and gate/up GEMMs, batched vs per-sequence attention, SDPA vs transformers' eager softmax),
which moves a logit by a few units in its last place per reduction: about 4e-6 at logits up to ~7 in
these models. A real defect moves them by orders of magnitude more (measured on llama-tiny: llama3
scaling dropped 4.7, rotation direction flipped 6.9, no causal mask 3.2; on the fixture: final norm
weight ignored 0.62). 1e-4 sits between the two with a wide margin on both sides.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from conformance.helpers import MODES, mode_config
from reference.engine import ModelRunner
from reference.models.loader import hf_state_dict
from reference.models.registry import build_model, model_config
from reference.ops import CustomOpSelection

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama"
PROMPT_LENS = (5, 12, 1, 8)
DECODE_STEPS = 4
MAX_MODEL_LEN = 32
ORACLE_ATOL = 1e-4  # see the module docstring
ORACLE_RTOL = 0.0  # the absolute bound already covers the largest logits (|logit| < 10)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
MODELS = ["llama-tiny", pytest.param(str(FIXTURE), id="fixture")]


def reference_config():
    """Ours, the plainest way: no compilation, every layer's ``forward_native`` (plain PyTorch)."""
    return mode_config("eager", custom_ops=["none"])


def prompts_for(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def run_greedy(runner: ModelRunner, prompts: list[list[int]]) -> tuple[torch.Tensor, list[list[int]]]:
    """Prefill ``prompts`` in one step, then ``DECODE_STEPS`` greedy steps.

    Returns:
        logits [DECODE_STEPS + 1, B, V] float32 (step 0: after the prompts), and each sequence
        (prompt + greedy tokens).
    """
    rows = list(range(len(prompts)))
    sequences = [list(p) for p in prompts]
    logits = runner.step(prompts, [0] * len(prompts), rows)
    steps = [logits]
    for _ in range(DECODE_STEPS):
        next_tokens = logits.argmax(-1).tolist()
        context_lens = [len(s) for s in sequences]
        for seq, token in zip(sequences, next_tokens):
            seq.append(token)
        logits = runner.step([[t] for t in next_tokens], context_lens, rows)
        steps.append(logits)
    return torch.stack(steps), sequences


@torch.no_grad()
def oracle_logits(hf_model, sequences: list[list[int]]) -> torch.Tensor:
    """transformers' logits at the same positions as :func:`run_greedy`'s: [DECODE_STEPS + 1, B, V]."""
    device = next(hf_model.parameters()).device
    per_sequence = []
    for seq, prompt_len in zip(sequences, PROMPT_LENS):
        logits = hf_model(input_ids=torch.tensor([seq], device=device)).logits[0]  # [L, V]
        per_sequence.append(logits[prompt_len - 1 : prompt_len + DECODE_STEPS].float())
    return torch.stack(per_sequence, dim=1)


def our_model(model: str, device: str):
    return build_model(model, CustomOpSelection(reference_config()), dtype=torch.float32, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", MODELS)
def test_prefill_and_greedy_decode_match_transformers(model, device):
    ours = our_model(model, device)
    if model == "llama-tiny":  # random preset weights, handed to transformers through the inverse mapping
        hf_model = AutoModelForCausalLM.from_config(copy.deepcopy(ours.config), attn_implementation="eager")
        hf_model.load_state_dict(hf_state_dict(ours))
    else:  # a checkpoint: transformers reads it with its own loader, independently of ours
        hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="eager")
    hf_model = hf_model.to(device).eval()
    runner = ModelRunner(ours, reference_config(), max_num_seqs=len(PROMPT_LENS), max_model_len=MAX_MODEL_LEN)
    runner.warm_up()  # as the engine does; it also leaves dummy keys in the cache that must not leak

    logits, sequences = run_greedy(runner, prompts_for(ours.config.vocab_size))

    torch.testing.assert_close(logits, oracle_logits(hf_model, sequences), atol=ORACLE_ATOL, rtol=ORACLE_RTOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_matches_our_reference(mode, device):
    """Modes share the reference model's weights; only custom ops, compilation and graphs differ.

    Where the same kernels run on the same shapes (CPU, eager and no_inductor: custom ops wrap the very
    functions ``forward_native`` calls, and no_inductor runs the traced ops as they are) the logits
    must be bitwise equal. Inductor fuses and reorders reductions, and on CUDA the piecewise modes pad
    each step to a capture size, so GEMMs of another shape may use another kernel: those compare with
    the oracle tolerance, for the same reason as there.
    """
    reference = our_model("llama-tiny", device)
    prompts = prompts_for(reference.config.vocab_size)
    expected, _ = run_greedy(
        ModelRunner(reference, reference_config(), max_num_seqs=len(prompts), max_model_len=MAX_MODEL_LEN), prompts
    )
    torch._dynamo.reset()
    config = mode_config(mode)
    model = build_model(
        "llama-tiny", CustomOpSelection(config), dtype=torch.float32, device=device, share_weights_with=reference
    )
    runner = ModelRunner(model, config, max_num_seqs=len(prompts), max_model_len=MAX_MODEL_LEN)
    runner.warm_up()

    logits, _ = run_greedy(runner, prompts)

    exact = device == "cpu" and mode != "inductor"
    tolerance = dict(atol=0.0, rtol=0.0) if exact else dict(atol=ORACLE_ATOL, rtol=ORACLE_RTOL)
    torch.testing.assert_close(logits, expected, **tolerance)


def test_llama_tiny_rope_frequencies_span_all_llama3_bands():
    """llama-tiny exists to exercise llama3 scaling: some frequencies must be kept, some divided by the
    factor and some interpolated between the two (Meta's scheme, as transformers implements it)."""
    config = model_config("llama-tiny")
    unscaled = copy.deepcopy(config)
    unscaled.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    ratio = LlamaRotaryEmbedding(config).inv_freq / LlamaRotaryEmbedding(unscaled).inv_freq
    factor = config.rope_parameters["factor"]  # ratio 1: kept, 1/factor: scaled, in between: interpolated
    kept = torch.isclose(ratio, torch.tensor(1.0))
    divided = torch.isclose(ratio, torch.tensor(1 / factor))
    assert kept.any() and divided.any() and (~kept & ~divided).any(), ratio.tolist()
