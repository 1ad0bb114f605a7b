"""At COLUMNS=80 (a laptop terminal, a CI log), every table `size`, `fit`, `check`, `models` and `gpus` print is
within 80 columns, nothing is cut short (no ellipsis, no cropped figure), and every id a reader copies (a model id,
a GPU name, a deployment name) stands whole on one line. What cannot fit is left out with a footnote saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import build_app

EXAMPLE_SPEC = Path(__file__).resolve().parents[2] / "examples" / "kvplan.yaml"
BOX = set("│┃━╇─┼┆")


def _run(*args: str, columns: int = 80):
    result = CliRunner().invoke(build_app(), list(args), env={"COLUMNS": str(columns), "HF_HUB_OFFLINE": "1"})
    assert result.exit_code in (0, 1), result.output
    return result.output


def _check_within(output: str, width: int = 80) -> None:
    assert "…" not in output
    wide = [line for line in output.splitlines() if BOX & set(line) and len(line.rstrip()) > width]
    assert wide == []


@pytest.mark.parametrize("args", [
    ("size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k"),
    ("size", "Qwen/Qwen3.5-27B", "--gpu", "2xH100", "--ctx", "128k", "-c", "4"),
    ("fit", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "-c", "8"),
    ("fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--prompt", "2k", "--output", "128", "--gpus", "H100",
     "--max-gpus", "2", "--rate", "40", "--slo", "ttft_p99=800ms,tpot_p99=40ms", "--price", "H100=2.5"),
    ("check", str(EXAMPLE_SPEC)),
])
def test_tables_fit_80_columns(args):
    _check_within(_run(*args))


def test_models_and_gpus_keep_every_id_whole():
    for command, key in (("models", "model"), ("gpus", "name")):
        out = _run(command)
        _check_within(out)
        ids = [row[key] for row in json.loads(_run(command, "--json", columns=200))]
        lines = out.splitlines()
        cut = [i for i in ids if not any(i in line for line in lines)]
        assert ids and cut == [], command


def test_check_keeps_deployment_names_whole_and_says_what_it_left_out():
    out = _run("check", str(EXAMPLE_SPEC))
    for name in ("chat-8b", "rag-qwen3-32b", "long-context-8b"):
        assert any(name in line for line in out.splitlines())
    wide = _run("check", str(EXAMPLE_SPEC), columns=200)
    assert "limiting term" in wide and "Left out" not in wide
    if "limiting term" not in out:  # left out at 80: the footnote names it
        assert "Left out at 80 columns: limiting term" in " ".join(out.split())


def test_a_narrow_models_table_names_the_column_it_left_out():
    out = _run("models")
    wide = _run("models", columns=200)
    assert "params (B)" in wide and "Left out" not in wide
    assert "params (B)" in out  # shown, or named by the footnote
