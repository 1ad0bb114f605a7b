"""`kvplan bench --traffic` on the real CPU engine serving a hybrid model: the tiny Llama with its first layer a
64-token sliding window (config.json's ``layer_types``, as vLLM's Llama reads them), so vLLM builds a sliding-
window group beside the full-attention one ("kv cache group sizes (32, 32)"), on a pool of 39 usable blocks of
32 tokens shared by both. The engine's own prefix-cache counters against the prediction bench prints beside
them, made on the served model's groups (kvplan.plan.hybrid_sim): agent sessions in lockstep (the simulator in
engine steps) and a Mooncake-style trace spaced apart (one request at a time). Full attention alone would
predict more hits than the engine makes (the window keeps only the blocks before each prompt's last block)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.bench import TINY_MODEL, EngineSpec, bench_env, cpu_engine_fixture, engine_required, kvplan_cmd

pytestmark = [pytest.mark.engine, engine_required]

POOL_BLOCKS = 40  # the full-attention and window groups of one 512-token request need 16 + 17 (+ the null block)


def tiny_hybrid_model(dest: Path) -> Path:
    """The tiny Llama with a sliding-window layer (64 tokens) before its full-attention one, written into ``dest``."""
    shutil.copytree(TINY_MODEL, dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


ENGINE = EngineSpec("hybrid_engine", tiny_hybrid_model, pool_blocks=POOL_BLOCKS)


@pytest.fixture(scope="module")
def hybrid_engine(tmp_path_factory):
    yield from cpu_engine_fixture(tmp_path_factory, ENGINE)


def _bench(engine, tmp_path, *args: str) -> dict:
    proc = subprocess.run(kvplan_cmd("--url", engine.cfg.base_url, "--no-warmup", "--json", "--out",
                                     str(tmp_path / "runs"), *args),
                          capture_output=True, text=True, env=bench_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_hybrid_model_replays_as_predicted(hybrid_engine, tmp_path):
    from kvplan.bench.replay import first_sessions
    from kvplan.plan.prefix_cache import traffic_load, traffic_working_set
    from kvplan.plan.simulate import SchedulerConfig, simulate
    from kvplan.traffic.loaders import load_traffic

    agent = tmp_path / "agent.json"  # turns of 136, 200 and 264 prompt tokens; 96 shared by every other session
    agent.write_text(json.dumps({"kind": "agent", "sessions": 3, "turns": 3, "groups": 2, "shared_prefix_tokens": 96,
                                 "new_tokens": 40, "output_tokens": 24, "think_s": 0.0}))
    lines, prefixes, nxt = [], [[1, 2], [3, 4, 5], [6, 7, 8, 9]], 100
    for i in range(24):  # 3 system prompts of 2-4 hash blocks, some requests extending an earlier one
        ids = list(prefixes[i % 3]) + ([10 + i % 3] if i % 2 else []) + [nxt, nxt + 1]
        nxt += 2
        lines.append(json.dumps({"timestamp": 600 * i, "input_length": 32 * (len(ids) - 1) + 1 + (i * 7) % 31,
                                 "output_length": 8 + i % 5, "hash_ids": ids}))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")

    out = _bench(hybrid_engine, tmp_path, "--traffic", str(agent), "--sessions", "3")
    (point,) = out["points"]
    r = point["replay"]
    assert r["predicted_by"] == "simulator, in engine steps (sessions in lockstep, over client timings)", r
    assert r["prefix_queries"] == r["predicted_queries"]
    assert r["predicted_hit_rate_low"] - 0.02 <= r["hit_rate"] <= r["predicted_hit_rate_high"] + 0.02, r
    full_only = simulate(SchedulerConfig(num_blocks=POOL_BLOCKS, block_size=32),
                         traffic_load(first_sessions(load_traffic(agent), 3), 32))
    assert full_only.prefix_hits > r["prefix_hits"], (full_only.prefix_hits, r)

    out = _bench(hybrid_engine, tmp_path, "--traffic", str(trace), "--traffic-option", "hash_block_tokens=32")
    (point,) = out["points"]
    r = point["replay"]
    assert r["predicted_by"] == "working set (requests one at a time, in the traffic's order) on sliding 64 + full attention"
    assert r["prefix_queries"] == r["predicted_queries"]
    assert abs(r["hit_rate"] - r["predicted_hit_rate"]) <= 0.02, r
    full_only_rate = traffic_working_set(load_traffic(Path(trace), hash_block_tokens=32), 32).hit_rate(POOL_BLOCKS - 1)
    assert full_only_rate > r["hit_rate"] + 0.05, (full_only_rate, r)


def test_hybrid_model_onsets_as_predicted(hybrid_engine, tmp_path):
    """The standard closed-loop sweep on the same engine: the onsets the hybrid simulator predicts on the reported
    pool (kvplan.plan.hybrid_rule) are the ones the engine reaches. By hand, 64 + 64 tokens on 39 usable blocks of
    32: the full-attention group ends at cdiv(64 + 64 - 1, 32) = 4 blocks; the 64-token window group allocates the
    prompt's 2 blocks at prefill and, at the last step (126 tokens computed, 126 - 64 + 1 = 63 skipped: block 0
    freed, `remove_skipped_blocks`), holds 4 - 1 = 3 (single_type_kv_cache_manager.py@0.32.0): 7 a request.
    5 x 7 = 35 fit; at 6, all six are admitted (2 + 2 blocks each, 24) and grow to 42 > 39: both onsets at 6.
    The full-attention block rule alone would say 39 // 4 + 1 = 10."""
    out = _bench(hybrid_engine, tmp_path, "--prompt", "64", "--output", "64", "--requests-per-stream", "8",
                 "--scrape-interval", "0.05", "--max-concurrency", "6")
    pred = out["prediction"]
    assert (pred["kv_groups"], pred["usable_blocks"], pred["admit_blocks"], pred["peak_blocks"]) == (
        "sliding 64 + full attention", POOL_BLOCKS - 1, 4, 7), pred
    assert (pred["first_kv_wait"], pred["first_preemption"]) == (6, 6), pred
    assert "prediction_note" not in out
    assert (out["measured_first_kv_wait"], out["measured_first_preemption"]) == (6, 6), out["measured"]
    assert out["measured"]["agrees_with_prediction"] == {"first_kv_wait": True, "first_preemption": True}
    by_c = {p["concurrency"]: p for p in out["points"]}
    assert by_c[5]["server"]["preemptions"] == 0 and by_c[6]["server"]["preemptions"] > 0
