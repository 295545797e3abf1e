"""One throughput run: a workload of random requests through one ``generate`` call per (mode, scheduling).

The workload is drawn once (:func:`draw_workload`) and every row runs all of it. The first row's
:class:`~reference.engine.llm.LLM` builds the weights and every later one shares them; each row is its own
``LLM`` (its compilation, KV cache, CUDA graphs and scheduling), built untimed (``startup_s``), warmed up by
one small untimed ``generate``, then timed over one ``generate`` of every request between device
synchronisations. A step is one call of the runner (one forward of the model); the engine's last call,
which only reads the tokens of the step before, runs none and is not counted.

Each row's tokens are compared with those of the first mode's row of the same scheduling, which ran the
same batches. Across schedulings the batches differ, and another batch moves a request's logits by
rounding (conformance/test_generate_batching.py), enough to flip a greedy near-tie. On a CPU in float32
eager and the Inductor-free modes then agree on every request; on a GPU in bfloat16 a step padded to a
capture size multiplies matrices of another shape, and random weights, whose best logits lie close,
can part most requests somewhere along their tokens, so there the column is a hint, not a check.

The floor of a decode step (every running sequence fed one token) is the bytes it must move over the memory
bandwidth (:mod:`reference.benchmark.floor`): every weight read once (:func:`weight_bytes_per_decode_step`),
and in each layer the keys and values of every sequence's cached context read once and the new token's written
once; a layer with a sliding window of ``w`` tokens attends to the last ``w`` positions only (the new one
included), so it moves at most ``w`` tokens a sequence (:func:`decode_kv_bytes`). The embedding rows gathered
and the logits written are left out (a few MB at most). Under continuous batching the contexts grow to
hundreds of tokens, so the KV cache, not the weights, is most of a step's bytes: a floor of weights alone
would flatter a long run. A row's ``decode_floor`` compares the decode steps' mean time with their mean floor.
"""

from __future__ import annotations

import argparse
import datetime
import random
import shlex
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reference.benchmark.choices import mode_kwargs
from reference.benchmark.floor import Bandwidth, floor_bandwidth
from reference.benchmark.latency import NO_GRAPHS_WARNING
from reference.benchmark.machine import benchmark_threads, machine_info, source_commit
from reference.benchmark.timing import release, sync
from reference.engine.kv_cache import free_kv_caches, kv_bytes_per_token, kv_bytes_per_token_by_window
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams
from reference.models import registry
from reference.models.weights import weight_bytes_per_decode_step

# token ids below this are left out of prompts: 0-2 are pad / unk, BOS and EOS in the tiny presets and
# SentencePiece vocabularies (elsewhere they are ordinary tokens, and leaving them out costs nothing)
FIRST_PROMPT_TOKEN = 3
# the warm-up: this many of the workload's requests, each at most this many tokens out (a prefill and a decode)
WARMUP_REQUESTS, WARMUP_MAX_TOKENS = 4, 2


class Interrupted(Exception):
    """Ctrl-C stopped the run before any row finished (the message says during which)."""


@dataclass(frozen=True)
class Workload:
    """The requests of a run: ``prompts[i]`` (token ids) generates exactly ``output_lens[i]`` tokens."""

    prompts: list[list[int]]
    output_lens: list[int]

    def describe(self) -> dict[str, Any]:
        inputs = [len(p) for p in self.prompts]
        return {
            "input_lens": inputs,
            "output_lens": self.output_lens,
            "prompt_tokens": sum(inputs),
            "output_tokens": sum(self.output_lens),
        }


# Host bytes per token a workload holds while it runs, and per request (tracemalloc, CPython 3.11, this machine):
# a token id is an int object in a list, 41-43 bytes in the drawn prompts, 8 more for the engine's list of it, and
# the same for each generated token; a request is about 390 bytes of lists and SamplingParams in the workload and
# 460 in the engine. Rounded up: a bound on what cannot fit, not a prediction.
HOST_BYTES_PER_TOKEN = 56
HOST_BYTES_PER_REQUEST = 1024


def workload_host_bytes(num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int]) -> int:
    """Bytes of host memory ``num_prompts`` requests can hold at their longest (each ``input_len`` and
    ``output_len``'s MAX tokens): what ``draw_workload`` and the engine keep as Python lists."""
    tokens = input_len[1] + output_len[1]
    return num_prompts * (tokens * HOST_BYTES_PER_TOKEN + HOST_BYTES_PER_REQUEST)


