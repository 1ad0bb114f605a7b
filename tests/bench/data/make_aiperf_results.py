"""Regenerate tests/bench/data/aiperf/: AIPerf's own result files, from AIPerf run against the real vLLM CPU engine.

AIPerf is not a kvplan dependency (nor a test one): install it in a venv of its own and name its executable.

    python3.11 -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf==0.13.0
    AIPERF=/tmp/aiperf/bin/aiperf python tests/bench/data/make_aiperf_results.py

It starts the engine the engine tests use (the tiny Llama of tests/fixtures, the pool pinned to 17 blocks of 32
tokens: tests/helpers/bench.py), runs ``aiperf profile`` twice against it, at 2 concurrent requests and at 4
requests/s (Poisson arrivals, AIPerf's default), prompts of 64 tokens and outputs of 16, streamed from
/v1/completions, then copies each run's ``profile_export_aiperf.json`` (and its server-metrics export) here as they
were written, and stops the engine by its PID."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for helpers

from helpers.bench import BLOCK_SIZE, POOL_BLOCKS, TINY_MODEL, kill_group  # noqa: E402

from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port  # noqa: E402
from kvplan.vllm.args import EngineArgs  # noqa: E402

RUNS = {"concurrency-2": ("--concurrency", "2"), "rate-4": ("--request-rate", "4")}


def main() -> None:
    aiperf = os.environ["AIPERF"]
    work = Path(tempfile.mkdtemp(prefix="aiperf-samples-"))
    cfg = EngineConfig(model=str(TINY_MODEL), port=free_port(),
                       args=EngineArgs(block_size=BLOCK_SIZE, num_gpu_blocks_override=POOL_BLOCKS,
                                       kv_cache_memory_bytes=64 * 2**20, max_model_len=512, enforce_eager=True),
                       env=(("HF_HUB_OFFLINE", "1"),))
    launcher = EngineLauncher(cfg, work / "engine.log", startup_timeout_s=600)
    launcher.start()
    try:
        launcher.wait_ready()
        # AIPerf 0.13.0 looks a tokenizer up in the hub's cache when HF_HUB_OFFLINE is set, and fails on a local
        # folder (aiperf/common/tokenizer.py _from_pretrained_local); without it a local path loads from disk
        aiperf_env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        for name, load in RUNS.items():
            out = work / name
            subprocess.run([aiperf, "profile", "--model", str(TINY_MODEL), "--url", cfg.base_url,
                            "--endpoint-type", "completions", "--streaming", "--tokenizer", str(TINY_MODEL),
                            "--isl", "64", "--isl-stddev", "0", "--osl", "16", "--osl-stddev", "0",
                            "--request-count", "24", "--warmup-request-count", "2", "--random-seed", "1",
                            "--ui-type", "none", "--no-gpu-telemetry", *load, "--artifact-dir", str(out)],
                           check=True, timeout=600, env=aiperf_env)
            dest = HERE / "aiperf" / name
            dest.mkdir(parents=True, exist_ok=True)
            for f in out.rglob("*.json"):
                if f.name in ("profile_export_aiperf.json", "server_metrics_export.json"):
                    shutil.copy(f, dest / f.name)
    finally:
        launcher.stop()
        kill_group(launcher.pid)


if __name__ == "__main__":
    main()
