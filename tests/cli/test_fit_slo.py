"""`kvplan fit --slo`: only deployments whose simulated latency (prior step-time model) meets the SLOs."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from kvplan.cli import fit_cmd
from kvplan.deploy import load_model
from kvplan.hardware.catalog import find_device
from kvplan.plan.fit import FitRequest, latency_floor, predict_deployment, replan, search, workload_lengths
from kvplan.plan.overhead import load_overhead
from kvplan.plan.steptime import model_for
from kvplan.vllm.rules import rules_for

ENV = {"HF_HUB_OFFLINE": "1"}
BASE = ["fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "-c", "32", "--prompt", "2k", "--output", "256",
        "--gpus", "H100,L40S,L4", "--source", "bundled", "--json"]


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("fit")(fit_cmd.fit)
    app.command("noop")(lambda: None)
    return app


def _run(*extra: str):
    return CliRunner().invoke(_app(), [*BASE, *extra], env=ENV)


def test_slo_keeps_only_deployments_that_meet_it():
    loose = _run()
    assert loose.exit_code == 0, loose.output
    assert json.loads(loose.output)["deployments"][0]["gpus"] == 1  # without SLOs: one GPU fits
    r = _run("--slo", "ttft_p99=500ms,itl_p99=50ms")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["slo"] == {"ttft_p99": 500.0, "itl_p99": 50.0}
    assert doc["slo_simulated"] >= len(doc["deployments"]) > 0 and sum(doc["slo_rejected"].values()) > 0
    for d in doc["deployments"]:
        assert all(c["met"] and c["predicted_ms"] <= c["target_ms"] for c in d["slo"].values()), d["slo"]
        pred = d["latency_predicted"]
        assert set(pred["ttft_ms"]) == {"p50", "p90", "p95", "p99", "mean"} and pred["source"] == "prior"
        assert pred["ttft_ms"]["p99"] == d["slo"]["ttft_p99"]["predicted_ms"]
    assert doc["deployments"][0]["gpus"] >= 2  # one GPU's decode steps are too slow for 50 ms ITL (prior)


def test_slo_nothing_meets_and_bad_keys():
    none = CliRunner().invoke(_app(), [*BASE[:-1], "--slo", "itl_p50=1ms"], env=ENV)
    assert none.exit_code == 1 and "NO DEPLOYMENT MEETS THE SLOs" in none.output
    for bad in ("ttft_p42=1s", "ttft_p99", "ttft_p99=-1s", ","):
        r = _run("--slo", bad)
        assert r.exit_code == 2, (bad, r.output)


def test_latency_floor_bounds_the_simulation():
    model = load_model("meta-llama/Llama-3.1-8B", None, "bundled", True, {})
    req = FitRequest(ctx=8192, concurrency=16, prompt=3000, output=64, shared_prefix=512)
    rules, overhead = rules_for(None), load_overhead()
    res = search(model.arch, [find_device("L40S")], req, rules, overhead, model.weights_total)
    cand = res.fitting[0]
    cap = replan(model.arch, cand, req, rules, overhead, model.weights_total)
    pred = predict_deployment(cap, req, cand.dp)
    floor = latency_floor(model_for(cap), *workload_lengths(req, cand.ctx), cap.limits.max_num_batched_tokens,
                          cached=req.shared_prefix)
    for metric in ("ttft", "itl", "tpot", "e2e"):
        low = min(v for v in getattr(pred, metric).values() if v is not None)
        assert floor[metric] <= low * (1 + 1e-9), (metric, floor[metric], low)
    assert pred.itl["p99"] >= pred.itl["p50"] > 0 and pred.output_tokens_per_s > 0
