"""Compile the custom ops' Triton kernels on threads while Dynamo traces the model (issue 22's cold start).

Triton compiles a kernel at its first launch. Without this module a cold start launched each custom-op kernel
for the first time after the trace, in the first forward of the split graph, and compiled them one after another
on the main thread: on an H100 (perf/NOTES.md v35) 1.1 s of the 8B model's compile phase and 0.4 s of its capture
phase, against about 3.5 s of Dynamo's trace, which launches nothing (it runs on fake tensors).

:class:`KernelWarmUp` runs one small eager step of the model on a thread of its own (a decode beside a two-token
prefill, so both attention kernels compile, and every norm, rotary and activation kernel of every layer kind
with them), under its own forward context (contexts are per thread), twice:

1. with every launch turned into a compile (:func:`reference.ops.kernel_launch.compile_only`): each kernel
   specialisation the step would launch compiles on a pool of ``COMPILE_WORKERS`` threads, all at once, and is
   readied there for its first launch (its launcher built, its binary loaded); no Triton kernel is launched
   (torch's own kernels, the embedding's and the GEMMs', run on whatever the outputs held). One after
   another on the warm-up's thread, compiles and readying took 2.9-3.5 s beside a stamped 8B trace
   (perf/NOTES.md v44), long after the trace had ended. Where Triton lacks the parallel compile
   (:func:`~reference.ops.kernel_launch.supported`) this pass is skipped and the second compiles them;
2. with real launches, which find every kernel compiled and ready: a kernel it compiles or readies itself is
   one the first pass missed.

Part of Triton's compile (LLVM, ``ptxas``) runs outside the interpreter's lock and overlaps the trace; its code
generator is Python and takes turns with the trace (perf/NOTES.md v39, where Inductor's own Python loses more to
it than the step saves). The backend calls :meth:`KernelWarmUp.wait`
before any piece runs (``PiecewiseBackend.before_first_run``): no piece's first run compiles a kernel twice, and
no capture meets the thread's launches (a launch from another thread during a capture in torch's default
``'global'`` error mode invalidates it).

Not covered: ``cudagraph_mode='full'``'s attention inside full graphs of every step (the cache write, the
variable-length kernel and the decode kernel without zeroed padding rows) compiles at the first capture, as
before; the eager step takes the piecewise path's kernels.

The second step writes its keys and values into KV-cache rows 0 and 1 (positions 0 and 1); the warm-up's own
dummy steps write there too, and every real sequence rewrites its slots before reading them. The first writes
nothing a kernel would have written: its attention reads no cache and its outputs are left as allocated.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch
from torch import nn

from reference.compilation import key_prefetch
from reference.config import CompilationConfig
from reference.cpus import usable_cpus
from reference.forward_context import ForwardContext, set_forward_context
from reference.ops import Attention, AttentionMetadata, kernel_launch

# Device types whose custom ops compile a kernel at its first launch (Triton's); the runner warms up only these.
DEVICE_TYPES = frozenset({"cuda"})
# Threads compiling the step's kernels: a step has 6-12 specialisations (the 8B's: 6), and v35 measured eight
# compiles at 0.84 s on 8 threads and 0.77 s on 16 (perf/NOTES.md); more than the CPUs this process may run on
# cannot help.
COMPILE_WORKERS = min(16, usable_cpus())


def wanted(device: torch.device, config: CompilationConfig) -> bool:
    """Whether a start on ``device`` under ``config`` warms up kernels: on a device of ``DEVICE_TYPES``, with
    ``use_inductor=False``.

    Not with Inductor: its pieces launch kernels of its own, compiled in its compile phase, and the step's Python
    (Triton's code generator) takes turns for the interpreter's lock with Inductor's, which made an 8B ``inductor``
    start about 1 s slower, warm and cold, on an H100 (perf/NOTES.md v39). The runner also skips the warm-up
    when the compile cache serves the start (``CompiledModel.before_trace`` is called only before a trace).
    """
    return device.type in DEVICE_TYPES and not config.use_inductor


def warm_up_step(max_num_seqs: int, max_model_len: int) -> tuple[list[int], list[int], list[int]]:
    """The eager step's ``(query_lens, seq_lens, rows)``: a one-token decode (row 0) beside a two-token prefill
    (row 1) where the KV cache has two rows of at least two tokens; else a two-token prefill, else one token."""
    if max_num_seqs >= 2 and max_model_len >= 2:
        return [1, 2], [1, 2], [0, 1]
    if max_model_len >= 2:
        return [2], [2], [0]
    return [1], [1], [0]


def _launches_done(device: torch.device) -> None:
    """Return once ``device`` has run every launch made so far: the warm-up's kernels are done before its thread
    ends, so no capture that begins after :meth:`KernelWarmUp.wait` runs beside them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class KernelWarmUp:
    """One eager step of ``model`` on a thread, run twice (compiling only, then launching), to compile the Triton
    kernels its custom ops launch.

    Args:
        model: ``forward(input_ids [T] int64, positions [T] int64) -> [T, H]``, its attention layers' KV caches
            allocated (``ModelRunner`` does both).
        max_num_seqs, max_model_len: the KV cache's rows and tokens per row (:func:`warm_up_step`).

    Attributes:
        thread: the ``threading.Thread`` (named ``'kernel-warm-up'``), None before :meth:`start`.
        step_s: seconds the step took on its thread, both passes (0.0 until it ends).
        compile_s: seconds of the compile-only pass, inside ``step_s`` (0.0 where it did not run).
        waited_s: seconds :meth:`wait` blocked in all (the part of the step the trace did not hide).
        error: the exception the step raised, else None (read it after :meth:`wait`).
    """

    THREAD_NAME = "kernel-warm-up"

    def __init__(self, model: nn.Module, max_num_seqs: int, max_model_len: int):
        self.model: nn.Module | None = model  # dropped when the step ends
        self.step = warm_up_step(max_num_seqs, max_model_len)
        self.max_model_len = max_model_len
        self.thread: threading.Thread | None = None
        self.step_s = self.compile_s = self.waited_s = 0.0
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start the step on its thread; returns at once."""
        self.thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        self.thread.start()

    def wait(self) -> None:
        """Wait for the step to end (at once before :meth:`start` or once it has ended); never raises."""
        if self.thread is not None:
            start = time.perf_counter()
            self.thread.join()
            self.waited_s += time.perf_counter() - start

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            self._eager_step()
        except BaseException as error:  # for the waiting thread to report; this one has no caller
            self.error = error
        finally:
            self.model = None  # the runner holds the model; a failed start must not leave it held here
        self.step_s = time.perf_counter() - start

    @torch.inference_mode()
    def _eager_step(self) -> None:
        key_prefetch.wait()  # Triton's installation hash: computed on its own thread, never twice
        query_lens, seq_lens, rows = self.step
        device = next(self.model.parameters()).device
        positions = [p for q, s in zip(query_lens, seq_lens) for p in range(s - q, s)]
        metadata = AttentionMetadata.build(query_lens, seq_lens, rows, self.max_model_len, device)
        layers = {m.layer_name: m for m in self.model.modules() if isinstance(m, Attention)}
        input_ids = torch.zeros(len(positions), dtype=torch.int64, device=device)  # [T]
        on_cuda = device.type == "cuda"
        # Triton launches on this thread's current device, which need not be the main thread's
        with torch.cuda.device(device) if on_cuda else contextlib.nullcontext():
            with set_forward_context(ForwardContext(metadata, layers, "NONE")):
                position_ids = torch.tensor(positions, device=device)  # [T]
                if on_cuda and kernel_launch.supported():  # Triton's device, and its parallel compile
                    start = time.perf_counter()
                    with kernel_launch.compile_only(COMPILE_WORKERS, device):
                        self.model(input_ids, position_ids)  # compiles every Triton kernel, launching none of them
                    self.compile_s = time.perf_counter() - start
                self.model(input_ids, position_ids)  # launches them, each compiled and loaded now
            _launches_done(device)
