"""`kvplan validate` (predictions vs public vLLM start-up reports) and `kvplan calibrate`
(record a real start-up's measured overhead for later `size` runs)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from kvplan.cli.common import print_json, user_errors
from kvplan.cli.tables import Column, OutputFormat, chosen_format, emit_rows, format_option
from kvplan.term import esc, make_console
from kvplan.units import format_range


class ValidateMode(str, Enum):
    page = "page"
    full = "full"
    both = "both"


VALIDATE_EXAMPLES = """
Examples:

  kvplan validate                               # the shipped reports, both modes

  kvplan validate my-reports.jsonl --configs ./configs --json

  kvplan validate --mode page                   # page math only (given the reported KV memory)

  kvplan validate --fit                         # refit profiles/overhead.json on the reports, then validate

  kvplan validate --engine sglang               # the public SGLang start-ups (trtllm: TensorRT-LLM's)

  kvplan validate --engine all                  # every engine's reports and goal lines
"""

CALIBRATE_EXAMPLES = """
Examples:

  kvplan calibrate runs/2026-07-01-qwen3/       # a bench run folder (reads engine.log)

  kvplan calibrate vllm.log --gpu H100          # a saved start-up log; name the GPU if the log does not

  kvplan calibrate vllm.log --gpu H100 --json

  kvplan calibrate --bench runs/2026-07-01-qwen3/ --gpu H100   # fit the step-time model to the run's points
