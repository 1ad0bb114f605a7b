"""`kvplan gpus`, `kvplan models`, `kvplan schema`: what kvplan knows, for people and scripts."""

from __future__ import annotations

import typer

from kvplan.cli.common import print_json, user_errors
from kvplan.cli.tables import Column, OutputFormat, chosen_format, emit_rows, format_option


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


@user_errors
def gpus(
    as_json: bool = typer.Option(False, "--json", help="Print JSON (same as --format json).", rich_help_panel="Output"),
    fmt: OutputFormat = format_option(),
) -> None:
    """List the GPU catalog (profiles/gpus.json): memory, bandwidth, dense BF16 TFLOP/s.

    Examples: kvplan gpus; kvplan gpus --format csv > gpus.csv
    """
    from kvplan.hardware.catalog import load_catalog

    devices, _ = load_catalog()
    rows = [
        {
            "name": d.name,
            "memory_mib": d.memory_bytes // 2**20,
            "cuda_total_gib": round(d.cuda_total_bytes / 2**30, 2),
            "cuda_total_measured": d.cuda_total_measured,
            "bandwidth_gbps": d.bandwidth_gbps,
            "bf16_dense_tflops": d.bf16_dense_tflops,
        }
        for d in devices.values()
    ]
    shown = [{**r, "cuda_total": f"{r['cuda_total_gib']:.2f}" + ("" if r["cuda_total_measured"] else "*")}
             for r in rows]
    fmt = chosen_format(fmt, as_json)
    columns = [Column("name", "GPU", right=False, whole=True), Column("memory_mib", "driver MiB", "{:,}".format),
               Column("cuda_total", "CUDA total GiB"), Column("bandwidth_gbps", "GB/s", _or_dash),
               Column("bf16_dense_tflops", "BF16 TFLOP/s", _or_dash)]
    emit_rows(rows if fmt in (OutputFormat.json, OutputFormat.csv) else shown, columns, fmt,
              footnote="* estimated: driver total minus the median reserve of the measured rows")


@user_errors
def models(
    as_json: bool = typer.Option(False, "--json", help="Print JSON (same as --format json).", rich_help_panel="Output"),
    fmt: OutputFormat = format_option(),
) -> None:
    """List the bundled model profiles (work offline).

    Examples: kvplan models; kvplan models --format markdown
    """
    from kvplan.model.arch import parse_architecture
    from kvplan.model.dtypes import kv_dtype
    from kvplan.model.source import bundled_names, load_bundled

    rows = []
    for name in bundled_names():
        cfg = load_bundled(name)
        assert cfg is not None
        arch = parse_architecture(cfg.config)
        bpt = sum(s.bytes_per_token(kv_dtype(arch.model_dtype)) for s in arch.layers)
        rows.append({"model": name, "attention": arch.attention_label, "kv_bytes_per_token": int(bpt),
                     "params_b": round(arch.params.total / 1e9, 2)})
    columns = [Column("model", "model", right=False, whole=True), Column("attention", "attention", right=False),
               Column("kv_bytes_per_token", "KV B/token", "{:,}".format), Column("params_b", "params (B)", "{:,}".format)]
    emit_rows(rows, columns, chosen_format(fmt, as_json))


SCHEMAS = {
    "size": ("kvplan.plan.schema", "SizePlan"),
    "size-engines": ("kvplan.engines.base", "EnginePools"),  # kvplan size --engine sglang|all
    "gpus": ("kvplan.plan.schema", "list[GpuRow]"),
    "models": ("kvplan.plan.schema", "list[ModelRow]"),
    "fit": ("kvplan.plan.schema", "FitOutput"),
    "fit-rate": ("kvplan.plan.schema", "FleetFitOutput"),  # kvplan fit --rate R
    "check": ("kvplan.gate.check", "CheckReport"),
    "check-log": ("kvplan.gate.checklog", "CheckLogResult"),
    "check-log-engines": ("kvplan.gate.enginelog", "EngineLogResult"),  # an SGLang or TensorRT-LLM log
    "validate": ("kvplan.validate.runner", "Validation"),
    "validate-engines": ("kvplan.validate.engine_reports", "EngineValidation"),  # --engine sglang|trtllm
    "calibrate": ("kvplan.plan.schema", "CalibrateOutput"),  # a start-up log's record, or --bench RUN's step time
    "bench": ("kvplan.bench.results", "BenchSummary"),  # also summary.json
    "report": ("kvplan.bench.results", "BenchSummary"),  # one summary, or a list of them for several runs
}


@user_errors
def schema(
    name: str = typer.Argument("size", help=f"Which command's --json output: {', '.join(SCHEMAS)}."),
) -> None:
    """Print the JSON Schema of a command's --json output.

    Example: kvplan schema size > size.schema.json
    """
    import importlib

    from pydantic import TypeAdapter

    from kvplan.errors import KvplanError

    if name not in SCHEMAS:
        raise KvplanError(f"unknown schema {name!r}", f"choose one of {', '.join(SCHEMAS)}")
    module, cls = SCHEMAS[name]
    many = cls.startswith("list[")  # a command that prints a list of records
    record = getattr(importlib.import_module(module), cls.removeprefix("list[").removesuffix("]"))
    print_json(TypeAdapter(list[record] if many else record).json_schema())
