"""Client TTFT (kvplan's load generator) against the server's own TTFT histogram.

Launches the vLLM CPU engine on the tiny test model (or attaches with --url), then for 1, 16 and
64 closed-loop streams compares the mean TTFT the client measured (first output chunk - scheduled
time) with the mean of ``vllm:time_to_first_token_seconds`` over the same requests (histogram
sum / count, delta over the level: exact, not bucket-limited). Goal: within 5%.

The server's clock starts when the API server has parsed the request and ends when the first
token leaves the engine; the client's also holds the HTTP round trip, the request parsing before
that and the SSE delivery, so the client is expected slightly above the server.

    python benchmarks/bench_ttft_vs_server.py [--streams 1,16,64] [--prompt 64] [--output 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_level(url: str, model: str, streams: int, per_stream: int, prompt: int, output: int, first: int,
              keep_alive: bool = True):
    from kvplan.bench.loadgen import run_closed_loop
    from kvplan.bench.metrics import scrape_once
    from kvplan.bench.stats import describe
    from kvplan.bench.workload import Workload

    w = Workload(prompt_tokens=prompt, output_tokens=output, nonce=str(time.time_ns()))
    before = asyncio.run(scrape_once(url))
    result = asyncio.run(run_closed_loop(url, model, "completions", streams, per_stream, w.request, first,
                                         keep_alive=keep_alive))
    time.sleep(0.2)  # the last request's stats reach the API server's registry
    after = asyncio.run(scrape_once(url))
    ok = [r for r in result.records if r.ok]
    client = describe([r.ttft_s for r in ok])
    server = after.histograms["ttft"].minus(before.histograms["ttft"])
    return len(ok), len(result.records), client, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="attach to this server instead of launching the CPU engine")
    ap.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "tiny-llama"))
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--no-keep-alive", action="store_true", help="one connection per request (default: reused)")
    ap.add_argument("--requests", type=int, default=128, help="about this many requests per level (>= 2 per stream)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port
    from kvplan.vllm.args import EngineArgs

    launcher = None
    url = args.url
    try:
        if url is None:
            log = Path(tempfile.mkdtemp(prefix="kvplan-ttft-")) / "engine.log"
            cfg = EngineConfig(model=args.model, port=free_port(),
                               args=EngineArgs(block_size=32, max_model_len=512, kv_cache_memory_bytes=256 * 2**20,
                                               enforce_eager=True),
                               env=(("HF_HUB_OFFLINE", "1"),))
            launcher = EngineLauncher(cfg, log, startup_timeout_s=900)
            launcher.start()
            took = launcher.wait_ready()
            url = cfg.base_url
            print(f"engine ready in {took:.0f} s (log {log}); 256 MiB KV pool: no KV waits at 64 streams")
        import json
        import urllib.request

        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        run_level(url, model, 8, 1, args.prompt, args.output, 10**6)  # warm-up, not shown
        print(f"prompt {args.prompt}, output {args.output}; TTFT in ms (client: from the scheduled time)")
        print(f"{'streams':>8} {'requests':>9} {'client mean':>12} {'server mean':>12} {'diff':>7} {'diff ms':>8} "
              f"{'client p50':>11} {'client p99':>11}")
        first = 2 * 10**6
        for streams in (int(x) for x in args.streams.split(",")):
            per_stream = max(2, args.requests // streams)
            ok, n, client, server = run_level(url, model, streams, per_stream, args.prompt, args.output, first,
                                              not args.no_keep_alive)
            first += n
            c, s = client["mean"], server.mean
            diff = (c - s) / s if c and s else float("nan")
            print(f"{streams:>8} {ok:>5}/{n:<3} {c * 1000:>12.2f} {s * 1000:>12.2f} {diff:>+7.1%} "
                  f"{(c - s) * 1000:>+8.2f} {client['p50'] * 1000:>11.2f} {client['p99'] * 1000:>11.2f}")
    finally:
        if launcher is not None:
            launcher.stop()


if __name__ == "__main__":
    main()
