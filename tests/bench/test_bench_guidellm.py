"""GuideLLM benchmark reports read by `kvplan report` (and, in tests/gate, by `kvplan check --bench`).

No example report file exists in GuideLLM's repository (its tests build reports in code), so the two
reports in tests/bench/data were built field by field to GuideLLM's own pydantic schema by
tests/bench/data/make_guidellm_reports.py:
GenerativeBenchmarksReport (args, benchmarks) and GenerativeBenchmark (config with the SchedulingStrategy,
scheduler_state, scheduler_metrics, metrics, requests) from
https://github.com/vllm-project/guidellm/blob/main/src/guidellm/benchmark/schemas/generative/report.py and
.../generative/benchmark.py; GenerativeMetrics (request_latency in s; time_to_first_token_ms,
inter_token_latency_ms, time_per_output_token_ms in ms, each a StatusDistributionSummary) from
.../generative/metrics.py; DistributionSummary and Percentiles (p001 ... p999) from
https://github.com/vllm-project/guidellm/blob/main/src/guidellm/schemas/statistics.py; the strategies
(``synchronous``, ``concurrent`` with ``streams``, ``throughput``, ``constant``/``poisson`` with ``rate``)
from src/guidellm/scheduler/strategies.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvplan.bench.external import is_guidellm_report, is_vllm_result, read_external, read_guidellm_report
from kvplan.errors import KvplanError

DATA = Path(__file__).parent / "data"


def test_concurrent_report_becomes_typed_points_per_load():
    s = read_guidellm_report(DATA / "guidellm-concurrent.json")
    assert s.source == "GuideLLM" and s.model == "meta-llama/Llama-3.1-8B-Instruct" and s.load_mode == "concurrency"
    assert [p.concurrency for p in s.points] == [4, 16, 64]
    p = s.points[1]
    assert p.mode == "concurrency" and p.status == "ok" and p.requests_ok == 240
    assert p.ttft.p99 == pytest.approx(0.3343933) and p.ttft.n == 240  # ms in the report, seconds here
    assert p.e2e.p99 == pytest.approx(3.52587)  # request_latency is already in seconds
    assert p.itl.n == 240 * 127  # GuideLLM weights ITL by the token gaps of each request
    assert p.tpot.n == 240  # one TPOT per request
    assert p.throughput_tok_s == pytest.approx(1024.0) and p.request_throughput == pytest.approx(8.0)
    # what the source cannot show
    assert p.server.empty and p.server.model_dump() == {} and not p.preempted and p.label == "not measured"
    assert any("no preemption, KV wait or KV fill" in n for n in p.notes)
    assert s.measured_first_preemption is None and s.measured.first_preemption is None
    assert s.model_dump()["measured"] == {} and s.prediction is None  # nothing claimed that the report does not hold


def test_sweep_report_keeps_the_rate_benchmarks_and_says_what_it_left_out():
    s = read_external(DATA / "guidellm-sweep.json")
    assert s.load_mode == "rate" and [p.rate for p in s.points] == [2.5, 5.0]
    assert s.points[1].burstiness == 1.0  # poisson
    assert "left out" in s.load_description and "throughput" in s.load_description
    assert any("TTFT p99 rests on 75 samples" in w for w in s.points[0].warnings)


def test_detection_and_bad_files(tmp_path):
    data = json.loads((DATA / "guidellm-concurrent.json").read_text())
    assert is_guidellm_report(data) and not is_vllm_result(data)
    assert not is_guidellm_report(json.loads((DATA / "vllm-bench-serve-c16.json").read_text()))
    only_throughput = dict(data, benchmarks=[dict(data["benchmarks"][0], config=dict(
        data["benchmarks"][0]["config"], strategy={"type_": "throughput", "max_concurrency": None}))])
    bad = tmp_path / "throughput.json"
    bad.write_text(json.dumps(only_throughput))
    with pytest.raises(KvplanError, match="no GuideLLM benchmark at a fixed concurrency or request rate"):
        read_external(bad)
    other = tmp_path / "other.json"
    other.write_text('{"benchmarks": []}')
    with pytest.raises(KvplanError, match="neither"):
        read_external(other)


def test_kvplan_report_renders_and_compares_guidellm_offline(tmp_path):
    html = tmp_path / "cmp.html"
    proc = subprocess.run([sys.executable, "-m", "kvplan", "report", str(DATA / "guidellm-concurrent.json"),
                           str(DATA / "vllm-bench-serve-c16.json"), "--html", str(html), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [s["source"] for s in out] == ["GuideLLM", "vllm bench serve"]
    assert html.is_file() and "GuideLLM" in html.read_text()
    table = subprocess.run([sys.executable, "-m", "kvplan", "report", str(DATA / "guidellm-sweep.json")],
                           capture_output=True, text=True, timeout=120, env={"COLUMNS": "100", "PATH": ""})
    assert table.returncode == 0, table.stderr
    assert "(GuideLLM)" in table.stdout and "2.5" in table.stdout


# --- the same report saved as YAML --------------------------------------------------------------------


def _as_guidellm_yaml(json_file: Path, out: Path) -> Path:
    """``yaml.dump`` of the report's dict: GuideLLM's own call for --output-path *.yaml (default Dumper)."""
    out.write_text(yaml.dump(json.loads(json_file.read_text())))
    return out


def _points(summary) -> list[dict]:
    """Every figure of every point; the notes name the file they came from (.json or .yaml), so not those."""
    return [p.model_dump(exclude={"notes"}) for p in summary.points]


def test_yaml_report_gives_the_json_reports_points_and_figures(tmp_path):
    raw = json.loads((DATA / "guidellm-concurrent.json").read_text())
    yaml_file = _as_guidellm_yaml(DATA / "guidellm-concurrent.json", tmp_path / "guidellm-concurrent.yaml")
    assert yaml.safe_load(yaml_file.read_text()) == raw  # the fixture holds the JSON report's numbers
    s = read_external(yaml_file)
    assert s.source == "GuideLLM" and s.model == "meta-llama/Llama-3.1-8B-Instruct" and s.load_mode == "concurrency"
    assert [p.concurrency for p in s.points] == [4, 16, 64]
    p = s.points[1]
    # the numbers in the file (ms), as the JSON test above reads them (s)
    assert raw["benchmarks"][1]["metrics"]["time_to_first_token_ms"]["successful"]["percentiles"]["p99"] == 334.3933
    assert p.ttft.p99 == pytest.approx(0.3343933) and p.ttft.n == 240 and p.requests_ok == 240
    assert p.e2e.p99 == pytest.approx(3.52587) and p.itl.n == 240 * 127 and p.tpot.n == 240
    assert p.throughput_tok_s == pytest.approx(1024.0) and p.request_throughput == pytest.approx(8.0)
    assert p.server.empty and not p.preempted and s.measured_first_preemption is None
    assert any("guidellm-concurrent.yaml" in n for n in p.notes)
    from_json = read_external(DATA / "guidellm-concurrent.json")
    assert _points(s) == _points(from_json)
    assert s.model_dump(exclude={"points", "run_dir"}) == from_json.model_dump(exclude={"points", "run_dir"})


def test_yml_sweep_and_a_folder_holding_benchmarks_yaml(tmp_path):
    yml = _as_guidellm_yaml(DATA / "guidellm-sweep.json", tmp_path / "sweep.yml")
    s = read_guidellm_report(yml)
    assert s.load_mode == "rate" and [p.rate for p in s.points] == [2.5, 5.0] and s.points[1].burstiness == 1.0
    assert "left out" in s.load_description and "throughput" in s.load_description
    assert any("TTFT p99 rests on 75 samples" in w for w in s.points[0].warnings)
    assert _points(s) == _points(read_external(DATA / "guidellm-sweep.json"))
    # GuideLLM's default file in a folder given as --output-path with the yaml output: benchmarks.yaml
    folder = tmp_path / "run"
    folder.mkdir()
    _as_guidellm_yaml(DATA / "guidellm-concurrent.json", folder / "benchmarks.yaml")
    s = read_external(folder)
    assert s.run_dir == str(folder / "benchmarks.yaml") and [p.concurrency for p in s.points] == [4, 16, 64]
    # both saved: the JSON one is read (as before)
    (folder / "benchmarks.json").write_text((DATA / "guidellm-sweep.json").read_text())
    assert read_external(folder).load_mode == "rate"


def test_a_tuple_written_by_yaml_dump_is_read_as_a_list(tmp_path):
    """pydantic keeps a tuple field (GuideLLM's args.outputs: list[str] | tuple[str]) a tuple in model_dump, and
    yaml.dump writes it as !!python/tuple, which a plain safe loader refuses; kvplan reads it as a list."""
    data = json.loads((DATA / "guidellm-concurrent.json").read_text())
    data["args"]["outputs"] = ("yaml",)
    text = yaml.dump(data)
    assert "!!python/tuple" in text
    path = tmp_path / "benchmarks.yaml"
    path.write_text(text)
    assert [p.concurrency for p in read_external(path).points] == [4, 16, 64]


@pytest.mark.parametrize("text, match", [
    ("benchmarks: []\n", "not a GuideLLM benchmarks report"),
    ("- 1\n- 2\n", "not a GuideLLM benchmarks report"),
    ("", "not a GuideLLM benchmarks report"),
    ("deployments:\n  - name: chat\n", "not a GuideLLM benchmarks report"),
    ("benchmarks: [\n", r"x\.yaml:2: not valid YAML"),
    ("a: &a [*a]\n", "refers to the node that holds it"),
    ("a: 1\n---\nb: 2\n", "expected a single document"),
    ("benchmarks:\n- metrics: {request_latency: .inf}\n", r"x\.yaml:2: \.inf is not a number kvplan accepts"),
    ("benchmarks:\n- metrics: {request_latency: .nan}\n", "is not a number kvplan accepts"),
    ("a: " + "9" * 5000 + "\n", "too many digits"),
    ("a: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 64 levels"),
])
def test_bad_yaml_is_one_kvplan_error(tmp_path, text, match):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(KvplanError, match=match) as info:
        read_external(path)
    assert "\n" not in str(info.value)


def test_a_folder_whose_benchmarks_yaml_is_not_a_report(tmp_path):
    (tmp_path / "benchmarks.yaml").write_text("a: 1\n")
    with pytest.raises(KvplanError, match="benchmarks.yaml: not a GuideLLM benchmarks report"):
        read_external(tmp_path)


def test_kvplan_report_and_check_read_the_yaml_report(tmp_path):
    report = _as_guidellm_yaml(DATA / "guidellm-concurrent.json", tmp_path / "benchmarks.yaml")
    proc = subprocess.run([sys.executable, "-m", "kvplan", "report", str(report), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["source"] == "GuideLLM" and [p["concurrency"] for p in out["points"]] == [4, 16, 64]
    assert out["points"][1]["ttft"]["p99"] == pytest.approx(0.3343933)
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("deployments:\n  - name: chat\n    model: meta-llama/Llama-3.1-8B-Instruct\n    gpu: H100\n"
                    "    vllm_version: \"0.11.0\"\n    kv_cache_memory: 16GiB\n    context: 32k\n    prompt: 8k\n"
                    "    output: 1\n    concurrency: 14\n    slo: {ttft_p99: 300ms}\n")
    for evidence in (report, tmp_path):  # the file, and the folder GuideLLM wrote it into
        check = subprocess.run([sys.executable, "-m", "kvplan", "check", str(spec), "--bench", str(evidence), "--json"],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "HF_HUB_OFFLINE": "1", "GITHUB_ACTIONS": ""})
        assert check.returncode == 1, check.stderr
        assert "ttft_p99 334.393 ms > 300 ms at concurrency 16" in json.loads(check.stdout)["results"][0]["reason"]


@pytest.mark.parametrize("case", ["alias-bomb", "torn", "fifo", "not-a-report"])
def test_kvplan_report_on_a_bad_yaml_is_exit_2_and_one_line(tmp_path, case):
    path = tmp_path / "benchmarks.yaml"
    if case == "fifo":
        os.mkfifo(path)
    elif case == "alias-bomb":
        path.write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
            f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi")))
    elif case == "torn":
        path.write_text(yaml.dump(json.loads((DATA / "guidellm-concurrent.json").read_text()))[:5000] + '"\n  x: [')
    else:
        path.write_text("deployments: []\n")
    proc = subprocess.run([sys.executable, "-m", "kvplan", "report", str(path)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], proc.stderr


@pytest.mark.parametrize("libyaml", [True, False])
def test_the_bounded_yaml_loader_with_and_without_libyaml(libyaml, monkeypatch):
    """kvplan.paths.parse_yaml_text scans with libyaml's C parser where PyYAML has it, else in Python: same data,
    same limits (the gate's spec reader uses the Python one, kvplan.gate.spec)."""
    import kvplan.paths as paths

    if not libyaml:
        monkeypatch.setattr(paths, "_c_parser", lambda: None)
        assert paths.yaml_loader(libyaml=True) is paths.yaml_loader()  # the pure-Python SafeLoader subclass
    raw = json.loads((DATA / "guidellm-sweep.json").read_text())
    assert paths.parse_yaml_text(yaml.dump(raw), "x.yaml") == raw
    cases = [("a: &a [*a]\n", "x.yaml:1: not valid YAML: alias \\*a refers to the node that holds it"),
             ("a: [" + "0," * 1001 + "]\n", "x.yaml:1: not valid YAML: more than 1,000 nodes"),
             ("a: &a [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\nb: [" + "*a," * 99 + "]\n", "expands to more than 1,000 nodes"),
             ("a: &a 1\nb: [" + "*a," * 101 + "]\n", "more than 100 aliases"),
             ("a:\n  b: -.inf\n", "x.yaml:2: -.inf is not a number kvplan accepts")]
    for text, match in cases:
        with pytest.raises(KvplanError, match=match):
            paths.parse_yaml_text(text, "x.yaml", max_nodes=1000)
