"""Wall time and imports of a cold `kvplan size` process (goal: under 0.25 s on 2 cores).

Each run is a fresh interpreter, as a user's shell starts it, offline on a bundled profile.
Prints the median and spread of the whole-process wall time, the biggest imports
(`python -X importtime`), and whether any heavy module (torch, vllm, transformers) was imported.

    python benchmarks/bench_size.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ARGS = ["size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "4090"]
HEAVY = ("torch", "vllm", "transformers", "aiohttp", "matplotlib")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="time the --json output path instead")
    opts = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "kvplan", *ARGS] + (["--json"] if opts.json else [])
    subprocess.run(cmd, env=env, capture_output=True)  # compile .pyc files once
    times = []
    for _ in range(opts.runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True)
        times.append(time.perf_counter() - start)
        if proc.returncode not in (0, 1):
            sys.exit(f"kvplan size failed: {proc.stderr.decode()}")
    baseline = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env)
        baseline.append(time.perf_counter() - start)

    trace = subprocess.run([sys.executable, "-X", "importtime", *cmd[1:]], env=env, capture_output=True, text=True)
    rows = []
    for line in trace.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if not cumulative.strip().isdigit():  # the header line
            continue
        if name.startswith("  "):  # nested imports are indented further: keep top-level only
            continue
        rows.append((int(cumulative.strip()), name.strip()))
    all_names = {line.split("|")[-1].strip().split(".")[0] for line in trace.stderr.splitlines() if "|" in line}

    print(f"kvplan {' '.join(ARGS)}{' --json' if opts.json else ''}  ({opts.runs} cold processes, {os.cpu_count()} CPUs)")
    print(f"  wall time   median {statistics.median(times):.3f} s  min {min(times):.3f} s  max {max(times):.3f} s")
    print(f"  python -c pass     {statistics.median(baseline):.3f} s (interpreter start-up alone)")
    print("  largest top-level imports (cumulative ms):")
    for micros, name in sorted(rows, reverse=True)[:8]:
        print(f"    {micros / 1000:7.1f}  {name}")
    print(f"  heavy modules imported: {', '.join(sorted(all_names & set(HEAVY))) or 'none'}")


if __name__ == "__main__":
    main()
