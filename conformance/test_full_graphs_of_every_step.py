"""``cudagraph_mode='full'``: every step of a capture size, prefill, mixed and decode alike, replays one graph
of the whole forward, and the attention's declared support level decides whether a full mode runs at all.

A full graph freezes every kernel's grid and arguments at capture, so a mixed step is right under it only if
attention reads each token's cache slot and each sequence's query offsets, length and row from static
tables the runner rewrites before the replay, and launches grids that depend on the graph's key alone
(reference/ops/graph_attention_kernels.py). The rules:

* dispatch: under ``'full'`` every step of at most the largest capture size goes to the full graph of the
  next capture size, whatever its kind, one graph per size (vLLM's FULL); larger steps run without graphs;
  on a CPU too, where the runner dispatches alike and nothing is captured;
* support levels (vLLM's ``AttentionCGSupport``): a full mode the attention does not declare it can serve
  is lowered with one warning line, ``'full'`` to ``'full_and_piecewise'`` for decode-only support, any
  full mode to ``'piecewise'`` (or ``'none'``) for none; a mode it can serve runs unchanged, silently;
* on CUDA, a declared level is tested, not trusted: each kind of step (uniform decode, prefill only,
  mixed) replays its full graph and gives bitwise the logits of the same kernels run without a graph, over
  a continuous schedule whose offsets, lengths and rows change every step. The kernels themselves are
  held to the torch path in test_triton_kernels.py (``test_graph_attention_kernels_match_torch_path``).
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import implementation
from conformance.helpers import DEVICES, build_llama, make_runner, points_at, small_llama_config, token_ids
from reference.benchmark.choices import MODE_KWARGS
from reference.compilation import compilation_counter
from reference.compilation.cuda_graph import WarmUpCount
from reference.config import ConfigError, mode_config
from reference.engine import graph_plan
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams
from reference.forward_context import BatchDescriptor
from reference.ops.attention import AttentionCGSupport
from reference.ops.attention_metadata import AttentionMetadata, GraphTables

pytestmark = [pytest.mark.requires("components"), pytest.mark.no_inductor, pytest.mark.no_inductor_full]


def _record(runner, new_tokens, context_lens):
    runner.step(new_tokens, context_lens, list(range(len(new_tokens))))
    return runner.last_dispatch.runtime_mode, runner.last_dispatch.descriptor


@pytest.mark.parametrize("device", DEVICES)
def test_full_sends_every_step_of_a_capture_size_to_the_graph_of_its_padded_size(device, impl):
    sizes = dict(max_num_seqs=4, max_model_len=32, max_num_batched_tokens=16, cudagraph_capture_sizes=[1, 2, 4, 8])
    runner = make_runner(impl, "no_inductor", small_llama_config(), device=device, cudagraph_mode="full", **sizes)
    runner.warm_up()
    assert runner.full_sizes == (1, 2, 4, 8) and runner.capture_sizes == ()  # past max_num_seqs: steps of any kind
    assert _record(runner, [[1, 2, 3]], [0]) == ("FULL", BatchDescriptor(4, False))  # a prefill
    assert _record(runner, [[1], [2], [3]], [3, 5, 1]) == ("FULL", BatchDescriptor(4, False))  # a decode: same graph
    assert _record(runner, [[1], [2, 3, 4, 5, 6]], [4, 6]) == ("FULL", BatchDescriptor(8, False))  # mixed
    assert _record(runner, [[1]], [9]) == ("FULL", BatchDescriptor(1, False))
    assert _record(runner, [[1] * 9], [0]) == ("NONE", BatchDescriptor(9, False))  # above every capture size


@pytest.mark.parametrize("cudagraph_mode", ["full", "full_and_piecewise"])
def test_attention_is_handed_the_static_tables_of_its_full_graph_step(cudagraph_mode, impl, monkeypatch):
    """What the graph kernels of a full step read (on CUDA only), checked where the runner builds it: under 'full'
    every step, decodes too, carries the tables of its padded size (GraphTables.host_list of the step), read from
    the runner's static buffer; under 'full_and_piecewise' a decode step carries its lengths and rows padded with
    0 to the graph's size, and a mixed step (piecewise) no tables and unpadded lists."""
    from reference.engine import runner as runner_module

    sizes = dict(max_num_seqs=4, max_model_len=32, max_num_batched_tokens=16, cudagraph_capture_sizes=[1, 2, 4, 8])
    runner = make_runner(impl, "no_inductor", small_llama_config(), cudagraph_mode=cudagraph_mode, **sizes)
    runner.warm_up()
    seen = []
    real = runner_module.ForwardContext
    monkeypatch.setattr(runner_module, "ForwardContext", lambda md, *rest: seen.append(md) or real(md, *rest))
    every_step = cudagraph_mode == "full"
    for tokens, contexts in (([[1], [2, 3, 4, 5, 6]], [4, 6]), ([[1], [2], [3]], [3, 5, 1])):  # mixed, decode
        runner.step(tokens, contexts, list(range(len(tokens))))
        md = seen[-1]
        query_lens = [len(t) for t in tokens]
        seq_lens = [c + q for c, q in zip(contexts, query_lens)]
        size = runner.last_dispatch.descriptor.num_tokens
        decode = all(q == 1 for q in query_lens)
        if every_step:
            capacity = runner.graph_capacity(size)
            expected = GraphTables.host_list(query_lens, seq_lens, md.rows, md.slot_mapping.tolist(), size, capacity)
            tables = md.graph_tables
            flat = [tables.slots, tables.decode_seq_lens, tables.decode_rows, tables.cu_query_lens, tables.seq_lens,
                    tables.rows]  # fmt: skip
            assert [x for t in flat for x in t.tolist()] == expected
            assert {t.dtype for t in flat} == {torch.int64}  # tolist() would show 1.0 == 1 in a float buffer
            assert tables.slots.data_ptr() == runner.graph_tables_buffer.data_ptr()  # the buffer the graph reads
            continue
        assert md.graph_tables is None
        if decode:
            assert runner.last_dispatch.runtime_mode == "FULL"
            padding = [0] * (size - len(tokens))
            assert (md.seq_lens_tensor.tolist(), md.rows_tensor.tolist()) == (seq_lens + padding, md.rows + padding)
            assert md.seq_lens_tensor.dtype == md.rows_tensor.dtype == torch.int64
        else:
            assert (md.seq_lens_tensor.tolist(), md.rows_tensor.tolist()) == (seq_lens, md.rows)


