"""The offline LLM: continuous batching (ragged prefill, chunked prefill, mixed steps), stopping rules,
sampling, text prompts, and clear errors. CPU, small models; the greedy oracle is transformers' model recomputing
the whole sequence for every token, on the same weights."""

import collections
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from conformance.oracle import oracle_greedy
from reference.benchmark.baselines import build_hf_model
from reference.benchmark.choices import MODE_KWARGS as MODES
from reference.config import DEFAULT_MAX_CAPTURE_SIZE, ConfigError, default_capture_sizes
from reference.engine.arguments import engine_capture_sizes
from reference.engine import kv_cache
from reference.engine import llm_engine as llm_engine_module
from reference.engine.llm import LLM
from reference.engine.llm_engine import LLMEngine
from reference.engine.sampling import SamplingParams
from reference.models import registry

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")

TINY_CHECKPOINT = Path(__file__).parents[1] / "fixtures" / "tiny-llama"
# Inductor compiles cost seconds on CPU: the inductor modes run in the GPU tests
ENGINE_MODES = ("eager", "breakable", "no_inductor", "no_inductor_full")
# Our fused layers and transformers' agree to ~1e-5 in float32 (test_llama_oracle). Where the oracle's two
# best logits are closer than this, rounding may pick either, so a divergence there is not a bug.
NEAR_TIE = 1e-3


def make_llm(model: str, mode: str, device: str = "cpu", **kwargs) -> LLM:
    return LLM(model, device=device, use_tqdm=False, **MODES[mode], **kwargs)


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def ragged_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 7, 3, 12, 5, 2, 9][:n]
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lengths]


def assert_matches_oracle(llm: LLM, prompts, outputs, max_tokens: int) -> None:
    hf = build_hf_model(llm.model_name, llm.model)
    for prompt, out in zip(prompts, outputs):
        expected, gaps = oracle_greedy(hf, prompt, max_tokens)
        got = out.outputs[0].token_ids
        first_diff = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        if first_diff is not None:
            assert gaps[first_diff] < NEAR_TIE, (
                f"prompt {prompt}: token {first_diff} is {got[first_diff]}, oracle says {expected[first_diff]} "
                f"with a clear margin {gaps[first_diff]:.2e}; got {got}, expected {expected}"
            )


# ---------------------------------------------------------------------- batching and lengths
@pytest.mark.parametrize("mode", ENGINE_MODES)
@pytest.mark.parametrize("model", ["toy-llama", "llama-tiny"])
def test_each_prompt_gets_exactly_max_tokens_in_prompt_order(model, mode):
    llm = make_llm(model, mode)
    prompts = ragged_prompts(4, llm.vocab_size)
    params = [greedy(m, ignore_eos=True) for m in (1, 4, 2, 6)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outputs] == [1, 4, 2, 6]
    assert {o.outputs[0].finish_reason for o in outputs} == {"length"}
    assert len({o.request_id for o in outputs}) == 4
    assert all(0 <= t < llm.vocab_size for o in outputs for t in o.outputs[0].token_ids)


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(dict(mode="eager"), id="eager-one-wave", marks=pytest.mark.eager),
        pytest.param(dict(mode="no_inductor"), id="no_inductor-one-wave", marks=pytest.mark.no_inductor),
        pytest.param(dict(mode="eager", max_num_seqs=2), id="eager-waves-of-2", marks=pytest.mark.eager),
        pytest.param(
            dict(mode="eager", max_num_seqs=4, max_num_batched_tokens=5),
            id="eager-chunked-prefill",
            marks=pytest.mark.eager,
        ),
    ],
)
def test_greedy_generate_equals_token_by_token_recompute(engine):
    engine = dict(engine)
    llm = make_llm("llama-tiny", engine.pop("mode"), **engine)
    prompts = ragged_prompts(5, llm.vocab_size, seed=1)
    outputs = llm.generate(prompts, greedy(6, ignore_eos=True), use_tqdm=False)
    assert_matches_oracle(llm, prompts, outputs, 6)


