"""TensorRT-LLM's budget from the GPU and the settings (kvplan/trtllm/budget.py), priced by hand from a config and
TensorRT-LLM's own rule (`_torch/pyexecutor/_util.py@b35ac1b` `_cal_max_memory`), and judged against public reports."""

from __future__ import annotations

import json

from kvplan.trtllm.budget import dummy_request_lengths, estimation_pool_tokens

GiB = 1 << 30


def test_the_estimation_pool_is_the_dummy_requests_blocks():
    """tr001 (1.1.0rc3, disable_overlap_scheduler=True) printed its estimation pool '(8224)': one dummy request of
    max_num_tokens 8192 (max_seq_len 131072 is longer), + 1 generated token = 8193 -> ceil(8193 / 32) = 257 blocks =
    8224 tokens. With the overlap scheduler (the default) 8194 tokens, still 257 blocks."""
    assert dummy_request_lengths(8192, 131_072) == [8192]
    assert estimation_pool_tokens(8192, 131_072, 32, overlap_scheduler=False) == 8224
    assert estimation_pool_tokens(8192, 131_072, 32) == 8224
    # max_seq_len 4097: requests of min(8192, 4096) tokens -> two of 4096; each 4098 -> 129 blocks -> 258 x 32 = 8256
    assert dummy_request_lengths(8192, 4097) == [4096, 4096]
    assert estimation_pool_tokens(8192, 4097, 32) == 8256
    # max_seq_len 3001: 3000 + 3000 + 2192; (3002 -> 94) + (3002 -> 94) + (2194 -> 69) = 257 blocks = 8224 tokens
    assert dummy_request_lengths(8192, 3001) == [3000, 3000, 2192]
    assert estimation_pool_tokens(8192, 3001, 32) == 8224


def test_size_trtllm_qwen3_0_6b_on_h100_by_hand():
    """Qwen/Qwen3-0.6B (bundled config: 28 layers, hidden 1024, 16 heads / 8 KV heads of 128, intermediate 3072,
    vocab 151,936, tied embeddings, bf16) on one H100 SXM (CUDA total 79.18 GiB), trtllm-serve defaults.

    weights     = (28 x (1024 x 2048 + 2 x 1024 x 1024 + 2048 x 1024 + 3 x 1024 x 3072 + 2 x 1024)
                   + 151,936 x 1024 + 1024) params = 596,042,752 x 2 B                     = 1,192,085,504 B
                  (kvplan's weight estimate leaves out the 28 x 2 x 128 q/k-norm weights, 14,336 B)
    activation  = 8192 x (3 x 3072 + 3 x 1024) x 2 B                                     =   201,326,592 B
    context     = round(0.75 GiB)                                                         =   805,306,368 B
    CUDA graphs = int(0.6 GiB)                                                            =   644,245,094 B
    CUDA total  = int(79.18 GiB)                                                          = 85,018,877,624 B
    estimation pool: 8192 + 2 tokens -> 257 blocks -> 8224 x 114,688 B = 943,194,112 B, in the peak and added back
    budget      = (85,018,877,624 - 1,192,085,504 - 201,326,592 - 805,306,368 - 644,245,094) x 0.9
                = 82,175,914,066 x 0.9                                                    = 73,958,322,659 B
    cell        = 28 x (8 x 128) x 2 x 2 B = 114,688 B (estimator and manager alike at TP 1)
    max_tokens  = 73,958,322,659 // 114,688 = 644,865; pass 2: 0.9 x (85,018,877,624 - 1,192,085,504 - 805,306,368)
                  / 114,688 = 651,500 is larger, so 644,865 -> ceil(/ 32) = 20,153 blocks = 644,896 tokens
    pool        = 644,896 x 114,688 B = 68.88 GiB (report tr010 printed 68.69 GiB, 643,136 tokens on this deployment)
    """
    from helpers.harness import invoke

    r = invoke("size", "Qwen/Qwen3-0.6B", "--gpu", "H100", "--engine", "trtllm", "--json")
    assert r.code == 0, r.stderr
    pool = json.loads(r.stdout)["engines"][0]
    terms = {t["name"]: t for t in pool["memory_terms"]}
    assert terms["CUDA total"]["bytes"] == 85_018_877_624
    assert terms["weights"]["bytes"] == 1_192_085_504
    assert terms["dummy prefill activation"]["bytes"] == 201_326_592
    assert terms["CUDA context and communicators"]["bytes"] == 805_306_368
    assert terms["CUDA graphs"]["bytes"] == 644_245_094
    assert terms["estimation pool (in the peak, added back)"]["bytes"] == 943_194_112
    assert terms["x free_gpu_memory_fraction 0.9"]["bytes"] == 73_958_322_659
    assert (pool["kv_bytes_per_token_per_gpu"], pool["page_tokens"], pool["pool_tokens"]) == (114_688, 32, 644_896)
    assert pool["kv_memory_bytes_per_gpu"] == 644_896 * 114_688
    assert "Allocated 68.88 GiB for max tokens in paged KV cache (644896)." in pool["startup_lines"][-1]
    assert "tmp kv_mem 0.88 GiB" in pool["startup_lines"][0]
    # Half the fraction: 82,175,914,066 x 0.5 = 41,087,957,033 B
    # -> // 114,688 = 358,258 -> 11,196 blocks (11,195.56 up) = 358,272 tokens
    half = json.loads(invoke("size", "Qwen/Qwen3-0.6B", "--gpu", "H100", "--engine", "trtllm",
                             "--free-gpu-memory-fraction", "0.5", "--json").stdout)["engines"][0]
    assert half["pool_tokens"] == 358_272
    assert "--kv_cache_free_gpu_memory_fraction 0.5" in half["launch_command"]


