"""Fixtures of the gate tests: the tiny Llama (tests/fixtures/tiny-llama, or its config alone)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


TINY_LLAMA = HERE.parent / "fixtures" / "tiny-llama"  # built by tests/fixtures/build_tiny_llama.py


@pytest.fixture()
def tiny_llama_config(tmp_path) -> Path:
    """A folder with the tiny Llama's config.json only: enough for the planner."""
    out = tmp_path / "tiny-llama"
    out.mkdir()
    shutil.copyfile(TINY_LLAMA / "config.json", out / "config.json")
    return out
