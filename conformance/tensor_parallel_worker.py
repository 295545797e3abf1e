"""One rank of a tensor-parallel conformance run; conformance/test_tensor_parallel.py starts it with
``torchrun --standalone --nproc-per-node SIZE -m conformance.tensor_parallel_worker ...``.

Each rank builds the preset's model twice from the same weights: whole (one process) and as its shard of
a ``SIZE``-way group (loaded from the whole model's transformers-named tensors, so the loader's sharding is
what is tested). For every mode it compiles both with the implementation under test, feeds both the
same prefill and greedy decode steps (the whole model's argmax), and records the logits and the
compilation-counter deltas of each. Then it generates with ``LLM(..., tensor_parallel_size=1)`` and
``SIZE``. The test reads ``rank<R>.pt`` and asserts; the worker checks nothing itself.

The implementation comes from ``--impl`` (as pytest's), and its ``activate()`` is entered around all of
it, so a fault of the catalogue is planted in these processes too.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from conformance.driver import prefill_and_decode, run_steps
from conformance.helpers import perturb_norms, token_ids
from conformance.implementation import make_runner
from conformance.selection import load_implementation
from reference import parallel
from reference.compilation import compilation_counter
from reference.config import mode_config
from reference.engine import LLM, SamplingParams
from reference.models import registry
from reference.models.loader import hf_state_dict, load_weights
from reference.ops import CustomOpSelection

PROMPT_LENGTHS = (5, 3, 7)  # three sequences: decode steps of 3 tokens, padded to capture size 4
CAPTURE_SIZES = [1, 2, 4]
NUM_DECODE = 4
SIZES = {"max_num_seqs": 4, "max_model_len": 32}
# The presets the suite launches this worker for, one torchrun run each (conformance/test_tensor_parallel.py)
MODELS = ("llama-tiny", "qwen3-tiny", "gemma-3-tiny")


def run_mode(impl, preset: str, mode: str, tp: parallel.TensorParallel) -> dict:
    """Logits (``1 + NUM_DECODE`` tensors [seqs, vocab] float32) and counter deltas (compile, warm-up and
    every step) of the whole model and of this rank's shard, fed the same steps."""
    config = mode_config(mode, cudagraph_capture_sizes=CAPTURE_SIZES)
    build = {"dtype": torch.float32, "device": "cpu", "seed": 0}
    whole = perturb_norms(registry.build_model(preset, CustomOpSelection(config), **build), seed=1)
    shard = registry.build_model(preset, CustomOpSelection(config), **build, tensor_parallel=tp)
    load_weights(shard, hf_state_dict(whole).items())
    prompts = [token_ids(n, whole.config.vocab_size, seed=i) for i, n in enumerate(PROMPT_LENGTHS)]
    logits, counters = {}, {}

    for name, model in (("whole", whole), ("shard", shard)):
        torch._dynamo.reset()
        before = dataclasses.asdict(compilation_counter.snapshot())
        runner = make_runner(impl, model, config, **SIZES)
        runner.warm_up()
        if name == "whole":  # greedy from the whole model; the shard is fed the same tokens
            logits[name] = prefill_and_decode({name: runner}, prompts, NUM_DECODE, leader=name)[name]
            steps = [prompts, *([[t] for t in step.argmax(-1).tolist()] for step in logits[name][:-1])]
        else:
            logits[name] = run_steps(runner, steps)
        counters[name] = {k: v - before[k] for k, v in dataclasses.asdict(compilation_counter.snapshot()).items()}
    return {"logits": logits, "counters": counters, "all_reduces": _all_reduces_per_piece(impl, runner)}


def _all_reduces_per_piece(impl, runner) -> list[tuple[bool, int]] | None:
    """``(is_splitting_op, all-reduce nodes)`` per piece of the shard's split graph; None without pieces."""
    backend = getattr(runner.compiled, "backend", None)
    if "pieces" not in impl.capabilities or backend is None:
        return None
    return [
        (piece.is_splitting_op, sum("_c10d_functional.all_reduce" in str(n.target) for n in piece.module.graph.nodes))
        for piece in backend.pieces
    ]


def run_llm(preset: str, tp_size: int) -> dict[str, list[list[int]]]:
    """Greedy token ids of three prompts from ``LLM`` with one process and with ``tp_size``."""
    prompts = [{"prompt_token_ids": [3 + i, 5, 7 + 2 * i][: 1 + i]} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    tokens = {}
    for name, size in (("whole", 1), ("shard", tp_size)):
        torch._dynamo.reset()
        llm = LLM(
            preset,
            compilation_config={"level": 3, "use_inductor": False},
            device="cpu",
            dtype="float32",
            max_num_seqs=4,
            max_model_len=32,
            tensor_parallel_size=size,
            use_tqdm=False,
        )
        tokens[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m conformance.tensor_parallel_worker")
    parser.add_argument("--model", required=True, help="a preset, e.g. llama-tiny")
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--modes", default="eager,no_inductor,inductor", help="comma-separated; may be empty")
    parser.add_argument("--no-llm", action="store_true", help="skip the LLM generations of both sizes")
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    impl = load_implementation(args.impl)
    tp, _ = parallel.init_tensor_parallel(args.size, torch.device("cpu"))
    result = {"rank": tp.rank, "size": tp.size, "modes": {}}
    try:
        with impl.activate(), torch.inference_mode():
            for mode in filter(None, args.modes.split(",")):
                result["modes"][mode] = run_mode(impl, args.model, mode, tp)
            if not args.no_llm:
                result["llm"] = run_llm(args.model, args.size)
        torch.save(result, args.out / f"rank{tp.rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
