"""The compiled modes' config overrides on a bench's command line: vLLM's spellings, the flags, their checks.

``bench_latency`` and ``bench_startup`` take the same ``--compilation-config`` (``-cc``, ``-O VALUE``,
``-O.FIELD=VALUE``, expanded by :mod:`reference.benchmark.vllm_flags`) and ``-O<n>``; this module parses them
and checks them against the chosen modes before any model loads: the fields a mode is made of
(``MODE_DEFINING_FIELDS``) stay the mode's, every other field is validated per compiled mode with that
mode's config, and a compile size no step would run at is refused. Imports no torch until a check needs it.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from reference.benchmark.choices import MODE_KWARGS, mode_kwargs
from reference.benchmark.vllm_flags import OPTIMIZATION_LEVEL_MODES, expand_vllm_spellings
from reference.config import CompilationConfig, ConfigError, config_fields, mode_config
from reference.config.vllm_names import translate

# The config fields that tell the modes apart: --compilation-config may not change them, or a row
# labelled with one mode would run another.
MODE_DEFINING_FIELDS = ("level", "use_inductor", "cudagraph_mode")

COMPILATION_CONFIG_HELP = (
    "(-cc, -O) JSON or Python-literal dict overriding fields of the compiled modes' configs, e.g. capture sizes, "
    "custom_ops or use_inductor_graph_partition; or one field: -O.FIELD=VALUE, -cc.FIELD=VALUE or "
    "--compilation-config.FIELD=VALUE (or VALUE as the next argument; JSON or a Python literal, else a string), "
    "dots nest: -O.inductor_compile_config.max_autotune=true; fields and a whole dict merge, each field given "
    "once; level, use_inductor and cudagraph_mode are set by --modes"
)


def compilation_config_fields(text: str) -> dict[str, Any]:
    """argparse type of ``--compilation-config``: the fields of ``text`` (vLLM's names translated), checked
    as a config, their custom-op and splitting-op names included.

    Raises:
        argparse.ArgumentTypeError: the config's own one-line error.
    """
    try:
        fields = translate(config_fields(text))  # vLLM's mode / backend as level / use_inductor: --modes owns them
        config = CompilationConfig.parse(fields)  # keys and values
        from reference.compilation.backend import check_splitting_ops_exist  # torch: after --help
        from reference.ops import CustomOpSelection

        CustomOpSelection(config)  # custom-op names
        check_splitting_ops_exist(config.splitting_ops or ())  # splitting-op names, before any model loads
    except ConfigError as err:
        raise argparse.ArgumentTypeError(_with_modes_hint(str(err))) from None
    return fields


# What a config error's advice to set or use a mode-defining field means in the CLIs, where --modes sets it.
# The config check of the flag's own parse runs on the default config (level 3, Inductor, piecewise graphs),
# before --modes is read; check_overrides then checks each mode's config.
MODES_FOR_FIELD = {
    "level": "--modes sets the level: eager and breakable run at 0, the other modes at 3",
    "use_inductor": "--modes sets use_inductor: inductor and inductor_full compile with Inductor",
    "cudagraph_mode": "--modes sets cudagraph_mode, and every compiled mode captures graphs",
}


def _with_modes_hint(message: str, mode: str | None = None) -> str:
    """``message`` (a config's own error) in the CLIs' terms: where it advises setting or using a field that
    ``--compilation-config`` refuses (``MODE_DEFINING_FIELDS``), who sets that field here; where it is one
    ``mode``'s error (the override does not fit that mode), that the mode may be left out. A new user's try
    followed the config's own advice into a second error (perf/NOTES.md v47)."""
    advised = [hint for name, hint in MODES_FOR_FIELD.items() if re.search(rf"\b(set|use) {name}\b", message)]
    message += f" (here {'; '.join(advised)})" if advised else ""
    return f"{message}; or leave {mode} out of --modes" if mode else message


def add_compilation_flags(parser: argparse.ArgumentParser) -> None:
    """``--compilation-config`` and ``--optimization-level`` (what ``-O<n>`` expands to) on ``parser``."""
    parser.add_argument(
        "--compilation-config", type=compilation_config_fields, default=None, help=COMPILATION_CONFIG_HELP
    )
    parser.add_argument(
        "--optimization-level",
        default=None,
        metavar="N",
        help="(-O0 .. -O3, -O N, -O=N) vLLM's optimization level, here the mode it stands for: "
        + ", ".join(f"{n} {mode}" for n, mode in OPTIMIZATION_LEVEL_MODES.items())
        + " (vLLM: 0 no compilation nor graphs, 1 Inductor with piecewise graphs, 2 and 3 with full graphs too)",
    )


def parse_with_vllm_spellings(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args`` of ``argv`` with vLLM's spellings expanded first; a spelling's error exits 2 in one
    line, as argparse's own do."""
    try:
        expanded = expand_vllm_spellings(argv)
    except ConfigError as err:
        parser.error(str(err))
    return parser.parse_args(expanded)


def level_mode(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The mode ``-O<n>`` stands for (None without one); exits 2 where ``--modes`` names other modes too."""
    if args.optimization_level is None:
        return None
    level, mode = args.optimization_level, OPTIMIZATION_LEVEL_MODES[args.optimization_level]
    if args.modes not in (None, [mode]):  # the same mode twice is no contradiction
        parser.error(
            f"-O{level} selects --modes {mode} (vLLM's optimization level), and --modes "
            f"{','.join(args.modes)} was given too; give one"
        )
    return mode


def check_overrides(
    parser: argparse.ArgumentParser,
    overrides: dict[str, Any] | None,
    modes: list[str],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    no_compiled_mode: str = "--modes has none",
) -> None:
    """Refuse ``overrides`` (``--compilation-config``'s fields) that cannot apply to ``modes``: none of them
    compiled (``no_compiled_mode`` says why), a mode-defining field changed, a config a mode refuses with them,
    a compile size no step runs at with the engine's limits. Each is one line, exit status 2."""
    if overrides is None:
        return
    compiled = [m for m in modes if "compilation_config" in MODE_KWARGS[m]]
    if not compiled:
        parser.error(f"--compilation-config applies only to compiled modes, and {no_compiled_mode}; drop one of them")
    changed = [f for f in MODE_DEFINING_FIELDS if any(_changes(overrides, m, f) for m in compiled)]
    if changed:
        parser.error(
            f"--compilation-config: sets {', '.join(changed)}, which --modes decides: choose modes instead "
            f"({'; '.join(map(_defining_fields, MODE_KWARGS))}); other fields (capture sizes, custom_ops, "
            "splitting_ops, ...) may be set"
        )
    for mode in compiled:
        try:
            CompilationConfig.parse(mode_kwargs(mode, overrides)["compilation_config"])
        except ConfigError as err:
            parser.error(f"--compilation-config: with mode {mode!r}: {_with_modes_hint(str(err), mode)}")
    from reference.engine.arguments import compile_sizes_never_run, engine_config  # torch

    for mode in compiled:
        config = engine_config(
            mode_kwargs(mode, overrides)["compilation_config"],
            enforce_eager=False,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        never = compile_sizes_never_run(config, max_num_batched_tokens)
        if never:  # the engine would refuse it when the mode's LLM is built, after the modes before it ran
            sizes = [s for s in config.cudagraph_capture_sizes if s <= max_num_batched_tokens]
            parser.error(
                f"--compilation-config: with mode {mode!r}: compile_sizes {never} never run: a step is padded to the "
                f"next capture size ({sizes}); list capture sizes, or counts above the largest one up to "
                f"{max_num_batched_tokens}"
            )


def _defining_fields(mode: str) -> str:
    """``mode`` and its values of ``MODE_DEFINING_FIELDS``, e.g. 'inductor: level 3, use_inductor=True'."""
    if "enforce_eager" in MODE_KWARGS[mode]:
        return f"{mode}: level 0"
    config = mode_config(mode)
    parts = [f"level {config.level}"] + ([f"use_inductor={config.use_inductor}"] if config.level else [])
    if config.cudagraph_mode != CompilationConfig(level=config.level).cudagraph_mode:  # not the level's default
        parts.append(f"cudagraph_mode={config.cudagraph_mode}")
    return f"{mode}: {', '.join(parts)}"


def _changes(overrides: dict[str, Any], mode: str, field: str) -> bool:
    """Whether ``overrides`` gives ``field`` a value other than compiled ``mode``'s (resolved) one."""
    return field in overrides and overrides[field] != getattr(mode_config(mode), field)
