"""Inference engines kvplan sizes, one module each (see base.py); importing the package registers them all."""

from kvplan.engines import sglang, trtllm, vllm  # noqa: F401  (registers)
from kvplan.engines.base import ENGINES, Engine, EngineCapacity, EngineOptions, EnginePool, EnginePools, engine_named

__all__ = ["ENGINES", "Engine", "EngineCapacity", "EngineOptions", "EnginePool", "EnginePools", "engine_named"]
