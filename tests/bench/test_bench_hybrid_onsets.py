"""The bench's onset prediction on a model whose KV cache is several groups. The block rule counts one
full-attention group; vLLM's hybrid manager takes blocks in every group from the one pool (gpt-oss: a 128-token
sliding window beside full attention, kvplan/plan/hybrid_cache.py), so the rule would promise requests that do not
fit. The runner predicts such a model's onsets with the hybrid simulator (kvplan.plan.hybrid_rule) and says so,
recurrent-state groups included where kvplan knows the release, with the waits for the token budget that vLLM's
waiting gauge counts as it counts waits for KV (kvplan.bench.point.budget_wait); a model whose groups kvplan does not
model there gets no onset and the reason."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from kvplan.bench import store as st
from kvplan.bench.config import BenchConfig
from kvplan.bench.outputs.markdown import markdown
from kvplan.bench.point import budget_wait
from kvplan.bench.results import OnsetPrediction, PredictedPoint, ServerFigures
from kvplan.bench.runner import BenchRun
from kvplan.bench.sweep import PointOutcome, measured_label
from kvplan.engines.base import EngineCapacity
from kvplan.plan.blocks import BlockRule
from kvplan.plan.hybrid_cache import FULL, MAMBA, CacheGroup, HybridGroups
from kvplan.plan.hybrid_rule import HybridRule
from kvplan.plan.simulate import SchedulerConfig

DATA = Path(__file__).parent / "data"


def _run(tmp_path: Path, model: str, prompt: int = 8, output: int = 6, vllm_version: str | None = None,
         num_blocks: int = 1000, block_size: int = 16, **config) -> BenchRun:
    raw = json.loads((DATA / "old-run-conc" / "run.json").read_text())["config"]  # 8 requests a point, attached
    raw["workload"].update(prompt_tokens=prompt, output_tokens=output)
    raw.update(config)
    cfg = BenchConfig.model_validate(raw)
    (tmp_path / "run").mkdir(parents=True)
    run = BenchRun(cfg, st.RunStore(tmp_path / "run"))
    run.model = model  # the served model's name, as /v1/models gives it (bundled profiles, read offline)
    run.capacity = EngineCapacity(num_blocks=num_blocks, block_size=block_size, vllm_version=vllm_version)
    run._predict()
    return run


def test_gpt_oss_onsets_by_the_hybrid_simulator(tmp_path, monkeypatch):
    """gpt-oss-20b, 256 + 128 tokens on 999 usable blocks of 16: full attention ends at cdiv(383, 16) = 24 blocks;
    the 128-token window holds at most 9 while decoding (at 382 computed, 255 skipped: 15 of its 24 positions
    freed) and 16 at prefill, so a request peaks at 24 + 9 = 33 (16 + 16 = 32 at prefill, which admission
    reserves). 999 // 33 = 30 fit; 31 are all admitted (31 x 32 = 992) and grow to 31 x 33 = 1,023 > 999: both
    onsets at 31. The one-group block rule would say 999 // 24 + 1 = 42."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = _run(tmp_path, "openai/gpt-oss-20b", 256, 128)
    pred = run.prediction
    assert run.prediction_note is None and pred is not None
    assert (pred.kv_groups, pred.admit_blocks, pred.peak_blocks) == ("sliding 128 + full attention", 32, 33)
    assert (pred.first_kv_wait, pred.first_preemption, pred.searched_up_to) == (31, 31, 62)
    assert BlockRule(1000, 16, 256, 128, 1 << 30).first_kv_wait == 42
    report = markdown(run.summary("complete", None))
    assert "| onset | predicted (hybrid simulator) | measured |" in report
    assert "shared by the KV cache groups (sliding 128 + full attention)" in report


