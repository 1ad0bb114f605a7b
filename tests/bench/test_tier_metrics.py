"""The KV tier's counters in each bench point (issue 24 item 5): vLLM's native CPU offloading and any KV connector's
prefix-cache counters, read from /metrics (kvplan.vllm.metric_names.TIER_COUNTERS).

The /metrics text is written by prometheus_client (the library vLLM exposes its metrics with) under vLLM 0.32.0's
names, types and labels (distributed/kv_transfer/kv_connector/v1/offloading/metrics.py: the flat
``vllm:kv_offload_{load,store}_{bytes,time}`` counters and the deprecated ``vllm:kv_offload_total_{bytes,time}`` by
``transfer_type``, both updated for the CPU spec; v1/metrics/loggers.py: ``vllm:external_prefix_cache_{queries,hits}``,
labelled ``model_name`` and ``engine``). Expected figures are the counters set here, summed over engines."""

from __future__ import annotations

from helpers.bench import bench_one_fake_point
from helpers.fake_server import METRICS
from prometheus_client import CollectorRegistry, Counter, generate_latest

from kvplan.bench.metrics import parse_metrics, summarize

LABELS = ["model_name", "engine"]
GiB = 2**30


def _text(engines: dict[str, dict[str, float]], flat: bool = True, deprecated: bool = True) -> str:
    """/metrics of engines {engine: {quantity: value}}: what vLLM 0.32 (flat + deprecated), 0.16-0.23 (deprecated
    only) or a server without offloading (neither) would declare."""
    reg = CollectorRegistry()
    ext_q = Counter("vllm:external_prefix_cache_queries", "queries", LABELS, registry=reg)
    ext_h = Counter("vllm:external_prefix_cache_hits", "hits", LABELS, registry=reg)
    names = ("load_bytes", "load_time", "store_bytes", "store_time")
    flat_counters = {n: Counter(f"vllm:kv_offload_{n}", n, LABELS, registry=reg) for n in names} if flat else {}
    old = {kind: Counter(f"vllm:kv_offload_total_{kind}", kind, LABELS + ["transfer_type"], registry=reg)
           for kind in ("bytes", "time")} if deprecated else {}
    for engine, v in engines.items():
        ext_q.labels("m", engine).inc(v.get("queries", 0))
        ext_h.labels("m", engine).inc(v.get("hits", 0))
        for n in names:
            if n in v:  # vLLM creates a transfer's labelled child at the first transfer
                if flat:
                    flat_counters[n].labels("m", engine).inc(v[n])
                if deprecated:
                    kind, direction = n.split("_")[1], "CPU_to_GPU" if n.startswith("load") else "GPU_to_CPU"
                    old["bytes" if kind == "bytes" else "time"].labels("m", engine, direction).inc(v[n])
    return METRICS.format(running=0.0) + generate_latest(reg).decode()


def test_the_flat_names_summed_over_engines_and_never_counted_twice():
    snap = parse_metrics(_text({"0": {"queries": 300, "hits": 120, "load_bytes": GiB, "load_time": 0.5,
                                      "store_bytes": 3 * GiB, "store_time": 1.25},
                                "1": {"queries": 100, "hits": 40, "load_bytes": GiB, "store_bytes": GiB,
                                      "load_time": 0.25, "store_time": 0.5}}))
    v = snap.values
    assert (v["external_queries"], v["external_hits"]) == (400, 160)
    assert (v["offload_load_bytes"], v["offload_store_bytes"]) == (2 * GiB, 4 * GiB)  # not 4 and 8: flat wins
    assert (v["offload_load_s"], v["offload_store_s"]) == (0.75, 1.75)


def test_the_deprecated_names_by_direction_where_the_flat_ones_are_not_declared():
    v = parse_metrics(_text({"0": {"load_bytes": 5 * GiB, "store_bytes": 7 * GiB, "load_time": 2.0,
                                   "store_time": 3.0}}, flat=False)).values
    assert (v["offload_load_bytes"], v["offload_store_bytes"], v["offload_load_s"], v["offload_store_s"]) == \
        (5 * GiB, 7 * GiB, 2.0, 3.0)


def test_declared_without_a_transfer_is_zero_and_undeclared_is_unknown():
    v = parse_metrics(_text({"0": {"queries": 64}})).values  # families declared, no child created yet
    assert v["external_queries"] == 64 and v["external_hits"] == 0 and v["offload_load_bytes"] == 0
    v = parse_metrics(METRICS.format(running=0.0)).values  # an engine without these families
    assert not {"external_queries", "offload_load_bytes", "offload_store_s"} & set(v)
    lying = METRICS.format(running=0.0) + ("# TYPE vllm:kv_offload_load_bytes counter\n"
                                           "vllm:kv_offload_load_bytes_total{engine=\"0\"} NaN\n")
    assert "offload_load_bytes" not in parse_metrics(lying).values


def test_a_point_carries_the_deltas_and_the_reports_show_them(tmp_path):
    before = parse_metrics(_text({"0": {"queries": 100, "hits": 10, "load_bytes": GiB, "store_bytes": GiB,
                                        "load_time": 0.1, "store_time": 0.2}}))
    after = parse_metrics(_text({"0": {"queries": 612, "hits": 266, "load_bytes": 3 * GiB, "store_bytes": 2 * GiB,
                                       "load_time": 0.6, "store_time": 0.45}}))
    pm = summarize(before, [], after)
    assert (pm.external_queries, pm.external_hits, pm.offload_load_bytes, pm.offload_store_bytes) == \
        (512, 256, 2 * GiB, GiB)
    assert pm.offload_load_s == 0.5 and abs(pm.offload_store_s - 0.25) < 1e-12

    # The whole path: a server whose counters grow between the scrapes around the point.
    def metrics(n: int) -> str:
        k = n // 2  # two scrapes a step: the counters move between the point's first and last
        return _text({"0": {"queries": 512 * k, "hits": 128 * k, "load_bytes": GiB * k, "store_bytes": 2 * GiB * k,
                            "load_time": 0.25 * k, "store_time": 0.5 * k}})

    point = bench_one_fake_point(tmp_path, metrics)
    srv_figures = point["server"]
    assert srv_figures["external_queries"] > 0 and srv_figures["external_hits"] * 4 == srv_figures["external_queries"]
    assert srv_figures["offload_store_bytes"] == 2 * srv_figures["offload_load_bytes"] > 0
    assert isinstance(srv_figures["external_queries"], int)  # a whole count is an integer in the JSON
    run = next(tmp_path.iterdir())
    report = (run / "report.md").read_text()
    assert "## KV tier (the engine's connector counters)" in report and "| 25.0% |" in report
    html = (run / "report.html").read_text()
    assert "<caption>KV tier (the engine's connector counters)</caption>" in html
    assert "<td>25.0%</td>" in html
    header, row = (run / "points.csv").read_text().splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(",")))
    assert int(cells["external_hits"]) * 4 == int(cells["external_queries"])
