"""`kvplan bench --traffic` on the real CPU engine serving a Mamba-2 hybrid: a tiny Granite-4.0-H
(GraniteMoeHybridForCausalLM, a Mamba-2 layer then a full-attention one, no experts, vLLM's dummy weights) with
prefix caching on, so vLLM 0.32.0 runs its Mamba cache in "align" mode (`MambaModelConfig`,
model_executor/models/config.py@0.32.0) and the Mamba-2 mixer adds a prefill checkpoint page
(`MambaMixer2.get_kv_cache_spec`, model_executor/layers/mamba/mamba_mixer2.py@0.32.0). The CPU build runs the
mixer on its own kernels ("Using cpu Mamba SSU backend"; their conv weight packing wants the conv channels,
128 + 2 groups x 2 x 8, a multiple of 32: 160). The state is small enough (conv 3 x 160 bf16 + SSM
4 x 32 x 8 fp32 = 5,056 B) that one 32-token attention page (2 KV heads x 32 x 2 x 2 B = 256 B a token: 8,192 B)
holds it, so both groups keep the pinned 32-token block (`CpuPlatform` via `Platform.
update_block_size_for_backend`, platforms/interface.py@0.32.0). The prediction bench prints is made on the served
release's groups (the engine's /version: 0.32.0), against the engine's own prefix-cache counters.

One engine serves both tests, with a 32-token chunk budget
(``--max-num-batched-tokens 32``), which bench is told with the same flag: attached, that flag is the prediction's
budget."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.bench import (
    BLOCK_SIZE,
    DUMMY_WEIGHTS,
    EngineSpec,
    bench_env,
    cpu_engine_fixture,
    engine_required,
    kvplan_cmd,
    tiny_granite_h_model,
)

pytestmark = [pytest.mark.engine, engine_required]

#: 24 usable blocks of 32: the replay below keeps 768 of its 1,800 prompt tokens' hits there, where a pool of 27 blocks
#: or more keeps all 960 it can (kvplan's simulator); the engine's own count says whether it evicted (by hand below).
POOL_BLOCKS = 25
BUDGET = BLOCK_SIZE  # one block a chunk (see the tests)


#: The tiny Granite-4.0-H (helpers.bench.tiny_granite_h_model), dummy weights, 25 blocks of 32, a 32-token budget.
ENGINE = EngineSpec("granite_h_engine", tiny_granite_h_model, ("--max-num-batched-tokens", str(BUDGET), *DUMMY_WEIGHTS),
                    POOL_BLOCKS)


@pytest.fixture(scope="module")
def granite_h_engine(tmp_path_factory):
    yield from cpu_engine_fixture(tmp_path_factory, ENGINE)


def bench(engine, tmp_path, *args: str) -> dict:
    """`kvplan bench` attached to ``engine``, told its chunk budget."""
    proc = subprocess.run(kvplan_cmd("--url", engine.cfg.base_url, "--max-num-batched-tokens", str(BUDGET),
                                     "--no-warmup", "--json", "--out", str(tmp_path / "runs"), *args),
                          capture_output=True, text=True, env=bench_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_mamba2_hybrid_replays_as_predicted(granite_h_engine, tmp_path):
    """Agent sessions in lockstep (the engine's /version names the release: 0.32.0) with a 32-token chunk budget.
    The budget keeps every prefill chunk inside one block, so no chunk exports the state at its checkpoint
    (`is_mamba_prefill_checkpoint_valid`, v1/kv_cache_interface.py@0.32.0, needs the chunk to start a block or more
    before it): vLLM 0.32.0's CPU scan returns one final state per sequence and ignores
    ``return_intermediate_states`` (`_mamba_chunk_scan_combined_fwd_cpu`, model_executor/layers/mamba/ops/cpu/
    mamba_ssm.py), so a chunk that exports one ends the engine ("IndexError: index 4 is out of bounds for
    dimension 0 with size 1" in `MambaMixer2.conv_ssm_forward`, mamba_mixer2.py@0.32.0).

    By hand: 3 sessions send 136, 200 and 264 prompt tokens (1,800 queried). Each turn re-sends the previous turn
    and its 24 output tokens, of which 159 (223) were computed: 4 (6) full blocks. A state is cached where a chunk
    ends on a block, so at every block boundary of the prompt: turns 2 and 3 hit 4 and 6 blocks, 3 x 10 x 32 = 960
    tokens when nothing is evicted (the sessions start together, so none reuses another's system prompt)."""
    agent = tmp_path / "agent.json"
    agent.write_text(json.dumps({"kind": "agent", "sessions": 3, "turns": 3, "groups": 2, "shared_prefix_tokens": 96,
                                 "new_tokens": 40, "output_tokens": 24, "think_s": 0.0}))
    out = bench(granite_h_engine, tmp_path, "--traffic", str(agent), "--sessions", "3")
    assert (out["capacity"]["vllm_version"], out["capacity"]["block_size"]) == ("0.32.0", BLOCK_SIZE), out["capacity"]
    (point,) = out["points"]
    r = point["replay"]
    assert r["predicted_by"] == "simulator, in engine steps (sessions in lockstep, over client timings)", r
    assert r["prefix_queries"] == r["predicted_queries"] == 1800, r
    assert r["prefix_hits"] < 960, r  # the pool evicted
    assert abs(r["hit_rate"] - r["predicted_hit_rate"]) <= 0.02, r
    assert r["predicted_hit_rate_low"] - 0.02 <= r["hit_rate"] <= r["predicted_hit_rate_high"] + 0.02, r
    assert r["predicted_preemption"] == (point["server"]["preemptions"] > 0), (r, point["server"])


def test_a_one_block_budget_serves_one_request_at_a_time_and_the_onsets_are_predicted(granite_h_engine, tmp_path):
    """The onsets on state groups, predicted and measured (kvplan/bench/runner.py, kvplan.bench.point.budget_wait):
    with the 32-token budget a waiting request's first chunk rounds down to no block while another decodes
    (`Scheduler._mamba_block_aligned_split`, v1/core/sched/scheduler.py@0.32.0), so 2 streams of 64 + 64 run one
    request at a time, never holding more than one request's 6 of the 24 usable blocks (4 attention blocks,
    cdiv(127, 32), and 2 state blocks at the step a block is crossed: tests/vllm_facing/test_hybrid_scheduler_budget.py),
    and the other request is counted waiting for "capacity". The simulator predicts that wait for the budget from 2
    streams and no KV wait or preemption up to 10; the bench puts the gauge's wait down to the budget (the pool
    never held more than 6 blocks, room for a request's 4 at admission), so the point is budget-limited and the
    measured onsets (none up to 2) equal the predicted ones."""
    out = bench(granite_h_engine, tmp_path, "--prompt", "64", "--output", "64", "--max-concurrency", "2",
                "--requests-per-stream", "8")
    pred = out["prediction"]
    assert out.get("prediction_note") is None, out["prediction_note"]
    assert pred["kv_groups"] == "recurrent state (align, checkpoint page) + full attention", pred
    assert (pred["admit_blocks"], pred["peak_blocks"]) == (4, 6), pred  # by hand: tests/vllm_facing/test_hybrid_scheduler_budget.py
    assert (pred["first_kv_wait"], pred["first_preemption"], pred["first_budget_wait"]) == (None, None, 2), pred
    two = next(p for p in out["points"] if p["concurrency"] == 2)
    s = two["server"]
    assert s["peak_running"] == 1 and s["preemptions"] == 0, s
    assert s["peak_kv_usage"] <= 6 / (POOL_BLOCKS - 1), s
    assert s["peak_waiting_capacity"] == 1, s  # the gauge counted the other stream's request waiting ...
    assert (two["label"], two["waited_for_budget"], two["waited_for_kv"]) == ("budget-limited", True, False), two
    assert two["predicted"]["label"] == "budget-limited", two["predicted"]  # ... for the budget, as predicted
    measured = out["measured"]
    assert (measured["first_kv_wait"]["first"], measured["first_preemption"]["first"]) == (None, None), measured
    assert measured["agrees_with_prediction"] == {"first_kv_wait": True, "first_preemption": True}, measured
    report = (tmp_path / "runs").glob("*/report.md")
    assert "points measured budget-limited: 2" in next(report).read_text()
