"""The reference's own post-grad pass for Inductor (reference.compilation.inductor_passes), read from
the code Inductor generates for llama-tiny's pieces: a residual add after a projection stays an add
(fused into the next norm's kernel) instead of becoming ``addmm``, which on CUDA copies the residual
into the output before its GEMM."""

from __future__ import annotations

import pytest
from torch._inductor.utils import run_and_get_code

from reference.benchmark.choices import MODE_KWARGS
from reference.engine.llm import LLM

pytestmark = pytest.mark.inductor


def _generated_code(**inductor_patches) -> str:
    """Inductor's output code for every piece of llama-tiny in ``inductor`` mode, joined."""
    config = {**MODE_KWARGS["inductor"]["compilation_config"]}
    # no FX graph cache: a hit would skip the code generation this test reads
    config["inductor_compile_config"] = {"fx_graph_cache": False, **inductor_patches}
    _, codes = run_and_get_code(lambda: LLM("llama-tiny", device="cpu", use_tqdm=False, compilation_config=config))
    assert codes, "Inductor generated no code"
    return "\n".join(codes)


@pytest.mark.slow
def test_residual_adds_stay_adds_and_join_the_next_norms_kernel():
    without_pass = _generated_code(post_grad_custom_post_pass=None)
    if "addmm(" not in without_pass:
        pytest.skip("this torch does not fold the residual add into addmm: the pass has nothing to undo")
    code = _generated_code()
    assert "addmm(" not in code
    # 2 layers: per layer qkv, o, gate_up and down projections, plus the LM head's outside the pieces
    assert code.count("extern_kernels.mm(") == 2 * 4
