"""Set-up for the latency benchmarks: command-line options, one compiled runner per mode, the decode floor.

Runs are saved by pytest-benchmark (autosave) to ``<repo>/.benchmarks/`` so that
``pytest perf/ --benchmark-compare`` compares against the previous run. Model runners are built once per
mode for the whole session (Inductor compiles once per mode); see perf/NOTES.md for how to read the numbers.
"""

from __future__ import annotations

import gc
import os
import shlex
from dataclasses import dataclass
from typing import Callable, ContextManager

import pytest
import torch
from pytest_benchmark.utils import get_tag

from reference.benchmark.choices import TORCH_NATIVE_MODE
from reference.benchmark.cli import usable_cpus
from reference.benchmark.floor import Bandwidth, floor_bandwidth
from reference.benchmark.machine import benchmark_threads
from reference.benchmark.machine import machine_info as reference_machine_info
from reference.benchmark.machine import source_commit
from reference.compilation.counters import CompilationCounter, compilation_counter
from reference.compilation.replays import ReplayTally, dynamo_graphs, reference_replays
from reference.config import MODES, CompilationConfig
from reference.engine import ModelRunner
from reference.engine.arguments import DTYPES, engine_config, resolve_device
from reference.engine.memory_check import check_memory_before_build
from reference.models import registry
from reference.models.weights import weight_bytes_per_decode_step
from reference.ops import Attention, CustomOpSelection
from reference.peers import compile_torch_native
from reference.peers.torch_native import graph_tree_replays

# The registry's tiny random Llama (2 layers, H=64, vocab 256) with the real KV-cache attention.
DEFAULT_MODEL = "llama-tiny"


def mode_config_for(mode: str, batch_size: int, input_len: int) -> CompilationConfig:
    """Mode ``mode``'s config as the engine resolves it for ``batch_size`` sequences and a step budget of
    ``batch_size * input_len`` tokens (the prefill): capture sizes 1, 2, 4, 8, then 16, 24, 32, 48 ... up
    to the prefill's tokens (:func:`~reference.engine.arguments.engine_capture_sizes`), so decode steps
    and the prefill replay graphs, as in ``bench_latency``."""
    return engine_config(
        MODES[mode],
        enforce_eager=mode == "eager",
        max_num_seqs=batch_size,
        max_num_batched_tokens=batch_size * input_len,
    )


# ---------------------------------------------------------------------- options
def pytest_addoption(parser):
    group = parser.getgroup("perf", "latency benchmarks (perf/)")
    group.addoption(
        "--perf-model", default=DEFAULT_MODEL, help=f"preset or checkpoint directory to benchmark [{DEFAULT_MODEL}]"
    )
    group.addoption("--perf-device", default=None, help="torch device [cuda if available, else cpu]")
    group.addoption("--perf-dtype", default=None, help=f"one of {list(DTYPES)} [bfloat16 on cuda, float32 on cpu]")
    group.addoption("--perf-batch-size", type=int, default=8, help="sequences per decode step and prefill [8]")
    group.addoption("--perf-input-len", type=int, default=32, help="prompt tokens per sequence in the prefill [32]")
    group.addoption(
        "--perf-threads", type=int, default=None, help="torch intra-op threads [1 on a CPU, torch's own count on CUDA]"
    )


@dataclass(frozen=True)
class PerfSettings:
    """The validated ``--perf-*`` options.

    Attributes:
        model: preset name or checkpoint directory (see reference.models.registry).
        device: where the model runs.
        dtype: parameter dtype.
        batch_size: sequences per step (decode: one token each; prefill: ``input_len`` tokens each).
        input_len: prompt length in tokens; decode steps run at context ``input_len``.
        threads: torch intra-op threads the session runs with (reference.benchmark.machine.benchmark_threads).
    """

    model: str
    device: torch.device
    dtype: torch.dtype
    batch_size: int
    input_len: int
    threads: int


_SETTINGS = pytest.StashKey[PerfSettings]()


