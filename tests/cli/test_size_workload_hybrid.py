"""`kvplan size --workload FILE` and `kvplan check` workload gates on hybrid KV caches: gpt-oss's sliding-window
(128 tokens) + full-attention groups worked by hand; Qwen3-Next's recurrent-state groups in "align" mode worked
by hand; what is not modelled of them refused with one line, never given full attention's hits."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvplan.cli.app import app

NO_GITHUB = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None, "GITHUB_WORKSPACE": None}


def run(*args):
    return CliRunner().invoke(app, list(args), env=NO_GITHUB)


# Mooncake lines, one 16-token block per hash id (hash_block_tokens=16), 3 output tokens each, far apart.
TRACE = [
    {"timestamp": 0, "input_length": 200, "output_length": 3, "hash_ids": list(range(1, 14))},
    {"timestamp": 1000, "input_length": 250, "output_length": 3, "hash_ids": list(range(1, 13)) + [20, 21, 22, 23]},
    {"timestamp": 2000, "input_length": 150, "output_length": 3, "hash_ids": list(range(1, 7)) + [30, 31, 32, 33]},
    {"timestamp": 3000, "input_length": 150, "output_length": 3, "hash_ids": list(range(1, 7)) + [40, 41, 42, 43]},
]


def test_gpt_oss_window_hits_worked_by_hand(tmp_path):
    """Block 16; a 128-token window needs cdiv(127, 16) = 8 cached blocks in a row ending at the hit.
    r0 (200 tokens): its replay boundary 199 ends block 12, so the window group caches blocks 4..11 only; full
    attention caches 0..11. r1 shares r0's 12 full blocks: full attention hits 192 tokens, the window finds 4..11
    in a row ending there: 192. r2 shares r0's first 6 blocks (96 tokens): full attention hits 96, but the window
    has only blocks 4, 5 of them cached, not 8 in a row nor all from block 0: 0 tokens (full attention alone: 96);
    its lookup marks 96 a junction, so r2's window group also caches blocks 0..5. r3 (the same 6 blocks): the
    window's blocks 0..5, all from the start: 96. Hits 192 + 0 + 96 = 288 of 750 prompt tokens."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    base = ("size", "openai/gpt-oss-20b", "--gpu", "H100", "--ctx", "4k", "--num-gpu-blocks-override", "2000",
            "--workload", str(trace), "--workload-option", "hash_block_tokens=16", "--json")
    result = run(*base)
    assert result.exit_code == 0, result.output
    w = json.loads(result.stdout)["workload"]
    assert w["queried_tokens"] == 750
    assert (w["achievable_hit_rate"], w["hit_rate_at_pool"]) == (round(288 / 750, 6), round(288 / 750, 6))
    assert any("sliding 128 + full attention" in n for n in w["notes"])
    llama = run("size", "meta-llama/Llama-3.1-8B", *base[2:])  # full attention alone: r2 hits 96 too
    assert json.loads(llama.stdout)["workload"]["achievable_hit_rate"] == round(384 / 750, 6)


def test_qwen3_next_state_hits_worked_by_hand(tmp_path):
    """Qwen3-Next on 4 x A100 (no GDN checkpoint page), 4k context: kvplan raises the block to 272 tokens so a
    page holds a state page; one hash id per block (hash_block_tokens=272). r0 (600 tokens): the scheduler cuts its
    prefill at its replay boundary 599 // 272 * 272 = 544, so the state after block 1 is cached (none after block
    0); full attention caches blocks 0, 1. r1 (r0's 2 blocks + 156 own): full attention hits 544, the state groups
    find block 1's state: 544. r2 (r0's block 0 + 128 own): full attention hits 272 but no state after block 0 is
    cached: 0 (full attention alone: 272); its lookup marks 272 a junction, where its prefill stops and caches that
    state. r3 (block 0 + 128 others): 272. Hits 544 + 0 + 272 = 816 of 2,100 prompt tokens (full attention alone:
    1,088)."""
    rows = [(600, [1, 2, 3]), (700, [1, 2, 4]), (400, [1, 5]), (400, [1, 6])]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": n, "output_length": 3, "hash_ids": ids})
                             + "\n" for i, (n, ids) in enumerate(rows)))
    result = run("size", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpu", "A100-80GB-SXM", "--gpus", "4", "--ctx", "4k",
                 "--workload", str(trace), "--workload-option", "hash_block_tokens=272", "--json")
    assert result.exit_code == 0, result.output
    w = json.loads(result.stdout)["workload"]
    assert (w["block_size"], w["queried_tokens"]) == (272, 2100)
    assert (w["achievable_hit_rate"], w["hit_rate_at_pool"]) == (round(816 / 2100, 6), round(816 / 2100, 6))
    assert any("3 x recurrent state (align) + full attention" in n for n in w["notes"])


def test_recurrent_state_models_are_refused(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    result = run("size", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpu", "H100", "--gpus", "4", "--ctx", "4k",
                 "--workload", str(trace), "--workload-option", "hash_block_tokens=16")
    assert result.exit_code == 2
    # (on Hopper GDN exports a prefill checkpoint page from vLLM 0.33, kvplan's newest known release)
    assert "prefix cache of mamba KV groups (gated_delta_net) with a prefill checkpoint page" in result.stderr
    assert "Traceback" not in result.output
    spec = tmp_path / "kvplan.yaml"
    spec.write_text(f"deployments:\n  - {{name: next, model: Qwen/Qwen3-Next-80B-A3B-Thinking, gpu: 4xH100, context: 4096,"
                    f" workload: {trace.name}, workload_options: {{hash_block_tokens: 16}}, min_hit_share: 0.5}}\n")
    result = run("check", str(spec))
    assert result.exit_code == 2 and "not modelled" in result.stderr and "kvplan.yaml:" in result.stderr
