"""Start-up of one compilation mode, cold and warm, each in a fresh process (vLLM's ``vllm bench startup``).

A start is everything between ``python`` and the first answered request, split into phases (seconds):

* ``import_s``: importing torch and the project (the child's own clock, from its first line);
* ``weights_s``: building the model with its weights on the device (:func:`~reference.models.registry.build_model`);
* ``compile_s``: the first forward call, Dynamo's trace, the split and each piece's compilation (the runner's
  :class:`~reference.engine.runner.StartupStats`);
* ``capture_s``: warm-up runs and CUDA-graph capture of every capture size (nothing is captured on a CPU);
* ``first_step_s``: one prefill of the batch's prompts and one decode step after that, synchronised.

``ready_s = compile_s + capture_s``: what the mode adds to a start, weights excluded (the figure vLLM's
issue 22 targets use). A *cold* start has empty compiler caches, a *warm* one the caches the cold start
filled, all kept in ``CACHE_DIR/MODE``: the project's compile cache (``REFERENCE_COMPILE_CACHE``: the split
graph and Inductor's pieces, so a warm level-3 start neither traces nor compiles), Inductor's own
(``TORCHINDUCTOR_CACHE_DIR``: FX-graph and AOTAutograd caches), Triton's compiled kernels
(``TRITON_CACHE_DIR``) and the temporary folder (``TMPDIR``: Inductor's C++ precompiled header, kept outside
its cache folder). ``compile_cache_hits`` (the project's) and ``inductor_cache_hits`` / ``_misses``
(Inductor's ``fxgraph_cache_hit`` / ``_miss``) say what the caches served.

The parent (:func:`measure_mode`) runs ``python -m reference.benchmark.startup SPEC`` twice per mode and reads
the child's last line, ``STARTUP {json}``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

_STARTED = time.perf_counter()  # before torch: the child's import phase starts here

PHASES = ("import_s", "weights_s", "compile_s", "capture_s", "first_step_s")
MARK, ERROR_MARK = "STARTUP ", "STARTUP_ERROR "
STARTS = ("cold", "warm")


class StartupError(RuntimeError):
    """A child process failed; the message holds the end of its output."""


class StartupSettingsError(StartupError):
    """A child refused the start's settings (a config, a batch no memory holds, a broken checkpoint): its own
    one-line message, the user's to fix, as ``bench_latency``'s usage errors are."""


def cache_environment(cache_dir: Path, mode: str) -> dict[str, str]:
    """The environment variables that put every compiler cache in ``cache_dir/mode`` (the project's compile
    cache, on even where the caller turned it off; Inductor's; Triton's) and the temporary folder there, where
    Inductor keeps its C++ precompiled header (outside its own cache folder)."""
    root = Path(cache_dir) / mode
    return {
        "REFERENCE_COMPILE_CACHE": str(root / "reference"),
        "REFERENCE_DISABLE_COMPILE_CACHE": "0",
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TMPDIR": str(root / "tmp"),
    }


# The file each mode's folder gets when this tool makes it: only a folder holding it, or an empty one, is emptied
MARK_FILE = ".made-by-bench-startup"


def made_by_bench_startup(folder: Path) -> bool:
    """Whether ``folder`` is a mode's cache folder this tool made (it holds :data:`MARK_FILE`)."""
    return (Path(folder) / MARK_FILE).is_file()


def check_mode_folder(cache_dir: Path, mode: str) -> None:
    """Refuse to empty ``cache_dir/mode`` unless it is absent, a link (removed, its target left alone), an empty
    folder, or a folder this tool made: a folder of the user's named after a mode would lose its files.

    Raises:
        StartupError: one line naming the folder and what to give instead.
    """
    path = Path(cache_dir) / mode
    if path.is_symlink() or not path.exists():
        return
    if path.is_dir() and (made_by_bench_startup(path) or not any(path.iterdir())):
        return
    raise StartupError(
        f"--cache-dir: {path} holds files bench_startup did not write, and each mode's folder is emptied before its "
        "cold start; give a new or empty folder, or one an earlier bench_startup run used"
    )