def draw_workload(
    seed: int, num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab_size: int
) -> Workload:
    """``num_prompts`` requests drawn with ``random.Random(seed)``: every input length (uniform over
    ``input_len``'s inclusive MIN..MAX), then every output length, then each prompt's token ids (uniform in
    ``[FIRST_PROMPT_TOKEN, vocab_size)``)."""
    rng = random.Random(seed)
    inputs = [rng.randint(*input_len) for _ in range(num_prompts)]
    outputs = [rng.randint(*output_len) for _ in range(num_prompts)]
    prompts = [[rng.randrange(FIRST_PROMPT_TOKEN, vocab_size) for _ in range(n)] for n in inputs]
    return Workload(prompts, outputs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every (mode, scheduling) row of ``args`` (the parsed ``bench_throughput`` flags); returns the results
    document (described in :func:`reference.bench_throughput.main`).

    Raises:
        Interrupted: Ctrl-C before any row finished (after one, the document says where it stopped).
        reference.config.ConfigError: the KV cache and buffers do not fit the device's memory.
    """
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    threads_before = torch.get_num_threads()
    torch.set_num_threads(benchmark_threads(device, None))
    try:
        return _run(args, device)
    finally:
        torch.set_num_threads(threads_before)  # a caller in the same process (the tests) keeps its own


def _run(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    vocab = registry.model_config(args.model).vocab_size
    bandwidth = floor_bandwidth(device)  # before any weights: the probe's 2 GiB are freed again
    workload = draw_workload(args.seed, args.num_prompts, args.input_len, args.output_len, vocab)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    # the priority policy's order: the longest output first (each request's length is its max_tokens)
    priority = [-n for n in workload.output_lens] if args.scheduling_policy == "priority" else None
    rows: list[dict[str, Any]] = []
    first_tokens: dict[str, list[list[int]]] = {}  # per scheduling, the first mode's: the agreement column
    owner: LLM | None = None  # the LLM holding the weights
    graph_modes = args.cudagraph_mode or [None]  # None: the mode's own
    runs = [(m, g, s) for m in args.modes for g in graph_modes for s in args.scheduling]
    interrupted = None
    try:
        for mode, graphs, scheduling in runs:
            start = time.perf_counter()
            overrides = None if graphs is None else {"cudagraph_mode": graphs}
            llm = _build_llm(args, device, owner, scheduling, **mode_kwargs(mode, overrides))
            startup_s = time.perf_counter() - start
            owner = owner or llm
            row, tokens = _time_generate(llm, workload, params, priority, bandwidth)
            first = first_tokens.setdefault(scheduling, tokens)
            agree = sum(a == b for a, b in zip(tokens, first)) / len(tokens)
            ran = llm.runner.config.cudagraph_mode  # after any lowering for the attention
            rows.append({"mode": mode, "requested_cudagraph_mode": graphs, "cudagraph_mode": ran,
                         "scheduling": scheduling, "startup_s": startup_s, **row,
                         "same_tokens_as_first_mode": agree})  # fmt: skip
            print(
                f"{mode}/{ran}/{scheduling}: {row['requests_per_s']:.1f} requests/s, {row['output_tokens_per_s']:.1f} "
                f"output tokens/s ({row['elapsed_s']:.3f} s, {row['num_steps']} steps)",
                file=sys.stderr,
            )
            if llm is owner:  # it lends its weights to the rows after it, not its KV cache
                free_kv_caches(list(llm.runner.attention_layers.values()))
            del llm
            release(device)  # before the next row allocates its own cache
    except KeyboardInterrupt:  # keep what finished, say where it stopped
        run_name = "/".join(name for name in (mode, graphs, scheduling) if name)
        where = f"interrupted during {run_name}: {len(rows)} of {len(runs)} rows finished"
        if not rows:
            raise Interrupted(where) from None
        interrupted = where
    _add_speedups(rows)
    return {
        "benchmark": "throughput",
        "model": args.model,
        "workload": {
            "seed": args.seed,
            "num_prompts": args.num_prompts,
            "input_len": list(args.input_len),
            "output_len": list(args.output_len),
            "token_range": [FIRST_PROMPT_TOKEN, vocab],  # prompt token ids: FIRST_PROMPT_TOKEN <= id < vocab
            **workload.describe(),
        },
        "engine": {
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": owner.runner.max_num_tokens,
            "max_model_len": owner.max_model_len,
            "enable_chunked_prefill": args.enable_chunked_prefill,
            "scheduling_policy": args.scheduling_policy,
            "dtype": str(owner.dtype).removeprefix("torch."),
            "device": str(owner.device),
        },
        "weight_bytes_per_decode_step": weight_bytes_per_decode_step(owner.model),
        "kv_bytes_per_token": kv_bytes_per_token(list(owner.runner.attention_layers.values()), owner.dtype),
        "kv_sliding_windows": [[window, nbytes] for window, nbytes in _by_window(owner).items() if window is not None],
        "bandwidth_Bps": bandwidth.bytes_per_s if bandwidth else None,
        "bandwidth_method": bandwidth.source if bandwidth else None,
        "bandwidth_measured_Bps": bandwidth.measured_bytes_per_s if bandwidth else None,
        "rows": rows,
        **({"interrupted": interrupted} if interrupted else {}),
        "env": {
            **machine_info(device),  # threads: the run's (benchmark_threads), read before they are restored
            "torch": torch.__version__,
            "commit": source_commit(Path(__file__).resolve().parents[2]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": f"{args.prog} " + shlex.join(args.argv),
        },
    }


def _build_llm(args: argparse.Namespace, device: torch.device, owner: LLM | None, scheduling: str, **kwargs) -> LLM:
    """An LLM of ``args.model`` with the run's limits and ``scheduling``, sharing ``owner``'s weights;
    ``kwargs``: the mode's."""
    with warnings.catch_warnings():  # said once, over the table, not per row
        warnings.filterwarnings("ignore", message=NO_GRAPHS_WARNING, category=RuntimeWarning)
        return LLM(
            args.model,
            dtype=args.dtype,
            device=device,
            seed=args.seed,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            enable_chunked_prefill=args.enable_chunked_prefill,
            scheduling=scheduling,
            scheduling_policy=args.scheduling_policy,
            share_weights_with=owner,
            skip_tokenizer_init=True,  # token-id prompts, ignore_eos: a tokenizer would only be a way to fail
            use_tqdm=False,
            **kwargs,
        )


def _time_generate(
    llm: LLM,
    workload: Workload,
    params: list[SamplingParams],
    priority: list[int] | None,
    bandwidth: Bandwidth | None,
) -> tuple[dict, list[list[int]]]:
    """The warm-up, then the timed ``generate`` of the whole workload (``priority``: generate's, one per
    request, or None) with its steps counted; the row's measured fields and the tokens each request
    generated. ``bandwidth``: the floor's (None: no floor)."""
    warmup = slice(0, WARMUP_REQUESTS)
    warmup_params = [SamplingParams(temperature=0, max_tokens=min(p.max_tokens, WARMUP_MAX_TOKENS), ignore_eos=True)
                     for p in params[warmup]]  # fmt: skip
    runner, counts = llm.runner, {"steps": 0, "tokens": 0}
    clock = _StepClock(llm.device)
    weight_bytes = weight_bytes_per_decode_step(llm.model)
    by_window = _by_window(llm)

    def counted_step(new_tokens, context_lens, rows, fed=None):
        counts["steps"] += 1
        host = len(new_tokens) if isinstance(new_tokens, torch.Tensor) else sum(map(len, new_tokens))
        num_fed = len(new_tokens) if isinstance(new_tokens, torch.Tensor) else 0 if fed is None else len(fed)
        counts["tokens"] += host + (0 if fed is None else len(fed))  # shapes only: no wait for the device
        logits = type(runner).step(runner, new_tokens, context_lens, rows, fed=fed)
        if num_fed == len(rows):  # contexts read, one new token per sequence written
            clock.mark("decode", seqs=len(rows), kv_bytes=decode_kv_bytes(context_lens, by_window))
        else:
            clock.mark("mixed" if num_fed else "prefill")
        return logits

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NO_GRAPHS_WARNING, category=RuntimeWarning)
        llm.generate(workload.prompts[warmup], warmup_params, use_tqdm=False)
        runner.step = counted_step  # the engine calls runner.step: this instance's attribute wins
        try:
            sync(llm.device)
            start = time.perf_counter()
            clock.start()
            outputs = llm.generate(workload.prompts, params, use_tqdm=False, priority=priority)
            sync(llm.device)
            elapsed = time.perf_counter() - start
        finally:
            del runner.step
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    generated = sum(map(len, tokens))
    prompt_tokens = sum(map(len, workload.prompts))
    row = {
        "elapsed_s": elapsed,
        "requests_per_s": len(tokens) / elapsed,
        "output_tokens_per_s": generated / elapsed,
        "total_tokens_per_s": (prompt_tokens + generated) / elapsed,
        "output_tokens": generated,
        "num_steps": counts["steps"],
        "tokens_run": counts["tokens"],
        "step_ms": clock.mean_ms(),
        "decode_floor": _decode_floor(clock, weight_bytes, bandwidth),
    }
    return row, tokens


