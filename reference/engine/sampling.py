"""Sampling parameters (vLLM's names) and the sampler that turns logits into next tokens.

Per row, in this order: temperature 0 is greedy (argmax); otherwise logits are divided by the
temperature, top-k keeps the ``k`` largest, top-p (nucleus sampling, Holtzman et al. 2019, "The Curious
Case of Neural Text Degeneration") keeps the smallest set of most likely tokens whose probability sums to
at least ``p``, and one token is drawn from the renormalised distribution with the row's own
``torch.Generator``. Top-k before top-p is the order transformers and vLLM use.

Every request draws from its own generator, so what a request samples depends on its seed only, not on
which other requests share its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from reference.engine.arguments import SEED_LIMIT
from reference.ops.attention_metadata import int_lists_to_device

# Below this temperature, logits / temperature overflows float32 for ordinary logit magnitudes.
MIN_TEMPERATURE = 1e-2


class SamplingError(ValueError):
    """A sampling parameter is outside its allowed range."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """How to generate tokens for one prompt. Field names and defaults follow vLLM's ``SamplingParams``.

    Attributes:
        n: completions per prompt; only 1 is supported.
        temperature: 0 for greedy decoding, else a float >= ``MIN_TEMPERATURE`` (0.01) dividing the logits.
            vLLM silently raises smaller positive temperatures to 0.01; here they are an error.
        top_p: nucleus probability mass in (0, 1]; 1 keeps every token.
        top_k: keep the k most likely tokens; 0 or -1 keeps every token.
        max_tokens: most tokens to generate, >= 1.
        min_tokens: EOS and ``stop_token_ids`` cannot be sampled before this many tokens were generated;
            0 <= min_tokens <= max_tokens.
        ignore_eos: keep generating after EOS (the benchmark uses this to fix output lengths).
        stop_token_ids: token ids that end the sequence (the stop token is kept in the output ids); None
            (vLLM's default) is none.
        seed: seed of this request's generator; None lets the engine derive one from its own seed.

    Raises:
        SamplingError: a field is out of range; the message names the field and the allowed values.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n != 1:
            raise SamplingError(f"n: only n=1 is supported, got {self.n!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise SamplingError(f"temperature: expected a finite float, got {t!r}")
        if t != 0 and t < MIN_TEMPERATURE:
            raise SamplingError(f"temperature: expected 0 (greedy) or a float >= {MIN_TEMPERATURE}, got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise SamplingError(f"top_p: expected a float in (0, 1], got {p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise SamplingError(f"top_k: expected an int >= 1, or 0 or -1 to disable, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise SamplingError(f"max_tokens: expected an int >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingError(
                f"min_tokens: expected an int in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise SamplingError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")
        if self.stop_token_ids is None:  # vLLM's default spelling
            self.stop_token_ids = []
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
            raise SamplingError(
                f"stop_token_ids: expected a list of token ids (ints >= 0) or None, got {self.stop_token_ids!r}"
            )
        self.stop_token_ids = list(self.stop_token_ids)
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT):
            raise SamplingError(f"seed: expected an int in [0, 2**63) or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (one per request)."""
    return torch.Generator(device=device).manual_seed(seed)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) the tokens top-k and then top-p remove, row by row.

    Args:
        logits: [B, V] float32, already divided by the temperature.
        top_k: [B] int64; ``k <= 0`` or ``k >= V`` keeps every token. Tokens tied with the k-th largest
            logit are kept.
        top_p: [B] float32 in (0, 1]; a row keeps the smallest prefix of its tokens (most likely first)
            whose probabilities, after top-k, sum to at least ``p``. The most likely token is always kept.

    Returns:
        [B, V] float32, a new tensor.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, V]
    k = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k).clamp(min=1)  # [B]
    kth = sorted_logits.gather(-1, (k - 1)[:, None])  # [B, 1]
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [B, V]: probability of the more likely tokens
    # enough mass without this token (never the first); p = 1 keeps all, whatever the cumsum's rounding
    drop = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, k_max: int) -> torch.Tensor:
    """:func:`apply_top_k_top_p` with every ``top_p`` at 1, from one ``topk`` of ``k_max`` columns instead of a
    sort of the whole vocabulary: the same tensor, bitwise (the k-th largest value is the same either way).

    Args:
        logits: [B, V] float32. top_k: [B] int64 (``k <= 0`` or ``k >= V`` keeps every token).
        k_max: the largest ``k`` in ``top_k`` that restricts its row (1..V-1), known on the host.

    Returns:
        [B, V] float32, a new tensor.
    """
    vocab = logits.shape[-1]
    off = (top_k <= 0) | (top_k >= vocab)  # [B]
    largest = logits.topk(k_max, dim=-1).values  # [B, k_max], descending
    kth = largest.gather(-1, (top_k.clamp(1, k_max) - 1)[:, None])  # [B, 1]
    kth = kth.masked_fill(off[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def _to_device(values: list[list[float]], device: torch.device) -> torch.Tensor:
    """[len(values), len(values[0])] float32 on ``device`` from one pinned buffer, without waiting for the
    device (a plain ``torch.tensor(..., device='cuda')`` copies from pageable memory and synchronises)."""
    host = torch.tensor(values, dtype=torch.float32, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """Pick one next token per row.

    The sampled rows' parameters reach the device in one pinned, non-blocking copy (no host
    synchronisation), and the vocabulary is sorted only when a row uses top-p: top-k alone takes one
    ``topk`` (:func:`apply_top_k`), no restriction takes none. Every path gives the same draws.

    Args:
        logits: [B, V] float32.
        params: B sampling parameters, one per row.
        generators: B generators on ``logits.device``; rows with ``temperature > 0`` draw from theirs
            (None is allowed only for greedy rows).

    Returns:
        [B] int64 token ids on ``logits.device``.

    Raises:
        ValueError: ``params`` or ``generators`` does not have B entries, or a sampled row has no generator.
    """
    batch = logits.shape[0]
    if len(params) != batch or len(generators) != batch:
        raise ValueError(f"sample: expected {batch} params and generators, got {len(params)} and {len(generators)}")
    tokens = logits.argmax(dim=-1)  # [B]: the greedy rows' answer
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    vocab = logits.shape[-1]
    ks = [params[i].top_k for i in rows]
    restricting = [k for k in ks if 0 < k < vocab]
    nucleus = any(params[i].top_p < 1 for i in rows)
    # temperature, top_k (exact in float32 below 2**24) and top_p of the sampled rows: [3, b]
    staged = _to_device([[params[i].temperature for i in rows], ks, [params[i].top_p for i in rows]], logits.device)
    temperature, top_k, top_p = staged[0].to(logits.dtype), staged[1].long(), staged[2].to(logits.dtype)
    # the sampled rows, gathered by a staged index (a list index would be a synchronising copy)
    picked = logits if len(rows) == batch else logits[int_lists_to_device([rows], logits.device)[0]]
    scaled = picked / temperature[:, None]  # [b, V]
    if nucleus:  # top-p needs the sorted distribution
        scaled = apply_top_k_top_p(scaled, top_k, top_p)
    elif restricting:  # top-k alone: the k largest, no sort of the vocabulary
        scaled = apply_top_k(scaled, top_k, max(restricting))
    probs = scaled.softmax(dim=-1)  # [b, V]
    for j, i in enumerate(rows):
        if generators[i] is None:
            raise ValueError(f"sample: row {i} samples (temperature {params[i].temperature}) but has no generator")
        tokens[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return tokens