@pytest.mark.eager
def test_a_request_takes_a_row_in_the_step_after_one_frees_it_and_rows_stay_within_max_num_seqs():
    """Continuous batching: with 2 rows and max_tokens 1, 3, 2, 2, 1, a request is admitted (its prompt
    prefilled) in the step right after a running one samples its last token, beside the decodes of the
    others, never in a later wave; the engine frees a row once its last token is sampled."""
    llm = make_llm("llama-tiny", "eager", max_num_seqs=2)
    steps = []
    step = llm.runner.step

    def spy(new_tokens, context_lens, rows, fed=None):
        decodes = 0 if fed is None else len(fed)
        steps.append((decodes, [len(t) for t in new_tokens], list(rows)))
        return step(new_tokens, context_lens, rows, fed=fed)

    llm.runner.step = spy
    prompts = ragged_prompts(5, llm.vocab_size)  # 1, 7, 3, 12, 5 tokens
    max_tokens = [1, 3, 2, 2, 1]
    outputs = llm.generate(prompts, [greedy(m, ignore_eos=True) for m in max_tokens], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == max_tokens
    # (decodes, prompt chunk lengths, rows): decodes first, a new prompt in every free row
    assert steps == [
        (0, [1, 7], [0, 1]),  # A (1 token) and B; A is done after its first token
        (1, [3], [1, 0]),  # B decodes, C takes A's row
        (2, [], [1, 0]),  # B's last token, C's second and last: both rows free
        (0, [12, 5], [0, 1]),  # D and E
        (1, [], [0]),  # E finished at once; D decodes its last
    ]
    assert all(set(rows) <= {0, 1} for _, _, rows in steps)


@pytest.mark.eager
@pytest.mark.parametrize("scheduling", ["continuous", "static"])
def test_every_step_fits_the_token_budget_with_decodes_first_and_chunks_filling_the_rest(scheduling):
    """Budget 5, 4 rows, prompts of 1 + 7 + 3 + 12 tokens and 3 tokens each: every step holds at most 5
    tokens; under continuous batching a step leaves budget unused only when no prompt token is left to
    schedule; each prompt's chunks are contiguous and in order. Static batching admits the 4 prompts
    together (one batch of 4 rows), so it too fills every step while prompt tokens are left."""
    llm = make_llm("llama-tiny", "eager", max_num_seqs=4, max_num_batched_tokens=5, scheduling=scheduling)
    steps = []
    step = llm.runner.step

    def spy(new_tokens, context_lens, rows, fed=None):
        decodes = 0 if fed is None else len(fed)
        chunks = [(row, start, len(t)) for row, start, t in zip(rows[decodes:], context_lens[decodes:], new_tokens)]
        steps.append((decodes, chunks))
        return step(new_tokens, context_lens, rows, fed=fed)

    llm.runner.step = spy
    prompts = ragged_prompts(4, llm.vocab_size)
    llm.generate(prompts, greedy(3, ignore_eos=True), use_tqdm=False)
    sizes = [d + sum(n for _, _, n in chunks) for d, chunks in steps]
    assert max(sizes) == 5
    prompt_tokens_left = sum(map(len, prompts))
    cached = {}  # row -> prompt tokens cached so far
    for size, (decodes, chunks) in zip(sizes, steps):
        for row, start, n in chunks:
            assert start == cached.get(row, 0), f"row {row}: a chunk starts at {start}, {cached.get(row, 0)} cached"
            cached[row] = start + n
        prompt_tokens_left -= sum(n for _, _, n in chunks)
        assert size == 5 or prompt_tokens_left == 0
    assert prompt_tokens_left == 0 and sorted(cached.values()) == sorted(map(len, prompts))


@pytest.mark.eager
def test_under_the_priority_policy_the_lowest_value_runs_first_and_outputs_keep_prompt_order():
    """One row: requests run one after another, in priority order (ties in prompt order), and each generates
    what it generates under fcfs (the same tokens alone in the row); generate still returns them in prompt
    order."""
    prompts = ragged_prompts(4, 256)
    fcfs = make_llm("llama-tiny", "eager", max_num_seqs=1)
    expected = [o.outputs[0].token_ids for o in fcfs.generate(prompts, greedy(3, ignore_eos=True))]
    llm = make_llm("llama-tiny", "eager", max_num_seqs=1, scheduling_policy="priority", share_weights_with=fcfs)
    first_tokens = []
    step = llm.runner.step

    def spy(new_tokens, context_lens, rows, fed=None):
        if fed is None and context_lens == [0]:  # a prompt's first (and, unchunked here, only) chunk
            first_tokens.append(new_tokens[0])
        return step(new_tokens, context_lens, rows, fed=fed)

    llm.runner.step = spy
    outputs = llm.generate(prompts, greedy(3, ignore_eos=True), priority=[1, 0, 2, 0])
    assert first_tokens == [prompts[i] for i in (1, 3, 0, 2)]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.prompt_token_ids for o in outputs] == prompts