def test_size_trtllm_refuses_what_it_does_not_price():
    """A multimodal model's dummy prefill (its encoder's input, not read) is an input; another engine's flag, a release
    before 1.0, a fraction outside (0, 1]: one line, exit 2. (An MoE model's is priced: tests/engines/test_trtllm_moe.py.)"""
    from helpers.harness import invoke

    mm = invoke("size", "moonshotai/Kimi-K2.5", "--gpu", "8xH200", "--engine", "trtllm")
    assert mm.code == 2 and "--dummy-activation-gib" in mm.one_line_error()
    for args, words in ((("--mem-fraction-static", "0.8"), "not a TensorRT-LLM flag"),
                        (("--engine-version", "0.19.0"), "no TensorRT-LLM budget rules for 0.19.0"),
                        (("--free-gpu-memory-fraction", "1.5"), "invalid free_gpu_memory_fraction"),
                        (("--max-num-tokens", "0"), "invalid max_num_tokens 0"),
                        (("--max-num-tokens", "999999999999"), "invalid max_num_tokens"),
                        (("--tokens-per-block", "0"), "invalid --tokens-per-block 0")):
        r = invoke("size", "Qwen/Qwen3-0.6B", "--gpu", "H100", "--engine", "trtllm", *args)
        assert r.code == 2 and words in r.one_line_error(), (args, r.stderr)
    sg = invoke("size", "Qwen/Qwen3-0.6B", "--gpu", "H100", "--engine", "sglang", "--max-num-tokens", "4096")
    assert sg.code == 2 and "not an SGLang flag" in sg.one_line_error()
    # --engine all hands each engine its own flags
    both = json.loads(invoke("size", "Qwen/Qwen3-0.6B", "--gpu", "H100", "--engine", "all",
                             "--free-gpu-memory-fraction", "0.5", "--json").stdout)
    assert {p["engine"] for p in both["engines"]} == {"vllm", "sglang", "trtllm"} and not both["refused"]


def _tr010_row() -> dict:
    from kvplan.validate.engine_reports import REPORT_FILES

    rows = [json.loads(line) for line in REPORT_FILES["trtllm"].read_text().splitlines() if line.strip()]
    return next(r for r in rows if r["case_id"] == "tr010")


def test_validate_judges_the_trtllm_full_budget_of_reports_that_state_enough():
    """tr010 (Qwen3-Reranker-0.6B = Qwen3-0.6B's shape, one H100 80GB HBM3, TensorRT-LLM 1.2.1, PyTorch backend,
    defaults) is the deployment priced by hand in test_size_trtllm_qwen3_0_6b_on_h100_by_hand: 644,896 x 114,688 B =
    68.88 GiB against the printed 68.69 GiB, (68.88 - 68.69) / 79.18 = +0.24% of the GPU. tr001 (gpt-oss-120b, an MoE
    model whose dummy prefill is now priced) ran on a DGX Spark: unified memory, so it is not judged, with the reason."""
    from helpers.harness import invoke

    tr = json.loads(invoke("validate", "--engine", "trtllm", "--json").stdout)
    cases = {c["case_id"]: c for c in tr["cases"]}
    assert cases["tr010"]["full"] == {"reported_gib": 68.69, "predicted_gib": 68.88, "gpu_gib": 79.18,
                                      "error_of_gpu_pct": 0.24}
    assert "unified-memory GPU (GB10)" in cases["tr001"]["full_reason"]
    assert "TensorRT engine" in cases["tr005"]["full_reason"]  # its C++ 'Memory usage when calculating' line
    # tr016 (SmolLM2-135M on an RTX 4070 Super: 12,282 MiB in nvidia-smi, a CUDA total of 11.55 GiB with the catalog's
    # median reserve) is judged since the catalog has that GPU: 8.87 GiB against the printed 9.06, (8.87 - 9.06) /
    # 11.55 = -1.645% of the GPU
    assert cases["tr016"]["full"] == {"reported_gib": 9.06, "predicted_gib": 8.87, "gpu_gib": 11.55,
                                      "error_of_gpu_pct": -1.645}
    goal = tr["goals"][1]
    assert goal["met"] is True and goal["achieved"].startswith("2/2 of ")
    assert "tr010 +0.24%, tr016 -1.65% of the GPU" in goal["achieved"] and "agrees on 1/1" in goal["achieved"]


