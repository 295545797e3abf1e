"""Faults of the layers' arithmetic: the attention op and its masks, the custom ops, the models.

Custom ops are patched where the layers look them up (``reference.ops.layernorm.rms_norm_op``, ...), and
their reference functions where both the native path and the op's own implementation call them, so that
a fault reaches ``forward_native`` and ``forward_custom`` alike unless it is meant to split them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import tempfile
from pathlib import Path
from unittest import mock

import torch

from conformance.faults.fault import Fault, patches
from reference.models.gemma3 import Gemma3ForCausalLM
from reference.models.llama import LlamaForCausalLM
from reference.ops import attention, attention_metadata, layernorm, rotary
from reference.ops.attention_metadata import AttentionMetadata
from reference.ops.library import HAS_TRITON, TRITON_DTYPES

_real_attention_torch = attention.attention_torch
_real_attention_impl = attention.attention_impl
_real_causal_mask = attention._causal_mask
_real_decode_mask = AttentionMetadata.decode_mask
_real_from_device = AttentionMetadata.from_device.__func__
_real_attention_init = attention.Attention.__init__
_real_rms_norm = layernorm.rms_norm_reference
_real_rms_norm_op = layernorm.rms_norm_op
_real_fused_add_rms_norm = layernorm.fused_add_rms_norm_reference
_real_fused_add_rms_norm_op = layernorm.fused_add_rms_norm_op


# ---------------------------------------------------------------------- attention
def _wider(window):
    return None if window is None else window + 1


class _KernelsWithAWiderPrefillWindow:
    """The attention module's ``triton_kernels`` with ``prefill_attention`` launched one key wider in its
    sliding window; every other kernel is the real one. Triton is imported only when a kernel is called
    (it exists only on the GPU machines; on a CPU the fault plants and nothing calls it)."""

    def __getattr__(self, name):
        from reference.ops import triton_kernels

        return getattr(triton_kernels, name)

    def prefill_attention(self, q, kv_cache, seqs, max_query_len, out, scale, sliding_window, softcap):
        from reference.ops import triton_kernels

        triton_kernels.prefill_attention(q, kv_cache, seqs, max_query_len, out, scale, _wider(sliding_window), softcap)


# The decode kernel's cache write (the new key and value, then the barrier), as the kernel's source has it
_DECODE_WRITE_FIRST_LINE = "    new_k = tl.load("
_DECODE_WRITE_LAST_LINE = "    tl.debug_barrier()"
_DECODE_AFTER_THE_LOOP = "    out = tl.where(l_i"


@functools.cache
def _decode_kernel_writing_after_it_reads():
    """``_decode_attention_kernel`` with its cache write moved after its attention loop: the step's own key
    and value are read from the cache before they are written (what a write on another stream, or a
    missing barrier that the hardware happens to expose, would do). Built from the real kernel's source,
    so it follows every other change of the kernel; Triton needs the source in a file to compile it."""
    from reference.ops import triton_kernels

    src = inspect.getsource(triton_kernels._decode_attention_kernel.fn)
    first = src.index(_DECODE_WRITE_FIRST_LINE)
    last = src.index("\n", src.index(_DECODE_WRITE_LAST_LINE)) + 1
    write, src = src[first:last], src[:first] + src[last:]
    assert src.count(_DECODE_AFTER_THE_LOOP) == 1, "the decode kernel changed: update this fault's anchors"
    src = src.replace(_DECODE_AFTER_THE_LOOP, write + _DECODE_AFTER_THE_LOOP)
    header = (
        "import triton\nimport triton.language as tl\n"
        "from reference.ops.triton_kernels import _await_inputs, _online_softmax_step, _scores\n"
    )
    path = Path(tempfile.mkdtemp(prefix="fault-decode-kernel-")) / "decode_kernel_writing_after_it_reads.py"
    path.write_text(header + src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._decode_attention_kernel


@contextlib.contextmanager
def _decode_reads_before_its_cache_write():
    if not HAS_TRITON:  # no kernel runs on a machine without Triton: nothing to plant
        yield
        return
    from reference.ops import triton_kernels

    with mock.patch.object(triton_kernels, "_decode_attention_kernel", _decode_kernel_writing_after_it_reads()):
        yield


@contextlib.contextmanager
def _prefill_kernel_specialised_on_its_step():
    """Prefill attention compiled with Triton's default specialisation of every argument (its sequence count
    and metadata pointer included), as before d52869a."""
    if not HAS_TRITON:  # no kernel runs on a machine without Triton: nothing to plant
        yield
        return
    import triton

    from reference.ops import triton_kernels

    respecialised = triton.jit(triton_kernels._prefill_attention_kernel.fn)
    with mock.patch.object(triton_kernels, "_prefill_attention_kernel", respecialised):
        yield


def _prefill_before_the_cache_write(layer, md, q, k, v, out):
    """On CUDA a prefill's attention runs before its keys and values reach the cache, so each new token
    attends to what the cache held before (stale keys) at its own and its neighbours' positions."""
    if md.is_decode or not q.is_cuda or q.dtype not in TRITON_DTYPES:
        return _real_attention_impl(layer, md, q, k, v, out)
    from reference.ops import triton_kernels

    triton_kernels.prefill_attention(
        q,
        layer.kv_cache,
        md.varlen_tensor(q.device),
        max(md.query_lens),
        out,
        layer.scale,
        layer.sliding_window,
        layer.logits_soft_cap,
    )
    attention._write_cache(layer, md, k, v)


