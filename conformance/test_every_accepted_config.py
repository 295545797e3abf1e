"""Every accepted config runs correctly or is refused: a property over generated configs and batches.

Hypothesis draws compilation configs (levels, ``use_inductor=False``, custom-op lists, splitting ops,
graph modes, capture sizes, warm-up counts; valid and invalid alike) and batches of prompts of 1-9 tokens.
Each config must either be refused with a one-line ``ConfigError`` (when it is built, when layers are
built, or when the model is compiled), or generate what eager PyTorch generates: the same prefill and
decode logits within ``ORACLE_ATOL`` (both run float32 in different orders; see conformance/oracle.py). A
crash of another kind, a silently wrong answer or a dead CUDA context fails the property.

``use_inductor`` stays False here (an Inductor compile per example would take seconds on CPU); Inductor's
configs are covered by the mode matrix of the other modules.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.driver import run_steps
from conformance.helpers import build_llama, small_llama_config, token_ids
from conformance.implementation import Unsupported, make_runner
from conformance.oracle import ORACLE_ATOL
from reference.config import CompilationConfig, ConfigError, mode_config

HF = small_llama_config(num_hidden_layers=1)
SIZES = dict(max_num_seqs=4, max_model_len=24)
FIELDS = [f.name for f in dataclasses.fields(CompilationConfig) if f.init]
# Most drawn configs are refused in microseconds, the accepted ones trace a one-layer model: 40 examples
# take a few seconds on CPU. HYPOTHESIS_EXAMPLES sets a longer search.
EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "40"))


def _optional(strategy):
    """A field that is either left out (the default) or drawn from ``strategy``."""
    return st.one_of(st.just(None), strategy)


CONFIG_FIELDS = st.fixed_dictionaries(
    {
        "level": _optional(st.sampled_from([0, 1, 2, 3])),
        "use_inductor": st.just(False),
        "custom_ops": _optional(
            st.lists(
                st.sampled_from(["all", "none", "+rms_norm", "-rms_norm", "-rotary_embedding", "+bogus"]), max_size=3
            )
        ),
        "splitting_ops": _optional(
            st.sampled_from([[], ["reference::attention"], ["reference::rms_norm"], ["foo::bar"]])
        ),
        "cudagraph_mode": _optional(
            st.sampled_from(["none", "piecewise", "full_decode_only", "full_and_piecewise", "FULL", "full"])
        ),
        "cudagraph_capture_sizes": _optional(st.lists(st.integers(0, 20), max_size=4)),
        "cudagraph_num_of_warmups": _optional(st.integers(0, 2)),
        # refused without Inductor whenever not empty (test_compile_sizes runs them with it)
        "compile_sizes": _optional(st.lists(st.sampled_from([2, 4, 0, "cudagraph_capture_sizes"]), max_size=2)),
    }
).map(lambda fields: {k: v for k, v in fields.items() if v is not None})
PROMPTS = st.lists(st.integers(1, 9), min_size=1, max_size=4)


def _steps(lengths: list[int]) -> list[list[list[int]]]:
    """A prefill of prompts of ``lengths`` tokens, then two decode steps."""
    prompts = [token_ids(n, HF.vocab_size, seed=i) for i, n in enumerate(lengths)]
    decodes = [[[token_ids(1, HF.vocab_size, seed=100 * s + i)[0]] for i in range(len(lengths))] for s in (1, 2)]
    return [prompts, *decodes]


@pytest.mark.eager
@pytest.mark.breakable
@pytest.mark.no_inductor
@pytest.mark.no_inductor_full
@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=CONFIG_FIELDS, lengths=PROMPTS)
def test_every_accepted_config_runs_like_eager_or_is_refused(impl, fields, lengths):
    steps = _steps(lengths)
    eager = mode_config("eager", custom_ops=["none"])  # plain PyTorch: the same for every implementation
    expected = run_steps(make_runner(impl, build_llama(HF, eager), eager, **SIZES), steps)
    torch._dynamo.reset()
    try:
        config = CompilationConfig(**fields)
        runner = make_runner(impl, build_llama(HF, config), config, **SIZES)
        runner.warm_up()
        logits = run_steps(runner, steps)
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message and any(f in message for f in FIELDS), f"not one line naming a field: {message}"
        return
    except Unsupported:  # an implementation's declared gap (the config is valid): this example checks nothing
        return
    for step, (ours, reference) in enumerate(zip(logits, expected)):
        torch.testing.assert_close(
            ours, reference, rtol=0, atol=ORACLE_ATOL, msg=lambda m: f"{fields}, step {step}: {m}"
        )
