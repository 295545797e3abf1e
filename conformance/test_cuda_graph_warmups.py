"""``cudagraph_num_of_warmups``: a piece runs plainly that many times at a size before the size is captured.

The warm-up runs are what keep lazy initialisation (cuBLAS handles, autotuning, module loading) out of
the graphs, so the count the config asks for is the count that must happen. The silly model's test is CUDA
only (marked gpu): it has 3 capturable pieces, so capturing a size counts 3 captures, and its output has
an exact closed form at every call, warm-up, capture or replay. The count itself, which the piecewise,
full and breakable graphs share (the reference's ``WarmUpCount``), is checked on any device, as is its plain run
before a wrapper's first capture where no warm-up ran (0 warm-ups), which keeps each kernel's first launch out of
the captures.
"""

from __future__ import annotations

import pytest
import torch

from reference.compilation import compilation_counter, expect_counters
from reference.compilation import cuda_graph
from reference.compilation.compile_piece import SizeDispatch
from reference.compilation.cuda_graph import CUDAGraphPiece, WarmUpCount
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
    for call in range(warmups + 3):  # warm-ups (the first also traces), the capture, two replays
        with expect_counters(num_cudagraph_captured=3 if call == warmups else 0):
            x.copy_(torch.randn(x.shape))
            out = compiled(x)
            torch.testing.assert_close(out, expected_output(x), rtol=0, atol=0, msg=lambda m: f"call {call}: {m}")


@pytest.mark.parametrize("warmups", [0, 1, 3])
def test_each_key_captures_after_its_own_warm_ups(warmups):
    count = WarmUpCount(warmups)
    due = [(key, count.capture_due(key)) for key in [8, 4, 8, 8, 4, 8, 4, 4, 4]]
    for key in (8, 4):
        calls = [d for k, d in due if k == key]  # the two keys interleaved: each counts its own
        assert calls == [False] * min(warmups, len(calls)) + [True] * (len(calls) - min(warmups, len(calls)))


@pytest.mark.parametrize("warmups", [0, 1])
def test_with_no_warm_ups_each_code_runs_once_plainly_before_its_first_capture(warmups):
    """With 0 warm-ups a capture would hold the first launch of every kernel (module doc): the symbolic-shape code
    (None) runs plainly before its first capture, and a static compile (its size) before its own; with 1 or more
    the keys' own warm-ups have run the code, and nothing more runs."""
    count, runs = WarmUpCount(warmups), []
    before = compilation_counter.num_cudagraph_eager_runs
    for key, code in [(8, None), (8, None), (4, None), (16, 16), (16, 16), (2, None)]:
        if count.capture_due(key):
            count.load_before_first_capture(lambda k=key: runs.append(k), code)
    assert runs == ([8, 16] if warmups == 0 else [])
    assert compilation_counter.num_cudagraph_eager_runs - before == len(runs), "a plain run not counted as eager"


def test_with_no_warm_ups_a_piece_runs_its_symbolic_and_each_static_compile_plainly_before_capturing_it(monkeypatch):
    """A piece over Inductor's static compiles (``compile_sizes``) captures other kernels at those sizes than at
    the rest: each code runs plainly once before its first capture. The capture itself is a stand-in that runs
    nothing, so the calls seen are the plain runs alone."""
    calls = []
    generic = lambda x, n: calls.append(("symbolic", n)) or x  # noqa: E731
    static = lambda x, n: calls.append(("static", n)) or x  # noqa: E731
    monkeypatch.setattr(cuda_graph, "capture_graph", lambda fn, args, pool, stream: (None, "captured"))
    piece = CUDAGraphPiece("submod_0", SizeDispatch(generic, {16: static}, (1,)), size_args=(1,),
                           capture_sizes=(8, 16, 32), num_warmups=0, pool=None, stream=None, debug_addresses=False)  # fmt: skip
    for n in (32, 16, 8):
        assert piece(torch.zeros(n), n) == "captured"
    assert calls == [("symbolic", 32), ("static", 16)]
