"""Conformance tests: what the reference implementation promises, checked on CPU (and on CUDA where marked)."""
