"""`kvplan check-log` and `kvplan validate` for SGLang and TensorRT-LLM start-ups: each engine told from its own lines,
its printed figures against its own rules. Expected values are the public logs' own figures (tests/engines/data, the
reports in profiles/reports) and hand arithmetic from the configs, written out next to each assertion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.deploy import load_model
from kvplan.errors import KvplanError
from kvplan.gate.enginelog import judge_sglang
from kvplan.sglang.startup_log import parse_server_args, parse_sglang_log
from kvplan.trtllm.pool import blocks_for, cell_of, pool_from_budget, pool_from_engine_free, tokens_in_printed_gib
from kvplan.trtllm.startup_log import parse_trtllm_log
from kvplan.units import GiB

DATA = Path(__file__).resolve().parent / "data"
SGLANG_LOG = DATA / "sglang-0.4.3-qwq32b-4xL4.log"
TRTLLM_LOG = DATA / "trtllm-1.1.0rc3-gpt-oss-120b-dgx-spark.log"
VLLM_LOG = Path(__file__).resolve().parents[1] / "gate" / "data" / "vllm-0.8.3-v0-tp2.log"
REPORTS = Path(__file__).resolve().parents[2] / "profiles" / "reports"


def _rows(result: dict) -> dict[str, dict]:
    return {c["quantity"]: c for section in ("page_math", "budget", "full_budget") if result.get(section)
            for c in result[section]["comparisons"]}


# --- reading the lines ------------------------------------------------------------------------------


def test_sglang_lines_are_read_from_the_public_log():
    r = parse_sglang_log(SGLANG_LOG.read_text())
    assert (r.model, r.server_args["tp_size"], r.mem_fraction_static, r.page_size) == (
        "/home/model/Qwen/QwQ-32B", 4, 0.85, 1)
    assert (r.pool_tokens, r.k_size_gib, r.v_size_gib, r.max_total_num_tokens) == (46611, 1.42, 1.42, 46611)
    assert (r.free_before_load_gib, r.free_after_load_gib, r.weights_gib) == (21.63, 6.09, 15.54)
    assert (r.model_class, r.model_dtype, r.ranks, r.draft_pools) == ("Qwen2ForCausalLM", "bfloat16", 4, 0)
    assert (r.max_running_requests, r.context_len, r.chunked_prefill_size) == (2049, 131072, 2048)


def test_sglang_line_variants_by_release():
    """The formats of `mem_cache/memory_pool.py` by release (0.4.6 K/V and MLA lines, 0.5.13's dtype, 0.5.23's
    label), the 0.5.23 dict form of server_args, the sliding-window and Mamba pools, a draft's second pool line,
    and check_env's release and GPU lines, each as a real report quotes it where one does (sg010, sg011)."""
    sg011 = parse_sglang_log(
        "[2026-09-12 00:22:48 TP0] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 454112, K size: 3.46 GB, "
        "V size: 3.46 GB\n[2026-09-12 00:22:48 TP0] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: "
        "454112, K size: 1.08 GB, V size: 1.08 GB")
    assert (sg011.kv_cache_dtype, sg011.pool_tokens, sg011.k_size_gib, sg011.draft_pools) == (
        "float8_e4m3fn", 454112, 3.46, 1)
    sg010 = parse_sglang_log("[2026-01-31 13:50:39 TP0] Use sliding window memory pool. full_layer_tokens=375360, "
                             "swa_layer_tokens=300288")
    assert (sg010.swa_full_tokens, sg010.swa_tokens) == (375360, 300288)
    mla = parse_sglang_log("[2025-10-07 23:17:19 DP0 TP0] KV Cache is allocated. #tokens: 975424, KV size: 43.67 GB")
    assert (mla.kv_size_gib, mla.pool_gib, mla.pool_tokens) == (43.67, 43.67, 975424)
    old = parse_sglang_log("[2025-02-17 14:07:28 TP1] KV Cache is allocated. K size: 2.98 GB, V size: 2.98 GB.")
    assert (old.pool_tokens, old.pool_gib) == (None, 2.98 + 2.98)
    # 0.4.1.post7's scheduler line has no chunked_prefill_size (sg020, SGLang's own docs of January 2025)
    sched = parse_sglang_log("[2025-01-23 19:35:27 TP0] max_total_num_tokens=444500, max_prefill_tokens=16384, "
                             "max_running_requests=2049, context_len=131072")
    assert (sched.max_total_num_tokens, sched.chunked_prefill_size, sched.max_running_requests, sched.context_len) == (
        444500, None, 2049, 131072)
    env = parse_sglang_log("sglang: 0.4.9.post6\nGPU 0,1,2,3: NVIDIA H100 80GB HBM3\n"
                           "GPU 0,1,2,3 Compute Capability: 9.0")
    assert (env.sglang_version, env.gpu, env.gpu_count) == ("0.4.9.post6", "NVIDIA H100 80GB HBM3", 4)
    # 0.5.23 logs a dict (`_server_args_for_logging`): the same fields are read
    assert parse_server_args("server_args={'model_path': 'Qwen/Qwen3-8B', 'tp_size': 2, 'mem_fraction_static': "
                             "0.83, 'page_size': 64, 'kv_cache_dtype': 'fp8_e4m3'}") == {
        "model_path": "Qwen/Qwen3-8B", "tp_size": 2, "mem_fraction_static": 0.83, "page_size": 64,
        "kv_cache_dtype": "fp8_e4m3"}
    labelled = parse_sglang_log("[t] MiniMax main NVFP4 KV Cache is allocated. dtype: torch.uint8, #tokens: 10, "
                                "KV size: 0.01 GB")
    assert labelled.pool_label == "MiniMax main NVFP4"


