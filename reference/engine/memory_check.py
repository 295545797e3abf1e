"""The memory check made before a model's weights exist: weights + KV cache + input buffers against the
device's memory, so a model that can never fit is one line in seconds, not an OOM kill minutes into loading.
"""

from __future__ import annotations

import itertools

import torch

from reference import parallel
from reference.engine.kv_cache import check_fits
from reference.engine.runner import memory_needed
from reference.models import registry
from reference.ops import CustomOpSelection


def check_memory_before_build(
    model: str,
    ops: CustomOpSelection,
    *,
    dtype: torch.dtype,
    device: torch.device,
    max_num_seqs: int,
    max_model_len: int,
    max_num_tokens: int,
    tensor_parallel: parallel.TensorParallel = parallel.SINGLE,
    weights_in_memory: bool = False,
) -> None:
    """Refuse ``model``'s weights (this rank's shard, in ``dtype``) plus the KV cache and input buffers of a
    :class:`~reference.engine.runner.ModelRunner` beyond ``device``'s memory (CUDA: free; CPU: physical).

    The shapes come from a build on the meta device (no memory, nothing read). ``weights_in_memory``: the
    weights are shared with a model already built, so only the cache and buffers count.

    Raises:
        ConfigError: (a ValueError) from :func:`~reference.engine.kv_cache.check_fits`, naming what does
            not fit and the GiB needed and available.
    """
    shapes = registry.build_model(model, ops, dtype=dtype, device="meta", tensor_parallel=tensor_parallel)
    weights = 0 if weights_in_memory else sum(
        t.numel() * t.element_size() for t in itertools.chain(shapes.parameters(), shapes.buffers())
    )  # fmt: skip
    needed = memory_needed(shapes, max_num_seqs, max_model_len, max_num_tokens)
    check_fits(needed, device, max_num_seqs, max_model_len, weight_bytes=weights, dtype=dtype)
