"""Piecewise CUDA graphs with a toggleable Inductor: a compact reference implementation.

Pipeline: :mod:`reference.config` -> :mod:`reference.compilation.capture` (Dynamo, once) ->
:mod:`reference.compilation.split` -> :mod:`reference.compilation.compile_piece` (Inductor or eager) ->
:mod:`reference.compilation.cuda_graph` -> :mod:`reference.engine.runner` (run).

The offline API is vLLM's: ``from reference import LLM, SamplingParams``.
"""

from reference.config import CompilationConfig, ConfigError

__all__ = ["LLM", "CompilationConfig", "ConfigError", "SamplingParams"]


def __getattr__(name: str):
    # LLM and SamplingParams load on first use: the engine imports transformers and every model module,
    # which `import reference.config` should not pay for.
    if name in ("LLM", "SamplingParams"):
        from reference import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'reference' has no attribute {name!r}")
