"""kvplan.yaml `rate:` gates a fleet: the deployment's replicas (gpus / (tp x pp) engines) behind a router at that
request rate, each simulated at its share against the SLOs, as `kvplan fit --rate` sizes one (kvplan.plan.fleet;
its search is worked by hand in tests/plan/test_fleet.py, and fit's answer is checked against the simulator at
its count and one fewer in tests/cli/test_fit_rate.py). Here: check and fit give one count for one shape, the
gate passes at that count and fails one below it, and a `rate:` without what it needs is a line error."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app

runner = CliRunner()
ENV = {"HF_HUB_OFFLINE": "1", "GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None, "GITHUB_WORKSPACE": None}
SHAPE = ("model: meta-llama/Llama-3.1-8B, tp: 1, context: 8k, prompt: 2k, output: 128, rate: 40/s, "
         "slo: {ttft_p99: 800ms, tpot_p99: 40ms}")


def _check(tmp_path, deployments: str):
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("deployments:\n" + deployments)
    result = runner.invoke(app, ["check", str(spec), "--json"], env=ENV)
    rows = {r["name"]: r for r in json.loads(result.stdout)["results"]} if result.stdout.strip() else {}
    return result, rows


@pytest.fixture(scope="module")
def fit_count() -> int:
    """`kvplan fit --rate` for the same shape: one H100 a replica, bf16 KV."""
    result = runner.invoke(app, ["fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--prompt", "2k", "--output", "128",
                                 "--gpus", "H100", "--max-gpus", "1", "--source", "bundled", "--rate", "40/s",
                                 "--slo", "ttft_p99=800ms,tpot_p99=40ms", "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    (fleet,) = [f for f in json.loads(result.stdout)["fleets"] if f["kv_cache_dtype"] == "bfloat16"]
    assert fleet["gpus_per_replica"] == 1 and fleet["replicas"] > 2
    return fleet["replicas"]


def test_the_gate_passes_at_fits_count_and_fails_one_below(tmp_path, fit_count):
    n = fit_count
    result, rows = _check(tmp_path, f"  - {{name: enough, gpu: {n}xH100, {SHAPE}}}\n"
                                    f"  - {{name: short, gpu: {n - 1}xH100, {SHAPE}}}\n")
    assert result.exit_code == 1, result.output
    enough, short = rows["enough"], rows["short"]
    assert enough["fits"] and enough["limiting_term"] == "none"
    assert enough["fleet"]["replicas"] == n and enough["fleet"]["replicas_needed"] == n and enough["fleet"]["passed"]
    assert all(c["met"] for c in enough["fleet"]["slo"].values())
    assert any(note.startswith(f"rate: {n} replicas meet the SLOs") for note in enough["notes"])

    assert (short["fits"], short["limiting_term"]) == (False, "rate")
    assert short["fleet"]["replicas"] == n - 1 and short["fleet"]["replicas_needed"] == n
    assert not short["fleet"]["passed"] and any(c["met"] is False for c in short["fleet"]["slo"].values())
    assert short["suggestion"] == f"more replicas (gpu: {n}xH100-SXM)"
    assert f"{n - 1} replicas miss the SLOs" in short["reason"] and f"{n} needed" in short["reason"]


def test_a_fleet_that_cannot_start_is_not_simulated(tmp_path):
    """1 GiB of KV memory cannot hold one 8k request of Llama-3.1-8B (128 KiB a token: 1 GiB is 8,192 tokens less
    vLLM's null block): the plan's own verdict stands, and nothing is simulated."""
    result, rows = _check(tmp_path, f"  - {{name: tiny, gpu: H100, kv_cache_memory: 1GiB, {SHAPE}}}\n")
    assert result.exit_code == 1, result.output
    row = rows["tiny"]
    assert not row["fits"] and row["limiting_term"] != "rate" and row["fleet"] is None
    assert "rate: the fleet was not simulated: the plan does not fit" in row["notes"]


@pytest.mark.parametrize("extra, message", [
    ("rate: 40", "rate needs slo:, prompt:, output:"),
    ("rate: 40, slo: {ttft_p99: 1s}, prompt: 2k", "rate needs output:"),
    ("rate: fast, slo: {ttft_p99: 1s}, prompt: 2k, output: 64", "invalid rate: 'fast'"),
    ("rate: 0, slo: {ttft_p99: 1s}, prompt: 2k, output: 64", "invalid rate: 0"),
    ("rate: -3/s, slo: {ttft_p99: 1s}, prompt: 2k, output: 64", "invalid rate: '-3/s'"),
    ("rate: 1e300, slo: {ttft_p99: 1s}, prompt: 2k, output: 64", "invalid rate"),
    ("rate: .inf, slo: {ttft_p99: 1s}, prompt: 2k, output: 64", "not a finite number"),
])
def test_a_rate_without_what_it_needs_is_a_line_error(tmp_path, extra, message):
    spec = tmp_path / "kvplan.yaml"
    spec.write_text(f"deployments:\n  - {{name: x, model: meta-llama/Llama-3.1-8B, gpu: H100, {extra}}}\n")
    result = runner.invoke(app, ["check", str(spec)], env=ENV)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "kvplan.yaml:" in result.stderr
    assert "Traceback" not in result.output
