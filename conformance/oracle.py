"""The one oracle harness: our models against their transformers counterparts on the same weights.

A transcript is a batch of prompts of different lengths, then greedy decode steps, then one multi-token
"extend" step per sequence (new tokens on top of a filled cache, as chunked prefill does). Every step is
teacher-forced from the oracle: the decode tokens are the oracle's greedy choices, so both models always
see the same sequences however close two logits are.

Our side runs through :class:`~reference.engine.ModelRunner` (KV cache, one batch per step, flat token
layout; :func:`conformance.driver.run_steps`); the oracle recomputes every whole sequence from scratch
at every step, with transformers' eager attention (the plainest path: an explicit additive mask and an
fp32 softmax). So a match checks our cache, masks and batching as well as the layer math.

Subjects: a tiny preset (random weights, norms moved off identity, handed to transformers through the
inverse weight mapping) or a checkpoint directory (transformers reads it with its own loader, ours with
ours: the loaders are checked against each other too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from conformance.driver import run_steps
from conformance.helpers import perturb_norms, token_ids
from conformance.implementation import Implementation, make_runner
from reference.config import mode_config
from reference.models.loader import hf_state_dict
from reference.models.presets import PRESETS
from reference.models.registry import build_model, model_config
from reference.ops import CustomOpSelection

# Our logits vs the oracle's, absolute. Both compute in fp32 (unit roundoff 6e-8) but sum in different
# orders: one fused qkv / gate-up GEMM instead of several, SDPA instead of matmul + softmax, a batch of
# sequences instead of one. Over the tiny presets' 2-3 layers that leaves at most 5e-6 on logits of
# magnitude up to 10 (measured on the CPU, every mode). 1e-4 keeps 20x headroom and stays 1000x below the
# smallest deliberate break measured (Gemma 3 without its final soft-cap: 0.12; a sliding window one
# token too wide, q/k norm after RoPE, the wrong attention scale or RoPE per layer kind: 0.3 to 2; no
# embedding scale: 7; llama3 scaling dropped 4.7; no causal mask 3.2; the fixture's final norm weight
# ignored 0.62). The gpu-marked CUDA runs assume the same bound: fp32 GEMMs stay fp32 there, as torch
# does not allow TF32 by default.
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


def build_source_model(model: str | Path, seed: int = 0) -> nn.Module:
    """``model`` in fp32 on CPU (eager custom-op selection): a preset with random weights and perturbed
    norms, or a checkpoint directory's own weights."""
    ours = build_model(model, CustomOpSelection(mode_config("eager")), dtype=torch.float32, device="cpu", seed=seed)
    return perturb_norms(ours, seed + 1) if str(model) in PRESETS else ours


def build_oracle(model: str | Path, source: nn.Module) -> nn.Module:
    """transformers' causal LM (eager attention, fp32) for ``model``: ``source``'s weights for a preset,
    the directory's weights read by transformers for a checkpoint."""
    if str(model) not in PRESETS:
        return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="eager").eval()
    oracle = AutoModelForCausalLM.from_config(model_config(model), attn_implementation="eager")
    oracle.load_state_dict(hf_state_dict(source), strict=True)
    return oracle.eval()


@torch.no_grad()
def oracle_last_logits(oracle: nn.Module, sequences: list[list[int]]) -> torch.Tensor:
    """[num_seqs, vocab] float32: the oracle's logits after the last token of each whole sequence.

    One forward over the batch, right-padded with token 0 and no attention mask: under the causal mask
    a position never sees the padding after it, so each sequence's last real position is unaffected.
    """
    device = next(oracle.parameters()).device
    longest = max(map(len, sequences))
    ids = torch.tensor([seq + [0] * (longest - len(seq)) for seq in sequences], device=device)  # [B, L]
    logits = oracle(ids).logits  # [B, L, V]
    last = torch.tensor([len(seq) - 1 for seq in sequences], device=device)
    return logits[torch.arange(len(sequences), device=device), last].float().cpu()


def oracle_greedy(oracle: nn.Module, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """``n`` greedy tokens after ``prompt``, each from a whole-sequence forward, and at each step the gap
    between the two best logits (how close the choice was)."""
    ids, gaps = list(prompt), []
    for _ in range(n):
        logits = oracle_last_logits(oracle, [ids])[0]
        top = logits.topk(2).values
        gaps.append((top[0] - top[1]).item())
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :], gaps


