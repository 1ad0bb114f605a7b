"""vLLM's --speculative-config in the pool (issue 21 item 4).

Expected numbers are the engine's own start-up lines where a public log gives them, else hand arithmetic
from the bundled configs and vLLM 0.32.0's rules (cited in kvplan/plan/speculative.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.errors import KvplanError
from kvplan.plan.speculative import parse_speculative_config

runner = CliRunner()

MTP3 = '{"method": "mtp", "num_speculative_tokens": 3}'


def size_json(*args: str) -> dict:
    pinned = () if "--vllm-version" in args else ("--vllm-version", "0.33.0")  # figures worked for 0.33
    result = runner.invoke(app, ["size", *args, *pinned, "--offline", "--json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


# --- reading the JSON as vLLM does ---------------------------------------------------------------------


def test_mtp_aliases_fold_to_mtp_and_the_lookahead_is_k():
    spec = parse_speculative_config('{"method": "qwen3_5_mtp", "num_speculative_tokens": 2}')
    assert (spec.method, spec.num_speculative_tokens, spec.lookahead_tokens, spec.adds_kv_layers) == ("mtp", 2, 2, True)


@pytest.mark.parametrize("doc, method, lookahead", [
    ({"model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}, "eagle", 3),
    ({"model": "AngelSlim/Qwen3-8B_eagle3", "num_speculative_tokens": 3}, "eagle3", 3),
    ({"model": "z-lab/Qwen3-8B-DFlash-b16", "num_speculative_tokens": 15}, "dflash", 16),  # K + 1
    ({"model": "[ngram]", "num_speculative_tokens": 4}, "ngram", 0),
    ({"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 5}, "draft_model", 5),
    ({"method": "suffix"}, "suffix", 0),
])
def test_the_method_is_detected_from_the_draft_name_as_vllm_does(doc, method, lookahead):
    spec = parse_speculative_config(doc)
    assert (spec.method, spec.lookahead_tokens) == (method, lookahead)


def test_suffix_decoding_drafts_vllms_default_tree_depth():
    assert parse_speculative_config({"method": "suffix"}).num_speculative_tokens == 24


@pytest.mark.parametrize("text, said", [
    ('{"method": "mtp", "num_speculative_tokens": 3, "num_lookahead_slots": 3}', "unknown key"),
    ('{"method": "mtp"}', "needs num_speculative_tokens"),
    ('{"method": "mtp", "num_speculative_tokens": 0}', "from 1 to 128"),
    ('{"method": "mtp", "num_speculative_tokens": 1e9}', "from 1 to 128"),
    ('{"method": "mtp", "num_speculative_tokens": true}', "from 1 to 128"),
    ('{"method": "telepathy", "num_speculative_tokens": 3}', "unknown method"),
    ('[1, 2]', "JSON object"),
    ('{"method": ', "not JSON"),
    ('{"model": 7, "num_speculative_tokens": 3}', "model must be a string"),
])
def test_bad_configs_are_refused_with_the_reason(text, said):
    with pytest.raises(KvplanError, match=said):
        parse_speculative_config(text)


def test_a_bad_config_on_the_command_line_is_one_line_and_exit_2():
    result = runner.invoke(app, ["size", "Qwen/Qwen3.5-27B", "--gpu", "H100", "--offline",
                                 "--speculative-config", '{"method": "mtp"}'])
    assert result.exit_code == 2
    assert "needs num_speculative_tokens" in result.output and "Traceback" not in result.output


# --- the pool: Qwen3.5/3.6-27B with MTP, against public start-up logs -----------------------------------


def test_qwen3_6_27b_with_mtp3_prints_what_vllm_printed():
    """https://github.com/noonghunna/club-3090/issues/294: Qwen3.6-27B (Qwen3.5-27B's shape) on 2 x RTX 3090,
    TP 2, fp8_e5m2 KV, max_model_len 262,144, prefix caching, MTP with 3 tokens: "GPU KV cache size: 622,408
    tokens", "Maximum concurrency for 262,144 tokens per request: 2.37x"; #295, the same settings: 620,944.

    By hand (config: 48 gated-delta-net layers, 16 k-heads and 48 v-heads of 128, conv kernel 4, SSM float32;
    16 full-attention layers, 4 KV heads of 256):
    - state per GPU: conv (2 x 16 x 128 + 48 x 128) / 2 = 5,120 rows x (4 - 1 + 3) columns x 2 B = 61,440,
      SSM 24 x 128 x 128 x 4 B = 1,572,864: 1,634,304 B;
    - attention: 2 KV heads x 256 x 2 x 1 B = 1,024 B a token a layer; block 16 x cdiv(1,634,304, 16 x 1,024) =
      1,600 tokens;
    - 16 + 1 MTP = 17 full layers in one group, 48 state layers in 3 groups of 17 (3 padding);
    - a request: cdiv(262,144, 1,600) = 164 blocks + 3 state groups x (2 + 3) = 179;
    - 425 blocks / 179 = 2.3743 -> int(2.3743 x 262,144) = 622,408; 424 -> 620,944."""
    args = ("Qwen/Qwen3.5-27B", "--gpu", "2x3090", "--tp", "2", "--ctx", "262144", "--kv-cache-dtype", "fp8_e5m2",
            "--enable-prefix-caching", "--speculative-config", MTP3, "--vllm-version", "0.32.0")
    plan = size_json(*args, "--num-gpu-blocks-override", "425")
    assert (plan["block_size"], plan["kv_cache_tokens"], round(plan["max_concurrency"], 2)) == (1600, 622_408, 2.37)
    assert size_json(*args, "--num-gpu-blocks-override", "424")["kv_cache_tokens"] == 620_944
    groups = {g["kind"]: g for g in plan["kv_groups"]}
    assert groups["full_attention"]["layers"] == 17


def test_vllm_0_20_1_counts_the_speculative_state_blocks_too():
    """https://github.com/noonghunna/club-3090/issues/91: the same deployment on "Initializing a V1 LLM engine
    (v0.20.1)", speculative_config=SpeculativeConfig(method='mtp', ..., num_spec_tokens=3): "GPU KV cache size:
    619,479 tokens", "Maximum concurrency for 262,144 tokens per request: 2.36x" = 423 blocks / 179 a request
    (423 / 179 x 262,144 = 619,479.4). Without the 3 x 3 speculative state blocks (170 a request) no whole
    number of blocks prints 619,479."""
    plan = size_json("Qwen/Qwen3.5-27B", "--gpu", "2x3090", "--tp", "2", "--ctx", "262144", "--kv-cache-dtype",
                     "fp8_e5m2", "--enable-prefix-caching", "--speculative-config", MTP3, "--vllm-version", "0.20.1",
                     "--num-gpu-blocks-override", "423")
    assert (plan["block_size"], plan["kv_cache_tokens"], round(plan["max_concurrency"], 2)) == (1600, 619_479, 2.36)


def test_without_mtp_the_same_pool_holds_more_tokens():
    """The same 425 blocks without the drafter: block 16 x cdiv(5,120 x 3 x 2 + 1,572,864, 16,384) = 1,568, a
    request cdiv(262,144, 1,568) = 168 + 3 x 2 = 174 blocks: 425 / 174 x 262,144 = 640,294 tokens."""
    plan = size_json("Qwen/Qwen3.5-27B", "--gpu", "2x3090", "--tp", "2", "--ctx", "262144", "--kv-cache-dtype",
                     "fp8_e5m2", "--enable-prefix-caching", "--vllm-version", "0.32.0", "--num-gpu-blocks-override", "425")
    assert (plan["block_size"], plan["kv_cache_tokens"]) == (1568, 640_294)


def test_ngram_adds_no_layers_but_widens_the_recurrent_state():
    """ngram drafts no KV layers, yet vLLM sizes every gated-delta-net state for K more tokens and keeps K
    more state blocks a request (num_speculative_blocks = vllm_config.num_speculative_tokens): K = 3 gives the
    block of 1,600 tokens, 16 full layers, 164 + 3 x 5 = 179 blocks a request: 425 / 179 -> 622,408."""
    plan = size_json("Qwen/Qwen3.5-27B", "--gpu", "2x3090", "--tp", "2", "--ctx", "262144", "--kv-cache-dtype",
                     "fp8_e5m2", "--enable-prefix-caching", "--vllm-version", "0.32.0", "--num-gpu-blocks-override", "425",
                     "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}')
    groups = {g["kind"]: g for g in plan["kv_groups"]}
    assert (plan["block_size"], groups["full_attention"]["layers"], plan["kv_cache_tokens"]) == (1600, 16, 622_408)


def test_ngram_on_an_attention_model_changes_nothing_at_start_up():
    base = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k")
    plain = size_json(*base)
    ngram = size_json(*base, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}')
    assert (ngram["num_blocks"], ngram["kv_cache_tokens"]) == (plain["num_blocks"], plain["kv_cache_tokens"])


def test_eagle_adds_one_layer_of_the_targets_shape_and_its_weights():
    """Llama-3.1-8B: 32 layers of 8 KV heads x 128 x 2 x 2 B = 4,096 B a token each; EAGLE's one draft layer
    makes it 33 x 4,096 = 135,168 B a token, with a block of 16: 2,162,688 B a block."""
    base = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-memory", "20GiB")
    plan = size_json(*base, "--speculative-config", '{"model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", '
                                                     '"num_speculative_tokens": 3}')
    assert plan["block_bytes"] == 33 * 4096 * 16
    assert plan["num_blocks"] == 20 * 2**30 // (33 * 4096 * 16)
    assert any("one draft layer" in n and "cannot find model 'yuhuili/EAGLE-LLaMA3.1-Instruct-8B'" in n
               for n in plan["notes"])  # offline: the head's config is not at hand, and the note says so


def test_a_draft_model_brings_its_own_layers_and_weights():
    """Llama-3.2-1B (bundled) drafting for Llama-3.1-8B: its 16 layers of 8 KV heads x 64 x 2 x 2 B = 2,048 B a
    token each join the target's 32 x 4,096 B in one group of unequal pages (vLLM's uniform-type layout, as the
    "draft-model" twin shows): (131,072 + 32,768) x 16 = 2,621,440 B a block. Its weights by hand from its
    config: embedding 128,256 x 2,048 (tied, no LM head) + 16 x (attention 10,485,760 + MLP 3 x 2,048 x 8,192 +
    two norms 4,096) + the final norm 2,048 = 1,235,814,400 parameters, 2,471,628,800 B in bf16."""
    base = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-memory", "20GiB")
    plain = size_json(*base)
    plan = size_json(*base, "--speculative-config", '{"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 5}')
    assert plan["block_bytes"] == (32 * 4096 + 16 * 2048) * 16
    assert plan["num_blocks"] == 20 * 2**30 // plan["block_bytes"]
    assert plan["weights_bytes"] - plain["weights_bytes"] == 2_471_628_800
    assert any("the draft's own 16 KV layer(s) from its config (bundled)" in n for n in plan["notes"])
    # --draft-layers still sets the layers (of the target's shape)
    given = size_json(*base, "--speculative-config", '{"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 5}',
                      "--draft-layers", "16")
    assert given["block_bytes"] == (32 + 16) * 4096 * 16


def test_the_drafts_own_kv_dtype_sizes_its_layers():
    """vLLM builds the drafter under a cache config with the speculative config's kv_cache_dtype (a key from 0.26;
    kvplan.vllm.rules). Llama-3.2-1B's 16 layers in fp8 beside the target's 32 in bf16: (32 x 4,096 + 16 x 1,024)
    x 16 = 2,359,296 B a block. vLLM 0.31's default runner keeps the target's dtype for a draft model (the bf16
    block, 2,621,440 B); 0.25 refuses the key. "auto" is the model dtype, whatever the target's: under an fp8
    target, bf16 draft layers: (32 x 2,048 + 16 x 2,048) x 16 = 1,572,864 B."""
    base = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-memory", "20GiB")
    draft = '{"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 5, "kv_cache_dtype": "%s"}'
    assert size_json(*base, "--speculative-config", draft % "fp8")["block_bytes"] == (32 * 4096 + 16 * 1024) * 16
    assert size_json(*base, "--vllm-version", "0.31.0", "--speculative-config", draft % "fp8")["block_bytes"] == (
        (32 * 4096 + 16 * 2048) * 16)
    refused = runner.invoke(app, ["size", *base, "--offline", "--vllm-version", "0.25.0", "--speculative-config",
                                  draft % "fp8"])
    assert refused.exit_code == 2 and "a key from 0.26" in refused.output
    fp8_target = size_json(*base, "--kv-cache-dtype", "fp8", "--speculative-config", draft % "auto")
    assert fp8_target["block_bytes"] == (32 * 2048 + 16 * 2048) * 16


def test_a_draft_kv_dtype_on_a_hybrid_model_is_refused():
    result = runner.invoke(app, ["size", "google/gemma-3-12b-it", "--gpu", "H100", "--offline", "--speculative-config",
                                 '{"method": "eagle3", "model": "x/eagle3", "num_speculative_tokens": 3, '
                                 '"kv_cache_dtype": "fp8"}'])
    assert result.exit_code == 2 and "hybrid model is not modelled" in result.output


def test_a_draft_model_kvplan_cannot_load_needs_its_layers_given():
    result = runner.invoke(app, ["size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--offline", "--speculative-config",
                                 '{"model": "acme/drafter-1b", "num_speculative_tokens": 5}'])
    assert result.exit_code == 2 and "--draft-layers" in result.output and "acme/drafter-1b" in result.output


# The config of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (https://huggingface.co/yuhuili/EAGLE3-LLaMA3.1-Instruct-8B).
EAGLE3_LLAMA_8B = {
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
    "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000}


def test_an_eagle3_head_from_its_folder_brings_its_layers_and_weights(tmp_path):
    """Its one decoder layer has the target's KV shape (33 x 4,096 B a token); its weights, by hand: attention
    4,096 x (4,096 + 1,024 + 1,024) + 4,096 x 4,096 = 41,943,040, MLP 3 x 4,096 x 14,336 = 176,160,768, the fc
    over three hidden states 3 x 4,096 x 4,096 = 50,331,648, its LM head over the 32,000-token draft vocabulary
    131,072,000; the embedding is the target's. 399,507,456 parameters plus its norms (at most 3 x 4,096), in
    the target's bf16."""
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3_LLAMA_8B))
    base = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-memory", "20GiB")
    plain = size_json(*base)
    plan = size_json(*base, "--speculative-config",
                     json.dumps({"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 3}))
    assert plan["block_bytes"] == 33 * 4096 * 16
    extra = plan["weights_bytes"] - plain["weights_bytes"]
    assert 0 <= extra - 399_507_456 * 2 <= 3 * 4096 * 2
    assert any("the draft's own 1 KV layer(s) from its config (local)" in n for n in plan["notes"])


def test_the_lookahead_counts_in_a_running_request_not_in_vllms_figure():
    """Llama-3.1-8B, blocks of 16: a 1,000 + 25 token request holds 1,024 tokens: 64 blocks; with MTP-style
    lookahead of 3 (EAGLE) it allocates 1,027 slots: 65 blocks. vLLM's own concurrency figure (whole
    context) leaves the lookahead out."""
    base = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--prompt", "1000", "--output", "25")
    assert size_json(*base)["blocks_per_request"] == 64
    eagle = size_json(*base, "--speculative-config", '{"method": "eagle", "model": "x/EAGLE-8B", "num_speculative_tokens": 3}')
    assert eagle["blocks_per_request"] == 65


def test_the_serve_line_carries_the_config_as_given():
    plan = size_json("Qwen/Qwen3.5-27B", "--gpu", "2xH100", "--ctx", "64k", "--speculative-config",
                     '{"method":"qwen3_5_mtp","num_speculative_tokens":2}')
    assert """--speculative-config '{"method":"qwen3_5_mtp","num_speculative_tokens":2}'""" in plan["vllm_serve_command"]


# --- start-up logs --------------------------------------------------------------------------------------


def test_a_log_shows_the_config_in_its_args_and_the_engines_resolved_method():
    from kvplan.vllm.startup_log import parse_startup_log

    args = ("INFO 06-20 10:00:00 [api_utils.py:286] non-default args: {'model': 'Qwen/Qwen3.6-27B', "
            "'speculative_config': {'method': 'qwen3_5_mtp', 'num_speculative_tokens': 3}}\n")
    assert parse_startup_log(args).speculative_config == {"method": "qwen3_5_mtp", "num_speculative_tokens": 3}
    init = ("INFO 06-20 10:00:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
            "model='Qwen/Qwen3.6-27B', speculative_config=SpeculativeConfig(method='mtp', model='Qwen/Qwen3.6-27B', "
            "num_spec_tokens=3), tokenizer='Qwen/Qwen3.6-27B', max_seq_len=262144, tensor_parallel_size=2\n")
    r = parse_startup_log(args + init)
    assert r.speculative_config == {"method": "mtp", "num_speculative_tokens": 3, "model": "Qwen/Qwen3.6-27B"}
    shorthand = "non-default args: {'model': 'm', 'spec_method': 'ngram', 'spec_tokens': 4}\n"
    assert parse_startup_log(shorthand).speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert parse_startup_log("non-default args: {'model': 'x'}\n").speculative_config is None


def test_kvplan_yaml_takes_the_config_and_refuses_a_bad_one(tmp_path):
    from kvplan.gate.spec import load_spec

    good = tmp_path / "kvplan.yaml"
    good.write_text("deployments:\n  - name: a\n    model: Qwen/Qwen3.5-27B\n    gpu: 2xH100\n"
                    "    speculative_config: {method: mtp, num_speculative_tokens: 2}\n")
    (entry,) = load_spec(good).entries
    assert entry.deployment.settings(2).speculative.num_speculative_tokens == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments:\n  - name: a\n    model: m\n    gpu: H100\n    speculative_config: {method: mtp}\n")
    with pytest.raises(KvplanError, match="needs num_speculative_tokens"):
        load_spec(bad)


def test_fit_plans_the_speculative_config_as_size_does():
    """Every `fit` row is the plan `size` makes: with MTP, 2 x H100 TP 2 at 128k holds the blocks and needs the
    blocks per request `size` gives for the same deployment, and its serve line carries the config."""
    mtp = '{"method":"mtp","num_speculative_tokens":3}'
    result = runner.invoke(app, ["fit", "Qwen/Qwen3.5-27B", "--ctx", "128k", "-c", "4", "--gpus", "H100", "--offline",
                                 "--speculative-config", mtp, "--vllm-version", "0.33.0", "--json"])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout)["deployments"] if r["gpus"] == 2 and r["tensor_parallel_size"] == 2
               and r["kv_cache_dtype"] == "bfloat16")
    plan = size_json("Qwen/Qwen3.5-27B", "--ctx", "128k", "-c", "4", "--gpu", "2xH100", "--speculative-config", mtp)
    assert (row["usable_blocks"], row["blocks_needed"]) == (plan["num_blocks"] - 1, 4 * plan["blocks_per_request"])
    assert f"--speculative-config '{mtp}'" in row["vllm_serve_command"]
