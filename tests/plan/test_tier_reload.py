"""Reload vs recompute of a CPU tier hit (kvplan.plan.offload.tier_reload), by hand on a step-time model whose
terms are round numbers: a step takes 4 ms overhead + 1 GB of weights at 1 TB/s (1 ms) + 20 us a prompt token
(2e10 FLOP at 1e15 FLOP/s, efficiencies 1, no KV read or attention term). Pages: 16 tokens, 2 MiB a block
(131,072 B a token, Llama-3.1-8B's bf16 KV on one GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.offload import HOST_COPY_EFFICIENCY, tier_reload
from kvplan.plan.steptime import StepTimeModel

MODEL = StepTimeModel(weight_bytes=1e9, kv_bytes_per_token=0, linear_flops_per_token=2e10, attn_flops_per_pair=0,
                      bandwidth_bytes_s=1e12, peak_flops=1e15, mem_efficiency=1.0, compute_efficiency=1.0,
                      overhead_s=0.004)
LAYOUT = SimpleNamespace(min_block_size=16, block_bytes=2 * 1024**2)


def _link_gbps(transfer_s_per_token: float) -> float:
    """The link rate that moves a token's 131,072 B in ``transfer_s_per_token`` at the copy efficiency."""
    return 131_072 / transfer_s_per_token / HOST_COPY_EFFICIENCY / 1e9


def test_a_link_faster_than_compute():
    """6.5536 us a token over the link (25 GB/s at 0.8), 20 us to compute it; chunks of 2,048.
    A prompt of 16k + 1 tokens (k <= 127: one chunk) reloads 16k of them:
      recompute = 5 ms + 20 us (16k + 1)
      reload    = 4 ms + 16k x 6.5536 us + (5 ms + 20 us)       (the load's step, the transfer, the last token)
      recompute - reload = 16k x 13.4464 us - 4 ms > 0  <=>  k > 18.59: the crossover is 19 blocks + 1 = 305.
    Rows: 1,024 tokens reload 1,008 and compute 16 in the last step: 4 + 6.6060288 + 5 + 0.32 = 15.9260288 ms,
    against 5 + 20.48 = 25.48 ms; 4,096 tokens (two chunks to recompute): 4 + 26.738688 + 5.32 = 36.058688 ms,
    against 10 + 81.92 = 91.92 ms."""
    r = tier_reload(LAYOUT, "PCIe 4.0 x16", 25.0, MODEL, 2048, 4096)
    assert r.bytes_per_token == 131_072 and r.transfer_s_per_token == pytest.approx(6.5536e-6)
    assert r.crossover_tokens == 305
    assert [(x.prompt_tokens, x.reloaded_tokens) for x in r.rows] == [(1024, 1008), (4096, 4080)]
    assert r.rows[0].reload_ttft_s == pytest.approx(0.0159260288)
    assert r.rows[0].recompute_ttft_s == pytest.approx(0.02548)
    assert r.rows[1].reload_ttft_s == pytest.approx(0.036058688)
    assert r.rows[1].recompute_ttft_s == pytest.approx(0.09192)
    assert r.step_model == "prior"


def test_the_crossover_is_the_first_length_though_the_difference_is_not_monotone():
    """30 us a token over the link, 20 us to compute it, chunks of 256 tokens (16 blocks). With P = 16k + 1
    tokens, recompute = 5 ms x ceil(P / 256) + 20 us P, reload = 9 ms + 30 us x 16k + 20 us, so
    recompute - reload = 5 ms x ceil(P / 256) - 9 ms - 160 us k:
      k = 31 (P 497, 2 chunks): 10 - 9 - 4.96 < 0;  k = 32 (P 513, 3 chunks): 15 - 9 - 5.12 = 0.88 ms > 0;
      k = 47 (P 753, 3 chunks): 15 - 9 - 7.52 < 0 again (a bisection over [1, 255] would answer 769)."""
    r = tier_reload(LAYOUT, "link", _link_gbps(30e-6), MODEL, 256, 4096)
    assert r.crossover_tokens == 513


def test_a_link_that_never_pays():
    """164 us a token over the link: more than computing a token plus its share of the chunk steps
    (20 us + 5 ms / 256 = 39.5 us): reload is never sooner."""
    r = tier_reload(LAYOUT, "link", _link_gbps(163.84e-6), MODEL, 256, 4096)
    assert r.crossover_tokens is None
    assert all(x.reload_ttft_s > x.recompute_ttft_s for x in r.rows)


