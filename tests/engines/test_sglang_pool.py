"""SGLang's pool (kvplan/sglang): its default mem_fraction_static per release, the per-token cell, the lines it
prints and its caps, worked by hand from its source (docs/engines-sglang-rules.md quotes the lines) and from the
one public report that names its model (vllm#21348)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvplan.deploy import load_model, select_gpus
from kvplan.engines import EngineOptions, engine_named
from kvplan.errors import KvplanError
from kvplan.plan.schema import Settings
from kvplan.sglang.pool import default_fraction, max_running_requests, prefill_graph_sizes, size_pool
from kvplan.sglang.rules import parse_version, rules_for
from kvplan.units import GiB

H100_SMI_MIB = 81_559  # nvidia-smi memory.total of an H100 SXM 80GB (the catalog's)
REPORTS = Path(__file__).resolve().parents[2] / "profiles" / "reports" / "sglang-startup-reports.jsonl"


@pytest.mark.parametrize("version, gpu_mem, tp, mla, expected", [
    # 0.4.6: the table by TP x PP (server_args.py@0.4.6.post5): <= 81,920 MiB at TP 4 -> 0.85
    ("0.4.6", H100_SMI_MIB, 4, False, 0.85),
    # ... above 96 GiB (an H200's 143,771 MiB), TP 1: min(0.88 + 49,152 x 0.12 / 143,771, (143,771 - 18,432) / 143,771)
    ("0.4.6", 143_771, 1, False, (143_771 - 18_432) / 143_771),
    # 0.4.7-0.5.2: (9.5 + 4 / 2) GiB = 11,776 MiB reserved on a 35-90 GiB card: (81,559 - 11,776) / 81,559 = 0.85561
    ("0.4.9", H100_SMI_MIB, 4, False, 0.856),
    # 0.5.3-0.5.9: 512 + 8,192 x 1.5 + 256 x 2 + 1 / 8 x 1,024 = 13,440 MiB: (81,559 - 13,440) / 81,559 = 0.83521
    ("0.5.3", H100_SMI_MIB, 1, False, 0.835),
    # 0.5.10+: and the prefill graphs, 58 sizes up to 8,192 x 8 MiB = 464: 13,904 MiB -> 0.82952
    ("0.5.23", H100_SMI_MIB, 1, False, 0.830),
    # ... MLA: 1.5 GiB for them instead: 13,440 + 1,536 = 14,976 MiB -> 0.81638
    ("0.5.23", H100_SMI_MIB, 1, True, 0.816),
    # an RTX 4090 (24,564 MiB) at 0.5.3: 512 + 2,048 x 1.5 + 16 x 2 + 128 = 3,744 MiB, no 10 GiB floor below 60 GiB
    ("0.5.3", 24_564, 1, False, 0.848),
])
def test_default_mem_fraction_static_by_release(version, gpu_mem, tp, mla, expected):
    rules = rules_for(version)
    fraction, how = default_fraction(rules, gpu_mem, tp, mla, rules.prefill_graph_reserve)
    assert fraction == pytest.approx(expected, abs=1e-9)
    assert how


def test_prefill_graph_sizes_up_to_a_chunk_of_8192():
    sizes = prefill_graph_sizes(8192)
    # 4..32 by 4 (8), 48..256 by 16 (14), 288..512 by 32 (8), 576..1024 by 64 (8), 1280..4096 by 256 (12),
    # 4608..8192 by 512 (8)
    assert len(sizes) == 58 and sizes[:3] == [4, 8, 12] and sizes[-1] == 8192


def test_versions():
    assert parse_version("0.5.3.post3") == (0, 5, 3) and parse_version("v0.4.9") == (0, 4, 9)
    assert rules_for(None).version == "0.5.23"
    for bad in ("0.3.0", "0.6.0", "five", ""):
        with pytest.raises(KvplanError):
            rules_for(bad)


def test_nsa_pool_line_counts_the_indexer_from_0_5_3_post1():
    """memory_pool.py@0.5.3 logs before the indexer buffers exist; @0.5.3.post1 logs after them (read in the wheels)."""
    assert rules_for("0.5.2").nsa_indexer_in_pool is None  # no NSA pool yet
    assert rules_for("0.5.3").nsa_indexer_in_pool is False
    assert rules_for("0.5.3.post1").nsa_indexer_in_pool is True and rules_for("0.5.3.post1").version == "0.5.3"
    assert rules_for("0.5.4").nsa_indexer_in_pool is True


def test_running_requests_cap():
    rules = rules_for("0.5.23")
    # int(399,087 / 40,960 x 512) = 4,988, clamped to 4,096; tokens // 2 = 199,543
    assert max_running_requests(399_087, 40_960, rules) == 4096
    # int(100,000 / 131,072 x 512) = 390 -> 2,048
    assert max_running_requests(100_000, 131_072, rules) == 2048
    assert max_running_requests(3_000, 131_072, rules) == 1_500  # tokens // 2
    assert max_running_requests(100_000, 131_072, rules_for("0.4.6")) == 2049  # ReqToTokenPool(max_num_reqs + 1)


def _qwen235b_pool(version: str, **kw):
    model = load_model("Qwen/Qwen3-235B-A22B-FP8", source="bundled")
    settings = Settings(tensor_parallel_size=4)
    return size_pool(model.arch, select_gpus("H100").device, settings, rules_for(version), 55 * GiB, **kw)


def test_vllm_21348_the_printed_pool_line():
    """SGLang printed "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB" for
    Qwen3-235B-A22B-FP8 at TP 4 (vllm#21348). By hand from its config: 94 layers x 4 KV heads / TP 4 = 1 head of
    128, bf16 (the FP8 checkpoint declares no KV scheme): a cell of 1 x 128 x 2 x 94 x 2 B = 48,128 B, K half
    24,064 B; the buffers hold one padding page more: 367,405 x 24,064 B = 8.234 GiB."""
    pool = _qwen235b_pool("0.4.9", mem_fraction_static=0.93)
    assert (pool.cell_bytes, pool.k_bytes_per_token, pool.kv_dtype.name) == (48_128, 24_064, "bfloat16")
    printed = dataclasses.replace(pool, tokens=367_404).startup_lines()[0]
    assert printed == "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"
    # 0.5.13+ name the dtype in the line
    assert dataclasses.replace(_qwen235b_pool("0.5.23"), tokens=367_404).startup_lines()[0].startswith(
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 367404,")


def test_the_pool_is_the_budget_over_the_cell():
    """tokens = int(rest x 2^30) // cell (model_runner.py `profile_max_num_token`), rest = P x fraction - weights:
    with 55 GiB of weights, P = the H100's CUDA total less 0.75 GiB, and 0.93."""
    pool = _qwen235b_pool("0.5.23", mem_fraction_static=0.93)
    p = select_gpus("H100").device.cuda_total_bytes - 0.75 * GiB
    assert pool.free_before_load[1] == pytest.approx(p)
    assert pool.tokens == int(p * 0.93 - 55 * GiB) // 48_128
    low, high = pool.tokens_range
    assert low < pool.tokens < high
    paged = _qwen235b_pool("0.5.23", mem_fraction_static=0.93, page_size=64)
    assert paged.tokens == pool.tokens // 64 * 64


def test_the_sizes_in_sglang_s_reports_are_its_cell():
    """Every report with its tokens and K size: K size / (tokens + 1 page) is a whole number of bytes a token
    (heads x head size x layers x dtype), as the K buffer holds them."""
    rows = [json.loads(line) for line in REPORTS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 13 and all(r["source"].startswith("https://") and r["quote"] for r in rows)
    for r in rows:
        tokens, k = r["reported_max_total_num_tokens"], r["reported_k_size_gb"]
        assert str(tokens) in r["quote"].replace(",", ""), r["case_id"]
        if tokens and k:
            per_token = k * GiB / (tokens + (r["page_size"] or 1))
            assert per_token > 0, r["case_id"]
    sg001 = next(r for r in rows if r["case_id"] == "sg001")
    assert (sg001["reported_max_total_num_tokens"] + 1) * 24_064 / GiB == pytest.approx(8.23, abs=0.005)


def _sglang(model: str, gpu: str, version: str | None = None, **settings):
    return engine_named("sglang").size(load_model(model, source="bundled"), select_gpus(gpu), Settings(**settings),
                                       version, EngineOptions())


def test_what_is_not_modelled_is_refused():
    # gpt-oss's hybrid sliding-window pool takes page 1 only before 0.5.8... and 0.5.6 gives gpt-oss none at all
    # (server_args.py@0.5.6.post2 sets --disable-hybrid-swa-memory for it): every one of its 24 layers a full page,
    # 8 KV heads x 64 x 2 (K, V) x 24 x 2 B = 49,152 B a token
    assert _sglang("openai/gpt-oss-20b", "H100", "0.5.6").kv_bytes_per_token_per_gpu == 49_152
    with pytest.raises(KvplanError, match="--block-size"):
        _sglang("meta-llama/Llama-3.1-8B", "H100", block_size=32)
    with pytest.raises(KvplanError, match="pipeline"):
        _sglang("meta-llama/Llama-3.1-70B", "2xH100", pipeline_parallel_size=2)
    with pytest.raises(KvplanError, match="mem-fraction-static"):
        engine_named("sglang").size(load_model("meta-llama/Llama-3.1-8B", source="bundled"), select_gpus("H100"),
                                    Settings(), None, EngineOptions(mem_fraction_static=1.5))
    with pytest.raises(KvplanError, match="not a vLLM flag"):
        engine_named("vllm").size(load_model("meta-llama/Llama-3.1-8B", source="bundled"), select_gpus("H100"),
                                  Settings(), None, EngineOptions(page_size=16))


def test_mla_is_one_latent_a_token():
    """DeepSeek-V3: (512 + 64) x 61 layers x 2 B = 70,272 B a token on every GPU, whatever the TP."""
    pool = _sglang("deepseek-ai/DeepSeek-V3", "8xH200", tensor_parallel_size=8, max_model_len=32768)
    assert pool.kv_bytes_per_token_per_gpu == 70_272 and pool.page_tokens == 1
    assert pool.startup_lines[0].startswith("KV Cache is allocated. dtype: torch.bfloat16, #tokens: ")
    assert ", KV size: " in pool.startup_lines[0]


def test_size_engine_all_on_the_command_line():
    from helpers.harness import invoke

    both = invoke("size", "Qwen/Qwen3-32B", "--gpu", "2xH100", "--ctx", "32k", "--engine", "all", "--json")
    assert both.code == 0
    pools = {p["engine"]: p for p in json.loads(both.stdout)["engines"]}
    vllm = json.loads(invoke("size", "Qwen/Qwen3-32B", "--gpu", "2xH100", "--ctx", "32k", "--json").stdout)
    assert pools["vllm"]["pool_tokens"] == vllm["kv_cache_tokens"]  # the vLLM column is kvplan size's plan
    # 64 layers x 2 x (8 KV heads / TP 2) x 128 x 2 B = 131,072 B a token on each GPU, in both engines
    assert pools["sglang"]["kv_bytes_per_token_per_gpu"] == pools["vllm"]["kv_bytes_per_token_per_gpu"] == 131_072
    assert pools["sglang"]["launch_command"] == ("python -m sglang.launch_server --model-path Qwen/Qwen3-32B "
                                                 "--tp-size 2 --context-length 32768")
    table = invoke("size", "Qwen/Qwen3-32B", "--gpu", "2xH100", "--ctx", "32k", "--engine", "all",
                   env={"COLUMNS": "80"})
    assert "page (tokens) *" in table.stdout and "KV bytes / token / GPU  " in table.stdout
    for argv, what in ((("--engine", "tgi"), "--engine"), (("--engine", "sglang", "--engine-version", "0.3.0"), "0.3.0"),
                       (("--mem-fraction-static", "0.9"), "not a vLLM flag"),
                       (("--engine", "sglang", "--kv-offloading-size", "8"), "--kv-offloading-size is for vLLM"),
                       (("--engine", "all", "--engine-version", "0.5.3"), "--engine-version")):
        r = invoke("size", "Qwen/Qwen3-32B", "--gpu", "H100", *argv)
        assert r.code == 2 and what in r.one_line_error(), argv


def test_gemma_3_window_layers_take_full_pages_in_sglang():
    """Gemma 3 is in neither of SGLang's hybrid sliding-window lists (`is_hybrid_model`, Llama 4 only,
    configs/model_config.py@0.4.9.post6; `is_hybrid_swa_model` @0.5.8.post1 .. @0.5.23): one pool, every one of
    gemma-3-27b's 62 layers a full page, 62 x 16 KV heads x 128 x 2 (K, V) x 2 B = 507,904 B a token."""
    pool = _sglang("google/gemma-3-27b-it", "H100", language_model_only=True)
    assert pool.kv_bytes_per_token_per_gpu == 507_904 and pool.page_tokens == 1
    assert any("window layers take full pages" in n for n in pool.notes)
    # Gemma 4 is on SGLang's hybrid list (is_hybrid_swa_model@0.5.23), whose split kvplan has not read: refused
    with pytest.raises(KvplanError, match="hybrid sliding-window pool for Gemma4ForConditionalGeneration"):
        _sglang("google/gemma-4-31B-it", "H100", language_model_only=True)
    from helpers.harness import invoke

    # side by side: TensorRT-LLM, without max_attention_window, pools its sliding-window layers for the whole sequence
    doc = json.loads(invoke("size", "google/gemma-3-27b-it", "--gpu", "H100", "--ctx", "8k", "--engine", "all",
                            "--language-model-only", "--json").stdout)
    engines = {p["engine"]: p for p in doc["engines"]}
    assert engines["sglang"]["kv_bytes_per_token_per_gpu"] == 507_904
    assert any("pools sliding-window layers for the whole sequence" in n for n in engines["trtllm"]["notes"])


def test_engine_all_shows_the_others_when_one_does_not_size_the_model():
    from helpers.harness import invoke

    # Jamba: Mamba layers beside attention, whose state pool kvplan sizes for SGLang 0.5.3.post3-0.5.15 only (Qwen3-Next,
    # Nemotron-H; Qwen3.5 from 0.5.9) and for TensorRT-LLM not at all
    r = invoke("size", "ai21labs/Jamba-v0.1", "--gpu", "2xH100", "--ctx", "8k", "--engine", "all", "--json")
    assert r.code == 0
    doc = json.loads(r.stdout)
    assert [p["engine"] for p in doc["engines"]] == ["vllm"]
    assert "state pool" in doc["refused"]["sglang"] and "mamba" in doc["refused"]["trtllm"]
    alone = invoke("size", "ai21labs/Jamba-v0.1", "--gpu", "H100", "--ctx", "8k", "--engine", "sglang")
    assert alone.code == 2 and "state pool" in alone.one_line_error()
