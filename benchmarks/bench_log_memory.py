"""Peak memory and time of `kvplan check-log`'s parser on a large start-up log (issue 9's goal:
a 100 MB log in under 200 MB of memory, a 1 MB single-line log in under 1 s).

    python benchmarks/bench_log_memory.py [SIZE_MB]      (default 100)

Each measurement runs in a fresh subprocess so its peak RSS (ru_maxrss) is its own; the figure
printed next to it is the baseline of a subprocess that imports the parser and reads nothing.
Nothing here asserts: it prints figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import resource, sys, time
from kvplan.vllm.startup_log import parse_startup_log, read_startup_log
start = time.perf_counter()
if sys.argv[1] != "-":
    report = parse_startup_log(read_startup_log(sys.argv[1], "log"))
    assert report.num_gpu_blocks == 7290, report.num_gpu_blocks
took = time.perf_counter() - start
print(f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} {took:.2f}")
"""

HEAD = ("INFO 01-01 00:00:00 [__init__.py:1] vLLM API server version 0.9.1\n"
        "INFO 01-01 00:00:01 [gpu_worker.py:1] Available KV cache memory: 12.34 GiB\n"
        "INFO 01-01 00:00:02 [executor_base.py:1] # cuda blocks: 7,290, # CPU blocks: 2048\n")


def run(path: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, check=True)
    rss, took = out.stdout.split()
    return float(rss), float(took)


def main(argv: list[str]) -> int:
    size_mb = int(argv[0]) if argv else 100
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "big.log")
        line = "INFO 01-01 00:00:03 [engine.py:1] " + "token throughput avg " * 12 + "\n"
        with open(big, "w") as fh:
            fh.write(HEAD)
            written = len(HEAD)
            while written < size_mb * 2**20:
                fh.write(line * 1000)
                written += len(line) * 1000
        one_line = os.path.join(tmp, "one-line.log")
        with open(one_line, "w") as fh:
            fh.write(HEAD + "word " * (2**20 // 5) + "\n")
        base_rss, _ = run("-")
        start = time.perf_counter()
        big_rss, big_took = run(big)
        wall = time.perf_counter() - start
        line_rss, line_took = run(one_line)
    print(f"baseline (import only):       peak RSS {base_rss:7.1f} MiB")
    print(f"{size_mb} MB log ({written / 2**20:.0f} MiB):     peak RSS {big_rss:7.1f} MiB, "
          f"parse {big_took:.2f} s (process {wall:.2f} s)")
    print(f"1 MB single-line log:         peak RSS {line_rss:7.1f} MiB, parse {line_took:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
