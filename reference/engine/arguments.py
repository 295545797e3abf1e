"""Engine arguments as users give them (vLLM's names) -> checked values: device, dtype, lengths, the
compilation config with the engine's capture-size default, the tokenizer and its EOS ids.

Each resolver raises ``ValueError`` (or ``ConfigError``, a ``ValueError``) with one line naming the
argument and the allowed values. The benchmark CLI and perf/ parse their flags with the same functions.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from reference.config import (
    DEFAULT_MAX_CAPTURE_SIZE,
    CompilationConfig,
    config_fields,
    default_capture_sizes,
    echo,
)
from reference.models import pretrained

DEFAULT_MAX_MODEL_LEN = 2048  # cap on the default; long-context models would otherwise get huge KV caches
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_CAPTURE_FIELDS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")


def check_positive(name: str, value: Any) -> None:
    """``value`` is an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {echo(value)}")


SEED_LIMIT = 2**63  # seeds are in [0, SEED_LIMIT): torch.Generator.manual_seed overflows at 2**64, and
# negative seeds wrap around to large ones there, so the non-negative int64 range is what every seed takes


def check_seed(seed: Any) -> None:
    """``seed`` is an int in [0, 2**63) (not a bool): it seeds ``torch.Generator``s.

    Raises:
        ValueError: naming ``seed`` and the range.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed: expected an int in [0, 2**63), got {echo(seed)}")


def resolve_device(device: "str | torch.device | None", name: str = "device") -> torch.device:
    """``device`` as a ``torch.device``: None is ``cuda`` if available, else ``cpu``.

    Raises:
        ValueError: not a device string, a device other than cpu or cuda, or cuda without CUDA; the
            message starts with ``name``.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        # torch's own message repeats the string too, so it is left out
        raise ValueError(f"{name}: expected e.g. 'cpu', 'cuda' or 'cuda:1', got {echo(device)}") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected a 'cpu' or 'cuda' device, got {echo(device)}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}: {echo(device)} requested but CUDA is not available")
    return resolved


def resolve_dtype(dtype: str, configured: Any, device: torch.device) -> torch.dtype:
    """``dtype`` as a torch dtype; ``'auto'`` picks the checkpoint's ``configured`` dtype (str, dtype or
    None) if it is one of ``DTYPES``, else bfloat16 on CUDA and float32 on CPU."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {['auto', *DTYPES]}, got {echo(dtype)}")
        return DTYPES[dtype]
    configured = DTYPES.get(configured, configured) if isinstance(configured, str) else configured
    if configured in DTYPES.values():
        return configured
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_max_model_len(max_model_len: int | None, max_positions: int) -> int:
    """Tokens per sequence: default ``min(max_positions, 2048)``, at least 2 (a request holds at least one
    prompt token and one generated token), at most ``max_positions``.

    Raises:
        ValueError: one line naming ``max_model_len``, if it is not an int in ``[2, max_positions]``.
    """
    if max_model_len is None:
        return min(max_positions, DEFAULT_MAX_MODEL_LEN)
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
        raise ValueError(
            f"max_model_len: expected an int >= 2 (one prompt token and one generated token), got {echo(max_model_len)}"
        )
    check_within_positions(max_model_len, max_positions)
    return max_model_len


def check_within_positions(max_model_len: int, max_positions: int) -> None:
    """Raises: ValueError (one line naming both) if ``max_model_len`` exceeds the model's positions."""
    if max_model_len > max_positions:
        raise ValueError(
            f"max_model_len ({max_model_len}) exceeds the model's max_position_embeddings ({max_positions})"
        )


