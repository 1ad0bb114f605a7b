"""A data-parallel vLLM server (one API server, ``--data-parallel-size 2``: two engine cores, each with its own KV
pool): kvplan reads each engine's figures by vLLM's ``engine`` label, judges each engine on its own pool, and the
server's onset is its first engine's (kvplan.bench.fleet.EnginePools).

The /metrics text is a real server's: tests/bench/data/data-parallel/, recorded by make_dp_metrics.py (the tiny Llama
on vLLM 0.32's CPU build, 17 blocks of 32 per engine, 3 requests at once of 160 prompt + 160 output tokens). Every
expected number below is read off that text by hand (the lines quoted), or is block arithmetic on it:

- ``vllm:cache_config_info`` says ``num_gpu_blocks="34"`` under both engine labels: the API server writes the engines'
  blocks summed (vllm/v1/engine/core_client.py@0.32.0), so each engine holds 34 / 2 = 17 (the pinned override).
- 160 + 160 tokens peak at ceil(319 / 32) = 10 blocks; 16 usable blocks hold one such request: an engine waits and
  preempts from 2 at once (o = 2). Two engines: 2 (2 - 1) + 1 = 3 streams at the latest, 2 at the earliest.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.llmd import assert_valid_llmd_reports

from kvplan.bench.config import BenchConfig
from kvplan.bench.fleet import EnginePools
from kvplan.bench.metrics import GAUGES, MAX_ENGINES, parse_metrics
from kvplan.bench.point import engine_points
from kvplan.plan.blocks import BlockRule

DATA = Path(__file__).parent / "data" / "data-parallel"
BEFORE, DURING, AFTER = ((DATA / f"{name}.prom").read_text() for name in ("before", "during", "after"))
MODEL = re.search(r'model_name="([^"]*)"', BEFORE).group(1)


def _cfg() -> BenchConfig:
    return BenchConfig(url="http://127.0.0.1:1")  # max_num_seqs unset: not the limit


def _line(text: str, sample: str) -> float:
    """The value of one sample line of the recorded text, found by its name and labels."""
    (value,) = [line.rsplit(" ", 1)[1] for line in text.splitlines()
                if line.startswith(sample.replace("}", f',model_name="{MODEL}"}}'))]
    return float(value)


def test_the_recorded_text_holds_what_the_hand_arithmetic_reads():
    # the lines the expected numbers below come from
    assert _line(DURING, 'vllm:num_requests_running{engine="0"}') == 1.0
    assert _line(DURING, 'vllm:num_requests_waiting{engine="0"}') == 1.0
    assert _line(DURING, 'vllm:num_requests_running{engine="1"}') == 1.0
    assert _line(DURING, 'vllm:num_requests_waiting{engine="1"}') == 0.0
    assert _line(DURING, 'vllm:kv_cache_usage_perc{engine="0"}') == 0.625  # 10 of 16 blocks
    assert _line(AFTER, 'vllm:num_preemptions_total{engine="0"}') == 1.0
    assert _line(AFTER, 'vllm:num_preemptions_total{engine="1"}') == 0.0
    assert _line(AFTER, 'vllm:prompt_tokens_total{engine="0"}') == 320.0  # two requests of 160
    assert _line(AFTER, 'vllm:prompt_tokens_total{engine="1"}') == 160.0  # one
    assert 'num_gpu_blocks="34"' in BEFORE and 'engine="0"' in BEFORE and 'engine="1"' in BEFORE


def test_each_engine_is_read_on_its_own_beside_the_sum():
    during = parse_metrics(DURING, 1.0, GAUGES)  # the fast scrape's parse
    assert sorted(during.engines) == [0, 1] and during.engine_error is None
    e0, e1 = during.engines[0], during.engines[1]
    assert (e0.get("running"), e0.get("waiting"), e0.get("kv_usage")) == (1.0, 1.0, 0.625)
    assert (e1.get("running"), e1.get("waiting")) == (1.0, 0.0)
    # the server as a whole, as before: counts summed, KV usage the fuller engine's
    assert (during.get("running"), during.get("waiting"), during.get("kv_usage")) == (2.0, 1.0, 0.625)
    after = parse_metrics(AFTER, 2.0)
    assert after.engines[0].get("prompt_tokens") == 320 and after.engines[1].get("prompt_tokens") == 160
    assert after.get("prompt_tokens") == 480


def test_the_point_waited_at_the_first_engine_not_by_a_sum():
    engines, why = engine_points(parse_metrics(BEFORE), [parse_metrics(DURING, 1.0, GAUGES)],
                                 parse_metrics(AFTER, 2.0), _cfg(), failed=False)
    assert why is None
    e0, e1 = engines
    assert (e0.name, e0.server.preemptions, e0.server.peak_waiting, e0.server.prompt_tokens) == ("engine 0", 1, 1, 320)
    assert (e0.preempted, e0.waited_for_kv, e0.label) == (True, True, "KV-limited")
    assert e0.wait_evidence == ["preemptions", "waiting gauge"]
    assert e0.first_kv_wait_s == 1.0  # the during scrape, 1 s into the point, saw its queue
    assert (e1.server.preemptions, e1.server.peak_waiting, e1.server.prompt_tokens) == (0, 0, 160)
    assert (e1.preempted, e1.waited_for_kv, e1.label) == (False, False, "neither")
    assert e0.requests is None and e0.peak_in_flight is None  # the DP coordinator chose: the client cannot say


def test_the_engines_pools_and_the_onset_range_by_hand():
    pools = EnginePools(parse_metrics(BEFORE), "http://dp", "http://dp")
    assert pools.names == ["engine 0", "engine 1"]
    assert [(c.num_blocks, c.block_size) for c in pools.capacities] == [(17, 32), (17, 32)]  # 34 / 2
    assert pools.capacity.num_blocks == 34
    rule = BlockRule(num_blocks=17, block_size=32, prompt_tokens=160, output_tokens=160, max_num_seqs=1 << 30)
    assert (rule.peak_blocks, rule.first_kv_wait, rule.first_preemption) == (10, 2, 2)
    server = pools.predict(rule, True, None)
    assert server.first_kv_wait == 3 and server.first_preemption == 3
    summary = pools.summary([], {"first_kv_wait": None, "first_preemption": None})
    assert summary.route == "data-parallel" and summary.first_preemption.predicted == 3
    assert summary.first_preemption.predicted_earliest == 2 and summary.first_preemption.predicted_replica is None
    assert "vllm/v1/engine/core_client.py@0.32.0" in summary.prediction_basis


def _bench_dp(tmp_path: Path, texts, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    """``kvplan bench`` at 3 streams of one request each against a stand-in serving ``texts(n)`` as its n-th /metrics
    (from 1: the run's first scrape, the point's before, its one fast scrape, its after)."""
    from helpers.fake_server import FakeBehaviour, FakeServer

    with FakeServer(FakeBehaviour(metrics_text=texts, token_gap_s=0.005, model_id=MODEL)) as srv:
        proc = subprocess.run(kvplan_cmd("--url", srv.url, "--sweep", "3", "--requests-per-stream", "1",
                                         "--prompt", "160", "--output", "160", "--no-warmup", "--scrape-interval", "10",
                                         "--out", str(tmp_path), *args),
                              capture_output=True, text=True, timeout=120, env=bench_env())
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    """The error lines of the run's stderr (the live view writes its progress there too)."""
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def _recorded(n: int) -> str:
    return (BEFORE, BEFORE, BEFORE, DURING, AFTER)[min(n, 4)]  # scrape 1: the run's, 2: the point's before...