@pytest.mark.eager
def test_a_prompt_of_token_ids_may_be_a_tensor_or_a_numpy_array():
    """A new user's numpy prompt was refused where the same ids as a tensor were taken."""
    llm = make_llm("llama-tiny", "eager")
    ids = [[3, 14, 15, 92], [65, 35, 89, 79]]
    expected = [o.outputs[0].token_ids for o in llm.generate(ids, greedy(2), use_tqdm=False)]
    for prompts in (np.array(ids), torch.tensor(ids), [np.array(ids[0]), torch.tensor(ids[1])],
                    [{"prompt_token_ids": np.array(i)} for i in ids]):  # fmt: skip
        outputs = llm.generate(prompts, greedy(2), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == expected
        assert [o.prompt_token_ids for o in outputs] == ids and all(
            type(t) is int for o in outputs for t in o.prompt_token_ids
        )


@pytest.mark.eager
def test_priorities_of_0_pass_under_fcfs_and_numpy_and_torch_ints_are_ints_as_in_vllm():
    """vLLM refuses only a priority other than 0 under fcfs, and takes any integral number."""
    fcfs = make_llm("llama-tiny", "eager", max_num_seqs=1)
    prompts = ragged_prompts(2, fcfs.vocab_size)
    assert len(fcfs.generate(prompts, greedy(1), priority=[0, 0])) == 2
    llm = make_llm("llama-tiny", "eager", max_num_seqs=1, scheduling_policy="priority", share_weights_with=fcfs)
    for priority in (np.array([1, 0]), torch.tensor([1, 0])):
        outputs = llm.generate(prompts, greedy(1), priority=priority)
        assert [o.prompt_token_ids for o in outputs] == prompts


@pytest.mark.eager
@pytest.mark.parametrize(
    "policy, priority, message",
    [
        ("fcfs", [0, 1], "priority: [0, 1] is not 0 everywhere, but scheduling_policy is 'fcfs', which ignores it; "
         "build the LLM with scheduling_policy='priority'"),
        ("priority", [0], "priority: expected one int per prompt (2), got 1 value"),
        ("priority", [0, 1, 2], "priority: expected one int per prompt (2), got 3 values"),
        ("priority", [0, True], "priority[1]: expected an int, got True"),
        ("priority", [0, 1.5], "priority[1]: expected an int, got 1.5"),
        ("priority", torch.tensor([False, True]), "priority[0]: expected an int, got tensor(False)"),
        ("priority", 3, "priority: expected a list, tuple or 1-d array of ints, one per prompt (2), got 3"),
        ("priority", torch.tensor(5),
         "priority: expected a list, tuple or 1-d array of ints, one per prompt (2), got tensor(5)"),
        ("priority", np.array(0),
         "priority: expected a list, tuple or 1-d array of ints, one per prompt (2), got array(0)"),
        ("priority", torch.tensor([[1], [2]]),
         "priority: expected a list, tuple or 1-d array of ints, one per prompt (2), got tensor([[1], [2]])"),
        ("priority", {2, 0}, "priority: expected a list, tuple or 1-d array of ints, one per prompt (2), got {0, 2}"),
        ("priority", bytearray(b"ab"),
         "priority: expected a list, tuple or 1-d array of ints, one per prompt (2), got bytearray(b'ab')"),
    ],
    ids=["fcfs", "too-few", "too-many", "a-bool", "a-float", "a-bool-tensor", "not-a-list", "0-d-tensor", "0-d-array",
         "2-d-tensor", "a-set", "bytes"],
)  # fmt: skip
def test_a_bad_priority_is_one_line_and_queues_nothing(policy, priority, message):
    llm = make_llm("llama-tiny", "eager", max_num_seqs=1, scheduling_policy=policy)
    with pytest.raises(ValueError) as err:
        llm.generate(ragged_prompts(2, llm.vocab_size), greedy(2), priority=priority)
    assert str(err.value) == message
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.eager
def test_static_scheduling_admits_a_batch_only_when_the_last_has_finished():
    llm = make_llm("llama-tiny", "eager", max_num_seqs=2, scheduling="static")
    steps = []
    step = llm.runner.step

    def spy(new_tokens, context_lens, rows, fed=None):
        steps.append((0 if fed is None else len(fed), len(new_tokens)))
        return step(new_tokens, context_lens, rows, fed=fed)

    llm.runner.step = spy
    llm.generate(ragged_prompts(3, llm.vocab_size), [greedy(m, ignore_eos=True) for m in (1, 3, 2)], use_tqdm=False)
    # A and B; B decodes alone (A's row stays idle) until its last token; then C
    assert steps == [(0, 2), (1, 0), (1, 0), (0, 1), (1, 0)]


@pytest.mark.eager
def test_without_chunked_prefill_a_prompt_waits_for_a_step_it_fits_and_one_that_never_fits_is_refused():
    llm = make_llm("llama-tiny", "eager", max_num_seqs=4, max_num_batched_tokens=9, enable_chunked_prefill=False)
    steps = []
    step = llm.runner.step

    def spy(new_tokens, context_lens, rows, fed=None):
        steps.append([len(t) for t in new_tokens])
        return step(new_tokens, context_lens, rows, fed=fed)

    llm.runner.step = spy
    prompts = ragged_prompts(3, llm.vocab_size)  # 1, 7, 3 tokens
    llm.generate(prompts, greedy(2, ignore_eos=True), use_tqdm=False)
    # A and B take 8 of 9; C waits whole (chunked prefill would start it with 1 token): the next step has 2
    # decodes and room for its 3 tokens
    assert steps[:2] == [[1, 7], [3]]
    with pytest.raises(ValueError, match=r"^prompts\[0\]: prompt \(10 tokens\) exceeds max_num_batched_tokens \(9\) "
                       r"with enable_chunked_prefill=False"):  # fmt: skip
        llm.generate([[1] * 10], greedy(1))


@pytest.mark.eager
@pytest.mark.parametrize(
    "where, error",
    [
        ("model", KeyboardInterrupt),  # Ctrl-C while the model runs
        ("model", RuntimeError),
        ("sampler", RuntimeError),  # after the step ran, before its samples are kept
        ("between steps", KeyboardInterrupt),  # generate's own loop, outside any step
    ],
)
def test_an_exception_inside_generate_aborts_its_requests_and_the_next_call_is_right(where, error, monkeypatch):
    """A failed or interrupted call leaves the engine empty: the next call runs, and generates what an
    untouched engine generates (a step that died half-made must not leave a chunk counted as cached or a
    decode without its token)."""
    llm = make_llm("llama-tiny", "eager", max_num_seqs=2, max_num_batched_tokens=4)
    prompts, params = ragged_prompts(3, llm.vocab_size), greedy(6, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    calls = collections.Counter()

    def raising(real):
        def call(*args, **kwargs):
            calls[where] += 1
            if calls[where] == 3:
                raise error("planted")
            return real(*args, **kwargs)

        return call

    with monkeypatch.context() as patched:
        if where == "model":
            patched.setattr(llm.runner, "step", raising(llm.runner.step))
        elif where == "sampler":
            patched.setattr(llm_engine_module, "sample", raising(llm_engine_module.sample))
        else:
            patched.setattr(llm.llm_engine, "step", raising(llm.llm_engine.step))
        with pytest.raises(error, match="planted"):
            llm.generate(prompts, params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert sorted(llm.llm_engine.scheduler.free_rows) == [0, 1]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == expected


@pytest.mark.eager
def test_an_aborted_request_is_never_returned_and_the_others_generate_what_they_generate_alone():
    """``llm_engine.abort_requests`` on a running request (its row goes to a waiting one) and on a waiting
    one; unknown and finished ids are ignored."""
    llm = make_llm("llama-tiny", "eager", max_num_seqs=2)
    prompts, params = ragged_prompts(4, llm.vocab_size), greedy(5, ignore_eos=True)
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    engine = llm.llm_engine
    ids = engine.add_requests(prompts, params)
    outputs = {o.request_id: o for o in engine.step() + engine.step()}
    engine.abort_requests([ids[0], ids[3], "no-such-id"])  # A runs, D waits
    assert [r.request_id for r in engine.scheduler.waiting] == [ids[2]]
    while engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in engine.step())
    engine.abort_requests([ids[1]])  # finished: nothing happens
    assert sorted(outputs) == sorted([ids[1], ids[2]])
    assert [outputs[i].outputs[0].token_ids for i in (ids[1], ids[2])] == [alone[1], alone[2]]
    assert sorted(engine.scheduler.free_rows) == [0, 1]


@pytest.mark.eager
def test_abort_requests_takes_one_id_as_a_string_and_refuses_what_is_no_id():
    """A string was read as its characters: ``abort_requests("12")`` aborted requests '1' and '2' and left '12'
    running. vLLM's ``abort_request`` takes one id or an iterable of them; ids are strings (``add_requests``
    returns them), so an int is refused in one line rather than matching nothing without a word."""
    llm = make_llm("llama-tiny", "eager", max_num_seqs=2)
    engine = llm.llm_engine
    ids = engine.add_requests(ragged_prompts(7, llm.vocab_size) * 2, greedy(2, ignore_eos=True))  # '0' .. '13'
    engine.abort_requests(ids[12])
    unfinished = sorted(r.request_id for r in engine.scheduler.waiting + engine.scheduler.running)
    assert unfinished == sorted(ids[:12] + ids[13:])
    for bad, named in [(5, "5"), ([ids[0], 3], "3"), (None, "None"), (b"11", "b'11'")]:
        with pytest.raises(ValueError) as err:
            engine.abort_requests(bad)
        assert str(err.value).startswith("request_ids: expected") and named in str(err.value), err.value

    def ids_then_a_failure():
        yield ids[0]
        raise TypeError("the caller's own error")

    with pytest.raises(TypeError, match="the caller's own error"):  # not hidden behind a message about ids
        engine.abort_requests(ids_then_a_failure())
    assert len(engine.scheduler.waiting + engine.scheduler.running) == 13  # none dropped
    engine.abort_requests(ids)


@pytest.mark.eager
def test_generate_refuses_to_drop_requests_added_to_the_engine_by_hand():
    """Their outputs would be lost; the way out is named, and after it generate runs."""
    llm = make_llm("llama-tiny", "eager", max_num_seqs=2)
    (request_id,) = llm.llm_engine.add_requests(ragged_prompts(1, llm.vocab_size), greedy(3, ignore_eos=True))
    with pytest.raises(ValueError) as err:
        llm.generate(ragged_prompts(1, llm.vocab_size), greedy(3), use_tqdm=False)
    assert str(err.value) == (
        "generate: llm_engine holds unfinished requests added with llm_engine.add_requests, whose outputs generate "
        "would drop; step them to the end (llm_engine.step() while llm_engine.has_unfinished_requests()) or abort "
        "them (llm_engine.abort_requests(ids)) first"
    )
    llm.llm_engine.abort_requests([request_id])
    assert len(llm.generate(ragged_prompts(1, llm.vocab_size), greedy(3), use_tqdm=False)) == 1


@pytest.mark.eager
def test_a_request_aborted_while_its_stop_token_is_in_flight_is_not_returned():
    """The step that samples a stop token is read one call later; aborted in between, the request must stay
    aborted when that token is read (beside another request's, which keeps the step's tokens to be read),
    not finish with it."""
    llm = make_llm("llama-tiny", "eager")
    prompt, other = ragged_prompts(2, llm.vocab_size)[::-1]
    free = _first_tokens(llm, prompt, 4)
    assert free[1] != free[0], "the stop token must first come at the second position: pick another prompt"
    engine = llm.llm_engine
    request_id, other_id = engine.add_requests(
        [prompt, other], [greedy(4, stop_token_ids=[free[1]], ignore_eos=True), greedy(6, ignore_eos=True)]
    )
    assert engine.step() == [] and engine.step() == []  # the prefill, then the decode that samples free[1]
    engine.abort_requests([request_id])
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [o.request_id for o in outputs] == [other_id]


# ---------------------------------------------------------------------- stopping
def _first_tokens(llm: LLM, prompt: list[int], n: int) -> list[int]:
    return llm.generate([prompt], greedy(n, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.eager
def test_a_stop_token_ends_the_sequence_and_is_reported():
    llm = make_llm("llama-tiny", "eager")
    prompt = ragged_prompts(2, llm.vocab_size)[1]
    free = _first_tokens(llm, prompt, 8)
    stop = free[3]
    out = llm.generate([prompt], greedy(8, stop_token_ids=[stop]), use_tqdm=False)[0].outputs[0]
    end = free.index(stop) + 1
    assert out.token_ids == free[:end]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


@pytest.mark.eager
def test_decode_issues_each_step_before_reading_the_previous_steps_tokens(monkeypatch):
    """The decode loop never waits for a step's tokens before issuing the next: every decode step feeds
    the previous step's samples as a device tensor (the first one too: the prefill's), and it sees a stop
    token one step late, so the stopped sequence runs in one more step, whose token is dropped."""
    llm = make_llm("llama-tiny", "eager")
    a, b = ragged_prompts(2, llm.vocab_size)
    free_a, free_b = _first_tokens(llm, a, 8), _first_tokens(llm, b, 6)
    # a stop token A generates as its 2nd-4th token (not before) and B never does
    stop = next((t for i, t in enumerate(free_a[1:4], 1) if t not in free_a[:i] and t not in free_b), None)
    assert stop is not None, f"no usable stop token in {free_a} against {free_b}: pick other prompts"
    end = free_a.index(stop) + 1  # A's last token; decode step k makes token k + 1
    steps = []
    real_step = llm.runner.step

    def recording(tokens, context_lens, rows, fed=None):
        steps.append((fed is not None, len(rows)))
        return real_step(tokens, context_lens, rows, fed=fed)

    monkeypatch.setattr(llm.runner, "step", recording)
    params = [greedy(8, stop_token_ids=[stop]), greedy(6, ignore_eos=True)]
    out_a, out_b = (o.outputs[0] for o in llm.generate([a, b], params, use_tqdm=False))
    assert (out_a.token_ids, out_a.finish_reason, out_a.stop_reason) == (free_a[:end], "stop", stop)
    assert (out_b.token_ids, out_b.finish_reason) == (free_b, "length")
    # the prefill, then B's 5 decode steps; A runs in decode steps 1..end (step `end` is the late one)
    assert steps == [(False, 2)] + [(True, 1 + (k <= end)) for k in range(1, 6)]


@pytest.mark.eager
def test_eos_ends_the_sequence_unless_ignore_eos():
    llm = make_llm("llama-tiny", "eager")
    prompt = ragged_prompts(2, llm.vocab_size)[1]
    free = _first_tokens(llm, prompt, 8)
    llm.requests.eos_token_ids = frozenset({free[2]})  # pretend the model's EOS is the third token it generates
    stopped = llm.generate([prompt], greedy(8), use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == free[: free.index(free[2]) + 1]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", None)
    ignored = llm.generate([prompt], greedy(8, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert (ignored.token_ids, ignored.finish_reason) == (free, "length")


MAX_TOKENS = 8


@pytest.fixture(scope="module")
def stop_case():
    """An eager llama-tiny LLM, two prompts and each one's first MAX_TOKENS greedy tokens (no stopping)."""
    llm = make_llm("llama-tiny", "eager")
    a, b = ragged_prompts(3, llm.vocab_size)[1:]
    return llm, a, b, _first_tokens(llm, a, MAX_TOKENS), _first_tokens(llm, b, MAX_TOKENS)


@pytest.mark.eager
@pytest.mark.parametrize("position", range(MAX_TOKENS))
def test_a_stop_token_at_any_position_ends_the_sequence_there_and_the_other_goes_on(stop_case, position):
    """Position 0 is the prefill's token, the last one reaches max_tokens as it stops (still 'stop', with
    its reason, as in vLLM); in between, the decode loop reads each step's tokens one step late, so the
    stopped sequence runs one more step whose token must be dropped while the other sequence goes on."""
    llm, a, b, free_a, free_b = stop_case
    stop = free_a[position]
    if stop in free_a[:position] or stop in free_b:
        pytest.skip(f"token {stop} also comes earlier in A or in B: no clean boundary at {position}")
    out_a, out_b = (
        o.outputs[0] for o in llm.generate([a, b], greedy(MAX_TOKENS, stop_token_ids=[stop]), use_tqdm=False)
    )
    assert (out_a.token_ids, out_a.finish_reason, out_a.stop_reason) == (free_a[: position + 1], "stop", stop)
    assert (out_b.token_ids, out_b.finish_reason, out_b.stop_reason) == (free_b, "length", None)


@pytest.mark.eager
def test_eos_wins_over_a_stop_token_that_is_also_eos_unless_ignore_eos(stop_case):
    """vLLM checks EOS first: a token that is EOS and in stop_token_ids stops with stop_reason None; with
    ignore_eos it is only a stop token, and is reported as the reason."""
    llm, a, _, free_a, _ = stop_case
    token = free_a[2]
    eos = llm.requests.eos_token_ids
    llm.requests.eos_token_ids = frozenset({token})
    try:
        as_eos = llm.generate([a], greedy(MAX_TOKENS, stop_token_ids=[token]), use_tqdm=False)[0].outputs[0]
        ignored = llm.generate([a], greedy(MAX_TOKENS, stop_token_ids=[token], ignore_eos=True), use_tqdm=False)
    finally:
        llm.requests.eos_token_ids = eos
    end = free_a.index(token) + 1
    assert (as_eos.token_ids, as_eos.finish_reason, as_eos.stop_reason) == (free_a[:end], "stop", None)
    out = ignored[0].outputs[0]
    assert (out.token_ids, out.finish_reason, out.stop_reason) == (free_a[:end], "stop", token)


@pytest.mark.eager
def test_min_tokens_allows_a_stop_token_exactly_from_its_count_on(stop_case):
    """With min_tokens=m the (m+1)-th token may stop the sequence; with m+1 it may not."""
    llm, a, b, free_a, _ = stop_case
    m = next(i for i in range(1, MAX_TOKENS - 1) if free_a[i] not in free_a[:i])
    stop = free_a[m]
    allowed = llm.generate([a], greedy(MAX_TOKENS, stop_token_ids=[stop], min_tokens=m), use_tqdm=False)
    assert allowed[0].outputs[0].token_ids == free_a[: m + 1]
    banned = llm.generate([a], greedy(MAX_TOKENS, stop_token_ids=[stop], min_tokens=m + 1), use_tqdm=False)
    tokens = banned[0].outputs[0].token_ids
    assert tokens[:m] == free_a[:m] and tokens[m] != stop


@pytest.mark.eager
def test_min_tokens_keeps_stop_tokens_from_being_sampled_early():
    llm = make_llm("llama-tiny", "eager")
    prompt = ragged_prompts(2, llm.vocab_size)[1]
    stop = _first_tokens(llm, prompt, 1)[0]
    out = llm.generate([prompt], greedy(8, stop_token_ids=[stop], min_tokens=4), use_tqdm=False)[0].outputs[0]
    assert stop not in out.token_ids[:4]
    assert len(out.token_ids) >= 4


# ---------------------------------------------------------------------- sampling and text
@pytest.mark.eager
def test_seeded_sampling_repeats_and_different_seeds_differ():
    llm = make_llm("llama-tiny", "eager")
    prompts = ragged_prompts(3, llm.vocab_size)

    def run(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, ignore_eos=True, seed=seed)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.eager
def test_unseeded_sampling_repeats_for_an_llm_with_the_same_seed():
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    runs = []
    for _ in range(2):
        llm = make_llm("llama-tiny", "eager", seed=5)
        runs.append([o.outputs[0].token_ids for o in llm.generate(ragged_prompts(3, 256), params, use_tqdm=False)])
    assert runs[0] == runs[1]


@pytest.mark.eager
@pytest.mark.skipif(not (TINY_CHECKPOINT / "tokenizer.json").exists(), reason="fixtures/tiny-llama not built")
def test_text_prompts_are_tokenized_and_outputs_detokenized():
    llm = LLM(str(TINY_CHECKPOINT), enforce_eager=True, device="cpu", use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    out = llm.generate(["the cat sat on the mat"], greedy(5, ignore_eos=True), use_tqdm=False)[0]
    assert out.prompt == "the cat sat on the mat"
    assert out.prompt_token_ids == tokenizer.encode("the cat sat on the mat")
    completion = out.outputs[0]
    assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    by_ids = llm.generate([out.prompt_token_ids], greedy(5, ignore_eos=True), use_tqdm=False)[0]
    assert by_ids.outputs[0].token_ids == completion.token_ids
    # vLLM's TextPrompt form (a new user's first try was refused)
    as_dict = llm.generate([{"prompt": "the cat sat on the mat"}], greedy(5, ignore_eos=True), use_tqdm=False)[0]
    assert (as_dict.prompt, as_dict.outputs[0].token_ids) == (out.prompt, completion.token_ids)


@pytest.mark.eager
@pytest.mark.skipif(not (TINY_CHECKPOINT / "tokenizer.json").exists(), reason="fixtures/tiny-llama not built")
@pytest.mark.parametrize(
    "prompt, match",
    [
        ({"prompt": 3}, r"^prompts\[0\]: expected a non-empty list of token ids or a string"),
        ({"prompt": ""}, r"^prompts\[0\]: expected a non-empty list of token ids or a string"),
        ("\ud800", r"^prompts\[0\]: the tokenizer cannot encode it \("),  # a lone surrogate: transformers' TypeError
    ],
    ids=["not-text", "empty-text", "lone-surrogate"],
)
def test_a_text_prompt_the_tokenizer_cannot_take_is_one_line_naming_it(prompt, match):
    llm = LLM(str(TINY_CHECKPOINT), enforce_eager=True, device="cpu", use_tqdm=False)
    with pytest.raises(ValueError, match=match) as error:
        llm.generate([prompt], greedy(2), use_tqdm=False)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_modes_resolve_to_their_compilation_settings(mode):
    llm = make_llm("llama-tiny", mode, max_num_seqs=4, max_model_len=40)
    expected_level = 0 if mode in ("eager", "breakable") else 3
    assert llm.config.level == expected_level
    # these modes use every custom op but the opt-in GEMM fusions
    assert llm.custom_ops["disabled"] == ["linear_activation", "linear_residual_add", "rms_norm_linear"]
    # decode sizes up to max_num_seqs, then prefill sizes up to max_num_seqs x max_model_len = 160 tokens
    assert llm.config.cudagraph_capture_sizes == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160)


@pytest.mark.no_inductor
def test_a_prefill_replays_the_piecewise_graph_of_the_next_size_up_by_default():
    llm = make_llm("llama-tiny", "no_inductor", max_num_seqs=4, max_model_len=32)
    before = collections.Counter(llm.runner.dispatch_counts)  # the warm-up's steps
    llm.generate(ragged_prompts(4, 256), greedy(3, ignore_eos=True), use_tqdm=False)  # 23 prompt tokens
    # dispatched the same way on a CPU, where nothing is captured: 1 prefill + 2 decode steps
    assert llm.runner.dispatch_counts - before == {"PIECEWISE": 3}
    assert llm.runner.padded_size(23) == 24


@pytest.mark.parametrize("max_num_seqs", [1, 3, 8, 40, 256, 600])
@pytest.mark.parametrize("max_num_tokens", [1, 7, 64, 200, 512, 8192])
def test_engine_capture_sizes_pad_decode_like_vllm_and_a_prefill_by_at_most_half(max_num_seqs, max_num_tokens):
    if max_num_tokens < max_num_seqs:
        max_num_tokens = max_num_seqs  # the engine refuses fewer tokens than sequences
    sizes = engine_capture_sizes(max_num_seqs, max_num_tokens)
    largest = min(max_num_tokens, DEFAULT_MAX_CAPTURE_SIZE)
    assert sizes == tuple(sorted(set(sizes))) and sizes[-1] == largest
    decode = min(max_num_seqs, largest)
    assert tuple(s for s in sizes if s <= decode) == default_capture_sizes(decode)
    for n in range(decode + 1, largest + 1):
        padded = next(s for s in sizes if s >= n)
        assert padded <= max(16, 1.5 * n), (n, padded)
    assert len(sizes) <= len(default_capture_sizes(decode)) + 12  # a dozen prefill sizes at most


@pytest.mark.no_inductor
def test_capture_sizes_given_as_none_are_the_engines_default_as_in_vllm():
    config = {**MODES["no_inductor"]["compilation_config"], "cudagraph_capture_sizes": None}
    llm = LLM("llama-tiny", device="cpu", use_tqdm=False, max_num_seqs=4, max_model_len=8, compilation_config=config)
    assert llm.config.cudagraph_capture_sizes == (1, 2, 4, 8, 16, 24, 32)


@pytest.mark.no_inductor
@pytest.mark.parametrize(
    "field, value, expected",
    [("max_cudagraph_capture_size", 16, (1, 2, 4, 8, 16)), ("cudagraph_capture_sizes", [1, 16], (1, 16))],
)
def test_a_config_that_names_its_capture_sizes_keeps_them(field, value, expected):
    config = {**MODES["no_inductor"]["compilation_config"], field: value}
    llm = LLM("llama-tiny", device="cpu", use_tqdm=False, compilation_config=config)
    assert llm.config.cudagraph_capture_sizes == expected


@pytest.mark.eager
def test_a_kv_cache_larger_than_the_machine_is_refused_in_one_line_naming_its_sizes():
    message = r"max_num_seqs x max_model_len \(1000000000 x 16\): the KV cache and input buffers need [\d,.]+ GiB"
    with pytest.raises(ValueError, match=message) as err:
        make_llm("llama-tiny", "eager", max_num_seqs=10**9, max_model_len=16)
    assert "\n" not in str(err.value)


@pytest.mark.eager
def test_weights_larger_than_the_machine_are_refused_before_any_is_built(tmp_path, monkeypatch):
    """A model that can never fit (here a 1,024-layer config of 3.3 trillion parameters: no weight files are
    needed to see it) is one line naming the weights' size, raised before a weight is allocated or read, not
    a kernel OOM kill minutes in (a 23 GiB machine asked for llama-3.1-8b in float32)."""
    config = transformers.LlamaConfig(
        hidden_size=16384, intermediate_size=53248, num_hidden_layers=1024, num_attention_heads=128,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=64,
    )  # fmt: skip
    config.save_pretrained(tmp_path)
    built = []
    real_build = registry.build_model
    monkeypatch.setattr(registry, "build_model", lambda *a, **k: built.append(k["device"]) or real_build(*a, **k))
    with pytest.raises(ConfigError, match=r"the weights \([\d,.]+ GiB in float32\) need more than") as err:
        LLM(str(tmp_path), device="cpu", dtype="float32", use_tqdm=False, max_num_seqs=1, enforce_eager=True)
    assert "\n" not in str(err.value)
    assert all(torch.device(d).type == "meta" for d in built), f"weights built on {built} before the check"


@pytest.mark.parametrize(
    "weights, cache, blamed",
    [(0, 9, "the KV cache and input buffers need 9.0 GiB"), (9, 1, r"the weights \(9.0 GiB in bfloat16\) need"),
     (6, 6, r"the weights \(6.0 GiB in bfloat16\) and the KV cache and input buffers of .* \(6.0 GiB\)"),
     (900, 9, r"the weights \(900.0 GiB in bfloat16\) need more than .*; and the KV cache and input buffers of "
              r"max_num_seqs x max_model_len \(1 x 1\) need 9.0 GiB")],
)  # fmt: skip
def test_the_memory_refusal_blames_what_does_not_fit(monkeypatch, weights, cache, blamed):
    """8 GiB of memory: the cache alone, the weights alone, only the two together, or each too large (a
    user who lowered only the cache's sizes would meet the weights' refusal next)."""
    monkeypatch.setattr(kv_cache.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**21}[name])
    with pytest.raises(ConfigError, match=blamed):
        kv_cache.check_fits(
            cache * 2**30, torch.device("cpu"), 1, 1, weight_bytes=weights * 2**30, dtype=torch.bfloat16
        )
    kv_cache.check_fits(2**30, torch.device("cpu"), 1, 1, weight_bytes=6 * 2**30, dtype=torch.bfloat16)  # fits


@pytest.mark.eager
def test_explicit_capture_sizes_are_kept():
    llm = make_llm("llama-tiny", "eager", compilation_config={"level": 0, "cudagraph_capture_sizes": [1, 16]})
    assert llm.config.cudagraph_capture_sizes == (1, 16)


@pytest.mark.eager
def test_default_max_model_len_is_capped_at_2048_and_dtype_auto_follows_the_checkpoint():
    llm = make_llm("llama-tiny", "eager")
    assert llm.max_model_len == 512  # llama-tiny's max_position_embeddings, below the 2048 cap
    assert llm.dtype == torch.float32  # preset without a dtype, on CPU
    if TINY_CHECKPOINT.exists():
        assert LLM(str(TINY_CHECKPOINT), enforce_eager=True, device="cpu", use_tqdm=False).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dtype="float64"), "^dtype: expected one of"),
        (dict(max_num_seqs=0), "^max_num_seqs: expected an int >= 1"),
        (dict(max_model_len=10_000), r"^max_model_len \(10000\) exceeds"),
        (dict(max_num_seqs=8, max_num_batched_tokens=4), r"^max_num_batched_tokens \(4\) must be >= max_num_seqs"),
        (dict(device="tpu"), "^device:"),
        (dict(model="no-such-model"), "^model:"),
        (dict(model=None), "^model: expected a preset name"),
        (dict(seed=1.5), r"^seed: expected an int in \[0, 2\*\*63\), got 1.5"),
        (dict(seed=-1), r"^seed: expected an int in \[0, 2\*\*63\), got -1"),
        (dict(seed=2**64), r"^seed: expected an int in \[0, 2\*\*63\), got 18446744073709551616"),
        (dict(enforce_eager="yes"), r"^enforce_eager: expected a bool, got 'yes'"),
        (dict(skip_tokenizer_init=1), r"^skip_tokenizer_init: expected a bool, got 1"),
        (dict(skip_tokenizer_init=True, tokenizer="fixtures/tiny-llama"), r"^tokenizer and skip_tokenizer_init=True"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(kwargs, match):
    kwargs = {"model": "llama-tiny", **kwargs}
    with pytest.raises(ValueError, match=match):
        LLM(use_tqdm=False, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(compilation_config="{level: 3"), "neither JSON"),
        (dict(compilation_config={"levle": 3}), "unknown key"),
        (dict(enforce_eager=True, compilation_config={"level": 3}), "enforce_eager=True contradicts"),
    ],
)
def test_bad_compilation_settings_raise_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LLM("llama-tiny", use_tqdm=False, **kwargs)


@pytest.mark.eager
@pytest.mark.parametrize(
    "prompts, params, match",
    [
        ([[5] * 500], greedy(20), r"^prompts\[0\]: prompt \(500 tokens\) \+ max_tokens \(20\) = 520 exceeds"),
        (["some text"], greedy(2), r"^prompts\[0\] is a string but 'llama-tiny' has no tokenizer"),
        (
            [[1, 2], [3, 256]],
            greedy(2),
            r"^prompts\[1\]: token ids must be ints in \[0, 256\), got 256 at position 1 of 2$",
        ),
        ([[1, 2], []], greedy(2), r"^prompts\[1\]: expected a non-empty list"),
        ([{"prompt": "hi"}], greedy(2), r"^prompts\[0\] is a string but 'llama-tiny' has no tokenizer"),
        ([1, 2, 3], greedy(2), "^prompts: a flat list of ints is ambiguous"),
        ([[1, 2]], greedy(2, stop_token_ids=[300]), r"^sampling_params.stop_token_ids: \[300\] outside"),
        ([[1, 2], [3]], [greedy(2)], "^sampling_params: expected one SamplingParams or a list of 2"),
    ],
)
def test_bad_requests_name_the_prompt_or_field(prompts, params, match):
    llm = make_llm("llama-tiny", "eager")
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, params, use_tqdm=False)


LONG = "x" * 100_000  # a pasted blob: error messages must not echo all of it


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(device=LONG), "^device: expected e.g. 'cpu'"),
        (dict(dtype=LONG), "^dtype: expected one of"),
        (dict(max_num_seqs=LONG), "^max_num_seqs: expected an int >= 1"),
    ],
)
def test_constructor_errors_echo_at_most_a_few_hundred_characters(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        LLM("llama-tiny", use_tqdm=False, **kwargs)
    assert len(str(err.value)) < 400 and "(100002 characters)" in str(err.value)  # repr adds the quotes


@pytest.mark.eager
@pytest.mark.parametrize(
    "prompts, match",
    [
        ([[1] * 100_000 + [256]], r"^prompts\[0\]: token ids must be ints in \[0, 256\), got 256 at position 100000 "),
        ([{"text": LONG}], r"^prompts\[0\]: expected a non-empty list of token ids or a string, got \{'text'"),
    ],
    ids=["long-prompt-with-a-bad-id", "dict-without-token-ids"],
)
def test_request_errors_echo_at_most_a_few_hundred_characters(prompts, match):
    llm = make_llm("llama-tiny", "eager")
    with pytest.raises(ValueError, match=match) as err:
        llm.generate(prompts, greedy(1), use_tqdm=False)
    assert len(str(err.value)) < 400


# ---------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.eager
@pytest.mark.no_inductor
def test_piecewise_cuda_graphs_generate_the_tokens_eager_generates():
    # 4 prompts, max_num_seqs 4: every decode step runs exactly at capture size 4 (no padding rows) and
    # the prefill (24 tokens) exactly at capture size 24, so no_inductor replays eager's kernels on
    # eager's shapes: the tokens must be identical, not just close.
    prompts = ragged_prompts(4, 256)
    prompts[0].append(3)  # 23 + 1 prompt tokens
    tokens = {}
    for mode in ("eager", "no_inductor"):
        llm = make_llm("llama-tiny", mode, device="cuda", dtype="float32", max_num_seqs=4)
        before = collections.Counter(llm.runner.dispatch_counts)  # the warm-up's steps
        outputs = llm.generate(prompts, greedy(8, ignore_eos=True), use_tqdm=False)
        tokens[mode] = [o.outputs[0].token_ids for o in outputs]
        if mode == "no_inductor":
            assert llm.startup.capture_sizes[-4:] == (8, 4, 2, 1) and 24 in llm.startup.capture_sizes
            assert llm.runner.dispatch_counts - before == {"PIECEWISE": 8}  # the prefill and 7 decode steps
    assert tokens["no_inductor"] == tokens["eager"]


@pytest.mark.gpu
@pytest.mark.inductor
def test_inductor_with_padded_decode_batches_matches_the_oracle():
    # float32: NEAR_TIE is a float32 margin (bfloat16 rounding would flip far wider gaps)
    llm = make_llm("llama-tiny", "inductor", device="cuda", dtype="float32", max_num_seqs=4)
    prompts = ragged_prompts(3, llm.vocab_size, seed=2)  # 3 sequences: decode steps padded to size 4
    outputs = llm.generate(prompts, greedy(8, ignore_eos=True), use_tqdm=False)
    assert_matches_oracle(llm, prompts, outputs, 8)


@pytest.mark.gpu
@pytest.mark.eager
def test_the_decode_loops_token_copy_to_the_host_returns_before_the_device_is_done():
    """The loop copies a step's sampled tokens to the host while later steps run. A copy into pageable
    memory waits for everything queued before it, even with ``non_blocking=True``, and torch's sync debug
    mode does not see that wait (the test above would pass): every step would stall the host, with the same
    tokens. Here about 50 ms of device work is queued before the copy, which must return while it runs."""
    tokens = torch.arange(8, device="cuda").reshape(2, 4)  # int64, as sampled
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # about 50 ms at the H200's 1.98 GHz
    host, copied = llm_engine_module._copy_to_host(tokens)
    returned_early = not copied.query()
    copied.synchronize()
    assert host.device.type == "cpu" and host.is_pinned()
    assert host.dtype == tokens.dtype and host.shape == tokens.shape  # tolist() would take 0.0 for 0
    assert host.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert returned_early, "the copy returned only once the device had finished the work queued before it"


def test_the_decode_loops_token_copy_asks_cuda_for_a_pinned_non_blocking_copy_then_an_event(monkeypatch):
    """The test above on a CPU, with what ``_copy_to_host`` asks of CUDA recorded instead of run (CI has no
    GPU, and the mutation runs are CI's): a pinned host tensor of the tokens' shape and dtype, a non-blocking
    copy into it, and an event recorded after the copy, handed back with it."""
    calls = []

    class Tokens:  # a CUDA tensor, as far as _copy_to_host looks
        is_cuda, shape, dtype = True, (2, 4), torch.int64

    class Host:
        def copy_(self, source, **kwargs):
            calls.append(("copy", source, kwargs))

    class Event:
        def record(self, *args):
            calls.append(("record", self, args))

    host = Host()
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: calls.append(("empty", args, kwargs)) or host)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    tokens = Tokens()
    returned, copied = llm_engine_module._copy_to_host(tokens)
    assert returned is host and isinstance(copied, Event)
    assert calls == [
        ("empty", ((2, 4),), {"dtype": torch.int64, "pin_memory": True}),
        ("copy", tokens, {"non_blocking": True}),
        ("record", copied, ()),  # after the copy, on the current stream
    ]


