"""A decoder layer's GEMMs with their neighbours fused in: the RMSNorm in front, the gated activation or the
residual add behind (issue 24). Three custom ops, each its own switch in ``custom_ops``:

* ``rms_norm_linear``: RMSNorm, then the GEMM that reads it (qkv_proj, gate_up_proj).
* ``linear_activation``: gate_up_proj, then the gated activation (SiLU or GELU(tanh)-and-mul).
* ``linear_residual_add``: o_proj or down_proj, then the residual add.

All three are opt-in (``'+name'``; ``'all'`` leaves them off): with tuned configs they make the decode step
of Llama-3.1-8B and Qwen3-8B faster and Gemma 3 4B's slower (perf/NOTES.md v33). Each is one
``reference::fused_linear`` op (:data:`fused_linear_op`) whose reference is the torch code it replaces; on
CUDA with Triton, a step of at most ``KERNEL_MAX_ROWS`` (16) tokens runs the small-M kernel of
:mod:`reference.ops.linear_kernels` (norm and activation in one launch where both switches are on at
gate_up_proj), a larger one today's ops (the norm and activation kernels around cuBLAS). The kernel takes up
to 64 rows, but at 64 the 8B's fused layer chain measured slower than the unfused one (H200 untuned, H100
tuned), at 1 and 8 rows faster (perf/NOTES.md v26, v33); 9-63 rows were not timed. Where its switch is off
a place runs the unfused ops, so each fusion can be measured alone.

The residual stream. Layers carry it as ``(hidden, residual)`` with the add deferred into the next norm (the
pre-norm decoder's usual trick, :class:`~reference.models.llama.LlamaDecoderLayer`): the stream is
``hidden + residual``, or ``hidden`` alone where ``residual`` is None. ``linear_residual_add`` makes the add
where the GEMM ends, so after it the stream is ``hidden`` alone; ``rms_norm_linear`` takes either form (with
a deferred add it makes the add first: its kernel reads the stream whole). Same additions in the same order
as the unfused layer, so on a CPU (where every op runs its reference) both give the same bits.
"""

# No ``from __future__ import annotations`` here: torch.library infers the op's schema from the reference's
# annotations, which then are objects; as strings they must resolve in the function's module, and the
# mutation tool's wrappers (./run mutate ops.fused) live in another.
import torch
import torch.nn.functional as F

from reference.ops.activation import (
    GatedActivation,
    gelu_tanh_and_mul_op,
    gelu_tanh_and_mul_reference,
    silu_and_mul_op,
    silu_and_mul_reference,
)
from reference.ops.custom_op import CustomOp
from reference.ops.layernorm import RMSNorm, rms_norm_op, rms_norm_reference
from reference.ops.library import HAS_TRITON, define_op

if HAS_TRITON:
    from reference.ops import linear_kernels

KERNEL_MAX_ROWS = 16  # the largest step the fused ops give the small-M kernel (module doc); at most MAX_ROWS
_ACTIVATIONS = {"silu_and_mul": silu_and_mul_reference, "gelu_tanh_and_mul": gelu_tanh_and_mul_reference}
_ACTIVATION_OPS = {"silu_and_mul": silu_and_mul_op, "gelu_tanh_and_mul": gelu_tanh_and_mul_op}  # Triton on CUDA
EPILOGUES = ("none", "residual", *_ACTIVATIONS)


def fused_linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float,
    weight_offset: float,
    epilogue: str,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """``epilogue(rms_norm(x) W^T)`` as the unfused layers compute it.

    Args:
        x: [T, K]. weight: [N, K] ([2I, K], gate rows first, for a gated epilogue).
        norm_weight, eps, weight_offset: the RMSNorm in front (:func:`~reference.ops.layernorm.rms_norm_reference`),
            or None for none.
        epilogue: ``'none'``, ``'residual'`` (``+ residual`` [T, N]), ``'silu_and_mul'`` or ``'gelu_tanh_and_mul'``.

    Returns:
        [T, N] ([T, I] for a gated epilogue), x's dtype.
    """
    return _composed(rms_norm_reference, _ACTIVATIONS, x, weight, norm_weight, eps, weight_offset, epilogue, residual)


def _composed(norm, activations, x, weight, norm_weight, eps, weight_offset, epilogue, residual):
    """The norm, ``F.linear`` and the epilogue one after another, with ``norm`` and ``activations`` (name ->
    function) the functions or ops that make them."""
    if epilogue not in EPILOGUES:  # as the small-M kernel refuses it: no plain GEMM for a misspelt epilogue
        raise ValueError(f"epilogue: expected one of {EPILOGUES}, got {epilogue!r}")
    if norm_weight is not None:
        x = norm(x, norm_weight, eps, weight_offset)
    y = F.linear(x, weight)
    if epilogue == "residual":
        return y + residual
    return activations[epilogue](y) if epilogue in activations else y


