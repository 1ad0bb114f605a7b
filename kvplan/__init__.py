"""kvplan: KV-cache capacity planner and benchmark harness for vLLM deployments."""

__version__ = "0.1.0"
