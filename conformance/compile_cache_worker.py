"""One of two processes starting the same model at once on one compile cache folder;
conformance/test_compile_cache.py starts two with ``-m conformance.compile_cache_worker CACHE_DIR`` and checks
that both run, print the same logits and leave one whole entry.

A module of the package, run from the repository's root, rather than a script written into a temporary folder:
a worker whose working folder is elsewhere cannot run under mutmut, whose trampolines read their settings from
the working folder.
"""

import sys

import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import make_runner, small_llama_config
from conformance.implementation import ReferenceImplementation

if __name__ == "__main__":
    runner = make_runner(ReferenceImplementation(), "no_inductor", small_llama_config(), cache_dir=sys.argv[1],
                         max_num_seqs=2, max_model_len=16, max_cudagraph_capture_size=16)  # fmt: skip
    logits = prefill_and_decode({"r": runner}, [[3, 14, 15, 92, 65], [35, 89, 79]], num_decode=3, leader="r")["r"]
    print("LOGITS", torch.stack(logits).sum().item())
