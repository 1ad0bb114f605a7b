"""Speed and figures of the two-tier model (kvplan.plan.tier_cache) on bench_working_set's 100,000-request
Mooncake-shaped trace: the GPU pool and vLLM 0.32's native CPU tier behind it, requests one at a time.
Prints the figures; asserts nothing.

    python benchmarks/bench_tier_cache.py [--requests 100000] [--block-size 16] [--pool 200000]
                                          [--tier 1000000] [--size]   # --size: bisect the tier for 50/90/99%
"""

from __future__ import annotations

import argparse
import time

from bench_working_set import trace

from kvplan.plan.prefix_cache import traffic_working_set
from kvplan.plan.tier_cache import simulate_tiers, tier_curve, traffic_tier_requests


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--pool", type=int, default=200_000, help="GPU usable blocks")
    ap.add_argument("--tier", type=int, default=1_000_000, help="CPU tier chunks")
    ap.add_argument("--blocks-per-chunk", type=int, default=1)
    ap.add_argument("--size", action="store_true", help="also find the tier for 50/90/99%% (many simulations)")
    args = ap.parse_args()
    B = args.block_size
    traffic = trace(args.requests)
    t0 = time.perf_counter()
    reqs = traffic_tier_requests(traffic, B)
    print(f"trace: {traffic.describe()}; hashed in {time.perf_counter() - t0:.1f} s")
    ws = traffic_working_set(traffic, B)
    t0 = time.perf_counter()
    res = simulate_tiers(reqs, B, args.pool, args.tier, args.blocks_per_chunk)
    took = time.perf_counter() - t0
    print(f"two tiers (GPU {args.pool:,} blocks, tier {args.tier:,} chunks of {args.blocks_per_chunk}): {took:.1f} s; "
          f"GPU hits {res.rate(res.gpu_hit_tokens):.1%} (working set: {ws.hit_rate(args.pool):.1%}), tier hits "
          f"{res.rate(res.tier_hit_tokens):.1%}, computed {res.rate(res.missed_tokens):.1%}; {res.stored_chunks:,} "
          f"chunks stored, {res.evicted_chunks:,} evicted, {res.failed_stores:,} failed stores, "
          f"{res.distinct_chunks:,} distinct")
    if args.size:
        t0 = time.perf_counter()
        curve = tier_curve(reqs, B, args.pool, args.tier, args.blocks_per_chunk)
        print(f"unbounded tier hits {curve.unbounded.rate(curve.unbounded.tier_hit_tokens):.1%}; tier for 50/90/99%: "
              + " / ".join(f"{v:,}" for v in curve.tier_for_share.values())
              + f" chunks ({time.perf_counter() - t0:.0f} s, {len(curve.points)} simulations)")


if __name__ == "__main__":
    main()
