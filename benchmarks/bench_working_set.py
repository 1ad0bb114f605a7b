"""Speed of the prefix-cache predictions on a large trace (issue 23's goals: the working-set curve of a
100,000-request trace in <= 2 s on one core, its full simulation in <= 10 s).

The trace is Mooncake-shaped (kvplan.traffic.samples.make_samples' reuse, scaled): 512-token hash
blocks, a few hundred shared system prompts of 1-6 blocks, a third of the requests extending an
earlier one, the rest a fresh tail; 600-8,000 prompt tokens, 20-400 output tokens; timestamps
100 ms apart on average. Prints the figures; asserts nothing (speed goals live here, not in tests).

    python benchmarks/bench_working_set.py [--requests 100000] [--block-size 16] [--simulate [--prior] [--digest]]

The simulation's steps take 5 ms plus 2 us a prompt token (a lambda: a black box to the simulator); with ``--prior``,
the step-time model `kvplan bench` and `kvplan fit` predict with: the prior of Llama-3.1-8B on one H100 SXM (bundled
profile, context 16k; kvplan.plan.steptime.model_for), which prices a steady decode step without its batch.

``--digest`` prints a SHA-256 of every field of the simulation's result (floats as hex): a speed-up must leave it
unchanged, bit for bit (run it on both commits).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import random
import time

from kvplan.deploy import load_model, select_gpus
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.overhead import load_overhead
from kvplan.plan.prefix_cache import traffic_load, traffic_working_set
from kvplan.plan.schema import Settings
from kvplan.plan.simulate import SchedulerConfig, simulate
from kvplan.plan.steptime import StepTimeModel, model_for
from kvplan.traffic.model import Segment, Traffic, Turn
from kvplan.vllm.rules import rules_for


def trace(n: int, seed: int = 0) -> Traffic:
    rng = random.Random(seed)
    systems = [[f"sys{i}b{k}" for k in range(rng.randint(1, 6))] for i in range(300)]
    earlier: list[list[str]] = []
    turns, t, fresh = [], 0.0, 0
    for i in range(n):
        if earlier and rng.random() < 1 / 3:
            keys = list(rng.choice(earlier[-2000:]))
        else:
            keys = list(rng.choice(systems))
        want = rng.randint(600, 8000)
        while len(keys) * 512 < want:
            keys.append(f"t{fresh}")
            fresh += 1
        keys = keys[: -(-want // 512)]
        earlier.append(keys)
        segs = [Segment(k, 512) for k in keys[:-1]] + [Segment(keys[-1], want - 512 * (len(keys) - 1))]
        t += rng.expovariate(10.0)
        turns.append(Turn(f"r{i}", 0, tuple(segs), rng.randint(20, 400), arrival_s=t))
    return Traffic(tuple(turns), "synthetic Mooncake-shaped trace")


def prior_model() -> StepTimeModel:
    """The prior step-time model of Llama-3.1-8B (bundled profile) on one H100 SXM at a 16k context."""
    arch = load_model("meta-llama/Llama-3.1-8B", source="bundled").arch
    cap = compute_capacity(arch, select_gpus("H100-SXM").device, Settings(max_model_len=16384), rules_for(None),
                           load_overhead())
    return model_for(cap)


def result_digest(res) -> str:
    """SHA-256 over every field of a SimResult, in order, floats by their bits (``float.hex``); ``pool_after`` (the
    state a warm start carries on, None on this cold start) is no figure of the result and stays out."""
    h = hashlib.sha256()

    def text(value) -> str:
        if isinstance(value, float):
            return value.hex()
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(map(text, value)) + "]"
        if dataclasses.is_dataclass(value):
            return type(value).__name__ + text([getattr(value, f.name) for f in dataclasses.fields(value)])
        return repr(value)

    for f in dataclasses.fields(res):
        if f.name == "pool_after":
            continue
        for item in (getattr(res, f.name) if f.name in ("requests", "kv_fill", "step_batches") else [getattr(res, f.name)]):
            h.update(text(item).encode())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--pool", type=int, default=200_000, help="usable blocks for the simulation")
    ap.add_argument("--simulate", action="store_true", help="also time the full simulation (slow)")
    ap.add_argument("--digest", action="store_true", help="with --simulate: a SHA-256 of the whole result")
    ap.add_argument("--prior", action="store_true", help="with --simulate: the prior step-time model of Llama-3.1-8B "
                                                         "on an H100 SXM, not 5 ms + 2 us a prompt token")
    args = ap.parse_args()
    t0 = time.perf_counter()
    traffic = trace(args.requests)
    print(f"trace: {traffic.describe()} (built in {time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    ws = traffic_working_set(traffic, args.block_size)
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    pools = [ws.pool_for(share) for share in (0.5, 0.9, 0.99)]
    pools_took = time.perf_counter() - t0
    print(f"working set: {took:.2f} s for {ws.requests:,} requests ({len(ws.distances):,} reused runs); achievable "
          f"hit rate {ws.achievable_blocks * args.block_size / ws.queried_tokens:.1%}; pools for 50/90/99%: "
          f"{pools[0]:,} / {pools[1]:,} / {pools[2]:,} blocks ({pools_took:.3f} s)")
    if args.simulate:
        step_time = prior_model() if args.prior else lambda b: 0.005 + 2e-6 * b.prefill_tokens
        t0 = time.perf_counter()
        load = traffic_load(traffic, args.block_size, time_scale=1.0)
        built = time.perf_counter() - t0
        res = simulate(SchedulerConfig(num_blocks=args.pool + 1, block_size=args.block_size,
                                       max_num_batched_tokens=8192, max_num_seqs=256), load,
                       step_time=step_time)
        print(f"simulation: {time.perf_counter() - t0:.1f} s ({built:.1f} s hashing the prompts), {res.steps:,} steps, "
              f"hit rate {res.prefix_hit_rate:.1%}, {res.preemptions} preemptions")
        if args.digest:
            print(f"result digest: {result_digest(res)}")


if __name__ == "__main__":
    main()
