"""One latency run: every mode and baseline of a ``bench_latency`` invocation, over one set of weights.

The first mode's :class:`~reference.engine.llm.LLM` builds the model and every later mode (and the
transformers baselines) uses the same weight tensors. Each mode is its own ``LLM`` with its own
compilation, KV cache and CUDA graphs. One iteration is one whole ``generate`` call: ``batch_size``
dummy prompts of ``input_len`` random token ids (seeded, the same for every mode), greedy,
``ignore_eos``, exactly ``output_len`` new tokens each.

The floor next to every latency: a run reads every weight once per generated token (one prefill step
and ``output_len - 1`` decode steps), so it cannot take less than
``output_len * weight_bytes_per_decode_step / bandwidth`` (:mod:`reference.benchmark.floor`). On CPU
there is no floor.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import sys
from typing import Any

import torch
import transformers

from reference.benchmark.baselines import build_hf_model, make_baseline
from reference.benchmark.floor import floor_bandwidth
from reference.benchmark.timing import latency_stats, release, time_calls
from reference.config import MODES as MODE_FIELDS
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams
from reference.models import registry
from reference.models.weights import weight_bytes_per_decode_step
from reference.ops import kernel_backend

# mode -> LLM keyword arguments (from reference.config.MODES); vLLM users know them as --enforce-eager
# and two -O configs.
MODE_KWARGS: dict[str, dict[str, Any]] = {
    mode: {"enforce_eager": True} if mode == "eager" else {"compilation_config": dict(fields)}
    for mode, fields in MODE_FIELDS.items()
}


def mode_kwargs(mode: str, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """LLM keyword arguments of ``mode``, with ``overrides`` applied to a compiled mode's config."""
    kwargs = dict(MODE_KWARGS[mode])
    if overrides and "compilation_config" in kwargs:
        kwargs["compilation_config"] = {**kwargs["compilation_config"], **overrides}
    return kwargs


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark every mode and baseline of ``args`` (the parsed ``bench_latency`` flags); returns the
    results document (described in :func:`reference.bench_latency.main`)."""
    device = torch.device(args.device)
    bandwidth = floor_bandwidth(device)
    vocab = registry.model_config(args.model).get_text_config().vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    prompt_ids = torch.randint(0, vocab, (args.batch_size, args.input_len), generator=generator)  # [B, S]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    results: list[dict[str, Any]] = []
    reference_tokens = None  # the first mode's output, for the agreement column
    owner: LLM | None = None  # the LLM holding the weights
    weight_bytes = None
    for mode in args.modes:
        llm = LLM(
            args.model,
            dtype=args.dtype,
            device=device,
            seed=args.seed,
            max_num_seqs=args.batch_size,
            max_model_len=args.input_len + args.output_len,
            share_weights_with=owner,
            **mode_kwargs(mode, args.compilation_config),
        )
        if owner is None:
            owner, weight_bytes = llm, weight_bytes_per_decode_step(llm.model)
        prompts = prompt_ids.tolist()
        times, outputs = time_calls(
            lambda: llm.generate(prompts, params, use_tqdm=False), device, args.num_iters_warmup + args.num_iters
        )
        times = times[args.num_iters_warmup :]
        tokens = [o.outputs[0].token_ids for o in outputs]
        reference_tokens = reference_tokens or tokens
        results.append(
            {
                "mode": mode,
                "kind": "engine",
                "latency_s": latency_stats(times),
                "iters": len(times),
                "startup": {
                    "load_s": llm.load_s,
                    "compile_s": llm.startup.compile_s,
                    "capture_s": llm.startup.capture_s,
                    "graph_gib": llm.startup.graph_gib,
                    "capture_sizes": list(llm.startup.capture_sizes),
                },
                "compilation_config": llm.config.describe(),
                "custom_ops": llm.custom_ops,
                "same_tokens_as_first": _agreement(tokens, reference_tokens),
            }
        )
        print(f"{mode}: p50 {results[-1]['latency_s']['p50']:.4f} s", file=sys.stderr)
        if llm is not owner:
            del llm
            release(device)

    hf = build_hf_model(args.model, owner.model) if args.baselines else None  # one copy for all baselines
    for name in args.baselines:
        baseline = make_baseline(name, hf, args.output_len)
        input_ids = prompt_ids.to(device)
        warmup = args.num_iters_warmup_baseline
        times, out = time_calls(lambda: baseline(input_ids), device, warmup + args.num_iters_baseline)
        first_call_s, times = times[0], times[warmup:]  # the first call compiles hf-compile
        results.append(
            {
                "mode": name,
                "kind": "baseline",
                "latency_s": latency_stats(times),
                "iters": len(times),
                "startup": {"first_call_s": first_call_s},
                "same_tokens_as_first": _agreement(out.tolist(), reference_tokens),
            }
        )
        print(f"{name}: p50 {results[-1]['latency_s']['p50']:.4f} s", file=sys.stderr)
    del hf
    release(device)

    floor = args.output_len * weight_bytes / bandwidth.bytes_per_s if bandwidth else None
    baseline_p50 = {r["mode"]: r["latency_s"]["p50"] for r in results if r["kind"] == "baseline"}
    for r in results:
        p50 = r["latency_s"]["p50"]
        r["tokens_per_s"] = args.batch_size * args.output_len / p50
        r["floor_s"] = floor
        r["x_floor"] = p50 / floor if floor else None
        if r["kind"] == "engine":
            r["speedup_vs"] = {name: b / p50 for name, b in baseline_p50.items()}
    return {
        "model": args.model,
        "settings": {
            "batch_size": args.batch_size,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "num_iters_warmup": args.num_iters_warmup,
            "num_iters": args.num_iters,
            "num_iters_baseline": args.num_iters_baseline,
            "num_iters_warmup_baseline": args.num_iters_warmup_baseline,
            "dtype": str(owner.dtype).removeprefix("torch."),
            "device": str(device),
            "compilation_config_overrides": args.compilation_config,
        },
        "weight_bytes_per_decode_step": weight_bytes,
        "bandwidth_Bps": bandwidth.bytes_per_s if bandwidth else None,
        "bandwidth_method": bandwidth.source if bandwidth else None,
        "bandwidth_measured_Bps": bandwidth.measured_bytes_per_s if bandwidth else None,
        "results": results,
        "env": {
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "custom_op_kernels": kernel_backend(device),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": "python -m reference.bench_latency " + shlex.join(args.argv),
        },
    }


def _agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Fraction of sequences whose generated tokens equal the reference's."""
    return sum(a == b for a, b in zip(tokens, reference)) / len(reference)