def test_gemma_never_outgrows_admission(tmp_path, monkeypatch):
    """gemma-3-12b: five 1,024-token window groups and a full-attention one; 8 + 6 tokens take one block in each of
    the six at admission and never more: 999 // 6 = 166 run, the 167th waits, none preempts up to 2 x 167."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pred = _run(tmp_path, "google/gemma-3-12b-it").prediction
    assert pred.kv_groups == "5 x sliding 1,024 + full attention" and (pred.admit_blocks, pred.peak_blocks) == (6, 6)
    assert (pred.first_kv_wait, pred.first_preemption, pred.searched_up_to) == (167, None, 334)
    assert pred.none_text == "none up to 334"


def test_a_recurrent_state_model_gets_no_onsets_and_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = _run(tmp_path, "Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert run.rule is None and run.prediction is None
    assert run.prediction_note == ("onsets not predicted: the model's KV cache is 4 group(s) (mamba, mamba, mamba, "
                                   "full_attention) taking blocks from one pool, and kvplan's simulator does not model "
                                   "the onsets of mamba groups")
    summary = run.summary("complete", None)
    assert summary.prediction is None and summary.prediction_note == run.prediction_note
    assert run.prediction_note in markdown(summary)


def test_a_recurrent_state_model_on_a_known_release_gets_its_onsets_from_the_hybrid_simulator(tmp_path, monkeypatch):
    """On 0.32.0 kvplan knows Qwen3-Next's state groups (three gated-delta-net groups, no checkpoint page off Hopper),
    so the hybrid simulator predicts its onsets. 8 + 6 tokens on 999 usable blocks of 16: one attention block
    (cdiv(13, 16)) and one state block in each of the three state groups, at admission and at the peak: 999 // 4 =
    249 run, the 250th waits, none outgrows its admission (no preemption up to 2 x 250); with no token budget set,
    no request waits for one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = _run(tmp_path, "Qwen/Qwen3-Next-80B-A3B-Thinking", vllm_version="0.32.0")
    assert run.served_groups.groups is not None and run.served_groups.groups.has_mamba
    assert run.prediction_note is None
    pred = run.prediction
    assert (pred.kv_groups, pred.admit_blocks, pred.peak_blocks) == ("3 x recurrent state (align) + full attention", 4, 4)
    assert (pred.first_kv_wait, pred.first_preemption, pred.searched_up_to) == (250, None, 500)
    assert pred.first_budget_wait is None and "first_budget_wait" not in pred.model_dump()
    assert "| onset | predicted (hybrid simulator) | measured |" in markdown(run.summary("complete", None))


def test_attached_the_budget_flag_is_the_engines_budget(tmp_path, monkeypatch):
    """Attached (--url), kvplan does not see the engine's flags: ``--max-num-batched-tokens`` tells the prediction the
    engine's token budget (it was dropped, and the prediction assumed none). The tiny Granite-4.0-H of
    tests/bench/test_replay_engine_mamba2.py on its 25 blocks of 32, 64 + 64 tokens: with a 32-token budget a waiting
    request's first chunk rounds down to no block while another decodes, so from 2 streams one waits for the budget
    (`Scheduler._mamba_block_aligned_split`, v1/core/sched/scheduler.py@0.32.0: tests/vllm_facing/
    test_hybrid_scheduler_budget.py); with none, no request waits for it."""
    from helpers.bench import tiny_granite_h_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = str(tiny_granite_h_model(tmp_path / "tiny-granite-h"))
    shape = dict(prompt=64, output=64, vllm_version="0.32.0", num_blocks=25, block_size=32)
    plain = _run(tmp_path / "plain", model, **shape)
    assert "max_num_batched_tokens" not in plain.cfg.model_dump(mode="json")  # run.json as it always was
    assert plain._scheduler_config().max_num_batched_tokens == 1 << 30
    assert plain.prediction.first_budget_wait is None, plain.prediction
    budget = _run(tmp_path / "budget", model, **shape, max_num_batched_tokens=32)
    assert budget.cfg.model_dump(mode="json")["max_num_batched_tokens"] == 32  # kept for --resume
    pred = budget.prediction
    assert (pred.admit_blocks, pred.peak_blocks) == (4, 6), pred
    assert (pred.first_kv_wait, pred.first_preemption, pred.first_budget_wait) == (None, None, 2), pred


def _granite_h_rule(budget: int) -> HybridRule:
    """The tiny Granite-4.0-H the engine tests serve (tests/bench/test_replay_engine_mamba2.py): a Mamba-2 group with
    its checkpoint page and a full-attention group, 25 blocks of 32; 64 + 64 tokens, 8 requests a stream."""
    config = SchedulerConfig(num_blocks=25, block_size=32, max_num_batched_tokens=budget, max_model_len=512)
    groups = HybridGroups((CacheGroup(MAMBA, checkpoint=True), CacheGroup(FULL)), 32, 512, budget)
    return HybridRule(config, groups, lambda _: (64, 64), 64, 64, lambda _: 8)


