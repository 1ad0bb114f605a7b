"""AIPerf and inference-perf results read as evidence by `kvplan report` (and `kvplan check --bench`), as vllm bench
and GuideLLM results are.

The samples are each tool's own output, unchanged:
- tests/bench/data/aiperf/{concurrency-2,rate-4}: AIPerf 0.13.0 run against the real vLLM CPU engine of the engine
  tests by tests/bench/data/make_aiperf_results.py (its docstring: the command and the load).
- tests/bench/data/inference-perf: stages 0-2 of inference-perf's own published run, copied from
  https://github.com/kubernetes-sigs/inference-perf/tree/7de5ef2ed6f7934e0ecbc8297e593f79e68430c0/demos/kubecon-na-2025
  (vllm+batch_size/results/stage_{0,1,2}_lifecycle_metrics.json and stage_0_prometheus_metrics.json, and that demo's
  config.yaml, its load: constant rate stages).
Expected figures are the files' own numbers, copied by hand (ms in AIPerf's file, seconds here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.bench.external import read_external
from kvplan.errors import KvplanError

DATA = Path(__file__).parent / "data"
AIPERF = DATA / "aiperf"
IPERF = DATA / "inference-perf"


def test_inference_perf_stages_become_rate_points():
    s = read_external(IPERF)
    assert s.source == "inference-perf" and s.model == "meta-llama/Meta-Llama-3-8B-Instruct" and s.load_mode == "rate"
    assert [p.rate for p in s.points] == [1.0, 37.97, 74.94] and [p.seq for p in s.points] == [0, 1, 2]
    p = s.points[0]
    assert p.requests == 60 and p.requests_ok == 60 and p.requests_failed == 0 and p.status == "ok"
    assert p.ttft.p99 == 0.04251505806925707 and p.ttft.p50 == 0.032918093027547 and p.ttft.n == 60  # seconds
    assert p.e2e.p99 == 0.49334994919016023 and p.tpot.p99 == 0.003545912434292827
    assert p.itl.p99 == 0.007360343483742327
    assert p.output_tokens == 3741 and p.itl.n == 3741 - 60  # output_len mean 62.35 x 60 requests; a gap a token after the first
    assert p.throughput_tok_s == 62.15363932698074 and p.request_throughput == 0.996850670841712
    assert p.wall_s == 59.7131 and p.burstiness is None  # send_duration; the demo's load.type: constant
    # what it cannot show: its Prometheus file (beside it, all zeros) is not read as evidence
    assert p.server.empty and not p.preempted and s.measured_first_preemption is None
    assert any("no server metrics" in n for n in p.notes)


def test_an_inference_perf_stage_file_and_a_concurrency_stage(tmp_path):
    one = read_external(IPERF / "stage_2_lifecycle_metrics.json")
    assert [(p.seq, p.rate, p.requests_ok) for p in one.points] == [(2, 74.94, 4496)]
    # inference-perf 0.7.0 adds load_summary.concurrency on a `concurrent` load (reportgen/base.py summarize_requests)
    for i in (0, 1):
        data = json.loads((IPERF / f"stage_{i}_lifecycle_metrics.json").read_text())
        data["load_summary"]["concurrency"] = 4 * (i + 1)
        (tmp_path / f"stage_{i}_lifecycle_metrics.json").write_text(json.dumps(data))
    s = read_external(tmp_path)
    assert s.load_mode == "concurrency" and [p.concurrency for p in s.points] == [4, 8]
    assert s.model == "unknown"  # no config.yaml beside them


def test_aiperf_concurrency_and_rate_runs():
    s = read_external(AIPERF / "concurrency-2")
    assert s.source == "AIPerf" and s.load_mode == "concurrency" and s.model.endswith("tiny-llama")
    (p,) = s.points
    assert p.concurrency == 2 and p.requests_ok == 24 and p.requests_failed == 0 and p.status == "ok"
    assert p.ttft.p99 == pytest.approx(0.3056688156399999) and p.ttft.p50 == pytest.approx(0.05825764) and p.ttft.n == 24
    assert p.e2e.p99 == pytest.approx(0.31803524380999994)
    assert p.tpot.p99 == pytest.approx(0.004548024516931818)  # AIPerf's inter_token_latency: one a request
    assert p.itl.n is None and p.itl.p99 is None  # no per-token gaps in its summary
    assert p.throughput_tok_s == 175.05754413849118 and p.request_throughput == 8.863673120936262
    assert p.output_tokens == 474 and p.wall_s == 2.6995
    assert p.server.preemptions == 0 and p.server.peak_kv_usage is None and not p.preempted
    assert any("the server's usage says 384" in n for n in p.notes)  # 24 requests x 16 tokens (--osl 16)
    rate = read_external(AIPERF / "rate-4" / "profile_export_aiperf.json")
    (r,) = rate.points
    assert rate.load_mode == "rate" and r.rate == 4.0 and r.burstiness == 1.0  # AIPerf's default: Poisson arrivals
    assert r.ttft.p99 == pytest.approx(0.14670460094999999) and r.request_throughput == 5.305363329353292


def test_aiperf_preemptions_from_its_server_metrics(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(AIPERF / "concurrency-2", run)
    metrics = json.loads((run / "server_metrics_export.json").read_text())
    metrics["metrics"]["vllm:num_preemptions"]["series"][0]["stats"]["total"] = 7.0  # as a run that preempted
    (run / "server_metrics_export.json").write_text(json.dumps(metrics))
    (p,) = read_external(run).points
    assert p.server.preemptions == 7 and p.preempted
    (run / "server_metrics_export.json").unlink()
    (p,) = read_external(run).points
    assert p.server.empty and not p.preempted and any("no server metrics export" in n for n in p.notes)


def test_a_folder_of_aiperf_runs_is_one_sweep(tmp_path):
    for name in ("c2", "c4"):
        shutil.copytree(AIPERF / "concurrency-2", tmp_path / name)
    data = json.loads((tmp_path / "c4" / "profile_export_aiperf.json").read_text())
    data["input_config"]["phases"][1]["concurrency"] = 4
    (tmp_path / "c4" / "profile_export_aiperf.json").write_text(json.dumps(data))
    s = read_external(tmp_path)
    assert [p.concurrency for p in s.points] == [2, 4]
    with pytest.raises(KvplanError, match="mixes request-rate and concurrency runs"):
        read_external(AIPERF)


def _report(*paths: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvplan", "report", *map(str, paths), "--json"], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})


def test_kvplan_report_reads_both():
    proc = _report(AIPERF / "concurrency-2", IPERF)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [s["source"] for s in out] == ["AIPerf", "inference-perf"]
    assert out[1]["points"][2]["ttft"]["p99"] == 0.06029721509548836


def _stage(**changes) -> str:
    data = json.loads((IPERF / "stage_0_lifecycle_metrics.json").read_text())
    data["load_summary"].update(changes)
    return json.dumps(data)


def _aiperf(mutate) -> str:
    data = json.loads((AIPERF / "rate-4" / "profile_export_aiperf.json").read_text())
    mutate(data)
    return json.dumps(data)


@pytest.mark.parametrize("name, text, match", [
    ("stage_0_lifecycle_metrics.json", (IPERF / "stage_0_lifecycle_metrics.json").read_text()[:900], "not valid JSON"),
    ("stage_0_lifecycle_metrics.json", _stage(requested_rate="fast"), "the load is unknown"),
    ("stage_0_lifecycle_metrics.json", _stage(requested_rate=0, concurrency=0), "the load is unknown"),
    ("stage_0_lifecycle_metrics.json", _stage(requested_rate=1e400), "not a number kvplan accepts"),
    ("stage_0_lifecycle_metrics.json", "[" * 5000 + "]" * 5000, "nested deeper"),
    ("stage_0_prometheus_metrics.json", (IPERF / "stage_0_prometheus_metrics.json").read_text(), "neither"),
    ("profile_export_aiperf.json", _aiperf(lambda d: d["input_config"].pop("phases")), "the load is unknown"),
    ("profile_export_aiperf.json", _aiperf(lambda d: d.update(request_count={"unit": "requests", "avg": "24"})),
     None),
])
def test_hostile_results_are_one_line_and_exit_2(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    proc = _report(path)
    if match is None:  # a figure that is not a number is no figure: the run has no successful request
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["points"][0]["status"] == "failed"
        return
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], proc.stderr


def test_a_fifo_or_a_huge_file_in_their_place(tmp_path):
    folder = tmp_path / "iperf"
    folder.mkdir()
    os.mkfifo(folder / "stage_0_lifecycle_metrics.json")
    proc = _report(folder, timeout=30)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    big = tmp_path / "aiperf"
    big.mkdir()
    with open(big / "profile_export_aiperf.json", "wb") as fh:
        fh.truncate(65 * 2**20)  # past kvplan's 64 MiB cap on a result file: refused before it is read
    proc = _report(big, timeout=30)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_kvplan_check_gates_an_slo_on_aiperf_evidence(tmp_path):
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("deployments:\n  - name: chat\n    model: meta-llama/Llama-3.1-8B-Instruct\n    gpu: H100\n"
                    "    vllm_version: \"0.11.0\"\n    kv_cache_memory: 16GiB\n    context: 32k\n    prompt: 8k\n"
                    "    output: 1\n    concurrency: 2\n    slo: {ttft_p99: 300ms}\n")
    run = tmp_path / "run"  # the sample, its model renamed to the deployment's (the gate matches evidence by model)
    shutil.copytree(AIPERF / "concurrency-2", run)
    data = json.loads((run / "profile_export_aiperf.json").read_text())
    data["input_config"]["models"]["items"][0]["name"] = "meta-llama/Llama-3.1-8B-Instruct"
    (run / "profile_export_aiperf.json").write_text(json.dumps(data))
    check = subprocess.run([sys.executable, "-m", "kvplan", "check", str(spec), "--bench", str(run), "--json"],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "GITHUB_ACTIONS": ""})
    assert check.returncode == 1, check.stderr
    # AIPerf's TTFT p99 at concurrency 2: 305.6688 ms (its file)
    assert "ttft_p99 305.669 ms > 300 ms at concurrency 2" in json.loads(check.stdout)["results"][0]["reason"]
