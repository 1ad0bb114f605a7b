"""The load generator's own ceiling: streamed tokens/s it can take in on one CPU core.

A trivial streaming server (a separate process, pinned to another core when there is one) answers
every /v1/completions with its whole SSE stream prepared in advance and written at once, one
``data:`` event per token, so all the per-token work is on the client side: kvplan's closed-loop
generator (kvplan.bench.loadgen.run_closed_loop), pinned to core 0, parsing each event and
timestamping it. Prints tokens/s and the client's CPU use per concurrency.

    python benchmarks/bench_loadgen_ceiling.py [--tokens 256] [--streams 1,16,64,256] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def serve(port: int, tokens: int, ready) -> None:
    """The trivial server: the same prepared stream for every request."""
    from aiohttp import web

    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:
        os.sched_setaffinity(0, {1})
    chunk = "data: " + json.dumps({"choices": [{"index": 0, "text": "tok", "finish_reason": None}]}) + "\n\n"
    tail = "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": tokens}})
    body = (chunk * tokens + tail + "\n\ndata: [DONE]\n\n").encode()

    async def completions(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(body)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)

    async def main():
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def measure(url: str, streams: int, seconds: float, tokens: int) -> tuple[float, float, int]:
    """(tokens/s, client CPU share of one core, requests) for one concurrency."""
    from kvplan.bench.loadgen import run_closed_loop
    from kvplan.bench.workload import Workload

    w = Workload(prompt_tokens=8, output_tokens=tokens, nonce="ceiling")
    # Enough requests per stream for about `seconds` at the single-stream rate seen in a probe.
    probe = asyncio.run(run_closed_loop(url, "m", "completions", 1, 3, w.request))
    per_request_s = max(1e-4, probe.wall_s / 3)
    per_stream = max(2, int(seconds / per_request_s / max(1, streams / 4)))
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    result = asyncio.run(run_closed_loop(url, "m", "completions", streams, per_stream, w.request))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    ok = [r for r in result.records if r.ok]
    chunks = sum(len(r.chunk_times_s) for r in ok)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return chunks / result.wall_s, cpu / result.wall_s, len(ok)


def main() -> None:
    from kvplan.bench.engine import free_port

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256, help="tokens (SSE events) per response")
    ap.add_argument("--streams", default="1,16,64,256")
    ap.add_argument("--seconds", type=float, default=5.0, help="rough length of each level")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    port = free_port()
    ready = mp.Event()
    server = mp.Process(target=serve, args=(port, args.tokens, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(20):
            raise SystemExit("the trivial server did not start")
        url = f"http://127.0.0.1:{port}"
        print(f"kvplan load generator ceiling: {args.tokens} tokens per response, client on 1 core "
              f"(os.cpu_count() = {os.cpu_count()})")
        print(f"{'streams':>8} {'requests':>9} {'tokens/s':>10} {'client CPU':>11}")
        for streams in (int(x) for x in args.streams.split(",")):
            rate, cpu, n = measure(url, streams, args.seconds, args.tokens)
            print(f"{streams:>8} {n:>9} {rate:>10,.0f} {cpu:>10.0%}")
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
