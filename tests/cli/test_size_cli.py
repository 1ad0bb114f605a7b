"""`kvplan size` end to end through the real CLI: exit codes, JSON, and the bad-input corpus."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.plan.schema import SizePlan

runner = CliRunner()
from helpers.harness import invoke  # noqa: E402


def run(*args):
    if args[:1] in (("size",), ("fit",)) and "--vllm-version" not in args:
        args = (*args, "--vllm-version", "0.33.0")  # the release these figures were worked for
    return runner.invoke(app, list(args))


def test_seed_command_fits_and_prints_the_numbers():
    result = run("size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "4090")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "131,072" in out and "KV cache size" in out and "vllm serve meta-llama/Llama-3.1-8B" in out
    assert "bundled" in out


def test_json_has_the_contract_fields_and_validates():
    result = run("size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "4090", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)  # nothing but JSON on stdout
    for key in ("model", "gpu", "kv_bytes_per_token", "block_size", "num_blocks", "kv_cache_tokens",
                "available_kv_bytes", "weights_bytes", "max_concurrency", "fits"):
        assert key in data
    assert data["kv_bytes_per_token"] == 131_072 and data["block_size"] == 16
    plan = TypeAdapter(SizePlan).validate_python(data)
    assert plan.fits is True


def test_exit_1_when_it_does_not_fit_with_suggestions():
    result = run("size", "meta-llama/Llama-3.1-70B", "--ctx", "128k", "--gpu", "H100", "-c", "8", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["fits"] is False and data["suggestions"]
    assert any("bigger GPU" in s["change"] or "tensor parallel" in s["change"] for s in data["suggestions"])


def test_no_start_up_lines_when_vllm_stops_before_printing_them():
    """vLLM raises in `_check_enough_kv_cache_memory` before it reports the pool
    (v1/core/kv_cache_utils.py@0.32.0), so kvplan must not quote lines it never prints. Llama-3.1-70B
    at 128k on one 80 GB H100: 70.6e9 bf16 parameters are ~131 GiB of weights alone (no memory left);
    at 8k with --kv-memory 1GiB: one 8,192-token request needs 8,192 x 327,680 B = 2.5 GiB (too big)."""
    for args in (("--ctx", "128k"), ("--ctx", "8k", "--kv-memory", "1GiB")):
        result = run("size", "meta-llama/Llama-3.1-70B", "--gpu", "H100-SXM", *args, "--json")
        assert result.exit_code == 1, result.output
        assert json.loads(result.stdout)["vllm_startup_lines"] == []
        table = run("size", "meta-llama/Llama-3.1-70B", "--gpu", "H100-SXM", *args)
        assert "stops at start-up before printing its KV cache size" in table.stdout
        assert "would print" not in table.stdout


def test_negative_ranges_are_not_written_with_a_dash():
    result = run("size", "meta-llama/Llama-3.1-70B", "--ctx", "128k", "--gpu", "H100-SXM")
    line = next(x for x in result.stdout.splitlines() if "available KV cache" in x)
    assert " to -" in line and "--" not in line, line


def test_kv_memory_skips_the_budget_and_matches_the_seed_pool():
    result = run("size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--kv-memory", "32GiB", "--ctx", "32k", "--json")
    data = json.loads(result.stdout)
    assert data["num_blocks"] == 16_384 and data["max_concurrency"] == 8.0


def test_multi_gpu_defaults_tp_to_the_gpu_count():
    data = json.loads(run("size", "meta-llama/Llama-3.1-70B", "--gpu", "4xH100", "--ctx", "32k", "--json").stdout)
    assert data["tensor_parallel_size"] == 4 and data["gpu_count"] == 4
    assert data["kv_bytes_per_token_per_device"] == 327_680 / 4


def test_replicas_when_gpus_exceed_tp():
    data = json.loads(run("size", "meta-llama/Llama-3.1-8B", "--gpu", "4xH100", "--tp", "2", "--ctx", "32k",
                          "--json").stdout)
    assert data["replicas"] == 2


def test_schema_command_prints_a_json_schema():
    result = run("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert "kv_bytes_per_token" in schema["properties"]


def test_local_config_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 8192}))
    data = json.loads(run("size", str(tmp_path), "--gpu", "L4", "--json").stdout)
    assert data["model_source"] == "local"
    assert data["kv_bytes_per_token"] == 2 * 16 * 8 * 64 * 2  # 32,768


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072}


def bad_inputs(tmp_path):
    """(name, argv) pairs: each must exit 2 with one line on stderr and no traceback."""
    m = "meta-llama/Llama-3.1-8B"
    garbage = tmp_path / "binary.json"
    garbage.write_bytes(b"\xff\xfe\x00\x81 not text")
    return [
        ("malformed json", ["size", _write(tmp_path, "bad.json", "{not json"), "--gpu", "H100"]),
        ("json array", ["size", _write(tmp_path, "arr.json", "[1, 2]"), "--gpu", "H100"]),
        ("missing layers", ["size", _write(tmp_path, "m1.json", {"model_type": "x", "hidden_size": 8}), "--gpu", "H100"]),
        ("empty config", ["size", _write(tmp_path, "m2.json", {}), "--gpu", "H100"]),
        ("unknown model_type", ["size", _write(tmp_path, "m3.json", {"model_type": "foo"}), "--gpu", "H100"]),
        ("zero layers", ["size", _write(tmp_path, "m4.json", {**LLAMA, "num_hidden_layers": 0}), "--gpu", "H100"]),
        ("bad layer_types length", ["size", _write(tmp_path, "m5.json", {**LLAMA, "layer_types": ["full_attention"]}),
                                    "--gpu", "H100"]),
        ("unknown layer type", ["size", _write(tmp_path, "m6.json", {**LLAMA, "layer_types": ["weird"] * 32}),
                                "--gpu", "H100"]),
        ("sliding without window", ["size", _write(tmp_path, "m7.json",
                                                   {**LLAMA, "layer_types": ["sliding_attention"] * 32}), "--gpu", "H100"]),
        ("unsupported quantization", ["size", _write(tmp_path, "m8.json",
                                                     {**LLAMA, "quantization_config": {"quant_method": "weird"}}),
                                      "--gpu", "H100"]),
        ("unreadable file", ["size", str(garbage), "--gpu", "H100"]),
        ("missing local path", ["size", "./no/such/model", "--gpu", "H100"]),
        ("unknown model", ["size", "nobody/no-such-model-xyz", "--gpu", "H100"]),
        ("empty model", ["size", " ", "--gpu", "H100"]),
        ("tp does not divide heads", ["size", m, "--gpu", "3xH100", "--tp", "3"]),
        ("tp does not divide kv heads", ["size", _write(tmp_path, "m9.json", {**LLAMA, "num_attention_heads": 24,
                                                                             "num_key_value_heads": 6}),
                                         "--gpu", "4xH100", "--tp", "4"]),
        ("zero context", ["size", m, "--gpu", "H100", "--ctx", "0"]),
        ("negative context", ["size", m, "--gpu", "H100", "--ctx=-5"]),
        ("context not a number", ["size", m, "--gpu", "H100", "--ctx", "abc"]),
        ("context bad suffix", ["size", m, "--gpu", "H100", "--ctx", "32q"]),
        ("fractional context", ["size", m, "--gpu", "H100", "--ctx", "1.5"]),
        ("unknown gpu", ["size", m, "--gpu", "H900"]),
        ("no gpu", ["size", m]),
        ("bad gpu memory unit", ["size", m, "--gpu-mem", "24XB"]),
        ("negative gpu memory", ["size", m, "--gpu-mem=-3GiB"]),
        ("utilization above 1", ["size", m, "--gpu", "H100", "--gpu-memory-utilization", "1.5"]),
        ("utilization not a number", ["size", m, "--gpu", "H100", "--util", "most"]),
        ("zero kv memory", ["size", m, "--gpu", "H100", "--kv-memory", "0"]),
        ("unknown kv dtype", ["size", m, "--gpu", "H100", "--kv-cache-dtype", "fp3"]),
        ("fp8_ds_mla on a non-MLA model", ["size", m, "--gpu", "H100", "--kv-cache-dtype", "fp8_ds_mla"]),
        ("zero tp", ["size", m, "--gpu", "H100", "--tp", "0"]),
        ("zero concurrency", ["size", m, "--gpu", "H100", "-c", "0"]),
        ("zero block size", ["size", m, "--gpu", "H100", "--block-size", "0"]),
        ("prompt longer than context", ["size", m, "--gpu", "H100", "--ctx", "32k", "--prompt", "40k"]),
        ("shared prefix longer than request", ["size", m, "--gpu", "H100", "--prompt", "1k", "--output", "10",
                                               "--shared-prefix", "4k"]),
        ("bad vllm version", ["size", m, "--gpu", "H100", "--vllm-version", "banana"]),
        ("bad source", ["size", m, "--gpu", "H100", "--source", "nowhere"]),
        ("bad usage", ["size", m, "--gpu", "H100", "--usage", "batch"]),
        ("zero gpus", ["size", m, "--gpu", "0xH100"]),
        ("gpu counts disagree", ["size", m, "--gpu", "4xH100", "--gpus", "2"]),
        ("pp beyond layers", ["size", m, "--gpu", "64xH100", "--pp", "64", "--tp", "1"]),
        ("tp x pp beyond gpus", ["size", m, "--gpu", "H100", "--tp", "2"]),
        ("bad --set", ["size", m, "--gpu", "H100", "--set", "garbage"]),
        ("--set with a string for a count", ["size", m, "--gpu", "H100", "--set", "num_key_value_heads=abc"]),
        ("--set with a fraction for a count", ["size", m, "--gpu", "H100", "--set", "num_key_value_heads=4.5"]),
        ("config with a list for a count", ["size", _write(tmp_path, "m10.json", {**LLAMA, "head_dim": [1]}),
                                            "--gpu", "H100"]),
        ("memory without a unit", ["size", m, "--gpu-mem", "24"]),
        ("block size vLLM refuses", ["size", m, "--gpu", "H100", "--block-size", "7"]),
        ("batched tokens below max_num_seqs", ["size", m, "--gpu", "H100", "--max-num-seqs", "256",
                                               "--max-num-batched-tokens", "16"]),
    ]


def test_bad_input_corpus(tmp_path):
    """Through the real entry point, as a user's shell runs it (click's own usage errors included)."""
    cases = bad_inputs(tmp_path)
    assert len(cases) >= 30
    for name, argv in cases:
        result = invoke(*argv)
        assert result.code == 2, f"{name}: exit {result.code}\n{result.stdout}{result.stderr}"
        err = result.stderr.strip()
        assert "Traceback" not in result.stdout + result.stderr, name
        assert len(err.splitlines()) == 1 and err.startswith("error:"), f"{name}: {err!r}"
        assert result.stdout == "", f"{name}: stdout not empty"


def test_a_real_process_gives_one_line_and_exit_2():
    # Through the console entry point, as a user runs it (no CliRunner in between).
    proc = subprocess.run([sys.executable, "-m", "kvplan", "size", "meta-llama/Llama-3.1-8B", "--gpu", "H900"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: unknown GPU 'H900'") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_gpu_auto_without_a_driver_is_a_clear_error():
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("an NVIDIA driver is present: --gpu auto would succeed here")
    result = run("size", "meta-llama/Llama-3.1-8B", "--gpu", "auto")
    assert result.exit_code == 2
    assert "--gpu auto" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["-c", "1.5"], ["--nope"], ["--tp", "two"]])
def test_option_type_errors_are_one_line_too(argv):
    # Click's own usage errors, through the real entry point: one line, exit 2.
    proc = subprocess.run([sys.executable, "-m", "kvplan", "size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "kvplan size --help" in lines[0]


def test_context_beyond_the_model_does_not_fit_and_the_fix_respects_the_limit():
    data = json.loads(run("size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "200k", "--json").stdout)
    assert data["fits"] is False and data["limiting_term"] == "max_model_len"
    assert data["suggestions"][0]["updates"] == {"max_model_len": "131072"}


def test_tensor_parallel_suggestion_names_the_gpus_it_needs():
    data = json.loads(run("size", "meta-llama/Llama-3.1-8B", "--gpu", "4090", "--ctx", "32k", "-c", "2",
                          "--json").stdout)
    tp = next(s for s in data["suggestions"] if s["change"].startswith("tensor parallel"))
    assert tp["fits"] and tp["flags"] == "--gpu 2xRTX-4090 --tp 2"
    assert tp["updates"] == {"gpu": "2xRTX-4090", "tensor_parallel_size": "2"}
    # The flag reads back: the suggested command fits.
    again = run("size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "-c", "2", *tp["flags"].split())
    assert again.exit_code == 0


def test_size_imports_neither_torch_nor_vllm():
    """`kvplan size` with kvplan's rules stays light: the engine is imported only for --layout engine."""
    import subprocess
    import sys

    code = ("import sys; from kvplan.cli.app import main_exit_code; "
            "rc = main_exit_code(['size', 'Qwen/Qwen3.5-27B', '--gpu', 'H100', '--ctx', '32k', '--json']); "
            "heavy = sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules); "
            "print(rc, heavy, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert out.stderr.strip().splitlines()[-1] == "0 []", out.stderr[-1000:]


def test_rich_markup_in_a_model_path_is_printed_as_text(tmp_path):
    import json

    folder = tmp_path / "x[/]y[bold]"  # "x[" holding "]y[bold]"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 8192}))
    result = run("size", str(folder), "--gpu", "H100", "--ctx", "4k")
    assert result.exit_code == 0, result.output
    assert "x[/]y[bold]" in result.output


@pytest.mark.parametrize("flag, value", [("--draft-layers", "100000000"), ("--tp", "1000000"), ("--pp", "99999"),
                                         ("--decode-context-parallel-size", "100000")])
def test_absurd_sizes_are_refused_before_any_work(flag, value):
    result = run("size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "8k", flag, value)
    assert result.exit_code == 2, result.output


def test_a_fits_that_holds_at_the_estimate_only_says_so_and_strict_exits_1():
    """The README's first example (issue 21 item 3). One 32,768-token request of Llama-3.1-8B needs
    32,768 x 131,072 B = 4.00 GiB of KV (32 layers x 8 KV heads x 128 x 2 x 2 B a token). The estimate
    leaves more than that on a 4090; the low end of the budget range less: vLLM might not start there."""
    plain = run("size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "4090", "--json")
    assert plain.exit_code == 0
    data = json.loads(plain.stdout)
    assert data["available_kv_bytes_low"] < 4 * 2**30 <= data["available_kv_bytes"]
    assert data["fits"] is True and data["fits_across_range"] is False
    assert "low end" in data["range_note"] and "needs 4.00 GiB of KV" in data["range_note"]
    text = run("size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "4090")
    assert text.exit_code == 0 and "FITS at the estimate" in text.stdout and "not across the budget range" in text.stdout
    assert run("size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "4090", "--strict").exit_code == 1


def test_a_fits_across_its_range_passes_strict():
    """At 8k one request needs 8,192 x 131,072 B = 1 GiB, within even the low end."""
    result = run("size", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--gpu", "4090", "--json", "--strict")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["available_kv_bytes_low"] > 2**30
    assert data["fits_across_range"] is True and data["range_note"] is None


def test_a_does_not_fit_that_the_high_end_would_fit_says_so():
    """gpt-oss-120b at 128k on one H100: the estimate leaves too little for one request, the high end
    of the range enough (the verdict still says DOES NOT FIT, exit 1)."""
    result = run("size", "openai/gpt-oss-120b", "--ctx", "128k", "--gpu", "H100", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["fits"] is False and data["fits_across_range"] is False
    assert data["range_note"].startswith("at the high end of the budget range")


def test_size_workload_json_and_text(tmp_path):
    """--workload: the agent sample (kvplan/traffic/samples) on an 8B on an L4; bad files are exit 2."""
    from kvplan.paths import PROFILES_DIR

    sample = PROFILES_DIR.parent / "kvplan" / "traffic" / "samples" / "agent-sample.json"
    if not sample.is_file():  # an installed wheel: the package's own copy
        import kvplan.traffic

        sample = Path(kvplan.traffic.__file__).parent / "samples" / "agent-sample.json"
    result = run("size", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--ctx", "16k", "--workload", str(sample), "--json")
    assert result.exit_code == 0, result.output
    w = json.loads(result.stdout)["workload"]
    assert (w["requests"], w["sessions"], w["block_size"]) == (32, 8, 16)
    assert set(w["pool_for_share"]) == {"50%", "90%", "99%"}
    assert w["pool_for_share"]["50%"] <= w["pool_for_share"]["90%"] <= w["pool_for_share"]["99%"]
    text = run("size", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--ctx", "16k", "--workload", str(sample))
    assert text.exit_code == 0 and "Prefix cache" in text.stdout and "of the achievable hits" in text.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    out = run("size", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--workload", str(bad))
    assert out.exit_code == 2 and "bad.jsonl:1" in out.stderr


def test_help_names_the_releases_the_rules_give():
    """`size --help` once said async scheduling is on "from 0.32" where the rules (and vLLM's
    `VllmConfig.__post_init__`, config/vllm.py@0.14.1) say 0.14; the help now names the rule table's releases.
    Read in the wheels: on by default from 0.14.0; sliding windows hold 2 batches in flight from 0.26.0
    (`SlidingWindowSpec.max_admission_blocks_per_request`, kv_cache_interface.py@0.26.0); with --pp > 1 from 0.34.0,
    whose removal of the V1 model runner drops that exception (config/vllm.py@0.34.0:1637)."""
    import re

    r = invoke("size", "--help", env={"COLUMNS": "400"})
    text = re.sub(r"[\s│]+", " ", r.stdout)
    assert "async scheduling (on by default from 0.14.0, with --pp > 1 from 0.34.0; from 0.26.0 sliding-window" in text
