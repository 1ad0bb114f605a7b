"""`kvplan bench --url` against an SGLang server (issue 25 item 4): its /metrics read under SGLang's own names
(kvplan/sglang/metric_names.py). SGLang itself does not build on this CPU machine, so the /metrics text is written
by prometheus_client (the library SGLang exposes its metrics with) under SGLang 0.5.23's names, types and labels
(srt/observability/metrics_collector.py@0.5.23: gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
`sglang:token_usage`; counters `sglang:num_retracted_requests_total`, `sglang:prompt_tokens_total`,
`sglang:generation_tokens_total`; histograms `sglang:time_to_first_token_seconds` ...; labels model_name,
engine_type, tp_rank, pp_rank, moe_ep_rank, one series per attention-DP group), and served by a fake."""

from __future__ import annotations

from helpers.bench import bench_one_fake_point
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvplan.bench.metrics import parse_metrics, summarize

LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]


def _text(groups: dict[str, dict[str, float]]) -> str:
    """/metrics of an SGLang server: {dp group's tp_rank: {quantity: value}}."""
    reg = CollectorRegistry()
    running = Gauge("sglang:num_running_reqs", "running", LABELS, registry=reg)
    queued = Gauge("sglang:num_queue_reqs", "queued", LABELS, registry=reg)
    usage = Gauge("sglang:token_usage", "token usage", LABELS, registry=reg)
    retracted = Counter("sglang:num_retracted_requests_total", "retracted", LABELS, registry=reg)
    prompt = Counter("sglang:prompt_tokens_total", "prompt", LABELS + ["is_streaming"], registry=reg)
    generated = Counter("sglang:generation_tokens_total", "generated", LABELS + ["is_streaming"], registry=reg)
    ttft = Histogram("sglang:time_to_first_token_seconds", "ttft", LABELS + ["is_streaming"], registry=reg,
                     buckets=(0.1, 0.5, 1.0, float("inf")))
    for rank, v in groups.items():
        labels = ("fake", "unified", rank, "0", "0")
        running.labels(*labels).set(v.get("running", 0))
        queued.labels(*labels).set(v.get("queued", 0))
        usage.labels(*labels).set(v.get("usage", 0))
        retracted.labels(*labels).inc(v.get("retracted", 0))
        prompt.labels(*labels, "true").inc(v.get("prompt", 0))
        generated.labels(*labels, "true").inc(v.get("generated", 0))
        for seconds in v.get("ttfts", ()):
            ttft.labels(*labels, "true").observe(seconds)
    return generate_latest(reg).decode()


def test_sglang_s_names_are_read_over_its_dp_groups():
    snap = parse_metrics(_text({"0": {"running": 3, "queued": 2, "usage": 0.5, "retracted": 4, "prompt": 100,
                                      "generated": 40, "ttfts": (0.05, 0.3)},
                                "4": {"running": 1, "queued": 1, "usage": 0.75, "retracted": 1, "prompt": 20,
                                      "generated": 10}}))
    v = snap.values
    assert (v["running"], v["waiting"], v["preemptions"]) == (4, 3, 5)  # summed over the two groups
    assert v["kv_usage"] == 0.75  # the fullest pool, as for vLLM's engines
    assert (v["prompt_tokens"], v["generation_tokens"]) == (120, 50)
    assert snap.histograms["ttft"].count == 2


def test_a_bench_point_against_sglang_counts_its_retractions_as_preemptions(tmp_path):
    before = parse_metrics(_text({"0": {"retracted": 2}}))
    after = parse_metrics(_text({"0": {"retracted": 7}}))
    assert summarize(before, [], after).preemptions == 5

    def metrics(n: int) -> str:  # the retraction counter grows between the point's scrapes
        return _text({"0": {"running": 1, "retracted": 3 * (n // 2), "usage": 0.25}})

    point = bench_one_fake_point(tmp_path, metrics)
    assert point["server"]["preemptions"] > 0 and point["server"]["preemptions"] % 3 == 0
    assert point["preempted"] is True
