"""``cudagraph_num_of_warmups``: a piece runs plainly that many times at a size before the size is captured, and
at least once.

The warm-up runs are what keep lazy initialisation (cuBLAS handles, autotuning, module loading) out of
the graphs, so the count the config asks for is the count that must happen. 0 (vLLM's default) runs as 1: a
capture at a size's first run would hold the first launch of whichever kernels that size compiles to, and Triton
loads a kernel's binary at its first launch, which a capture does not allow (the reference's
``plain_runs_before_capture``; a fresh-process rule in conformance/test_compile_cache.py and an in-process one in
conformance/test_kernel_warm_up.py run such starts on CUDA). The silly model's test is CUDA
only (marked gpu): it has 3 capturable pieces, so capturing a size counts 3 captures, and its output has
an exact closed form at every call, warm-up, capture or replay. The count itself, which the piecewise,
full and breakable graphs share (the reference's ``WarmUpCount``), is checked on any device.
"""

from __future__ import annotations

import pytest
import torch

from reference.compilation import expect_counters
from reference.compilation.cuda_graph import WarmUpCount
from reference.config import mode_config
from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel, expected_output


@pytest.mark.gpu
@pytest.mark.requires("counters")
@pytest.mark.parametrize("warmups", [0, 1, 3])
@pytest.mark.parametrize("mode", ["no_inductor"])  # the warm-up count is the graphs' business, not the compiler's
def test_a_size_is_captured_after_exactly_num_of_warmups_plain_runs(mode, warmups, impl):
    config = mode_config(
        mode, splitting_ops=SILLY_SPLITTING_OPS, cudagraph_capture_sizes=[2], cudagraph_num_of_warmups=warmups
    )
    compiled = impl.compile(SillyModel(), config)
    x = torch.zeros(2, 8, device="cuda")
    plain = max(warmups, 1)
    for call in range(plain + 3):  # warm-ups (the first also traces), the capture, two replays
        with expect_counters(num_cudagraph_captured=3 if call == plain else 0):
            x.copy_(torch.randn(x.shape))
            out = compiled(x)
            torch.testing.assert_close(out, expected_output(x), rtol=0, atol=0, msg=lambda m: f"call {call}: {m}")


@pytest.mark.parametrize("warmups", [0, 1, 3])
def test_each_key_captures_after_its_own_warm_ups(warmups):
    count, plain = WarmUpCount(warmups), max(warmups, 1)  # 0 runs as 1: no capture at a size's first run
    due = [(key, count.capture_due(key)) for key in [8, 4, 8, 8, 4, 8, 4, 4, 4]]
    for key in (8, 4):
        calls = [d for k, d in due if k == key]  # the two keys interleaved: each counts its own
        assert calls == [False] * min(plain, len(calls)) + [True] * (len(calls) - min(plain, len(calls)))

