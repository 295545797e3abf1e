"""Model definitions: toy models for structure tests and real architectures built from transformers configs."""
