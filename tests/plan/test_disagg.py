"""Bytes a P/D disaggregated deployment moves per request over vLLM 0.32's NixlConnector (kvplan.plan.disagg), by
hand from the bundled config files: every decode rank reads its own page of every block of the prompt (the last
partial block whole) that its own prefix cache lacks, from ``d x P // D`` (or, prefill TP above decode TP, the
``P // D`` ranks from ``d x P // D``)."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import find_device
from kvplan.model.arch import parse_architecture
from kvplan.model.source import load_bundled
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.disagg import pd_transfer
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.units import GiB, MiB
from kvplan.vllm.rules import rules_for

OVERHEAD = load_overhead()


def capacity(name: str, device: str = "H100", **settings):
    arch = parse_architecture(load_bundled(name).config, None)
    return compute_capacity(arch, find_device(device), Settings(kv_cache_memory_bytes=16 * GiB,
                                                                max_model_len=8192, **settings),
                            rules_for("0.33.0"), OVERHEAD)


LLAMA_8B = "meta-llama/Llama-3.1-8B"  # 32 layers, 8 KV heads x 128, bf16: 32 x 2 x 8 x 128 x 2 B = 131,072 B a token


def test_llama_8b_prefill_tp1_to_decode_tp2_splits_the_heads():
    """A 16-token block is 16 x 131,072 B = 2 MiB; a 1,000-token prompt takes cdiv(1000, 16) = 63 blocks. Each
    decode rank holds 4 of the 8 heads: 1 MiB a block, 63 MiB read from prefill rank 0, which sends 126 MiB
    (= 1,008 tokens x 131,072 B). At 50 GB/s (400 Gb/s NDR) the prefill NIC takes 132,120,576 / 5e10 s."""
    t = pd_transfer(capacity(LLAMA_8B), decode_tp=2, prompt_tokens=1000)
    assert (t.block_size, t.blocks, t.decode_block_bytes) == (16, 63, 1 * MiB)
    assert [(r.decode_rank, r.sources, r.bytes) for r in t.reads] == [(0, (0,), 63 * MiB), (1, (0,), 63 * MiB)]
    assert t.total_bytes == 126 * MiB == 1008 * 131_072 and t.transfers == 2 and not t.replicated
    assert t.sent_per_prefill_rank == (126 * MiB,)
    assert t.transfer_s(50) == pytest.approx(132_120_576 / 50e9)


def test_llama_8b_prefill_tp2_to_decode_tp1_reads_both_halves():
    """Prefill TP 2 holds 4 heads a rank (1 MiB a block); the decode rank holds all 8 (2 MiB) and reads half of
    each block from each of ranks 0 and 1: a 1,024-token prompt is 64 blocks, 128 MiB in 2 READs; each prefill
    NIC sends 64 MiB, the decode NIC receives 128 MiB: at 25 GB/s (200 Gb/s HDR) 134,217,728 / 2.5e10 s."""
    t = pd_transfer(capacity(LLAMA_8B, tensor_parallel_size=2), decode_tp=1, prompt_tokens=1024)
    assert (t.blocks, t.decode_block_bytes) == (64, 2 * MiB)
    assert [(r.sources, r.bytes) for r in t.reads] == [((0, 1), 128 * MiB)]
    assert t.transfers == 2 and t.sent_per_prefill_rank == (64 * MiB, 64 * MiB)
    assert t.transfer_s(25) == pytest.approx(134_217_728 / 25e9)


def test_llama_8b_decode_tp_above_the_kv_heads_reads_copies():
    """Decode TP 16 over 8 KV heads: each rank holds max(1, 8 // 16) = 1 head, 2 MiB / 8 = 256 KiB a block, and
    two ranks hold each head: 16 x 256 KiB = 4 MiB a block cross the links, twice the KV."""
    t = pd_transfer(capacity(LLAMA_8B), decode_tp=16, prompt_tokens=1024)
    assert t.replicated and t.decode_block_bytes == 256 * 1024
    assert t.total_bytes == 64 * 4 * MiB and t.sent_per_prefill_rank == (64 * 4 * MiB,)


def test_block_size_only_rounds_the_last_block():
    """Block 32: cdiv(1000, 32) = 32 blocks = 1,024 tokens x 131,072 B, against 1,008 tokens at block 16."""
    t = pd_transfer(capacity(LLAMA_8B, block_size=32), decode_tp=1, prompt_tokens=1000)
    assert (t.blocks, t.total_bytes) == (32, 1024 * 131_072)


def test_a_decode_prefix_hit_is_not_moved():
    """A 500-token hit is 31 full blocks (496 tokens): 63 - 31 = 32 blocks move. A hit of the whole 1,024-token
    prompt counts at most 1,023 tokens (vLLM computes the last token): 63 blocks hit, 1 moves."""
    cap = capacity(LLAMA_8B)
    half = pd_transfer(cap, decode_tp=1, prompt_tokens=1000, decode_hit_tokens=500)
    assert (half.decode_hit_tokens, half.blocks, half.total_bytes) == (496, 32, 32 * 2 * MiB)
    whole = pd_transfer(cap, decode_tp=1, prompt_tokens=1024, decode_hit_tokens=1024)
    assert (whole.decode_hit_tokens, whole.blocks) == (1008, 1)


def test_deepseek_v3_mla_every_decode_rank_reads_one_whole_copy():
    """DeepSeek-V3: 61 layers x (512 + 64) latent x 2 B = 70,272 B a token, the same on every rank; FlashMLA's
    block of 64 is 4,497,408 B. A 4,096-token prompt is 64 blocks = 287,834,112 B a decode rank. Decode TP 16 from
    prefill TP 8: rank d reads rank d // 2, each prefill rank sends 2 copies, 16 copies in all. Decode TP 4: rank d
    reads rank 2d; odd prefill ranks send nothing."""
    cap = capacity("deepseek-ai/DeepSeek-V3", "H200", tensor_parallel_size=8)
    wide = pd_transfer(cap, decode_tp=16, prompt_tokens=4096)
    assert wide.replicated and (wide.block_size, wide.decode_block_bytes) == (64, 4_497_408)
    assert [r.sources for r in wide.reads] == [(d // 2,) for d in range(16)]
    assert wide.total_bytes == 16 * 64 * 4_497_408 and wide.sent_per_prefill_rank == (2 * 287_834_112,) * 8
    narrow = pd_transfer(cap, decode_tp=4, prompt_tokens=4096)
    assert [r.sources for r in narrow.reads] == [(0,), (2,), (4,), (6,)]
    assert narrow.sent_per_prefill_rank == (287_834_112, 0) * 4 and narrow.transfers == 4


@pytest.mark.parametrize("name, device, settings, decode_tp, words", [
    ("google/gemma-3-12b-it", "H100", {}, 1, "one group of full attention or MLA"),  # sliding-window groups
    (LLAMA_8B, "H100", {"pipeline_parallel_size": 2}, 1, "pipeline parallelism"),
    (LLAMA_8B, "H100", {"tensor_parallel_size": 2}, 3, "one TP size to divide the other"),
    # Llama-3.1-70B: 8 KV heads; prefill TP 16 > decode TP 8 replicates heads (base_worker.py:2449 asserts)
    ("meta-llama/Llama-3.1-70B", "H100", {"tensor_parallel_size": 16}, 8, "refuses a prefill TP"),
])
def test_refusals(name, device, settings, decode_tp, words):
    with pytest.raises(KvplanError, match=words):
        pd_transfer(capacity(name, device, **settings), decode_tp=decode_tp, prompt_tokens=1024)


def test_refuses_a_link_rate_of_zero():
    with pytest.raises(KvplanError, match="link rate"):
        pd_transfer(capacity(LLAMA_8B), decode_tp=1, prompt_tokens=16).transfer_s(0)