def test_a_bench_run_shows_each_engine_and_the_first_to_preempt(tmp_path):
    proc = _bench_dp(tmp_path, _recorded)
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    s = json.loads((run / "summary.json").read_text())
    (point,) = s["points"]
    assert point["preempted"] and point["wait_evidence"] == ["preemptions (engine 0)", "waiting gauge (engine 0)"]
    assert [(e["name"], e["server"]["preemptions"], e["label"]) for e in point["engines"]] == [
        ("engine 0", 1, "KV-limited"), ("engine 1", 0, "neither")]
    assert point["server"]["prompt_tokens"] == 480 and point["server"]["preemptions"] == 1  # summed, as before
    engines = s["engines"]
    assert [r["capacity"]["num_blocks"] for r in engines["replicas"]] == [17, 17]
    assert engines["first_preemption"] == {"predicted": 3, "predicted_earliest": 2, "predicted_replica": None,
                                           "predicted_share": 2, "measured": 3, "measured_replica": "engine 0",
                                           "measured_in_flight": None, "agrees": True}
    assert (s["predicted_first_preemption"], s["measured_first_preemption"]) == (3, 3)
    assert s["capacity"]["num_blocks"] == 34 and s.get("prediction") is None
    [line] = (run / "points.jsonl").read_text().splitlines()
    assert [e["index"] for e in json.loads(line)["engines"]] == [0, 1]
    assert "first preemption: predicted 2 to 3 streams (3 at the latest, 2 of them on the first engine" in proc.stdout
    assert "measured 3, engine 0; agrees" in proc.stdout
    report = (run / "report.md").read_text()
    assert "## Engines" in report and "| 0 | 17 blocks of 32; alone it waits for KV at 2, preempts at 2 |" in report
    # load 3, each engine's own figures: the most it held (running + waiting in one scrape: 1 + 1, and 1 + 0), its
    # preemptions, queue, KV usage (0.625) and prompt tokens looked up in its prefix cache
    assert "| 3 | 0 | 2 | KV | 1 | 1 | 62% | 0 / 320 |" in report and "| 3 | 1 | 1 | - | 0 | 0 | 62% | 0 / 160 |" in report
    # llm-d-benchmark's report: still valid, each engine's figures kept
    reports = assert_valid_llmd_reports(run)
    kept = reports[max(reports)]["results"]["observability"]["kvplan"]["engines"]
    assert [(e["name"], e["server"]["preemptions"]) for e in kept] == [("engine 0", 1), ("engine 1", 0)]


