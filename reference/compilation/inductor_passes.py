"""The post-grad passes the project adds to Inductor: a residual add stays an add (every compile), and, under
``use_inductor_graph_partition``, a pass that changes nothing and exists for its cache key (below).

Inductor's post-grad patterns fold ``mm(a, b) + c`` into ``addmm(c, a, b)`` unless every user of the sum
is pointwise. In a decoder layer the sum is the residual stream: the next RMSNorm reduces over it and
the piece returns it, so the fold happens twice per layer (after the o and the down projections). With a
full ``[T, N]`` ``c`` (not a bias row) and an output buffer of its own, ATen's CUDA ``addmm`` first copies
``c`` into the output and then runs the GEMM with ``beta=1``: one device-to-device copy kernel per fold,
two per layer (the copies issue 9 found in ``inductor`` mode's kernel profile). Unfolded, the add joins the
kernel Inductor generates for the norm, which reads the GEMM's output anyway, as ``no_inductor``'s fused
add + RMSNorm op does. A fold whose sum has no fusable user costs one add kernel instead of one copy, so
the pass never adds a launch.

Inductor's FX-graph cache key leaves out whether a partition wrapper is installed (pytorch#165471), though
the code it generates depends on it: with no wrapper and no Inductor CUDA graphs it makes no partitions. A
compile that is to be captured per partition could then be served code without partitions, and capture
nothing. :data:`PARTITION_WRAPPERS_KEY` puts the wrapper's presence into the key through the one door the
key has for such things, a custom pass's ``uuid``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten


def _is_full_matrix_add(node: torch.fx.Node) -> bool:
    """``node`` is ``addmm(c, a, b)`` with alpha = beta = 1 and ``c`` of the output's own [M, N] shape."""
    if node.target is not aten.addmm.default or node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("beta", 1) != 1:
        return False
    inp, out = node.args[0], node.meta.get("val")
    if not isinstance(inp, torch.fx.Node) or not isinstance(inp.meta.get("val"), torch.Tensor) or out is None:
        return False
    shape = inp.meta["val"].shape
    return len(shape) == 2 and all(statically_known_true(i == o) for i, o in zip(shape, out.shape))


class UnfoldResidualAddmm(CustomGraphPass):
    """Rewrite ``addmm(c, a, b)`` with a full-matrix ``c`` as ``add(mm(a, b), c)`` (see the module)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in [n for n in graph.nodes if _is_full_matrix_add(n)]:
            inp, mat1, mat2 = node.args
            with graph.inserting_before(node):
                product = graph.call_function(aten.mm.default, (mat1, mat2))
                total = graph.call_function(aten.add.Tensor, (product, inp))
            product.meta["val"] = aten.mm.default(mat1.meta["val"], mat2.meta["val"])  # fake tensors
            total.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(total)
            graph.erase_node(node)

    def uuid(self) -> bytes:
        """Inductor's cache key for the pass: this file's contents."""
        return get_hash_for_files((str(Path(__file__)),))


UNFOLD_RESIDUAL_ADDMM = UnfoldResidualAddmm()


class PartitionWrappersKey(CustomGraphPass):
    """A post-grad pass that changes nothing; its ``uuid`` says whether a partition wrapper is installed (torch's
    process-wide slot, which :func:`reference.compilation.partition_graph.partition_wrappers` sets), so that
    Inductor's FX-graph and AOTAutograd caches key a wrapped compile apart from an unwrapped one (module
    doc; pytorch#165471)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> bytes:
        from torch._inductor.utils import _unstable_customized_partition_wrapper

        installed = _unstable_customized_partition_wrapper.wrapper is not None
        return f"partition wrapper installed: {installed}".encode()


PARTITION_WRAPPERS_KEY = PartitionWrappersKey()
