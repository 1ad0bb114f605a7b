"""`--format table|json|markdown|csv` on the tabular commands: every format carries the same rows."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from harness import invoke  # noqa: E402

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
