"""vLLM's native CPU offload tier (`--kv-offloading-size GiB`, kvplan.plan.offload), by hand from vLLM 0.32's
``CPUOffloadingSpec`` arithmetic: a chunk is one GPU block of every rank holding a copy, rounded up to the 4 KiB
host page; chunks = GiB x 2^30 // chunk. The twins (tests/twins) check the same against vLLM's own spec code."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.errors import KvplanError
from kvplan.plan.offload import cpu_offload_tier

GiB = 1 << 30
ENV = {"HF_HUB_OFFLINE": "1"}


def size(*args: str) -> dict:
    pinned = () if "--vllm-version" in args else ("--vllm-version", "0.33.0")  # figures worked for 0.33
    result = CliRunner().invoke(app, ["size", *args, *pinned, "--json"], env=ENV)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_llama_8b_on_one_and_two_h100s():
    """Llama-3.1-8B, bf16, block 16: 16 x 32 layers x 2 x 8 KV heads x 128 x 2 B = 2 MiB a block on one GPU;
    200 GiB / 2 MiB = 102,400 chunks of 16 tokens. At TP 2 a rank's block is 1 MiB and a chunk holds both ranks'."""
    one = size("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-offloading-size", "200")["offload"]
    assert (one["chunk_bytes"], one["num_chunks"], one["tokens_per_chunk"]) == (2 * 1024**2, 102_400, 16)
    assert one["tokens"] == 102_400 * 16 == 1_638_400 and one["host_bytes"] == 200 * GiB
    two = size("meta-llama/Llama-3.1-8B", "--gpu", "2xH100", "--ctx", "32k", "--kv-offloading-size", "200")["offload"]
    assert (two["copies"], two["chunk_bytes"], two["num_chunks"]) == (2, 2 * 1024**2, 102_400)


def test_deepseek_v3_keeps_one_mla_copy_on_nvidia_and_one_per_rank_elsewhere():
    """DeepSeek-V3 at TP 8 on H200: FlashMLA's block 64 x 61 layers x 576 latent x 2 B = 4,497,408 B (a multiple
    of 4 KiB), one copy for the 8 ranks: 200 GiB // 4,497,408 = 47,749 chunks of 64 tokens."""
    plan = size("deepseek-ai/DeepSeek-V3", "--gpu", "8xH200", "--ctx", "32k", "--kv-offloading-size", "200")
    tier = plan["offload"]
    assert plan["block_size"] == 64 and tier["replicated_layout"] and tier["copies"] == 1
    assert (tier["chunk_bytes"], tier["num_chunks"], tier["tokens"]) == (4_497_408, 47_749, 47_749 * 64)
    assert "--kv-offloading-size 200" in plan["vllm_serve_command"]
    # vLLM shares the copy only where its shared region is used (CUDA, not ROCm; XPU): 8 copies on AMD
    amd = cpu_offload_tier(200, "native", block_bytes_per_rank=4_497_408, block_size=64, groups=1,
                           tensor_parallel_size=8, pipeline_parallel_size=1, decode_context_parallel_size=1,
                           mla=True, nvidia_or_xpu=False, gpu_pool_tokens=1)
    assert (amd.copies, amd.chunk_bytes, amd.num_chunks) == (8, 8 * 4_497_408, 200 * GiB // (8 * 4_497_408))


def test_a_chunk_is_rounded_up_to_the_host_page():
    """An MLA block of 16 tokens x 61 layers x 576 x 2 B = 1,124,352 B rounds up to 1,126,400 (275 pages of 4 KiB)."""
    tier = cpu_offload_tier(1.5, "native", block_bytes_per_rank=1_124_352, block_size=16, groups=1,
                            tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
                            mla=True, nvidia_or_xpu=True, gpu_pool_tokens=1)
    assert tier.chunk_bytes == 275 * 4096 == 1_126_400
    assert tier.num_chunks == int(1.5 * GiB) // 1_126_400 == 1429


def test_several_groups_each_take_whole_chunks():
    """gpt-oss: a sliding and a full group; each group's block takes its own chunk row (vllm#56871)."""
    tier = size("openai/gpt-oss-20b", "--gpu", "H100", "--ctx", "32k", "--kv-offloading-size", "64")["offload"]
    assert tier["groups"] == 2
    assert tier["tokens"] == tier["num_chunks"] * tier["tokens_per_chunk"] // 2
    assert any("vllm#56871" in n for n in tier["notes"])


def test_refusals_and_lmcache():
    with pytest.raises(KvplanError, match="pipeline parallelism"):
        cpu_offload_tier(10, "native", block_bytes_per_rank=4096, block_size=16, groups=1, tensor_parallel_size=1,
                         pipeline_parallel_size=2, decode_context_parallel_size=1, mla=False, nvidia_or_xpu=True,
                         gpu_pool_tokens=1)
    for bad in ("0", "-1", "nan", "inf", "1e9"):
        result = CliRunner().invoke(app, ["size", "meta-llama/Llama-3.1-8B", "--gpu", "H100",
                                          "--kv-offloading-size", bad], env=ENV)
        assert result.exit_code == 2 and "--kv-offloading-size" in result.output, bad
    # A hybrid whose Mamba state is not in "align" mode: vLLM's build_offloading_config asserts, so kvplan refuses.
    result = CliRunner().invoke(app, ["size", "Qwen/Qwen3.5-9B", "--gpu", "H100", "--no-prefix-caching",
                                      "--kv-offloading-size", "10"], env=ENV)
    assert result.exit_code == 2 and "refuses the CPU offload tier" in result.output
    lm = size("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--kv-offloading-size", "10", "--kv-offloading-backend",
              "lmcache")
    assert lm["offload"] is None and any("LMCache server" in n for n in lm["notes"])
    assert "--kv-offloading-backend lmcache" in lm["vllm_serve_command"]


def test_before_0_27_each_rank_pins_tensors_that_pytorch_rounds_to_a_power_of_two():
    """vLLM 0.19.1-0.26 mirror each rank's KV tensors in pinned torch tensors, which PyTorch's host allocator
    rounds up to a power of two (vllm#53042); 0.27+ (NVIDIA) map one exact shared region. Llama-3.1-8B, 200 GiB:
    one cross-layer tensor of 102,400 x 2 MiB = 200 GiB, pinned as 256 GiB (0.32: 200 GiB).
    DeepSeek-V3 on 8 x H200, 100 GiB: no shared MLA copy before 0.27, so a chunk holds 8 x 4,497,408 B =
    35,979,264 B: 2,984 chunks of 64 tokens = 190,976 tokens. 0.23 pins one tensor per layer (MLA's layered
    layout): 61 x pow2(2,984 x 73,728 B = 209.8 MiB) = 61 x 256 MiB a rank, 8 ranks: 122 GiB. 0.26 pins one
    tensor a rank: pow2(2,984 x 4,497,408 B = 12.5 GiB) = 16 GiB, 8 ranks: 128 GiB."""
    llama = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-offloading-size", "200")
    assert size(*llama, "--vllm-version", "0.26.0")["offload"]["host_bytes"] == 256 * GiB
    assert size(*llama, "--vllm-version", "0.27.0")["offload"]["host_bytes"] == 200 * GiB
    ds = ("deepseek-ai/DeepSeek-V3", "--gpu", "8xH200", "--ctx", "32k", "--kv-offloading-size", "100")
    old, new = (size(*ds, "--vllm-version", v)["offload"] for v in ("0.23.0", "0.26.0"))
    for tier in (old, new):
        assert (tier["chunk_bytes"], tier["num_chunks"], tier["tokens"]) == (35_979_264, 2_984, 190_976)
    assert old["host_bytes"] == 122 * GiB and new["host_bytes"] == 128 * GiB


def test_the_native_tier_before_0_19_1_is_refused():
    result = CliRunner().invoke(app, ["size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--kv-offloading-size", "8",
                                      "--vllm-version", "0.11.1"], env=ENV)
    assert result.exit_code == 2 and "never builds" in result.output


@pytest.mark.parametrize("size_gib, per_rank_measured_gib, node_measured_gib", [(200, 96.2, 385.0), (400, 192.2, 769.0)])
def test_vllm_53042_the_pinned_tier_of_a_hybrid_at_tp_4(size_gib, per_rank_measured_gib, node_measured_gib):
    """vllm#53042 (vLLM 0.26.0, a hybrid GDN + GQA model with 4 KV groups at TP 4, fp8 KV, block 16): each rank
    pins 24 tensors of torch.zeros((2053, 1089536), pin_memory=True) for 200 GiB, each rounded up to 4 GiB, so
    96.2 GiB a rank and 385.0 GiB of node Shmem (769.0 for 400 GiB). From the report's allocation shape alone:
    a block of 24 layer slots of 1,089,536 B = 26,148,864 B a rank; a chunk holds every rank's block,
    104,595,456 B; 200 GiB / that = 2,053 chunks; a tensor is 2,053 x 1,089,536 B = 2.0832 GiB -> 4 GiB pinned;
    4 ranks x 24 x 4 GiB = 384 GiB (400 GiB: 4,106 chunks, 4.17 GiB -> 8 GiB, 768 GiB)."""
    tier = cpu_offload_tier(size_gib, "native", block_bytes_per_rank=24 * 1_089_536, block_size=16, groups=4,
                            tensor_parallel_size=4, pipeline_parallel_size=1, decode_context_parallel_size=1,
                            mla=False, nvidia_or_xpu=True, gpu_pool_tokens=0, memory="pinned",
                            tensor_pages=(1_089_536,) * 24)
    assert tier.num_chunks == {200: 2053, 400: 4106}[size_gib]
    assert tier.host_bytes == {200: 384, 400: 768}[size_gib] * GiB
    assert abs(tier.host_bytes / GiB - node_measured_gib) / node_measured_gib < 0.005  # 0.26% and 0.13% under
    assert abs(tier.host_bytes / 4 / GiB - per_rank_measured_gib) / per_rank_measured_gib < 0.005
