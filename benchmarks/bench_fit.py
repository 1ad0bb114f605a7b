"""How many candidate deployments `kvplan fit`'s search evaluates per second (goal: >= 10,000 in < 1 s).

    python benchmarks/bench_fit.py [MODEL]

Searches the whole GPU catalog, 1-8 GPUs, every TP x PP x DP split, auto and fp8 KV, and the
context caps of a 32k context for 64 requests of 2k + 512 tokens; prints candidates, seconds, rate.
"""

from __future__ import annotations

import sys
import time

from kvplan.deploy import load_model
from kvplan.hardware.catalog import load_catalog
from kvplan.plan.fit import FitRequest, search
from kvplan.plan.overhead import load_overhead
from kvplan.vllm.rules import rules_for


def main(argv: list[str]) -> None:
    names = argv or ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "Qwen/Qwen3-32B"]
    devices = list(load_catalog()[0].values())
    rules, overhead = rules_for(None), load_overhead()
    for name in names:
        model = load_model(name, None, "bundled", True, {})
        req = FitRequest(ctx=32768, concurrency=64, prompt=2048, output=512, max_gpus=8)
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            res = search(model.arch, devices, req, rules, overhead, model.weights_total)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        print(f"{name}: {res.evaluated:,} candidates ({len(res.fitting):,} fit) over {len(devices)} GPUs "
              f"in {best:.3f} s = {res.evaluated / best:,.0f} candidates/s")


if __name__ == "__main__":
    main(sys.argv[1:])
