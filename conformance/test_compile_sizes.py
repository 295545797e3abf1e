"""``compile_sizes``: Inductor compiles every piece once more per listed token count, with static shapes.

The rules: a model compiled with compile sizes computes the same function as without them, at a listed
count and at any other (the toy Llama's float64 closed form, as in test_equivalence); each piece with a
token-count argument is compiled once for the symbolic count and once per listed count; a call at a listed
count runs that count's compile, inside its CUDA graph when the count is also a capture size, and no other
call does. The config's checks are in test_config.py.
"""

from __future__ import annotations

import pytest
import torch

from conformance.helpers import DEVICES, StaticTokens, make_runner, small_llama_config, token_ids
from reference.compilation import backend, compile_piece, expect_counters
from reference.compilation.compile_piece import SizeDispatch
from reference.config import CompilationConfig, ConfigError, mode_config
from reference.models.toy_llama import TOY_SPLITTING_OPS, ToyLlama, expected_hidden, toy_llama_config
from reference.ops import CustomOpSelection

pytestmark = [pytest.mark.requires("compile_sizes"), pytest.mark.inductor]

# Calls, in order: 8 is a capture size only, 4 a capture size and a compile size, 6 a compile size only
# (no graph: it runs its static compile directly), 5 neither. Every call has new token ids.
CALL_SIZES = [8, 8, 8, 4, 4, 4, 6, 6, 5, 8]
CAPTURE_SIZES = [4, 8]
COMPILE_SIZES = [4, 6]
# The toy model's closed-form tolerance, explained in test_equivalence (FP32_CLOSE): float32 rounding of a
# few dozen operations and Inductor's reordering of sums; a static compile may tile its sums otherwise, which
# stays within the same few ulps.
FP32_CLOSE = dict(rtol=1.3e-6, atol=1e-5)
CASES = [
    pytest.param(3, TOY_SPLITTING_OPS, id="level3-split"),
    pytest.param(2, None, id="level2-whole-graph"),
]


def _config(level: int, splitting_ops, **overrides) -> CompilationConfig:
    fields = {"compile_sizes": COMPILE_SIZES, "cudagraph_capture_sizes": CAPTURE_SIZES, **overrides}
    if level == 3:
        return mode_config("inductor", splitting_ops=splitting_ops, **fields)
    return CompilationConfig(level=2, use_inductor=True, cudagraph_mode="none", **fields)


def _run(compiled, hf, device, sizes=CALL_SIZES):
    tokens = StaticTokens(max(sizes), device)
    with torch.no_grad():
        for call, size in enumerate(sizes):
            ids = token_ids(size, hf.vocab_size, seed=call)
            yield call, ids, compiled(*tokens(ids))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("level, splitting_ops", CASES)
def test_the_toy_llama_matches_its_closed_form_at_and_beside_the_compile_sizes(level, splitting_ops, device, impl):
    config = _config(level, splitting_ops)
    hf = toy_llama_config(num_layers=2)
    compiled = impl.compile(ToyLlama(hf, CustomOpSelection(config)).to(device), config)
    for call, ids, hidden in _run(compiled, hf, device):
        torch.testing.assert_close(
            hidden.double().cpu(), expected_hidden(ids, hf), **FP32_CLOSE, msg=lambda m: f"call {call}: {m}"
        )


@pytest.mark.requires("counters", "pieces")
@pytest.mark.parametrize("level, splitting_ops", CASES)
def test_each_piece_is_compiled_once_for_any_count_and_once_per_compile_size(level, splitting_ops, impl):
    config = _config(level, splitting_ops)
    hf = toy_llama_config(num_layers=2)
    compiled = impl.compile(ToyLlama(hf, CustomOpSelection(config)), config)
    pieces = 3 if level == 3 else 1  # the toy Llama split at its 2 attention calls: 3 pieces around them
    per_piece = 1 + len(COMPILE_SIZES)
    with expect_counters(num_inductor_compiles=pieces * per_piece, num_backend_compilations=pieces * per_piece):
        next(_run(compiled, hf, "cpu"))
    assert sum(not p.is_splitting_op for p in compiled.backend.pieces) == pieces


