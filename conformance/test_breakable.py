"""Breakable CUDA graphs (mode ``breakable``): the eager model captured into segments broken at the
splitting ops, with no Dynamo trace and no compile.

Its bitwise equality with eager is checked with the other Inductor-free modes in test_equivalence.py;
here: what its start-up does (no trace, no compile, one segment per stretch between attention calls per
capture size) and that it refuses to capture attention into a segment.
"""

from __future__ import annotations

import pytest
import torch

from conformance.helpers import DEVICES, make_runner, small_llama_config
from reference.compilation import expect_counters
from reference.config import ConfigError, mode_config
from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel


@pytest.mark.requires("counters")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["breakable"])
def test_breakable_start_up_neither_traces_nor_compiles(mode, device, impl):
    """On CUDA: per capture size one segment before the first attention call, one after each (layers + 1)."""
    hf = small_llama_config()
    sizes = [2, 4, 8]
    runner = make_runner(impl, mode, hf, device=device, max_num_seqs=4, max_model_len=16, cudagraph_capture_sizes=sizes)
    segments = len(sizes) * (hf.num_hidden_layers + 1) if device == "cuda" else 0
    with expect_counters(num_graphs_seen=0, num_backend_compilations=0, num_cudagraph_captured=segments):
        runner.warm_up()
    assert runner.compiled.backend is None and runner.compiled.breakable is not None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["breakable"])
def test_a_splitting_op_that_returns_a_tensor_cannot_break_a_capture(mode, device, impl):
    """``reference::rms_norm`` as a splitting op returns a new tensor, which the next segment could not follow.
    Refused on a CPU too, where nothing is captured: the config asks for graphs (as the piecewise backend)."""
    runner = make_runner(
        impl,
        mode,
        small_llama_config(),
        device=device,
        dtype=torch.bfloat16 if device == "cuda" else torch.float32,
        max_num_seqs=2,
        max_model_len=16,
        splitting_ops=["reference::rms_norm", "reference::attention"],
        cudagraph_capture_sizes=[4],
    )
    with pytest.raises(
        ConfigError, match=r"'reference::rms_norm' returns tensors; a breakable graph's splitting op must write"
    ):
        runner.warm_up()


@pytest.mark.parametrize("mode", ["breakable"])
@pytest.mark.parametrize(
    "name, refusal",
    [("foo::bar", "is not a registered torch.library op"), ("reference::atention", "is not a registered"),
     ("aten::mm", "is an ATen-level op")],
    ids=["unknown-namespace", "misspelt-op", "aten-op"],
)  # fmt: skip
def test_breakable_graphs_refuse_a_splitting_op_name_that_is_no_custom_op(mode, name, refusal, impl):
    """Breakable graphs break at ops they see at dispatch, so a name that is no custom op would never break a
    capture; it is refused when the model is compiled, as the piecewise backend refuses it, not left to
    surface later as another op's complaint (or, for an untagged op, as one segment and a warning)."""
    with pytest.raises(ConfigError, match=f"splitting_ops: '{name}' {refusal}"):
        impl.compile(SillyModel(), mode_config(mode, splitting_ops=[name, *SILLY_SPLITTING_OPS]))
