"""Which CUDA graphs a runner captures: the graph kind its attention can serve, and the sizes of each kind.

Resolved once per :class:`~reference.engine.runner.ModelRunner`, before its model is compiled, from the
compilation config and the runner's limits (``max_num_seqs`` sequences, ``max_num_batched_tokens`` tokens a
step). vLLM resolves the same in its config and its CUDA-graph dispatcher; here it is one function whose
every refusal is a :class:`~reference.config.ConfigError` line and every adjustment one RuntimeWarning line:

* compile sizes above the token limit are dropped (no step holds that many tokens);
* a full ``cudagraph_mode`` the attention cannot serve on this device and dtype is lowered
  (:func:`~reference.ops.attention.cudagraph_support`, vLLM's ``AttentionCGSupport`` levels);
* capture sizes above the token limit are dropped; piecewise graphs take the rest, full decode graphs those
  a decode step can have (at most ``max_num_seqs``), ``'full'`` graphs those any step can have;
* a compile size that steps are padded past (never run at) is refused.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch

from reference.config import CompilationConfig, ConfigError
from reference.engine.arguments import compile_sizes_never_run
from reference.ops.attention import ATTENTION_OP, AttentionCGSupport, cudagraph_support

# the caller of ModelRunner(...), for the warnings of the helpers below (helper <- plan_graphs <- __init__)
_CALLER = 4


@dataclass(frozen=True)
class GraphPlan:
    """A runner's graphs.

    Attributes:
        config: the config the runner compiles: compile sizes above the token limit dropped, a full mode the
            attention cannot serve lowered.
        capture_sizes: the piecewise sizes (capture sizes up to the token limit), ascending; () without
            piecewise graphs.
        full_sizes: the full-graph sizes, ascending: capture sizes up to ``max_num_seqs`` (a decode step's
            tokens), or under ``'full'`` up to the token limit; () without full graphs.
    """

    config: CompilationConfig
    capture_sizes: tuple[int, ...]
    full_sizes: tuple[int, ...]

    @property
    def piecewise_warm_up_sizes(self) -> tuple[int, ...]:
        """The piecewise sizes a warm-up captures: size 1 is left out when full graphs serve it (a 1-token
        step is always a uniform decode)."""
        return tuple(s for s in self.capture_sizes if not (s == 1 and self.full_sizes))


def plan_graphs(
    config: CompilationConfig, device: torch.device, dtype: torch.dtype, max_num_seqs: int, max_num_tokens: int
) -> GraphPlan:
    """The graphs a runner with these limits captures for a model of ``dtype`` on ``device`` (module doc).

    Raises:
        ConfigError: no capture size fits the steps (piecewise and ``'full'``: at most ``max_num_tokens``;
            full decode graphs: at most ``max_num_seqs``), or a compile size no step runs at.

    Warns:
        RuntimeWarning: compile or capture sizes above ``max_num_tokens``, or a full mode lowered.
    """
    config = _without_compile_sizes_above(config, max_num_tokens)
    config = _within_attention_support(config, device, dtype)
    sizes = config.cudagraph_capture_sizes if config.piecewise_graphs else ()
    capture_sizes = tuple(s for s in sizes if s <= max_num_tokens)
    full_sizes = _full_sizes(config, max_num_seqs, max_num_tokens)
    _check_capture_sizes_within(config, max_num_tokens)
    never = compile_sizes_never_run(config, max_num_tokens)
    if never:
        raise ConfigError(
            f"compile_sizes {never} never run: a step is padded to the next capture size "
            f"({list(capture_sizes or full_sizes)}); list capture sizes, or counts above the largest one up to "
            "max_num_batched_tokens"
        )
    return GraphPlan(config, capture_sizes, full_sizes)


def _first_eight(sizes) -> str:
    """``sizes`` for a one-line message: the first eight as a list, ``...`` after them if there are more (a
    default capture list has 67 sizes)."""
    return f"{list(sizes)[:8]}{'...' if len(sizes) > 8 else ''}"


def _without_compile_sizes_above(config: CompilationConfig, max_num_tokens: int) -> CompilationConfig:
    """``config`` without the compile sizes above ``max_num_tokens``, with one warning line naming them, as
    capture sizes there are skipped; ``'cudagraph_capture_sizes'`` may have brought them in."""
    above = [s for s in config.compile_sizes if s > max_num_tokens]
    if not above:
        return config
    warnings.warn(
        f"{len(above)} compile sizes exceed max_num_batched_tokens ({max_num_tokens}) and are not compiled "
        f"(no step has that many tokens): {_first_eight(above)}",
        RuntimeWarning,
        stacklevel=_CALLER,
    )
    return dataclasses.replace(config, compile_sizes=[s for s in config.compile_sizes if s <= max_num_tokens])


def _within_attention_support(config: CompilationConfig, device: torch.device, dtype: torch.dtype) -> CompilationConfig:
    """``config`` with a full ``cudagraph_mode`` lowered to what the attention declares it can serve inside a
    graph for ``device`` and ``dtype``, with one warning line; unchanged when it can. vLLM lowers its modes for
    its backends the same way."""
    support = cudagraph_support(device, dtype)
    decodes = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    needed = {"full": AttentionCGSupport.ALWAYS, "full_and_piecewise": decodes, "full_decode_only": decodes}.get(
        config.cudagraph_mode
    )
    if needed is None or support >= needed:
        return config
    # piecewise graphs need the levels that have them and a split at attention (splitting_ops=[] keeps one
    # whole graph, which a piecewise capture would record attention in)
    pieces = config.level in (0, 3) and (config.splitting_ops is None or ATTENTION_OP in config.splitting_ops)
    if support >= decodes:  # only 'full' asks more
        lower = "full_and_piecewise" if pieces else "full_decode_only"
    else:
        lower = "piecewise" if pieces and config.cudagraph_mode != "full_decode_only" else "none"
    steps = "every step" if needed == AttentionCGSupport.ALWAYS else "decode steps"
    warnings.warn(
        f"cudagraph_mode={config.cudagraph_mode!r} runs as {lower!r}: attention declares {support.name} for "
        f"{dtype} on {device.type} (full graphs of {steps} need {needed.name})",
        RuntimeWarning,
        stacklevel=_CALLER,
    )
    return dataclasses.replace(config, cudagraph_mode=lower)


def _full_sizes(config: CompilationConfig, max_num_seqs: int, max_num_tokens: int) -> tuple[int, ...]:
    if not config.full_graphs:
        return ()
    if config.full_graphs_of_every_step:
        limit, what = max_num_tokens, f"a step (at most max_num_batched_tokens={max_num_tokens} tokens)"
    else:
        limit = min(max_num_seqs, max_num_tokens)
        what = f"a decode step (at most max_num_seqs={max_num_seqs} tokens)"
    sizes = tuple(s for s in config.cudagraph_capture_sizes if s <= limit)
    if not sizes:
        raise ConfigError(
            f"cudagraph_mode={config.cudagraph_mode!r}: no capture size fits {what}, so no full graph could be "
            "used; add smaller sizes"
        )
    return sizes


def _check_capture_sizes_within(config: CompilationConfig, max_num_tokens: int) -> None:
    """The sizes steps of any kind are padded to (piecewise graphs, or ``'full'``) past ``max_num_tokens``:
    none is captured, with one warning line, or an error when that leaves none."""
    padded = config.piecewise_graphs or config.full_graphs_of_every_step
    step_sizes = config.cudagraph_capture_sizes if padded else ()
    skipped = [s for s in step_sizes if s > max_num_tokens]
    if skipped and len(skipped) == len(step_sizes):
        raise ConfigError(
            f"cudagraph_capture_sizes {_first_eight(step_sizes)} all exceed max_num_batched_tokens "
            f"({max_num_tokens}): no step could use a graph; lower the sizes or raise the limit"
        )
    if skipped:
        warnings.warn(
            f"{len(skipped)} capture sizes exceed max_num_batched_tokens ({max_num_tokens}) and are not "
            f"captured (no step has that many tokens): {_first_eight(skipped)}",
            RuntimeWarning,
            stacklevel=_CALLER,
        )
