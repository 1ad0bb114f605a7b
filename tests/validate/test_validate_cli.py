"""`kvplan validate` through the real CLI: JSON contract and bad input."""

import json

from helpers.harness import invoke  # noqa: E402
from typer.testing import CliRunner

from kvplan.cli.app import app

runner = CliRunner()


def test_json_is_one_document_with_the_tables():
    r = runner.invoke(app, ["validate", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["reports"] == 24  # kv045, kv046 (gpt-oss weights only); kv047-kv053 (issue 11, new families)
    assert {s["mode"] for s in doc["summaries"]} == {"page", "full"}
    assert any(g["name"].startswith("page math") for g in doc["goals"])


def test_human_table_names_the_misses():
    r = runner.invoke(app, ["validate", "--mode", "page"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "Page math" in r.stdout and "kv003" in r.stdout and "410,128 / 410,128" in r.stdout
    assert "V0 engine" in r.stdout  # the limits kvplan states up front
    assert "Full budget" not in r.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    r = runner.invoke(app, ["validate", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "cannot read reports file" in r.output and "Traceback" not in r.output
    r = invoke("validate", "--mode", "sideways")  # through the real entry point: one line, exit 2
    assert r.code == 2 and "'--mode'" in r.one_line_error() and "page" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"case_id": "x"}\n')
    r = runner.invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2 and "bad.jsonl:1" in r.output
    r = runner.invoke(app, ["validate", "--configs", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "is not a folder" in r.output
