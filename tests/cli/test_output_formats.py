"""`--format table|json|markdown|csv` on the tabular commands: every format carries the same rows."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from helpers.harness import invoke  # noqa: E402

GPUS = Path(__file__).resolve().parents[2] / "profiles" / "gpus.json"


@pytest.mark.parametrize("command", ["gpus", "models"])
def test_csv_and_markdown_hold_the_json_rows(command):
    as_json = json.loads(invoke(command, "--format", "json").stdout)
    assert as_json == json.loads(invoke(command, "--json").stdout)
    as_csv = list(csv.DictReader(io.StringIO(invoke(command, "--format", "csv").stdout)))
    assert len(as_csv) == len(as_json) > 10
    for raw, row in zip(as_json, as_csv):
        assert list(row) == list(raw) and all(row[k] == str(v) for k, v in raw.items() if v is not None)
    md = invoke(command, "--format", "markdown").stdout.splitlines()
    assert md[0].startswith("| ") and set(md[1]) <= set("|-: ")
    body = [line for line in md[2:] if line.startswith("| ")]
    assert len(body) == len(as_json)
    first = as_json[0]["name" if command == "gpus" else "model"]
    assert body[0].startswith(f"| {first} |")


def test_the_catalog_figures_reach_every_format():
    # RTX 3090: 24,576 MiB in profiles/gpus.json
    entry = next(g for g in json.loads(GPUS.read_text())["gpus"] if g["name"] == "RTX 3090")
    assert entry["memory_mib"] == 24576
    assert "RTX 3090,24576," in invoke("gpus", "--format", "csv").stdout
    assert "| RTX 3090 | 24,576 |" in invoke("gpus", "--format", "markdown").stdout


def test_two_formats_at_once_or_an_unknown_one_is_bad_input():
    assert "two formats" in invoke("gpus", "--json", "--format", "csv").one_line_error()
    assert "--format" in invoke("models", "--format", "xml").one_line_error()


def test_validate_rows_in_csv_and_markdown():
    rows = list(csv.DictReader(io.StringIO(invoke("validate", "--format", "csv").stdout)))
    as_json = json.loads(invoke("validate", "--json").stdout)
    expected = [(case["case_id"], case["mode"], c["quantity"]) for case in as_json["cases"] for c in case["comparisons"]]
    assert [(r["case_id"], r["mode"], r["quantity"]) for r in rows] == expected and len(rows) > 20
    # kv001's page math as the report prints it: 1,952 blocks (profiles/reports/vllm-startup-reports.jsonl)
    assert any(r["case_id"] == "kv001" and r["quantity"] == "blocks" and float(r["reported"]) == 1952 for r in rows)
    md = invoke("validate", "--format", "markdown").stdout
    assert md.startswith("| case | model | mode |") and md.count("\n| kv001 |") >= 3


def _csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def _markdown_rows(text: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows (the header and the alignment row dropped)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]


# -- kvplan fit ----------------------------------------------------------------------------------------

FIT = ("fit", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "-c", "16", "--gpus", "H100", "--max-gpus", "2",
       "--price", "H100=2.5", "--top", "3")


def test_fit_rows_in_csv_and_markdown():
    payload = json.loads(invoke(*FIT, "--json").stdout)
    assert json.loads(invoke(*FIT, "--format", "json").stdout)["deployments"] == payload["deployments"]
    result = invoke(*FIT, "--format", "csv")
    assert result.code == 0, result.stderr
    rows = _csv(result.stdout)
    assert len(rows) == len(payload["deployments"]) == 3
    for rank, (row, d) in enumerate(zip(rows, payload["deployments"]), 1):
        assert int(row["rank"]) == rank and row["gpu"] == d["gpu"] == "H100 SXM"
        assert int(row["max_model_len"]) == 32 * 1024
        assert float(row["price_per_hour"]) == int(row["gpus"]) * 2.5  # --price H100=2.5 per GPU-hour
        assert int(row["gpus"]) == int(row["tensor_parallel_size"]) * int(row["pipeline_parallel_size"]) \
            * int(row["data_parallel_size"])
        assert float(row["headroom"]) == d["headroom"] and row["kv_cache_dtype"] == d["kv_cache_dtype"]
        assert float(row["ttft_ms"]) == d["latency_estimate"]["ttft_ms"]
        assert float(row["output_tokens_per_s"]) == d["latency_estimate"]["output_tokens_per_s"]
        assert row["vllm_serve_command"].startswith("vllm serve meta-llama/Llama-3.1-8B --max-model-len 32768")
    md = invoke(*FIT, "--format", "markdown").stdout
    assert md.startswith("| # | GPU | GPUs | TP | PP | DP | KV dtype | context | headroom | TTFT ms | TPOT ms |")
    body = _markdown_rows(md)
    assert len(body) == 3 and "Latency: prior step-time estimate" in md
    first, d = body[0], payload["deployments"][0]
    assert first[:2] == ["1", "H100 SXM"] and first[7] == "32,768"
    assert first[8] == f"{round(d['headroom'] * 100)}%" and first[12] == f"{d['gpus'] * 2.5:.2f}"


def test_fit_with_slos_tabulates_the_simulated_figures():
    args = ("fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "-c", "8", "--prompt", "2k", "--output", "64",
            "--gpus", "H100", "--max-gpus", "1", "--top", "1", "--slo", "ttft_p99=2s,itl_p99=100ms")
    deployment = json.loads(invoke(*args, "--json").stdout)["deployments"][0]
    row = _csv(invoke(*args, "--format", "csv").stdout)[0]
    assert "ttft_ms" not in row
    assert float(row["ttft_p99_ms"]) == deployment["slo"]["ttft_p99"]["predicted_ms"]
    assert float(row["itl_p99_ms"]) == deployment["slo"]["itl_p99"]["predicted_ms"]
    assert float(row["output_tokens_per_s"]) == deployment["latency_predicted"]["output_tokens_per_s"]


def test_fit_with_nothing_that_fits_prints_the_header_and_exits_1():
    result = invoke("fit", "meta-llama/Llama-3.1-70B", "--ctx", "128k", "-c", "64", "--gpus", "RTX 3090",
                    "--max-gpus", "1", "--format", "csv")
    assert result.code == 1 and result.stderr.startswith("NOTHING FITS within the search (")
    assert result.stdout.splitlines() == ["rank,gpu,gpus,tensor_parallel_size,pipeline_parallel_size,"
                                          "data_parallel_size,kv_cache_dtype,max_model_len,headroom,ttft_ms,tpot_ms,"
                                          "output_tokens_per_s,price_per_hour,vllm_serve_command"]


# -- kvplan check --------------------------------------------------------------------------------------

# Llama-3.1-8B with the pool pinned (tests/gate/test_check_cli.py): 131,072 B/token, a 16-token block is
# 2 MiB, 16 GiB = 8,192 blocks of which 8,191 usable; a request of 8,192 + 1 tokens holds 512 blocks.
SPEC = """\
defaults:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  vllm_version: "0.11.0"
  kv_cache_memory: 16GiB
  context: 32k
  prompt: 8k
  output: 1
  headroom: 0.1