def test_the_decode_loops_token_copy_is_the_tokens_themselves_on_a_cpu():
    tokens = torch.arange(8).reshape(2, 4)
    returned, copied = llm_engine_module._copy_to_host(tokens)
    assert returned is tokens and copied is None


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "no_inductor", "no_inductor_full"])
def test_the_engine_loop_waits_for_the_device_only_to_read_tokens_one_step_late(mode, monkeypatch):
    """Issue 9's decode loop, under continuous batching: every step (prompt chunks from the host, decodes
    fed the previous step's samples on the device, the sampling of greedy, temperature, top-k, top-p and
    min_tokens' bans, the samples gathered as requests finish and others join) makes no call that waits for
    the device (``torch.cuda.set_sync_debug_mode('error')`` raises on any), except the one deliberate wait:
    reading a step's tokens after the next is issued. Three rows for four requests, so the last one joins
    in the step after the first finishes."""
    llm = make_llm("llama-tiny", mode, device="cuda", max_num_seqs=3)
    params = [
        greedy(8, ignore_eos=True),  # the longest: with the prefill, 8 steps of its own
        SamplingParams(temperature=0.8, max_tokens=3, seed=1),
        SamplingParams(temperature=0.8, top_k=20, max_tokens=7, seed=2),
        SamplingParams(temperature=0.8, top_p=0.9, min_tokens=2, stop_token_ids=[7], max_tokens=6, seed=3),
    ]
    prompts = ragged_prompts(4, llm.vocab_size)
    llm.generate(prompts, params, use_tqdm=False)  # warm: graphs, kernels, pinned host blocks
    engine = llm.llm_engine
    reads, steps = [], []
    real_read, real_step = LLMEngine._read, llm.runner.step

    def read(self, *args):  # the deliberate wait, allowed
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_read(self, *args)
        finally:
            torch.cuda.set_sync_debug_mode("error")
            reads.append(len(args[0]))

    def step(new_tokens, context_lens, rows, fed=None):
        steps.append((0 if fed is None else len(fed), len(new_tokens)))
        return real_step(new_tokens, context_lens, rows, fed=fed)

    monkeypatch.setattr(LLMEngine, "_read", read)
    monkeypatch.setattr(llm.runner, "step", step)
    dispatched = collections.Counter(llm.runner.dispatch_counts)
    ids = engine.add_requests(prompts, params)
    outputs = {}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            while engine.has_unfinished_requests():
                outputs.update((o.request_id, o) for o in engine.step())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sorted(outputs) == sorted(ids) and len(outputs[ids[0]].outputs[0].token_ids) == 8
    assert any(decodes and chunks for decodes, chunks in steps), f"no mixed step: {steps}"
    assert len(reads) == len(steps)  # one read per step, each after the next step is issued (or the last)
    if mode != "eager":
        replayed = collections.Counter(llm.runner.dispatch_counts) - dispatched
        graph = {"no_inductor": "PIECEWISE", "no_inductor_full": "FULL"}[mode]
        decode_only = sum(1 for decodes, chunks in steps if not chunks)
        assert replayed[graph] >= (len(steps) if mode == "no_inductor" else decode_only)
