"""Data parallel (vLLM's --data-parallel-size) with MoE models: vLLM shards the routed experts over every
GPU of the deployment, tp x dp (`FusedMoEParallelConfig.make`, flatten_tp_across_dp, read in
vllm/model_executor/layers/fused_moe/config.py of 0.10.2 to 0.33.0); attention, dense and shared-expert
weights stay per replica, split over tp. Expected bytes from the bundled configs by hand."""

import json

from helpers.harness import invoke  # noqa: E402

# Mixtral-8x7B (profiles/models/mistralai--Mixtral-8x7B-v0.1.json): 32 layers x 8 experts x 3 matrices x
# hidden 4096 x intermediate 14336 = 45,097,156,608 routed-expert parameters, bf16: 90,194,313,216 bytes.
MIXTRAL_ROUTED_BYTES = 32 * 8 * 3 * 4096 * 14336 * 2


def _plan(*args):
    result = invoke("size", "mistralai/Mixtral-8x7B-v0.1", "--ctx", "8k", "--json", *args)
    assert result.code in (0, 1), result.stderr
    return json.loads(result.stdout)


def _weights(plan):
    return next(t["bytes"] for t in plan["memory_terms"] if t["name"] == "weights")


def test_two_replicas_share_the_experts_of_four_gpus():
    one = _plan("--gpu", "2xH100", "--tp", "2")
    two = _plan("--gpu", "4xH100", "--tp", "2")
    assert (one["replicas"], two["replicas"]) == (1, 2)
    # per GPU: the experts go from routed / 2 to routed / 4; everything else stays / 2
    assert _weights(one) - _weights(two) == MIXTRAL_ROUTED_BYTES // 4
    assert "--data-parallel-size 2 --tensor-parallel-size 2" in two["vllm_serve_command"]
    assert any("shards the MoE experts over 4 GPUs" in n for n in two["notes"])


def test_expert_parallel_holds_whole_experts_the_fullest_gpu_one_more():
    """8 experts over 3 GPUs (TP 1, DP 3): with expert parallel the first GPUs hold 3 whole experts
    (vLLM's determine_expert_map: 8 // 3 + 1), 3/8 of the experts, where one GPU holds all 8. (Without
    expert parallel vLLM refuses 3 ranks: 14,336 / 3 is no whole number, test_moe_split.py.)"""
    one = _plan("--gpu", "1xH100", "--tp", "1")
    ep = _plan("--gpu", "3xH100", "--tp", "1", "--enable-expert-parallel")
    assert "--enable-expert-parallel" in ep["vllm_serve_command"]
    assert abs((_weights(one) - _weights(ep)) - MIXTRAL_ROUTED_BYTES * (1 - 3 / 8)) <= 2


def test_a_dense_model_is_replicated_and_old_releases_keep_full_copies():
    dense = [_weights(_plan_of("meta-llama/Llama-3.1-8B", g)) for g in ("1xH100", "2xH100")]
    assert dense[0] == dense[1]
    old = _plan("--gpu", "4xH100", "--tp", "2", "--vllm-version", "0.9.2")
    assert _weights(old) == _weights(_plan("--gpu", "2xH100", "--tp", "2", "--vllm-version", "0.9.2"))


def _plan_of(model, gpu):
    result = invoke("size", model, "--gpu", gpu, "--tp", "1", "--ctx", "8k", "--json")
    assert result.code in (0, 1), result.stderr
    return json.loads(result.stdout)
