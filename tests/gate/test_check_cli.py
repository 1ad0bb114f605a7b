"""`kvplan check` end to end: exit codes, the table, JSON, JUnit, the GitHub step summary and
annotations, and gating on `kvplan bench` run folders.

The pool is pinned with kv_cache_memory so the arithmetic is exact. Llama-3.1-8B (bundled
config: 32 layers, 8 KV heads, head_dim 128, bf16): 2 x 32 x 8 x 128 x 2 = 131,072 bytes per
token; a 16-token block = 2 MiB; 16 GiB = 8,192 blocks, 8,191 usable (vLLM V1 keeps block 0 as
the null block). A request of prompt 8,192 + output 1 holds 8,192 tokens = 512 blocks, so:
14 requests = 7,168 blocks = 87.5% of the pool; 15 = 7,680 = 93.8%; 17 = 8,704 > 8,191.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.check import SPEC, only, run, run_dir, write


@pytest.fixture()
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "kvplan.yaml"
    path.write_text(SPEC)
    return path


def test_all_fit_exits_0(tmp_path):
    result = run(["check", str(write(tmp_path, only("fits14")))])
    assert result.exit_code == 0, result.output
    assert "fits14" in result.stdout and "1 of 1 deployments fit" in result.stdout
    assert "88%" in result.stdout and "12%" in result.stdout  # pool used 87.5%, margin 12.5%


def test_fit_headroom_and_pool_failures_exit_1_with_json(spec):
    result = run(["check", str(spec), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert (report["total"], report["passed"], report["failed"], report["ok"]) == (3, 1, 2, False)
    rows = {r["name"]: r for r in report["results"]}
    assert rows["fits14"]["fits"] and rows["fits14"]["blocks_needed"] == 7168 and rows["fits14"]["pool_blocks"] == 8191
    assert rows["fits14"]["line"] == 11
    h = rows["headroom15"]
    assert not h["fits"] and h["limiting_term"] == "headroom" and h["blocks_needed"] == 7680
    # 90% of 8,191 = 7,371 blocks: 14 requests of 512 blocks (7,168) fit in it.
    assert h["suggestion"] == "lower the concurrency (concurrency: 14)"
    p = rows["pool17"]
    assert not p["fits"] and p["limiting_term"] == "KV pool" and p["blocks_needed"] == 8704
    assert p["max_concurrency_at_request"] == 15  # 8,191 // 512
    assert p["suggestion"]  # the planner's first fitting change, as spec keys
    assert "--" not in p["suggestion"]


def test_table_names_the_failures_and_their_lines(spec):
    result = run(["check", str(spec)], COLUMNS="250")  # the spec's path whole (80 columns elide a long tmp path)
    assert result.exit_code == 1
    assert f"headroom15 ({spec}:13, meta-llama/Llama-3.1-8B-Instruct)" in result.stdout
    assert f"pool17 ({spec}:15, meta-llama/Llama-3.1-8B-Instruct)" in result.stdout
    assert "1 of 3 deployments fit" in result.stdout


def test_junit_has_one_case_per_deployment(spec, tmp_path):
    junit = tmp_path / "out" / "kvplan.xml"
    result = run(["check", str(spec), "--junit", str(junit)])
    assert result.exit_code == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("3", "2")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["fits14", "headroom15", "pool17"]
    assert cases["fits14"].find("failure") is None
    failure = cases["headroom15"].find("failure")
    assert failure.get("type") == "headroom" and "93.8% of the KV pool" in failure.get("message")
    assert "suggested fix: lower the concurrency (concurrency: 14)" in failure.text
    assert cases["pool17"].find("failure").get("type") == "KV pool"
    assert cases["pool17"].get("line") == "15"


def test_step_summary_only_when_the_variable_is_set(spec, tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    result = run(["check", str(spec)], GITHUB_STEP_SUMMARY=str(summary))
    assert result.exit_code == 1
    text = summary.read_text()
    assert text.startswith("# earlier step\n")  # appended, not overwritten
    assert "kvplan check" in text and "1 of 3 deployments fit" in text
    assert "| headroom15 |" in text and "❌ does not fit" in text
    before = summary.read_text()
    result = run(["check", str(spec)])  # GITHUB_STEP_SUMMARY unset
    assert result.exit_code == 1
    assert summary.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvplan.yaml", "summary.md"]


def test_annotations_inside_github_actions(spec):
    result = run(["check", str(spec)], GITHUB_ACTIONS="true")
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("::error ")]
    assert len(lines) == 2
    assert lines[0].startswith(f"::error file={spec},line=13,title=kvplan%3A headroom15 does not fit::")
    assert "::error" not in run(["check", str(spec)]).stdout
    # --json keeps stdout one JSON document: the annotations go to stderr.
    result = run(["check", str(spec), "--json"], GITHUB_ACTIONS="true")
    json.loads(result.stdout)
    assert result.stderr.count("::error ") == 2


def test_invalid_spec_exits_2_with_file_line_field(tmp_path):
    path = write(tmp_path, SPEC.replace("concurrency: 15", "concurrency: 15x"))
    result = run(["check", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"error: {path}:14: deployments[1].concurrency: Input should be a valid integer, "
        "unable to parse string as an integer (got '15x')"
    )


def test_invalid_spec_annotations_junit_and_summary(tmp_path):
    path = write(tmp_path, SPEC.replace("  gpu: H100\n", "  gpu: H100\n  colour: blue\n"))
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    result = run(["check", str(path), "--junit", str(junit)], GITHUB_ACTIONS="true",
                 GITHUB_STEP_SUMMARY=str(summary))
    assert result.exit_code == 2
    assert f"{path}:4: defaults.colour: unknown key" in result.stderr
    assert f"::error file={path},line=4,title=kvplan%3A invalid spec::" in result.stdout
    error = ET.parse(junit).getroot().find("testsuite/testcase/error")
    assert "defaults.colour: unknown key" in error.get("message")
    assert "the spec is invalid" in summary.read_text()


def test_unknown_model_and_plan_errors_exit_2(tmp_path):
    path = write(tmp_path, only("fits14").replace("name: fits14\n", "name: fits14\n    model: nobody/no-such-model\n"))
    result = run(["check", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {path}:12: deployments[0].model: cannot find model 'nobody/no-such-model'")
    path = write(tmp_path, only("fits14").replace("name: fits14\n", "name: fits14\n    gpu: 2xH100\n    tp: 4\n"))
    result = run(["check", str(path)])
    assert result.exit_code == 2
    assert f"{path}:13: deployments[0].tp: tp 4 x pp 1 needs 4 GPUs, 2 given" in result.stderr
    path = write(tmp_path, only("fits14").replace("name: fits14\n", "name: fits14\n    gpu: H1000\n"))
    result = run(["check", str(path)])
    assert result.exit_code == 2 and f"{path}:12: deployments[0].gpu: unknown GPU 'H1000'" in result.stderr


def test_missing_file_exits_2(tmp_path):
    result = run(["check", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'missing.yaml'}: no such file (pass the path of your kvplan.yaml)"


# --- --bench: run folders in the documented summary.json format (kvplan/gate/check.py) ----------


def test_bench_preemption_below_the_required_concurrency_fails(tmp_path):
    path = write(tmp_path, only("fits14"))
    bench = run_dir(tmp_path / "runs", "a", model="meta-llama/Llama-3.1-8B-Instruct", deployment="fits14",
                    measured_first_preemption=12)
    result = run(["check", str(path), "--bench", str(bench), "--json"])
    assert result.exit_code == 1, result.output
    row = json.loads(result.stdout)["results"][0]
    assert not row["fits"] and row["limiting_term"] == "bench"
    assert row["bench"] == {"runs": [str(bench)], "measured_first_preemption": 12, "required_concurrency": 14,
                            "passed": False}
    assert "12 < the required 14" in row["reason"]


def test_bench_without_preemption_or_above_passes_matching_by_model(tmp_path):
    path = write(tmp_path, only("fits14"))
    runs = tmp_path / "runs"
    run_dir(runs, "none-seen", model="/models/meta-llama/Llama-3.1-8B-Instruct", measured_first_preemption=None)
    run_dir(runs, "at-20", model="Llama-3.1-8B-Instruct", measured_first_preemption=20)
    run_dir(runs, "other", model="Qwen/Qwen3-8B", measured_first_preemption=2)
    result = run(["check", str(path), "--bench", str(runs), "--json"])  # a folder of run folders
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    row = report["results"][0]
    assert row["fits"] and row["bench"]["measured_first_preemption"] == 20 and row["bench"]["passed"]
    assert len(row["bench"]["runs"]) == 2
    assert any("Qwen/Qwen3-8B" in n and "no deployment uses" in n for n in report["notes"])


def test_bench_run_that_did_not_complete_is_not_evidence(tmp_path):
    path = write(tmp_path, only("fits14"))
    bench = run_dir(tmp_path / "runs", "cut", model="meta-llama/Llama-3.1-8B-Instruct", status="interrupted",
                    measured_first_preemption=None)
    result = run(["check", str(path), "--bench", str(bench), "--json"])
    assert result.exit_code == 0
    notes = json.loads(result.stdout)["results"][0]["notes"]
    assert any("did not complete" in n for n in notes)


@pytest.mark.parametrize("summary, message", [
    ({"model": "m", "measured_first_preemption": "x"}, "measured_first_preemption: expected an int >= 1 or null"),
    ({"model": "m"}, "measured_first_preemption: missing"),
    ({"measured_first_preemption": 3}, "model: expected the model name"),
    # Evidence that cannot be read is refused, not skipped (a gate passing on the points left):
    ({"model": "m", "measured_first_preemption": None, "points": {"a": 1}}, "points: expected a list"),
    ({"model": "m", "measured_first_preemption": None, "points": [7]}, "points[0]: expected an object"),
    ({"model": "m", "measured_first_preemption": None, "points": [{"concurrency": "14"}]},
     "points[0].concurrency: expected a number >= 0"),
    ({"model": "m", "measured_first_preemption": None, "points": [{"mode": "burst", "concurrency": 1}]},
     "points[0].mode: expected concurrency or rate"),
])
def test_bad_bench_summary_exits_2(tmp_path, summary, message):
    path = write(tmp_path, only("fits14"))
    bench = run_dir(tmp_path, "bad", **summary)
    result = run(["check", str(path), "--bench", str(bench)])
    assert result.exit_code == 2
    assert f"{bench / 'summary.json'}: {message}" in result.stderr


def test_bench_folder_without_summary_exits_2(tmp_path):
    path = write(tmp_path, only("fits14"))
    (tmp_path / "empty").mkdir()
    result = run(["check", str(path), "--bench", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no summary.json" in result.stderr


def test_example_spec_is_valid():
    example = Path(__file__).resolve().parents[2] / "examples" / "kvplan.yaml"
    result = run(["check", str(example), "--json"])
    assert result.exit_code in (0, 1), result.output
    assert json.loads(result.stdout)["total"] == 3


def test_strict_fails_a_deployment_that_fits_at_the_estimate_only(tmp_path):
    """The README's example as a gate: Llama-3.1-8B at 32k on a 4090 fits at the estimate, but one 32k
    request (4.00 GiB of KV) does not fit the low end of the budget range. Plain check passes it with a
    note; --strict fails it with limiting term "range"; an 8k context (1 GiB) passes both."""
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("deployments:\n"
                    "  - {name: at32k, model: meta-llama/Llama-3.1-8B, gpu: 4090, context: 32k, concurrency: 1,\n"
                    "     vllm_version: \"0.33.0\"}\n"
                    "  - {name: at8k, model: meta-llama/Llama-3.1-8B, gpu: RTX4090, context: 8k, concurrency: 1,\n"
                    "     vllm_version: \"0.33.0\"}\n")
    plain = run(["check", str(spec), "--json"])
    assert plain.exit_code == 0, plain.output
    rows = {r["name"]: r for r in json.loads(plain.stdout)["results"]}
    assert rows["at32k"]["fits"] and any("budget range" in n for n in rows["at32k"]["notes"])
    assert not any("budget range" in n for n in rows["at8k"]["notes"])
    strict = run(["check", str(spec), "--json", "--strict"])
    assert strict.exit_code == 1
    rows = {r["name"]: r for r in json.loads(strict.stdout)["results"]}
    assert (rows["at32k"]["fits"], rows["at32k"]["limiting_term"]) == (False, "range")
    assert rows["at8k"]["fits"] is True
