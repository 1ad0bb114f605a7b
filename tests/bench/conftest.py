"""Fixtures of the bench tests: one real CPU engine per module that asks for it."""

from __future__ import annotations

import pytest
from bench_helpers import cpu_engine_fixture


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    """One real vLLM CPU engine for a test module, pinned to POOL_BLOCKS x BLOCK_SIZE."""
    yield from cpu_engine_fixture(tmp_path_factory)
