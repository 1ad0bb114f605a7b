"""Wall time and imports of a cold `kvplan size` process, and the same input through vllm-wizard.

Each run is a fresh interpreter, as a user's shell starts it, offline on a bundled profile.
Prints the median and spread of the whole-process wall time, the biggest imports
(`python -X importtime`), and whether any heavy module (torch, vllm, transformers) was imported.

With ``--wizard PATH`` (the `vllm-wizard` executable of its own venv: ``python -m venv /tmp/vw &&
/tmp/vw/bin/pip install vllm-wizard==0.2.0``) it also runs ``vllm-wizard plan`` on the same config,
written to a local folder so that neither tool touches the network, in pairs (kvplan, wizard,
kvplan, ...), and prints the ratio of the medians (issue 8's goal: kvplan at most 0.6x) and of the
CPU times. The `kvplan` on PATH should be installed from a wheel in its own venv, as users get it
(an editable install adds its import hook to every start).

    python benchmarks/bench_size.py [--runs 20] [--wizard /tmp/vw/bin/vllm-wizard]

Measured 2026-12-01, Python 3.11, 2 CPUs shared with a vLLM CPU engine (load average 4-8, so wall
times are noisy), 20 pairs a run, wall (CPU) ratios. Before the start-up changes of that day (the
collector paused while the CLI starts, `size`'s annotations evaluated once), run alternately with
after: 0.52x (0.58x), 0.64x (0.61x), 0.52x (0.56x), 0.60x (0.55x), 0.58x (0.62x). After: 0.42x
(0.50x), 0.54x (0.54x), 0.51x (0.49x), 0.56x (0.52x), 0.52x (0.50x). The calmest pair of runs:
after, kvplan 0.187 s vs vllm-wizard 0.345 s (0.54x); before, 0.261 s vs 0.410 s (0.64x).

Measured 2026-12-05, the same machine quieter (load average 0.8-0.9), 10 pairs a run, kvplan from a wheel in a venv
of its own: with typer 0.28.0, kvplan 0.160 s vs vllm-wizard 0.225 s (0.71x); with typer 0.29.2, which imports
pydantic to coerce every option, 0.230 s vs 0.213 s (1.08x). typer is no longer capped below 0.29 (a cap would block
installing kvplan beside anything that needs a newer typer), so the goal of 0.6x is not met with the newest typer.
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
    parser.add_argument("--wizard", help="vllm-wizard executable: time it on the same input, paired")
    opts = parser.parse_args()
    if opts.wizard:
        compare_with_wizard(opts.wizard, opts.runs)
        return
    env = _environment()
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


def _environment() -> dict:
    """Offline, and with byte-code caching on as a user's shell has it: with PYTHONDONTWRITEBYTECODE
    set, every run would compile kvplan's sources again (an editable install has no .pyc files
    until the first run writes them)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _time(cmd: list[str], env: dict) -> float:
    return _times(cmd, env)[0]


def _times(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall time, and the CPU time (user + system) the process used: the CPU time hardly moves when
    other work on the machine makes the wall time noisy."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        sys.exit(f"{cmd[0]} failed: {proc.stderr.decode()[-2000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compare_with_wizard(wizard: str, runs: int) -> None:
    import json
    import shutil
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    profile = json.loads((root / "profiles/models/meta-llama--Llama-3.1-8B.json").read_text())
    folder = Path(tempfile.mkdtemp(prefix="kvplan-bench-"))
    try:
        (folder / "config.json").write_text(json.dumps(profile["config"]))
        env = _environment()
        kvplan = shutil.which("kvplan") or sys.exit("kvplan is not on PATH")
        ours = [kvplan, "size", str(folder), "--ctx", "32768", "--gpu", "4090"]
        theirs = [wizard, "plan", "-m", str(folder), "--max-model-len", "32768", "--gpu", "RTX 4090"]
        _time(ours, env), _time(theirs, env)  # compile .pyc files once
        a, b, cpu_a, cpu_b = [], [], [], []
        for _ in range(runs):
            for cmd, wall, cpu in ((ours, a, cpu_a), (theirs, b, cpu_b)):
                elapsed, used = _times(cmd, env)
                wall.append(elapsed)
                cpu.append(used)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ma, mb = statistics.median(a), statistics.median(b)
    load = os.getloadavg()[0]  # 1 min, this run included: other work slows both tools, not always alike
    print(f"Llama-3.1-8B config, 32k context, RTX 4090; {runs} paired cold runs, {os.cpu_count()} CPUs, "
          f"load average {load:.1f}")
    print(f"  kvplan size       median {ma:.3f} s  (min {min(a):.3f}, max {max(a):.3f})")
    print(f"  vllm-wizard plan  median {mb:.3f} s  (min {min(b):.3f}, max {max(b):.3f})")
    print(f"  ratio             {ma / mb:.2f}x  (goal <= 0.60x)")
    ca, cb = statistics.median(cpu_a), statistics.median(cpu_b)
    print(f"  CPU time (user + system) medians: kvplan {ca:.3f} s, vllm-wizard {cb:.3f} s, ratio {ca / cb:.2f}x")


if __name__ == "__main__":
    main()
