"""Time the bench's closed-loop onset prediction on a hybrid KV cache (kvplan.plan.hybrid_rule) at a GPU's pool:
gpt-oss-20b's groups (a 128-token sliding window beside full attention, blocks of 16), 60,000 blocks, a token
budget of 8,192, 512 + 128 tokens a request, 1 and 3 requests a stream (bench's default of 100 requests a point
gives 1 a stream above 100 streams). ``--state``: a Qwen3-Next-like layout instead (full attention beside a GDN
state group with Mamba-2's checkpoint page, blocks of 64). Prints the onsets, the levels simulated and the time;
asserts nothing.

    python benchmarks/bench_hybrid_onsets.py [--blocks 60000] [--prompt 512] [--output 128] [--state]
"""

from __future__ import annotations

import argparse
import time

from kvplan.plan.hybrid_cache import FULL, MAMBA, SLIDING, CacheGroup, HybridGroups
from kvplan.plan.hybrid_rule import HybridRule
from kvplan.plan.simulate import Lengths, SchedulerConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=60_000)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--state", action="store_true", help="full attention beside a recurrent-state group, blocks of 64")
    args = ap.parse_args()
    if args.state:
        groups = HybridGroups((CacheGroup(FULL), CacheGroup(MAMBA, checkpoint=True)), 64, 8192, 8192)
    else:
        groups = HybridGroups((CacheGroup(SLIDING, 128), CacheGroup(FULL)), 16, 8192, 8192)
    config = SchedulerConfig(num_blocks=args.blocks, block_size=groups.block_size, max_num_batched_tokens=8192)
    for per_stream in (1, 3):
        t0 = time.perf_counter()
        rule = HybridRule(config, groups, Lengths(args.prompt, args.output), args.prompt, args.output,
                          lambda c, k=per_stream: k)
        took = time.perf_counter() - t0
        print(f"{per_stream} a stream: first KV wait {rule.first_kv_wait}, first preemption {rule.first_preemption}, "
              f"{len(rule.results)} levels simulated, {rule.request_steps:,} request-steps, {took:.1f} s")


if __name__ == "__main__":
    main()
