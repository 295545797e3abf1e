"""Piecewise CUDA graphs (CUDA only): capture per size, address checks, pool sharing, padding, fallback.

Every test here is marked gpu and skips without CUDA. Bitwise claims (torch.equal) hold where the graph
replays exactly the kernels eager mode launches, i.e. for ``no_inductor`` at a token count that is a
capture size; elsewhere (padding changes GEMM shapes, Inductor fuses) the rule is FlashAttention's:
no more than twice eager's own error against a float32 run of the same bf16 weights.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from conformance.driver import prefill_and_decode
from conformance.helpers import (
    COMPILED_MODES,
    TRACED_MODES,
    StaticTokens,
    assert_error_within_twice_eager,
    make_runner,
    small_llama_config,
    token_ids,
)
from reference.compilation import expect_counters
from reference.config import default_capture_sizes, mode_config
from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel
from reference.models.toy_llama import TOY_SPLITTING_OPS, ToyLlama, toy_llama_config
from reference.ops import CustomOpSelection

pytestmark = pytest.mark.gpu
BF16 = dict(device="cuda", dtype=torch.bfloat16)


def _prompts(lengths: list[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    return [token_ids(n, vocab_size, seed=seed + i) for i, n in enumerate(lengths)]


# ---------------------------------------------------------------------- capture at warm-up
@pytest.mark.requires("counters")
@pytest.mark.eager
@pytest.mark.device_memory
@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_warm_up_captures_every_piece_at_every_size_once(mode, impl):
    hf = small_llama_config()  # 2 layers: 3 capturable pieces around 2 attention calls
    runner = make_runner(impl, mode, hf, **BF16, max_cudagraph_capture_size=16)
    sizes = runner.capture_sizes
    assert sizes == (1, 2, 4, 8, 16)
    traces = 0 if mode == "breakable" else 1  # breakable graphs capture the eager model: no trace
    # a 1-token step is a decode, which full modes send to a full graph: no piecewise size 1 there
    piecewise = (16, 8, 4, 2) if runner.full_sizes else (16, 8, 4, 2, 1)
    # one graph per piece (breakable: per segment) between and around the attention calls, per size
    with expect_counters(num_graphs_seen=traces, num_cudagraph_captured=(hf.num_hidden_layers + 1) * len(piecewise)):
        stats = runner.warm_up()
    assert stats.capture_sizes == piecewise  # largest first, so smaller sizes reuse its memory
    assert stats.compile_s > 0 and stats.capture_s > 0 and stats.graph_gib > 0
    with expect_counters(num_graphs_seen=0, num_cudagraph_captured=0):  # later steps only replay
        for size in sizes:
            runner.step(_prompts([size], hf.vocab_size), [0], [0])


# ---------------------------------------------------------------------- inputs must not move
@pytest.mark.requires("address_checks")
@pytest.mark.parametrize("mode", TRACED_MODES)
def test_debug_addresses_names_the_piece_and_size_when_an_input_moved(mode, impl):
    config = mode_config(
        mode, splitting_ops=SILLY_SPLITTING_OPS, cudagraph_capture_sizes=[2], debug_cudagraph_addresses=True
    )
    compiled = impl.compile(SillyModel(), config)
    x = torch.randn(2, 8, device="cuda")
    for _ in range(3):  # warm-up, capture, replay from the captured address: no complaint
        compiled(x)
    moved = x.clone()  # same contents elsewhere; x stays alive, so the allocator cannot hand its block out
    with pytest.raises(RuntimeError, match=r"CUDA graph of piece submod_0 at size 2: input \d+ moved from 0x"):
        compiled(moved)


@pytest.mark.requires("address_checks")
@pytest.mark.parametrize("mode", TRACED_MODES)
def test_debug_addresses_catches_a_parameter_reassigned_after_capture(mode, impl):
    config = mode_config(
        mode, splitting_ops=TOY_SPLITTING_OPS, cudagraph_capture_sizes=[4], debug_cudagraph_addresses=True
    )
    model = ToyLlama(toy_llama_config(1), CustomOpSelection(config)).cuda()
    compiled = impl.compile(model, config)
    tokens = StaticTokens(4, "cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(*tokens([1, 2, 3, 4]))
        mlp = model.model.layers[0].mlp
        mlp.down_proj.weight = nn.Parameter(mlp.down_proj.weight.detach().clone())
        # pieces: submod_0 (embedding .. RoPE), submod_1 (attention), submod_2 (o_proj .. MLP .. final norm)
        with pytest.raises(RuntimeError, match=r"CUDA graph of piece submod_2 at size 4: input \d+ moved"):
            compiled(*tokens([1, 2, 3, 4]))


# ---------------------------------------------------------------------- memory
# H=1024, I=4096 in bf16: activations at 512 tokens take tens of MiB, so a size's own graph memory shows
MEMORY_MODEL = dict(
    vocab_size=1024,
    hidden_size=1024,
    intermediate_size=4096,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    max_position_embeddings=1024,
)


def _graph_gib(impl, mode: str, sizes: list[int], **runner_kwargs) -> float:
    """Device memory (GiB) the graphs of ``sizes`` take at warm-up, measured in a fresh runner."""
    runner = make_runner(impl, mode, small_llama_config(**MEMORY_MODEL), **BF16, cudagraph_capture_sizes=sizes,
                         **runner_kwargs)  # fmt: skip
    gib = runner.warm_up().graph_gib
    del runner
    torch._dynamo.reset()  # Dynamo's cache holds the compiled model, and with it the graphs and their pool
    gc.collect()
    torch.cuda.empty_cache()
    return gib


@pytest.mark.device_memory
@pytest.mark.parametrize("mode", ["no_inductor"])  # the pool is the graphs' business, not the compiler's
def test_all_capture_sizes_share_the_memory_of_the_largest(mode, impl):
    """Graphs of all 67 default sizes up to 512 cost about what the size-512 graphs alone cost.

    Without a shared pool, or with graph outputs kept alive, each size would add its own activations: the
    sizes sum to ~32x the largest, so ~32x the memory. Allowed: 2x the largest-only cost plus 64 MiB, for
    allocator rounding (segments of 2 and 20 MiB) and the graphs' own small device allocations.
    """
    largest_only = _graph_gib(impl, mode, [512], max_num_seqs=2, max_model_len=512)
    all_sizes = _graph_gib(impl, mode, list(default_capture_sizes(512)), max_num_seqs=2, max_model_len=512)
    assert largest_only > 0
    message = f"all sizes {all_sizes:.3f} GiB vs 512 alone {largest_only:.3f} GiB"
    assert all_sizes <= 2 * largest_only + 64 / 1024, message


@pytest.mark.device_memory
@pytest.mark.parametrize("mode", ["no_inductor_full"])
def test_all_full_graph_sizes_share_the_memory_of_the_largest(mode, impl):
    """The same bound for full graphs: 512 sequences make every default size up to 512 a full decode graph
    (and a piecewise one), and all of them together cost about what size 512 alone costs. Full graphs in a
    pool each, or captured so that a size cannot reuse a larger one's memory, sum to ~32x (the bound and
    its allowance as for piecewise graphs)."""
    runner_kwargs = dict(max_num_seqs=512, max_model_len=4)
    largest_only = _graph_gib(impl, mode, [512], **runner_kwargs)
    all_sizes = _graph_gib(impl, mode, list(default_capture_sizes(512)), **runner_kwargs)
    assert largest_only > 0
    message = f"all sizes {all_sizes:.3f} GiB vs 512 alone {largest_only:.3f} GiB"
    assert all_sizes <= 2 * largest_only + 64 / 1024, message


# ---------------------------------------------------------------------- sizes without a graph of their own
@pytest.mark.requires("counters")
@pytest.mark.eager
@pytest.mark.parametrize("mode", ["no_inductor"])  # bitwise needs eager's kernels; Inductor: the odd-batch test
def test_steps_larger_than_the_largest_capture_size_run_without_graphs_and_match_eager(mode, impl):
    hf = small_llama_config()
    runners = {
        "eager": make_runner(impl, "eager", hf, **BF16),
        mode: make_runner(impl, mode, hf, **BF16, max_cudagraph_capture_size=16),
    }
    for runner in runners.values():
        runner.warm_up()
    lengths = [9, 7, 8, 6]  # 30 prompt tokens: above 16, so no graph; decode: 4 tokens, a capture size
    assert runners[mode].padded_size(sum(lengths)) == sum(lengths)
    with expect_counters(num_graphs_seen=0, num_cudagraph_captured=0):
        logits = prefill_and_decode(runners, _prompts(lengths, hf.vocab_size), num_decode=3, leader="eager")
    for step, (eager, actual) in enumerate(zip(logits["eager"], logits[mode])):
        # the unpadded prefill runs the eager FX code at its own size: eager's kernels, bitwise
        assert torch.equal(actual, eager), f"step {step}: max diff {(actual - eager).abs().max()}"


@pytest.mark.eager
@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_odd_batch_sizes_are_padded_and_sliced_correctly(mode, impl):
    """Decode batches of 3, 5, 7 and 13 sequences run padded to 4, 8, 8 and 16 tokens.

    Not bitwise: padding changes the GEMMs' row count, and cuBLAS may pick other kernels or split-K.
    Bound: the mode's error against a float32 run of the same (bf16-rounded) weights is at most twice
    eager bf16's error plus a few float32 ulps.
    """
    hf = small_llama_config()
    runners = {
        "reference": make_runner(
            impl, "eager", hf, device="cuda", dtype=torch.float32, max_num_seqs=16, weights_rounded_to=torch.bfloat16
        ),
        "eager": make_runner(impl, "eager", hf, **BF16, max_num_seqs=16),
        mode: make_runner(impl, mode, hf, **BF16, max_num_seqs=16, max_cudagraph_capture_size=64),
    }
    for runner in runners.values():
        runner.warm_up()
    for batch in (3, 5, 7, 13):
        assert runners[mode].padded_size(batch) > batch
        lengths = [1 + (3 * i) % 5 for i in range(batch)]
        logits = prefill_and_decode(runners, _prompts(lengths, hf.vocab_size, seed=batch), 3, leader="reference")
        for step in range(4):
            assert_error_within_twice_eager(logits[mode][step], logits["eager"][step], logits["reference"][step])


# ---------------------------------------------------------------------- a piece's token-count arguments
@pytest.mark.requires("components")
def test_a_piece_whose_token_counts_disagree_runs_without_its_graph():
    """Dynamo may give equal token dimensions two symbols, so a piece can take two counts; the graph captured
    when both were 4 must not replay for a call where the second is 3 (its kernels would read 4 rows)."""
    from reference.compilation.cuda_graph import CUDAGraphPiece

    def piece(x, n, m):
        return x[:n] * 2 + x[:m].sum()

    graphed = CUDAGraphPiece(
        "submod_0", piece, size_args=(1, 2), capture_sizes=(4,), num_warmups=1,
        pool=torch.cuda.graph_pool_handle(), stream=torch.cuda.Stream(), debug_addresses=False,
    )  # fmt: skip
    x = torch.randn(4, 8, device="cuda")
    with expect_counters(num_cudagraph_eager_runs=1, num_cudagraph_captured=1, num_cudagraph_replays=1):
        for _ in range(3):  # warm-up, capture, replay
            graphed(x, 4, 4)
    with expect_counters(num_cudagraph_eager_runs=1, num_cudagraph_replays=0):
        assert torch.equal(graphed(x, 4, 3), piece(x, 4, 3))