@pytest.mark.parametrize("gbps, chunk, longest", [(0.0, 2048, 4096), (-1.0, 2048, 4096), (25.0, 0, 4096), (25.0, 2048, 1)])
def test_refusals(gbps, chunk, longest):
    with pytest.raises(KvplanError):
        tier_reload(LAYOUT, "link", gbps, MODEL, chunk, longest)


def _size(*args: str) -> dict:
    import json

    from typer.testing import CliRunner

    from kvplan.cli.app import app

    pinned = () if "--vllm-version" in args else ("--vllm-version", "0.33.0")  # figures worked for 0.33
    result = CliRunner().invoke(app, ["size", *args, *pinned, "--json"], env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_kvplan_size_gives_a_tier_hit_its_reload_over_the_gpus_host_link():
    """Llama-3.1-8B on an H100 (PCIe 5.0 x16: 63 GB/s a direction, profiles/gpus.json): a rank moves its whole
    bf16 KV, 32 layers x 2 x 8 heads x 128 x 2 B = 131,072 B a token; a prompt reloads its full blocks but the
    last token (32,768 -> 32,752)."""
    r = _size("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-offloading-size", "200")["offload"]["reload"]
    assert (r["link"], r["link_gbps"], r["bytes_per_token"]) == ("PCIe 5.0 x16", 63.0, 131_072)
    assert [(x["prompt_tokens"], x["reloaded_tokens"]) for x in r["rows"]] == [(1024, 1008), (8192, 8176),
                                                                              (32768, 32752)]
    assert r["step_model"] == "prior" and r["notes"] == []
    # 32,752 x 131,072 B at 0.8 x 63 GB/s is 85 ms of transfer; recomputing 32k tokens of an 8B model takes longer.
    assert all(x["reload_ttft_s"] < x["recompute_ttft_s"] for x in r["rows"])
    assert r["rows"][-1]["reload_ttft_s"] > 32_752 * 131_072 / (0.8 * 63e9)
    # The shortest prompt whose reload is sooner: each block more is cheaper to move than to compute, so it is
    # the first length past one step's overhead (the load's own step).
    assert 17 <= r["crossover_tokens"] < 1024 and (r["crossover_tokens"] - 1) % 16 == 0


def test_no_reload_estimate_without_a_sourced_link_or_with_several_groups():
    """The A10G's host link has no source in the catalog; Gemma-2's sliding-window layers make a second KV group
    (a reload there moves part of the window only: not modelled). Both still get their tier."""
    a10g = _size("meta-llama/Llama-3.1-8B", "--gpu", "A10G", "--ctx", "8k", "--kv-offloading-size", "20")["offload"]
    assert a10g["num_chunks"] > 0 and a10g["reload"] is None
    gemma = _size("google/gemma-2-9b", "--gpu", "H100", "--ctx", "8k", "--kv-offloading-size", "20")["offload"]
    assert gemma["groups"] == 2 and gemma["reload"] is None


def test_a_moe_prior_says_its_recompute_is_an_upper_bound():
    r = _size("deepseek-ai/DeepSeek-V3", "--gpu", "8xH200", "--ctx", "32k", "--kv-offloading-size", "200")["offload"]["reload"]
    assert r["bytes_per_token"] == 61 * 576 * 2  # one MLA latent a layer, bf16, on every rank
    assert "every routed expert" in r["notes"][0]


def test_the_terminal_prints_each_length_both_ways_and_the_crossover():
    """The same plan as text: every row's two TTFTs as --json gives them (3 decimals), and the crossover."""
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    args = ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "32k", "--kv-offloading-size", "200")
    r = _size(*args)["offload"]["reload"]
    text = CliRunner().invoke(app, ["size", *args, "--vllm-version", "0.33.0"],
                              env={"HF_HUB_OFFLINE": "1", "COLUMNS": "120"}).stdout
    assert "reloaded over PCIe 5.0 x16 (63 GB/s at 80%)" in text
    for row in r["rows"]:
        assert (f"{row['prompt_tokens']:>8,} tokens: reload {row['reload_ttft_s']:.3f} s, recompute "
                f"{row['recompute_ttft_s']:.3f} s (reload sooner)") in text
    assert f"a reload serves sooner from {r['crossover_tokens']:,} tokens" in text
