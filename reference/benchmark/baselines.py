"""transformers ``generate`` on our weights: the baselines the benchmark compares against.

* ``hf-eager``: ``generate`` with transformers' default dynamic KV cache, no compilation.
* ``hf-compile``: ``generate`` with the static KV cache, which lets transformers compile its decode
  forward with ``torch.compile(mode='reduce-overhead', fullgraph=True)`` (Inductor + CUDA graphs),
  through its ``CompileConfig``; the prefill runs uncompiled. This is transformers' documented fast
  path. On a CPU, where transformers would silently skip the compilation, it is forced (CUDA graphs do
  not exist there; Inductor still compiles).

Both decode greedily with ``min_new_tokens = max_new_tokens``, so every run generates exactly the
requested number of tokens, like the engine with ``ignore_eos``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from transformers import AutoModelForCausalLM, CompileConfig, PreTrainedModel

from reference.benchmark.choices import BASELINES
from reference.models import registry
from reference.models.loader import hf_state_dict


def build_hf_model(model: str, ours: nn.Module) -> PreTrainedModel:
    """The transformers causal LM of preset/checkpoint ``model`` holding ``ours``' weights.

    The transformers model is built on ``ours``' device in its dtype (randomly initialised, then
    overwritten), so it takes a second copy of the weights in device memory.

    Raises:
        RuntimeError: ``ours`` does not match transformers' model for the config (see ``hf_state_dict``).
    """
    param = next(ours.parameters())
    with torch.device(param.device):
        hf = AutoModelForCausalLM.from_config(registry.model_config(model), dtype=param.dtype)
    hf.load_state_dict(hf_state_dict(ours), strict=True)
    return hf.eval()


def make_baseline(name: str, hf: PreTrainedModel, output_len: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function running baseline ``name`` on ``input_ids`` [B, S] int64 and returning the generated
    tokens, [B, output_len] int64.

    Raises:
        ValueError: ``name`` is not one of ``BASELINES``.
    """
    if name not in BASELINES:
        raise ValueError(f"baseline: expected one of {list(BASELINES)}, got {name!r}")
    eos = hf.config.eos_token_id
    kwargs = dict(
        do_sample=False,
        max_new_tokens=output_len,
        min_new_tokens=output_len,
        pad_token_id=eos[0] if isinstance(eos, list) else (eos if eos is not None else 0),
    )
    if name == "hf-compile":
        compile_config = CompileConfig(mode="reduce-overhead", fullgraph=True)
        if hf.device.type != "cuda":
            compile_config._compile_all_devices = True  # transformers' switch to compile off CUDA
        kwargs.update(cache_implementation="static", compile_config=compile_config)

    @torch.inference_mode()
    def run(input_ids: torch.Tensor) -> torch.Tensor:
        attention_mask = torch.ones_like(input_ids)
        out = hf.generate(input_ids, attention_mask=attention_mask, **kwargs)  # [B, S + output_len]
        return out[:, input_ids.shape[1] :]

    return run
