"""The hand-written mutants of the code that runs only on CUDA (conformance/mutation/cuda.py runs them).

Each is one edit an implementer could plausibly make: a sign, a bound off by one, a mask or a rounding point
dropped, a stride of the wrong head, a stream or a counter forgotten. None repeats a fault of
conformance/faults/ (those are planted by monkeypatching the op or the runner; these edit the source text,
inside the Triton kernels and the CUDA-graph wrappers). Kept memory-safe: no edit writes outside a tensor, so a
mutant's run cannot take the CUDA context down with it.
"""

from __future__ import annotations

from dataclasses import dataclass

KERNELS = "reference/ops/triton_kernels.py"
LINEAR = "reference/ops/linear_kernels.py"
GRAPHS = "reference/compilation/cuda_graph.py"

# the test files that can see each kind of edit (their CUDA cases run: -m gpu)
KERNEL_TESTS = (
    "conformance/test_triton_kernels.py",
    "conformance/test_llama_oracle.py",
    "conformance/test_qwen3_oracle.py",
    "conformance/test_gemma3_oracle.py",
)
LINEAR_TESTS = (
    "conformance/test_linear_kernels.py",
    "conformance/test_fused_linear.py",
    "conformance/test_llama_oracle.py",
    "conformance/test_gemma3_oracle.py",
)
GRAPH_TESTS = (
    "conformance/test_cuda_graph.py",
    "conformance/test_cuda_graph_streams.py",
    "conformance/test_cuda_graph_warmups.py",
    "conformance/test_full_graphs.py",
    "conformance/test_stale_outputs.py",
    "conformance/test_graph_replays.py",
    "conformance/test_equivalence.py",
)


