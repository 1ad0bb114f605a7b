"""`kvplan size --emit llm-d-sim` (issue 26 item 5): one replica of a plan as llm-d-inference-sim's YAML config.

The keys and their value types are checked against the simulator's own flag list (tests/data/llm-d-inference-sim/
flags.tsv, copied from its parser at eec055a), every duration with a port of Go's ``time.ParseDuration`` (the parser
the simulator's yaml.v3 calls), and the values against hand arithmetic on the bundled Llama-3.1-8B profile and the
catalog's H100 SXM: the pool is the 16,384 blocks tests/cli/test_size_cli.py pins, less vLLM's null block; the step
times are kvplan.plan.steptime's roofline sum written out term by term below with the profile's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.harness import invoke

FLAGS_FILE = Path(__file__).resolve().parents[1] / "data" / "llm-d-inference-sim" / "flags.tsv"
LLAMA = ("size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--kv-memory", "32GiB", "--ctx", "32k",
         "--prompt", "1000", "--output", "200", "--vllm-version", "0.33.0")


def sim_flags() -> dict[str, tuple[str, bool]]:
    """name -> (Go type, is a YAML key), from the vendored list."""
    out = {}
    for line in FLAGS_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind, yaml_key = line.split("\t")
            out[name] = (kind, yaml_key == "yes")
    return out


# --- Go's time.ParseDuration (src/time/format.go), ported: the grammar [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+ or "0" ---
GO_UNITS_NS = {"ns": 1, "us": 10**3, "\u00b5s": 10**3, "\u03bcs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
               "h": 3600 * 10**9}


def parse_go_duration(text: str) -> int:
    """Nanoseconds, or ValueError where Go's ParseDuration returns an error."""
    s, neg = text, False
    if s and s[0] in "+-":
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while s:
        if not (s[0] == "." or s[0].isdigit()):
            raise ValueError(f"invalid duration {text!r}")
        i = 0
        while i < len(s) and "0" <= s[i] <= "9":
            i += 1
        pre, whole, s = i > 0, int(s[:i] or 0), s[i:]
        frac, scale, post = 0, 1.0, False
        if s.startswith("."):
            s = s[1:]
            i = 0
            while i < len(s) and "0" <= s[i] <= "9":
                i += 1
            post = i > 0
            for ch in s[:i]:  # leadingFraction: digits past int64's range are dropped
                if frac <= (2**63 - 1) // 10:
                    frac, scale = frac * 10 + int(ch), scale * 10
            s = s[i:]
        if not pre and not post:
            raise ValueError(f"invalid duration {text!r}")
        i = 0
        while i < len(s) and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        unit = s[:i]
        s = s[i:]
        if unit not in GO_UNITS_NS:
            raise ValueError(f"unknown or missing unit in duration {text!r}")
        value = whole * GO_UNITS_NS[unit]
        if frac:
            value += int(float(frac) * (GO_UNITS_NS[unit] / scale))
        total += value
        if total > 2**63:
            raise ValueError(f"invalid duration {text!r}")
    return -total if neg else total


def test_the_go_duration_check_can_fail():
    assert parse_go_duration("12.345678ms") == 12_345_678 and parse_go_duration("250us") == 250_000
    assert parse_go_duration("1h2m3.5s") == 3_723_500_000_000 and parse_go_duration("0") == 0
    for bad in ("", "12", "1.5", "ms", "12 ms", "12mss", ".s", "1e3ms", "--1s"):
        with pytest.raises(ValueError):
            parse_go_duration(bad)


def emitted(*argv: str) -> tuple[dict, str]:
    result = invoke(*argv, "--emit", "llm-d-sim")
    assert result.code == 0, result.stderr
    return yaml.safe_load(result.stdout), result.stdout


def test_every_key_is_a_flag_of_the_simulator_with_its_type():
    flags = sim_flags()
    assert flags["kv-cache-size"] == ("int", True) and flags["inter-token-latency"] == ("duration", True)
    assert "kv-cache-blocks" not in flags  # the list is not everything
    config, _ = emitted(*LLAMA)
    assert list(config) == ["model", "max-model-len", "max-num-seqs", "enable-kvcache", "kv-cache-size", "block-size",
                            "latency-calculator", "prefill-overhead", "prefill-time-per-token", "inter-token-latency",
                            "time-factor-under-load"]
    for key, value in config.items():
        kind, is_yaml_key = flags[key]
        assert is_yaml_key, key
        if kind == "duration":
            assert isinstance(value, str) and parse_go_duration(value) > 0, (key, value)
        elif kind == "int":
            assert isinstance(value, int) and not isinstance(value, bool), (key, value)
        elif kind == "float":
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (key, value)
        else:
            assert {"bool": bool, "string": str}[kind] is type(value), (key, value)
    assert config["latency-calculator"] == "per-token"  # pkg/common/config.go PerPromptTokenLatencyCalculator


