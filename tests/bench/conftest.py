"""Fixtures of the bench tests: the session's real CPU engine for the modules that ask for it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cpu_engine(pinned_cpu_engine):
    """The session's real vLLM CPU engine, pinned to POOL_BLOCKS x BLOCK_SIZE (tests/conftest.py)."""
    return pinned_cpu_engine
