"""The runner's KV caches: one [2, rows, max_model_len, Hkv, D] tensor per attention layer (keys, then
values), sized and checked against the device before anything is allocated."""

from __future__ import annotations

import os

import torch

from reference.config import ConfigError
from reference.ops import Attention


def kv_bytes_per_token(layers: list[Attention], dtype: torch.dtype) -> int:
    """Bytes one token's keys and values take over ``layers``: 2 x Hkv x D elements of ``dtype`` per layer
    (Llama-3.1-8B in bf16: 32 x 2 x 8 x 128 x 2 = 131,072)."""
    per_token = sum(2 * layer.num_kv_heads * layer.head_size for layer in layers)
    return per_token * torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_token_by_window(layers: list[Attention], dtype: torch.dtype) -> dict[int | None, int]:
    """:func:`kv_bytes_per_token` of the layers of each sliding window (None: the layers that attend to their
    whole context); Gemma 3's local layers, for one, keep a window of 1,024 tokens."""
    windows: dict[int | None, list[Attention]] = {}
    for layer in layers:
        windows.setdefault(layer.sliding_window, []).append(layer)
    return {window: kv_bytes_per_token(group, dtype) for window, group in windows.items()}


def kv_cache_bytes(layers: list[Attention], max_num_seqs: int, max_model_len: int, dtype: torch.dtype) -> int:
    """Bytes of every layer's cache: rows x max_model_len tokens of :func:`kv_bytes_per_token` each."""
    return max_num_seqs * max_model_len * kv_bytes_per_token(layers, dtype)


def check_fits(
    nbytes: int, device: torch.device, max_num_seqs: int, max_model_len: int, weight_bytes: int = 0, dtype=None
) -> None:
    """Refuse ``nbytes`` (the caches and the runner's input buffers), plus ``weight_bytes`` of weights not
    yet built, beyond the device's free memory (CUDA) or the machine's physical memory (CPU, where an
    oversized zero-filled tensor would exhaust it).

    A bound that turns sizes the device can never hold into a clear error, not admission control: what
    fits leaves the capture's and the activations' memory to the caller. Checked before the weights are
    built, it turns a kernel's OOM kill minutes into loading into one line.

    Args:
        nbytes: bytes of the KV cache and the input buffers.
        weight_bytes: bytes of the weights still to be allocated (0: they are in memory already), whose
            ``dtype`` the message names.

    Raises:
        ConfigError: (a ValueError) naming max_num_seqs and max_model_len (and the weights, when they
            count), with the GiB needed and available: a configuration no run can serve, which the CLI
            reports in one line.
    """
    if device.type == "cuda":  # free on the device, plus what torch's caching allocator holds unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        available, where = torch.cuda.mem_get_info(device)[0] + cached, f"free on {device}"
    elif hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        available, where = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "of physical memory"
    else:
        return
    if nbytes + weight_bytes <= available:
        return
    sizes = f"max_num_seqs x max_model_len ({max_num_seqs} x {max_model_len})"
    have = f"the {available / 2**30:,.1f} GiB {where}"
    weights = f"the weights ({weight_bytes / 2**30:,.1f} GiB in {str(dtype).removeprefix('torch.')})"
    cache = f"the KV cache and input buffers of {sizes} need {nbytes / 2**30:,.1f} GiB"
    if weight_bytes > available:
        also = f"; and {cache}" if nbytes > available else ""
        raise ConfigError(
            f"{weights} need more than {have}; choose a smaller model or dtype, or more tensor-parallel ranks{also}"
        )
    if nbytes > available or not weight_bytes:
        raise ConfigError(
            f"{sizes}: the KV cache and input buffers need {nbytes / 2**30:,.1f} GiB, more than {have}; lower either"
        )
    raise ConfigError(
        f"{weights} and the KV cache and input buffers of {sizes} ({nbytes / 2**30:,.1f} GiB) need more than {have}; "
        "lower max_num_seqs or max_model_len, or choose a smaller model or dtype"
    )


def allocate_kv_caches(
    layers: list[Attention], max_num_seqs: int, max_model_len: int, dtype: torch.dtype, device: torch.device
) -> None:
    """Give every layer a zeroed ``kv_cache`` of [2, max_num_seqs, max_model_len, Hkv, D] in ``dtype``."""
    for layer in layers:
        shape = (2, max_num_seqs, max_model_len, layer.num_kv_heads, layer.head_size)
        layer.kv_cache = torch.zeros(shape, dtype=dtype, device=device)


def free_kv_caches(layers: list[Attention]) -> None:
    """Let go of every layer's ``kv_cache`` (None again, as before :func:`allocate_kv_caches`), so that its
    memory is freed once nothing else holds it; the runner of these layers cannot step after this."""
    for layer in layers:
        layer.kv_cache = None
