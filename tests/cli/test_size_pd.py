"""`kvplan size --pd-decode-tp N`: one request's KV moved from the planned (prefill) deployment to a decode
instance over vLLM's NixlConnector (kvplan.plan.disagg). Expected bytes by hand from the bundled configs."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvplan.cli.app import app


def _size(*args: str):
    pinned = () if "--vllm-version" in args else ("--vllm-version", "0.33.0")  # figures worked for 0.33
    return CliRunner().invoke(app, ["size", *args, *pinned], env={"HF_HUB_OFFLINE": "1", "COLUMNS": "200"})


def test_gqa_prefill_tp_above_decode_tp_reads_every_head_slice():
    """Llama-3.1-70B: 80 layers, 8 KV heads of 128, bf16. Decode TP 4 holds 2 heads a rank: 80 x 2 (K, V) x 2 x 128
    x 2 B = 81,920 B a token. A prompt of 8,192 tokens with 1,000 in the decode's cache: 62 full blocks (992
    tokens) are not moved, 512 - 62 = 450 blocks of 16 are: 7,200 tokens x 81,920 B = 589,824,000 B a decode
    rank, read from prefill ranks 2d and 2d + 1 (TP 8 -> 4), half each."""
    result = _size("meta-llama/Llama-3.1-70B", "--gpu", "8xH100", "--ctx", "32k", "--pd-decode-tp", "4",
                   "--pd-prompt", "8k", "--pd-decode-hit", "1000", "--pd-link-gbs", "12.5", "--json")
    assert result.exit_code == 0, result.output
    t = json.loads(result.stdout)["pd_transfer"]
    assert (t["prefill_tp"], t["decode_tp"], t["blocks"], t["decode_hit_tokens"]) == (8, 4, 450, 992)
    assert t["decode_block_bytes"] == 16 * 81_920 and t["bytes_per_decode_rank"] == 589_824_000
    assert t["sources_per_decode_rank"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and t["transfers"] == 8
    assert t["sent_per_prefill_rank"] == [294_912_000] * 8 and t["total_bytes"] == 4 * 589_824_000
    assert t["replicated"] is False
    # The busiest NIC receives 589,824,000 B: 23.59 ms at 25 GB/s, 47.19 ms at the given 12.5 GB/s.
    assert t["transfer_s"] == {"200 Gb/s NIC": 0.023593, "400 Gb/s NIC": 0.011796, "800 Gb/s NIC": 0.005898,
                               "12.5 GB/s (given)": 0.047186}
    text = _size("meta-llama/Llama-3.1-70B", "--gpu", "8xH100", "--ctx", "32k", "--pd-decode-tp", "4",
                 "--pd-prompt", "8k", "--pd-decode-hit", "1000", "--pd-link-gbs", "12.5").stdout
    assert "a prompt of 8,192 tokens, 992 already in the decode's prefix cache moves 450 blocks of 16 tokens" in text
    assert "from prefill rank(s) 0+1, 2+3, 4+5, 6+7" in text and "12.5 GB/s (given) 47.2 ms" in text


def test_mla_latent_is_read_whole_by_every_decode_rank():
    """DeepSeek-V3: 61 layers, one latent of 512 + 64 a token, bf16: 70,272 B a token on every rank. The whole
    context (32,768 tokens, 512 blocks of 64) to decode TP 8: each rank reads 2,302,672,896 B from its own
    prefill rank; eight copies cross the network."""
    t = json.loads(_size("deepseek-ai/DeepSeek-V3", "--gpu", "8xH200", "--ctx", "32k", "--pd-decode-tp", "8",
                         "--json").stdout)["pd_transfer"]
    assert (t["prompt_tokens"], t["blocks"], t["block_size"]) == (32_768, 512, 64)
    assert t["bytes_per_decode_rank"] == 32_768 * 70_272 == 2_302_672_896
    assert t["sources_per_decode_rank"] == [[d] for d in range(8)] and t["replicated"] is True
    assert t["total_bytes"] == 8 * 2_302_672_896


def test_refusals_are_one_line_and_exit_2():
    for args, words in (
        (("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--pd-prompt", "1k"), "are for --pd-decode-tp"),
        (("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "8k", "--pd-decode-tp", "1", "--pd-prompt", "16k"),
         "longer than the context length"),
        (("meta-llama/Llama-3.1-8B", "--gpu", "4xH100", "--tp", "4", "--pd-decode-tp", "3"), "divide the other"),
        (("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--pd-decode-tp", "1", "--pd-link-gbs", "-5"), "invalid P/D link"),
        (("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--pd-decode-tp", "0"), "pd_decode_tp"),
        (("google/gemma-2-9b", "--gpu", "H100", "--ctx", "8k", "--pd-decode-tp", "1"), "sliding-window"),
    ):
        result = _size(*args)
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output and "Traceback" not in result.output
