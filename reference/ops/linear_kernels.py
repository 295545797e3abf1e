"""Triton GEMMs for decode-sized token counts, ``out = x W^T`` for at most 64 rows of x, with the prologue and
epilogues of a pre-norm decoder fused in (issue 24).

A decode step's GEMM reads a weight of N x K elements for a handful of rows, so its floor is the weight's bytes
over memory bandwidth (perf/NOTES.md, "The floor"). The kernel streams W once: one program per block of
``BLOCK_N`` output columns and per slice of K (``SPLIT_K`` slices), each loading [BLOCK_N, BLOCK_K] tiles of W
with the whole row block of x and accumulating in fp32. With ``SPLIT_K > 1`` each program writes its partial
sums to a fp32 workspace and takes a ticket from its column block's counter; the program that draws the last
ticket adds the partials in slice order (so the result does not depend on which program finished last),
applies the epilogue, writes the output and sets the counter back to 0 for the next launch. One launch,
deterministic, nothing to zero before it: a CUDA graph captures it as one node. Split-K is the usual answer to
a GEMM with too few output tiles to fill the GPU; the in-kernel reduction by the last-arriving program is
stream-K's "fix-up" (Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix
Multiplication on the GPU", PPoPP 2023).

Prologue ``norm``: the rows of x are RMS-normalised first. Each program multiplies the tiles of x it reads by
the norm's weight (``w`` for Llama, ``1 + w`` for Gemma), rounds them to x's dtype for the tensor cores, and
adds up the squares of x over its slice of K beside its partial products; the rows' rstd scales the fp32 sums
once all of K is in (in the program that finishes the column block), before the epilogue. So no program reads
more of x than it multiplies: v23 of perf/NOTES.md measured the first version, which read every row of x whole
in every program before its first weight tile, 1.4x slower than the unfused chain. The price is where the
rounding falls: ``rms_norm`` rounds ``x * rstd`` (and Llama's ``* w`` once more) to the dtype,
this kernel rounds ``x * w`` and applies rstd in fp32, one rounding fewer; the conformance test bounds both by
the same multiple of torch's own error. In float16 ``x * w`` must stay below 65504 (float16's largest), where
the normalised value would not need to; bfloat16 and float32 have float32's range.

Epilogues (``EPILOGUES``):

* ``'none'``: ``out = round(x W^T)``.
* ``'residual'``: ``out = round(round(x W^T) + residual)``: the add a pre-norm decoder makes after o_proj and
  down_proj, rounded as torch's ``y + residual``.
* ``'silu_and_mul'`` / ``'gelu_tanh_and_mul'``: W is ``[gate; up]`` stacked (2I x K) and ``out`` [M, I] is
  ``act(gate) * up`` with :mod:`reference.ops.activation`'s rounding points (gate and up rounded to the
  activation dtype first, then the activation, then the product).

Launched with programmatic dependent launch (``REFERENCE_PDL=1``, :mod:`reference.ops.dependent_launch`), each
program first asks L2 for the lines of its first weight tile (``prefetch.global.L2``: no data reaches the program,
so nothing can be read stale) and only then waits for the kernel before it: while that kernel's last programs
finish, the weight stream of this one is already on its way.

Importing this module needs Triton; it is imported where Triton is available (``reference.ops.library``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from reference.ops import dependent_launch, kernel_launch
from reference.ops.linear_configs import MAX_ROWS, check_config, row_tile, tuned_config
from reference.ops.triton_kernels import _await_inputs

EPILOGUES = ("none", "residual", "silu_and_mul", "gelu_tanh_and_mul")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # x's and the weight's: what tl.dot multiplies
_COUNTERS: dict[torch.device, torch.Tensor] = {}
_MAX_TILES = 1 << 16  # column blocks one launch may count: N / BLOCK_N, e.g. 128256 / 16 for an LM head
_LINE = 128  # bytes of an L2 cache line (NVIDIA GPUs since Pascal)


@triton.jit
def _prefetch_to_l2(ptrs):
    """Ask L2 for the 128-byte lines holding ``ptrs`` (a tensor of pointers, any shape): ``prefetch.global.L2``,
    which loads nothing into the program and does not wait. Used before ``_await_inputs`` for weights only."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs.to(tl.int64, bitcast=True)], dtype=tl.int32,
        is_pure=False, pack=1,
    )


