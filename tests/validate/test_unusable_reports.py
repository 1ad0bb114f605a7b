"""`kvplan validate` skips a report it cannot use, with a note, and runs the others;
`kvplan calibrate` refuses a failed start-up's log and an implausible residual (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.validate.reports import DEFAULT_REPORTS, load_reports
from kvplan.validate.runner import validate

runner = CliRunner()
SHIPPED = [json.loads(line) for line in DEFAULT_REPORTS.read_text().splitlines() if line.strip()]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _variant(case_id: str, base: str = "kv031", **changes) -> dict:
    row = json.loads(json.dumps(next(r for r in SHIPPED if r["case_id"] == base)))
    row["case_id"] = case_id
    for key, value in changes.items():
        if key.startswith("kvplan."):
            row["kvplan"][key[len("kvplan."):]] = value
        else:
            row[key] = value
    return row


BAD = [
    _variant("engine_block", block_size=1056),  # an attention + Mamba engine's derived block size
    _variant("negative_pool", reported_kv_memory_gib=-2.53, reported_gpu_blocks=-1295, reported_kv_tokens=None),
    _variant("negative_blocks", reported_gpu_blocks=-7),
    _variant("zero_block", block_size=0),
    _variant("bad_util", gpu_memory_utilization=1.5),
    _variant("bad_version", vllm_version="banana"),
]


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "reports.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("mode", ["page", "full", "both"])
def test_unusable_reports_are_skipped_with_a_note(tmp_path, mode):
    file = _write(tmp_path, SHIPPED + BAD)
    result = runner.invoke(app, ["validate", str(file), "--mode", mode, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    modes = ["page", "full"] if mode == "both" else [mode]
    by_id: dict[str, list[dict]] = {}
    for case in doc["cases"]:
        by_id.setdefault(case["case_id"], []).append(case)
    for bad in BAD:
        cases = by_id[bad["case_id"]]
        assert sorted(c["mode"] for c in cases) == sorted(modes)
        assert all(c["status"] == "skipped" and c["comparisons"] == [] for c in cases), cases
        assert any(n.startswith(f"skipped {bad['case_id']}: ") for n in doc["notes"])
    notes = "\n".join(doc["notes"])
    assert "engine-derived block size" in notes and "negative pool" in notes
    # the shipped reports still ran and are compared as before
    good = validate(DEFAULT_REPORTS, modes=tuple(modes))
    assert [c for c in doc["cases"] if c["case_id"] not in by_id or c["status"] != "skipped"] == \
        [c.model_dump(mode="json") for c in good.cases]
    assert doc["summaries"] == [s.model_dump(mode="json") for s in good.summaries]


def test_table_output_says_skipped(tmp_path):
    result = runner.invoke(app, ["validate", str(_write(tmp_path, SHIPPED + BAD))], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "skipped engine_block: invalid block size 1056" in result.stdout
    assert "negative_pool: skipped: reported_kv_memory_gib is -2.53" in result.stdout


def test_missing_activation_figures_do_not_abort_leave_one_out(tmp_path):
    # Only kv029 prints its activation: leaving it out leaves nothing to fit the sampler on.
    rows = json.loads(json.dumps(SHIPPED))
    for row in rows:
        if row["case_id"] != "kv029":
            row["kvplan"].pop("reported_activation_gib", None)
    result = validate(_write(tmp_path, rows), modes=("full",))
    kv029 = next(c for c in result.cases if c.case_id == "kv029")
    assert kv029.status == "ok" and kv029.get("available_kv_gib").loo_error_pct is None
    assert any("no leave-one-out error for kv029" in n and "activation" in n for n in result.notes)
    assert not any(c.status == "skipped" for c in result.cases)
    assert len(result.cases) == len(rows)


def test_only_unusable_reports_still_exit_0_with_notes(tmp_path):
    result = runner.invoke(app, ["validate", str(_write(tmp_path, BAD)), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {c["status"] for c in doc["cases"]} == {"skipped"}
    assert all(s["n"] == 0 for s in doc["summaries"])


# --- calibrate ----------------------------------------------------------------------------------


@pytest.fixture()
def config_dir(tmp_path, monkeypatch):
    d = tmp_path / "config"
    monkeypatch.setenv("KVPLAN_CONFIG_DIR", str(d))
    return d


def _log(tmp_path: Path, available: str = "19.28", weights: str = "14.99") -> Path:
    quote = next(r for r in load_reports() if r.case_id == "kv043").quote
    quote = quote.replace("Available KV cache memory: 19.28 GiB", f"Available KV cache memory: {available} GiB")
    quote = quote.replace("Model loading took 14.99 GiB", f"Model loading took {weights} GiB")
    f = tmp_path / "vllm.log"
    f.write_text(quote + "\n")
    return f


def _calibrate(*args):
    return runner.invoke(app, ["calibrate", *map(str, args), "--model", MODEL, "--usage", "llm"])


def _one_line_exit_2(result, *words):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    for w in words:
        assert w in lines[0], lines[0]


def test_calibrate_refuses_a_negative_pool(config_dir, tmp_path):
    _one_line_exit_2(_calibrate(_log(tmp_path, available="-2.53"), "--gpu", "A100 40GB"), "negative KV pool")
    _one_line_exit_2(_calibrate(_log(tmp_path, available="0.0"), "--gpu", "A100 40GB"), "negative KV pool")
    assert not (config_dir / "calibration.json").exists()


@pytest.mark.parametrize("gpu", ["H200", "A100 80GB"])
def test_calibrate_refuses_an_implausible_residual(config_dir, tmp_path, gpu):
    # The A100 40GB log read as if from a larger GPU: tens of GiB of "overhead" nothing explains.
    _one_line_exit_2(_calibrate(_log(tmp_path), "--gpu", gpu), "implausible residual")
    assert not (config_dir / "calibration.json").exists()


def test_calibrate_still_records_a_plausible_log(config_dir, tmp_path):
    result = _calibrate(_log(tmp_path), "--gpu", "A100 40GB", "--json")
    assert result.exit_code == 0, result.output
    assert abs(json.loads(result.stdout)["overhead_gib"] - json.loads(result.stdout)["predicted_overhead_gib"]) < 1


def test_the_fit_excludes_unusable_reports_and_is_unchanged(tmp_path):
    from kvplan.validate.fit import fit_reports

    clean = fit_reports(load_reports(_write(tmp_path, SHIPPED)))
    mixed = fit_reports(load_reports(_write(tmp_path, SHIPPED + BAD)))
    assert mixed.coefficients() == clean.coefficients()
    skipped = {r.case_id: r.excluded for r in mixed.rows if r.case_id in {b["case_id"] for b in BAD}}
    assert len(skipped) == len(BAD) and all(why.startswith("skipped: ") for why in skipped.values())
