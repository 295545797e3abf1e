"""One start of the test model in a process of its own, on a compile cache folder:
``python -m conformance.compile_cache_worker CACHE_DIR [--device D] [--mode M] [--overrides JSON] [--save PATH]``.

conformance/test_compile_cache.py starts two at once (both must run, print the same logits and leave one whole
entry), and, on CUDA, one after another: the second is a warm start in a fresh process, which has launched no
kernel yet (a start inside the test's own process finds the first start's kernels loaded). It prints
``LOGITS <sum>`` and ``HITS <compile-cache hits>``; ``--save`` also writes the prefill's and decodes' logits
(a list of [2, vocab] float32 tensors, on the CPU) with ``torch.save``.

A module of the package, run from the repository's root, rather than a script written into a temporary folder:
a worker whose working folder is elsewhere cannot run under mutmut, whose trampolines read their settings from
the working folder.
"""

import argparse
import json

import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import make_runner, small_llama_config
from conformance.implementation import ReferenceImplementation
from reference.benchmark.cli import device_name


def _json_object(text: str) -> dict:
    """``--overrides``: a JSON object of CompilationConfig fields; anything else is argparse's one-line error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__} {text!r}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m conformance.compile_cache_worker")
    parser.add_argument("cache_dir")
    parser.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda[:N] where this machine has it")
    parser.add_argument("--mode", default="no_inductor")
    parser.add_argument("--overrides", type=_json_object, default={}, help="CompilationConfig fields, as JSON")
    parser.add_argument("--save", help="where to torch.save the logits")
    args = parser.parse_args()
    try:
        runner = make_runner(ReferenceImplementation(), args.mode, small_llama_config(), device=args.device,
                             cache_dir=args.cache_dir, max_num_seqs=2, max_model_len=16,
                             max_cudagraph_capture_size=16, **args.overrides)  # fmt: skip
    except (TypeError, ValueError) as err:  # an unknown field, a bad value or mode: the config's own message
        parser.error(f"--overrides / --mode: {err}")
    stats = runner.warm_up()
    logits = prefill_and_decode({"r": runner}, [[3, 14, 15, 92, 65], [35, 89, 79]], num_decode=3, leader="r")["r"]
    if args.save:
        torch.save([step.cpu() for step in logits], args.save)
    print("LOGITS", torch.stack(logits).sum().item())
    print("HITS", stats.compile_cache_hits)
