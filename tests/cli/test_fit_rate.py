"""`kvplan fit --rate`: the fewest replicas of each deployment shape that serve a request rate at the SLOs,
each replica simulated at its share (kvplan.plan.fleet; its search is checked by hand in tests/plan/test_fleet.py).
Here: the CLI's answers against the simulator run directly at the proposed count and one replica fewer."""

from __future__ import annotations

import json
import math

import pytest
import typer
from typer.testing import CliRunner

from kvplan.cli import fit_cmd
from kvplan.plan.fleet import missed_targets
from kvplan.plan.simulate import Lengths, SchedulerConfig, open_loop, poisson_arrivals
from kvplan.plan.steptime import StepTimeModel, predict_latency

ENV = {"HF_HUB_OFFLINE": "1"}
BASE = ["fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--prompt", "2k", "--output", "128", "--gpus", "H100",
        "--max-gpus", "1", "--source", "bundled"]
SLO = "ttft_p99=800ms,tpot_p99=40ms"


def _run(*extra: str):
    app = typer.Typer()
    app.command("fit")(fit_cmd.fit)
    app.command("noop")(lambda: None)
    return CliRunner().invoke(app, [*BASE, *extra], env=ENV)


@pytest.fixture(scope="module")
def fleet() -> dict:
    r = _run("--rate", "40/s", "--slo", SLO, "--price", "H100=2.5", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_each_shape_gets_the_fewest_replicas_the_simulator_says_meet_the_slo(fleet):
    """One H100 a replica: bf16 and fp8 KV are the two shapes. For each, the simulator (the same step-time model
    and pool, Poisson arrivals at the replica's share) meets the SLOs at the proposed count and misses them with
    one replica fewer."""
    assert fleet["rate_per_s"] == 40 and fleet["shapes_sized"] == 2
    assert {f["kv_cache_dtype"] for f in fleet["fleets"]} == {"bfloat16", "fp8"}
    from kvplan.deploy import load_model
    from kvplan.hardware.catalog import find_device
    from kvplan.plan.fit import FitRequest, replan, search
    from kvplan.plan.overhead import load_overhead
    from kvplan.plan.steptime import model_for
    from kvplan.vllm.rules import rules_for

    model = load_model("meta-llama/Llama-3.1-8B", None, "bundled", True, {})
    req = FitRequest(ctx=8192, concurrency=1, prompt=2048, output=128, max_gpus=1)
    rules = rules_for(None)
    result = search(model.arch, [find_device("H100")], req, rules, load_overhead(), model.weights_total)
    slo = {"ttft_p99": 0.8, "tpot_p99": 0.04}
    unit = poisson_arrivals(1.0, 500, 0)
    for f in fleet["fleets"]:
        cand = next(c for c in result.fitting if c.dp == 1 and c.kv_dtype == ("fp8" if "fp8" in f["kv_cache_dtype"] else "auto"))
        cap = replan(model.arch, cand, req, rules, load_overhead(), model.weights_total)
        step: StepTimeModel = model_for(cap)
        config = SchedulerConfig.from_capacity(cap)

        def predicted(n: int, config=config, step=step):
            load = open_loop([t * n / 40 for t in unit], Lengths(2048, 128))
            return predict_latency(config, load, step, (50, 90, 95, 99), mean=True)

        n = f["replicas"]
        assert n > 1 and not missed_targets(predicted(n), slo) and missed_targets(predicted(n - 1), slo), f
        assert f["gpus"] == n and f["per_replica_rate_per_s"] == pytest.approx(40 / n, rel=1e-3)
        assert f["price_per_hour"] == pytest.approx(2.5 * n)
        # $ per million output tokens: the fleet's $/h over 40 requests/s x 128 tokens x 3,600 s
        assert f["usd_per_million_output_tokens"] == pytest.approx(2.5 * n / (40 * 128 * 3600) * 1e6, rel=1e-3)
        assert f["binding"] in ("kv", "batch", "compute")
        assert all(c["met"] for c in f["slo"].values())
    prices = [f["price_per_hour"] for f in fleet["fleets"]]
    assert prices == sorted(prices)


def test_the_table_and_csv():
    r = _run("--rate", "40", "--slo", SLO)
    assert r.exit_code == 0, r.output
    assert "6 x H100 SXM" in r.output and "bound by" in r.output
    csv = _run("--rate", "40", "--slo", SLO, "--format", "csv")
    assert csv.exit_code == 0 and csv.output.splitlines()[0].startswith("rank,gpu,replicas,")


def test_no_fleet_within_the_largest_searched_exits_1():
    r = _run("--rate", "40", "--slo", SLO, "--max-replicas", "1", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.output)
    assert doc["fleets"] == [] and any("1 replicas do not meet it" in k for k in doc["fleet_unmet"])


@pytest.mark.parametrize("extra, message", [
    (["--rate", "0", "--slo", SLO], "invalid --rate"),
    (["--rate", "-3", "--slo", SLO], "invalid --rate"),
    (["--rate", "nan", "--slo", SLO], "invalid --rate"),
    (["--rate", "1e308", "--slo", SLO], "invalid --rate"),
    (["--rate", "fast", "--slo", SLO], "invalid --rate"),
    (["--rate", "40"], "--rate needs --slo"),
    (["--rate", "40", "--slo", SLO, "-c", "8"], "--rate and --concurrency"),
    (["--rate", "40", "--slo", SLO, "--max-replicas", "0"], "invalid --max-replicas"),
])
def test_bad_input_is_one_line_and_exit_2(extra, message):
    r = _run(*extra)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_pd_pairs_for_the_same_shapes():
    """--pd: each shape also as prefill + decode replicas. Checked for the bf16 shape (one H100 a replica): the KV
    moved is the prompt's 2,048 tokens x 131,072 B (Llama-3.1-8B's 32 layers x 8 heads x 128 x 2 x 2 B) = 268,435,456 B
    over one 50 GB/s NIC: 5.369 ms; a decode replica holds whole requests, cdiv(2,048 + 127, 16) = 136 blocks each, so
    at most usable // 136 of the pool `kvplan size` plans; the prefill count meets the TTFT target less the transfer
    and the decode's first step in the simulator, and one fewer misses it."""
    r = _run("--rate", "40/s", "--slo", SLO, "--pd", "--json", "--vllm-version", "0.33.0")  # 16-token blocks
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["pd"] is True and doc["pd_link_gb_per_s"] == 50
    (f,) = [f for f in doc["fleets"] if f["kv_cache_dtype"] == "bfloat16"]
    pair = f["pd"]
    assert pair["transfer_ms"] == pytest.approx(268_435_456 / 50e9 * 1000, abs=1e-3)
    size = CliRunner().invoke(_size_app(), ["size", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--gpu", "H100",
                                            "--source", "bundled", "--vllm-version", "0.33.0", "--json"], env=ENV)
    usable = json.loads(size.output)["num_blocks"] - 1
    # bf16 at 2k + 128 fills the pool before the 40 ms TPOT or max_num_seqs bind
    assert (pair["decode_binding"], pair["decode_concurrency"]) == ("kv", usable // 136)
    per_decode = pair["decode_concurrency"] / (128 * pair["decode_step_ms"] / 1000)
    assert pair["decode_replicas"] == math.ceil(40 / per_decode - 1e-9)
    assert pair["decode_step_ms"] <= 40  # the TPOT target
    assert pair["replicas"] == pair["prefill_replicas"] + pair["decode_replicas"] and pair["gpus"] == pair["replicas"]

    from kvplan.deploy import load_model
    from kvplan.hardware.catalog import find_device
    from kvplan.plan.fit import FitRequest, replan, search
    from kvplan.plan.overhead import load_overhead
    from kvplan.plan.steptime import model_for
    from kvplan.vllm.rules import rules_for

    model = load_model("meta-llama/Llama-3.1-8B", None, "bundled", True, {})
    req = FitRequest(ctx=8192, concurrency=1, prompt=2048, output=128, max_gpus=1)
    rules = rules_for(None)
    result = search(model.arch, [find_device("H100")], req, rules, load_overhead(), model.weights_total)
    cand = next(c for c in result.fitting if c.dp == 1 and c.kv_dtype == "auto")
    cap = replan(model.arch, cand, req, rules, load_overhead(), model.weights_total)
    step, config, unit = model_for(cap), SchedulerConfig.from_capacity(cap), poisson_arrivals(1.0, 500, 0)
    target = {"ttft_p99": 0.8 - (pair["transfer_ms"] + pair["decode_step_ms"]) / 1000}

    def prefill(n: int):
        load = open_loop([t * n / 40 for t in unit], Lengths(2048, 1))
        return predict_latency(config, load, step, (50, 90, 95, 99), mean=True)

    n = pair["prefill_replicas"]
    assert not missed_targets(prefill(n), target) and (n == 1 or missed_targets(prefill(n - 1), target))


def test_pd_bad_input():
    r = _run("--pd", "--slo", SLO)
    assert r.exit_code == 2 and "--pd sizes a fleet: it needs --rate" in r.output
    r = _run("--rate", "40", "--slo", SLO, "--pd-link-gbs", "50")
    assert r.exit_code == 2 and "--pd-link-gbs is for --pd" in r.output
    r = _run("--rate", "40", "--slo", SLO, "--pd", "--pd-link-gbs", "-1")
    assert r.exit_code == 2 and "invalid --pd-link-gbs" in r.output
    r = _run("--rate", "40", "--slo", "ttft_p99=1s,e2e_p99=5s", "--pd")
    assert r.exit_code == 2 and "e2e_p99 is not modelled for a P/D pair" in r.output


def _size_app():
    from kvplan.cli import size_cmd

    app = typer.Typer()
    app.command("size")(size_cmd.size)
    app.command("noop")(lambda: None)
    return app


# --------------------------------------------------------------------------- --steptime RUN: the measured engine
TINY = "tests/fixtures/tiny-llama"


def _calibration(tmp_path, scheduler: dict, overhead_s: float = 0.010, model: str = "") -> str:
    """A RUN/steptime.json as `kvplan calibrate --bench` writes it: every step 10 ms whatever it computes (as
    tests/plan/test_fleet.py's TEN_MS), the scheduler given."""
    (tmp_path / "steptime.json").write_text(json.dumps({
        "schema": 1, "model": model, "device": "nominal", "scheduler": scheduler,
        "steptime": {"weight_bytes": 0, "kv_bytes_per_token": 0, "linear_flops_per_token": 0,
                     "attn_flops_per_pair": 0, "bandwidth_bytes_s": 1.0, "peak_flops": 1.0,
                     "overhead_s": overhead_s, "source": "calibrated"}}))
    return str(tmp_path)


def _run_measured(run: str, *extra: str, env: dict[str, str] = ENV):
    app = typer.Typer()
    app.command("fit")(fit_cmd.fit)
    app.command("noop")(lambda: None)
    return CliRunner().invoke(app, ["fit", TINY, "--ctx", "512", "--prompt", "100", "--output", "10",
                                    "--steptime", run, *extra], env=env)


def test_steptime_sizes_the_measured_engine_by_hand(tmp_path):
    """The run's engine: 4 slots (max_num_seqs), a pool that never binds, steps of 10 ms. A request of 10 output
    tokens holds a slot 10 steps = 100 ms, so a replica serves at most 4 / 0.1 = 40 requests/s: at 100 requests/s
    2 replicas (50/s each) fall behind (their queue grows ~10/s over the 500 requests simulated: TTFT p99 of
    seconds), 3 (33.3/s, 83% of their slots) meet TTFT p99 <= 1 s, bound by the batch one replica short."""
    run = _calibration(tmp_path, {"num_blocks": 10_000, "block_size": 16, "max_num_seqs": 4,
                                  "max_num_batched_tokens": 2048})
    r = _run_measured(run, "--rate", "100", "--slo", "ttft_p99=1s", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["steptime_run"] == run and doc["shapes_sized"] == 1
    (f,) = doc["fleets"]
    assert (f["replicas"], f["binding"], f["gpus"]) == (3, "batch", 3)
    assert f["per_replica_rate_per_s"] == pytest.approx(100 / 3, rel=1e-3)
    assert f["slo"]["ttft_p99"]["met"] is True and f["latency_predicted"]["source"] == "calibrated"
    # the smallest such count: the simulator (the same sample, replica_at) misses at 2 and meets at 3
    from kvplan.plan.fleet import replica_at
    from kvplan.plan.steptime import StepTimeModel

    ten_ms = StepTimeModel(weight_bytes=0, kv_bytes_per_token=0, linear_flops_per_token=0, attn_flops_per_pair=0,
                           bandwidth_bytes_s=1.0, peak_flops=1.0, overhead_s=0.010)
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048)
    assert missed_targets(replica_at(config, ten_ms, 100.0, 2, 100, 10), {"ttft_p99": 1.0}) == ["ttft_p99"]
    assert missed_targets(replica_at(config, ten_ms, 100.0, 3, 100, 10), {"ttft_p99": 1.0}) == []
    table = _run_measured(run, "--rate", "100", "--slo", "ttft_p99=1s",
                          env={**ENV, "COLUMNS": "250"})  # the run's path whole (80 columns elide a long tmp path)
    assert table.exit_code == 0 and f"3 x engine of {run}" in " ".join(table.output.split())
    assert "calibrated on" in table.output


def test_steptime_pool_binds_where_it_is_small(tmp_path):
    """The same engine with a pool of 20 usable blocks of 16: a request peaks at cdiv(100 + 10 - 1, 16) = 7 blocks,
    so 2 run at once though 4 slots are free: 20 requests/s a replica; 100/s need 6 (5 are at their throughput),
    bound by the pool (tests/plan/test_fleet.py, by hand)."""
    run = _calibration(tmp_path, {"num_blocks": 21, "block_size": 16, "max_num_seqs": 4,
                                  "max_num_batched_tokens": 2048})
    doc = json.loads(_run_measured(run, "--rate", "100", "--slo", "ttft_p99=1s", "--json").output)
    assert [(f["replicas"], f["binding"]) for f in doc["fleets"]] == [(6, "kv")]


@pytest.mark.parametrize("scheduler, extra, message", [
    ({"num_blocks": 21, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 2048}, ["--slo", "ttft_p99=1s"],
     "--steptime sizes a fleet"),
    ({"num_blocks": 21, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 2048},
     ["--rate", "5", "--slo", "ttft_p99=1s", "--gpus", "H100"], "--gpus is for the GPU search"),
    ({"num_blocks": 21, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 2048},
     ["--rate", "5", "--slo", "ttft_p99=1s", "--pd"], "--pd is for the GPU search"),
    ({"num_blocks": "21", "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 2048},
     ["--rate", "5", "--slo", "ttft_p99=1s"], "does not record the engine's scheduler"),
    ({"num_blocks": 1, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 2048},
     ["--rate", "5", "--slo", "ttft_p99=1s"], "needs >= 2 blocks"),
    ({}, ["--rate", "5", "--slo", "ttft_p99=1s"], "does not record the engine's scheduler"),
])
def test_steptime_refusals_are_one_line_and_exit_2(tmp_path, scheduler, extra, message):
    r = _run_measured(_calibration(tmp_path, scheduler), *extra)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_steptime_of_another_model_or_no_calibration_is_refused(tmp_path):
    sched = {"num_blocks": 21, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 2048}
    other = _run_measured(_calibration(tmp_path, sched, model="meta-llama/Llama-3.1-8B"), "--rate", "5", "--slo",
                          "ttft_p99=1s")
    assert other.exit_code == 2 and "was calibrated on meta-llama/Llama-3.1-8B" in other.output
    missing = _run_measured(str(tmp_path / "nowhere"), "--rate", "5", "--slo", "ttft_p99=1s")
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_steptime_names_the_release_the_run_engine_reported(tmp_path):
    """The answer's vLLM release is the run's engine's (run.json's capacity), not the newest rules kvplan has; a
    calibration without its run folder says the rules' own."""
    from kvplan.vllm.rules import rules_for

    run = _calibration(tmp_path, {"num_blocks": 10_000, "block_size": 16, "max_num_seqs": 4,
                                  "max_num_batched_tokens": 2048})
    bare = json.loads(_run_measured(run, "--rate", "10", "--slo", "ttft_p99=1s", "--json").output)
    assert bare["vllm_version"] == rules_for(None).version
    (tmp_path / "run.json").write_text(json.dumps({"config": {"engine": {}},
                                                   "capacity": {"num_blocks": 10_000, "block_size": 16,
                                                                "vllm_version": "0.32.0"}}))
    r = _run_measured(run, "--rate", "10", "--slo", "ttft_p99=1s", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["vllm_version"] == "0.32.0"


def test_steptime_outside_the_calibrated_prompts_says_so(tmp_path):
    """A calibration that saw prompts of 8-64 tokens sizing a fleet of 100-token prompts: its price of a prompt token
    is extrapolated, and the answer says so in one note (JSON and the table's footnote); 8-512 tokens: no note."""
    sched = {"num_blocks": 10_000, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 2048}
    run = _calibration(tmp_path, sched)
    doc = json.loads((tmp_path / "steptime.json").read_text())
    (tmp_path / "steptime.json").write_text(json.dumps(dict(doc, prompt_tokens_seen=[8, 64])))
    out = json.loads(_run_measured(run, "--rate", "20", "--slo", "ttft_p99=1s", "--json").output)
    assert "prompts of 100 tokens are outside the 8-64 tokens" in out["steptime_note"]
    table = _run_measured(run, "--rate", "20", "--slo", "ttft_p99=1s")
    assert "outside the 8-64 tokens" in " ".join(table.output.split())
    (tmp_path / "steptime.json").write_text(json.dumps(dict(doc, prompt_tokens_seen=[8, 512])))
    out = json.loads(_run_measured(run, "--rate", "20", "--slo", "ttft_p99=1s", "--json").output)
    assert out["steptime_note"] is None


def test_a_hybrid_replica_is_simulated_on_its_kv_groups():
    """gpt-oss-20b's pool is shared by a 128-token window group and a full-attention one (config.json: every other
    layer sliding): `SchedulerConfig.from_capacity` carries both, so a replica's requests hold blocks in each; a dense
    Llama's pool stays one full-attention group (None)."""
    from kvplan.api import size

    hybrid = SchedulerConfig.from_capacity(size("openai/gpt-oss-20b", "H100", ctx=8192, source="bundled").capacity)
    dense = SchedulerConfig.from_capacity(size("meta-llama/Llama-3.1-8B", "H100", ctx=8192, source="bundled").capacity)
    assert hybrid.kv_groups is not None and hybrid.kv_groups.describe() == "sliding 128 + full attention"
    assert dense.kv_groups is None


def test_kv_groups_the_simulator_does_not_model_get_no_fleet():
    """Gemma 4's groups have blocks of 16 and 32 tokens (vLLM 0.33), which the hybrid simulator refuses: every shape is left
    unsized with that reason (exit 1), where it used to be simulated as one full-attention group."""
    app = typer.Typer()
    app.command("fit")(fit_cmd.fit)
    app.command("noop")(lambda: None)
    r = CliRunner().invoke(app, ["fit", "google/gemma-4-31B-it", "--ctx", "8k", "--gpus", "H200", "--max-gpus", "1",
                                 "--rate", "1", "--slo", "ttft_p99=2s", "--source", "bundled", "--vllm-version", "0.33.0",
                                 "--json"], env=ENV)
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    assert out["fleets"] == [] and out["fleet_simulations"] == 0
    (reason,) = out["fleet_unmet"]
    assert reason.startswith("latency not simulated: KV groups of different block sizes (16, 32)")
