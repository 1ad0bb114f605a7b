"""Issue 28, security: text from files and servers (a model name in a run folder, a summary's error)
never reaches the terminal or a CI log as control sequences: no ESC, no BEL, no line that starts a new
`::error::` annotation, in any output format of `kvplan report`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.harness import invoke

OLD_RUN = Path(__file__).resolve().parents[1] / "bench" / "data" / "old-run-conc"
HOSTILE = "fake\x1b]0;pwned\x07\x1b[2J\n::error::injected\r"


def _hostile_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    for name in ("run.json", "summary.json"):
        doc = json.loads((run / name).read_text())
        doc["model"] = HOSTILE
        if name == "summary.json":
            doc["error"] = HOSTILE
        (run / name).write_text(json.dumps(doc))
    return run


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_report_never_prints_control_text_from_a_run_folder(tmp_path, fmt):
    run = _hostile_run(tmp_path)
    r = invoke("report", str(run), "--format", fmt)
    assert r.code in (0, 2), (r.code, r.stderr[-2000:])
    out = r.stdout + r.stderr
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out, repr(out[:3000])
    assert not any(line.lstrip().startswith("::error::") for line in out.splitlines()), out[:3000]
    if fmt == "json" and r.code == 0:
        json.loads(r.stdout)  # escaped by JSON itself: the name is kept, as data


@pytest.mark.parametrize("cell", ["=1+1", "-2+3+cmd|' /C calc'!A0", "+1+cmd", "@SUM(A1)", "\t=1", "\r=1", " =1",
                                  "\x1b[2J=1"])
def test_no_csv_cell_starts_a_formula_or_holds_control_text(cell):
    from kvplan.term import csv_cell

    out = csv_cell(cell)
    assert out.startswith("'") or out.lstrip(" ")[:1] not in ("=", "+", "-", "@", "\t"), out
    assert not any(ch in out for ch in "\x1b\r\n"), repr(out)


def test_plain_figures_stay_figures_in_csv():
    from kvplan.term import csv_cell

    assert [csv_cell(v) for v in ("-1.5", "+1", "12", "name", 3, None, -2.0)] == [
        "-1.5", "+1", "12", "name", 3, None, -2.0]


def test_a_megabyte_model_name_is_reported_in_bounded_time(tmp_path):
    """A server's 1 MB model name reaches the plot title, the tables and the HTML: `report` ends within
    the hostile-input bounds (it took matplotlib over a minute to lay out such a title)."""
    from helpers.harness import invoke_capped

    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    for name in ("run.json", "summary.json"):
        doc = json.loads((run / name).read_text())
        doc["model"] = "m" * 1_000_000
        (run / name).write_text(json.dumps(doc))
    r = invoke_capped("report", str(run), "--format", "markdown", timeout=40, memory_mb=1024)
    assert r.code in (0, 2), (r.code, r.stderr[-1500:])
