"""The compilation pipeline: Dynamo capture -> split -> compile piece -> CUDA graph."""

from reference.compilation.capture import CompiledModel, compile_model
from reference.compilation.counters import CompilationCounter, compilation_counter, expect_counters

__all__ = ["CompilationCounter", "CompiledModel", "compilation_counter", "compile_model", "expect_counters"]