def _fused_linear_cuda(x, weight, norm_weight, eps, weight_offset, epilogue, residual):
    if x.shape[0] > KERNEL_MAX_ROWS:  # a larger batch or a prefill: today's kernels around cuBLAS (module doc)
        return _composed(rms_norm_op, _ACTIVATION_OPS, x, weight, norm_weight, eps, weight_offset, epilogue, residual)
    norm = None if norm_weight is None else (norm_weight, eps, weight_offset)
    return linear_kernels.small_m_linear(x, weight, epilogue=epilogue, residual=residual, norm=norm)


def _fused_linear_fake(x, weight, norm_weight, eps, weight_offset, epilogue, residual):
    n = weight.shape[0] // 2 if epilogue in _ACTIVATIONS else weight.shape[0]
    return x.new_empty((x.shape[0], n))


fused_linear_op = define_op("fused_linear", fused_linear_reference, fake=_fused_linear_fake, cuda=_fused_linear_cuda)


def _stream(hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """The residual stream of a deferred pair (module doc)."""
    return hidden if residual is None else hidden + residual


def _fusable(linear: torch.nn.Linear) -> bool:
    """Whether the kernel can stand for ``linear``: no bias, and no all-reduce behind it (one rank)."""
    tp = getattr(linear, "tp", None)
    return linear.bias is None and (tp is None or tp.size == 1)


class RMSNormLinear(CustomOp):
    """RMSNorm, then a linear layer (and its gated activation, where the caller fuses that too).

    ``forward(hidden [T, H], residual [T, H] | None, norm, linear, activation=None) -> (y, stream)``: ``y =
    linear(norm(stream))`` (``activation(...)`` of it when given: [T, I]) and the stream [T, H] the norm read,
    the residual that the sublayer's output joins. ``norm`` and ``linear`` are the layer's own modules (their
    weights stay where the checkpoint names them).
    """

    name = "rms_norm_linear"
    opt_in = True  # slower than the unfused ops until the kernel is tuned (module doc)

    def forward_native(self, hidden, residual, norm: RMSNorm, linear, activation: GatedActivation | None = None):
        x, stream = (norm(hidden), hidden) if residual is None else norm(hidden, residual)
        y = linear(x)
        return (y if activation is None else activation(y)), stream

    def forward_custom(self, hidden, residual, norm: RMSNorm, linear, activation: GatedActivation | None = None):
        if not _fusable(linear):
            return self.forward_native(hidden, residual, norm, linear, activation)
        stream = _stream(hidden, residual)
        epilogue = "none" if activation is None else activation.name
        y = fused_linear_op(stream, linear.weight, norm.weight, norm.eps, norm.weight_offset, epilogue, None)
        return y, stream


class LinearActivation(CustomOp):
    """A gate/up linear layer, then its gated activation. ``forward(x [T, H], linear, activation) -> [T, I]``."""

    name = "linear_activation"
    opt_in = True

    def forward_native(self, x, linear, activation: GatedActivation):
        return activation(linear(x))

    def forward_custom(self, x, linear, activation: GatedActivation):
        if not _fusable(linear):
            return self.forward_native(x, linear, activation)
        return fused_linear_op(x, linear.weight, None, 0.0, 0.0, activation.name, None)


class LinearResidualAdd(CustomOp):
    """A sublayer's output projection, then the residual add.

    ``forward(x [T, in], residual [T, H], linear) -> (hidden, residual)``, the stream's deferred pair (module
    doc): ``(linear(x), residual)`` unfused, ``(linear(x) + residual, None)`` fused.
    """

    name = "linear_residual_add"
    opt_in = True

    def forward_native(self, x, residual, linear):
        return linear(x), residual

    def forward_custom(self, x, residual, linear):
        if not _fusable(linear):
            return linear(x) + residual, None
        return fused_linear_op(x, linear.weight, None, 0.0, 0.0, "residual", residual), None


def norm_gate_up(
    norm_linear: RMSNormLinear,
    linear_activation: LinearActivation,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm: RMSNorm,
    mlp: torch.nn.Module,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP's norm, ``mlp.gate_up_proj`` and ``mlp.act_fn`` with whichever fusions are on (one kernel where
    both are): the gated activations [T, I] and the stream [T, H] the norm read."""
    if norm_linear.use_custom:
        fused = mlp.act_fn if linear_activation.use_custom else None
        y, stream = norm_linear(hidden, residual, norm, mlp.gate_up_proj, fused)
        return (y if fused is not None else mlp.act_fn(y)), stream
    x, stream = (norm(hidden), hidden) if residual is None else norm(hidden, residual)
    return linear_activation(x, mlp.gate_up_proj, mlp.act_fn), stream
