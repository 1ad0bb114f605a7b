"""`kvplan gpus`, `kvplan models`, `kvplan schema`: what kvplan knows, for people and scripts."""

from __future__ import annotations

import typer

from kvplan.cli.common import print_json, user_errors


@user_errors
def gpus(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the GPU catalog (profiles/gpus.json): memory, bandwidth, dense BF16 TFLOP/s.

    Example: kvplan gpus
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
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    from kvplan.cli.common import make_console

    table = Table(show_edge=False)
    for col in ("GPU", "driver MiB", "CUDA total GiB", "GB/s", "BF16 TFLOP/s"):
        table.add_column(col, justify="left" if col == "GPU" else "right")
    for r in rows:
        total = f"{r['cuda_total_gib']:.2f}" + ("" if r["cuda_total_measured"] else "*")
        table.add_row(r["name"], f"{r['memory_mib']:,}", total, f"{r['bandwidth_gbps'] or '-'}",
                      f"{r['bf16_dense_tflops'] or '-'}")
    console = make_console()
    console.print(table)
    console.print("* estimated: driver total minus the median reserve of the measured rows")


@user_errors
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the bundled model profiles (work offline).

    Example: kvplan models
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
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    from kvplan.cli.common import make_console

    table = Table(show_edge=False)
    for col in ("model", "attention", "KV B/token", "params (B)"):
        table.add_column(col, justify="left" if col in ("model", "attention") else "right")
    for r in rows:
        table.add_row(r["model"], r["attention"], f"{r['kv_bytes_per_token']:,}", f"{r['params_b']:,}")
    make_console().print(table)


SCHEMAS = {
    "size": ("kvplan.plan.schema", "SizePlan"),
    "check": ("kvplan.gate.check", "CheckReport"),
    "check-log": ("kvplan.gate.checklog", "CheckLogResult"),
    "validate": ("kvplan.validate.runner", "Validation"),
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
    print_json(TypeAdapter(getattr(importlib.import_module(module), cls)).json_schema())
