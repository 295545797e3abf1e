"""What ``ModelRunner(...)`` decides before its first step: the step budget it accepts, the capture sizes it
keeps, warns about or refuses, and which sizes its warm-up captures (the reference's own runner, on a CPU,
where the decisions are made as on CUDA; nothing is captured)."""

from __future__ import annotations

import re
import warnings
from types import SimpleNamespace

import pytest
import torch

from conformance.helpers import build_llama, points_at, small_llama_config
from reference.config import ConfigError, mode_config
from reference.engine import ModelRunner
from reference.engine.runner import memory_needed
from reference.forward_context import get_forward_context

pytestmark = [pytest.mark.requires("components"), pytest.mark.no_inductor]

HF = small_llama_config()


def _runner(capture_sizes, *, max_num_seqs=4, max_model_len=16, max_num_batched_tokens=None, mode="no_inductor",
            **overrides) -> ModelRunner:  # fmt: skip
    config = mode_config(mode, cudagraph_capture_sizes=capture_sizes, **overrides)
    return ModelRunner(build_llama(HF, config), config, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                       max_num_batched_tokens=max_num_batched_tokens)  # fmt: skip


def test_a_runner_that_ran_no_step_has_dispatched_none():
    runner = _runner([1, 2])
    assert runner.last_dispatch is None
    assert sum(runner.dispatch_counts.values()) == 0
    runner.step([[1, 2, 3]], [0], [0])
    assert runner.last_dispatch is not None and sum(runner.dispatch_counts.values()) == 1


