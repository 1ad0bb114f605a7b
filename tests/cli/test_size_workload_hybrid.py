"""`kvplan size --workload FILE` and `kvplan check` workload gates on hybrid KV caches: gpt-oss's sliding-window
(128 tokens) + full-attention groups worked by hand; Qwen3-Next's recurrent-state groups in "align" mode worked
by hand; what is not modelled of them refused with one line, never given full attention's hits."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvplan.cli.app import app

NO_GITHUB = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None, "GITHUB_WORKSPACE": None}


def run(*args):
    if args[:1] in (("size",), ("fit",)) and "--vllm-version" not in args:
        args = (*args, "--vllm-version", "0.33.0")  # the release these figures were worked for
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


def test_qwen3_next_on_hopper_gdn_checkpoint_page_worked_by_hand(tmp_path):
    """Qwen3-Next on 4 x H100, vLLM 0.33, 4k context. FlashInfer's GDN prefill (the auto choice on SM90) exports
    prefill checkpoints aligned to 64 tokens (`FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`, gdn_attn.py@0.33.0), and in
    "align" mode the platform makes the hybrid block a multiple of that (`_align_hybrid_block_size`,
    platforms/interface.py@0.33.0: ``lcm(kernel alignment, 64)``).

    Block size (bundled config: linear_num_key_heads 16 x linear_key_head_dim 128, linear_num_value_heads 32 x
    linear_value_head_dim 128, linear_conv_kernel_dim 4; 2 KV heads x 256; bf16; TP 4): a GDN state page is conv
    (4 - 1) x (2 x 16 x 128 + 32 x 128) / 4 x 2 B = 12,288 B + recurrent 32 / 4 x 128 x 128 x 2 B = 262,144 B:
    274,432 B; an attention token is 1 KV head (2 over TP 4, replicated) x 256 x 2 x 2 B = 1,024 B. The block is
    64 x cdiv(274,432, 64 x 1,024) = 64 x 5 = 320 tokens (an A100, no checkpoints: 16 x 17 = 272).

    Trace (hash_block_tokens=320, 3 output tokens, served one at a time): r0 700 tokens, ids 1, 2, 3; r1 1,300
    tokens, ids 1, 2, 4, 5, 6 (r0's 2 full blocks, 640 tokens). Hits: r0 caches full attention's blocks 0, 1 and
    the state at its replay boundary (700 - 1) // 320 x 320 = 640 (block 1); r1 finds both: 640 of 2,000 tokens.

    The pool every hit needs. GDN's checkpoint alignment is the grid, the block (no --prefix-match-unit), so the
    checkpoint rule is Mamba-2's (`is_mamba_prefill_checkpoint_valid`, v1/kv_cache_interface.py@0.33.0). r0: one
    chunk 0..700 (the position 640 >= 0 + 320), each of the 3 state groups taking 2 blocks (the checkpoint, index
    1, and the running state, index 2), full attention 3: 9. r1 from its hit at 640: position 1,299 // 320 x 320 =
    1,280 >= 640 + 320, so one chunk to 1,300 with a checkpoint at index 3: full attention 3 new + its 2 hit blocks
    (free in the queue), each state group min(5 - 2, 1 + 1) = 2 new + its hit block: 5 + 3 x 3 = 14. On 14 usable
    blocks r1's 9 new blocks are r0's 4 uncached ones (freed to the queue's head) and the 5 never used: its hits
    survive; on 13 it is never admitted. Every share's pool: 14. The same block without checkpoints (an A100 at
    --block-size 320): r1 stops at its replay boundary 1,280, admission min(5 - 2, 1) = 1 new + 1 hit a state
    group: 5 + 3 x 2 = 11, its chunks holding 4 + 6 = 10, then 5 + 6 = 11: every share's pool 11."""
    rows = [(700, [1, 2, 3]), (1300, [1, 2, 4, 5, 6])]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": n, "output_length": 3, "hash_ids": ids})
                             + "\n" for i, (n, ids) in enumerate(rows)))
    base = ("size", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpus", "4", "--ctx", "4k", "--workload", str(trace),
            "--workload-option", "hash_block_tokens=320", "--json")
    hopper = run(*base, "--gpu", "H100-SXM")
    assert hopper.exit_code == 0, hopper.output
    w = json.loads(hopper.stdout)["workload"]
    assert (w["block_size"], w["queried_tokens"], w["achievable_hit_rate"]) == (320, 2000, 0.32)
    assert w["pool_for_share"] == {"50%": 14, "90%": 14, "99%": 14}
    assert any("3 x recurrent state (align, checkpoint page) + full attention" in n for n in w["notes"])
    ampere = run(*base, "--gpu", "A100-80GB-SXM", "--block-size", "320")
    assert ampere.exit_code == 0, ampere.output
    w = json.loads(ampere.stdout)["workload"]
    assert (w["block_size"], w["achievable_hit_rate"], w["pool_for_share"]) == (320, 0.32, {"50%": 11, "90%": 11,
                                                                                           "99%": 11})
    assert any("3 x recurrent state (align) + full attention" in n for n in w["notes"])
    # without prefix caching there is no "align" mode, and no checkpoint alignment: 16 x 17 on Hopper too
    plain = run("size", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpu", "H100-SXM", "--gpus", "4", "--ctx", "4k",
                "--no-enable-prefix-caching", "--json")
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["block_size"] == 272


