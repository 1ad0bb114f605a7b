"""How long `kvplan check` takes on a spec of 100 deployments (goal: under 1 s).

    python benchmarks/bench_check.py [--deployments 100] [--repeat 3]

Writes a spec of N deployments (bundled models, catalog GPUs, a mix that fits and that does
not, with and without headroom and shared prefixes) to a temporary folder, then prints:
- in-process: reading + validating the spec, and planning every deployment (best of --repeat);
- the whole command, `kvplan check spec.yaml --json`, in a fresh interpreter (includes Python's
  start-up and imports), best of --repeat.
Offline: HF_HUB_OFFLINE=1, bundled profiles only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

MODELS = [
    "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B", "google/gemma-3-27b-it", "mistralai/Mistral-7B-Instruct-v0.3",
    "Qwen/Qwen2.5-7B-Instruct", "openai/gpt-oss-20b", "meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen2.5-32B",
    "deepseek-ai/DeepSeek-V2-Lite", "Qwen/Qwen3-30B-A3B",
]
GPUS = ["H100", "2xH100", "A100-80GB", "L4", "H200", "4xH100", "RTX 4090", "A10G"]
CONTEXTS = ["4k", "8k", "16k", "32k"]


def write_spec(path: Path, n: int) -> None:
    lines = ['defaults:\n  vllm_version: "0.11.0"\ndeployments:\n']
    for i in range(n):
        gpu = GPUS[i % len(GPUS)]
        count = int(gpu.split("x")[0]) if "x" in gpu[:2] else 1
        lines.append(
            f"  - name: d{i:03d}\n"
            f"    model: {MODELS[i % len(MODELS)]}\n"
            f"    gpu: {gpu}\n"
            f"    tp: {count}\n"
            f"    context: {CONTEXTS[i % len(CONTEXTS)]}\n"
            f"    concurrency: {1 + (i * 7) % 48}\n"
            f"    prompt: 2k\n"
            f"    output: 512\n"
            + ("    shared_prefix: 1k\n" if i % 3 == 0 else "")
            + ("    headroom: 0.1\n" if i % 4 == 0 else "")
        )
    path.write_text("".join(lines))


def in_process(spec: Path) -> tuple[float, float, int, int]:
    from kvplan.gate.check import check_spec
    from kvplan.gate.spec import load_spec

    t0 = time.perf_counter()
    parsed = load_spec(spec)
    t1 = time.perf_counter()
    report = check_spec(parsed)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, report.total, report.passed


def whole_command(spec: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvplan", "check", str(spec), "--json"],
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"kvplan check failed ({proc.returncode}): {proc.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "kvplan.yaml"
        write_spec(spec, args.deployments)
        t_import = time.perf_counter()
        import kvplan.gate.check  # noqa: F401  (import cost reported apart)
        t_import = time.perf_counter() - t_import
        runs = [in_process(spec) for _ in range(args.repeat)]
        first = runs[0]
        best = min(runs, key=lambda r: r[0] + r[1])
        cli = min(whole_command(spec) for _ in range(args.repeat))
    print(f"spec: {args.deployments} deployments ({best[3]} fit, {best[2] - best[3]} do not)")
    print(f"imports (kvplan.gate, pydantic, planner): {t_import:.3f} s")
    print(f"first run: read+validate {first[0]:.3f} s, plan {first[1]:.3f} s, total {first[0] + first[1]:.3f} s")
    print(f"best of {args.repeat}: read+validate {best[0]:.3f} s, plan {best[1]:.3f} s, total {best[0] + best[1]:.3f} s")
    print(f"whole command (fresh interpreter, `kvplan check --json`), best of {args.repeat}: {cli:.3f} s")
    goal = first[0] + first[1] + t_import
    print(f"goal < 1 s for imports + first run: {goal:.3f} s -> {'met' if goal < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
