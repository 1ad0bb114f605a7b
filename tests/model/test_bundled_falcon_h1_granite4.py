"""The bundled tiiuae/Falcon-H1-34B-Instruct and ibm-granite/granite-4.0-h-350m profiles, against numbers
worked out by hand from their config.json and vLLM 0.32.0's Mamba-2 state shapes
(`MambaStateShapeCalculator.mamba2_state_shape`, model_executor/layers/mamba/mamba_utils.py@0.32.0: conv
state (d_inner + 2 x n_groups x d_state) x (d_conv - 1), SSM state heads x head_dim x d_state). The
engine twins (tests/twins) check the same layouts against vLLM itself."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanError
from kvplan.model.arch import parse_architecture
from kvplan.model.dtypes import kv_dtype
from kvplan.model.layers import FullAttention, MambaState
from kvplan.model.source import load_bundled

BF16 = kv_dtype("bfloat16")


def arch_of(name):
    found = load_bundled(name)
    assert found is not None, name
    return parse_architecture(found.config)


def test_falcon_h1_34b_every_layer_is_attention_and_mamba():
    # 72 layers, attn_layer_indices null: each layer has both an attention and a Mamba-2 mixer.
    arch = arch_of("tiiuae/Falcon-H1-34B-Instruct")
    attention = [s for s in arch.layers if isinstance(s, FullAttention)]
    mamba = [s for s in arch.layers if isinstance(s, MambaState)]
    assert len(attention) == len(mamba) == 72
    # KV per token: 72 x 2 (K, V) x 4 KV heads x 128 x 2 B = 147,456
    assert sum(s.bytes_per_token(BF16) for s in attention) == 147_456
    # mamba_d_ssm 4,096, n_groups 2, d_state 256, d_conv 4, 32 heads x 128, bf16:
    # conv (4,096 + 2 x 2 x 256) x 3 x 2 = 30,720; SSM 32 x 128 x 256 x 2 = 2,097,152 -> 2,127,872 B
    assert {s.state_bytes() for s in mamba} == {2_127_872}


def test_granite_4_h_350m_layer_types_and_state():
    # layer_types: attention at 10, 13, 17, 27; the other 28 layers Mamba-2.
    arch = arch_of("ibm-granite/granite-4.0-h-350m")
    kinds = ["attention" if isinstance(s, FullAttention) else "mamba" for s in arch.layers]
    assert [i for i, k in enumerate(kinds) if k == "attention"] == [10, 13, 17, 27]
    assert kinds.count("mamba") == 28
    # KV per token: 4 layers x 2 x 4 KV heads x 64 x 2 B = 4,096
    assert sum(s.bytes_per_token(BF16) for s in arch.layers if isinstance(s, FullAttention)) == 4_096
    # d_inner = 2 x 768 = 1,536, n_groups 1, d_state 128, d_conv 4, 48 heads x 32:
    # conv (1,536 + 2 x 128) x 3 x 2 = 10,752; SSM 48 x 32 x 128 x 2 = 393,216 -> 403,968 B
    assert {s.state_bytes() for s in arch.layers if isinstance(s, MambaState)} == {403_968}
    # num_local_experts 0 and num_experts_per_tok 0: a dense model (a shared MLP only), not a broken config
    assert arch.params.experts == 0 and arch.num_experts == 0


def test_a_zero_top_k_with_experts_is_still_refused():
    config = dict(load_bundled("ibm-granite/granite-4.0-h-350m").config, num_local_experts=8)
    with pytest.raises(KvplanError, match="num_experts_per_tok"):
        parse_architecture(config)
