"""Running models: the step runner (static buffers, padding, KV cache), sampling, the scheduler (continuous
batching), the engine loop and the offline API."""

from reference.engine.llm import LLM
from reference.engine.llm_engine import LLMEngine
from reference.engine.requests import CompletionOutput, RequestOutput
from reference.engine.runner import ModelRunner, StartupStats
from reference.engine.sampling import SamplingParams

__all__ = ["LLM", "LLMEngine", "CompletionOutput", "ModelRunner", "RequestOutput", "SamplingParams", "StartupStats"]
