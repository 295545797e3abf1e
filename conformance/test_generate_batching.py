"""A request's greedy tokens do not depend on the requests batched with it, nor on when those finish.

Requests of one wave finish at different steps (different ``max_tokens``), so later decode steps run a
shrinking batch whose sequences sit in KV-cache rows that are no longer 0..B-1; a second configuration
runs the same prompts in waves of two, reusing cache rows. The expectation is the same engine running
each prompt alone, compared exactly: float32 on the CPU with one sequence per step or several moves
logits by a few ulps (conformance/test_runner.py), and along these transcripts the two best logits are
never closer than 0.02 (measured with transformers' greedy oracle), so batching cannot flip a token. A
sequence that reads another's cache row changes its logits by far more than that.
"""

from __future__ import annotations

import pytest

from conformance.helpers import token_ids
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams

pytestmark = [pytest.mark.requires("components"), pytest.mark.eager]

MAX_TOKENS = [2, 7, 3, 7, 5]


@pytest.mark.parametrize("max_num_seqs", [8, 2], ids=["one-wave", "waves-of-2"])
def test_each_request_generates_what_it_generates_alone(max_num_seqs):
    llm = LLM("llama-tiny", enforce_eager=True, device="cpu", use_tqdm=False, max_num_seqs=max_num_seqs)
    prompts = [token_ids(n, llm.vocab_size, seed=10 + n) for n in (4, 9, 1, 6, 3)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    alone = [llm.generate([p], [sp], use_tqdm=False)[0].outputs[0].token_ids for p, sp in zip(prompts, params)]
    assert [len(t) for t in together] == MAX_TOKENS
    assert together == alone
