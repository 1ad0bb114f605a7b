"""Inference engines kvplan sizes, one module each (see base.py); importing the package registers them all."""

from kvplan.engines import vllm  # noqa: F401  (registers)
from kvplan.engines.base import ENGINES, Engine, EnginePool, engine_named

__all__ = ["ENGINES", "Engine", "EnginePool", "engine_named"]
