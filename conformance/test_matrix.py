"""The equivalence matrix: architectures x modes x custom ops x dtypes x batch sizes, covered pairwise.

The full product (3 architectures, 3 modes, 3 custom-op lists, 2-3 dtypes, 3 batch sizes: 162 cases on
CPU) would take most of CI's time, chiefly for Inductor compiles. Instead the cases form a *pairwise*
covering set: every pair of values of any two factors appears in at least one case (the greedy
construction of :func:`pairwise`, in the spirit of Cohen et al., "The AETG System", 1997), which finds the
faults that need two factors to meet, the most common kind, with about a tenth of the cases.

Factors:
* architecture: the tiny Llama, Qwen3 and Gemma 3 presets (std-0.2 random weights, norms off identity);
* mode: eager, no_inductor, inductor;
* custom ops: ``['all']``, ``['none']``, and mixed ``['none', '+rms_norm']``;
* dtype: float32, bfloat16 (float16 on GPU, in the gpu-marked cases);
* batch: decode batches at a capture size (4), between two (3, padded to 4) and above the largest (6,
  capture sizes 1, 2, 4).

Rules: the mode's logits at every step (a ragged prefill, then decode steps) are at most twice as far as
eager's, in the same dtype and with the same custom ops, from a float64 run of the same (rounded) weights
(``assert_error_within_twice_eager``: FlashAttention's rule), and where a ``no_inductor`` step runs at a
capture size without padding it is bitwise eager's.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import assert_error_within_twice_eager, perturb_norms, token_ids
from conformance.implementation import make_runner
from reference.config import mode_config
from reference.models.registry import build_model
from reference.ops import CustomOpSelection

FACTORS = {
    "model": ["llama-tiny", "qwen3-tiny", "gemma-3-tiny"],
    "mode": ["eager", "no_inductor", "inductor"],
    "custom_ops": ["all", "none", "mixed"],
    "dtype": ["float32", "bfloat16"],
    "batch": ["at_capture_size", "between_sizes", "above_largest"],
}
CUSTOM_OPS = {"all": ["all"], "none": ["none"], "mixed": ["none", "+rms_norm"]}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BATCH = {"at_capture_size": 4, "between_sizes": 3, "above_largest": 6}
CAPTURE_SIZES = [1, 2, 4]


def pairwise(factors: dict[str, list]) -> list[dict]:
    """A small list of cases in which every pair of values of two factors occurs at least once.

    Greedy: repeatedly take, from the full product, the case that covers the most pairs not yet covered
    (ties: the first in product order, so the list is deterministic).
    """
    names = list(factors)
    uncovered = {
        ((a, va), (b, vb)) for a, b in itertools.combinations(names, 2) for va in factors[a] for vb in factors[b]
    }
    candidates = [dict(zip(names, values)) for values in itertools.product(*factors.values())]
    cases = []
    while uncovered:

        def gain(case):
            return sum(((a, case[a]), (b, case[b])) in uncovered for a, b in itertools.combinations(names, 2))

        best = max(candidates, key=gain)
        uncovered -= {((a, best[a]), (b, best[b])) for a, b in itertools.combinations(names, 2)}
        cases.append(best)
    return cases


def _case_param(case: dict, device: str):
    marks = [getattr(pytest.mark, case["mode"])]
    if case["mode"] != "eager":
        marks.append(pytest.mark.eager)  # the rule runs eager as the baseline
    if device == "cuda":
        marks.append(pytest.mark.gpu)
    ident = "-".join([*(str(case[k]) for k in FACTORS), device])
    return pytest.param(case, device, marks=marks, id=ident)


GPU_FACTORS = {**FACTORS, "dtype": ["float32", "bfloat16", "float16"]}
CASES = [_case_param(c, "cpu") for c in pairwise(FACTORS)] + [_case_param(c, "cuda") for c in pairwise(GPU_FACTORS)]


def _model(preset: str, config, dtype: torch.dtype, device: str, source):
    """``preset`` for ``config`` in ``dtype`` on ``device`` holding ``source``'s weights rounded to ``dtype``
    (built in that dtype, so its float32 RoPE table is computed, not cast)."""
    model = build_model(preset, CustomOpSelection(config), dtype=dtype, device=device)
    model.load_state_dict({name: t.to(dtype) for name, t in source.state_dict().items()})
    return model


@pytest.mark.parametrize("case, device", CASES)
def test_mode_stays_within_twice_eager_error(case, device, impl):
    preset, mode, dtype = case["model"], case["mode"], DTYPES[case["dtype"]]
    batch = BATCH[case["batch"]]
    custom_ops = CUSTOM_OPS[case["custom_ops"]]
    source = perturb_norms(
        build_model(preset, CustomOpSelection(mode_config("eager")), dtype=torch.float32, device="cpu", seed=3), seed=4
    )
    sizes = dict(max_num_seqs=batch, max_model_len=40, max_num_batched_tokens=batch * 40)
    configs = {
        "reference": mode_config("eager", custom_ops=["none"]),
        "eager": mode_config("eager", custom_ops=custom_ops),
        mode: mode_config(mode, custom_ops=custom_ops, cudagraph_capture_sizes=CAPTURE_SIZES),
    }
    runners = {}
    for name, config in configs.items():
        weights_dtype = torch.float64 if name == "reference" else dtype
        model = _model(preset, config, weights_dtype, device, source)
        if name == "reference":  # the tested dtype's weights, exactly, computed in float64
            model.load_state_dict({n: t.to(dtype).to(torch.float64) for n, t in source.state_dict().items()})
        runners[name] = make_runner(impl, model, config, **sizes)
        runners[name].warm_up()
    prompts = [token_ids(2 + (5 * i) % 9, source.config.vocab_size, seed=i) for i in range(batch)]
    logits = prefill_and_decode(runners, prompts, num_decode=3, leader="reference")
    for step in range(4):
        assert_error_within_twice_eager(logits[mode][step], logits["eager"][step], logits["reference"][step])
        decode_at_capture_size = step > 0 and batch in CAPTURE_SIZES
        if mode == "no_inductor" and decode_at_capture_size:
            assert torch.equal(logits[mode][step], logits["eager"][step]), f"step {step}: not bitwise eager"
