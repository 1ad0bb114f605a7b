"""Shared test setup: no network but loopback, no user state."""

import os
import tempfile

# Set before anything imports kvplan or huggingface_hub: tests never reach the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_CACHE", tempfile.mkdtemp(prefix="kvplan-hf-cache-"))
# User calibration profiles must not leak into tests.
os.environ["KVPLAN_CONFIG_DIR"] = tempfile.mkdtemp(prefix="kvplan-config-")


import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def pinned_cpu_engine(tmp_path_factory):
    """One real vLLM CPU engine (the tiny model, the pool pinned to 17 blocks of 32, context 512) for
    every test module that only sends it requests: started once a session (~25 s on 2 cores), stopped
    by PID at the end. Each bench run sends prompts no other run shares (a nonce per run), and reads
    counter deltas, so the modules cannot see each other's traffic."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
    from bench_helpers import cpu_engine_fixture

    yield from cpu_engine_fixture(tmp_path_factory)