def engine_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """The engine's default capture sizes (tokens), ascending: decode sizes dense, prefill sizes sparse.

    * Up to ``max_num_seqs`` (a decode step has one token per sequence): every size of vLLM's list,
      :func:`~reference.config.default_capture_sizes` (1, 2, 4, then multiples of 8, the maximum kept).
    * Above it, up to ``min(max_num_batched_tokens, 512)`` (the largest included): 8 x 2^k and 24 x 2^k
      (8, 16, 24, 32, 48, 64, 96, ... 512), so a step of more than 16 tokens pads to less than 1.5x its
      tokens (8 -> 16 and the sizes below 8 are 2x steps).

    vLLM's list takes every multiple of 8 (of 16 above 256, in its later versions) up to 512: 67 sizes.
    Every size costs a warm-up and a capture of every piece at start-up, while padding a prefill of
    hundreds of tokens by a few more tokens saves little; a ladder that grows by a ratio bounds the
    waste relative to the step with a dozen prefill sizes instead of sixty (perf/NOTES.md, v7, has the
    measured start-up and prefill figures of both lists).

    Raises:
        ValueError: ``max_num_seqs`` or ``max_num_batched_tokens`` not an int >= 1.
    """
    check_positive("max_num_seqs", max_num_seqs)
    check_positive("max_num_batched_tokens", max_num_batched_tokens)
    largest = min(max_num_batched_tokens, DEFAULT_MAX_CAPTURE_SIZE)
    decode = default_capture_sizes(min(max_num_seqs, largest))
    prefill = {base << k for base in (8, 24) for k in range(DEFAULT_MAX_CAPTURE_SIZE.bit_length())}
    prefill = {s for s in prefill if decode[-1] < s < largest} | ({largest} - set(decode))
    return tuple(sorted({*decode, *prefill}))


def engine_config(
    value: Any, *, enforce_eager: bool, max_num_seqs: int, max_num_batched_tokens: int
) -> CompilationConfig:
    """The engine's compilation config: ``value`` parsed, capture sizes defaulted, ``enforce_eager``
    applied.

    Without ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size`` in ``value`` (or with them
    None, vLLM's spelling of "the default"), the capture sizes are :func:`engine_capture_sizes`: decode
    steps and prefills up to ``min(max_num_batched_tokens, 512)`` tokens replay graphs; larger steps run
    compiled without graphs. A ``CompilationConfig`` object is used as built.

    Raises:
        ConfigError: ``value`` is invalid or contradicts ``enforce_eager``.
    """
    if not isinstance(value, CompilationConfig):
        fields = config_fields(value)
        if all(fields.get(f) is None for f in _CAPTURE_FIELDS):
            fields["cudagraph_capture_sizes"] = list(engine_capture_sizes(max_num_seqs, max_num_batched_tokens))
        value = fields
    config = CompilationConfig.parse(value)
    return config.for_eager() if enforce_eager else config


def compile_sizes_never_run(config: CompilationConfig, max_num_tokens: int) -> list[int]:
    """The compile sizes of ``config`` at most ``max_num_tokens`` that no step runs the model at: a step runs
    at the smallest capture size that holds it (``ModelRunner.padded_size`` with piecewise graphs; the full
    graph's size under ``cudagraph_mode='full'``), so a count below a capture size and not itself one is never
    seen. Sizes above ``max_num_tokens`` are the runner's to drop (no step holds that many tokens), as it drops
    capture sizes there.

    vLLM refuses such sizes too (a compile size that would be padded).
    """
    padding = config.piecewise_graphs or config.full_graphs_of_every_step
    sizes = config.cudagraph_capture_sizes if padding else ()
    captured = [s for s in sizes if s <= max_num_tokens]
    padded = [s for s in config.compile_sizes if s not in captured and any(c > s for c in captured)]
    return [s for s in padded if s <= max_num_tokens]


def load_tokenizer(model: str, path: str | None):
    """The transformers tokenizer at ``path`` (default: the model directory's, if it has one; a pretrained
    model's conversion has its own) or None.

    Raises:
        ValueError: ``path`` holds no loadable tokenizer.
    """
    if path is None:
        model = pretrained.resolve(model)  # a pretrained model's tokenizer is in its conversion
        if not (os.path.isdir(model) and any(os.path.exists(os.path.join(model, f)) for f in _TOKENIZER_FILES)):
            return None
        path = model
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # a corrupt file fails anywhere inside transformers / tokenizers, as any type
        raise ValueError(f"tokenizer: cannot load a tokenizer from {echo(path)}: {type(err).__name__}: {err}") from None


def eos_token_ids(hf_config, tokenizer) -> frozenset[int]:
    """EOS ids from the language model's config (an int, a list or None; a multimodal checkpoint's top-level
    ids are in it, :func:`reference.models.registry.language_model_config`) and the tokenizer (or None)."""
    eos = getattr(hf_config, "eos_token_id", None)
    ids = set([eos] if isinstance(eos, int) else eos or [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