@dataclass(frozen=True)
class Mutant:
    """One edit: in ``path``, the text ``old`` (which must occur exactly once) becomes ``new``; ``tests`` are
    the files run against it; ``what`` says the bug in a few words."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


def _kernel(name: str, old: str, new: str, what: str) -> Mutant:
    return Mutant(f"cuda.{name}", KERNELS, old, new, KERNEL_TESTS, what)


def _linear(name: str, old: str, new: str, what: str) -> Mutant:
    return Mutant(f"cuda.{name}", LINEAR, old, new, LINEAR_TESTS, what)


def _graph(name: str, path: str, old: str, new: str, what: str) -> Mutant:
    return Mutant(f"cuda.{name}", path, old, new, GRAPH_TESTS, what)


MUTANTS: tuple[Mutant, ...] = (
    # RMSNorm
    _kernel("rms_norm_eps_after_rsqrt", "rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / hidden + eps)",
            "rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / hidden) + eps", "epsilon added after the rsqrt"),
    _kernel("rms_norm_mean_over_block", "rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / hidden + eps)",
            "rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / BLOCK + eps)", "mean over the padded block, not H"),
    _kernel("rms_norm_residual_sum_unrounded",
            "x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the add rounds to the activation dtype",
            "x = x.to(tl.float32) + r.to(tl.float32)", "the residual sum kept in fp32 (torch rounds it)"),
    _kernel("rms_norm_weight_before_rounding", "y = (x32 * rstd).to(x.dtype).to(tl.float32) * w",
            "y = x32 * rstd * w", "Llama's rounding before the weight dropped"),
    # gated activations
    _kernel("silu_sign", "act = g / (1.0 + tl.exp(-g))", "act = g / (1.0 + tl.exp(g))", "SiLU's sign"),
    _kernel("gated_up_reads_gate", "up = tl.load(x_ptr + row * x_stride + inter + cols",
            "up = tl.load(x_ptr + row * x_stride + cols", "the up half read from the gate half"),
    _kernel("gelu_cubic_coefficient", "y = 0.7978845608028654 * (g + 0.044715 * g * g * g)",
            "y = 0.7978845608028654 * (g + 0.04715 * g * g * g)", "GELU's cubic coefficient mistyped"),
    _kernel("silu_unrounded_before_product", "act = act.to(gate.dtype).to(tl.float32)  # the activation rounds",
            "act = act  # the activation rounds", "the activation not rounded before the product"),
    # RoPE
    _kernel("rope_sin_sign", "tl.store(out, (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype), mask=mask)",
            "tl.store(out, (x1 * cos[None, :] + x2 * sin[None, :]).to(dtype), mask=mask)", "rotation's sign"),
    _kernel("qk_norm_second_half_weight", "w2 = tl.load(w_ptr + HALF + d).to(tl.float32)[None, :]",
            "w2 = tl.load(w_ptr + d).to(tl.float32)[None, :]", "per-head norm's second half uses the first's weights"),
    _kernel("rope_cos_unrounded", "cos = tl.load(cache_ptr + pos * cache_stride + d).to(q_ptr.dtype.element_ty)",
            "cos = tl.load(cache_ptr + pos * cache_stride + d).to(tl.float32)", "cos not rounded to q's dtype"),
    # attention, shared
    _kernel("softcap_without_scale", "s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)",
            "s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s)) - 1.0)", "softcap's tanh of s, not s / cap"),
    _kernel("online_softmax_rescale_inverted", "alpha = tl.exp(m_i - m_safe)", "alpha = tl.exp(m_safe - m_i)",
            "the running sums rescaled by the inverse factor"),
    _kernel("online_softmax_sum_not_rescaled", "m_new, l_i * alpha + tl.sum(p, axis=1)",
            "m_new, l_i + tl.sum(p, axis=1)", "the running sum not rescaled"),
    # decode attention
    _kernel("decode_window_one_key_more", "start = tl.maximum(seq_len - window, 0)",
            "start = tl.maximum(seq_len - window - 1, 0)", "a sliding window one key too wide"),
    _kernel("decode_query_heads_interleaved",
            "q = tl.load(q_ptr + seq * q_stride + (kvh * GROUP + g[:, None]) * D + d[None, :]",
            "q = tl.load(q_ptr + seq * q_stride + (kvh + g[:, None] * tl.num_programs(1)) * D + d[None, :]",
            "a KV head's query heads read interleaved (h = g * Hkv + kvh), not grouped"),
    # prefill attention
    _kernel("prefill_query_cannot_see_itself", "allowed = (n[None, :] <= q_pos[:, None]) & (n[None, :] < hi)",
            "allowed = (n[None, :] < q_pos[:, None]) & (n[None, :] < hi)", "the causal mask hides the diagonal"),
    _kernel("prefill_window_one_key_more", "allowed = allowed & (n[None, :] > q_pos[:, None] - window)",
            "allowed = allowed & (n[None, :] >= q_pos[:, None] - window)", "a sliding window one key too wide"),
    _kernel("prefill_kv_head_of_query_head", "k_cache = cache_ptr + row * c_row + (qh // GROUP) * c_head",
            "k_cache = cache_ptr + row * c_row + (qh % (tl.num_programs(2) // GROUP)) * c_head",
            "a query head mapped to KV head h mod Hkv (interleaved), not h // group"),
    # dispatch to the kernels
    Mutant("cuda.attention_kernel_never_used", "reference/ops/attention.py",
           "if HAS_TRITON and q.is_cuda and q.dtype in TRITON_DTYPES:",
           "if HAS_TRITON and q.is_cuda and q.dtype in TRITON_DTYPES and False:",
           KERNEL_TESTS + ("conformance/test_structure.py",), "the Triton attention silently never used"),
    # CUDA graphs
    _graph("capture_returns_unreplayed_output", GRAPHS,
           "    torch.cuda.current_stream().wait_stream(stream)\n    graph.replay()\n",
           "    torch.cuda.current_stream().wait_stream(stream)\n",
           "the capture's output returned without the replay that fills it"),
    _graph("capture_side_stream_not_waited", GRAPHS, "    stream.wait_stream(torch.cuda.current_stream())\n", "",
           "the capture stream does not wait for the work queued before it"),
    _graph("one_warm_up_too_many", GRAPHS, "        if done < self.num_warmups:",
           "        if done <= self.num_warmups:", "one plain run more than cudagraph_num_of_warmups"),
    _graph("second_size_argument_ignored", GRAPHS, "return all(args[i] == size for i in self.size_args[1:])",
           "return all(args[i] == size for i in self.size_args[2:])",
           "a piece's second token-count argument unchecked"),
    _graph("replay_not_counted", GRAPHS,
           "            captured.graph.replay()\n"
           "            compilation_counter.num_cudagraph_replays += 1\n"
           "            return captured.output",
           "            captured.graph.replay()\n            return captured.output", "a replay not counted"),
    _graph("stale_outputs_never_poisoned", "reference/compilation/stale_outputs.py",
           "            if call == self.call:", "            if call <= self.call:",
           "debug_cudagraph_outputs never poisons an earlier call's views"),
    _graph("full_graph_address_check_skipped", "reference/compilation/full_graph.py",
           "            if self.debug_addresses:\n                check_addresses(",
           "            if False:\n                check_addresses(", "a full graph's moved input goes unnoticed"),
    # the small-M GEMM (the faults of conformance/faults/gemm.py aside)
    _linear("linear_squares_of_the_last_slice_only", "sum_sq += tl.load(squares + s * BLOCK_M",
            "sum_sq = tl.load(squares + s * BLOCK_M", "the norm's rstd from the last K slice's squares alone"),
    _linear("linear_up_half_not_normalised", "acc_up = acc_up * rstd", "acc_up = acc_up",
            "the norm's rstd left off the up half of a gated GEMM"),
    _linear("linear_gemma_offset_dropped", ".to(tl.float32) + weight_offset", ".to(tl.float32)",
            "Gemma's (1 + w) applied as w"),
    _linear("linear_last_tile_of_each_slice_skipped", "k_hi = tl.minimum(k_lo + k_per_split, K)",
            "k_hi = tl.minimum(k_lo + k_per_split - BLOCK_K, K)", "each K slice stops one tile short"),
    _linear("linear_partials_share_one_slot", "mine = partial_ptr + pid_k * (1 + GATED) * BLOCK_M * N",
            "mine = partial_ptr + 0 * pid_k * (1 + GATED) * BLOCK_M * N",
            "every K slice writes its partials to slot 0"),
    _linear("linear_first_arrival_reduces", "if ticket == SPLIT_K - 1:", "if ticket == 0:",
            "the first program to arrive adds the partials, before the others wrote theirs"),
    _linear("linear_counter_not_reset", "tl.atomic_xchg(count_ptr + pid_n, 0)  # ready for the next launch", "pass",
            "the ticket counters left counted, so the next launch reduces early"),
    _linear("linear_gelu_for_silu", "        if EPILOGUE == 3:", "        if EPILOGUE >= 2:",
            "SiLU-gated MLPs given GELU"),
    _linear("linear_up_rows_one_early", "wu = tl.load(w_rows + N * w_stride",
            "wu = tl.load(w_rows + (N - 1) * w_stride", "the up half read one row early"),
)