def measure_mode(spec: dict, cache_dir: Path, *, timeout_s: float = 3600) -> list[dict]:
    """A cold start of ``spec["mode"]`` (its cache folder emptied first), then a warm one: two rows.

    Args:
        spec: the child's arguments: ``model``, ``mode``, ``device`` (None: cuda if available), ``dtype``
            (``'auto'`` or a name of ``reference.engine.arguments.DTYPES``), ``batch_size``, ``input_len``,
            optionally ``overrides`` (fields over a compiled mode's config, or None).
        cache_dir: folder holding one cache folder per mode; this mode's is deleted before the cold start (a
            link of that name too, its target left alone) where :func:`check_mode_folder` allows, and marked.

    Returns:
        ``[cold, warm]``: each the spec's ``mode`` and ``start``, every phase of ``PHASES`` and ``ready_s``
        (seconds), ``compile_cache_hits``, ``kernel_warm_up_s`` / ``_wait_s``, ``kernel_compile_s`` (the runner's
        :class:`~reference.engine.runner.StartupStats`), ``inductor_cache_hits`` / ``_misses``, ``capture_sizes``,
        ``compilation_config`` (the config the start ran, resolved), ``dtype``, ``compile_cache_warnings`` (the
        compile cache's warnings the start printed: :func:`compile_cache_warnings`).

    Raises:
        StartupSettingsError: a child refused the settings; the message is its own one-line error (a batch no
            memory holds, a broken checkpoint, a bad config value).
        StartupError: a child exited non-zero, printed no result, or ran past ``timeout_s``; or the mode's cache
            folder could not be removed or made, or is not this tool's to empty.
    """
    check_mode_folder(cache_dir, spec["mode"])
    _remove(Path(cache_dir) / spec["mode"])
    env = {**os.environ, **cache_environment(cache_dir, spec["mode"])}
    try:
        Path(env["TMPDIR"]).mkdir(parents=True)  # a TMPDIR that does not exist is ignored
        (Path(cache_dir) / spec["mode"] / MARK_FILE).write_text("a mode's caches, written by bench_startup\n")
    except OSError as err:
        raise StartupError(f"--cache-dir: could not make {env['TMPDIR']}: {err.strerror or err}") from None
    rows = []
    for start in STARTS:
        cmd = [sys.executable, "-m", "reference.benchmark.startup", json.dumps(spec)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise StartupError(f"{spec['mode']} ({start} start): still running after {timeout_s:.0f} s") from None
        results = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
        errors = [line for line in proc.stdout.splitlines() if line.startswith(ERROR_MARK)]
        if errors:
            raise StartupSettingsError(f"{spec['mode']} ({start} start): {errors[-1][len(ERROR_MARK) :]}")
        if proc.returncode != 0 or not results:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
            raise StartupError(f"{spec['mode']} ({start} start): exit {proc.returncode}: {tail}")
        row = {"mode": spec["mode"], "start": start, **json.loads(results[-1][len(MARK) :])}
        row["compile_cache_warnings"] = compile_cache_warnings(proc.stderr)
        rows.append(row)
    return rows


def compile_cache_warnings(stderr: str) -> list[str]:
    """The compile cache's warnings in a child's stderr, each its message alone (``compile cache: ...``, as
    :mod:`reference.compilation.compile_cache` and ``capture`` word them), in order, without repeats."""
    found = []
    for line in stderr.splitlines():
        _, mark, message = line.partition("RuntimeWarning: compile cache: ")
        if mark and f"compile cache: {message}" not in found:
            found.append(f"compile cache: {message}")
    return found


def _remove(path: Path) -> None:
    """Remove what ``path`` names: a folder with all it holds, or a file or link (a link's target is left alone).

    Raises:
        StartupError: it could not be removed (one line: the path and the OS's reason).
    """
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
    except OSError as err:
        raise StartupError(f"--cache-dir: could not empty {path}: {err.strerror or err}") from None


def _child(spec: dict) -> dict:
    """One start in this process (module doc); returns its phases and counters."""
    import torch
    from torch._dynamo.utils import counters

    from reference.compilation import compilation_counter, key_prefetch
    from reference.config import MODES
    from reference.engine.arguments import engine_config, resolve_device, resolve_dtype
    from reference.engine.memory_check import check_memory_before_build
    from reference.engine.runner import ModelRunner
    from reference.models import registry
    from reference.ops import CustomOpSelection

    device = resolve_device(spec["device"])
    dtype = resolve_dtype(spec["dtype"], registry.model_config(spec["model"]).dtype, device)
    batch, prompt = spec["batch_size"], spec["input_len"]
    times = {"import_s": time.perf_counter() - _STARTED}

    tokens = batch * prompt  # the prefill, the largest step
    eager = spec["mode"] == "eager"
    fields = {**MODES[spec["mode"]], **(spec.get("overrides") or {})}  # bench_startup lets no override reach eager
    config = engine_config(fields, enforce_eager=eager, max_num_seqs=batch, max_num_batched_tokens=tokens)
    ops = CustomOpSelection(config)
    sizes = {"max_num_seqs": batch, "max_model_len": prompt + 1, "max_num_tokens": tokens}
    check_memory_before_build(spec["model"], ops, dtype=dtype, device=device, **sizes)
    key_prefetch.start(device)  # as LLM does, after the checks and before the weights
    start = time.perf_counter()
    model = registry.build_model(spec["model"], ops, dtype=dtype, device=device)
    times["weights_s"] = time.perf_counter() - start
    runner = ModelRunner(model, config, max_num_seqs=batch, max_model_len=prompt + 1, max_num_batched_tokens=tokens)
    stats = runner.warm_up()
    times.update(compile_s=stats.compile_s, capture_s=stats.capture_s)

    start = time.perf_counter()
    prompts = torch.randint(model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    logits = runner.step(prompts.tolist(), [0] * batch, list(range(batch)))  # [B, V]
    runner.step(logits.argmax(-1), [prompt] * batch, list(range(batch)))  # one decode step, fed on the device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times["first_step_s"] = time.perf_counter() - start
    return {
        **times,
        "ready_s": times["compile_s"] + times["capture_s"],
        "compile_cache_hits": compilation_counter.num_cache_hits,
        "kernel_warm_up_s": stats.kernel_warm_up_s,
        "kernel_warm_up_wait_s": stats.kernel_warm_up_wait_s,
        "kernel_compile_s": stats.kernel_compile_s,
        "inductor_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
        "inductor_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
        "capture_sizes": list(stats.capture_sizes),
        "compilation_config": config.describe(),
        "dtype": str(dtype).removeprefix("torch."),
    }


def _child_main(spec: dict) -> int:
    """Run :func:`_child` and print its result line; an error the user's settings cause (a batch no memory
    holds, a broken checkpoint, a bad value) is printed as one line instead, exit status 2."""
    from reference.config import ConfigError
    from reference.models.loader import CheckpointError

    try:
        result = _child(spec)
    except (ConfigError, CheckpointError, ValueError) as err:
        print(ERROR_MARK + " ".join(str(err).split()), flush=True)
        return 2
    print(MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(json.loads(sys.argv[1])))
