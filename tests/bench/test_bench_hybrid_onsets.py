"""The bench's onset prediction on a model whose KV cache is several groups. The block rule counts one
full-attention group; vLLM's hybrid manager takes blocks in every group from the one pool (gpt-oss: a 128-token
sliding window beside full attention, kvplan/plan/hybrid_cache.py), so the rule would promise requests that do not
fit. The runner then predicts no onset and says why, rather than a number it cannot stand behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.bench import store as st
from kvplan.bench.config import BenchConfig
from kvplan.bench.outputs.markdown import markdown
from kvplan.bench.runner import BenchRun
from kvplan.engines.base import EngineCapacity

DATA = Path(__file__).parent / "data"


def _run(tmp_path: Path, model: str) -> BenchRun:
    cfg = BenchConfig.model_validate(json.loads((DATA / "old-run-conc" / "run.json").read_text())["config"])
    (tmp_path / "run").mkdir()
    run = BenchRun(cfg, st.RunStore(tmp_path / "run"))
    run.model = model  # the served model's name, as /v1/models gives it (bundled profiles, read offline)
    run.capacity = EngineCapacity(num_blocks=1000, block_size=16)
    run._predict()
    return run


@pytest.mark.parametrize("model", ["openai/gpt-oss-20b", "google/gemma-3-12b-it"])
def test_a_model_of_several_kv_groups_gets_no_block_rule(tmp_path, model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = _run(tmp_path, model)
    assert run.rule is None and run.prediction is None
    assert "sliding_window" in run.prediction_note and "full_attention" in run.prediction_note
    summary = run.summary("complete", None)
    assert summary.prediction is None and summary.prediction_note == run.prediction_note
    assert run.prediction_note in markdown(summary)


def test_one_full_attention_group_keeps_the_block_rule(tmp_path, monkeypatch):
    """Llama-3.1-8B: one group; 8 + 6 tokens peak at cdiv(8 + 6 - 1, 16) = 1 block of 999 usable."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = _run(tmp_path, "meta-llama/Llama-3.1-8B")
    assert run.prediction_note is None and run.rule is not None and run.rule.peak_blocks == 1
    assert run.prediction.usable_blocks == 999