@triton.jit
def _finish(acc, acc_up, sum_sq, K, eps, rows, cols, row_ok, col_ok, out_ptr, res_ptr, out_stride, res_stride,
            NORM: tl.constexpr, EPILOGUE: tl.constexpr):  # fmt: skip
    """Scale the fp32 sums ``acc`` [BLOCK_M, BLOCK_N] (and ``acc_up`` for a gated epilogue) by the rows' rstd
    where NORM (``sum_sq`` [BLOCK_M]: their squares over all of K), round them, apply the epilogue (module doc;
    1 residual, 2 SiLU-and-mul, 3 GELU(tanh)-and-mul) and store the real rows and columns."""
    dtype = out_ptr.dtype.element_ty
    if NORM:
        rstd = tl.rsqrt(sum_sq / K + eps)[:, None]
        acc = acc * rstd
        acc_up = acc_up * rstd
    y = acc.to(dtype)
    mask = row_ok[:, None] & col_ok[None, :]
    if EPILOGUE == 1:
        r = tl.load(res_ptr + rows[:, None] * res_stride + cols[None, :], mask=mask, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(dtype)
    if EPILOGUE >= 2:
        g = y.to(tl.float32)
        if EPILOGUE == 3:  # tanh approximation; tanh(z) = 2 * sigmoid(2z) - 1
            z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            act = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * z)))
        else:
            act = g / (1.0 + tl.exp(-g))
        y = (act.to(dtype).to(tl.float32) * acc_up.to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], y, mask=mask)


