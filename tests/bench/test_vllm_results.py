"""`vllm bench serve` result files read as evidence: `--save-result` (one JSON document) and
`--append-result` (each run appends `json.dump(result)` after a newline, vllm/benchmarks/serve.py@0.32.0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.bench.external import read_external
from kvplan.cli.app import app
from kvplan.errors import KvplanError

DATA = Path(__file__).resolve().parent / "data"
SAVED = [DATA / "vllm-bench-serve-c16.json", DATA / "vllm-bench-serve-c32.json"]


def _appended(tmp_path: Path) -> Path:
    """What two `vllm bench serve --append-result` runs into one file leave: as serve.py writes it."""
    out = tmp_path / "appended.json"
    with out.open("a+", encoding="utf-8") as fh:
        for saved in SAVED:
            if fh.tell() != 0:
                fh.write("\n")
            json.dump(json.loads(saved.read_text()), fh)
    return out


def test_an_append_result_file_reads_as_its_runs(tmp_path):
    appended = read_external(_appended(tmp_path))
    folder = tmp_path / "saved"
    folder.mkdir()
    for saved in SAVED:
        (folder / saved.name).write_text(saved.read_text())
    separate = read_external(folder)
    assert [p.concurrency for p in appended.points] == [p.concurrency for p in separate.points] == [16, 32]
    assert [p.ttft for p in appended.points] == [p.ttft for p in separate.points]


def test_kvplan_report_takes_an_append_result_file(tmp_path):
    result = CliRunner().invoke(app, ["report", str(_appended(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    summary = data[0] if isinstance(data, list) else data
    assert summary["source"] == "vllm bench serve" and len(summary["points"]) == 2


def test_a_torn_append_result_line_names_its_line(tmp_path):
    torn = _appended(tmp_path)
    torn.write_text(torn.read_text()[:-40])
    with pytest.raises(KvplanError, match=r"appended\.json:2"):
        read_external(torn)
