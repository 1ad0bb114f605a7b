"""kvplan.yaml `workload:` gates: the pool must keep a share of the workload's prefix-cache hits, or hold
N sessions at once. Llama-3.1-8B: 131,072 B a token, a 16-token block = 2 MiB, so kv_cache_memory pins the
pool (vLLM V1 keeps block 0 as the null block). The workload: 2 agent sessions of 2 turns, one group, a
32-token prefix, 16 new and 16 output tokens a turn; tests/plan/test_prefix_cache.py works it by hand:
256 prompt tokens queried, 8 blocks (128 tokens) of hits at most, every reused run at distance 1, so a pool
of C usable blocks keeps min(C - 1, run) of each run of 3, 2 and 3 blocks; the two sessions' largest turns
take 6 blocks each, 2 shared."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvplan.cli.app import app

runner = CliRunner()
NO_GITHUB = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None, "GITHUB_WORKSPACE": None}


def _check(tmp_path, deployments: str):
    (tmp_path / "agent.json").write_text(json.dumps({
        "kind": "agent", "sessions": 2, "turns": 2, "groups": 1, "shared_prefix_tokens": 32, "new_tokens": 16,
        "output_tokens": 16}))
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("defaults:\n  model: meta-llama/Llama-3.1-8B\n  gpu: H100\n  context: 32\n  workload: agent.json\n"
                    "  vllm_version: \"0.33.0\"\n"
                    "deployments:\n" + deployments)
    result = runner.invoke(app, ["check", str(spec), "--json"], env=NO_GITHUB)
    return result, ({r["name"]: r for r in json.loads(result.stdout)["results"]} if result.stdout.strip() else {})


def test_hit_share_and_sessions_gates(tmp_path):
    result, rows = _check(tmp_path, (
        "  - {name: two, kv_cache_memory: 6MiB, min_hit_share: 0.5}\n"  # 3 blocks, 2 usable: 1 + 1 + 1 = 3 of 8 kept
        "  - {name: four, kv_cache_memory: 10MiB, min_hit_share: 0.9}\n"  # 4 usable: 3 + 2 + 3 = all 8 kept
        "  - {name: four-sessions, kv_cache_memory: 10MiB, sessions: 1}\n"  # 6 blocks for one session > 4
        "  - {name: eleven-sessions, kv_cache_memory: 24MiB, sessions: 2}\n"))  # 6 + 4 = 10 <= 11
    assert result.exit_code == 1, result.output
    assert (rows["two"]["fits"], rows["two"]["limiting_term"], rows["two"]["workload_kept_share"]) == (False, "workload", 0.375)
    assert rows["two"]["workload_hit_rate"] == 48 / 256
    assert rows["two"]["reason"].startswith("the pool keeps 37.5% of the workload's achievable prefix-cache hits, "
                                            "below the asked 50%")  # 3 of 8, not rounded to 38%
    assert (rows["four"]["fits"], rows["four"]["workload_kept_share"]) == (True, 1.0)
    assert (rows["four-sessions"]["fits"], rows["four-sessions"]["workload_sessions"]) == (False, 0)
    assert (rows["eleven-sessions"]["fits"], rows["eleven-sessions"]["workload_sessions"]) == (True, 2)


def test_a_gate_without_its_workload_or_a_bad_workload_file_is_exit_2(tmp_path):
    (tmp_path / "kvplan.yaml").write_text("deployments:\n  - {name: x, model: meta-llama/Llama-3.1-8B, gpu: H100, "
                                          "min_hit_share: 0.9}\n")
    result = runner.invoke(app, ["check", str(tmp_path / "kvplan.yaml")], env=NO_GITHUB)
    assert result.exit_code == 2 and "min_hit_share needs workload" in result.stderr
    result, _ = _check(tmp_path, "  - {name: x, workload: missing.jsonl}\n")
    assert result.exit_code == 2 and "missing.jsonl" in result.stderr and "kvplan.yaml:" in result.stderr
