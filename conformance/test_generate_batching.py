"""A request's greedy tokens do not depend on the requests batched with it, on when those arrive or
finish, nor on how its prompt is cut into chunks.

Requests finish at different steps (different ``max_tokens``), so later steps run a changing batch whose
sequences sit in KV-cache rows that are no longer 0..B-1; with fewer rows than requests, a request takes
the row another has just freed, and with a small token budget its prompt is prefilled in chunks, in steps
that also decode the running requests (mixed steps). The expectation is the same engine running each
prompt alone, compared exactly: float32 on the CPU with one sequence per step or several moves logits by
a few ulps (conformance/test_runner.py), and along these transcripts the two best logits are never closer
than 0.02 (measured with transformers' greedy oracle), so batching cannot flip a token. A sequence that
reads another's cache row, or a chunk that starts at the wrong token, changes its logits by far more.
"""

from __future__ import annotations

import pytest

from conformance.helpers import tiny_eager_llm, token_ids
from reference.benchmark.choices import MODE_KWARGS
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams

pytestmark = [pytest.mark.requires("components"), pytest.mark.eager]

PROMPT_LENS = (4, 9, 1, 6, 3)
MAX_TOKENS = [2, 7, 3, 7, 5]
# (max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, scheduling)
SCHEDULES = {
    "all-at-once": (8, None, True, "continuous"),
    "rows-of-2": (2, None, True, "continuous"),  # a request starts in the step after one finishes
    "budget-4-chunked": (3, 4, True, "continuous"),  # prompts in chunks, in steps that also decode
    "budget-9-unchunked": (3, 9, False, "continuous"),  # a prompt waits for a step it fits whole
    "static-rows-of-2": (2, None, True, "static"),  # the next two start when both have finished
}


def _llm(max_num_seqs=8, max_num_batched_tokens=None, enable_chunked_prefill=True, scheduling="continuous"):
    return tiny_eager_llm(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        scheduling=scheduling,
    )


def _greedy(max_tokens):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def _assert_each_request_generates_what_it_generates_alone(llm: LLM) -> None:
    prompts = [token_ids(n, llm.vocab_size, seed=10 + n) for n in PROMPT_LENS]
    params = [_greedy(m) for m in MAX_TOKENS]
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    alone = [llm.generate([p], [sp], use_tqdm=False)[0].outputs[0].token_ids for p, sp in zip(prompts, params)]
    assert [len(t) for t in together] == MAX_TOKENS
    assert together == alone


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_each_request_generates_what_it_generates_alone(schedule):
    _assert_each_request_generates_what_it_generates_alone(_llm(*schedule))


@pytest.mark.parametrize("budget", [1, 2, 5])
def test_chunked_prefill_generates_what_one_step_prefill_generates(budget):
    """A prompt prefilled ``budget`` tokens a step (one row, so nothing else shares the steps; chunk
    boundaries fall inside every prompt longer than the budget) generates what it generates when the whole
    prompt runs in one step. The two engines are built alike (same seed, same weights); only the budget
    differs."""
    prompts = [token_ids(n, 256, seed=20 + n) for n in (7, 3, 11)]
    params = _greedy(4)
    whole = [o.outputs[0].token_ids for o in _llm(1).generate(prompts, params, use_tqdm=False)]
    chunked = [o.outputs[0].token_ids for o in _llm(1, budget).generate(prompts, params, use_tqdm=False)]
    assert chunked == whole


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "no_inductor", "no_inductor_full"])
def test_on_cuda_each_request_generates_what_it_generates_alone(mode):
    """The rule above on CUDA in float32 (cuBLAS keeps float32 GEMMs in float32 unless TF32 is allowed, which
    torch does not by default), under the schedule with mixed steps, in the modes that replay graphs:
    piecewise graphs around the decode and prefill kernels, and full graphs for the decode-only steps."""
    llm = LLM(
        "llama-tiny",
        device="cuda",
        dtype="float32",
        use_tqdm=False,
        max_num_seqs=3,
        max_num_batched_tokens=4,
        **MODE_KWARGS[mode],
    )
    _assert_each_request_generates_what_it_generates_alone(llm)