def test_a_gauge_wait_the_budget_explains_is_budget_limited_not_a_kv_wait():
    """A 32-token budget: from 2 streams a waiting request's first chunk rounds down to no block while another decodes
    (tests/vllm_facing/test_hybrid_scheduler_budget.py), so the simulator predicts waits for the budget from 2 and
    none for KV up to 10. A point at 2 streams whose only evidence is the waiting gauge, with KV usage at 6 of 24
    blocks (one request's peak, by hand: 4 attention + 2 state), had room for a waiting request's 4 admission blocks:
    budget-limited. With the pool seen at 21 of 24 (no room for 4), or with a preemption, it stays a KV wait."""
    rule = _granite_h_rule(32)
    assert (rule.first_budget_wait, rule.first_kv_wait, rule.first_preemption, rule.searched_up_to) == (2, None, None, 10)
    assert (rule.admit_blocks, rule.peak_blocks, rule.usable_blocks) == (4, 6, 24)
    assert [rule.label(c) for c in (1, 2, 10)] == ["neither", "budget-limited", "budget-limited"]
    note = budget_wait(rule, 2, ["waiting gauge"], ServerFigures(peak_waiting_capacity=1, peak_kv_usage=6 / 24))
    assert note is not None and "KV usage peaked at 6 of 24 blocks, leaving room for a request's 4" in note
    assert budget_wait(rule, 2, ["waiting gauge"], ServerFigures(peak_kv_usage=21 / 24)) is None
    assert budget_wait(rule, 2, ["preemptions", "waiting gauge"], ServerFigures(peak_kv_usage=6 / 24)) is None
    assert budget_wait(rule, 2, ["waiting gauge"], ServerFigures()) is None  # no KV usage read: no judgement
    assert budget_wait(rule, 1, ["waiting gauge"], ServerFigures(peak_kv_usage=6 / 24)) is None  # none predicted at 1
    assert measured_label(PointOutcome(2, False, False), None, True) == "budget-limited"
    point = PredictedPoint.from_rule(rule, 2)
    assert (point.waits_for_budget, point.waits_for_kv, point.label) == (True, False, "budget-limited")


def test_an_unlimited_budget_predicts_no_budget_wait_and_keeps_kv_waits():
    """With no budget to speak of the same model waits for KV and preempts at 5 streams (4 admission blocks, a 6-block
    peak: 4 x 6 = 24 fit; 5 x 4 = 20 are admitted and outgrow the pool), and no request waits for the budget."""
    rule = _granite_h_rule(4096)
    assert (rule.first_budget_wait, rule.first_kv_wait, rule.first_preemption) == (None, 5, 5)
    assert budget_wait(rule, 5, ["waiting gauge"], ServerFigures(peak_kv_usage=6 / 24)) is None
    assert BlockRule(25, 32, 64, 64, 1 << 30).label(2) == "neither"  # the block rule has no budget waits


def test_one_full_attention_group_keeps_the_block_rule(tmp_path, monkeypatch):
    """Llama-3.1-8B: one group; 8 + 6 tokens peak at cdiv(8 + 6 - 1, 16) = 1 block of 999 usable."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = _run(tmp_path, "meta-llama/Llama-3.1-8B")
    assert run.prediction_note is None and isinstance(run.rule, BlockRule) and run.rule.peak_blocks == 1
    assert run.prediction.usable_blocks == 999
    assert "kv_groups" not in run.prediction.model_dump() and "searched_up_to" not in run.prediction.model_dump()
    assert "| onset | predicted (block rule) | measured |" in markdown(run.summary("complete", None))


def test_a_rate_sweep_on_a_hybrid_model_says_its_onsets_are_not_predicted(tmp_path, monkeypatch):
    """The hybrid simulator predicts closed-loop streams; an open-loop rate sweep gets the reason, not the block rule."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = BenchConfig.model_validate(json.loads((DATA / "old-run-rate" / "run.json").read_text())["config"])
    (tmp_path / "run").mkdir(parents=True)
    run = BenchRun(cfg, st.RunStore(tmp_path / "run"))
    run.model, run.capacity = "openai/gpt-oss-20b", EngineCapacity(num_blocks=1000, block_size=16)
    run._predict()
    assert run.profile.load_mode == "rate" and run.prediction is None
    assert run.prediction_note.endswith("the hybrid simulator predicts the onsets of closed-loop sweeps (--traffic "
                                        "replays: each point's own prediction)")


