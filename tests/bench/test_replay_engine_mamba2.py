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
release's groups (the engine's /version: 0.32.0), against the engine's own prefix-cache counters."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from helpers.bench import BLOCK_SIZE, TINY_MODEL, bench_env, engine_required, kvplan_cmd

pytestmark = [pytest.mark.engine, engine_required]

#: 24 usable blocks of 32: the replay below keeps 768 of its 1,800 prompt tokens' hits there, where a pool of 27 blocks
#: or more keeps all 960 it can (kvplan's simulator); the engine's own count says whether it evicted (by hand below).
POOL_BLOCKS = 25

#: Granite-4.0-H's layout at toy size: mamba_expand x hidden = heads x head dim (128).
TINY_GRANITE_H = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "vocab_size": 1024,
    "hidden_size": 128, "intermediate_size": 256, "shared_intermediate_size": 256, "num_local_experts": 0,
    "num_experts_per_tok": 0, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
    "position_embedding_type": "rope", "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "mamba_n_heads": 4, "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_d_head": 32, "mamba_d_conv": 4,
    "mamba_expand": 1, "mamba_chunk_size": 32, "hidden_act": "silu", "rms_norm_eps": 1e-06, "bos_token_id": 0,
    "eos_token_id": 1, "pad_token_id": 2, "tie_word_embeddings": True, "dtype": "bfloat16"}


@pytest.fixture()
def tiny_granite_h(tmp_path):
    model = tmp_path / "tiny-granite-h"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_GRANITE_H, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(TINY_MODEL / name, model / name)
    return model


def test_mamba2_hybrid_replays_as_predicted(tiny_granite_h, tmp_path):
    """Agent sessions in lockstep, launched by kvplan (the start-up log names the release: 0.32.0) with a 32-token
    chunk budget. The budget keeps every prefill chunk inside one block, so no chunk exports the state at its
    checkpoint (`is_mamba_prefill_checkpoint_valid`, v1/kv_cache_interface.py@0.32.0, needs the chunk to start a
    block or more before it): vLLM 0.32.0's CPU scan returns one final state per sequence and ignores
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
    flags = ["--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(POOL_BLOCKS), "--kv-memory",
             str(64 * 2**20), "--ctx", "512", "--enforce-eager", "--max-num-batched-tokens", str(BLOCK_SIZE),
             "--engine-arg=--load-format=dummy"]
    proc = subprocess.run(kvplan_cmd(str(tiny_granite_h), *flags, "--no-warmup", "--json", "--out",
                                     str(tmp_path / "runs"), "--traffic", str(agent), "--sessions", "3"),
                          capture_output=True, text=True, env=bench_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert (out["capacity"]["vllm_version"], out["capacity"]["block_size"]) == ("0.32.0", BLOCK_SIZE), out["capacity"]
    (point,) = out["points"]
    r = point["replay"]
    assert r["predicted_by"] == "simulator, in engine steps (sessions in lockstep, over client timings)", r
    assert r["prefix_queries"] == r["predicted_queries"] == 1800, r
    assert r["prefix_hits"] < 960, r  # the pool evicted
    assert abs(r["hit_rate"] - r["predicted_hit_rate"]) <= 0.02, r
    assert r["predicted_hit_rate_low"] - 0.02 <= r["hit_rate"] <= r["predicted_hit_rate_high"] + 0.02, r
    assert r["predicted_preemption"] == (point["server"]["preemptions"] > 0), (r, point["server"])
