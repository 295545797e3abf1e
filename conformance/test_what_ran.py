"""What actually ran, read from torch's own counters, not from the implementation's.

``torch._dynamo.utils.counters`` is torch's process-wide tally: AOT Autograd and Inductor bump
``counters['aot_autograd']`` and ``counters['inductor']`` (graph-cache misses and hits, ...) for every
graph they compile. An implementation's own counters are bumped by its own code, so a branch that
decides wrongly and counts as if it had decided rightly fools them; torch's counters it cannot fool.
So ``use_inductor=False`` must leave both untouched, and ``use_inductor=True`` must move Inductor's.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from conformance.helpers import StaticTokens, build_llama, small_llama_config, token_ids
from conformance.implementation import make_runner
from reference.config import mode_config
from reference.models.silly import SillyModel
from reference.models.toy_llama import ToyLlama, toy_llama_config
from reference.ops import CustomOpSelection

MODELS = ["silly", "toy_llama", "llama_runner"]


def _run(impl, model_name: str, mode: str) -> None:
    """Compile ``model_name`` in ``mode`` with ``impl`` and run it on a few token counts."""
    config = mode_config(mode, cudagraph_capture_sizes=[2, 4])
    if model_name == "silly":
        compiled = impl.compile(SillyModel(), config)
        buffer = torch.zeros(4, 8)
        for size in (4, 2, 3):
            compiled(buffer[:size])
    elif model_name == "toy_llama":
        compiled = impl.compile(ToyLlama(toy_llama_config(2), CustomOpSelection(config)), config)
        tokens = StaticTokens(4)
        with torch.no_grad():
            for size in (4, 2, 3):
                compiled(*tokens(list(range(size))))
    else:
        hf = small_llama_config()
        runner = make_runner(impl, build_llama(hf, config), config, max_num_seqs=2, max_model_len=16)
        runner.warm_up()
        runner.step([token_ids(5, hf.vocab_size, 0), token_ids(3, hf.vocab_size, 1)], [0, 0], [0, 1])


def _compiler_counters() -> dict[str, dict]:
    return {name: dict(counters[name]) for name in ("aot_autograd", "inductor") if counters[name]}


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("mode", ["no_inductor"])
def test_use_inductor_false_compiles_nothing_with_inductor(impl, mode, model_name):
    counters.clear()
    _run(impl, model_name, mode)
    assert _compiler_counters() == {}, "use_inductor=False, but torch's counters show AOT Autograd / Inductor at work"


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("mode", ["inductor"])
def test_use_inductor_true_compiles_with_inductor(impl, mode, model_name):
    """The control: the counters read above do move when Inductor compiles."""
    counters.clear()
    _run(impl, model_name, mode)
    assert counters["inductor"], "use_inductor=True, but torch's counters show no Inductor compilation"
