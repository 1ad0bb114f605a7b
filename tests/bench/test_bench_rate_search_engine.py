"""`--sweep-rate auto` end to end on the real vLLM CPU engine (the module's shared engine): the search
brackets the highest request rate meeting a TTFT SLO and the report says it. Kept short: 24 requests
or 6 s a point, a 50% resolution, at most 6 points (the pure search is tested in test_bench_rate_search.py)."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.bench import bench_env, engine_required, kvplan_cmd

pytestmark = [pytest.mark.engine, engine_required]


def test_rate_search_on_the_cpu_engine(cpu_engine, tmp_path):
    # prompt 64 + output 128 peaks at cdiv(191, 32) = 6 blocks: two requests fit the 16 usable blocks at
    # once, so a few requests/s saturate the engine; queued requests wait for their first token, and the
    # TTFT counted from the scheduled send time grows past 500 ms. A lone request's TTFT is tens of ms. (With 12
    # requests a point, a fast run, 3 running at once at ~1,450 tokens/s, drained even a 64/s burst with a TTFT p99 of
    # 468 ms: every point met the SLO and nothing was bracketed. 24 requests take twice as long to drain.)
    proc = subprocess.run(kvplan_cmd("--url", cpu_engine.cfg.base_url, "--sweep-rate", "auto", "--rate-start", "2",
                                     "--rate-resolution", "50%", "--rate-points", "6", "--requests", "24",
                                     "--duration", "6s", "--prompt", "64", "--output", "128", "--slo", "ttft_p99=500ms",
                                     "--no-warmup", "--out", str(tmp_path), "--json"),
                          capture_output=True, text=True, timeout=300, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    search = s["rate_search"]
    assert s["load_mode"] == "rate" and search["points"] == len(s["points"]) <= 6
    assert all(p["mode"] == "rate" and p["status"] == "ok" and "ttft_p99" in p["slo"] for p in s["points"])
    best, missed = search["highest_meeting_slo"], search["first_missing_slo"]
    assert best is not None and missed is not None and best < missed, search  # bracketed
    by_rate = {p["rate"]: p for p in s["points"]}
    assert by_rate[best]["slo_met"] is True and by_rate[missed]["slo_met"] is False
    assert s["highest_load_meeting_slo"] == best
    assert not any(p["slo_met"] for p in s["points"] if p["rate"] >= missed)  # monotonic around the bracket
    report = (next(tmp_path.iterdir()) / "report.md").read_text()
    assert f"highest rate meeting the SLOs: {best:g} requests/s; first rate missing them: {missed:g}" in report