def oracle_transcript(
    oracle: nn.Module, vocab_size: int, prompt_lens: tuple[int, ...], decode_steps: int, extend_len: int, seed: int
) -> Transcript:
    """Prompts of ``prompt_lens`` tokens, ``decode_steps`` greedy steps, then ``extend_len`` random tokens
    each (no extend step when 0)."""
    prompts = [token_ids(n, vocab_size, seed + i) for i, n in enumerate(prompt_lens)]
    sequences = [list(p) for p in prompts]
    steps, logits = [prompts], [oracle_last_logits(oracle, sequences)]
    for _ in range(decode_steps):
        steps.append([[t] for t in logits[-1].argmax(-1).tolist()])  # the oracle's greedy choice
        for seq, tokens in zip(sequences, steps[-1]):
            seq.extend(tokens)
        logits.append(oracle_last_logits(oracle, sequences))
    if extend_len:
        steps.append([token_ids(extend_len, vocab_size, seed + 100 + i) for i in range(len(prompt_lens))])
        for seq, tokens in zip(sequences, steps[-1]):
            seq.extend(tokens)
        logits.append(oracle_last_logits(oracle, sequences))
    return Transcript(steps, logits)


class OracleCase:
    """One model's transcript with the oracle's logits, and ours per (mode, device, overrides) on request.

    Args:
        model: a tiny preset name or a checkpoint directory (the oracle runs on the CPU).
        impl: the implementation under test, whose compiled forward runs our side.
        prompt_lens, decode_steps, extend_len, seed: the transcript (see :func:`oracle_transcript`).
    """

    def __init__(
        self,
        model: str | Path,
        impl: Implementation,
        prompt_lens: tuple[int, ...] = (3, 7, 12),
        decode_steps: int = 6,
        extend_len: int = 3,
        seed: int = 0,
    ):
        self.model, self.impl = model, impl
        self.sources = {"cpu": build_source_model(model, seed)}
        self.config = self.sources["cpu"].config
        oracle = build_oracle(model, self.sources["cpu"])
        self.transcript = oracle_transcript(oracle, self.config.vocab_size, prompt_lens, decode_steps, extend_len, seed)
        self._ours: dict[tuple, list[torch.Tensor]] = {}

    def ours(self, mode: str, device: str = "cpu", **overrides) -> list[torch.Tensor]:
        """Our logits per step for the transcript ([num_seqs, vocab] float32 on the CPU), model mode
        ``mode`` with config ``overrides``, on ``device``, with the same weights on every device.

        The runner warms up first, as a server does: on CUDA every capture size is captured with dummy
        tokens before the transcript, which then runs on graph replays (and the dummy keys left in the
        cache must not leak into it).
        """
        key = (mode, device, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in self._ours:
            if device not in self.sources:
                self.sources[device] = copy.deepcopy(self.sources["cpu"]).to(device)
            config = mode_config(mode, **overrides)
            model = build_model(
                self.model,
                CustomOpSelection(config),
                dtype=torch.float32,
                device=device,
                share_weights_with=self.sources[device],
            )
            rows = len(self.transcript.steps[0])
            runner = make_runner(self.impl, model, config, max_num_seqs=rows, max_model_len=self.transcript.max_seq_len)
            runner.warm_up()
            self._ours[key] = run_steps(runner, self.transcript.steps)
        return self._ours[key]

    @property
    def exact_capture_sizes(self) -> list[int]:
        """The token counts of the transcript's steps: as capture sizes, no step is padded."""
        return sorted({sum(map(len, step)) for step in self.transcript.steps})

    def assert_matches_oracle(self, mode: str, device: str) -> None:
        """Every step's logits of ``mode`` on ``device`` within ``ORACLE_ATOL`` of the oracle's."""
        for step, (ours, oracle) in enumerate(zip(self.ours(mode, device), self.transcript.oracle_logits)):
            torch.testing.assert_close(ours, oracle, rtol=0, atol=ORACLE_ATOL, msg=lambda m: f"step {step}: {m}")

    def assert_no_inductor_bitwise_equal_to_eager(self, device: str) -> None:
        """Both run the same custom ops; the uncompiled FX pieces call the same kernels in the same order.

        The rule assumes the same kernels on the same shapes, so it is checked where no padding happens:
        ``no_inductor`` captures exactly the token counts of the transcript's steps. A padded step runs
        its GEMMs over more rows than eager's, and a CPU BLAS may block a row's reduction by the row
        count (oneDNN on an AMD EPYC does: 2.3e-6 apart on Gemma 3's logits), so padding is held to the
        fp32 rules (``test_runner.py``: padded vs exact) instead.
        """
        no_inductor = self.ours("no_inductor", device, cudagraph_capture_sizes=self.exact_capture_sizes)
        for step, (piecewise, eager) in enumerate(zip(no_inductor, self.ours("eager", device))):
            torch.testing.assert_close(piecewise, eager, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")
