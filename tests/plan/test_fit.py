"""`kvplan fit`'s search: every proposal is a plan `kvplan size` agrees fits; 70B at 128k x 16 on H100s."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from kvplan.cli import fit_cmd
from kvplan.deploy import load_model
from kvplan.hardware.catalog import find_device, load_catalog
from kvplan.plan.fit import FitRequest, replan, search
from kvplan.plan.overhead import load_overhead
from kvplan.plan.size import verdict_for
from kvplan.vllm.rules import rules_for


@pytest.fixture(scope="module")
def llama70b():
    return load_model("meta-llama/Llama-3.1-70B", None, "bundled", True, {})


def _search(model, devices, req):
    return search(model.arch, devices, req, rules_for(None), load_overhead(), model.weights_total)


def test_70b_at_128k_x16_on_h100s_scales_out_with_tp(llama70b):
    h100 = find_device("H100")
    res = _search(llama70b, [h100, find_device("MI300X"), find_device("L40S")], FitRequest(ctx=131072, concurrency=16))
    h100_fits = [c for c in res.fitting if c.device == h100]
    assert h100_fits and all(c.tp * c.pp >= 2 for c in h100_fits)
    only_h100 = _search(llama70b, [h100], FitRequest(ctx=131072, concurrency=16))
    best = only_h100.fitting[0]
    assert best.device == h100 and best.tp >= 2 and best.pp == 1
    # By hand: 16 x 131,072 tokens x 327,680 B (bf16) = 687 GB of KV: more than 8 x 80 GB, so only
    # an fp8 cache (163,840 B/token, 344 GB) on 8 GPUs fits.
    assert (best.gpus, best.kv_dtype) == (8, "fp8")
    assert all(c.kv_dtype == "fp8" for c in only_h100.fitting)


def test_every_fitting_candidate_is_confirmed_by_the_size_path(llama70b):
    req = FitRequest(ctx=32768, concurrency=64, prompt=4096, output=512)
    devices = [find_device(n) for n in ("H100", "H200", "L40S", "A100 80GB", "MI300X")]
    res = _search(llama70b, devices, req)
    assert res.evaluated > 500 and res.fitting
    rules, overhead = rules_for(None), load_overhead()
    for cand in res.fitting[:: max(1, len(res.fitting) // 40)]:
        cap = replan(llama70b.arch, cand, req, rules, overhead, llama70b.weights_total)
        assert verdict_for(cap, cand.dp).fits, cand
    counts = [c.gpus for c in res.fitting]
    assert counts == sorted(counts)  # ranked by GPU count


def test_prices_rank_by_cost(llama70b):
    req = FitRequest(ctx=8192, concurrency=8, prices={"H100 SXM": 3.0, "H200": 10.0})
    res = _search(llama70b, [find_device("H200"), find_device("H100")], req)
    costs = [c.price_per_hour for c in res.fitting]
    assert costs == sorted(costs) and res.fitting[0].device.name == "H100 SXM"


def test_search_covers_the_catalog():
    # Its speed is a benchmark's figure (benchmarks/bench_fit.py), not a timed test: CI's load decides wall time.
    model = load_model("meta-llama/Llama-3.1-8B", None, "bundled", True, {})
    devices = list(load_catalog()[0].values())
    res = _search(model, devices, FitRequest(ctx=32768, concurrency=64, prompt=2048, output=512))
    assert res.evaluated >= 2000


def test_fit_cli_json():
    app = typer.Typer()
    app.command("fit")(fit_cmd.fit)
    app.command("noop")(lambda: None)
    r = CliRunner().invoke(app, ["fit", "meta-llama/Llama-3.1-70B", "--ctx", "128k", "-c", "16", "--gpus", "H100",
                                 "--source", "bundled", "--json"], env={"HF_HUB_OFFLINE": "1"})
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    first = doc["deployments"][0]
    assert first["gpu"] == "H100 SXM" and first["tensor_parallel_size"] >= 2
    assert "--tensor-parallel-size" in first["vllm_serve_command"] and first["latency_estimate"]["tpot_ms"] > 0
    bad = CliRunner().invoke(app, ["fit", "meta-llama/Llama-3.1-70B", "--ctx", "128k", "--price", "H100=abc",
                                   "--source", "bundled"], env={"HF_HUB_OFFLINE": "1"})
    assert bad.exit_code == 2
    none = CliRunner().invoke(app, ["fit", "meta-llama/Llama-3.1-70B", "--ctx", "128k", "-c", "64", "--gpus", "L4",
                                    "--max-gpus", "2", "--source", "bundled"], env={"HF_HUB_OFFLINE": "1"})
    assert none.exit_code == 1 and "NOTHING FITS" in none.output
