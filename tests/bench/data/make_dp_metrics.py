"""Regenerate tests/bench/data/data-parallel/: the /metrics text of a real data-parallel vLLM server (one API server,
``--data-parallel-size 2``: two engine cores, each with its own KV pool) before, during and after a load that makes
one engine, not the other, preempt and wait.

    python tests/bench/data/make_dp_metrics.py            # starts the server (about a minute on 2 cores)
    python tests/bench/data/make_dp_metrics.py --url URL  # or reads one already serving the tiny model so

It starts the tiny Llama of tests/fixtures on vLLM's CPU build with the pool the engine tests pin (17 blocks of 32
tokens per engine: tests/helpers/bench.py), ``--data-parallel-size 2`` and ``--served-model-name tiny-llama``,
scrapes /metrics (``before.prom``), sends 3 requests at once to /v1/completions (prompts of 160 distinct token ids,
160 output tokens, ignore_eos), scrapes every 50 ms while they run and keeps the scrape with the most requests
waiting (``during.prom``), then scrapes once they have all ended (``after.prom``; a load during which no scrape saw
a request waiting is sent again, up to 5 times), and stops the server by its PID. By the block rule, two requests on
one engine are admitted (6 blocks each) and then outgrow its 16 usable blocks (10 blocks each at 320 tokens): that
engine preempts one and it waits; the engine with one request does neither. vLLM's DP coordinator chooses which
engine gets two (vllm/v1/engine/core_client.py@0.32.0, DPLBAsyncMPClient.get_core_engine_for_request)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "data-parallel"
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for helpers

from helpers.bench import BLOCK_SIZE, POOL_BLOCKS, TINY_MODEL, kill_group  # noqa: E402

from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port  # noqa: E402
from kvplan.vllm.args import EngineArgs  # noqa: E402

PROMPT_TOKENS, OUTPUT_TOKENS, REQUESTS = 160, 160, 3


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - loopback
        return resp.read().decode()


def complete(base: str, model: str, k: int) -> None:
    prompt = [10 + (331 * k + j) % 1000 for j in range(PROMPT_TOKENS)]  # ids < 1,024, distinct per request: no prefix shared
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310
        resp.read()


def waiting(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_waiting{"))


def record(base: str, tries: int = 5) -> None:
    """One load, recorded; again (the counters read afresh) when no scrape caught a request waiting."""
    model = json.loads(get(base + "/v1/models"))["data"][0]["id"]
    for _ in range(tries):
        before = get(base + "/metrics")
        threads = [threading.Thread(target=complete, args=(base, model, k)) for k in range(REQUESTS)]
        for t in threads:
            t.start()
        peak, peak_text = 0.0, ""
        while any(t.is_alive() for t in threads):
            text = get(base + "/metrics")
            if waiting(text) > peak:
                peak, peak_text = waiting(text), text
            time.sleep(0.05)
        for t in threads:
            t.join()
        time.sleep(1.0)  # the engines' last stats reach the API server's logger
        if peak_text:
            OUT.mkdir(exist_ok=True)
            (OUT / "before.prom").write_text(before)
            (OUT / "during.prom").write_text(peak_text)
            (OUT / "after.prom").write_text(get(base + "/metrics"))
            print(f"recorded: {peak:g} waiting at the peak scrape")
            return
    raise SystemExit(f"no scrape caught a request waiting in {tries} loads")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", help="a data-parallel server of the tiny model already running")
    url = parser.parse_args().url
    if url:
        record(url.rstrip("/"))
        return
    import tempfile

    cfg = EngineConfig(model=str(TINY_MODEL), port=free_port(),
                       args=EngineArgs(block_size=BLOCK_SIZE, num_gpu_blocks_override=POOL_BLOCKS,
                                       kv_cache_memory_bytes=64 * 2**20, max_model_len=512, enforce_eager=True),
                       env=(("HF_HUB_OFFLINE", "1"),), extra_args=("--data-parallel-size", "2", "--served-model-name", "tiny-llama"))
    with tempfile.TemporaryDirectory() as tmp:
        launcher = EngineLauncher(cfg, Path(tmp) / "engine.log", startup_timeout_s=600)
        launcher.start()
        try:
            launcher.wait_ready()
            record(cfg.base_url)
        finally:
            launcher.stop()
            kill_group(launcher.pid)


if __name__ == "__main__":
    main()