# Hand arithmetic. meta-llama/Llama-3.1-8B (the bundled profile's config.json): 32 layers, 8 KV heads of 128, hidden
# 4096, 32 heads, intermediate 14336, vocab 128256, untied embeddings, bf16.
KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x heads x head size x 2 B = 131,072
PARAMS = (2 * 128256 * 4096  # embeddings and lm_head
          + 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)  # q, o, k, v, MLP, 2 norms
          + 4096)  # final norm: 8,030,261,248, the published 8.03B
WEIGHT_BYTES = 2 * PARAMS
# H100 SXM in kvplan/profiles/gpus.json: 3,350 GB/s and 989 dense bf16 TFLOP/s; kvplan.plan.steptime's datacenter
# prior: 75% of the bandwidth, 50% of the FLOP/s, 4 ms a step. Attention: 4 x layers x hidden FLOPs a (query, key) pair.
BANDWIDTH, FLOPS, STEP_OVERHEAD_S = 3350e9 * 0.75, 989e12 * 0.5, 0.004
ATTN_FLOPS_PER_PAIR = 4 * 32 * 4096


def step_s(tokens: int, kv_read: int, pairs: int) -> float:
    return (STEP_OVERHEAD_S + (WEIGHT_BYTES + kv_read * KV_BYTES_PER_TOKEN) / BANDWIDTH
            + (tokens * 2 * PARAMS + pairs * ATTN_FLOPS_PER_PAIR) / FLOPS)


