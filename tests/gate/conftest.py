"""Fixtures of the gate tests: the tiny Llama (config only, or built and served by the CPU engine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


def _tiny_model_module():
    spec = importlib.util.spec_from_file_location("kvplan_gate_tiny_model", HERE / "tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny_model = _tiny_model_module()


@pytest.fixture()
def tiny_llama_config(tmp_path) -> Path:
    """A folder with the tiny Llama's config.json only: enough for the planner."""
    return tiny_model.write_tiny_llama_config(tmp_path / "tiny-llama")
