"""Issue 28: figures of other tools' result files past any float or count (400 digits, 1e308, inf, -1)
are refused or dropped, never an internal error (`kvplan report` on a `vllm bench serve` result)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.harness import invoke

VLLM_RESULT = Path(__file__).resolve().parents[1] / "bench" / "data" / "vllm-bench-serve-c16.json"


@pytest.mark.parametrize("key", ["max_concurrency", "max_concurrent_requests", "completed", "failed",
                                 "total_output_tokens", "mean_ttft_ms", "duration", "output_throughput"])
@pytest.mark.parametrize("value", [int("9" * 400), 1e308, -1, "many"])
def test_a_result_figure_past_any_range_is_no_internal_error(tmp_path, key, value):
    doc = json.loads(VLLM_RESULT.read_text())
    doc[key] = value
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    r = invoke("report", str(path), "--format", "json")
    assert r.code in (0, 2), (r.code, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    if r.code == 0:
        json.loads(r.stdout)
    else:
        r.one_line_error()
