"""vLLM's fused MoE splits every routed expert's matrices over all tp x dp ranks when expert parallel is
off, and asserts ``intermediate_size % tp_size == 0`` (`FusedMoEConfig.__post_init__`,
vllm/model_executor/layers/fused_moe/config.py@0.32.0, tp_size flattened over dp by
`FusedMoEParallelConfig.make`): kvplan refuses those splits as vLLM would fail to start, and keeps the
ones that divide, and every split with expert parallel (whole experts: tp_size 1)."""

from __future__ import annotations

import json

import pytest

from kvplan.deploy import load_model, select_gpus
from kvplan.errors import KvplanError
from kvplan.plan.capacity import compute_capacity, moe_split_error
from kvplan.plan.fit import MOE_SPLIT_REFUSED, FitRequest, search
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.vllm.rules import rules_for

#: An MoE model whose experts' intermediate size, 1,001 = 7 x 11 x 13, is odd: no even split divides it.
ODD_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 1024,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 3072, "moe_intermediate_size": 1001, "num_experts": 8, "num_experts_per_tok": 2,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 32000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def odd_moe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("odd-moe")
    (folder / "config.json").write_text(json.dumps(ODD_MOE))
    return load_model(str(folder), offline=True)


def capacity(model, tp: int, dp: int = 1, ep: bool = False):
    settings = Settings(tensor_parallel_size=tp, data_parallel_size=dp, enable_expert_parallel=ep, max_model_len=4096)
    return compute_capacity(model.arch, select_gpus("H100").device, settings, rules_for(None), load_overhead(),
                            model.weights_total)


def test_the_config_is_read(odd_moe):
    assert (odd_moe.arch.num_experts, odd_moe.arch.expert_intermediate_size) == (8, 1001)


@pytest.mark.parametrize("tp,dp", [(2, 1), (4, 1), (1, 2), (2, 3)])
def test_a_split_that_does_not_divide_is_refused(odd_moe, tp, dp):
    with pytest.raises(KvplanError, match=rf"1,001 does not divide over {tp * dp} MoE ranks"):
        capacity(odd_moe, tp, dp)


@pytest.mark.parametrize("tp,dp", [(2, 1), (1, 2), (2, 3)])
def test_expert_parallel_has_no_such_limit(odd_moe, tp, dp):
    assert capacity(odd_moe, tp, dp, ep=True).num_blocks > 0


def test_splits_that_divide_start():
    """Mixtral-8x7B: 14,336 = 2^11 x 7. 7 ranks divide it (2,048 each), 3 do not (4,778.67)."""
    mixtral = load_model("mistralai/Mixtral-8x7B-v0.1", offline=True)
    assert mixtral.arch.expert_intermediate_size == 14336
    assert moe_split_error(mixtral.arch, 7) is None and moe_split_error(mixtral.arch, 8) is None
    assert "14,336 does not divide over 3 MoE ranks" in moe_split_error(mixtral.arch, 3)
    dense = load_model("meta-llama/Llama-3.1-8B", offline=True)
    assert moe_split_error(dense.arch, 3) is None  # no experts: nothing to split


def test_fit_rejects_the_split_and_keeps_expert_parallel(odd_moe):
    """Two GPUs: TP 2 (expert parallel off) is refused; two replicas, which fit proposes with expert
    parallel, are kept; one GPU is kept."""
    found = search(odd_moe.arch, [select_gpus("H100").device], FitRequest(ctx=4096, concurrency=1, max_gpus=2,
                   kv_dtypes=("auto",), allow_pp=False), rules_for(None), load_overhead(), odd_moe.weights_total)
    kept = {(c.tp, c.dp) for c in found.fitting}
    assert kept == {(1, 1), (1, 2)}
    assert found.rejected_reasons[MOE_SPLIT_REFUSED] == 1
