"""The README's bench showcase (issue 27: it was made at 3 requests a stream and showed an ITL p50 of 0.0 ms): its block
is what benchmarks/readme_showcase.py renders from the kept run (docs/bench-cpu-sweep.json), and that run was made at
the bench's defaults, every figure one the README's definitions allow."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kvplan.bench.config import DEFAULT_REQUESTS
from kvplan.bench.results import BenchSummary

ROOT = Path(__file__).resolve().parents[1]


def _showcase():
    spec = importlib.util.spec_from_file_location("readme_showcase", ROOT / "benchmarks" / "readme_showcase.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_shows_the_kept_run():
    summary = BenchSummary.model_validate_json((ROOT / "docs" / "bench-cpu-sweep.json").read_text())
    assert _showcase().showcase_block(summary) in (ROOT / "README.md").read_text()


def test_the_kept_run_is_at_the_defaults_and_plausible():
    summary = BenchSummary.model_validate_json((ROOT / "docs" / "bench-cpu-sweep.json").read_text())
    assert summary.status == "complete" and summary.points
    for p in summary.points:
        assert p.requests == DEFAULT_REQUESTS and p.requests_ok == p.requests, p.concurrency
        # an ITL is a gap between two output chunks of a stream: never 0 ms at the median
        assert p.itl.p50 is not None and p.itl.p50 > 0, p.concurrency
        assert p.ttft.count >= 100  # a p99 carried by at least 100 samples
    report = (ROOT / "docs" / "bench-cpu-sweep.md").read_text()
    assert all(f"| {p.concurrency} |" in report for p in summary.points)