def _causal_mask_one_too_wide(query_len, seq_len, sliding_window, device):
    return _real_causal_mask(query_len, seq_len, _wider(sliding_window), device)


def _decode_mask_one_too_wide(self, sliding_window, device):
    return _real_decode_mask(self, _wider(sliding_window), device)


def _decode_mask_one_too_wide_for_equal_lengths(self, sliding_window, device):
    """The fast path for a batch of equal lengths takes the window one key wider (and so skips the mask
    while the sequences hold window + 1 keys)."""
    equal = len(set(self.seq_lens)) == 1
    return _real_decode_mask(self, _wider(sliding_window) if equal else sliding_window, device)


def _padding_written_to_slot_0(layer, md, q, k, v, out):
    """Keys and values of the padding rows are written to slot 0 (row 0, position 0): a slot mapping padded
    with 0 where it should skip padding."""
    n, padded = md.num_actual_tokens, k.shape[0]
    if padded > n:
        zeros = torch.zeros(padded - n, dtype=torch.int64, device=k.device)
        for cache, new in zip(layer.kv_cache.unbind(0), (k, v)):
            cache.view(-1, layer.num_kv_heads, layer.head_size).index_copy_(
                0, zeros, new[n:].reshape(padded - n, layer.num_kv_heads, layer.head_size)
            )
    _real_attention_torch(layer, md, q, k, v, out)


def _kv_heads_interleaved(layer, md, q, k, v, out):
    """Query head h attends with kv head h % Hkv (interleaved groups), not h // (Hq / Hkv) as transformers'
    repeat_kv does."""
    heads, kv_heads, d = layer.num_heads, layer.num_kv_heads, layer.head_size
    group = heads // kv_heads
    order = [g * kv_heads + j for j in range(kv_heads) for g in range(group)]  # slot j * group + g <- head
    grouped = q.view(q.shape[0], heads, d)[:, order].reshape(q.shape)
    result = torch.empty_like(out)
    _real_attention_torch(layer, md, grouped, k, v, result)
    out.view(out.shape[0], heads, d)[:, order] = result.view(out.shape[0], heads, d)


def _rows_assumed_consecutive(cls, *args):
    """``rows_index`` is always the slice from the first row, as if the rows were consecutive."""
    md = _real_from_device(cls, *args)
    md.rows_index = slice(md.rows[0], md.rows[0] + len(md.rows))
    return md


def _scale_from_head_size(self, num_heads, num_kv_heads, head_size, scale, layer_name, **kwargs):
    _real_attention_init(self, num_heads, num_kv_heads, head_size, head_size**-0.5, layer_name, **kwargs)


# ---------------------------------------------------------------------- custom ops
def _rms_norm_op_without_eps(x, weight, eps, weight_offset):
    return _real_rms_norm_op(x, weight, 0.0, weight_offset)


def _fused_add_rms_norm_op_without_eps(x, residual, weight, eps, weight_offset):
    return _real_fused_add_rms_norm_op(x, residual, weight, 0.0, weight_offset)


def _residual_not_written_back(x, residual, weight, eps, weight_offset):
    """Normalises x + residual but hands back the old residual: the in-place update of the fused kernel lost."""
    return _real_fused_add_rms_norm(x, residual, weight, eps, weight_offset)[0], residual