def test_trtllm_lines_are_read_from_the_public_log():
    r = parse_trtllm_log(TRTLLM_LOG.read_text())
    assert (r.trtllm_version, r.backend, r.tokens_per_block) == ("1.1.0rc3", "pytorch", 32)
    assert [(p.gib, p.tokens) for p in r.pools] == [(0.56, 8224), (5.95, 86720)]
    assert (r.pool.gib, r.pool.tokens) == (5.95, 86720)  # the last line is the pool; the first is the estimation's
    assert (r.peak_gib, r.profiled_kv_gib, r.kv_bytes_per_token, r.device_total_gib, r.estimation_pool_gib) == (
        113.65, 5.95, 73728, 119.70, 0.56)
    assert (r.estimated_kv_gib, r.max_tokens_used, r.free_gpu_memory_fraction) == (5.95, 86711, 0.8999999761581421)
    # later releases: "TensorRT LLM version: X (backend: cuda)" (tensorrt_llm/__init__.py@083a741); a TensorRT
    # engine's C++ sizing line (kvCacheManager.cpp), as NVIDIA's memory doc and report tr006 print it
    engine = parse_trtllm_log("[TensorRT-LLM] TensorRT LLM version: 1.3.0rc7 (backend: cuda)\n"
                              "[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache: total: "
                              "79.10 GiB, available: 70.48 GiB\n[TensorRT-LLM][INFO] Number of blocks in KV cache "
                              "primary pool: 4060")
    assert (engine.trtllm_version, engine.backend, engine.engine_available_gib, engine.primary_blocks) == (
        "1.3.0rc7", "tensorrt", 70.48, 4060)


# --- the engines' page math by hand -------------------------------------------------------------------


def test_trtllm_bytes_a_token_and_blocks():
    """`KVCacheManager.get_cache_bytes_per_token` (resource_manager.py@b35ac1b): layers x ceil(KV heads / TP) x
    head_dim x 2 x dtype; MLA: the latent x 1, on every rank. Blocks round up (`calculate_max_num_blocks`)."""
    oss = cell_of(load_model("openai/gpt-oss-120b", source="bundled").arch, 1)
    assert oss.manager_bytes == oss.estimator_bytes == 36 * 8 * 64 * 2 * 2 == 73_728  # the log's "kv size is 73728"
    assert oss.sliding_as_full  # gpt-oss's sliding layers pool the whole sequence without max_attention_window
    llama = load_model("meta-llama/Llama-3.1-8B", source="bundled").arch
    assert cell_of(llama, 2).manager_bytes == 32 * 4 * 128 * 2 * 2 == 65_536
    assert cell_of(llama, 1, "fp8").manager_bytes == 32 * 8 * 128 * 2 * 1 == 65_536
    dsv3 = cell_of(load_model("deepseek-ai/DeepSeek-V3", source="bundled").arch, 8)
    assert dsv3.manager_bytes == (512 + 64) * 61 * 2 == 70_272  # not divided by TP 8
    assert blocks_for(86_653, 32) == 2_708 and blocks_for(86_656, 32) == 2_708 and blocks_for(86_657, 32) == 2_709
    # tr001 by hand: int(5.95 x 2^30) = 6,388,763,852 B // 73,728 = 86,653 max tokens -> 2,708 blocks -> 86,656
    assert pool_from_budget(5.95 * GiB, oss, 32) == 86_656
    # ... the printed 86,720 (2,710 blocks) is inside the rounding of "5.95": 5.955 GiB gives 86,725 -> 86,752
    assert pool_from_budget(5.955 * GiB, oss, 32) == 86_752
    nearest, low, high = tokens_in_printed_gib(5.95, oss, 32)
    assert low <= 86_720 <= high and nearest == 86_656
    # a TensorRT engine: SizeType32(0.9 x 70.48 GiB / 65,536 B) = 1,039,269 -> ceil(/ 64) = 16,239 blocks
    assert pool_from_engine_free(70.48 * GiB, 0.9, cell_of(llama, 2), 64) == 16_239 * 64
    with pytest.raises(KvplanError, match="mamba"):
        cell_of(load_model("ibm-granite/granite-4.0-h-350m", source="bundled").arch, 1)


