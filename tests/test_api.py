"""kvplan.api (issue 27): the command line's plans from Python, as typed records."""

from __future__ import annotations

import json

import pytest
from helpers.harness import invoke

from kvplan.api import EnginePool, KvplanError, SizePlan, size, size_engines


def test_size_is_the_plan_kvplan_size_prints():
    plan = size("meta-llama/Llama-3.1-8B", gpu="4090", ctx="32k", source="bundled")
    assert isinstance(plan, SizePlan)
    # 32 layers x 2 (K, V) x 8 KV heads x 128 x 2 B, from the config by hand
    assert plan.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131_072
    assert plan.max_model_len == 32_768
    cli = json.loads(invoke("size", "meta-llama/Llama-3.1-8B", "--gpu", "4090", "--ctx", "32k", "--source", "bundled",
                            "--json").stdout)
    for key in ("num_blocks", "kv_cache_tokens", "max_concurrency", "fits", "verdict", "vllm_serve_command"):
        assert cli[key] == getattr(plan, key), key


def test_engine_arguments_by_vllm_s_names():
    plan = size("Qwen/Qwen3-8B", gpu="2xH100", ctx=16384, tensor_parallel_size=2, kv_cache_dtype="fp8",
                kv_cache_memory_bytes="10GiB", source="bundled")
    # 36 layers x 2 x (8 KV heads / TP 2) x 128 x 1 B (fp8) = 36,864 B a token per GPU
    assert plan.kv_bytes_per_token_per_device == 36_864
    assert plan.available_kv_bytes == 10 * 2**30
    assert "--tensor-parallel-size 2" in plan.vllm_serve_command and "--kv-cache-dtype fp8" in plan.vllm_serve_command


def test_bad_input_raises_the_command_line_s_error():
    with pytest.raises(KvplanError, match="unknown engine argument"):
        size("meta-llama/Llama-3.1-8B", gpu="H100", tensor_paralel_size=2)
    with pytest.raises(KvplanError, match="context length"):
        size("meta-llama/Llama-3.1-8B", gpu="H100", ctx="32q")
    with pytest.raises(KvplanError, match="unknown engine"):
        size_engines("meta-llama/Llama-3.1-8B", gpu="H100", engines=("tgi",))


def test_size_engines_gives_one_pool_per_engine():
    pools = size_engines("meta-llama/Llama-3.1-8B", gpu="4090", ctx="32k", engines=("vllm",), source="bundled")
    (pool,) = pools
    assert isinstance(pool, EnginePool) and pool.engine == "vllm"
    plan = size("meta-llama/Llama-3.1-8B", gpu="4090", ctx="32k", source="bundled")
    # 64-token pages: CacheConfig.DEFAULT_BLOCK_SIZE = 64 in vLLM 0.34.0 (config/cache.py@0.34.0:185; 16 before)
    assert (pool.pool_tokens, pool.pool_pages, pool.page_tokens) == (plan.kv_cache_tokens, plan.num_blocks, 64)
