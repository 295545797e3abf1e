"""Running models: the step runner (static buffers, padding, KV cache), sampling and the offline API."""

from reference.engine.llm import LLM
from reference.engine.requests import CompletionOutput, RequestOutput
from reference.engine.runner import ModelRunner, StartupStats
from reference.engine.sampling import SamplingParams

__all__ = ["LLM", "CompletionOutput", "ModelRunner", "RequestOutput", "SamplingParams", "StartupStats"]
