"""`kvplan size --layout engine`: the layout learned from the installed vLLM, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine

# An architecture vLLM 0.32 serves (on its Transformers backend, which slides the layers layer_types
# names) and kvplan has no family rules for: SmolLM3 with sliding windows on three of every four
# layers. Small shapes, written here.
SMOLLM3 = {
    "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 512,
    "max_position_embeddings": 8192, "sliding_window": 1024,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "rope_theta": 500000,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,  # SmolLM3Config's defaults exceed the small vocabulary
}


def kvplan(*args: str, cache: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CACHE_HOME=cache)
    return subprocess.run([sys.executable, "-m", "kvplan", "size", *args], capture_output=True, text=True,
                          env=env, timeout=900)


def test_an_unknown_architecture_is_planned_from_the_engine_and_cached(tmp_path):
    model = tmp_path / "smollm3"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM3))
    cache = str(tmp_path / "cache")
    args = [str(model), "--gpu", "H100", "--ctx", "4k", "--kv-memory", "1GiB", "--json"]

    refused = kvplan(*args[:-1], cache=cache)
    assert refused.returncode == 2 and "no layout rules for model_type 'smollm3'" in refused.stderr

    learned = kvplan(*args, "--layout", "engine", cache=cache)
    assert learned.returncode == 0, learned.stderr[-2000:]
    plan = json.loads(learned.stdout)
    assert plan["layout_source"].startswith("vLLM 0.32.0 (exact")
    # What vLLM built: 3 sliding-window layers (window 1,024) and 1 full-attention layer, 2 KV heads x
    # 64 (256 / 4 heads); K and V in bf16: 4 x 2 x 64 x 2 x 2 B = 2,048 B per token.
    layers = {}
    for group in plan["kv_groups"]:
        layers[group["kind"]] = layers.get(group["kind"], 0) + group["layers"]
    assert layers == {"sliding_window": 3, "full_attention": 1}
    assert plan["kv_bytes_per_token"] == 4 * 2 * 64 * 2 * 2
    assert "UNVERIFIED" not in plan["verdict"]
    cached = list((tmp_path / "cache" / "kvplan" / "layouts").glob("*.json"))
    assert len(cached) == 1

    again = kvplan(*args, "--layout", "engine", cache=cache)  # from the cache: no engine start
    assert again.returncode == 0 and json.loads(again.stdout)["num_blocks"] == plan["num_blocks"]

    unverified = kvplan(*args, "--allow-unverified-layout", cache=cache)
    assert unverified.returncode == 0
    assert json.loads(unverified.stdout)["verdict"].startswith("UNVERIFIED LAYOUT")


def test_engine_layout_agrees_with_the_rules_for_a_known_family(tmp_path):
    cache = str(tmp_path / "cache")
    args = ["google/gemma-3-1b-it", "--gpu", "H100", "--ctx", "8k", "--kv-memory", "2GiB", "--json",
            "--vllm-version", "0.32.0"]
    rules = kvplan(*args, cache=cache)
    engine = kvplan(*args, "--layout", "engine", cache=cache)
    assert rules.returncode == 0 and engine.returncode == 0, engine.stderr[-2000:]
    by_rules, by_engine = json.loads(rules.stdout), json.loads(engine.stdout)
    assert by_engine["layout_source"].startswith("vLLM 0.32.0 (exact")
    for key in ("num_blocks", "kv_cache_tokens", "max_concurrency", "kv_bytes_per_token", "block_size"):
        assert by_engine[key] == by_rules[key], key