def _by_window(llm: LLM) -> dict[int | None, int]:
    return kv_bytes_per_token_by_window(list(llm.runner.attention_layers.values()), llm.runner.dtype)


def decode_kv_bytes(context_lens: list[int], bytes_per_token_by_window: dict[int | None, int]) -> int:
    """Bytes of keys and values a decode step moves: for each sequence (``context_lens[i]`` tokens cached
    before the step) its context read and its new token written, ``context + 1`` tokens in a layer without a
    window and ``min(context + 1, window)`` in one with a sliding window (the new position and the ``window -
    1`` before it). ``bytes_per_token_by_window``: :func:`kv_bytes_per_token_by_window`."""
    total = 0
    for window, per_token in bytes_per_token_by_window.items():
        if window is None:
            tokens = sum(context_lens) + len(context_lens)
        else:
            tokens = sum(min(c + 1, window) for c in context_lens)
        total += tokens * per_token
    return total


def _decode_floor(clock: _StepClock, weight_bytes: int, bandwidth: Bandwidth | None) -> dict[str, Any] | None:
    """The decode steps' floor (module doc): ``{"seqs_per_step"``, ``"bytes_per_step"``,
    ``"kv_bytes_per_step"`` (means over the decode steps: sequences, bytes), ``"floor_ms"`` (bytes_per_step /
    bandwidth), ``"x_floor"`` (the steps' mean time / floor_ms)}``, the last two None without a bandwidth (a
    CPU); None when no decode step ran."""
    kv = clock.decode_kv_bytes
    if not kv:
        return None
    per_step = weight_bytes + sum(kv) / len(kv)
    floor_ms = per_step / bandwidth.bytes_per_s * 1e3 if bandwidth else None
    mean_ms = clock.mean_ms()["decode"]["mean_ms"]
    return {
        "seqs_per_step": sum(clock.decode_seqs) / len(kv),
        "bytes_per_step": per_step,
        "kv_bytes_per_step": sum(kv) / len(kv),
        "floor_ms": floor_ms,
        "x_floor": mean_ms / floor_ms if floor_ms else None,
    }


