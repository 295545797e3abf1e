"""The reference's own post-grad pass for Inductor (reference.compilation.inductor_passes), read from
the code Inductor generates for llama-tiny's pieces: a residual add after a projection stays an add
(fused into the next norm's kernel) instead of becoming ``addmm``, which on CUDA copies the residual
into the output before its GEMM."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from reference.benchmark.choices import MODE_KWARGS
from reference.compilation.inductor_passes import UNFOLD_RESIDUAL_ADDMM
from reference.engine.llm import LLM

pytestmark = pytest.mark.inductor
aten = torch.ops.aten


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


# ---------------------------------------------------------------------- the pass on graphs built by hand
def _addmm_graph(c_shape: tuple[int, ...], *, m: int = 4, meta: bool = True, **kwargs) -> torch.fx.Graph:
    """``relu(addmm(c, a, b, **kwargs))`` with a [m, 3] and b [3, 5], each node's ``meta['val']`` a fake tensor
    as Inductor's post-grad graphs carry them (``meta=False``: c has none)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = torch.fx.Graph()
    c, a, b = (graph.placeholder(name) for name in "cab")
    with FakeTensorMode():
        for node, shape in ((c, c_shape), (a, (m, 3)), (b, (3, 5))):
            node.meta["val"] = torch.empty(shape)
        total = graph.call_function(aten.addmm.default, (c, a, b), kwargs)
        total.meta["val"] = aten.addmm.default(c.meta["val"], a.meta["val"], b.meta["val"], **kwargs)
    if not meta:
        del c.meta["val"]
    graph.output(graph.call_function(aten.relu.default, (total,)))
    return graph


def _targets(graph: torch.fx.Graph) -> list:
    return [node.target for node in graph.nodes if node.op == "call_function"]


def test_a_full_matrix_addmm_becomes_mm_then_add_in_place_with_the_same_result():
    graph = _addmm_graph((4, 5))
    addmm = next(n for n in graph.nodes if n.target is aten.addmm.default)
    UNFOLD_RESIDUAL_ADDMM(graph)
    graph.lint()  # every node defined before its users: the new nodes went where the addmm was
    assert _targets(graph) == [aten.mm.default, aten.add.Tensor, aten.relu.default]
    product, total = (n for n in graph.nodes if n.target in (aten.mm.default, aten.add.Tensor))
    assert total.args == (product, next(iter(graph.nodes)))  # mm(a, b) + c
    # the fake values Inductor's later passes read: the product's own, the sum's the addmm's
    assert tuple(product.meta["val"].shape) == (4, 5) and product.meta["val"].dtype == torch.float32
    assert total.meta["val"] is addmm.meta["val"]
    c, a, b = torch.randn(4, 5), torch.randn(4, 3), torch.randn(3, 5)
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    torch.testing.assert_close(module(c, a, b), torch.relu(torch.addmm(c, a, b)))


@pytest.mark.parametrize(
    "c_shape, m, kwargs, meta",
    [
        ((5,), 4, {}, True),  # a bias row: ATen's addmm broadcasts it without a copy
        ((5,), 5, {}, True),  # the same in a square product, where the row's length matches the first dim too
        ((1, 5), 4, {}, True),  # a broadcast row, two-dimensional
        ((4, 5), 4, {"alpha": 2}, True),  # unfolding would drop the scale
        ((4, 5), 4, {"beta": 2}, True),
        ((4, 5), 4, {"beta": 0}, True),
        ((4, 5), 4, {}, False),  # no fake value to read c's shape from
    ],
)
def test_any_other_addmm_is_left_alone(c_shape, m, kwargs, meta):
    graph = _addmm_graph(c_shape, m=m, meta=meta, **kwargs)
    UNFOLD_RESIDUAL_ADDMM(graph)
    assert _targets(graph) == [aten.addmm.default, aten.relu.default]


def test_an_addmm_without_its_own_fake_value_is_left_alone():
    graph = _addmm_graph((4, 5))
    del next(n for n in graph.nodes if n.target is aten.addmm.default).meta["val"]
    UNFOLD_RESIDUAL_ADDMM(graph)
    assert _targets(graph) == [aten.addmm.default, aten.relu.default]