@pytest.mark.inductor
def test_sizes_past_the_step_limit_are_dropped_with_one_line_each_pointing_at_the_caller(impl):
    """compile_sizes and capture sizes above max_num_batched_tokens: no step has that many tokens. A size equal
    to the limit is kept. The warnings name the line that built the runner (nothing is compiled here)."""
    from reference.engine.runner import ModelRunner

    config = mode_config("inductor", compile_sizes=[4, 8, 16], cudagraph_capture_sizes=[4, 8, 16])
    model = build_llama(small_llama_config(), config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = ModelRunner(model, config, max_num_seqs=4, max_model_len=16, max_num_batched_tokens=8)
    assert [(str(w.message), w.category) for w in caught] == [
        ("1 compile sizes exceed max_num_batched_tokens (8) and are not compiled (no step has that many tokens): [16]",
         RuntimeWarning),
        ("1 capture sizes exceed max_num_batched_tokens (8) and are not captured (no step has that many tokens): [16]",
         RuntimeWarning),
    ]  # fmt: skip
    assert all(points_at(w, __file__) for w in caught)
    assert (runner.config.compile_sizes, runner.capture_sizes) == ((4, 8), (4, 8))


def test_full_warns_of_capture_sizes_no_step_reaches(impl):
    with pytest.warns(RuntimeWarning, match=r"^1 capture sizes exceed max_num_batched_tokens \(16\) and are not"):
        runner = make_runner(impl, "no_inductor", small_llama_config(), max_num_batched_tokens=16,
                             cudagraph_mode="full", cudagraph_capture_sizes=[4, 64])  # fmt: skip
    assert runner.full_sizes == (4,)


@pytest.mark.inductor  # compile_sizes need Inductor; the check refuses before any compile
@pytest.mark.parametrize("mode", ["full", "piecewise"])
def test_a_compile_size_that_steps_are_padded_past_is_refused(mode, impl):
    """Under 'full' every step is padded to a capture size, as under piecewise graphs: a compile size of 3 between
    the capture sizes 2 and 4 would be compiled and never run."""
    with pytest.raises(ConfigError, match=r"^compile_sizes \[3\] never run: a step is padded to the next capture "
                                          r"size \(\[1, 2, 4, 8\]\); list capture sizes, or counts above the "
                                          r"largest one up to max_num_batched_tokens$"):  # fmt: skip
        make_runner(impl, "inductor", small_llama_config(), max_num_batched_tokens=16, cudagraph_mode=mode,
                    cudagraph_capture_sizes=[1, 2, 4, 8], compile_sizes=[3])  # fmt: skip


def test_full_needs_a_capture_size_a_step_can_have(impl):
    with pytest.raises(ConfigError, match=r"no capture size fits a step \(at most max_num_batched_tokens=4 tokens"):
        make_runner(impl, "no_inductor", small_llama_config(), max_num_batched_tokens=4, cudagraph_mode="full",
                    cudagraph_capture_sizes=[8, 16])  # fmt: skip


ONE_GRAPH = {"splitting_ops": []}  # level 3 without a split: no pieces to fall back to


@pytest.mark.parametrize(
    "mode, fields, support, lowered",
    [
        ("full", {}, AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "full_and_piecewise"),
        ("full", {}, AttentionCGSupport.UNIFORM_BATCH, "full_and_piecewise"),
        ("full", {"level": 2}, AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "full_decode_only"),  # no pieces
        ("full", ONE_GRAPH, AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "full_decode_only"),
        ("full", {}, AttentionCGSupport.NEVER, "piecewise"),
        pytest.param("full_and_piecewise", {"level": 0}, AttentionCGSupport.NEVER, "piecewise",
                     marks=pytest.mark.breakable, id="breakable-NEVER"),  # level 0 has pieces too: breakable ones
        ("full", {"level": 2}, AttentionCGSupport.NEVER, "none"),
        ("full", ONE_GRAPH, AttentionCGSupport.NEVER, "none"),
        ("full_and_piecewise", {}, AttentionCGSupport.NEVER, "piecewise"),
        ("full_decode_only", {}, AttentionCGSupport.NEVER, "none"),
        ("full", {}, AttentionCGSupport.ALWAYS, None),
        ("full_and_piecewise", {}, AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, None),
    ],
)
def test_a_full_mode_the_attention_cannot_serve_is_lowered_with_one_warning_line(
    mode, fields, support, lowered, impl, monkeypatch
):
    """The lowered mode is one the runner then builds (a piecewise mode needs pieces split at attention). The
    level is the one declared for the model's device and dtype."""
    asked = []
    monkeypatch.setattr(graph_plan, "cudagraph_support", lambda device, dtype: asked.append((device, dtype)) or support)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = make_runner(impl, "no_inductor", small_llama_config(), cudagraph_mode=mode,
                             cudagraph_capture_sizes=[1, 2, 4], **fields)  # fmt: skip
        runner.warm_up()
    notes = [w for w in caught if "attention declares" in str(w.message)]
    assert asked == [(runner.device, runner.dtype)]
    if lowered is None:
        assert runner.config.cudagraph_mode == mode and not notes
        return
    assert runner.config.cudagraph_mode == lowered
    (note,) = notes
    steps, needed = ("every step", "ALWAYS") if mode == "full" else ("decode steps", "UNIFORM_SINGLE_TOKEN_DECODE")
    assert note.category is RuntimeWarning and str(note.message) == (
        f"cudagraph_mode={mode!r} runs as {lowered!r}: attention declares {support.name} for {runner.dtype} on "
        f"{runner.device.type} (full graphs of {steps} need {needed})"
    )
    assert points_at(note, implementation.__file__)  # stacklevel: the line that built the runner


@pytest.mark.gpu
def test_float64_on_cuda_runs_full_graphs_as_pieces(impl):
    """float64 attention runs the torch path, which reads host lengths a graph would freeze: NEVER."""
    with pytest.warns(RuntimeWarning, match=r"'full_and_piecewise' runs as 'piecewise': attention declares NEVER"):
        runner = make_runner(impl, "no_inductor_full", small_llama_config(), device="cuda", dtype=torch.float64)
    assert runner.full_sizes == () and runner.capture_sizes


def _continuous_run(device: str, *, graphs: bool) -> tuple[list, dict]:
    """One continuous schedule under ``cudagraph_mode='full'`` (3 rows, budget 6, capture sizes 2, 4, 6: steps
    padded, rows reused): (per step, its kind and logits), counter deltas. ``graphs=False``: the same steps
    through the same code and kernels, each run without its graph (the full graphs' wrapper never captures)."""
    config = {**MODE_KWARGS["no_inductor"]["compilation_config"], "cudagraph_mode": "full",
              "cudagraph_capture_sizes": [2, 4, 6]}  # fmt: skip
    llm = LLM("llama-tiny", device=device, dtype="float32", use_tqdm=False, max_num_seqs=3, max_num_batched_tokens=6,
              compilation_config=config)  # fmt: skip
    if not graphs:
        full_graphs = llm.runner.compiled.full_graphs
        full_graphs.captured.clear()
        full_graphs.warm_ups = WarmUpCount(sys.maxsize)
    steps, real_step = [], llm.runner.step

    def spy(new_tokens, context_lens, rows, fed=None):
        logits = real_step(new_tokens, context_lens, rows, fed=fed)
        kind = "mixed" if fed is not None and new_tokens else "decode" if fed is not None else "prefill"
        steps.append((kind, llm.runner.last_dispatch, logits.clone()))
        return logits

    llm.runner.step = spy
    prompts = [token_ids(n, llm.vocab_size, seed=60 + n) for n in (5, 2, 9, 1, 3, 4)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (3, 6, 2, 4, 3, 5)]
    before = compilation_counter.snapshot()
    llm.generate(prompts, params, use_tqdm=False)
    after = compilation_counter.snapshot()
    return steps, {name: getattr(after, name) - getattr(before, name) for name in vars(after)}


@pytest.mark.gpu
@pytest.mark.slow  # two engines captured and run: 19-27 s a fault's run on the H200, which starts it early
@pytest.mark.requires("counters")
def test_every_kind_of_step_replays_its_full_graph_bitwise_as_its_kernels_run_without_one():
    replayed, deltas = _continuous_run("cuda", graphs=True)
    plain, _ = _continuous_run("cuda", graphs=False)
    assert {kind for kind, _, _ in replayed} == {"prefill", "mixed", "decode"}, "a kind of step is missing"
    assert all(d.runtime_mode == "FULL" for _, d, _ in replayed)
    assert deltas["num_full_cudagraph_replays"] == len(replayed) and deltas["num_full_cudagraph_captured"] == 0
    assert [(k, d) for k, d, _ in replayed] == [(k, d) for k, d, _ in plain]
    for i, ((kind, d, a), (_, _, b)) in enumerate(zip(replayed, plain)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"step {i} ({kind}, {d.descriptor}): {m}")


STEPS = st.lists(st.tuples(st.integers(1, 9), st.integers(0, 20)), min_size=1, max_size=6)  # (query, context)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(step=STEPS, extra_tokens=st.integers(0, 5), extra_seqs=st.integers(0, 3), first_decodes=st.integers(0, 3))
def test_a_graphs_tables_give_each_token_to_exactly_one_kernel_and_leave_padding_alone(
    step, extra_tokens, extra_seqs, first_decodes
):
    """What the CUDA kernels of a full graph read, checked where it is built (the CPU): every real token row
    is served once, by the decode kernel if its sequence is one of the step's leading one-token sequences,
    else by the one variable-length entry of non-zero length whose offsets hold it, with that sequence's
    length and cache row; padding rows have slot -1 and padding entries length 0."""
    step = [(1, c) for _, c in step[:first_decodes]] + step[first_decodes:]
    query_lens, seq_lens = [q for q, _ in step], [q + c for q, c in step]
    rows = list(range(len(step)))[::-1]
    n = sum(query_lens)
    slots = AttentionMetadata.slot_mapping_list(query_lens, seq_lens, rows, 32)
    tokens, capacity = n + extra_tokens, len(step) + extra_seqs
    flat = GraphTables.host_list(query_lens, seq_lens, rows, slots, tokens, capacity)
    assert len(flat) == GraphTables.flat_len(tokens, capacity)
    t = GraphTables.from_flat(torch.tensor(flat), tokens, capacity)
    assert t.slots.tolist() == slots + [-1] * extra_tokens
    served = {}  # token row -> (kernel, length, cache row)
    for i, (length, row) in enumerate(zip(t.decode_seq_lens.tolist(), t.decode_rows.tolist())):
        if length:
            served[i] = ("decode", length, row)
    cu = t.cu_query_lens.tolist()
    assert cu[0] == 0 and cu == sorted(cu) and cu[-1] == n
    for e, (length, row) in enumerate(zip(t.seq_lens.tolist(), t.rows.tolist())):
        for token in range(cu[e], cu[e + 1]) if length else ():
            assert token not in served, f"token {token} served twice"
            served[token] = ("varlen", length, row)
    starts = [sum(query_lens[:i]) for i in range(len(step))]
    leading = next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))
    expected = {starts[i] + j: ("decode" if i < leading else "varlen", seq_lens[i], rows[i])
                for i in range(len(step)) for j in range(query_lens[i])}  # fmt: skip
    assert served == expected


def test_tables_for_a_step_past_the_graph_or_of_unequal_lists_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^a step of 5 tokens in 2 sequences does not fit a graph of 4 tokens"):
        GraphTables.host_list([2, 3], [2, 3], [0, 1], [0, 1, 32, 33, 34], 4, 2)
    with pytest.raises(ValueError, match=r"^query_lens \(2\), seq_lens \(1\) and rows \(2\) need one entry"):
        GraphTables.host_list([2, 3], [2], [0, 1], [0, 1, 32, 33, 34], 8, 2)
    with pytest.raises(ValueError, match=r"^flat: 3 ints, a graph of 4 tokens and 2 sequences needs 18"):
        GraphTables.from_flat(torch.zeros(3, dtype=torch.int64), 4, 2)
