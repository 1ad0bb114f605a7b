"""`kvplan schema NAME` describes what the command's --json really prints: every key the output has is in the
schema, every key the schema requires is in the output, at every level, and pydantic validates the output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from typer.testing import CliRunner

from kvplan.bench.results import BenchSummary
from kvplan.cli.app import app
from kvplan.engines import EnginePools
from kvplan.gate.enginelog import EngineLogResult
from kvplan.plan.schema import FitOutput, FleetFitOutput, SizePlan
from kvplan.validate.engine_reports import EngineValidation

ENV = {"HF_HUB_OFFLINE": "1"}
ENGINE_LOGS = Path(__file__).resolve().parents[1] / "engines" / "data"


def _json(*args: str):
    result = CliRunner().invoke(app, list(args), env=ENV)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def _same_keys(data, schema: dict, defs: dict, where: str = "$") -> None:
    """Walk the output beside its schema: an object has no key its schema does not declare, and every key
    the schema requires (fields with a default, such as a summary's later additions, may be left out)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema:  # X | None: follow the branch that matches
        if data is None:
            return
        schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
        return _same_keys(data, schema, defs, where)
    if isinstance(data, dict) and "properties" in schema:
        undeclared = set(data) - set(schema["properties"])
        missing = set(schema.get("required", ())) - set(data)
        assert not undeclared and not missing, f"{where}: undeclared {undeclared}, missing {missing}"
        for key, value in data.items():
            _same_keys(value, schema["properties"][key], defs, f"{where}.{key}")
    elif isinstance(data, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in data.items():
            _same_keys(value, schema["additionalProperties"], defs, f"{where}.{key}")
    elif isinstance(data, list) and "items" in schema:
        for i, value in enumerate(data):
            _same_keys(value, schema["items"], defs, f"{where}[{i}]")


@pytest.mark.parametrize("name, cls, args", [
    ("size-engines", EnginePools, ["size", "Qwen/Qwen3-32B", "--gpu", "2xH100", "--ctx", "32k", "--engine", "all",
                                   "--json"]),
    ("fit", FitOutput, ["fit", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "-c", "8", "--json"]),
    # with SLOs: the simulator's prediction and the per-SLO checks are filled in
    ("fit", FitOutput, ["fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "-c", "32", "--prompt", "2k", "--output",
                        "256", "--gpus", "H100,L40S", "--slo", "ttft_p99=500ms,itl_p99=50ms", "--json"]),
    # with a rate: the fleets (kvplan fit --rate)
    ("fit-rate", FleetFitOutput, ["fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--prompt", "2k", "--output", "256",
                                  "--gpus", "H100", "--slo", "ttft_p99=2s", "--rate", "20", "--json"]),
    # ... with their P/D pairs (--pd)
    ("fit-rate", FleetFitOutput, ["fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--prompt", "2k", "--output", "256",
                                  "--gpus", "H100", "--max-gpus", "2", "--slo", "ttft_p99=2s,tpot_p99=50ms", "--rate",
                                  "20", "--pd", "--json"]),
    ("size", SizePlan, ["size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "4090", "--prompt", "1k", "--json"]),
    # an SGLang start-up log (with its full budget) and the engines' reports
    ("check-log-engines", EngineLogResult, ["check-log", str(ENGINE_LOGS / "sglang-0.4.3-qwq32b-4xL4.log"), "--model",
                                            "Qwen/Qwen2.5-32B", "--gpu", "4xL4", "--gate", "all", "--json"]),
    ("check-log-engines", EngineLogResult, ["check-log", str(ENGINE_LOGS / "trtllm-1.1.0rc3-gpt-oss-120b-dgx-spark.log"),
                                            "--model", "openai/gpt-oss-120b", "--tp", "1", "--json"]),
    ("validate-engines", EngineValidation, ["validate", "--engine", "trtllm", "--json"]),
    # the CPU tier with its reload rows, and a P/D transfer
    ("size", SizePlan, ["size", "meta-llama/Llama-3.1-8B", "--ctx", "32k", "--gpu", "2xH100", "--tp", "2",
                        "--kv-offloading-size", "64", "--pd-decode-tp", "1", "--json"]),
])
def test_the_schema_describes_the_output(name, cls, args):
    schema = _json("schema", name)
    data = _json(*args)
    _same_keys(data, schema, schema.get("$defs", {}))
    TypeAdapter(cls).validate_python(data)
    if name == "fit-rate":
        assert data["fleets"] and all(f["slo"]["ttft_p99"]["met"] for f in data["fleets"] if f["replicas"])
        if "--pd" in args:
            assert any(f["pd"]["replicas"] for f in data["fleets"])
    if name == "fit":
        assert data["deployments"], "a fit that shows no deployment checks nothing below the top level"
        assert any(d["latency_estimate"] for d in data["deployments"])
        if "--slo" in args:
            assert any(d["latency_predicted"] and d["slo"] for d in data["deployments"])


@pytest.mark.parametrize("report", ["vllm-bench-serve-c16.json", "guidellm-sweep.json"])
def test_report_json_is_the_bench_summary_schema(report):
    """`kvplan report --json` of one result is one BenchSummary (`kvplan schema report`)."""
    path = Path(__file__).resolve().parents[1] / "bench" / "data" / report
    schema = _json("schema", "report")
    data = _json("report", str(path), "--json")
    _same_keys(data, schema, schema.get("$defs", {}))
    TypeAdapter(BenchSummary).validate_python(data)
    assert data["points"]


@pytest.mark.parametrize("name, cls", [("gpus", "GpuRow"), ("models", "ModelRow")])
def test_the_catalog_listings_have_their_schema(name, cls):
    """`kvplan schema gpus|models`: a list of typed rows, each row of the real output declared and validated."""
    import kvplan.plan.schema as records

    schema = _json("schema", name)
    data = _json(name, "--json")
    assert schema["type"] == "array" and data
    _same_keys(data, schema, schema.get("$defs", {}))
    TypeAdapter(list[getattr(records, cls)]).validate_python(data)


def test_calibrate_json_is_its_schema(tmp_path, monkeypatch):
    """Both modes of `kvplan calibrate --json`: a start-up log (kv043's, vLLM 0.15.1 on an A100 40GB) and a bench
    run's step time (the old CPU run kept in tests/bench/data)."""
    import shutil

    from kvplan.plan.schema import CalibrateOutput, StartupCalibrationOutput, StepTimeCalibrationOutput
    from kvplan.validate.reports import load_reports

    monkeypatch.setenv("KVPLAN_CONFIG_DIR", str(tmp_path / "config"))
    schema = _json("schema", "calibrate")
    log = tmp_path / "vllm.log"
    log.write_text(next(r for r in load_reports() if r.case_id == "kv043").quote + "\n")
    startup = _json("calibrate", str(log), "--gpu", "A100 40GB", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                    "--usage", "llm", "--json")
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "bench" / "data" / "old-run-conc", run)
    steptime = _json("calibrate", "--bench", str(run), "--model", "meta-llama/Llama-3.1-8B-Instruct", "--json")
    for data, cls in ((startup, StartupCalibrationOutput), (steptime, StepTimeCalibrationOutput)):
        branch = next(s for s in schema["anyOf"] if s["$ref"].endswith(cls.__name__))
        _same_keys(data, branch, schema.get("$defs", {}))
        assert isinstance(TypeAdapter(CalibrateOutput).validate_python(data), cls)
    assert startup["profile"] and steptime["written"].endswith("steptime.json")
