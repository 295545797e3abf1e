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
import hashlib
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

from reference.benchmark.baselines import build_hf_model, make_baseline
from reference.benchmark.choices import HF_BASELINES, TORCH_NATIVE_MODE, mode_kwargs
from reference.benchmark.floor import floor_bandwidth
from reference.benchmark.machine import benchmark_threads, machine_info, source_commit
from reference.benchmark.timing import latency_stats, release, time_calls
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams
from reference.models import registry
from reference.models.weights import weight_bytes_per_decode_step
from reference.ops import kernel_backend
from reference.peers import compile_torch_native

# capture.py's warning for a piecewise config on a CPU
NO_GRAPHS_WARNING = r"CUDA graphs asked for \(cudagraph_mode="


class Interrupted(Exception):
    """Ctrl-C stopped the run before any mode finished (the message says during which)."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark every mode and baseline of ``args`` (the parsed ``bench_latency`` flags); returns the
    results document (described in :func:`reference.bench_latency.main`)."""
    device = torch.device(args.device)  # under tensor parallelism, the first LLM says this rank's device
    threads_before = torch.get_num_threads()
    torch.set_num_threads(benchmark_threads(device, args.threads))
    try:
        return _run(args, device)
    finally:
        torch.set_num_threads(threads_before)  # a caller in the same process (the tests) keeps its own


def _run(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    load_at_start = [round(x, 2) for x in os.getloadavg()]  # a busy machine moves every number
    vocab = registry.model_config(args.model).vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    results: list[dict[str, Any]] = []
    reference_tokens = None  # the first mode's output, for the agreement column
    owner: LLM | None = None  # the LLM holding the weights
    weight_bytes = None
    current = None  # the run under way, for the message if Ctrl-C stops it
    try:
        for mode in args.modes:
            current = mode
            llm = _build_llm(args, device, owner, **mode_kwargs(mode, args.compilation_config))
            if owner is None:  # one rank's bytes under tensor parallelism: the ranks read their shards at once
                owner, weight_bytes, device = llm, weight_bytes_per_decode_step(llm.model), llm.device
                bandwidth = floor_bandwidth(device)
                # drawn once the first LLM has checked that its KV cache fits --batch-size prompts
                generator = torch.Generator().manual_seed(args.seed)
                prompt_ids = torch.randint(0, vocab, (args.batch_size, args.input_len), generator=generator)  # [B, S]
            result, tokens = _time_mode(args, mode, llm, prompt_ids.tolist(), params, device)
            reference_tokens = reference_tokens or tokens
            result["same_tokens_as_first"] = _agreement(tokens, reference_tokens)
            results.append(result)
            if llm is not owner:
                del llm
                release(device)
        hf_baselines = [name for name in args.baselines if name in HF_BASELINES]
        hf = build_hf_model(args.model, owner.model) if hf_baselines else None  # one copy for all of them
        if "torch-native" in args.baselines:
            current = "torch-native"
            results.append(_torch_native(args, device, owner, prompt_ids.tolist(), params, reference_tokens))
        for name in hf_baselines:
            current = name
            results.append(_hf_baseline(args, name, hf, prompt_ids.to(device), device, reference_tokens))
        del hf
        release(device)
    except KeyboardInterrupt:  # Ctrl-C: keep what finished, say where it stopped
        runs = len(args.modes) + len(args.baselines)
        interrupted = f"interrupted during {current}: {len(results)} of {runs} runs finished"
        if not results:
            raise Interrupted(interrupted) from None
    else:
        interrupted = None

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
            "tensor_parallel_size": args.tensor_parallel_size,
            "compilation_config_overrides": args.compilation_config,
        },
        "weight_bytes_per_decode_step": weight_bytes,
        "bandwidth_Bps": bandwidth.bytes_per_s if bandwidth else None,
        "bandwidth_method": bandwidth.source if bandwidth else None,
        "bandwidth_measured_Bps": bandwidth.measured_bytes_per_s if bandwidth else None,
        "results": results,
        **({"interrupted": interrupted} if interrupted else {}),
        "env": {
            **machine_info(device),  # gpu, cpu, threads, load average and GPU clocks after the run
            "load_avg_at_start": load_at_start,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "custom_op_kernels": kernel_backend(device),
            "commit": source_commit(Path(__file__).resolve().parents[2]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": f"{args.prog} " + shlex.join(args.argv),
        },
    }


def _build_llm(args: argparse.Namespace, device: torch.device, owner: LLM | None, **kwargs) -> LLM:
    """An LLM of ``args.model`` sized for the run, sharing ``owner``'s weights; ``kwargs``: the mode's."""
    with warnings.catch_warnings():  # said once, under the table (report.markdown_header), not mid-bar
        warnings.filterwarnings("ignore", message=NO_GRAPHS_WARNING, category=RuntimeWarning)
        return LLM(
            args.model,
            dtype=args.dtype,
            device=device,
            seed=args.seed,
            max_num_seqs=args.batch_size,
            max_model_len=args.input_len + args.output_len,
            max_num_batched_tokens=args.batch_size * args.input_len,  # the prefill, the largest step
            share_weights_with=owner,
            tensor_parallel_size=args.tensor_parallel_size,
            skip_tokenizer_init=True,  # token-id prompts, ignore_eos: a tokenizer would only be a way to fail
            **kwargs,
        )


