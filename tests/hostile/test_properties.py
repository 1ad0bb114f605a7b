"""Property-based tests: any config.json or kvplan.yaml, however odd, gives a plan or one
KvplanError (exit 2) — never another exception, never a number from an impossible size."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from kvplan.errors import KvplanError
from kvplan.gate.spec import parse_spec_text
from kvplan.model.arch import parse_architecture
from kvplan.model.layers import FullAttention, MambaState
from kvplan.model.source import load_bundled

# Values a hostile or broken config may hold in any field.
ODD_VALUES = hs.one_of(
    hs.none(), hs.booleans(), hs.integers(min_value=-(2**70), max_value=2**70),
    hs.floats(allow_nan=True, allow_infinity=True), hs.text(max_size=8),
    hs.lists(hs.integers(min_value=-3, max_value=3), max_size=4), hs.dictionaries(hs.text(max_size=4), hs.integers(), max_size=2),
)
FIELDS = [
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "sliding_window", "layer_types", "kv_lora_rank", "qk_rope_head_dim", "index_head_dim", "attention_chunk_size",
    "num_kv_shared_layers", "max_position_embeddings", "rope_scaling", "linear_num_value_heads",
    "linear_key_head_dim", "mamba_ssm_dtype", "global_head_dim", "num_global_key_value_heads",
    "hybrid_override_pattern", "quantization_config", "torch_dtype", "vocab_size", "intermediate_size",
]
BASES = ["meta-llama/Llama-3.1-8B", "google/gemma-4-26B-A4B", "Qwen/Qwen3.5-27B", "deepseek-ai/DeepSeek-V3.2",
         "nvidia/Nemotron-H-56B-Base-8K", "openai/gpt-oss-20b", "ai21labs/Jamba-v0.1"]


def _text(config: dict) -> dict:
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=hs.sampled_from(BASES), patch=hs.dictionaries(hs.sampled_from(FIELDS), ODD_VALUES, max_size=4))
def test_any_patched_config_plans_or_says_why(base, patch):
    config = json.loads(json.dumps(load_bundled(base).config))
    _text(config).update(patch)
    try:
        arch = parse_architecture(config)
    except KvplanError:
        return
    # Whatever was accepted is a real shape: every size positive and finite.
    for spec in arch.layers:
        if isinstance(spec, FullAttention):
            assert spec.num_kv_heads > 0 and spec.head_size > 0
        if isinstance(spec, MambaState):
            assert spec.state_bytes() > 0
    assert arch.num_hidden_layers > 0 and arch.params.total >= 0


SPEC_KEYS = ["model", "gpu", "tp", "pp", "context", "concurrency", "prompt", "output", "kv_cache_dtype",
             "gpu_memory_utilization", "vllm_version", "headroom", "shared_prefix"]
YAML_SCALARS = hs.one_of(
    hs.integers(min_value=-(2**70), max_value=2**70), hs.sampled_from([".inf", "-.inf", ".nan", "1e400", "32k", "0",
                                                                       "-1", "H100", "4xH100", "~", "[]", "{}"]),
    hs.text(alphabet=hs.characters(blacklist_categories=("Cs",)), max_size=6),
)


@settings(max_examples=200, deadline=None)
@given(entries=hs.dictionaries(hs.sampled_from(SPEC_KEYS), YAML_SCALARS, max_size=6))
def test_any_spec_parses_or_says_why(entries):
    lines = ["deployments:", "  - name: d"] + [f"    {k}: {json.dumps(v) if isinstance(v, str) else v}"
                                                  for k, v in entries.items()]
    with contextlib.suppress(KvplanError):
        parse_spec_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("text", ["", "deployments:", "deployments: 3", "- a\n- b", "a: &x [*x]"])
def test_degenerate_specs_are_one_clear_error(text):
    with pytest.raises(KvplanError):
        parse_spec_text(text)
