"""The runner's KV caches: one [2, rows, max_model_len, Hkv, D] tensor per attention layer (keys, then
values), sized and checked against the device before anything is allocated."""

from __future__ import annotations

import os

import torch

from reference.config import ConfigError
from reference.ops import Attention


def kv_cache_bytes(layers: list[Attention], max_num_seqs: int, max_model_len: int, dtype: torch.dtype) -> int:
    """Bytes of every layer's cache: 2 x rows x max_model_len x Hkv x D elements of ``dtype`` each."""
    per_token = sum(2 * layer.num_kv_heads * layer.head_size for layer in layers)
    return max_num_seqs * max_model_len * per_token * torch.empty((), dtype=dtype).element_size()


def check_fits(nbytes: int, device: torch.device, max_num_seqs: int, max_model_len: int) -> None:
    """Refuse ``nbytes`` (the caches and the runner's input buffers) beyond the device's free memory
    (CUDA) or the machine's physical memory (CPU, where an oversized zero-filled tensor would exhaust it).

    A bound that turns sizes the device can never hold into a clear error, not admission control: a cache
    that fits leaves the capture's and the activations' memory to the caller (and on a CPU, the weights).

    Raises:
        ConfigError: (a ValueError) naming max_num_seqs and max_model_len, with the GiB needed and
            available: a configuration no run can serve, which the CLI reports in one line.
    """
    if device.type == "cuda":  # free on the device, plus what torch's caching allocator holds unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        available, where = torch.cuda.mem_get_info(device)[0] + cached, f"free on {device}"
    elif hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        available, where = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "of physical memory"
    else:
        return
    if nbytes > available:
        raise ConfigError(
            f"max_num_seqs x max_model_len ({max_num_seqs} x {max_model_len}): the KV cache and input buffers "
            f"need {nbytes / 2**30:,.1f} GiB, more than the {available / 2**30:,.1f} GiB {where}; lower either"
        )


def allocate_kv_caches(
    layers: list[Attention], max_num_seqs: int, max_model_len: int, dtype: torch.dtype, device: torch.device
) -> None:
    """Give every layer a zeroed ``kv_cache`` of [2, max_num_seqs, max_model_len, Hkv, D] in ``dtype``."""
    for layer in layers:
        shape = (2, max_num_seqs, max_model_len, layer.num_kv_heads, layer.head_size)
        layer.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