@triton.jit(do_not_specialize=["M"])
def _small_m_linear_kernel(
    x_ptr, w_ptr, out_ptr, res_ptr, g_ptr, partial_ptr, count_ptr,
    M, N, K, x_stride, w_stride, out_stride, res_stride, eps, weight_offset, k_per_split,
    NORM: tl.constexpr, EPILOGUE: tl.constexpr, GATED: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    PDL: tl.constexpr, LINES: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns; for a gated epilogue, W's gate rows
    col_ok = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * w_stride  # an LM head's N x K passes 2**31 in 70B models
    dtype = x_ptr.dtype.element_ty
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if PDL:  # the first weight tile's lines (LINES per row) head for L2 while the kernel before this one ends
        line_k = k_lo + tl.arange(0, LINES) * (BLOCK_K // LINES)
        line_ok = col_ok[:, None] & (line_k < k_hi)[None, :]
        _prefetch_to_l2(tl.where(line_ok, w_rows + line_k[None, :], w_ptr))  # out of range: W's first line
        if GATED:
            _prefetch_to_l2(tl.where(line_ok, w_rows + N * w_stride + line_k[None, :], w_ptr))
    _await_inputs(PDL)

    sum_sq = tl.zeros([BLOCK_M], tl.float32)  # NORM: each row's squares over this program's slice of K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # the up half of a gated epilogue; unused otherwise
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < k_hi
        xt = tl.load(x_ptr + rows[:, None] * x_stride + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:  # x * w rounded for the dot; rstd comes after the sums (module doc)
            xf = xt.to(tl.float32)
            sum_sq += tl.sum(xf * xf, axis=1)
            gw = tl.load(g_ptr + kk, mask=k_ok, other=0.0).to(tl.float32) + weight_offset
            xt = (xf * gw[None, :]).to(dtype)
        w_mask = col_ok[:, None] & k_ok[None, :]
        wt = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)  # [BLOCK_N, BLOCK_K]
        if IEEE:  # fp32 weights: exact fp32 products, as torch's fp32 GEMM without TF32
            acc += tl.dot(xt, tl.trans(wt), input_precision="ieee")
        else:
            acc += tl.dot(xt, tl.trans(wt))
        if GATED:  # the up rows sit N rows below the gate rows
            wu = tl.load(w_rows + N * w_stride + kk[None, :], mask=w_mask, other=0.0)
            if IEEE:
                acc_up += tl.dot(xt, tl.trans(wu), input_precision="ieee")
            else:
                acc_up += tl.dot(xt, tl.trans(wu))

    if SPLIT_K == 1:
        _finish(acc, acc_up, sum_sq, K, eps, rows, cols, row_ok, col_ok, out_ptr, res_ptr, out_stride, res_stride,
                NORM, EPILOGUE)  # fmt: skip
    else:
        # partials: [SPLIT_K, 1 + GATED, BLOCK_M, N] fp32 (the up half after the gate half), then, with NORM,
        # squares: [column blocks, SPLIT_K, BLOCK_M] fp32 (each column block keeps its own copy of the slices')
        tile = rows[:, None] * N + cols[None, :]
        real = row_ok[:, None] & col_ok[None, :]  # the padding rows' partials are 0: neither stored nor read
        mine = partial_ptr + pid_k * (1 + GATED) * BLOCK_M * N
        tl.store(mine + tile, acc, mask=real)
        if GATED:
            tl.store(mine + BLOCK_M * N + tile, acc_up, mask=real)
        squares = partial_ptr + SPLIT_K * (1 + GATED) * BLOCK_M * N + pid_n * SPLIT_K * BLOCK_M + rows
        if NORM:
            tl.store(squares + pid_k * BLOCK_M, sum_sq)
        tl.debug_barrier()  # every thread's partials stored before the ticket releases them
        ticket = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:  # the last of the column block's programs: add all partials in slice order
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            sum_sq = tl.zeros([BLOCK_M], tl.float32)
            for s in tl.static_range(SPLIT_K):
                theirs = partial_ptr + s * (1 + GATED) * BLOCK_M * N
                acc += tl.load(theirs + tile, mask=real, other=0.0, cache_modifier=".cg")
                if GATED:
                    acc_up += tl.load(theirs + BLOCK_M * N + tile, mask=real, other=0.0, cache_modifier=".cg")
                if NORM:
                    sum_sq += tl.load(squares + s * BLOCK_M, cache_modifier=".cg")
            _finish(acc, acc_up, sum_sq, K, eps, rows, cols, row_ok, col_ok, out_ptr, res_ptr, out_stride,
                    res_stride, NORM, EPILOGUE)  # fmt: skip
            tl.atomic_xchg(count_ptr + pid_n, 0)  # ready for the next launch


def _counters(device: torch.device) -> torch.Tensor:
    """The device's ticket counters, [_MAX_TILES] int32, all 0 between launches (each launch's last programs
    set theirs back). Made on first use, which must not be inside a CUDA-graph capture (the runner's warm-up
    runs every size eagerly first). One set serves every GEMM on a stream: launches may overlap under
    programmatic dependent launch, but a program touches the counters only after its wait, when every kernel
    before it has finished.

    Raises:
        RuntimeError: first used while a CUDA graph is being captured.
    """
    counters = _COUNTERS.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("small_m_linear: first launched inside a CUDA-graph capture; run it once eagerly first")
        counters = _COUNTERS[device] = torch.zeros(_MAX_TILES, dtype=torch.int32, device=device)
    return counters


@functools.cache
def _gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def default_config(m: int, n: int, k: int, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """``{BLOCK_N, BLOCK_K, SPLIT_K, num_warps}`` for an [m, k] x [n, k]^T GEMM of ``dtype`` where no tuned one
    exists: 32-wide column blocks, 256-wide K tiles for 16-bit operands in a 16-row tile (128 otherwise: the
    tiles of fp32 or of 64 rows take twice the shared memory), and as many K slices (a power of two, each at
    least 512 wide) as it takes for about two programs per multiprocessor (one on a CPU), so a GEMM with few
    output tiles still loads from every SM. On the 8B's four fused calls at B=8 this lands within 6% of the
    fastest config of the sweep (perf/NOTES.md, v25); v23's 64 x 128 tiles ran the norm-fused ones 1.6x slower."""
    block_n = 32
    block_k = 256 if dtype.itemsize == 2 and row_tile(m) == 16 else 128
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    tiles = triton.cdiv(n, block_n)
    split = 1
    while tiles * split < 2 * sms and k // (2 * split) >= 512:
        split *= 2
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "num_warps": 4}


def _describe(value: object) -> str:
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    return f"{tuple(value.shape)} {value.dtype} on {value.device}, strides {tuple(value.stride())}"


def _check_matrix(name: str, value: object, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> None:
    """One ValueError line naming ``name`` unless ``value`` is a ``shape`` tensor of ``dtype`` on ``device`` whose
    last dimension is contiguous."""
    if not (
        isinstance(value, torch.Tensor)
        and tuple(value.shape) == shape
        and value.dtype == dtype
        and value.device == device
        and (value.stride(1) == 1 or shape[1] <= 1)
    ):
        raise ValueError(
            f"{name}: expected [{shape[0]}, {shape[1]}] {dtype} on {device} with a contiguous last dimension, "
            f"got {_describe(value)}"
        )


def _check_arguments(x, weight, epilogue, residual, norm, out) -> tuple[int, int, int, bool]:
    """(M, N, K, gated) of a :func:`small_m_linear` call whose arguments are as its docstring says; else one
    ValueError line naming the first argument that is not."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue: expected one of {EPILOGUES}, got {epilogue!r}")
    if (residual is not None) != (epilogue == "residual"):
        takes = "one" if epilogue == "residual" else "none"
        given = "given" if residual is not None else "missing"
        raise ValueError(f"residual: {given}; epilogue {epilogue!r} takes {takes}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in DTYPES:
        raise ValueError(f"x: expected an [M, K] tensor of one of {[str(d) for d in DTYPES]}, got {_describe(x)}")
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"x: {m} rows; small_m_linear takes at most {MAX_ROWS}")
    if k == 0 or (x.stride(1) != 1 and k > 1):
        raise ValueError(f"x: expected K >= 1 and a contiguous last dimension, got {_describe(x)}")
    gated = epilogue.endswith("_and_mul")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight: expected an [N, {k}] tensor, got {_describe(weight)}")
    rows = weight.shape[0]
    if gated and rows % 2:
        raise ValueError(f"weight: a gated epilogue takes [2I, K] (gate rows, then up rows), got {_describe(weight)}")
    _check_matrix("weight", weight, (rows, k), x.dtype, x.device)
    n = rows // 2 if gated else rows
    if residual is not None:
        _check_matrix("residual", residual, (m, n), x.dtype, x.device)
    if out is not None:
        _check_matrix("out", out, (m, n), x.dtype, x.device)
    if norm is not None:
        if not (isinstance(norm, tuple) and len(norm) == 3 and all(isinstance(v, (int, float)) for v in norm[1:])):
            got = [_describe(v) if i == 0 else repr(v) for i, v in enumerate(norm)] if isinstance(norm, tuple) else norm
            raise ValueError(f"norm: expected (norm_weight, eps, weight_offset), two floats last, got {got!s:.200}")
        g = norm[0]
        if not (isinstance(g, torch.Tensor) and tuple(g.shape) == (k,) and g.is_floating_point()
                and g.device == x.device and g.stride(0) == 1):  # fmt: skip
            raise ValueError(f"norm: expected a contiguous [{k}] float weight on {x.device}, got {_describe(g)}")
    return m, n, k, gated


def small_m_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    epilogue: str = "none",
    residual: torch.Tensor | None = None,
    norm: tuple[torch.Tensor, float, float] | None = None,
    config: dict[str, int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x W^T`` for at most ``MAX_ROWS`` rows in one launch, with the fused prologue and epilogue (module doc).

    Args:
        x: [M, K], M <= 64, last dimension contiguous (rows may be strided).
        weight: [N, K] contiguous, x's dtype; for a gated epilogue [2I, K] with the gate rows first.
        epilogue: one of ``EPILOGUES``.
        residual: [M, N] (last dimension contiguous), for ``epilogue='residual'`` only.
        norm: ``(norm_weight [K], eps, weight_offset)``: RMS-normalise x first (0: Llama's style, 1: Gemma's).
        config: ``{BLOCK_N, BLOCK_K, SPLIT_K, num_warps}`` as :func:`reference.ops.linear_configs.check_config`
            takes it; default the one tuned for this GPU, shape and row tile
            (:func:`reference.ops.linear_configs.tuned_config`), else :func:`default_config`.
        out: where to write (e.g. rows of a larger static buffer): [M, N], last dimension contiguous, x's
            dtype; default a new tensor.

    Returns:
        out: [M, N] ([M, I] for a gated epilogue), x's dtype; only its M rows are written.

    Raises:
        ValueError: one line naming the argument: an unknown epilogue, a residual missing or given where the
            epilogue takes none, x not [M, K] in one of ``DTYPES`` with 1 <= K and M <= ``MAX_ROWS``, a tensor
            whose shape, dtype, device or last-dimension stride does not fit x (an odd row count for a gated
            weight), a norm that is not ``(weight [K], eps, offset)``, a bad config, or more column blocks
            than the split-K counters count.
    """
    m, n, k, gated = _check_arguments(x, weight, epilogue, residual, norm, out)
    if config is not None:
        cfg = check_config(config, "config")
    else:
        cfg = tuned_config(_gpu_name(x.device), n, k, m, gated) or default_config(m, n, k, x.device, x.dtype)
    block_m = row_tile(m)
    split = cfg["SPLIT_K"]
    k_per_split = triton.cdiv(triton.cdiv(k, split), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    tiles = triton.cdiv(n, cfg["BLOCK_N"])
    if split > 1 and tiles > _MAX_TILES:
        block_n = cfg["BLOCK_N"]
        raise ValueError(f"config: {tiles} column blocks of BLOCK_N={block_n}; split-K counts {_MAX_TILES} at most")
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    # the split-K workspace (kernel comments): partial sums, then the squares of x for the norm
    squares = tiles * split * block_m if norm is not None else 0
    size = split * (1 + gated) * block_m * n + squares if split > 1 else 1
    partial = torch.empty(size, dtype=torch.float32, device=x.device)
    g, eps, offset = norm if norm is not None else (x, 0.0, 0.0)  # unread without NORM
    res = residual if residual is not None else out  # unread without the residual epilogue
    pdl = dependent_launch.enabled(x.device)
    lines = max(1, cfg["BLOCK_K"] * x.element_size() // _LINE)  # a power of two: BLOCK_K and itemsize are
    if m:
        kernel_launch.launcher(_small_m_linear_kernel, (tiles, split))(
            x, weight, out, res, g, partial, _counters(x.device),
            m, n, k, x.stride(0), weight.stride(0), out.stride(0), res.stride(0), eps, offset, k_per_split,
            NORM=norm is not None, EPILOGUE=EPILOGUES.index(epilogue),
            GATED=gated, SPLIT_K=split,
            BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], IEEE=x.dtype == torch.float32,
            PDL=pdl, LINES=lines, num_warps=cfg["num_warps"], launch_pdl=pdl,
        )  # fmt: skip
    return out
