"""The smallest model that exercises splitting: arithmetic around two calls of a stand-in attention op.

``SillyModel`` is for structure tests. Its graph has two calls of ``reference::silly_attention``, so
splitting at that op gives 5 pieces: 3 compiled and capturable, 2 that run eagerly. Its output has a
closed form (``expected_output``), so the tests need no other backend to know the right answer.
"""

from __future__ import annotations

import torch
from torch import nn

from reference.ops.library import define_op

SILLY_SPLITTING_OPS = ("reference::silly_attention",)


def silly_attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """Stand-in attention: ``out = q + k + v`` (elementwise, all [T, H]). Mutates ``out``."""
    torch.add(q, k, out=out)
    out += v


# Not tagged cudagraph_unsafe: it is pure tensor code, correct inside a graph; tests name it in splitting_ops.
silly_attention = define_op(
    "silly_attention", silly_attention_impl, mutates_args=("out",), fake=lambda q, k, v, out: None
)


class SillyModel(nn.Module):
    """``forward(x [T, H]) -> [T, H]``; see :func:`expected_output`. No parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 2 + 1
        out = torch.empty_like(x)
        silly_attention(x, x, x, out)  # 3x
        x = out - 1
        out = torch.empty_like(x)
        silly_attention(x, x, x, out)  # 3x
        return out + 2


def expected_output(x: torch.Tensor) -> torch.Tensor:
    """Closed form of ``SillyModel()(x)``."""
    return 3 * (3 * (x * 2 + 1) - 1) + 2