def _time_mode(args, mode: str, llm: LLM, prompts, params, device) -> tuple[dict[str, Any], list[list[int]]]:
    """Warm-up and timed ``generate`` calls of one mode; its result row (without the agreement column)
    and the tokens it generated."""
    quiet = llm.tensor_parallel.rank != 0
    calls = args.num_iters_warmup + args.num_iters
    label = None if quiet else f"{mode}: {args.num_iters_warmup} warm-up + {args.num_iters} timed generates"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NO_GRAPHS_WARNING, category=RuntimeWarning)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # the ranks start timing together
        times, outputs = time_calls(lambda: llm.generate(prompts, params, use_tqdm=False), device, calls, label)
    times = times[args.num_iters_warmup :]
    result = {
        "mode": mode,
        "kind": "engine",
        "latency_s": latency_stats(times),
        "iters": len(times),
        "startup": {
            "load_s": llm.load_s,
            "compile_s": llm.startup.compile_s,
            "compile_cache_hits": llm.startup.compile_cache_hits,
            "capture_s": llm.startup.capture_s,
            "graph_gib": llm.startup.graph_gib,
            "capture_sizes": list(llm.startup.capture_sizes),
            "full_capture_sizes": list(llm.startup.full_capture_sizes),
        },
        "compilation_config": llm.config.describe(),
        "custom_ops": llm.custom_ops,
    }
    tokens = [o.outputs[0].token_ids for o in outputs]
    result["token_digests"] = token_digests(tokens)
    if not quiet:
        print(f"{mode}: p50 {result['latency_s']['p50']:.4f} s", file=sys.stderr)
    return result, tokens


def _hf_baseline(args, name: str, hf, input_ids: torch.Tensor, device, reference_tokens) -> dict[str, Any]:
    """A transformers ``generate`` baseline (``hf-eager``, ``hf-compile``) on the same weights."""
    baseline = make_baseline(name, hf, args.output_len)
    warmup = args.num_iters_warmup_baseline
    label = f"{name}: {warmup} warm-up + {args.num_iters_baseline} timed generates"
    times, out = time_calls(lambda: baseline(input_ids), device, warmup + args.num_iters_baseline, label)
    first_call_s, times = times[0], times[warmup:]  # the first call compiles hf-compile
    print(f"{name}: p50 {latency_stats(times)['p50']:.4f} s", file=sys.stderr)
    return {
        "mode": name,
        "kind": "baseline",
        "latency_s": latency_stats(times),
        "iters": len(times),
        "startup": {"first_call_s": first_call_s},
        "same_tokens_as_first": _agreement(out.tolist(), reference_tokens),
        "token_digests": token_digests(out.tolist()),
    }


def _torch_native(args, device, owner: LLM, prompts, params, reference_tokens) -> dict[str, Any]:
    """The ``torch-native`` baseline: torch's own piecewise path (reference.peers) compiling the model in
    this project's engine, with the ``inductor`` mode's config; its start-up is compile + capture."""
    llm = _build_llm(args, device, owner, **mode_kwargs(TORCH_NATIVE_MODE, None), compile_fn=compile_torch_native)
    warmup = args.num_iters_warmup_baseline
    label = f"torch-native: {warmup} warm-up + {args.num_iters_baseline} timed generates"
    times, outputs = time_calls(
        lambda: llm.generate(prompts, params, use_tqdm=False), device, warmup + args.num_iters_baseline, label
    )
    times = times[warmup:]
    result = {
        "mode": "torch-native",
        "kind": "baseline",
        "latency_s": latency_stats(times),
        "iters": len(times),
        "startup": {"first_call_s": llm.startup.compile_s + llm.startup.capture_s},
        "compilation_config": llm.config.describe(),
        "same_tokens_as_first": _agreement([o.outputs[0].token_ids for o in outputs], reference_tokens),
        "token_digests": token_digests([o.outputs[0].token_ids for o in outputs]),
    }
    print(f"torch-native: p50 {result['latency_s']['p50']:.4f} s", file=sys.stderr)
    llm = None  # freed before the device's cache is emptied
    release(device)
    return result


def token_digests(tokens: list[list[int]]) -> list[str]:
    """Each sequence's generated token ids as the first 16 hex digits of the SHA-256 of their decimal spelling
    joined by commas: what ``python -m reference.report --compare`` needs to say whether two runs generated the
    same tokens, in 16 characters a sequence instead of its ``output_len`` ids."""
    return [hashlib.sha256(",".join(map(str, seq)).encode()).hexdigest()[:16] for seq in tokens]


def _agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Fraction of sequences whose generated tokens equal the reference's."""
    return sum(a == b for a, b in zip(tokens, reference)) / len(reference)
