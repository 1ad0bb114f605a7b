"""Tiny-twin probes: ask the installed vLLM for its own KV-cache layout of a model config."""
