"""How build_layout groups layer specs (kvplan.plan.layout), where each kind answers for itself.

Expected values by hand, bf16 (2 B), block 16: a full-attention layer of 8 KV heads x 128 holds
2 x 8 x 128 x 2 = 4,096 B a token, 65,536 B a block."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvplan.model.dtypes import kv_dtype
from kvplan.model.layers import MLA, FullAttention, LayerSpec, SlidingWindow
from kvplan.plan.layout import build_layout
from kvplan.vllm.rules import rules_for

BF16 = kv_dtype("bfloat16")


@dataclass(frozen=True)
class _Unregistered(LayerSpec):
    """A kind kvplan has no grouping rule for (as a new vLLM spec class would be)."""

    def per_rank(self, tp: int) -> LayerSpec:
        return self

    def bytes_per_token(self, dtype) -> float:
        return 100.0

    def describe(self) -> str:
        return "unregistered"


def test_an_unregistered_kind_is_refused_not_grouped_as_state():
    specs = [FullAttention(8, 128), _Unregistered()]
    with pytest.raises(NotImplementedError, match="_Unregistered has no KV grouping rule"):
        build_layout(specs, BF16, 16, rules_for("0.32.0"))


def test_one_kind_of_any_size_shares_one_group_table():
    """Full attention of two sizes is one type (UniformTypeKVCacheSpecs): one block table, pages summed."""
    layout = build_layout([FullAttention(8, 128), FullAttention(8, 128), FullAttention(4, 128)], BF16, 16,
                          rules_for("0.32.0"))
    assert layout.shared_block_table
    assert layout.page_bytes == 16 * 2 * 8 * 128 * 2  # the largest page: 65,536 B
    assert layout.block_bytes == 2 * 65_536 + 16 * 2 * 4 * 128 * 2  # 163,840 B a block id across the 3 layers


def test_without_the_hybrid_allocator_a_window_is_full_attention():
    window = SlidingWindow(8, 128, window=4096)
    assert window.without_hybrid_allocator() == FullAttention(8, 128)
    assert MLA(latent_size=576).without_hybrid_allocator() == MLA(latent_size=576)
    assert window.uniform_type_key() == ("sliding", 4096) != FullAttention(8, 128).uniform_type_key()