def test_a_step_budget_as_large_as_the_kv_cache_is_accepted_and_one_more_token_refused():
    assert _runner([1, 2], max_num_batched_tokens=4 * 16).max_num_tokens == 64
    message = (
        "max_num_batched_tokens (65) exceeds max_num_seqs x max_model_len (4 x 16 = 64): no step can hold more "
        "tokens than the KV cache; lower it or raise the others"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        _runner([1, 2], max_num_batched_tokens=65)


def test_capture_sizes_above_the_step_budget_are_left_out_with_a_warning_naming_them():
    with pytest.warns(RuntimeWarning) as caught:
        runner = _runner([1, 2, 4, 8, 16], max_num_batched_tokens=8)
    assert runner.capture_sizes == (1, 2, 4, 8)  # a budget-sized step is still captured
    (warning,) = caught
    assert str(warning.message) == (
        "1 capture sizes exceed max_num_batched_tokens (8) and are not captured (no step has that many tokens): [16]"
    )
    assert points_at(warning, __file__)  # stacklevel: the line that built the runner


@pytest.mark.parametrize("count, shown", [(8, "[9, 10, 11, 12, 13, 14, 15, 16]"),
                                          (9, "[9, 10, 11, 12, 13, 14, 15, 16]...")])  # fmt: skip
def test_the_warning_lists_at_most_eight_left_out_sizes(count, shown):
    with pytest.warns(RuntimeWarning) as caught:
        _runner([1, 2, *range(9, 9 + count)], max_num_batched_tokens=8, max_model_len=64)
    assert str(caught[0].message).endswith(f"(no step has that many tokens): {shown}")


@pytest.mark.inductor
@pytest.mark.parametrize("count, shown", [(8, "[9, 10, 11, 12, 13, 14, 15, 16]"),
                                          (9, "[9, 10, 11, 12, 13, 14, 15, 16]...")])  # fmt: skip
def test_the_compile_sizes_warning_lists_at_most_eight_too(count, shown):
    with pytest.warns(RuntimeWarning) as caught:
        _runner([1, 2, 4, 8], max_num_batched_tokens=8, mode="inductor", compile_sizes=list(range(9, 9 + count)))
    (warning,) = caught
    assert str(warning.message) == (
        f"{count} compile sizes exceed max_num_batched_tokens (8) and are not compiled (no step has that many "
        f"tokens): {shown}"
    )


@pytest.mark.parametrize("count, shown", [(8, "[9, 10, 11, 12, 13, 14, 15, 16]"),
                                          (9, "[9, 10, 11, 12, 13, 14, 15, 16]...")])  # fmt: skip
def test_sizes_that_all_exceed_the_step_budget_are_refused_listing_at_most_eight(count, shown):
    message = (
        f"cudagraph_capture_sizes {shown} all exceed max_num_batched_tokens (8): no step could use a graph; "
        "lower the sizes or raise the limit"
    )
    with warnings.catch_warnings(), pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        warnings.simplefilter("ignore")
        _runner(list(range(9, 9 + count)), max_num_batched_tokens=8, max_model_len=64)


@pytest.mark.no_inductor_full
def test_full_graphs_take_the_sizes_a_decode_step_can_have_and_warm_up_leaves_size_1_to_them():
    runner = _runner([1, 2, 4, 8], max_num_seqs=4, mode="no_inductor_full")
    assert runner.full_sizes == (1, 2, 4)  # at most max_num_seqs tokens, 4 included
    assert runner.piecewise_warm_up_sizes == (2, 4, 8)  # 1 token is always a uniform decode: a full graph's
    assert not runner.use_cuda_graphs  # a CPU captures nothing
    piecewise_only = _runner([1, 2, 4, 8], max_num_seqs=4)
    assert piecewise_only.full_sizes == () and piecewise_only.piecewise_warm_up_sizes == (1, 2, 4, 8)


@pytest.mark.no_inductor_full
def test_full_graphs_take_no_size_above_the_step_budget():
    with pytest.warns(RuntimeWarning, match=r"\(no step has that many tokens\): \[4\]$"):
        runner = _runner([1, 2, 4], max_num_seqs=4, max_num_batched_tokens=2, mode="no_inductor_full")
    assert runner.full_sizes == (1, 2)


@pytest.mark.no_inductor_full
def test_decode_only_full_graphs_leave_larger_sizes_out_without_a_word():
    """Under 'full_decode_only' no step is padded to a size past max_num_seqs (prefills run without graphs), so
    a size past the step budget is no different from one past max_num_seqs: neither is captured, neither warned
    of."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = _runner([1, 2, 4, 16], max_num_seqs=4, max_num_batched_tokens=8, mode="no_inductor_full",
                         cudagraph_mode="full_decode_only")  # fmt: skip
    assert (runner.full_sizes, runner.capture_sizes) == ((1, 2, 4), ())


@pytest.mark.no_inductor_full
def test_full_graphs_without_a_decode_size_are_refused():
    message = (
        "cudagraph_mode='full_and_piecewise': no capture size fits a decode step (at most max_num_seqs=4 tokens), "
        "so no full graph could be used; add smaller sizes"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        _runner([8, 16], max_num_seqs=4, mode="no_inductor_full")


@pytest.mark.parametrize("budget, slots", [(1, 3), (2, 3), (20, 21)])
def test_each_input_buffer_is_one_slot_longer_than_any_step_and_holds_the_two_token_trace(budget, slots):
    """No step's inputs may be a view as long as its buffer (Dynamo's duck sizing would tie their sizes)."""
    runner = _runner([1], max_num_seqs=1, max_model_len=32, max_num_batched_tokens=budget)
    assert runner.input_ids.shape == runner.positions.shape == (slots,)


def test_the_memory_a_runner_needs_is_its_kv_cache_and_its_two_input_buffers():
    runner = _runner([1, 2], max_num_seqs=2, max_model_len=16, max_num_batched_tokens=8)
    kv = sum(layer.kv_cache.numel() * layer.kv_cache.element_size() for layer in runner.attention_layers.values())
    assert kv > 0  # allocated in the model's dtype, as the estimate must count it
    assert memory_needed(runner.model, 2, 16, 8) == kv + 2 * 9 * 8  # int64 ids and positions, 8 + 1 slots


@pytest.mark.eager
def test_the_memory_needed_counts_the_kv_cache_in_the_models_dtype():
    """A bfloat16 model's cache takes half a float32 one's bytes (the KV cache is allocated in the model's
    dtype); the two int64 input buffers do not change."""
    model = build_llama(HF, mode_config("eager"))
    buffers = 2 * 9 * 8
    float32 = memory_needed(model, 2, 16, 8) - buffers
    assert memory_needed(model.to(torch.bfloat16), 2, 16, 8) - buffers == float32 // 2 > 0


@pytest.mark.no_inductor_full
def test_dispatch_at_the_edges_of_the_full_and_piecewise_sizes():
    runner = _runner([1, 2, 4, 8], max_num_seqs=4, mode="no_inductor_full")
    cases = {
        (4, True): ("FULL", 4, True),  # the largest full size itself
        (3, True): ("FULL", 4, True),
        (4, False): ("PIECEWISE", 4, False),  # a prefill of a decode size
        (8, False): ("PIECEWISE", 8, False),  # the largest capture size itself
        (9, False): ("NONE", 9, False),
    }
    for (tokens, uniform), (mode, size, descriptor_uniform) in cases.items():
        dispatch = runner.dispatch(tokens, uniform)
        assert dispatch.num_tokens == tokens and dispatch.runtime_mode == mode, (tokens, uniform, dispatch)
        assert (dispatch.descriptor.num_tokens, dispatch.descriptor.uniform_decode) == (size, descriptor_uniform)


class _Recorder:
    """A compiled forward, recorded: per call, the token count it ran at and the forward context's runtime mode
    and batch descriptor (what full and partition graphs key on)."""

    def __init__(self, forward):
        self.forward, self.calls = forward, []

    def __call__(self, input_ids, positions):
        context = get_forward_context()
        self.calls.append((input_ids.shape[0], context.cudagraph_runtime_mode, tuple(context.batch_descriptor)))
        return self.forward(input_ids, positions)


class _TracingRecorder(_Recorder):
    """A recorded :class:`~reference.compilation.capture.CompiledModel`, whose ``awaits_trace`` it passes on."""

    @property
    def awaits_trace(self) -> bool:
        return self.forward.awaits_trace


# (new tokens, context lengths, rows) of four steps: decodes of 1 and 3 sequences, a 3-token prefill, 20 tokens
_STEPS = [([[5]], [0], [0]), ([[5], [6], [7]], [1, 0, 0], [0, 1, 2]), ([[5, 6, 7]], [0], [3]),
          ([[1] * 10, [2] * 10], [0, 0], [1, 2])]  # fmt: skip


@pytest.mark.no_inductor_full
def test_each_step_hands_the_forward_its_size_runtime_mode_and_descriptor_and_the_tracing_step_no_full_graph():
    """The first step traces (the compiled model awaits it): a 1-token decode runs at 2 tokens, outside any full
    graph; then a decode of 3 replays the full graph of 4, a 3-token prefill the piecewise graphs of 4, and 20
    tokens, past every capture size, run at 20 without graphs."""
    runner = _runner([1, 2, 4, 8], max_num_seqs=4, max_num_batched_tokens=32, mode="no_inductor_full")
    runner.compiled = recorder = _TracingRecorder(runner.compiled)
    dispatched = []
    for step in _STEPS:
        runner.step(*step)
        dispatched.append(runner.last_dispatch.runtime_mode)
    assert recorder.calls == [(2, "NONE", (2, True)), (4, "FULL", (4, True)), (4, "PIECEWISE", (4, False)),
                              (20, "NONE", (20, False))]  # fmt: skip
    assert dispatched == ["NONE", "FULL", "PIECEWISE", "NONE"] and runner.dispatch_counts["NONE"] == 2


@pytest.mark.no_inductor_full
def test_a_forward_that_awaits_no_trace_runs_its_first_step_at_the_steps_own_size():
    """A ``compile_fn`` result without ``awaits_trace`` (here the model's own forward) is never padded for a
    trace: a first 1-token decode is the full graph of size 1."""
    runner = _runner([1, 2, 4, 8], max_num_seqs=4, max_num_batched_tokens=32, mode="no_inductor_full")
    runner.compiled = recorder = _Recorder(runner.model.forward)
    runner.step(*_STEPS[0])
    assert recorder.calls == [(1, "FULL", (1, True))] and runner.last_dispatch.runtime_mode == "FULL"


def test_the_warm_ups_compile_step_fills_one_cache_row_per_max_model_len_tokens(monkeypatch):
    """The tracing step runs at the largest capture size (40 here): tokens past one sequence's ``max_model_len``
    (16) go to the next cache row, as many rows as it takes, each from position 0."""
    runner = _runner([1, 2, 40], max_num_batched_tokens=64)
    calls = []
    forward = runner.forward
    monkeypatch.setattr(runner, "forward", lambda *args: calls.append(args) or forward(*args))
    runner.warm_up()
    assert calls[0] == ([[0] * 16, [0] * 16, [0] * 8], [0, 0, 0], [0, 1, 2])
    # steps may have 1 token and a CPU captures no graph of 1 token: a 1-token step compiles that size now
    assert calls[1:] == [([[0]], [0], [0])]


def test_start_up_times_wait_for_the_device_on_cuda_only(monkeypatch):
    """compile_s and capture_s end with a synchronize of the runner's own device (kernels run asynchronously;
    an unsynchronised clock would time only their launches); a CPU has nothing to wait for."""
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    ModelRunner._sync(SimpleNamespace(device=torch.device("cpu")))
    ModelRunner._sync(SimpleNamespace(device=torch.device("cuda", 1)))
    assert waited == [torch.device("cuda", 1)]


class _PositionFree(torch.nn.Module):
    """A model whose config has no ``max_position_embeddings`` (no rotary table to run past), and no attention."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=8)
        self.embed = torch.nn.Embedding(8, 4)

    def forward(self, input_ids, positions):
        return self.embed(input_ids)

    def compute_logits(self, hidden):
        return hidden @ self.embed.weight.T


@pytest.mark.eager
def test_a_model_without_a_position_limit_takes_any_max_model_len():
    runner = ModelRunner(_PositionFree(), mode_config("eager"), max_num_seqs=2, max_model_len=10**6,
                         max_num_batched_tokens=8)  # fmt: skip
    assert runner.step([[1, 2], [3]], [0, 0], [0, 1]).shape == (2, 8)


def test_the_runner_checks_its_own_allocation_against_the_device_naming_its_sizes(monkeypatch):
    """What it hands kv_cache.check_fits: the bytes memory_needed counts, its device, and the two sizes the
    refusal names (test_engine_arguments.py checks the refusal's line itself)."""
    from reference.engine import runner as runner_module

    seen = []
    monkeypatch.setattr(runner_module, "check_fits", lambda *args: seen.append(args))
    runner = _runner([1, 2], max_num_seqs=3, max_model_len=32, max_num_batched_tokens=16)
    assert seen == [(memory_needed(runner.model, 3, 32, 16), torch.device("cpu"), 3, 32)]
