"""Running models: the step runner (static buffers, padding, KV cache), sampling and the offline API."""

from reference.engine.runner import ModelRunner, StartupStats

__all__ = ["ModelRunner", "StartupStats"]
