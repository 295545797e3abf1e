"""``debug_cudagraph_outputs`` (CUDA only): a graph output read after a later call replayed over it raises.

A replay's outputs live in the graph pool until the model's next call, which writes over them; with the
switch on, a read of such a tensor raises, naming the graph and the size that produced it, instead of
returning the later step's values (torch's CUDA graph trees do the same for theirs).
"""

from __future__ import annotations

import pytest
import torch

from conformance.helpers import COMPILED_MODES, make_runner, small_llama_config

pytestmark = pytest.mark.gpu
BF16 = dict(device="cuda", dtype=torch.bfloat16)
ROWS, CONTEXT = [0, 1, 2], [0, 0, 0]  # three one-token sequences: a decode step, padded to size 4


def _two_steps(runner) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the first step's output, a copy of it taken in time, the second step's output)."""
    runner.warm_up()
    first = runner.forward([[5], [6], [7]], CONTEXT, ROWS)
    kept = first.clone()
    second = runner.forward([[8], [9], [10]], CONTEXT, ROWS)
    assert not torch.equal(second, kept)  # other tokens: a stale read would show other values
    return first, kept, second


@pytest.mark.requires("stale_output_checks")
@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_reading_an_output_a_later_call_replayed_over_raises_naming_the_graph_and_size(mode, impl):
    runner = make_runner(impl, mode, small_llama_config(), **BF16, max_cudagraph_capture_size=16,
                         debug_cudagraph_outputs=True)  # fmt: skip
    first, kept, second = _two_steps(runner)
    graph = "the full graph" if runner.full_sizes else "the breakable segments" if mode == "breakable" else "piece "
    with pytest.raises(RuntimeError, match=rf"debug_cudagraph_outputs: this tensor is the output of {graph}.*size 4"):
        first.float().sum().item()
    torch.testing.assert_close(second.clone(), second)  # the current call's output stays readable
    assert torch.isfinite(kept).all()


@pytest.mark.requires("components")
@pytest.mark.no_inductor
def test_without_the_switch_a_stale_output_silently_holds_the_later_steps_values(impl):
    """What the switch exists for: off (the default, at no cost), the first step's tensor now reads as the
    second step's."""
    runner = make_runner(impl, "no_inductor", small_llama_config(), **BF16, max_cudagraph_capture_size=16)
    first, kept, second = _two_steps(runner)
    assert torch.equal(first, second) and not torch.equal(first, kept)
