"""kvplan check --bench with slo: keys: kvplan runs and `vllm bench serve` results as evidence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers.check import SPEC, only, run, run_dir, write

DATA = Path(__file__).parents[1] / "bench" / "data"


def _spec(tmp_path: Path, slo: str) -> Path:
    return write(tmp_path, only("fits14").replace("    concurrency: 14\n", f"    concurrency: 14\n    slo: {slo}\n"))


def _point(c: int, ttft_p99: float) -> dict:
    stats = {"n": 120, "p50": ttft_p99 / 2, "p99": ttft_p99}
    return {"concurrency": c, "status": "ok", "ttft": stats, "itl": {"n": 9000, "p99": 0.02},
            "tpot": {}, "e2e": {"n": 120, "p99": 4.0}}


def test_slo_met_and_missed_by_a_kvplan_run(tmp_path):
    path = _spec(tmp_path, "{ttft_p99: 500ms, e2e_p99: 10s}")
    ok = run_dir(tmp_path / "runs", "ok", model="meta-llama/Llama-3.1-8B-Instruct", measured_first_preemption=None,
                 points=[_point(8, 0.9), _point(16, 0.4)])
    result = run(["check", str(path), "--bench", str(ok), "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["results"][0]
    assert row["bench"]["slo"][0]["load"] == 16 and row["bench"]["slo"][0]["passed"]
    slow = run_dir(tmp_path / "runs", "slow", model="meta-llama/Llama-3.1-8B-Instruct", measured_first_preemption=None,
                   points=[_point(16, 0.9)])
    result = run(["check", str(path), "--bench", str(slow), "--json"])
    assert result.exit_code == 1
    row = json.loads(result.stdout)["results"][0]
    assert row["limiting_term"] == "slo" and "ttft_p99 900 ms > 500 ms at concurrency 16" in row["reason"]


def test_slo_without_a_point_at_the_concurrency_cannot_be_shown(tmp_path):
    path = _spec(tmp_path, "ttft_p99=500ms")
    low = run_dir(tmp_path / "runs", "low", model="meta-llama/Llama-3.1-8B-Instruct", measured_first_preemption=None,
                  points=[_point(4, 0.1)])
    result = run(["check", str(path), "--bench", str(low), "--json"])
    assert result.exit_code == 1
    assert "cannot show the SLOs at concurrency 14" in json.loads(result.stdout)["results"][0]["reason"]


def test_vllm_bench_serve_results_gate_slos_not_preemption(tmp_path):
    folder = tmp_path / "vllm"
    folder.mkdir()
    for f in DATA.glob("vllm-bench-serve-*.json"):
        shutil.copy(f, folder)
    result = run(["check", str(_spec(tmp_path, "{ttft_p99: 800ms, itl_p99: 20ms}")), "--bench", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["results"][0]
    assert row["bench"]["slo"][0]["load"] == 16 and row["bench"]["slo"][0]["source"] == "vllm bench serve"
    assert any("cannot show preemptions" in n for n in row["notes"])
    # a metric vLLM's file did not save: the gate says it cannot show it
    one = run(["check", str(_spec(tmp_path, "{ttft_p90: 800ms}")), "--bench", str(folder / "vllm-bench-serve-c16.json"),
               "--json"])
    assert one.exit_code == 1 and "ttft_p90 not in the vllm bench serve results" in one.stdout


def test_bad_slo_key_is_a_spec_error(tmp_path):
    result = run(["check", str(_spec(tmp_path, "{ttft_p42: 1s}"))])
    assert result.exit_code == 2 and "slo" in result.stderr
    assert SPEC  # the shared spec is the base


def test_guidellm_reports_gate_slos_not_preemption(tmp_path):
    """A GuideLLM benchmarks report (tests/bench/data/guidellm-*.json, built field by field to GuideLLM's
    GenerativeBenchmarksReport schema by tests/bench/data/make_guidellm_reports.py): concurrent streams 4, 16, 64."""
    report = DATA / "guidellm-concurrent.json"
    result = run(["check", str(_spec(tmp_path, "{ttft_p99: 500ms, itl_p99: 30ms, e2e_p99: 10s}")), "--bench",
                  str(report), "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["results"][0]
    check = row["bench"]["slo"][0]
    assert check["load"] == 16 and check["source"] == "GuideLLM" and check["passed"]
    assert abs(check["checks"]["ttft_p99"]["value"] - 0.3343933) < 1e-9  # metrics.time_to_first_token_ms.successful p99, in s
    assert any("GuideLLM): cannot show preemptions or KV onsets" in n for n in row["notes"])
    tight = run(["check", str(_spec(tmp_path, "{ttft_p99: 300ms}")), "--bench", str(report), "--json"])
    assert tight.exit_code == 1
    assert "ttft_p99 334.393 ms > 300 ms at concurrency 16" in json.loads(tight.stdout)["results"][0]["reason"]
    # a folder holding GuideLLM's default benchmarks.json is read as well
    folder = tmp_path / "guidellm"
    folder.mkdir()
    shutil.copy(report, folder / "benchmarks.json")
    again = run(["check", str(_spec(tmp_path, "{ttft_p99: 500ms}")), "--bench", str(folder), "--json"])
    assert again.exit_code == 0, again.output


def test_a_guidellm_rate_sweep_cannot_show_a_concurrency(tmp_path):
    result = run(["check", str(_spec(tmp_path, "{ttft_p99: 500ms}")), "--bench", str(DATA / "guidellm-sweep.json"),
                  "--json"])
    assert result.exit_code == 1
    reason = json.loads(result.stdout)["results"][0]["reason"]
    assert "cannot show the SLOs at concurrency 14: it measured request rates, not concurrencies" in reason