"""


@user_errors
def validate(
    reports: Path | None = typer.Argument(None, help="JSON-lines reports file (default: the shipped public reports)."),
    configs: Path | None = typer.Option(None, "--configs", help="Folder of config.json files (org--name.json or org/name/config.json), tried before the bundled profiles."),
    mode: ValidateMode = typer.Option(ValidateMode.both, "--mode", help="page (page math from the reported KV memory), full (from GPU and settings), or both."),
    fit: bool = typer.Option(False, "--fit", help="Refit the overhead model on the reports and write profiles/overhead.json first."),
    overhead_file: Path | None = typer.Option(None, "--overhead", help="Overhead model JSON to validate (default: profiles/overhead.json)."),
    engine: str = typer.Option("vllm", "--engine", help="vllm, sglang, trtllm or all: whose public start-up reports (a given REPORTS file is read as its rows say).", metavar="ENGINE"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    fmt: OutputFormat = format_option(),
) -> None:
    """Run the planner on every vLLM start-up report and print predicted vs reported figures.

    Page math: KV tokens, blocks and concurrency from the reported available KV memory.
    Full budget: available KV memory and weights from the GPU and settings alone.
    Each with the median and p90 absolute % error. --engine sglang|trtllm|all judges those engines'
    reports by their own rules, with each engine's goal lines.
    """
    from kvplan.errors import KvplanError

    engines = _engines_to_validate(engine, reports)
    if engines != ["vllm"]:
        if fit or overhead_file or ValidateMode(mode) is not ValidateMode.both:
            raise KvplanError("--fit, --overhead and --mode are vLLM's", "drop them for --engine sglang|trtllm|all")
        _validate_engines(engines, reports, configs, chosen_format(fmt, as_json))
        return
    from kvplan.plan.overhead import load_overhead
    from kvplan.validate.fit import run_fit, write_overhead
    from kvplan.validate.reports import DEFAULT_REPORTS
    from kvplan.validate.runner import validate as run_validate

    modes = {"both": ("page", "full"), "page": ("page",), "full": ("full",)}[ValidateMode(mode).value]
    fmt = chosen_format(fmt, as_json)
    if configs is not None and not configs.is_dir():
        raise KvplanError(f"--configs {configs} is not a folder")
    fit_result = None
    if fit:
        fit_result = run_fit(reports, configs)
        written = write_overhead(fit_result, reports or DEFAULT_REPORTS)
        load_overhead.cache_clear()
        if fmt is OutputFormat.table:
            typer.echo(f"wrote {written}", err=True)
    overhead = load_overhead(str(overhead_file)) if overhead_file else None
    if fmt in (OutputFormat.csv, OutputFormat.markdown):
        # one row per report, mode and quantity: predicted against reported
        result = run_validate(reports, configs, overhead, modes)
        rows = [{"case_id": res.case_id, "model": res.model, "mode": res.mode, "vllm_rules": res.vllm_rules,
                 "quantity": c.quantity, "predicted": c.predicted, "reported": c.reported, "error_pct": c.error_pct}
                for res in result.cases for c in res.comparisons]
        emit_rows(rows, COMPARISON_COLUMNS, fmt)
        return
    if fmt is OutputFormat.json:
        result = run_validate(reports, configs, overhead, modes)
        payload = result.model_dump()
        if fit_result is not None:
            payload["fit"] = fit_result.model_dump()
        print_json(payload)
        return

    console = make_console()
    with console.status("running the planner on the reports...") as status:
        result = run_validate(reports, configs, overhead, modes,
                              progress=lambda case_id: status.update(f"running the planner on {case_id}..."))
    if fit_result is not None:
        render_fit(console, fit_result)
    render(console, result)


def _engines_to_validate(engine: str, reports: Path | None) -> list[str]:
    """The engines whose reports run: --engine, or a given file's own (its rows' release field says)."""
    from kvplan.errors import KvplanError

    name = str(engine).strip().lower()
    if name not in ("vllm", "sglang", "trtllm", "all"):
        raise KvplanError(f"unknown engine {engine!r}", "use vllm, sglang, trtllm or all")
    if reports is not None:
        from kvplan.validate.engine_reports import engine_of_file

        if name == "all":
            raise KvplanError("--engine all runs the shipped reports", "pass a REPORTS file with one engine, or none")
        found = engine_of_file(reports) or "vllm"
        if name not in ("vllm", found):
            raise KvplanError(f"{reports} holds {found} reports, not {name}", f"pass --engine {found}")
        return [found]
    return ["vllm", "sglang", "trtllm"] if name == "all" else [name]


def _validate_engines(engines: list[str], reports: Path | None, configs: Path | None, fmt: OutputFormat) -> None:
    """SGLang and TensorRT-LLM reports (and vLLM's, for --engine all), each engine's goals printed."""
    from kvplan.validate.engine_reports import validate_engine
    from kvplan.validate.runner import validate as run_validate

    results = {e: (run_validate(reports, configs) if e == "vllm" else validate_engine(e, reports, configs))
               for e in engines}
    if fmt is OutputFormat.json:
        print_json(next(iter(results.values())) if len(results) == 1 else
                   {e: r.model_dump() for e, r in results.items()})
        return
    if fmt in (OutputFormat.csv, OutputFormat.markdown):
        rows = []
        for e, result in results.items():
            if e == "vllm":
                rows += [{"case_id": c.case_id, "engine": e, "mode": c.mode, "quantity": q.quantity,
                          "predicted": q.predicted, "reported": q.reported, "error_pct": q.error_pct}
                         for c in result.cases for q in c.comparisons]
                continue
            for c in result.cases:
                if c.page:
                    rows.append({"case_id": c.case_id, "engine": e, "mode": "page", "quantity": c.page.quantity,
                                 "predicted": c.page.predicted, "reported": c.page.reported,
                                 "error_pct": c.page.error_pct})
                if c.full:
                    rows.append({"case_id": c.case_id, "engine": e, "mode": "full", "quantity": "KV budget GiB",
                                 "predicted": c.full.predicted_gib, "reported": c.full.reported_gib,
                                 "error_pct": c.full.error_of_gpu_pct})
        emit_rows(rows, ENGINE_COLUMNS, fmt, footnote="full budget rows (SGLang, TensorRT-LLM): the error is a "
                  "share of the GPU's memory")
        return
    console = make_console()
    for e, result in results.items():
        if e == "vllm":
            render(console, result)
        else:
            render_engine(console, result)
        console.print()


ENGINE_COLUMNS = [Column("case_id", "case", right=False), Column("engine", "engine", right=False),
                  Column("mode", "mode", right=False), Column("quantity", "quantity", right=False),
                  Column("predicted", "predicted", lambda v: "" if v is None else f"{v:,.4g}"),
                  Column("reported", "reported", lambda v: "" if v is None else f"{v:,.4g}"),
                  Column("error_pct", "error %", lambda v: "" if v is None else f"{v:+.2f}")]


def render_engine(console, result) -> None:
    from rich.table import Table

    from kvplan.validate.engine_reports import LABELS

    label = LABELS[result.engine]
    t = Table(title=f"{label}: page math (the printed memory in, the pool out) and full budget (from the GPU and the "
                    "settings; its miss as a share of the GPU's memory)", title_justify="left", show_edge=False)
    for col in ("case", "model", "GPU", "page math tokens", "full budget GiB", "budget rule", "not judged because"):
        t.add_column(col, overflow="fold")
    for c in result.cases:
        page = "" if c.page is None else (f"{int(c.page.predicted):,} / {int(c.page.reported):,}"
                                          + ("" if c.page.error_pct is None else f" ({c.page.error_pct:+.2f}%)"))
        full = "" if c.full is None else (f"{c.full.predicted_gib:.2f} / {c.full.reported_gib:.2f} "
                                          f"({c.full.error_of_gpu_pct:+.2f}% of {c.full.gpu_gib:g})")
        rule = "" if c.budget_rule is None else ("agrees" if c.budget_rule.within else "differs")
        why = c.page_reason or ("" if c.full else c.full_reason or "")
        if c.contradiction:
            why = f"the report contradicts itself: {c.contradiction}" + (f"; {why}" if why else "")
        t.add_row(esc(c.case_id), esc(_short(c.model or "")), esc(c.gpu or ""), page, full, rule, esc(why))
    console.print(t)
    console.print()
    for g in result.goals:
        mark = "[dim]not measured[/]" if g.met is None else "[green]met[/]" if g.met else "[red]missed[/]"
        console.print(f"{mark} {esc(g.name)}: {esc(g.target)}; got {esc(g.achieved)}")
    for note in result.notes:
        console.print(f"[dim]note: {esc(note)}[/]")


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:,.4g}"


COMPARISON_COLUMNS = [Column("case_id", "case", right=False), Column("model", "model", right=False),
                      Column("mode", "mode", right=False), Column("vllm_rules", "vLLM rules", right=False),
                      Column("quantity", "quantity", right=False), Column("predicted", "predicted", _number),
                      Column("reported", "reported", _number),
                      Column("error_pct", "error %", lambda v: "" if v is None else f"{v:+.2f}")]


def _cell(c, digits: int = 2) -> str:
    if c is None:
        return ""
    fmt = f"{{:,.{digits}f}}"
    pred = fmt.format(c.predicted) if c.predicted != int(c.predicted) or digits else f"{int(c.predicted):,}"
    rep = fmt.format(c.reported)
    err = "" if c.error_pct is None else f" ({c.error_pct:+.2f}%)"
    color = "green" if c.error_pct is not None and abs(c.error_pct) <= 0.5 else (
        "yellow" if c.error_pct is not None and abs(c.error_pct) <= 5 else "red")
    return f"{pred} / {rep}[{color}]{err}[/]"


def _int_cell(c) -> str:
    if c is None:
        return ""
    err = "" if c.error_pct is None else f" ({c.error_pct:+.2f}%)"
    color = "green" if c.error_pct is not None and abs(c.error_pct) <= 0.5 else (
        "yellow" if c.error_pct is not None and abs(c.error_pct) <= 5 else "red")
    return f"{int(c.predicted):,} / {int(c.reported):,}[{color}]{err}[/]"


def render(console, result) -> None:
    from rich.table import Table

    pages = [c for c in result.cases if c.mode == "page"]
    fulls = [c for c in result.cases if c.mode == "full"]
    if pages:
        t = Table(title="Page math: the reported available KV memory in, the pool out (predicted / reported)",
                  title_justify="left", show_edge=False)
        for col in ("case", "model", "rules", "KV tokens", "blocks", "max concurrency", "rounding bound"):
            t.add_column(col, overflow="fold")
        for c in pages:
            bound = f"±{c.rounding_bound_pct:.3f}%" if c.rounding_bound_pct is not None else ""
            t.add_row(esc(c.case_id), esc(_short(c.model)) + (" [dim](hybrid)[/]" if c.hybrid else ""), esc(c.vllm_rules),
                      _int_cell(c.get("tokens")), _int_cell(c.get("blocks")), _cell(c.get("concurrency")),
                      bound if c.comparisons else f"[dim]{c.status}[/]")
        console.print(t)
        console.print()
    if fulls:
        t = Table(title="Full budget: from GPU and settings (predicted / reported; KV range; leave-one-out error)",
                  title_justify="left", show_edge=False)
        for col in ("case", "model", "GPU", "rules", "available KV GiB", "range", "LOO", "weights GiB/GPU",
                    "KV tokens"):
            t.add_column(col, overflow="fold")
        for c in fulls:
            kv = c.get("available_kv_gib")
            rng = "" if kv is None or kv.low is None else (
                format_range(kv.low, kv.high) + ("" if kv.in_range else " [red]out[/]"))
            loo = "" if kv is None or kv.loo_error_pct is None else f"{kv.loo_error_pct:+.2f}%"
            t.add_row(esc(c.case_id), esc(_short(c.model)), esc(c.gpu or ""), esc(c.vllm_rules),
                      _cell(kv) if kv else f"[dim]{c.status}[/]", rng, loo, _cell(c.get("weights_gib")),
                      _int_cell(c.get("tokens")))
        console.print(t)
        console.print()
    s = Table(title="Absolute % error", title_justify="left", show_edge=False)
    for col in ("mode", "quantity", "reports", "n", "median", "p90", "max", "LOO median", "LOO p90"):
        s.add_column(col, justify="right" if col not in ("mode", "quantity", "reports") else "left", overflow="fold")
    for x in result.summaries:
        if not x.n:
            continue
        s.add_row(x.mode, x.quantity, x.subset, str(x.n), f"{x.median_abs_pct:.2f}%", f"{x.p90_abs_pct:.2f}%",
                  f"{x.max_abs_pct:.2f}%",
                  "" if x.loo_median_abs_pct is None else f"{x.loo_median_abs_pct:.2f}%",
                  "" if x.loo_p90_abs_pct is None else f"{x.loo_p90_abs_pct:.2f}%")
    console.print(s)
    console.print()
    for g in result.goals:
        mark = "[green]met[/]" if g.met else "[red]missed[/]"
        console.print(f"{mark} {g.name}: {g.target}; got {g.achieved}")
    console.print()
    for c in result.cases:
        reasons = c.limits + [a for a in c.assumptions if "assumed" in a or "config of" in a]
        if reasons and c.mode == ("page" if pages else "full"):
            console.print(f"[yellow]{esc(c.case_id)}[/]: " + esc("; ".join(dict.fromkeys(reasons))))
    for note in result.notes:
        console.print(f"[dim]note: {esc(note)}[/]")
    console.print(f"[dim]overhead model: {esc(result.overhead_source)}[/]")


def render_fit(console, fit) -> None:
    from rich.table import Table

    console.print(
        f"[bold]Overhead fit[/]: sampler {fit.sampler_bytes_per_logit} B/logit "
        f"(range -{fit.sampler_spread[0]:.1%} / +{fit.sampler_spread[1]:.1%}), non-torch "
        f"{fit.non_torch_gib_single} GiB (TP=1) / {fit.non_torch_gib_multi} GiB (TP>1) ± {fit.non_torch_spread_gib}"
    )
    t = Table(title="Fit residuals", title_justify="left", show_edge=False)
    for col in ("case", "used for", "B/logit", "non-torch GiB", "KV residual GiB", "KV error", "left out because"):
        t.add_column(col, overflow="fold")
    for r in fit.rows:
        t.add_row(r.case_id, ", ".join(r.used_for), "" if r.bytes_per_logit is None else f"{r.bytes_per_logit:.2f}",
                  "" if r.non_torch_gib is None else f"{r.non_torch_gib:.3f}",
                  "" if r.kv_residual_gib is None else f"{r.kv_residual_gib:+.3f}",
                  "" if r.kv_error_pct is None else f"{r.kv_error_pct:+.2f}%", r.excluded or "")
    console.print(t)
    console.print()


def _short(model: str) -> str:
    return model if len(model) <= 34 else model[:31] + "..."


@user_errors
def calibrate(
    path: Path | None = typer.Argument(None, help="A vLLM start-up log, or a bench run folder holding engine.log."),
    bench: Path | None = typer.Option(None, "--bench", help="A bench run folder: fit the step-time model (latency) to its measured points and write RUN/steptime.json."),
    gpu: str | None = typer.Option(None, "--gpu", help="The GPU the engine ran on (catalog name, or auto); needed unless the log prints it."),
    model: str | None = typer.Option(None, "--model", help="Hub id or local folder of the model, when the log shows a path kvplan cannot read."),
    vllm_version: str | None = typer.Option(None, "--vllm-version", help="The release, when the log does not print it."),
    util: str | None = typer.Option(None, "--gpu-memory-utilization", "--util", help="gpu_memory_utilization the engine used, when the log does not show it."),
    usage: str = typer.Option("serve", "--usage", help="serve (vllm serve) or llm (offline LLM class): the defaults the engine picked."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Record a real start-up's measured overhead for (GPU, vLLM version, model family).

    Later `kvplan size` runs with the same GPU, --vllm-version and model family use it and
    say so in their notes. The profile is $KVPLAN_CONFIG_DIR/calibration.json
    (default ~/.config/kvplan/calibration.json).
    """
    from dataclasses import asdict

    from kvplan.calibration import record_calibration
    from kvplan.errors import KvplanError
    from kvplan.units import parse_fraction
    from kvplan.validate.calibrate import log_path, measure

    if usage not in ("serve", "llm"):
        raise KvplanError(f"invalid --usage {usage!r}", "use serve or llm")
    if bench is not None:
        if path is not None:
            raise KvplanError("pass a start-up log or --bench RUN, not both")
        _calibrate_steptime(bench, gpu, model, as_json)
        return
    if path is None:
        raise KvplanError("pass a vLLM start-up log (or a bench run folder), or --bench RUN")
    file = log_path(path)
    from kvplan.vllm.startup_log import read_startup_log

    text = read_startup_log(str(file), "")
    fraction = None if util is None else parse_fraction(util, "gpu memory utilization")
    cal = measure(text, str(file), gpu, model, vllm_version, fraction, usage)
    written = record_calibration(cal)
    if as_json:
        from kvplan.plan.schema import StartupCalibrationOutput

        print_json(StartupCalibrationOutput(**asdict(cal), residual_gib=round(cal.residual_gib, 4), profile=str(written)))
        return
    typer.echo(f"recorded {cal.label()}")
    typer.echo(f"  requested {cal.requested_gib:.2f} GiB - weights {cal.weights_gib:.2f} - available KV "
               f"{cal.available_kv_gib:.2f} = overhead {cal.overhead_gib:.3f} GiB per GPU "
               f"(kvplan's model: {cal.predicted_overhead_gib:.3f}, residual {cal.residual_gib:+.3f})")
    typer.echo(f"  saved to {written}; `kvplan size` uses it for {cal.gpu} with --vllm-version {cal.vllm_version} "
               f"and {cal.model_family} models")


def _calibrate_steptime(run_dir: Path, gpu: str | None, model: str | None, as_json: bool) -> None:
    from kvplan.bench.steptime_io import STEPTIME_FILE, calibrate_run
    from kvplan.errors import KvplanError

    if not run_dir.is_dir():
        raise KvplanError(f"--bench {run_dir} is not a folder", "pass a folder made by kvplan bench")
    cal = calibrate_run(run_dir, gpu, model)
    m = cal.model
    if as_json:
        from kvplan.plan.schema import StepTimeCalibrationOutput

        print_json(StepTimeCalibrationOutput(**(cal.to_json() | {"steptime": cal.model}),
                                             written=str(run_dir / STEPTIME_FILE)))
        return
    typer.echo(f"calibrated the step-time model of {cal.model_name} on {cal.device} from {len(cal.points_used)} "
               f"point(s) at concurrency {', '.join(map(str, cal.points_used))}")
    terms = (f"the longer of memory / {m.mem_efficiency:.4g} and compute / {m.compute_efficiency:.4g}" if m.overlap
             else f"memory / {m.mem_efficiency:.4g} + compute / {m.compute_efficiency:.4g}")
    typer.echo(f"  per step {m.overhead_s * 1000:.3f} ms + {terms}; per request {m.request_overhead_s * 1000:.2f} ms "
               f"outside the steps "
               f"+ {m.request_overhead_per_rps_s2 * 1000:.2f} ms per request/s of load")
    if cal.held_outside is not None:
        rate, seconds = cal.held_outside
        typer.echo(f"  that line goes through vLLM's own split of the 1-stream TTFT (its queue and prefill histograms): "
                   f"{seconds * 1000:.2f} ms outside the steps at {rate:.2f} requests/s")
    typer.echo(f"  {prompt_price_line(cal)}")
    typer.echo(f"  saved to {run_dir / STEPTIME_FILE}")


def prompt_price_line(cal) -> str:
    """How well the run pins the price of a prompt token: the prompt lengths seen, the data's price with its range,
    the model's."""
    seen = "no prompt lengths" if cal.prompt_range is None else f"prompts of {cal.prompt_range[0]}-{cal.prompt_range[1]} tokens"
    sweep = f" ({cal.prompt_sweep_requests} from the prompt sweep)" if cal.prompt_sweep_requests else ""
    price = cal.prompt_price
    if price is None:
        return (f"a prompt token: {seen}{sweep}; too few 1-stream requests of distinct lengths to price one from the "
                "data (kvplan bench --prompt-sweep COUNT records them)")
    width = price.relative_range
    how = "" if width is None else f", a range {width:.0%} of it"
    verdict = "inside" if price.model_in_range else "OUTSIDE"
    hint = "" if cal.prompt_sweep_requests else "; a bench run with --prompt-sweep COUNT pins it over the context"
    return (f"a prompt token: {seen}{sweep}; {price.requests} 1-stream requests of {price.prompt_min}-{price.prompt_max} "
            f"tokens price it at {price.data_ms:.3g} ms (95%: {price.data_low_ms:.3g} to {price.data_high_ms:.3g}{how}; "
            f"Theil-Sen, Sen's interval); the model charges {price.model_ms:.3g} ms, {verdict} that range{hint}")
