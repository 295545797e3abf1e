"""Piecewise CUDA graphs with a toggleable Inductor: a compact reference implementation.

Pipeline: :mod:`reference.config` -> :mod:`reference.compilation.capture` (Dynamo, once) ->
:mod:`reference.compilation.split` -> :mod:`reference.compilation.compile_piece` (Inductor or eager) ->
:mod:`reference.compilation.cuda_graph` -> :mod:`reference.engine.runner` (run).
"""

from reference.config import CompilationConfig, ConfigError

__all__ = ["CompilationConfig", "ConfigError"]