def _settings(config: pytest.Config) -> PerfSettings:
    """Read and check the options.

    Raises:
        pytest.UsageError: an option has a bad value; the message names the option and the allowed values.
    """
    model = config.getoption("perf_model")
    try:
        model_config = registry.model_config(model)
        registry.model_class(model_config)
    except ValueError as err:
        raise pytest.UsageError(f"--perf-model: {err}") from None
    try:
        device = resolve_device(config.getoption("perf_device"), name="--perf-device")
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    dtype_name = config.getoption("perf_dtype") or ("bfloat16" if device.type == "cuda" else "float32")
    if dtype_name not in DTYPES:
        raise pytest.UsageError(f"--perf-dtype: expected one of {list(DTYPES)}, got {dtype_name!r}")
    for option in ("perf_batch_size", "perf_input_len", "perf_threads"):
        if option == "perf_threads" and config.getoption(option) is None:
            continue
        if config.getoption(option) < 1:
            flag = "--" + option.replace("_", "-")
            raise pytest.UsageError(f"{flag}: expected a positive int, got {config.getoption(option)}")
    if (config.getoption("perf_threads") or 1) > usable_cpus():
        raise pytest.UsageError(
            f"--perf-threads: expected an int in [1, {usable_cpus()}] (this machine's CPUs), "
            f"got {config.getoption('perf_threads')}"
        )
    longest = model_config.max_position_embeddings - 1  # the decode step's token sits at position input_len
    if config.getoption("perf_input_len") > longest:
        raise pytest.UsageError(f"--perf-input-len: {model} takes at most {longest} prompt tokens here")
    threads = benchmark_threads(device, config.getoption("perf_threads"))
    return PerfSettings(
        model,
        device,
        DTYPES[dtype_name],
        config.getoption("perf_batch_size"),
        config.getoption("perf_input_len"),
        threads,
    )


def pytest_configure(config):
    """Check the options; print each benchmark's line when its test ends; save every run to
    ``<rootdir>/.benchmarks`` (pytest-benchmark's autosave).

    Runs before pytest-benchmark's own ``pytest_configure`` (which is ``trylast``) reads these options when
    this conftest is loaded at start-up, i.e. when ``perf/`` (or a file in it) is on the command line;
    ``pytest .`` loads it later and runs the benchmarks without saving them. A ``--benchmark-storage``
    given on the command line is kept.
    """
    config.stash[_SETTINGS] = _settings(config)
    config.pluginmanager.register(_LinePrinter(config), "perf-line-printer")
    torch.set_num_threads(config.stash[_SETTINGS].threads)
    if not config.option.benchmark_autosave:
        config.option.benchmark_autosave = get_tag()  # what --benchmark-autosave stores: commit id + time
    if config.option.benchmark_storage == "file://./.benchmarks":  # pytest-benchmark's default (cwd-relative)
        config.option.benchmark_storage = f"file://{config.rootpath / '.benchmarks'}"


def pytest_benchmark_update_machine_info(config, machine_info):
    """Record the command, the accelerator, library versions, CPU threads, load average and GPU clocks with
    every saved run (pytest-benchmark hook; the run's date is pytest-benchmark's own ``datetime``)."""
    machine_info["command"] = "python -m pytest " + shlex.join(config.invocation_params.args)
    machine_info["torch"] = torch.__version__
    if torch.cuda.is_available():
        machine_info["cuda_device"] = torch.cuda.get_device_name()
    machine_info.update(reference_machine_info(config.stash[_SETTINGS].device))  # threads, load, GPU clocks


def pytest_benchmark_update_commit_info(config, commit_info):
    """The commit the run measured. pytest-benchmark asks git, but a copied tree (the H200's) may carry a
    stale ``.git``; ``REFERENCE_COMMIT`` names the real commit and replaces git's answer whole."""
    if os.environ.get("REFERENCE_COMMIT"):
        commit_info.clear()
        commit_info.update(id=source_commit(config.rootpath), source="REFERENCE_COMMIT")