def test_recurrent_state_models_are_refused(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    # vLLM 0.26-0.27 cache a state at every block ("all" mode) for the families that support it
    result = run("size", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpu", "H100", "--gpus", "4", "--ctx", "4k",
                 "--vllm-version", "0.27.0", "--workload", str(trace), "--workload-option", "hash_block_tokens=16")
    assert result.exit_code == 2
    assert "prefix cache of mamba KV groups (gated_delta_net) outside mamba_cache_mode 'align'" in result.stderr
    assert "Traceback" not in result.output
    spec = tmp_path / "kvplan.yaml"
    spec.write_text(f"deployments:\n  - {{name: next, model: Qwen/Qwen3-Next-80B-A3B-Thinking, gpu: 4xH100, context: 4096,"
                    f" vllm_version: \"0.27.0\", workload: {trace.name}, workload_options: {{hash_block_tokens: 16}}, "
                    f"min_hit_share: 0.5}}\n")
    result = run("check", str(spec))
    assert result.exit_code == 2 and "not modelled" in result.stderr and "kvplan.yaml:" in result.stderr


def test_granite4_mamba2_checkpoint_page_worked_by_hand(tmp_path):
    """Granite 4.0-H 350M (bundled config.json: 32 layers, layer_types "attention" at 10, 13, 17, 27, the other 28
    Mamba-2; 4 KV heads x 64, bf16; mamba_n_heads 48 x mamba_d_head 32, mamba_d_state 128, mamba_n_groups 1,
    mamba_expand 2 x hidden 768 = 1,536, mamba_d_conv 4) on one H100, 4k context.

    Block size: an attention layer's token is 2 x 4 x 64 x 2 B = 1,024 B; a Mamba-2 state page is (conv (4 - 1) x
    (1,536 + 2 x 1 x 128) + ssm 48 x 32 x 128) x 2 B = (5,376 + 196,608) x 2 = 403,968 B, so the attention block
    is raised to 16 x cdiv(403,968, 16 x 1,024) = 16 x 25 = 400 tokens. Groups: the 28 Mamba-2 layers in 7 groups
    of 4 beside the 4 attention layers' group: 7 state groups + 1 full attention. From vLLM 0.32 each state
    group has a prefill checkpoint page (`MambaMixer2.get_kv_cache_spec`,
    model_executor/layers/mamba/mamba_mixer2.py@0.32.0: num_prefill_checkpoint_blocks=1, alignment 1).

    Trace (hash_block_tokens=400, one id per 400-token block, 3 output tokens, served one at a time):
    r0: 1,000 tokens, ids 1, 2, 3; r1: 1,400 tokens, ids 1, 2, 5, 6 (shares r0's 2 full blocks, 800 tokens).

    Hits (either release): r0 caches full attention blocks 0, 1 and, in each state group, the state after its
    replay boundary (1,000 - 1) // 400 * 400 = 800 (block 1). r1's lookup (1,399 // 400 = 3 blocks: ids 1, 2, 5)
    finds full attention's blocks 0, 1 and the state at block 1: 800 of 2,400 prompt tokens (1/3).

    The pool those hits need. With the checkpoint page (0.32.0): r0's prefill goes in one chunk 0..1,000 (it starts
    on a block, 800 >= 0 + 400, `is_mamba_prefill_checkpoint_valid`), each state group taking 2 blocks (block 1,
    the checkpoint, and block 2) and full attention cdiv(1,000, 400) = 3: admission needs 3 + 7 x 2 = 17 free.
    r1 from its hit at 800: 1,199 // 400 * 400 = 1,200 >= 800 + 400, so again one chunk to 1,400 with a checkpoint:
    full attention needs cdiv(1,400, 400) - 2 hits = 2 new + its 2 hit blocks, free in the queue (r0 finished);
    each state group min(4 - 2, 1 + 1) = 2 new + its hit block: 2 + 2 + 7 x 3 = 25. On 25 usable blocks r1 takes
    its 16 new blocks from the 8 uncached blocks r0 freed (to the queue's head) and the 8 never used: its hits
    survive; on 24 it cannot be admitted even alone. Every share's pool: 25.
    Without it (0.31.0): r0 in chunks 0..800 (2 + 7 = 9 blocks) and 800..1,000 (+1 + 7 = 17 held); r1's
    admission needs min(4 - 2, 1) = 1 new + 1 hit per state group and 2 + 2 in full attention: 18; its chunk
    800..1,200 holds 3 + 7 x 2 = 17, the next one frees the hit states (7) and takes 1 + 7: 18. Every share: 18.

    Sessions held at once (a turn's peak cdiv(P + M - 1, 400) full-attention blocks, shared ones once, plus each
    state group's cap, 2 + 1 pages with the checkpoint, `MambaSpec.max_memory_usage_bytes`): r1 cdiv(1,402, 400) = 4
    + 7 x 3 = 25; r0 (3 - 2 shared) + 7 x 3 = 22: a pool of 25 holds 1, of 24 none."""
    rows = [(1000, [1, 2, 3]), (1400, [1, 2, 5, 6])]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": n, "output_length": 3, "hash_ids": ids})
                             + "\n" for i, (n, ids) in enumerate(rows)))

    def workload(version: str, *extra: str, exit_code: int = 0) -> dict:
        result = run("size", "ibm-granite/granite-4.0-h-350m", "--gpu", "H100", "--ctx", "4k", "--vllm-version",
                     version, "--workload", str(trace), "--workload-option", "hash_block_tokens=400", "--json", *extra)
        assert result.exit_code == exit_code, result.output
        return json.loads(result.stdout)["workload"]

    w = workload("0.32.0")
    assert (w["block_size"], w["queried_tokens"]) == (400, 2400)
    assert (w["achievable_hit_rate"], w["hit_rate_at_pool"]) == (round(800 / 2400, 6), round(800 / 2400, 6))
    assert w["pool_for_share"] == {"50%": 25, "90%": 25, "99%": 25}
    assert any("7 x recurrent state (align, checkpoint page) + full attention" in n for n in w["notes"])
    assert workload("0.31.0")["pool_for_share"] == {"50%": 18, "90%": 18, "99%": 18}
    # --num-gpu-blocks-override counts the null block: 26 -> 25 usable (such a pool does not fit a 4k request:
    # exit 1, the workload still planned).
    at_25 = workload("0.32.0", "--num-gpu-blocks-override", "26", exit_code=1)
    at_24 = workload("0.32.0", "--num-gpu-blocks-override", "25", exit_code=1)
    assert (at_25["pool_blocks"], at_25["hit_rate_at_pool"], at_25["sessions_held_at_once"]) == (25, round(800 / 2400, 6), 1)
    assert (at_24["pool_blocks"], at_24["hit_rate_at_pool"], at_24["sessions_held_at_once"]) == (24, 0.0, 0)
