"""Weights of presets and what a step reads: seeded random initialisation, no construction-time init where
every parameter is written afterwards, bytes per decode step."""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from reference.ops import RMSNorm
from reference.parallel import copy_full_into, full_shape, split_of


class ConstructionInitSkipped(TorchFunctionMode):
    """While active, ``torch.nn.init``'s fills and ``Tensor.uniform_`` / ``normal_`` return their tensor
    untouched: a model built under it holds uninitialised parameters and draws nothing from the global
    generators. For a build whose every parameter is written next (a checkpoint's loader refuses a missing
    tensor; :func:`init_random_weights` refuses a parameter it has no rule for), where ``nn.Linear``'s and
    ``nn.Embedding``'s own init would be thrown away: 4 s of a 270M model's CPU build (perf/NOTES.md v37).
    Values set by construction otherwise (norm weights, the rotary table, a closed-form preset) are kept.
    """

    SKIPPED = frozenset({torch.Tensor.uniform_, torch.Tensor.normal_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.SKIPPED or getattr(func, "__module__", None) == nn.init.__name__:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int) -> None:
    """transformers-style random init, on the parameters' device, from one seeded generator.

    Linear and Embedding weights ~ normal(0, ``config.initializer_range``), Linear biases 0, RMSNorm
    weights at the identity (1 - ``weight_offset``: 1 for Llama/Qwen, 0 for Gemma). Parameters are drawn
    in ``named_modules`` order, each shared (tied) tensor once, so a seed gives the same weights on every
    run on the same device type and dtype. A tensor-parallel shard is cut from the whole tensor drawn as
    one process draws it, so every tensor-parallel size gets the same model.

    Raises:
        TypeError: a parameter of a module type with no rule here (names the parameter).
    """
    std = model.config.initializer_range
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, (nn.Linear, nn.Embedding)) and name == "weight" and split_of(param) is None:
                param.normal_(0.0, std, generator=generator)
            elif isinstance(module, (nn.Linear, nn.Embedding)) and name == "weight":
                whole = torch.empty(full_shape(param), dtype=param.dtype, device=device)
                copy_full_into(param, whole.normal_(0.0, std, generator=generator))
            elif isinstance(module, nn.Linear) and name == "bias":
                param.zero_()
            elif isinstance(module, RMSNorm) and name == "weight":
                param.fill_(1.0 - module.weight_offset)
            else:
                raise TypeError(
                    f"init_random_weights: no rule for {module_name}.{name} of a {type(module).__name__}; "
                    "add one here"
                )


def weight_bytes_per_decode_step(model: nn.Module) -> int:
    """Bytes of parameters one decode step reads from memory (the bandwidth floor's numerator).

    Every parameter counts once, except a parameter used only by ``nn.Embedding`` modules: an untied
    input embedding table is gathered (one row per token), not streamed. A tied embedding is also the
    LM head's weight and counts once. Buffers (rotary tables) are gathered by position and not counted.
    Works on the meta device (shapes and dtypes only): Llama-3.1-8B in bf16 gives 15,009,849,344 bytes.
    For a tensor-parallel model these are one rank's bytes (its shards and the replicated norms).
    """
    streamed: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            continue
        for param in module.parameters(recurse=False):
            streamed[id(param)] = param
    return sum(p.numel() * p.element_size() for p in streamed.values())
