"""Faults of the GEMM fusions (reference.ops.fused_linear) and of the small-M kernel behind them on CUDA.

The kernel faults are the real kernel's source with one line changed, compiled from a file of their own
(Triton needs the source in a file), so they follow every other change of the kernel; an anchor that no
longer matches fails loudly instead of planting nothing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import tempfile
from pathlib import Path
from unittest import mock

from conformance.faults.fault import Fault, patches
from reference.ops import fused_linear
from reference.ops.library import HAS_TRITON

_real_fused_linear_op = fused_linear.fused_linear_op


@functools.cache
def _kernel_module_with(edits: tuple[tuple[str, str], ...]):
    """reference.ops.linear_kernels compiled from its source with each ``(anchor, replacement)`` of ``edits`` made
    in turn (each anchor found exactly once)."""
    from reference.ops import linear_kernels

    src = inspect.getsource(linear_kernels)
    for anchor, replacement in edits:
        assert src.count(anchor) == 1, f"the small-M kernel changed: update this fault's anchor {anchor!r}"
        src = src.replace(anchor, replacement)
    path = Path(tempfile.mkdtemp(prefix="fault-linear-kernel-")) / "faulty_linear_kernels.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kernel_changed(edits: tuple[tuple[str, str], ...]):
    @contextlib.contextmanager
    def plant():
        if not HAS_TRITON:  # no kernel runs on a machine without Triton: nothing to plant
            yield
            return
        from reference.ops import linear_kernels

        faulty = _kernel_module_with(edits)._small_m_linear_kernel
        with mock.patch.object(linear_kernels, "_small_m_linear_kernel", faulty):
            yield

    return plant


def _residual_added_twice(x, weight, norm_weight, eps, weight_offset, epilogue, residual):
    """The residual epilogue adds the residual to the GEMM's output twice."""
    out = _real_fused_linear_op(x, weight, norm_weight, eps, weight_offset, epilogue, residual)
    return out + residual if epilogue == "residual" else out


# the epilogue's store mask, and the same mask with every row of the tile in it
_STORE_EVERY_ROW = ("mask = row_ok[:, None] & col_ok[None, :]\n", "mask = (rows >= 0)[:, None] & col_ok[None, :]\n")

def _kernel_fault(fault_id: str, description: str, *edits: tuple[str, str], tests: str) -> Fault:
    """A fault of the small-M kernel's source (module doc), its ``(anchor, replacement)`` edits made in turn:
    only CUDA (or Triton's interpreter) runs it."""
    return Fault(fault_id, "ops", description, _kernel_changed(edits), tests, device="cuda")


FAULTS = [
    _kernel_fault(
        "split-k-partial-sum-dropped",
        "the small-M GEMM's last program adds all K slices' partial sums but the last, so a split-K GEMM misses "
        "the products of its last slice of K",
        ("for s in tl.static_range(SPLIT_K):", "for s in tl.static_range(SPLIT_K - 1):"),
        tests="test_every_split_of_k_adds_up_to_the_whole_product",
    ),
    _kernel_fault(
        "fused-norm-weight-applied-twice",
        "the small-M GEMM's RMSNorm prologue multiplies the activations by the norm's weight twice",
        ("xt = (xf * gw[None, :]).to(dtype)", "xt = (xf * gw[None, :] * gw[None, :]).to(dtype)"),
        tests="test_the_fused_gemm_matches_the_torch_code_it_replaces and llama",
    ),
    _kernel_fault(
        "fused-epilogue-writes-the-padded-rows",
        "the small-M GEMM's epilogue stores all BLOCK_M rows of its tile, past the M rows of the output, over "
        "whatever the memory after them holds",
        _STORE_EVERY_ROW,
        tests="test_a_strided_x_and_an_output_view_leave_every_other_row_alone",
    ),
    _kernel_fault(
        "dependent-launch-waits-after-its-loads",
        "the small-M GEMM, launched with programmatic dependent launch, waits for the kernel before it only after "
        "its K loop, so it may read x while that kernel still writes it (its pipelined cp.async loads come first)",
        ("    _await_inputs(PDL)\n\n    sum_sq = ", "\n    sum_sq = "),
        ("    if SPLIT_K == 1:\n", "    _await_inputs(PDL)\n    if SPLIT_K == 1:\n"),
        tests="test_a_kernel_launched_with_pdl_waits_before_it_touches_global_memory",
    ),
    Fault(
        id="fused-residual-added-twice",
        kind="ops",
        description="with linear_residual_add on, o_proj's and down_proj's fused op adds the residual to their "
        "output twice",
        plant=patches(mock.patch.object(fused_linear, "fused_linear_op", _residual_added_twice)),
        tests="test_fused_linear",
    ),
]