# --- check-log ---------------------------------------------------------------------------------------


def test_check_log_judges_an_sglang_start_up():
    """SGLang 0.4.3.post4, QwQ-32B (Qwen2.5-32B's config) at TP 4 on 4 x L4. By hand: 8 KV heads / TP 4 = 2 heads
    x 128 x 64 layers x 2 B = 32,768 B of K a token, 65,536 of K + V. The buffers hold one padding token more:
    (46,611 + 1) x 32,768 B = 1.4225 GiB, printed "1.42 GB". From the printed 2.84 GiB: 2.84 x 2^30 // 65,536 - 1 =
    46,529 tokens, and 2.83 / 2.85 GiB bound it: 46,366 .. 46,693, which hold the printed 46,611. SGLang's budget
    from the printed free memory: 6.09 - 21.63 x (1 - 0.85) = 2.8455 GiB -> // 65,536 = 46,620."""
    from helpers.harness import invoke

    r = invoke("check-log", str(SGLANG_LOG), "--model", "Qwen/Qwen2.5-32B", "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["engine"], out["engine_version"], out["ok"]) == ("sglang", None, True)
    rows = _rows(out)
    tokens = rows["#tokens from the printed pool GiB"]
    assert (tokens["reported"], tokens["predicted"], tokens["gated"], tokens["within"]) == (46611, 46529, True, True)
    assert (rows["K size GiB"]["reported"], rows["K size GiB"]["predicted"]) == (1.42, 1.42)
    budget = rows["#tokens from the budget"]
    assert (budget["predicted"], budget["gated"], budget["within"]) == (46620, False, True)
    assert rows["KV budget GiB: A - P x (1 - mem_fraction_static)"]["predicted"] == 2.8455
    assert "max_running_requests" not in rows  # no release printed: its cap (0.4.6 printed one more) is not judged


def test_check_log_sglang_full_budget_with_the_gpu_and_release():
    """--gpu 4xL4 and the release the report states: kvplan's SGLang pool from the GPU and the settings. The release
    (0.4.3) was not read, so the log's own mem_fraction_static is used and said so."""
    from helpers.harness import invoke

    r = invoke("check-log", str(SGLANG_LOG), "--model", "Qwen/Qwen2.5-32B", "--gpu", "4xL4", "--engine-version",
               "0.4.3.post4", "--gate", "all", "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["full_budget"]["gpu"] == "4x L4"
    full = {c["quantity"]: c for c in out["full_budget"]["comparisons"]}
    assert full["KV budget GiB per GPU"]["reported"] == 2.84 and full["KV budget GiB per GPU"]["gated"]
    assert any("0.4.3" in note and "not read" in note for note in out["notes"])


def test_check_log_judges_a_trtllm_start_up():
    """TensorRT-LLM 1.1.0rc3, gpt-oss-120b on one DGX Spark (report tr001); figures by hand in
    test_trtllm_bytes_a_token_and_blocks. The budget rule from the printed peak: (119.70 - 113.65 + 0.56) x 0.9 =
    5.949 GiB against the printed 5.95."""
    from helpers.harness import invoke

    r = invoke("check-log", str(TRTLLM_LOG), "--model", "openai/gpt-oss-120b", "--tp", "1", "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["engine"], out["engine_version"], out["ok"]) == ("trtllm", "1.1.0rc3", True)
    rows = _rows(out)
    pool = rows["pool tokens from the profiled budget"]
    assert (pool["reported"], pool["predicted"], pool["within"], pool["gated"]) == (86720, 86656, True, True)
    assert (rows["max_tokens (the last 'Both ... are set' line)"]["predicted"]) == 86653
    assert (rows["bytes a token ('kv size is')"]["reported"], rows["bytes a token ('kv size is')"]["predicted"]) == (
        73728, 73728)
    rule = rows["KV budget GiB: (total - peak + estimation pool) x fraction"]
    assert (rule["predicted"], rule["within"], rule["gated"]) == (5.949, True, False)


def test_a_wrong_tp_is_outside_the_tolerance():
    """The same SGLang log read at TP 2 (twice the heads a GPU): 131,072 B a token halves the tokens the printed
    memory holds, so the verdict is 'outside', exit 1, not a pass."""
    from helpers.harness import invoke

    r = invoke("check-log", str(SGLANG_LOG), "--model", "Qwen/Qwen2.5-32B", "--tp", "2", "--json")
    assert r.code == 1
    assert _rows(json.loads(r.stdout))["#tokens from the printed pool GiB"]["predicted"] == 23_264


@pytest.mark.parametrize("text, args, message", [
    ("hello\nworld\n", (), "cannot tell which engine wrote this log"),
    # vllm#21348 quotes both engines' lines: the engine must be named
    ("Available KV cache memory: 8.11 GiB\nGPU KV cache size: 178,880 tokens\nKV Cache is allocated. #tokens: 367404, "
     "K size: 8.23 GB, V size: 8.23 GB\n", (), "holds start-up lines of vLLM and SGLang"),
    ("KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB\n", (),
     "does not name the model"),
    ("KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB\n",
     ("--model", "Qwen/Qwen3-235B-A22B-FP8"), "cannot read SGLang's tensor parallel size"),
    ("KV Cache is allocated. #tokens: 10, K size: 0.01 GB, V size: 0.01 GB\n", ("--block-size", "16"), "vLLM flag"),
    ("[TensorRT-LLM][INFO] Using 10718 tokens in paged KV cache.\n", (), "prints no memory to compare"),
    ("[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache: total: 79.10 GiB, available: "
     "63.62 GiB\n[TensorRT-LLM][INFO] Number of tokens per block: 64.\n[TensorRT-LLM][INFO] [MemUsageChange] Allocated "
     "62.99 GiB for max tokens in paged KV cache (294848).\n", ("--model", "meta-llama/Llama-2-7b-hf", "--tp", "1"),
     "KV dtype is fixed when it is built"),
    ("[TensorRT-LLM][INFO] [MemUsageChange] Allocated 5.95 GiB for max tokens in paged KV cache (86720).\n",
     ("--model", "openai/gpt-oss-120b"), "cannot read TensorRT-LLM's tensor parallel size"),
    # a sliding-window pool printed for a model of full attention only: the log is not of that model
    ("Use Sliding window memory pool. full_layer_tokens=375360, swa_layer_tokens=300288\nKV Cache is allocated. "
     "#tokens: 300288, K size: 8.38 GB, V size: 5.59 GB\n", ("--model", "Qwen/Qwen2.5-32B", "--tp", "4"),
     "the model's config has no sliding-window layers"),
    ("Mamba Cache is allocated. max_mamba_cache_size: 10\nKV Cache is allocated. #tokens: 300288, K size: 8.38 GB, "
     "V size: 5.59 GB\n", ("--model", "Qwen/Qwen2.5-32B", "--tp", "4"), "Mamba hybrid pool"),
])
def test_what_cannot_be_judged_is_one_line_exit_2(tmp_path, text, args, message):
    from helpers.harness import invoke

    log = tmp_path / "engine.log"
    log.write_text(text)
    r = invoke("check-log", str(log), *args)
    assert r.code == 2 and message in r.one_line_error(), r.stderr


def test_engine_is_told_and_can_be_named():
    """A vLLM log still goes to vLLM's judge; --engine forces one; a forced engine without its lines is refused."""
    from helpers.harness import invoke

    vllm = invoke("check-log", str(VLLM_LOG), "--json")
    assert vllm.code == 0 and "vllm_version" in json.loads(vllm.stdout)
    forced = invoke("check-log", str(VLLM_LOG), "--engine", "sglang")
    assert forced.code == 2 and "no SGLang KV pool lines" in forced.one_line_error()
    wrong = invoke("check-log", str(VLLM_LOG), "--engine-version", "0.5.3")
    assert wrong.code == 2 and "--engine-version is for SGLang and TensorRT-LLM" in wrong.one_line_error()
    tgi = invoke("check-log", str(SGLANG_LOG), "--engine", "tgi")
    assert tgi.code == 2 and "invalid --engine" in tgi.one_line_error()


def test_other_engines_lines_never_crowd_out_vllm_s(tmp_path):
    """The reader keeps vLLM's lines as vLLM's reader does, the other engines' in a cap of their own: a vLLM log
    followed by 5,000 lines that only other engines' keywords keep is judged exactly as the log alone."""
    from helpers.harness import invoke

    alone = json.loads(invoke("check-log", str(VLLM_LOG), "--json").stdout)
    log = tmp_path / "vllm-then-noise.log"
    log.write_text(VLLM_LOG.read_text() + "".join(f"request {i} tp_size=1 Model: x\n" for i in range(5000)))
    noisy = invoke("check-log", str(log), "--json")
    assert noisy.code == 0
    assert json.loads(noisy.stdout)["page_math"] == alone["page_math"]


def test_a_hostile_log_is_bounded_and_refused(tmp_path):
    """A 5 MB line of digits and a line of 200,000 'KV Cache' words: one line on stderr, exit 2, no traceback."""
    from helpers.harness import invoke

    log = tmp_path / "bomb.log"
    log.write_text("9" * 5_000_000 + "\n" + "KV Cache is allocated. " * 200_000 + "\n")
    r = invoke("check-log", str(log))
    assert r.code == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# --- validate and size -----------------------------------------------------------------------------


def test_validate_sglang_and_trtllm_reports():
    from helpers.harness import invoke

    sg = json.loads(invoke("validate", "--engine", "sglang", "--json").stdout)
    cases = {c["case_id"]: c for c in sg["cases"]}
    # vllm#21348: 2 x 8.23 GiB // 48,128 B - 1 = 367,223 (the printed 367,404 is inside the rounding of "8.23")
    assert (cases["sg001"]["page"]["predicted"], cases["sg001"]["page"]["reported"]) == (367_223, 367_404)
    assert (cases["sg014"]["page"]["predicted"], cases["sg014"]["page"]["reported"]) == (46_529, 46_611)
    assert cases["sg014"]["full"]["gpu_gib"] == 22.05 and abs(cases["sg014"]["full"]["error_of_gpu_pct"]) <= 3
    assert cases["sg003"]["page_reason"] == "the report names no model"
    # sg002 names google/gemma-3-4b-it (the PR comment's own launch command). SGLang never gives Gemma 3 its hybrid
    # sliding-window pool (configs/model_config.py@0.4.9.post6 .. @0.5.23): one pool, every one of its 34 layers a
    # full page: 34 x 4 x 256 x 2 (K, V) x 2 B = 139,264 B a token; int(2 x 54.12 x 2^30) // 139,264 - 1 = 834,542
    assert cases["sg002"]["model"] == "google/gemma-3-4b-it"
    assert (cases["sg002"]["page"]["predicted"], cases["sg002"]["page"]["reported"]) == (834_542, 834_615)
    # Rows whose own thread names the model, page 1, bf16, the bytes a token from each config (layers x KV heads per
    # rank x head size x 2 (K and V) x 2 B), the printed K + V GiB over it less the padding token:
    # sg018 Llama-3.3-70B-Instruct at TP 8: 80 x 8/8 x 128 x 2 x 2 = 40,960 B; int(106.62 x 2^30) // 40,960 - 1
    assert (cases["sg018"]["page"]["predicted"], cases["sg018"]["page"]["reported"]) == (2_794_978, 2_795_207)
    # sg020 Llama-3.1-8B (SGLang's docs, 0.4.1 lines: the scheduler's tokens): 32 x 8 x 128 x 4 = 131,072 B; 54.26 GiB
    assert (cases["sg020"]["page"]["predicted"], cases["sg020"]["page"]["reported"]) == (444_496, 444_500)
    # sg021 DeepSeek-R1-Distill-Qwen-7B (Qwen2.5-7B's shape) on a 3090: 28 x 4 x 128 x 4 = 57,344 B; 5.64 GiB
    assert (cases["sg021"]["page"]["predicted"], cases["sg021"]["page"]["reported"]) == (105_605, 105_531)
    # sg015 Qwen3-30B-A3B-Instruct-2507-FP8 (Qwen3-30B-A3B's shape), bf16 cache: 48 x 4 x 128 x 4 = 98,304 B; 203.90 GiB
    assert (cases["sg015"]["page"]["predicted"], cases["sg015"]["page"]["reported"]) == (2_227_130, 2_227_073)
    # sg017 names Qwen3.5-397B-A17B-FP8 (the issue's own launch script, TP 2, SGLang 0.5.9): a GDN hybrid whose KV pool
    # holds its full-attention layers alone (HybridLinearKVPool, mem_cache/memory_pool.py@0.5.9): 60 layers, every
    # 4th full, 15 x (2 KV heads / TP 2) x 256 x 2 (K, V) x 2 B = 15,360 B; int(2 x 4.15 x 2^30) // 15,360 - 1
    assert (cases["sg017"]["page"]["predicted"], cases["sg017"]["page"]["reported"]) == (580_211, 580_364)
    assert "state pool" in cases["sg017"]["full_reason"]
    # sg019 names its model but neither its GPUs nor its TP: not judged, not guessed from the printed K size
    assert "tensor parallel size" in cases["sg019"]["page_reason"]
    names = [g["name"] for g in sg["goals"]]
    assert names == ["SGLang page math: pool tokens from the printed memory",
                     "SGLang full budget: the pool from the GPU and the settings"]
    tr = json.loads(invoke("validate", "--engine", "trtllm", "--json").stdout)
    tr001 = next(c for c in tr["cases"] if c["case_id"] == "tr001")
    assert (tr001["page"]["predicted"], tr001["page"]["reported"]) == (86_656, 86_720)  # one GPU: TP 1
    assert tr["goals"][1]["met"] is not None  # measured on the reports that state enough (test_trtllm_budget.py)
    table = invoke("validate", "--engine", "all")
    assert table.code == 0
    for line in ("SGLang page math", "TensorRT-LLM page math", "page math: KV tokens"):
        assert line in table.stdout
    bad = invoke("validate", "--engine", "sglang", "--fit")
    assert bad.code == 2 and "vLLM's" in bad.one_line_error()


def test_trtllm_reports_judged_by_hand_and_tr006_marked():
    """Public TensorRT-LLM start-ups priced by hand with TensorRT-LLM's rule (blocks = ceil(tokens / 32)), and tr006,
    whose pool lines contradict the model it names, still counted as a miss with the reason shown."""
    from helpers.harness import invoke

    tr = json.loads(invoke("validate", "--engine", "trtllm", "--json").stdout)
    cases = {c["case_id"]: c for c in tr["cases"]}
    assert tr["reports"] >= 15
    # tr010, Qwen3-Reranker-0.6B (Qwen3-0.6B's shape), bf16: 28 x 8 x 128 x 2 x 2 = 114,688 B a token;
    # int(68.69 x 2^30 / 114,688) = 643,095 -> 20,097 blocks of 32 = 643,104
    assert (cases["tr010"]["page"]["predicted"], cases["tr010"]["page"]["reported"]) == (643_104, 643_136)
    # tr011, Kimi K2.5 at TP 8, FP8 MLA: 61 x (512 + 64) x 1 = 35,136 B a token on every rank;
    # int(166.02 x 2^30 / 35,136) = 5,073,503 -> 158,547 blocks of 32 = 5,073,504
    assert (cases["tr011"]["page"]["predicted"], cases["tr011"]["page"]["reported"]) == (5_073_504, 5_073_376)
    # tr006: 0.99 x 63.62 GiB at Llama-2-7B's FP8 262,144 B a token = 257,981 tokens -> 4,031 blocks of 64
    tr006 = cases["tr006"]
    assert tr006["page"]["predicted"] == 257_984 and "GPT-J-6B" in tr006["contradiction"]
    page_goal = tr["goals"][0]["achieved"]
    assert "tr006 (-12.50%, the report contradicts itself)" in page_goal
    table = invoke("validate", "--engine", "trtllm")
    assert "the report contradicts itself" in table.stdout


def test_trtllm_0_8_log_prints_its_pool_in_bytes():
    """TensorRT-LLM 0.8-0.9 printed 'Allocate B bytes for k/v cache.' then 'Using N [total] tokens in paged KV cache':
    the pair is the pool line (B exact). Llama-3-8B bf16, 32 x 8 x 128 x 2 x 2 = 131,072 B a token: 60,672 x 131,072
    = 7,952,400,384 B (tr017's pair); gpt2-medium at TP 2 prints one pair a rank, 24 x (16 / 2) x 64 x 2 x 2 = 49,152
    B a token: 447,744 x 49,152 = 22,007,513,088 B (tr020's). A lone 'Using N tokens' (2023) still prints no memory."""
    from helpers.harness import invoke

    r = parse_trtllm_log("[05/21/2024-14:00:33] [TRT-LLM] [I] Set tokens_per_block to 128.\n"
                         "[TensorRT-LLM][INFO] Allocate 7952400384 bytes for k/v cache. \n"
                         "[TensorRT-LLM][INFO] Using 60672 tokens in paged KV cache.\n")
    assert [(p.gib, p.tokens) for p in r.pools] == [(7952400384 / 2**30, 60672)] and r.tokens_per_block == 128
    assert r.backend is None  # a TensorRT engine's runtime: its KV dtype must be given
    both = parse_trtllm_log("Allocate 22007513088 bytes for k/v cache.\nUsing 447744 tokens in paged KV cache.\n" * 2)
    assert [p.tokens for p in both.pools] == [447744, 447744]
    triton = parse_trtllm_log("Allocate 335544320 bytes for k/v cache.\n"
                              "Using 2560 total tokens in paged KV cache, and 20 blocks per sequence\n")
    assert (triton.pool.gib * 2**30, triton.pool.tokens) == (335544320, 2560)  # 2,560 x 131,072 B
    assert parse_trtllm_log("Using 10718 tokens in paged KV cache.\n").pools == []
    # the PyTorch backend's own lines name it (its KV dtype then defaults to "auto")
    assert parse_trtllm_log("[TRT-LLM] [I] Estimated max memory in KV cache : 9.06 GiB\n").backend == "pytorch"

    tr = json.loads(invoke("validate", "--engine", "trtllm", "--json").stdout)
    cases = {c["case_id"]: c for c in tr["cases"]}
    assert (cases["tr017"]["page"]["predicted"], cases["tr017"]["page"]["reported"]) == (60_672, 60_672)
    assert (cases["tr020"]["page"]["predicted"], cases["tr020"]["page"]["reported"]) == (447_744, 447_744)
    # tr016, SmolLM2-135M-Instruct (PyTorch backend, bf16): 30 x 3 x 64 x 2 x 2 = 23,040 B a token;
    # int(9.06 x 2^30) // 23,040 = 422,226 -> 13,195 blocks of 32 = 422,240 (printed 13,189 blocks = 422,048)
    assert (cases["tr016"]["page"]["predicted"], cases["tr016"]["page"]["reported"]) == (422_240, 422_048)
    # 21 reports: 12 within 0.5% (tr001, tr005, tr007, tr008, tr010, tr011, tr016-tr021), tr006 missed, 8 not judged
    assert tr["goals"][0]["achieved"].startswith("12/21 (57%); of the 13 it can judge, 12 within")
    assert "not judged, the report names no model: tr002, tr004, tr012, tr014, tr015" in tr["goals"][0]["achieved"]


def test_sglang_sliding_window_report_judged_by_hand():
    """sg010, MiMo-V2-Flash at TP 4, page 64, bf16 cache (its config: 9 full-attention layers of 4 KV heads, 39
    sliding-window layers of 8, K 192 and V 128 wide). The printed pool line is SWAKVPool's SWA pool (its #tokens is
    swa_layer_tokens): 39 x (8 / 4) x (192 + 128) x 2 B = 49,920 B a token; int(13.97 x 2^30) // 49,920 = 300,484,
    less one padding page = 300,420 -> 4,694 pages of 64 = 300,416 (+0.04%). K: 300,352 rows x 39 x 2 x 192 x 2 B
    = 8,996,143,104 B = 8.38 GiB. The split: int(375,360 x 0.8) = 300,288 = 4,692 pages of 64."""
    from helpers.harness import invoke

    sg = json.loads(invoke("validate", "--engine", "sglang", "--json").stdout)
    sg010 = next(c for c in sg["cases"] if c["case_id"] == "sg010")
    assert (sg010["page"]["predicted"], sg010["page"]["reported"]) == (300_416, 300_288)
    # the report names neither its GPU nor its release (the split rule changed by release): said precisely
    assert sg010["page_reason"] is None and sg010["full"] is None
    assert sg010["full_reason"].startswith("not judged because it names no GPU and no release (the split of the "
                                           "sliding-window pool changed by release")
    assert "sg010" not in sg["goals"][0]["achieved"]  # judged and within: neither missed nor listed as not judged
    log = ("[2026-01-31 13:50:39 TP0] Use sliding window memory pool. full_layer_tokens=375360, swa_layer_tokens=300288\n"
           "[2026-01-31 13:50:39 TP1] KV Cache is allocated. #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB\n")
    parsed = parse_sglang_log(log)
    model = load_model("XiaomiMiMo/MiMo-V2-Flash", source="bundled")
    r = judge_sglang(log, "sg010", 0.005, "all", None, None, None, 4, None, resolved=model,
                     given_args={"page_size": 64})
    rows = {c.quantity: c for c in r.page_math.comparisons}
    assert r.ok and parsed.draft_pools == 0
    assert (rows["K size GiB"].reported, rows["K size GiB"].predicted) == (8.38, 8.38)
    assert (rows["swa_layer_tokens from full_layer_tokens"].predicted, rows["swa_layer_tokens from full_layer_tokens"]
            .reported) == (300_288, 300_288)
    # the same line read as the full pool's would be priced with the 9 full layers' 5,760 B: it is not
    assert "the SWA pool" in rows["#tokens from the printed pool GiB"].note
    # SWAKVPool prints both pools' lines on a rank (SWA first, swa_memory_pool.py@0.5.8.post1): not a draft's
    both = log + ("[2026-01-31 13:50:39 TP1] KV Cache is allocated. #tokens: 375360, K size: 1.21 GB, "
                  "V size: 0.81 GB\n")
    assert parse_sglang_log(both).draft_pools == 0


def test_sglang_nsa_reports_judged_by_hand():
    """sg008 / sg009, DeepSeek-V3.2-Exp on 8 x B200 (DP attention, page 64, FP8 forced on Blackwell,
    server_args.py@0.5.3). A layer's FP8 latent: 512 + 512 // 128 x 4 + 64 x 2 (bf16 rope) = 656 B; its indexer keys:
    128 + 128 // 128 x 4 = 132 B. sg008 (PR #11309, as shipped in 0.5.3.post1: the pool line counts the indexer):
    61 x 788 = 48,068 B; int(43.67 x 2^30) = 46,890,305,454 // 48,068 = 975,499, less a page = 975,435 -> 975,424,
    the printed count. sg009 (main before it, 0.5.3: the latent alone): 61 x 656 = 40,016 B; int(54.52 x 2^30) =
    58,540,404,244 // 40,016 = 1,462,924, less a page = 1,462,860 -> 1,462,848 (one page above the printed)."""
    from helpers.harness import invoke

    sg = json.loads(invoke("validate", "--engine", "sglang", "--json").stdout)
    cases = {c["case_id"]: c for c in sg["cases"]}
    assert (cases["sg008"]["page"]["predicted"], cases["sg008"]["page"]["reported"]) == (975_424, 975_424)
    assert (cases["sg009"]["page"]["predicted"], cases["sg009"]["page"]["reported"]) == (1_462_848, 1_462_784)
    assert "0.5.3.post1" in cases["sg008"]["rules"]
    # the full budget is judged: B200, TP 8 and the release stated (tests/engines/test_sglang_hybrid_pools.py works it)
    assert cases["sg008"]["full"] is not None and cases["sg008"]["full_reason"] is None
    assert cases["sg009"]["full"] is not None and cases["sg009"]["full"]["reported_gib"] == 54.52
    # With the indexer's weights, the norms and routers whole under DP attention and MLA's bf16 w_kc / w_vc
    # (test_nsa_weights_on_each_gpu_by_hand), both within the goal's 3% of the GPU; both still over-predict: the
    # printed free memory puts SGLang's weights near 94 GiB a GPU against kvplan's 92.1 (docs/engines.md)
    assert all(0 < cases[c]["full"]["error_of_gpu_pct"] < 3 for c in ("sg008", "sg009"))
    assert "mla_indexer" not in sg["goals"][0]["achieved"]
    # The release decides what the printed size holds: with none, refused with the reason, one line, exit 2.
    log = ("[2025-10-07 23:17:19 DP0 TP0] KV Cache is allocated. #tokens: 975424, KV size: 43.67 GB\n")
    model = load_model("deepseek-ai/DeepSeek-V3.2-Exp", source="bundled")
    with pytest.raises(KvplanError, match="0.5.3.post1 and not in 0.5.3"):
        judge_sglang(log, "sg008", 0.005, "all", None, "B200", None, 8, None, resolved=model)
    with pytest.raises(KvplanError, match="0.5.3 to 0.5.10 only"):
        judge_sglang(log, "sg008", 0.005, "all", None, "B200", "0.5.11", 8, None, resolved=model)
    # Read as 0.5.3 (the latent alone), the same line would be 46,890,305,454 // 40,016 = 1,171,788, less a page,
    # in pages: 1,171,712 tokens, 20% off: the release's rule decides, nothing is fitted to the report.
    as_053 = judge_sglang(log, "sg008", 0.005, "all", None, "B200", "0.5.3", 8, None, resolved=model)
    assert as_053.page_math.comparisons[0].predicted == 1_171_712 and not as_053.ok


def test_every_new_report_quotes_its_figures():
    """Each report's tokens appear in its own quote, and every SGLang report has a public URL."""
    for engine, tokens in (("sglang", "reported_max_total_num_tokens"), ("trtllm", "reported_max_tokens")):
        rows = [json.loads(line) for line in (REPORTS / f"{engine}-startup-reports.jsonl").read_text().splitlines()
                if line.strip()]
        for row in rows:
            assert row["quote"] and (row[tokens] is None or str(row[tokens]) in row["quote"].replace(",", "")), row
    sg = [json.loads(line) for line in (REPORTS / "sglang-startup-reports.jsonl").read_text().splitlines() if line]
    assert len(sg) >= 15 and all(r["source"].startswith("https://") for r in sg)