def test_a_fleet_of_a_hybrid_model_is_not_predicted_by_the_one_group_rule(tmp_path, monkeypatch):
    """Two replicas of gpt-oss-20b, 999 usable blocks of 16 each, 256 + 128 tokens: the fleet's one-group rule would
    let each replica run 999 // 24 = 41 before it waits, where its sliding-window group makes it 30 (the test above).
    The fleet's prediction is withdrawn with that reason, not printed wrong; a single-group model keeps its rule."""
    from kvplan.bench.config import FleetConfig
    from kvplan.bench.fleet import Fleet

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def fleet_run(model: str) -> BenchRun:
        run = _run(tmp_path / model.replace("/", "_"), model, 256, 128)
        run.fleet = Fleet(FleetConfig(urls=["http://127.0.0.1:1", "http://127.0.0.1:2"], route="least-outstanding"))
        run.fleet.capacities = [EngineCapacity(num_blocks=1000, block_size=16)] * 2
        run.fleet._predict(run.cfg, run.workload)
        run.rule = run.fleet.rule
        run._fleet_groups()
        return run

    (tmp_path / "openai_gpt-oss-20b").mkdir(parents=True)
    hybrid = fleet_run("openai/gpt-oss-20b")
    assert hybrid.rule is None and hybrid.fleet.rule is None
    assert hybrid.fleet.basis.startswith("not predicted: the model's KV cache is 2 group(s)")
    (tmp_path / "Qwen_Qwen3-0.6B").mkdir(parents=True)
    plain = fleet_run("Qwen/Qwen3-0.6B")
    assert plain.rule is not None and plain.fleet.rule.rules[0].first_kv_wait == 999 // 24 + 1


def test_the_outputs_show_the_budget_waits_beside_the_onsets(capsys):
    """A run whose prediction has a first budget wait at 2 and whose 4-stream point was put down to the budget: the
    terminal, report.md, report.html and points.csv say so where they show the onsets and the points."""
    from kvplan.bench.outputs.csv import points_csv
    from kvplan.bench.outputs.html import html_report
    from kvplan.bench.render import load_summary
    from kvplan.cli.bench_cmd import render

    old = load_summary(DATA / "old-run-conc")
    pred = OnsetPrediction(num_blocks=25, block_size=32, prompt_tokens=64, output_tokens=64, usable_blocks=24,
                           admit_blocks=4, peak_blocks=6, first_kv_wait=None, first_preemption=None,
                           kv_groups="recurrent state (align, checkpoint page) + full attention", searched_up_to=10,
                           first_budget_wait=2)
    points = [p.model_copy(update={"label": "budget-limited", "waited_for_budget": True, "waited_for_kv": False})
              if p.concurrency == 4 else p for p in old.points]
    summary = old.model_copy(update={"prediction": pred, "points": points})
    text = "first concurrency that waits for the token budget (not KV): predicted 2; points measured budget-limited: 4"
    assert f"{text[0].upper()}{text[1:]}." in markdown(summary)
    assert f"<p>{text[0].upper()}{text[1:]}.</p>" in html_report([summary])
    rows = list(csv.DictReader(io.StringIO(points_csv(summary.points))))
    assert [(r["concurrency"], r["label"], r["waited_for_budget"]) for r in rows] == [
        ("1", old.points[0].label, ""), ("4", "budget-limited", "True")]
    render(summary)
    out = capsys.readouterr().out
    assert text in " ".join(out.split()) and "budget = the token budget" in " ".join(out.split())
    # an older run's points are written back without the new keys (_NewFieldsOptional)
    assert old.points[0].predicted is not None and "waits_for_budget" not in old.points[0].predicted.model_dump()
    assert "waited_for_budget" not in old.points[0].model_dump()