def _residual_op_not_written_back(x, residual, weight, eps, weight_offset):
    return _real_fused_add_rms_norm_op(x, residual, weight, eps, weight_offset)[0], residual


def _gemma_scale_in_activation_dtype(x, weight, eps, weight_offset):
    """``(1 + w) * norm(x)`` computed after the cast to x's dtype (Llama's order), so bf16 rounds two or three
    times instead of once."""
    if weight_offset == 0.0:
        return _real_rms_norm(x, weight, eps, weight_offset)
    return _real_rms_norm(x, weight + weight_offset, eps, 0.0)


def _rotate_adjacent_pairs(positions, x, cos_sin_cache, head_size):
    """GPT-J-style RoPE, rotating pairs (2i, 2i + 1), on checkpoints trained with neox pairs (i, i + D/2)."""
    cos, sin = cos_sin_cache[positions].to(x.dtype).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x = x.unflatten(-1, (-1, head_size))
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2).flatten(-2)


def _every_single_token_sequence(query_lens: list[int]) -> int:
    """Counts every one-token sequence of the step, not only the leading run of them."""
    return sum(q == 1 for q in query_lens)


FAULTS = [
    Fault(
        id="prefill-kernel-window-one-too-wide",
        kind="attention",
        description="the Triton prefill attention lets a sliding-window query see window + 1 keys (the torch "
        "path and the decode kernel are right)",
        plant=patches(mock.patch.object(attention, "triton_kernels", _KernelsWithAWiderPrefillWindow(), create=True)),
        tests="test_prefill_attention_kernel_matches_torch_path",
        device="cuda",
    ),
    Fault(
        id="decode-kernel-reads-before-its-cache-write",
        kind="attention",
        description="the Triton decode attention writes the step's key and value to the cache after its attention "
        "loop instead of before it, so each sequence attends to the stale entry at its own position",
        plant=_decode_reads_before_its_cache_write,
        tests="test_decode_attention_kernel_matches_torch_path",
        device="cuda",
    ),
    Fault(
        id="prefill-kernel-specialised-on-its-step",
        kind="ops",
        description="prefill attention is compiled again for each class of its sequence count (1, a multiple of "
        "16, any other) and for metadata at an unaligned address, so a cold start compiles it twice (0.4-0.6 s "
        "each on an H100); its outputs are right",
        plant=_prefill_kernel_specialised_on_its_step,
        tests="test_prefill_attention_compiles_once_for_every_sequence_count_and_metadata_offset",
        device="cuda",
    ),
    Fault(
        id="mixed-step-decode-count-takes-every-one-token-sequence",
        kind="attention",
        description="a mixed step sends as many of its first sequences to the decode kernel as it has one-token "
        "sequences anywhere, so a prompt chunk first in the step is attended as if it were one decode token",
        plant=patches(
            mock.patch.object(attention_metadata, "count_leading_single_tokens", _every_single_token_sequence)
        ),
        tests="test_prefill_attention_kernel_matches_torch_path",
        device="cuda",
    ),
    Fault(
        id="prefill-attention-before-the-cache-write",
        kind="attention",
        description="on CUDA a prefill step's attention runs before the step's keys and values are written to the "
        "cache, so its tokens attend to stale cache entries",
        plant=patches(mock.patch.object(attention, "attention_impl", _prefill_before_the_cache_write)),
        tests="test_prefill_attention_kernel_matches_torch_path",
        device="cuda",
    ),
    Fault(
        id="sliding-window-one-too-wide",
        kind="attention",
        description="a sliding-window query sees window + 1 keys, in prefill and in decode",
        plant=patches(
            mock.patch.object(attention, "_causal_mask", _causal_mask_one_too_wide),
            mock.patch.object(AttentionMetadata, "decode_mask", _decode_mask_one_too_wide),
        ),
        tests="test_gemma3_oracle and test_logits_match and eager-cpu",
        bug="https://github.com/huggingface/transformers/issues/39408",
    ),
    Fault(
        id="sliding-window-one-too-wide-equal-lengths",
        kind="attention",
        description="when every sequence of a decode step has the same length, the sliding window is one key too "
        "wide (the mask is skipped while the sequences hold window + 1 keys)",
        plant=patches(mock.patch.object(AttentionMetadata, "decode_mask", _decode_mask_one_too_wide_for_equal_lengths)),
        tests="test_prefill_and_decode_attend_to_exactly_the_keys_the_mask_allows",
    ),
    Fault(
        id="padding-written-to-slot-0",
        kind="attention",
        description="the padding rows of a padded step write their keys and values into KV-cache slot 0, the first "
        "position of the sequence in row 0",
        plant=patches(mock.patch.object(attention, "attention_torch", _padding_written_to_slot_0)),
        tests="test_padding_rows_do_not_change_the_real_rows",
    ),
    Fault(
        id="kv-heads-interleaved",
        kind="attention",
        description="grouped-query attention pairs query head h with kv head h % num_kv_heads instead of "
        "h // (num_heads / num_kv_heads)",
        plant=patches(mock.patch.object(attention, "attention_torch", _kv_heads_interleaved)),
        tests="test_llama_oracle and test_logits_match and llama-tiny-eager-cpu",
    ),
    Fault(
        id="rows-assumed-consecutive",
        kind="attention",
        description="decode reads the KV cache through a slice from the first sequence's row, as if the batch's "
        "rows were consecutive, so sequences in rows like [2, 0] read other sequences' keys",
        plant=patches(mock.patch.object(AttentionMetadata, "from_device", classmethod(_rows_assumed_consecutive))),
        tests="test_decoding_from_the_kv_cache_matches_recomputing_the_whole_sequence",
    ),
    Fault(
        id="attention-scale-from-head-size",
        kind="model",
        description="attention scores are scaled by head_size ** -0.5 whatever the model asks: Gemma 3's "
        "query_pre_attn_scalar is ignored",
        plant=patches(mock.patch.object(attention.Attention, "__init__", _scale_from_head_size)),
        tests="test_gemma3_oracle and test_logits_match and eager-cpu",
    ),
    Fault(
        id="gemma-final-softcap-dropped",
        kind="model",
        description="Gemma's final logit soft-cap (cap * tanh(logits / cap)) is not applied",
        plant=patches(mock.patch.object(Gemma3ForCausalLM, "compute_logits", LlamaForCausalLM.compute_logits)),
        tests="test_gemma3_oracle and test_logits_match and eager-cpu",
    ),
    Fault(
        id="rms-norm-op-drops-eps",
        kind="ops",
        description="the rms_norm custom ops normalise without eps, so forward_custom differs from forward_native "
        "(and from transformers) for rows of small norm",
        plant=patches(
            mock.patch.object(layernorm, "rms_norm_op", _rms_norm_op_without_eps),
            mock.patch.object(layernorm, "fused_add_rms_norm_op", _fused_add_rms_norm_op_without_eps),
        ),
        tests="test_rms_norm_custom_equals_native_and_transformers",
    ),
    Fault(
        id="fused-add-residual-not-written-back",
        kind="ops",
        description="fused add + RMSNorm normalises x + residual but returns the old residual, so the residual "
        "stream never takes in the sublayers' outputs",
        plant=patches(
            mock.patch.object(layernorm, "fused_add_rms_norm_reference", _residual_not_written_back),
            mock.patch.object(layernorm, "fused_add_rms_norm_op", _residual_op_not_written_back),
        ),
        tests="test_rms_norm_custom_equals_native_and_transformers and fused_residual",
    ),
    Fault(
        id="gemma-norm-scaled-in-bf16",
        kind="ops",
        description="Gemma's RMSNorm multiplies by (1 + w) after casting to the activation dtype instead of in "
        "fp32, so bf16 outputs are rounded two or three times",
        plant=patches(
            mock.patch.object(layernorm, "rms_norm_reference", _gemma_scale_in_activation_dtype),
            mock.patch.object(layernorm, "rms_norm_op", _gemma_scale_in_activation_dtype),
        ),
        tests="test_gemma_norm_in_bf16_is_the_fp32_result_rounded_once",
        bug="https://github.com/vllm-project/vllm/pull/29810",
    ),
    Fault(
        id="rope-adjacent-pairs",
        kind="ops",
        description="RoPE rotates adjacent pairs (GPT-J style) on models whose checkpoints rotate the two halves of "
        "each head (neox style)",
        plant=patches(mock.patch.object(rotary, "rotate_reference", _rotate_adjacent_pairs)),
        tests="test_rotary_custom_equals_native_and_transformers",
    ),
]
