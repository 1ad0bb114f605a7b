"""llm-d-benchmark's benchmark report v0.2 as the tests check it: llm-d-benchmark's own JSON Schema, vendored as
tests/data/llm-d-benchmark/br_v0_2_json_schema.json (its source and version: tests/data/README.md), plus the rules of
its pydantic model that the JSON Schema cannot carry (schema_errors). Used by tests/bench/test_llmd_report.py on the
stored runs and by tests/bench/test_bench_engine.py on a real CPU-engine run."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import jsonschema
import yaml

from kvplan.bench.outputs.llmd import FILE_PREFIX

ROOT = Path(__file__).resolve().parents[1]  # tests/
SCHEMA = json.loads((ROOT / "data" / "llm-d-benchmark" / "br_v0_2_json_schema.json").read_text())

#: The units each Statistics may carry: the model validators of llm-d-benchmark's schema_v0_2.py (check_units of
#: AggregateRequests, AggregateLatency, AggregateThroughput, ResourceMetrics), which its JSON Schema cannot say.
UNITS = {
    ("requests", "input_length"): {"count", "pixels"}, ("requests", "output_length"): {"count", "pixels"},
    ("latency", "time_to_first_token"): {"ms", "s"}, ("latency", "request_latency"): {"ms", "s"},
    ("latency", "inter_token_latency"): {"ms/token", "s/token"},
    ("latency", "time_per_output_token"): {"ms/token", "s/token"},
    ("latency", "normalized_time_per_output_token"): {"ms/token", "s/token"},
    ("throughput", "input_token_rate"): {"tokens/s"}, ("throughput", "output_token_rate"): {"tokens/s"},
    ("throughput", "total_token_rate"): {"tokens/s"}, ("throughput", "request_rate"): {"queries/s"},
    ("aggregate", "kv_cache_usage"): {"percent", "fraction"}, ("aggregate", "running_requests"): {"count", "pixels"},
    ("aggregate", "waiting_requests"): {"count", "pixels"},
}


def schema_errors(report: dict) -> list[str]:
    """Every way ``report`` breaks the vendored v0.2 schema or its unit rules; [] when it is a valid report."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    # an optional field is anyOf [Statistics, null]: name the deepest error, not "not valid under any of the schemas"
    leaves = [jsonschema.exceptions.best_match([e]) for e in validator.iter_errors(report)]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in leaves]
    perf = report.get("results", {}).get("request_performance", {}).get("aggregate", {})
    sections = [(name, perf.get(name) or {}) for name in ("requests", "latency", "throughput")]
    sections += [("aggregate", c.get("aggregate") or {})
                 for c in report.get("results", {}).get("observability", {}).get("components") or []]
    for section, fields in sections:
        for field, stats in fields.items():
            allowed = UNITS.get((section, field))  # None: a field the schema lacks (its error is above)
            if isinstance(stats, dict) and allowed is not None and stats.get("units") not in allowed:
                errors.append(f"{section}.{field}: units {stats['units']!r}")
    # Field(ge=...) on a union, which pydantic writes into the JSON Schema as an unknown "ge" keyword (ignored by
    # validators): LoadStandardized.concurrency >= 1 (an integer, or .inf) and SequenceLength.value >= 0
    load = (report.get("scenario") or {}).get("load") or {}
    standardized = load.get("standardized") or {}
    concurrency = standardized.get("concurrency")
    if concurrency is not None and not (concurrency >= 1 and (isinstance(concurrency, int) or concurrency == math.inf)):
        errors.append(f"scenario.load.standardized.concurrency: {concurrency!r}")
    for key in ("input_seq_len", "output_seq_len"):
        if (standardized.get(key) or {}).get("value", 0) < 0:
            errors.append(f"scenario.load.standardized.{key}.value < 0")
    for key in ("start", "end"):  # ISO-8601 (the schema's date-time, which jsonschema checks only with extras)
        if key in report.get("run", {}).get("time", {}):
            datetime.fromisoformat(report["run"]["time"][key])
    return errors


def assert_valid_llmd_reports(run_dir: Path) -> dict[int, dict]:
    """The run folder's benchmark reports (one a point, by seq), each valid; called by the engine test too."""
    summary = json.loads((run_dir / "summary.json").read_text())
    files = sorted(run_dir.glob(f"{FILE_PREFIX}*.yaml"))
    assert [f.name for f in files] == sorted(f"{FILE_PREFIX}{p['seq']}.yaml" for p in summary["points"] if p["requests"])
    reports = {}
    for f in files:
        report = yaml.safe_load(f.read_text())
        assert schema_errors(report) == [], f.name
        reports[report["scenario"]["load"]["standardized"]["stage"]] = report
    return reports