@pytest.fixture(scope="session")
def perf_settings(pytestconfig) -> PerfSettings:
    """The ``--perf-*`` options, checked at start-up."""
    return pytestconfig.stash[_SETTINGS]


# ---------------------------------------------------------------------- models and runners
@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Overrides the root conftest's per-test Dynamo reset: a reset would make the session's compiled
    runners re-trace on their next call. Runners reset Dynamo themselves, once per mode (``perf_run``)."""
    yield


@dataclass
class PerfRun:
    """A warmed-up runner for one mode.

    Attributes:
        mode: a key of reference.config.MODES, or a peer (``torch-native``).
        runner: compiled, captured (CUDA, level 3) and ready; KV cache ``batch_size`` rows x
            ``input_len + 1`` tokens. None once the mode's tests are done.
        vocab_size: logits width.
        weight_bytes: bytes of weights read per decode step.
        counters: the compilation counters right after warm-up; a step that re-traces or captures changes them.
        dynamo_graphs: graphs Dynamo had traced right after warm-up (any implementation's recompile adds one).
        replay_probe: the implementation's account of what its graph-able calls did in a block
            (reference.compilation.replays): a benchmark's steps must replay, nothing else.
        startup: compile_s, capture_s (s), graph_gib (GiB), capture_sizes; handed to the first test that
            asks (:meth:`take_startup`), so each mode's start-up cost is reported once.
    """

    mode: str
    runner: ModelRunner | None
    vocab_size: int
    weight_bytes: int
    counters: CompilationCounter
    dynamo_graphs: int
    replay_probe: Callable[[], ContextManager[ReplayTally]]
    startup: dict | None

    def take_startup(self) -> dict:
        """The start-up costs the first time it is called, ``{}`` afterwards."""
        startup, self.startup = self.startup, None
        return startup or {}


@pytest.fixture(scope="session")
def base_model(perf_settings) -> torch.nn.Module:
    """The weights every mode runs with: ``build_model(..., seed=0)`` once per session (each mode's model
    shares these tensors, so the 8B preset takes its 15 GB once).

    Raises:
        ValueError: the model has no KV-cache attention layer, so it has no decode step to time.
        ConfigError: (a ValueError) the weights, KV cache and inputs cannot fit the device (checked first).
    """
    s = perf_settings
    ops = CustomOpSelection(mode_config_for("eager", s.batch_size, s.input_len))
    check_memory_before_build(
        s.model, ops, dtype=s.dtype, device=s.device, max_num_seqs=s.batch_size, max_model_len=s.input_len + 1,
        max_num_tokens=s.batch_size * s.input_len,
    )  # fmt: skip
    model = registry.build_model(s.model, ops, dtype=s.dtype, device=s.device)
    if not any(isinstance(m, Attention) for m in model.modules()):
        raise ValueError(
            f"--perf-model {s.model!r}: no KV-cache attention layer (e.g. toy-llama, whose attention treats the whole "
            "batch as one sequence), so there is no decode step to time; use a Llama-family preset, e.g. llama-tiny"
        )
    return model


# torch's own piecewise path (reference.peers) in the same runner, with the inductor mode's config:
# (the mode whose config it runs, its compile function, its replay probe)
PEERS = {"torch-native": (TORCH_NATIVE_MODE, compile_torch_native, graph_tree_replays)}


@pytest.fixture(scope="session", params=[*MODES, *PEERS])
def perf_run(request, perf_settings, base_model):
    """One :class:`PerfRun` per mode and peer, alive while its tests run (pytest groups tests by it)."""
    mode, s = request.param, perf_settings
    config_mode, compile_fn, replay_probe = PEERS.get(mode, (mode, None, reference_replays))
    config = mode_config_for(config_mode, s.batch_size, s.input_len)
    torch._dynamo.reset()  # nothing compiled for another mode may be reused
    model = registry.build_model(
        s.model, CustomOpSelection(config), dtype=s.dtype, device=s.device, share_weights_with=base_model
    )
    runner = ModelRunner(
        model,
        config,
        max_num_seqs=s.batch_size,
        max_model_len=s.input_len + 1,  # prompt + the decode token, rewritten at the same position each round
        max_num_batched_tokens=s.batch_size * s.input_len,
        compile_fn=compile_fn,
    )
    stats = runner.warm_up()
    run = PerfRun(
        mode,
        runner,
        model.config.vocab_size,
        weight_bytes_per_decode_step(model),
        compilation_counter.snapshot(),
        dynamo_graphs(),
        replay_probe,
        startup={
            "compile_s": stats.compile_s,
            "capture_s": stats.capture_s,
            "graph_gib": stats.graph_gib,
            "capture_sizes": list(stats.capture_sizes),
            "full_capture_sizes": list(stats.full_capture_sizes),
        },
    )
    yield run
    # pytest holds `run` until after this teardown: drop the KV cache and graph pools now, so the next
    # mode's start-up (and its graph memory figure) does not share the device with them.
    run.runner = None
    del runner, model
    gc.collect()
    if s.device.type == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()


# ---------------------------------------------------------------------- decode floor
@pytest.fixture(scope="session")
def bandwidth(perf_settings) -> Bandwidth | None:
    """The bandwidth for the decode floor, as the benchmark CLI takes it (reference.benchmark.floor);
    None on CPU."""
    return floor_bandwidth(perf_settings.device)


# ---------------------------------------------------------------------- summary
_REPORT = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def perf_report(pytestconfig):
    """``perf_report(name, median_s | None, extra_info)``: the benchmark's line, printed when its test ends
    (so a run cut short keeps it) and again in the summary at the end."""
    lines = pytestconfig.stash.setdefault(_REPORT, [])
    return lambda name, median, info: lines.append(_describe(name, median, info))


def _describe(name: str, median: float | None, info: dict) -> str:
    """One line: the median (ms) next to its derived figures (tokens/s, floor, start-up costs)."""
    if median is None:
        problems = info.get("replay_problems")
        return f"{name}: not timed (benchmarks disabled)" + (f", GRAPHS DID NOT REPLAY ({'; '.join(problems)})" if problems else "")
    per_step = f" per step (chains of {info['chain']})" if info.get("chain", 1) > 1 else ""
    parts = [f"{name}: {median * 1e3:.3f} ms{per_step}", f"{info['tokens_per_s']:,.0f} tokens/s"]
    if info.get("replay_problems"):
        parts.insert(1, f"GRAPHS DID NOT REPLAY ({'; '.join(info['replay_problems'])})")
    if "floor_ms" in info:
        parts.append(f"floor {info['floor_ms']:.3f} ms ({info['bandwidth_source']}), {info['ratio_to_floor']:.2f}x")
    if "compile_s" in info:
        parts.append(f"startup: compile {info['compile_s']:.2f} s, capture {info['capture_s']:.2f} s")
        if info["capture_sizes"]:
            parts[-1] += f" (sizes {info['capture_sizes']}, {info['graph_gib']:.3f} GiB)"
    return ", ".join(parts)


class _LinePrinter:
    """Prints the lines a test reported once it ends (``pytest_runtest_logfinish`` runs outside output
    capture, which the test's own call does not)."""

    def __init__(self, config: pytest.Config):
        self.config, self.printed = config, 0

    def pytest_runtest_logfinish(self, nodeid, location):
        lines = self.config.stash.get(_REPORT, [])
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None or self.printed == len(lines):
            return
        terminal.ensure_newline()  # after `path .` (no -q) or `nodeid PASSED` (-v)
        if terminal.verbosity < 0:  # -q writes the test's `.` with no path, which ensure_newline ignores
            terminal.write("\n")
        for line in lines[self.printed :]:
            terminal.write_line(line)
        terminal.flush()  # a piped stdout is block-buffered: a run killed later must still have printed these
        self.printed = len(lines)


def pytest_terminal_summary(terminalreporter, config):
    """Print every benchmark's line again, together, at the end."""
    lines = config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("perf: medians with derived figures")
        for line in lines:
            terminalreporter.write_line(line)
