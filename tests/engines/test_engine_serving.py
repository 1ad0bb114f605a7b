"""The bench's half of the engine door (kvplan.engines): each engine gives the command that starts its server, or
says in one line that kvplan does not launch it, and reads the pool its start-up log reports. Expected figures are
the logs' own printed lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.bench.engine import EngineConfig, build_command
from kvplan.engines import ENGINES, engine_named
from kvplan.engines.base import EngineCapacity
from kvplan.errors import KvplanError
from kvplan.vllm.args import EngineArgs

DATA = Path(__file__).parent / "data"
FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_every_engine_answers_the_bench():
    for name, eng in ENGINES.items():
        for method in ("size", "server_command", "capacity_from_log", "capacity_from_metrics"):
            assert callable(getattr(eng, method, None)), (name, method)
        assert eng.capacity_from_log("no engine printed this") == EngineCapacity(), name


def test_vllms_server_command_is_its_flags_after_the_server():
    args = EngineArgs(block_size=32, num_gpu_blocks_override=17, enforce_eager=True)
    cmd = engine_named("vllm").server_command("org/m", "127.0.0.1", 8001, "chat", args, ["vllm", "serve"])
    assert cmd == ["vllm", "serve", "--model", "org/m", "--host", "127.0.0.1", "--port", "8001",
                   "--served-model-name", "chat", "--block-size", "32", "--num-gpu-blocks-override", "17",
                   "--enforce-eager"]


@pytest.mark.parametrize("name", ["sglang", "trtllm"])
def test_an_engine_kvplan_does_not_launch_says_so(name):
    with pytest.raises(KvplanError, match="does not launch"):
        build_command(EngineConfig(model="org/m", engine=name), ["python"])


def test_sglangs_pool_from_its_log():
    """QwQ-32B on 4 x L4 under SGLang 0.4.3: 'max_total_num_tokens=46611' (pages of 1 token, its default)."""
    cap = engine_named("sglang").capacity_from_log((DATA / "sglang-0.4.3-qwq32b-4xL4.log").read_text())
    assert (cap.kv_cache_tokens, cap.block_size, cap.num_blocks, cap.source) == (46611, 1, 46611, "log")


def test_trtllms_pool_from_its_log():
    """gpt-oss-120b on a DGX Spark: the last 'Allocated 5.95 GiB for max tokens in paged KV cache (86720)' is the
    pool (the first, 8224, is the estimation pass's); 'Number of tokens per block: 32' -> 86,720 / 32 = 2,710."""
    cap = engine_named("trtllm").capacity_from_log((DATA / "trtllm-1.1.0rc3-gpt-oss-120b-dgx-spark.log").read_text())
    assert (cap.kv_cache_tokens, cap.block_size, cap.num_blocks) == (86720, 32, 2710)


def test_vllms_pool_from_its_cpu_engine_log():
    """The CPU engine's own start-up log (tests/fixtures): 'CPU KV cache size: 544 tokens, Maximum concurrency for
    512 tokens per request: 1.06x' with block_size 32 in its args: 544 / 32 = 17 blocks (its override)."""
    cap = engine_named("vllm").capacity_from_log((FIXTURES / "vllm-0.32.0-cpu-startup.log").read_text())
    assert (cap.kv_cache_tokens, cap.block_size, cap.num_blocks, cap.max_concurrency) == (544, 32, 17, 1.06)