deployments:
  - name: fits14
    concurrency: 14
  - name: "=HYPERLINK(1)"
    concurrency: 17
    headroom: 0
"""
NO_GITHUB = {"GITHUB_ACTIONS": "", "GITHUB_STEP_SUMMARY": "", "GITHUB_WORKSPACE": ""}


def test_check_rows_in_csv_and_markdown(tmp_path):
    spec = tmp_path / "kvplan.yaml"
    spec.write_text(SPEC)
    report = json.loads(invoke("check", str(spec), "--json", env=NO_GITHUB).stdout)
    assert json.loads(invoke("check", str(spec), "--format", "json", env=NO_GITHUB).stdout) == report
    result = invoke("check", str(spec), "--format", "csv", "--github-annotations", env=NO_GITHUB)
    assert result.code == 1  # one deployment does not fit
    assert "::error" in result.stderr and "::error" not in result.stdout  # stdout stays one CSV document
    rows = _csv(result.stdout)
    assert [int(r["blocks_needed"]) for r in rows] == [14 * 512, 17 * 512]
    assert [int(r["pool_blocks"]) for r in rows] == [8191, 8191]
    assert float(rows[0]["pool_used"]) == round(14 * 512 / 8191, 4) and rows[0]["fits"] == "True"
    assert rows[1]["fits"] == "False" and rows[1]["limiting_term"] == "KV pool"
    assert rows[1]["deployment"] == "'=HYPERLINK(1)"  # a name is never a spreadsheet formula
    assert [(r["file"], int(r["line"])) for r in rows] == [(r["file"], r["line"]) for r in report["results"]]
    md = invoke("check", str(spec), "--format", "markdown", env=NO_GITHUB).stdout
    body = _markdown_rows(md)
    # 7,168 of 8,191 blocks: 88% of the pool, a 12% margin
    assert body[0][:10] == ["fits14", "meta-llama/Llama-3.1-8B-Instruct", "H100 SXM", "1", "32k", "14", "88%", "12%",
                            "fits", "none"]
    assert body[1][8] == "DOES NOT FIT" and body[1][6] == "107%"  # 8,704 of 8,191 = 106.3%, a used share rounded up
    assert md.rstrip().endswith("1 of 2 deployments fit\n- =HYPERLINK(1): 17 requests of 8,192 tokens need 8,704 blocks "
                                "per replica; the pool has 8,191 usable: 15 fit at once, the rest wait or are preempted")


# -- kvplan report -------------------------------------------------------------------------------------

BENCH_DATA = Path(__file__).resolve().parents[1] / "bench" / "data"


def test_report_rows_in_csv_and_markdown(tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)  # two runs write ./kvplan-report.html
    vllm = tmp_path / "vllm"
    vllm.mkdir()
    for name in ("vllm-bench-serve-c16.json", "vllm-bench-serve-c32.json"):
        shutil.copy(BENCH_DATA / name, vllm)
    run = tmp_path / "rate-run"
    shutil.copytree(BENCH_DATA / "old-run-rate", run)  # `report` rewrites a kvplan run's report files
    summaries = json.loads(invoke("report", str(vllm), str(run), "--json").stdout)
    assert json.loads(invoke("report", str(vllm), str(run), "--format", "json").stdout) == summaries
    rows = _csv(invoke("report", str(vllm), str(run), "--format", "csv").stdout)
    assert [(r["source"], r["load_mode"], float(r["load"])) for r in rows] == [
        ("vllm bench serve", "concurrency", 16), ("vllm bench serve", "concurrency", 32), ("kvplan", "rate", 20)]
    # vllm-bench-serve-c16.json: p99_ttft_ms 702.55 over 200 requests, p99_itl_ms 14.08, p99_e2el_ms 3977.2,
    # output_throughput 2445.66
    c16 = rows[0]
    assert (float(c16["ttft_p99_ms"]), int(c16["ttft_n"]), float(c16["itl_p99_ms"]), float(c16["e2e_p99_ms"]),
            float(c16["output_tok_s"])) == (702.55, 200, 14.08, 3977.2, 2445.66)
    assert c16["preemptions"] == "" and c16["slo_met"] == ""  # vllm bench serve reports neither
    rate = summaries[1]["points"][0]
    assert float(rows[2]["ttft_p99_ms"]) == round(rate["ttft"]["p99"] * 1000, 3) and rows[2]["slo_met"] == "True"
    body = _markdown_rows(invoke("report", str(vllm), str(run), "--format", "markdown").stdout)
    assert body[0][1:] == ["vllm bench serve", "concurrency", "16", "-", "703", "200", "14", "3,977", "2,446", "-"]
    assert body[2][2:4] == ["rate", "20"] and body[2][-1] == "met"