class _StepClock:
    """Each step's share of the timed run, by kind (``decode``: every sequence fed one token; ``prefill``:
    prompt tokens only; ``mixed``: both), as a mean in ms.

    On CUDA an event is recorded after each step and a step's time is the gap to the event before, so it is
    the step's device time while the host keeps ahead of the device (the engine never waits for a step
    before issuing the next), and includes the device's idle time where the host falls behind. On a CPU a
    step runs before its call returns, and the host's clock gives the same gaps."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = []
        self.decode_seqs: list[int] = []  # per decode step: its sequences,
        self.decode_kv_bytes: list[int] = []  # and the KV bytes its floor counts

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self.marks = [("start", self._now())]
        self.decode_seqs, self.decode_kv_bytes = [], []

    def mark(self, kind: str, seqs: int = 0, kv_bytes: int = 0) -> None:
        """A step of ``kind`` was issued; a decode step gives its sequences and the KV bytes it reads and
        writes."""
        self.marks.append((kind, self._now()))
        if kind == "decode":
            self.decode_seqs.append(seqs)
            self.decode_kv_bytes.append(kv_bytes)

    def mean_ms(self) -> dict[str, dict[str, float]]:
        """``{kind: {"count", "mean_ms"}}`` over the marked steps (call after the device is synchronised)."""
        times: dict[str, list[float]] = {}
        for (_, before), (kind, after) in zip(self.marks, self.marks[1:]):
            ms = before.elapsed_time(after) if self.cuda else (after - before) * 1e3
            times.setdefault(kind, []).append(ms)
        return {kind: {"count": len(ms), "mean_ms": sum(ms) / len(ms)} for kind, ms in sorted(times.items())}


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    """Each continuous row's ``speedup_vs_static``: the static elapsed of its mode and requested cudagraph_mode
    / its own (None without one); static rows get None. Keyed by the request: two requested graph kinds may
    run as one after the engine lowered them."""
    static = {(r["mode"], r["requested_cudagraph_mode"]): r["elapsed_s"] for r in rows if r["scheduling"] == "static"}
    for r in rows:
        key = (r["mode"], r["requested_cudagraph_mode"])
        base = static.get(key) if r["scheduling"] == "continuous" else None
        r["speedup_vs_static"] = None if base is None else base / r["elapsed_s"]