def test_engine_labels_that_are_no_engines_stop_the_run_in_one_line(tmp_path):
    bad = BEFORE.replace('engine="1"', 'engine="one"')
    proc = _bench_dp(tmp_path, lambda n: bad, code=2)
    [line] = _errors(proc)
    assert "the engine label 'one' is not an engine index" in line


def test_a_thousand_engine_labels_are_refused_in_bounded_time(tmp_path):
    many = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="{MODEL}"}} 0.0\n' for i in range(1000))
    text = "# TYPE vllm:num_requests_running gauge\n" + many
    start = time.monotonic()
    snap = parse_metrics(text)
    assert time.monotonic() - start < 5
    assert snap.engines == {} and f"more than {MAX_ENGINES} engine labels" in snap.engine_error
    proc = _bench_dp(tmp_path, lambda n: text, code=2)
    [line] = _errors(proc)
    assert f"more than {MAX_ENGINES} engine labels" in line


@pytest.mark.parametrize("when", ["during the point", "between points"])
def test_an_engine_that_appears_mid_run_fails_the_point(tmp_path, when):
    one = "".join(line for line in BEFORE.splitlines(keepends=True) if 'engine="1"' not in line)  # engine 0 alone
    texts = (lambda n: (one, one, one, DURING, AFTER)[min(n, 4)]) if when == "during the point" else \
        (lambda n: (one, one, BEFORE, DURING, AFTER)[min(n, 4)])
    proc = _bench_dp(tmp_path, texts, code=4)  # a failed point stops the sweep (exit 4), its record kept
    said = {"during the point": "named engines 0, 1 during the point, none (one engine) before it",
            "between points": "named engines 0, 1 at this point's start, none (one engine) when the run began"}[when]
    [line] = _errors(proc)
    assert "the point at concurrency 3 failed" in line and said in line
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    [point] = [json.loads(row) for row in (run / "points.jsonl").read_text().splitlines()]
    assert point["status"] == "failed" and said in point["error"] and point["label"] == "failed"
    # engines that came during the point give no figures; ones there all through it (from its start) do
    assert ("engines" in point) == (when == "between points")


def test_a_data_parallel_replica_of_a_fleet_is_judged_by_its_engines(tmp_path):
    from helpers.fake_server import FakeBehaviour, FakeServer
    from helpers.fleet import PoolReplica

    with FakeServer(FakeBehaviour(metrics_text=_recorded, token_gap_s=0.005, model_id=MODEL)) as dp, \
            PoolReplica(17, model_id=MODEL) as one:
        proc = subprocess.run(kvplan_cmd("--url", dp.url, "--url", one.url, "--sweep", "3", "--requests-per-stream",
                                         "1", "--prompt", "160", "--output", "160", "--no-warmup",
                                         "--scrape-interval", "10", "--out", str(tmp_path), "--json"),
                              capture_output=True, text=True, timeout=120, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["fleet"]["prediction_basis"].startswith(f"not predicted: replica {dp.url} is data-parallel (2 engines)")
    assert s["fleet"]["replicas"][0]["prediction"] is None  # its cache_config_info's 34 blocks are two engines' 17
    (point,) = s["points"]
    first, second = point["replicas"]
    assert [(e["name"], e["server"]["preemptions"]) for e in first["engines"]] == [("engine 0", 1), ("engine 1", 0)]
    assert first["preempted"] and first["wait_evidence"] == ["preemptions (engine 0)", "waiting gauge (engine 0)"]
    assert "engines" not in second  # one engine: as before
    assert s["fleet"]["first_preemption"]["measured_replica"] == dp.url