@pytest.mark.requires("components")
@pytest.mark.parametrize("device", DEVICES)
def test_a_call_at_a_compile_size_runs_that_sizes_compile_and_no_other_call_does(device, impl, monkeypatch):
    """Each static compile is wrapped to record the token counts it is called at; every other call runs the
    symbolic compile. On CUDA a capture size's static compile runs at its warm-up and its capture, then
    replays inside the graph, so it is seen there too."""
    seen: dict[int, list[int]] = {size: [] for size in COMPILE_SIZES}
    real = compile_piece.compile_static

    def recording(module, config, size_args):
        def spy(size, run):
            return lambda *args: seen[size].append(args[size_args[0]]) or run(*args)

        return {size: spy(size, run) for size, run in real(module, config, size_args).items()}

    monkeypatch.setattr(backend, "compile_static", recording)
    config = _config(3, TOY_SPLITTING_OPS)
    hf = toy_llama_config(num_layers=2)
    compiled = impl.compile(ToyLlama(hf, CustomOpSelection(config)).to(device), config)
    list(_run(compiled, hf, device))
    for size, counts in seen.items():
        assert counts and set(counts) == {size}, f"compile size {size}'s static compile ran at {counts}"


@pytest.mark.requires("components")
def test_the_dispatch_needs_every_token_count_argument_to_equal_a_compile_size():
    """Dynamo may give equal token dimensions two symbols; a static compile fixes both, so a call whose
    counts disagree runs the symbolic compile."""
    dispatch = SizeDispatch(lambda *a: "any", {4: lambda *a: "static 4"}, size_args=(0, 2))
    assert dispatch(4, "x", 4) == "static 4"
    assert dispatch(4, "x", 5) == "any"
    assert dispatch(5, "x", 5) == "any"


@pytest.mark.requires("components")
@pytest.mark.parametrize("sizes, never", [([5], [5]), ([4, 6, 16], [6]), ([2, 8], [2])])
def test_the_engine_refuses_a_compile_size_no_step_runs_at(sizes, never, impl):
    """Steps are padded to the next capture size (4 or 8), so 2, 5 and 6 never reach the model; 16 does (above
    the largest capture size a step runs at its own count)."""
    settings = dict(cudagraph_capture_sizes=[4, 8], max_num_batched_tokens=16)
    with pytest.raises(ConfigError, match=rf"^compile_sizes \[{never[0]}\] never run: a step is padded to the next "
                       r"capture size \(\[4, 8\]\); list capture sizes, or counts above the largest one up to "
                       "max_num_batched_tokens$"):
        make_runner(impl, "inductor", small_llama_config(), compile_sizes=sizes, **settings)
    make_runner(impl, "inductor", small_llama_config(), compile_sizes=[4, 8, 12, 16], **settings)  # all reachable


@pytest.mark.requires("components")
def test_compile_sizes_above_the_step_limit_are_dropped_with_one_warning_like_capture_sizes(impl):
    """'cudagraph_capture_sizes' names 32 too, which no step of at most 16 tokens reaches: the runner skips
    that capture size, and compiles nothing for it."""
    settings = dict(cudagraph_capture_sizes=[4, 8, 32], max_num_batched_tokens=16)
    with pytest.warns(RuntimeWarning) as caught:
        runner = make_runner(impl, "inductor", small_llama_config(), compile_sizes=["cudagraph_capture_sizes"],
                             **settings)  # fmt: skip
    said = [str(w.message) for w in caught]
    assert ("1 compile sizes exceed max_num_batched_tokens (16) and are not compiled (no step has that many "
            "tokens): [32]") in said  # fmt: skip
    assert runner.config.compile_sizes == (4, 8)