def test_validate_trtllm_full_budget_can_miss_and_says_why_it_does_not_judge(tmp_path):
    """tr010's row under other stated settings. free_gpu_memory_fraction 0.5: 358,272 tokens (by hand in
    test_size_trtllm_qwen3_0_6b_on_h100_by_hand) x 114,688 B = 38.27 GiB against the printed 68.69: (38.27 - 68.69) /
    79.18 = -38.419% of the GPU, a miss, so the goal is not met. On a DGX Spark (unified memory), or at release
    0.19.0 (before the budget rules read), or with neither a PyTorch-backend line nor a release nor a stated backend,
    it is not judged, each with its reason."""
    from helpers.harness import invoke

    base = _tr010_row()
    # without the PyTorch-backend line and the release, the row's own "backend" field says which backend it was
    bare = base | {"quote": base["quote"].split(" / ", 2)[-1], "trtllm_version": None, "free_gpu_memory_fraction": 0.9,
                   "kv_cache_dtype": "auto"}
    rows = [base | {"case_id": "x1", "free_gpu_memory_fraction": 0.5},
            base | {"case_id": "x2", "gpu": "NVIDIA DGX Spark"},
            base | {"case_id": "x3", "trtllm_version": "0.19.0"},
            bare | {"case_id": "x4"},
            bare | {"case_id": "x5", "backend": "pytorch"},
            base | {"case_id": "x6", "max_num_tokens": 4096}]
    path = tmp_path / "trtllm-rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = invoke("validate", str(path), "--engine", "trtllm", "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    cases = {c["case_id"]: c for c in out["cases"]}
    assert cases["x1"]["full"] == {"reported_gib": 68.69, "predicted_gib": 38.27, "gpu_gib": 79.18,
                                   "error_of_gpu_pct": -38.419}
    assert cases["x2"]["full"] is None and "unified-memory GPU (GB10)" in cases["x2"]["full_reason"]
    assert cases["x3"]["full"] is None and "no TensorRT-LLM budget rules for 0.19.0" in cases["x3"]["full_reason"]
    assert cases["x4"]["full"] is None and "neither the PyTorch backend's lines" in cases["x4"]["full_reason"]
    assert cases["x5"]["full"]["predicted_gib"] == 68.88  # the same deployment as tr010
    # max_num_tokens 4096: activation 4096 x 12,288 x 2 = 100,663,296 B, half of 8192's, so the budget is
    # 0.9 x (82,175,914,066 + 100,663,296) = 74,048,919,625 B -> 645,655 tokens -> 20,177 blocks = 645,664 tokens
    # = 68.96 GiB: (68.96 - 68.69) / 79.18 = +0.341% of the GPU
    assert cases["x6"]["full"] == {"reported_gib": 68.69, "predicted_gib": 68.96, "gpu_gib": 79.18,
                                   "error_of_gpu_pct": 0.341}
    goal = out["goals"][1]
    assert goal["met"] is False and "2/3 of 6 reports; missed: x1 (-38.4%)" in goal["achieved"]


def test_check_log_trtllm_prices_the_moe_full_budget_and_says_unified_memory_is_not_in_it():
    """The 1.1.0rc3 gpt-oss-120b log (tr001) on a DGX Spark: the MoE model's full budget is now built (its dummy prefill
    priced, tests/engines/test_trtllm_moe.py) but not gated, and the unified-memory note says why it misses: the log's
    peak (113.65 GiB) holds 49.28 GiB 'outside torch' that is the host's share. The page math still judges it (exit 0)."""
    from helpers.harness import invoke

    r = invoke("check-log", "tests/engines/data/trtllm-1.1.0rc3-gpt-oss-120b-dgx-spark.log", "--model",
               "openai/gpt-oss-120b", "--tp", "1", "--gpu", "DGX Spark", "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {c["quantity"]: c for c in out["full_budget"]["comparisons"]}
    assert not any(c["gated"] for c in rows.values())
    assert rows["profiled peak GiB (torch + non-torch)"]["reported"] == 113.65
    assert any(n.startswith("unified memory:") for n in out["notes"])
