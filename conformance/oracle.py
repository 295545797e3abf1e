"""Run one of our models and its transformers counterpart (the oracle) over the same multi-step transcript.

A transcript is a batch of prompts of different lengths, then greedy decode steps, then one multi-token
"extend" step per sequence (new tokens on top of a filled cache, as chunked prefill does). Every step is
teacher-forced from the oracle: the decode tokens are the oracle's greedy choices, so both models always
see the same sequences however close two logits are.

Our side runs through :class:`~reference.engine.ModelRunner` (KV cache, one batch per step, flat token
layout); the oracle recomputes every whole sequence from scratch at every step, with transformers'
eager attention (the plainest path: an explicit additive mask and an fp32 softmax). So a match checks
our cache, masks and batching as well as the layer math.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from conformance.helpers import mode_config, token_ids
from reference.engine import ModelRunner
from reference.models.loader import hf_state_dict
from reference.models.registry import build_model, model_config
from reference.ops import CustomOpSelection, RMSNorm

# Our logits vs the oracle's, absolute. Both compute in fp32 (unit roundoff 6e-8) but sum in different
# orders: one fused qkv / gate-up GEMM instead of several, SDPA instead of matmul + softmax, a batch of
# sequences instead of one. Over the tiny presets' 2-3 layers that leaves at most 5e-6 on logits of
# magnitude up to 10 (measured on the CPU, every mode). 1e-4 keeps 20x headroom and stays 1000x below the
# smallest deliberate break measured (Gemma 3 without its final soft-cap: 0.12; a sliding window one
# token too wide, q/k norm after RoPE, the wrong attention scale or RoPE per layer kind: 0.3 to 2; no
# embedding scale: 7). The gpu-marked CUDA runs assume the same bound: fp32 GEMMs stay fp32 there, as
# torch does not allow TF32 by default.
ORACLE_ATOL = 1e-4


@dataclass
class Transcript:
    """The steps fed to both models and the oracle's answers.

    Attributes:
        steps: per step, the new tokens of each sequence (``steps[s][i]``: list of ids).
        oracle_logits: per step, [num_seqs, vocab] float32: the oracle's logits after each sequence's
            last token so far.
    """

    steps: list[list[list[int]]]
    oracle_logits: list[torch.Tensor]

    @property
    def max_seq_len(self) -> int:
        """Tokens in the longest sequence after the last step."""
        return max(sum(len(step[i]) for step in self.steps) for i in range(len(self.steps[0])))


def build_source_model(preset: str, seed: int = 0) -> nn.Module:
    """``preset`` in fp32 on CPU (eager custom-op selection) with random weights, norms moved off identity.

    The registry initialises RMSNorm weights at the identity (1 for Llama/Qwen, 0 for Gemma's ``1 + w``);
    adding noise makes a norm that applies its weight wrongly (or ignores Gemma's offset) visible.
    """
    model = build_model(preset, CustomOpSelection(mode_config("eager")), dtype=torch.float32, device="cpu", seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.add_(0.3 * torch.randn(module.weight.shape, generator=generator))
    return model


def build_oracle(preset: str, source: nn.Module) -> nn.Module:
    """transformers' causal LM for ``preset`` (eager attention, fp32) holding ``source``'s weights."""
    oracle = AutoModelForCausalLM.from_config(model_config(preset), attn_implementation="eager")
    oracle.load_state_dict(hf_state_dict(source), strict=True)
    return oracle.eval()


@torch.no_grad()
def oracle_last_logits(oracle: nn.Module, sequences: list[list[int]]) -> torch.Tensor:
    """[num_seqs, vocab] float32: the oracle's logits after the last token of each whole sequence.

    One forward over the batch, right-padded with token 0 and no attention mask: under the causal mask
    a position never sees the padding after it, so each sequence's last real position is unaffected.
    """
    longest = max(map(len, sequences))
    ids = torch.tensor([seq + [0] * (longest - len(seq)) for seq in sequences])  # [B, L]
    logits = oracle(ids).logits  # [B, L, V]
    last = torch.tensor([len(seq) - 1 for seq in sequences])
    return logits[torch.arange(len(sequences)), last].float()


def oracle_transcript(
    oracle: nn.Module, vocab_size: int, prompt_lens: tuple[int, ...], decode_steps: int, extend_len: int, seed: int
) -> Transcript:
    """Prompts of ``prompt_lens`` tokens, ``decode_steps`` greedy steps, then ``extend_len`` random tokens each."""
    prompts = [token_ids(n, vocab_size, seed + i) for i, n in enumerate(prompt_lens)]
    extends = [token_ids(extend_len, vocab_size, seed + 100 + i) for i in range(len(prompt_lens))]
    sequences = [list(p) for p in prompts]
    steps, logits = [prompts], [oracle_last_logits(oracle, sequences)]
    for step in range(decode_steps + 1):
        if step < decode_steps:
            new = [[t] for t in logits[-1].argmax(-1).tolist()]  # the oracle's greedy choice
        else:
            new = extends
        for seq, tokens in zip(sequences, new):
            seq.extend(tokens)
        steps.append(new)
        logits.append(oracle_last_logits(oracle, sequences))
    return Transcript(steps, logits)


def run_transcript(preset: str, mode: str, source: nn.Module, transcript: Transcript) -> list[torch.Tensor]:
    """Our logits ([num_seqs, vocab] float32 on the CPU, per step) for ``transcript``, model mode ``mode``.

    The model is built on ``source``'s device for ``mode``'s custom-op selection and shares ``source``'s
    weight tensors. The runner warms up first, as a server does: on CUDA every capture size is captured
    with dummy tokens before the transcript, which then runs on graph replays.
    """
    config = mode_config(mode)
    device = next(source.parameters()).device
    model = build_model(
        preset, CustomOpSelection(config), dtype=torch.float32, device=device, share_weights_with=source
    )
    rows = list(range(len(transcript.steps[0])))
    runner = ModelRunner(model, config, max_num_seqs=len(rows), max_model_len=transcript.max_seq_len)
    runner.warm_up()
    context = [0] * len(rows)
    out = []
    for new in transcript.steps:
        out.append(runner.step(new, context, rows).cpu())
        context = [c + len(tokens) for c, tokens in zip(context, new)]
    return out


class OracleCase:
    """One preset's transcript with the oracle's logits, and ours per (mode, device) on first request.

    Args:
        preset: a registry preset name (a tiny one: the oracle runs on the CPU).
        prompt_lens, decode_steps, extend_len, seed: the transcript (see :func:`oracle_transcript`).
    """

    def __init__(
        self,
        preset: str,
        prompt_lens: tuple[int, ...] = (3, 7, 12),
        decode_steps: int = 6,
        extend_len: int = 3,
        seed: int = 0,
    ):
        self.preset = preset
        self.sources = {"cpu": build_source_model(preset, seed)}
        self.config = self.sources["cpu"].config
        oracle = build_oracle(preset, self.sources["cpu"])
        self.transcript = oracle_transcript(oracle, self.config.vocab_size, prompt_lens, decode_steps, extend_len, seed)
        self._ours: dict[tuple[str, str], list[torch.Tensor]] = {}

    def ours(self, mode: str, device: str = "cpu") -> list[torch.Tensor]:
        """Our logits per step (see :func:`run_transcript`); the same weights on every device."""
        if (mode, device) not in self._ours:
            if device not in self.sources:
                self.sources[device] = copy.deepcopy(self.sources["cpu"]).to(device)
            self._ours[mode, device] = run_transcript(self.preset, mode, self.sources[device], self.transcript)
        return self._ours[mode, device]

    def assert_matches_oracle(self, mode: str, device: str) -> None:
        """Every step's logits of ``mode`` on ``device`` within ``ORACLE_ATOL`` of the oracle's."""
        for step, (ours, oracle) in enumerate(zip(self.ours(mode, device), self.transcript.oracle_logits)):
            torch.testing.assert_close(ours, oracle, rtol=0, atol=ORACLE_ATOL, msg=lambda m: f"step {step}: {m}")

    def assert_no_inductor_bitwise_equal_to_eager(self, device: str) -> None:
        """Both run the same custom ops; the uncompiled FX pieces call the same kernels in the same order."""
        for step, (piecewise, eager) in enumerate(zip(self.ours("no_inductor", device), self.ours("eager", device))):
            torch.testing.assert_close(piecewise, eager, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")
