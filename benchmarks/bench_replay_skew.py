"""Send skew of a traffic replay (issue 23's goal: p99 <= 1 ms at 10,000 requests against a local trivial
server): how late kvplan.bench.loadgen.run_sessions sends each request after its timestamp.

The trivial streaming server of bench_loadgen_ceiling.py (a separate process, on another core when there is
one) answers each request with a short prepared stream. The traffic: N single-turn sessions at timestamps
drawn from a Poisson process of RATE requests/s (a Mooncake-style open-loop trace), prompts of 64 token ids.
Prints the skew's percentiles and the client's CPU use; asserts nothing.

    python benchmarks/bench_replay_skew.py [--requests 10000] [--rate 500] [--tokens 4]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from bench_loadgen_ceiling import serve

    from kvplan.bench.engine import free_port
    from kvplan.bench.loadgen import run_sessions
    from kvplan.bench.replay import request_specs, session_sends
    from kvplan.stats import percentile
    from kvplan.traffic.model import Segment, Traffic, Turn

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=500.0, help="requests per second")
    ap.add_argument("--tokens", type=int, default=4, help="output tokens a response streams")
    args = ap.parse_args()
    port = free_port()
    ready = mp.Event()
    server = mp.Process(target=serve, args=(port, args.tokens, ready), daemon=True)
    server.start()
    try:
        ready.wait(30)
        rng = random.Random(0)
        t, turns = 0.0, []
        for i in range(args.requests):
            t += rng.expovariate(args.rate)
            turns.append(Turn(f"r{i}", 0, (Segment("sys", 32), Segment(f"u{i}", 32)), args.tokens, arrival_s=t + 0.5))
        traffic = Traffic(tuple(turns), "synthetic open-loop trace")
        before = resource.getrusage(resource.RUSAGE_SELF)
        load = asyncio.run(run_sessions(f"http://127.0.0.1:{port}", "m", "completions", session_sends(traffic),
                                        request_specs(traffic, "bench"), request_timeout_s=30))
        after = resource.getrusage(resource.RUSAGE_SELF)
        skew = [max(0.0, r.sent_s - r.scheduled_s) * 1000 for r in load.records]
        ok = sum(r.ok for r in load.records)
        cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / load.wall_s
        print(f"{len(load.records):,} requests ({ok:,} ok) at {args.rate:g}/s over {load.wall_s:.1f} s; send skew ms: "
              f"p50 {percentile(skew, 50):.3f}, p99 {percentile(skew, 99):.3f}, max {max(skew):.3f}; client CPU "
              f"{cpu:.0%} of a core")
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