def test_values_are_the_plans_pool_and_step_times_by_hand():
    config, text = emitted(*LLAMA)
    assert PARAMS == 8_030_261_248
    # the pool: 32 GiB / (16 tokens x 131,072 B) = 16,384 blocks (test_size_cli pins it), less the null block
    assert config["kv-cache-size"] == 32 * 2**30 // (16 * KV_BYTES_PER_TOKEN) - 1 == 16_383
    assert config["block-size"] == 16 and config["max-model-len"] == 32 * 1024
    # vLLM 0.32's default for `vllm serve` on a GPU of >= 70 GiB that is not an A100 (engine/arg_utils.py)
    assert config["max-num-seqs"] == 1024
    decode_ctx = 1000 + 200 // 2  # the mid-output context kvplan prices TPOT at
    itl_one = step_s(1, decode_ctx, decode_ctx)
    itl_full = step_s(1024, 1024 * decode_ctx, 1024 * decode_ctx)
    empty = step_s(0, 0, 0)  # 4 ms + the weights read once
    prompt = step_s(1000, 1000, 1000 * 1001 // 2)  # 1,000 tokens: one chunk of max_num_batched_tokens 8,192
    assert parse_go_duration(config["inter-token-latency"]) == round(itl_one * 1e9)
    assert parse_go_duration(config["prefill-overhead"]) == round(empty * 1e9)
    assert parse_go_duration(config["prefill-time-per-token"]) == round((prompt - empty) / 1000 * 1e9)
    assert config["time-factor-under-load"] == pytest.approx(itl_full / itl_one, abs=1e-6)
    assert 9.8 < config["time-factor-under-load"] < 9.9  # 103.6 ms / 10.48 ms
    assert "kvplan's KV onsets (first wait, first preemption) do not show in it" in text


def test_the_simulators_formulas_give_back_what_kvplan_size_prints():
    """The simulator's TTFT of the prompt alone and its ITL at c requests running (latencies.go: ITL x (1 + (f - 1)
    x (c - 1) / (max-num-seqs - 1))) against `kvplan size`'s own TTFT and TPOT at concurrency c."""
    config, _ = emitted(*LLAMA)
    ttft_ms = (parse_go_duration(config["prefill-overhead"]) + 1000 * parse_go_duration(config["prefill-time-per-token"])) / 1e6
    itl_ms = parse_go_duration(config["inter-token-latency"]) / 1e6
    factor, seqs = config["time-factor-under-load"], config["max-num-seqs"]
    for c in (1, 8, 100):
        result = invoke(*LLAMA, "-c", str(c), "--json")
        assert result.code == 0, result.stderr
        latency = json.loads(result.stdout)["latency"]
        assert ttft_ms == pytest.approx(latency["ttft_ms"], abs=0.05)  # printed to 0.1 ms
        assert itl_ms * (1 + (factor - 1) * (c - 1) / (seqs - 1)) == pytest.approx(latency["tpot_ms"], abs=0.005)


def test_a_calibrated_step_time_model(tmp_path):
    """--steptime RUN: the terms are the calibration's; its request overhead goes into prefill-overhead."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "steptime.json").write_text(json.dumps({"steptime": {
        "weight_bytes": 1e10, "kv_bytes_per_token": 100_000, "linear_flops_per_token": 1.6e10,
        "attn_flops_per_pair": 500_000, "bandwidth_bytes_s": 2e12, "peak_flops": 1e15, "mem_efficiency": 0.5,
        "compute_efficiency": 0.25, "overhead_s": 0.002, "source": "calibrated", "request_overhead_s": 0.003}}))
    result = invoke(*LLAMA, "--steptime", str(run), "--emit", "llm-d-sim", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    config = doc["llm_d_inference_sim"]
    # empty step: 2 ms + 1e10 B / (2e12 B/s x 0.5) = 12 ms; + 3 ms outside the steps
    assert parse_go_duration(config["prefill-overhead"]) == 15_000_000
    # one decode sequence at 1,100 tokens: 12 ms + 1,100 x 1e5 B / 1e12 B/s + (1.6e10 + 1,100 x 5e5) / 2.5e14 s
    assert parse_go_duration(config["inter-token-latency"]) == round((0.012 + 1.1e8 / 1e12 + 1.655e10 / 2.5e14) * 1e9)
    # the prompt, per token: 1e5 B / 1e12 B/s + (1.6e10 + 500.5 x 5e5) / 2.5e14 s
    assert parse_go_duration(config["prefill-time-per-token"]) == round((1e-7 + (1.6e10 + 500.5 * 5e5) / 2.5e14) * 1e9)
    assert doc["derivation"]["step_time"] == "calibrated on a bench run"


def test_json_and_out(tmp_path):
    config, _ = emitted(*LLAMA)
    as_json = invoke(*LLAMA, "--emit", "llm-d-sim", "--json")
    assert as_json.code == 0 and json.loads(as_json.stdout)["llm_d_inference_sim"] == config
    out = tmp_path / "sim.yaml"
    result = invoke(*LLAMA, "--emit", "llm-d-sim", "--out", str(out), "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["num_blocks"] == 16_384  # stdout: the plan, as without --emit
    assert yaml.safe_load(out.read_text()) == config
    assert str(out) in result.stderr
    report = invoke(*LLAMA, "--emit", "llm-d-sim", "--out", str(out))
    assert report.code == 0 and "16,384" in report.stdout and "vllm serve" in report.stdout


def test_kv_groups_share_the_pool_and_replicas_are_data_parallel_ranks():
    # openai/gpt-oss-20b: 24 layers, 12 sliding and 12 full, in vLLM's 2 groups of 12; 8 KV heads of 64, bf16:
    # a block of 16 tokens is 12 x 16 x 2 x 8 x 64 x 2 B = 393,216 B; 12 GiB of it = 32,768 blocks, 32,767 usable,
    # a token takes a block in each group: 16,383 blocks each.
    config, text = emitted("size", "openai/gpt-oss-20b", "--gpu", "H100", "--kv-memory", "12GiB", "--ctx", "32k",
                           "--prompt", "1000", "--vllm-version", "0.33.0")
    assert config["kv-cache-size"] == (12 * 2**30 // (12 * 16 * 2 * 8 * 64 * 2) - 1) // 2 == 16_383
    assert "2 KV groups" in text and "MoE" in text
    config, _ = emitted("size", "meta-llama/Llama-3.1-8B", "--gpu", "2xH100", "--tp", "1", "--kv-memory", "32GiB",
                        "--ctx", "32k", "--prompt", "1000", "--output", "200", "--vllm-version", "0.33.0")
    assert config["data-parallel-size"] == 2 and config["kv-cache-size"] == 16_383  # a rank is one replica


def test_a_hostile_model_name_stays_one_yaml_string(tmp_path):
    folder = tmp_path / 'x"y: z # w'
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 8192}))
    config, text = emitted("size", str(folder), "--gpu", "L4", "--prompt", "100")
    assert config["model"].endswith('x"y: z # w')
    assert all(line.startswith("#") or ": " in line for line in text.splitlines())


@pytest.mark.parametrize(("argv", "says"), [
    (("--ctx", "8k", "--gpu", "H100", "--out", "x.yaml"), "--out is the file of --emit"),
    (("--ctx", "8k", "--gpu", "H100", "--emit", "llm-d-sim"), "--prompt"),
    (("--ctx", "8k", "--gpu", "H100", "--prompt", "100", "--emit", "llm-d-sim", "--engine", "sglang"), "vLLM plans"),
    (("--ctx", "8k", "--gpu", "H100", "--prompt", "100", "--emit", "llm-d-sim", "--block-size", "256"), "8, 16, 32"),
    (("--ctx", "8k", "--gpu", "16xH100", "--tp", "1", "--prompt", "100", "--emit", "llm-d-sim"), "at most 8"),
    (("--ctx", "8k", "--gpu-mem", "80GiB", "--prompt", "100", "--emit", "llm-d-sim"), "--steptime"),
    (("--ctx", "8k", "--gpu", "2xH100", "--dcp", "2", "--prompt", "100", "--emit", "llm-d-sim"), "context parallel"),
    (("--ctx", "8k", "--gpu", "H100", "--kv-memory", "1MiB", "--prompt", "100", "--emit", "llm-d-sim"), "no pool"),
    (("--ctx", "8k", "--gpu", "H100", "--prompt", "100", "--emit", "llm-d"), "--emit"),
])
def test_bad_combinations_are_one_line_and_exit_2(argv, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("size", "meta-llama/Llama-3.1-8B", *argv)
    assert result.code == 2 and result.stdout == ""
    assert says in result.one_line_error()
    assert not (tmp_path / "x.yaml").exists()


def test_out_into_a_folder_is_refused(tmp_path):
    result = invoke(*LLAMA, "--emit", "llm-d-sim", "--out", str(tmp_path))
    assert result.code == 2 and "not a regular file" in result.one_line_error()
