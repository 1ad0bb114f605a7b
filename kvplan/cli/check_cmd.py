"""`kvplan check` (gate a deployment spec in CI) and `kvplan check-log` (a vLLM log vs the plan)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from kvplan.cli.common import error_line, print_json, user_errors
from kvplan.cli.tables import OutputFormat, chosen_format, emit_rows, format_option
from kvplan.errors import ExitCode
from kvplan.term import printable
from kvplan.units import parse_tokens

CHECK_EXAMPLES = """
Examples:

  kvplan check kvplan.yaml

  kvplan check kvplan.yaml --junit reports/kvplan.xml

  kvplan check kvplan.yaml --bench runs/llama-8b-h100 --json

  kvplan check kvplan.yaml --format csv > check.csv   # one row per deployment

  kvplan check kvplan.yaml --format markdown          # the table for a PR comment

Exit code 0: every deployment fits; 1: at least one does not; 2: the spec is invalid
(the error names file:line and the key).
"""

CHECK_LOG_EXAMPLES = """
Examples:

  kvplan check-log vllm.log

  kvplan check-log vllm.log --gpu H100 --tolerance 0.01

  kvplan check-log engine.log --model ./my-model --json

  kvplan check-log sglang.log                 # SGLang and TensorRT-LLM logs are told apart from their own lines

  kvplan check-log trtllm.log --tp 1 --gate all

Exit code 0: every reported number is within --tolerance of the plan; 1: one is not; 2: bad input.
"""


@user_errors
def check(
    spec: str = typer.Argument(..., help="The deployment spec (kvplan.yaml)."),
    junit: Optional[str] = typer.Option(None, "--junit", help="Write JUnit XML here (one test case per deployment)."),
    bench: Optional[list[str]] = typer.Option(None, "--bench", help="A `kvplan bench` run folder (repeatable): fail deployments whose measured first preemption is below their concurrency. Also other harnesses' latencies for slo: keys (no preemption evidence): a `vllm bench serve --save-result` JSON file or folder, a GuideLLM report (JSON or YAML)."),
    annotations: Optional[bool] = typer.Option(None, "--github-annotations/--no-github-annotations", help="Print ::error annotations (default: on when GITHUB_ACTIONS=true)."),
    strict: bool = typer.Option(False, "--strict", help="Fail a deployment that fits at the estimate but not at the low end of its KV budget's range."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (same as --format json).", rich_help_panel="Output"),
    fmt: OutputFormat = format_option(),
) -> None:
    """Check every deployment of a spec against the planner: does it fit, by what margin, what binds.

    --format csv or markdown prints the result table alone, one row per deployment; json (as --json)
    the whole report. Other than the table, annotations go to stderr (stdout stays one document).
    --junit and the GitHub step summary are written whatever the format.
    """
    from kvplan.gate import outputs
    from kvplan.gate.check import check_spec, read_bench_runs
    from kvplan.gate.spec import SpecErrors, load_spec

    fmt = chosen_format(fmt, as_json)
    want_annotations = outputs.annotations_wanted(annotations)
    stream = sys.stdout if fmt is OutputFormat.table else sys.stderr
    try:
        parsed = load_spec(spec)
        runs = read_bench_runs(bench) if bench else []
        report = check_spec(parsed, runs, strict)
    except SpecErrors as errors:
        for issue in errors.issues:
            error_line(str(issue))
        if want_annotations:
            for line in outputs.annotations_for_issues(errors.issues):
                stream.write(line + "\n")
        if junit:
            outputs.write_file(junit, outputs.junit_xml_for_issues(spec, errors.issues))
        outputs.append_step_summary(outputs.step_summary_for_issues(spec, errors.issues))
        raise typer.Exit(ExitCode.BAD_INPUT) from None

    if junit:
        outputs.write_file(junit, outputs.junit_xml(report))
    outputs.append_step_summary(outputs.step_summary_markdown(report))
    if fmt is OutputFormat.json:
        print_json(report)
    elif fmt is OutputFormat.table:
        outputs.render_table(report)
    else:
        failing = [f"\n- {printable(r.name)}: {printable(r.reason)}" for r in report.results if not r.fits]
        emit_rows(outputs.result_rows(report), outputs.RESULT_COLUMNS, fmt,
                  footnote=f"{report.passed} of {report.total} deployments fit" + "".join(failing))
    if want_annotations:
        for line in outputs.annotations(report):
            stream.write(line + "\n")
        stream.flush()
    raise typer.Exit(ExitCode.OK if report.ok else ExitCode.DOES_NOT_FIT)


@user_errors
def check_log(
    log: str = typer.Argument(..., help="A vLLM, SGLang or TensorRT-LLM start-up log (any release; GPU or CPU build). '-' reads stdin."),
    tolerance: float = typer.Option(0.02, "--tolerance", help="Largest |error| allowed, as a fraction (0.02 = 2%)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="The GPU the log came from (H100, 2xH100), when the log does not say: adds the memory budget comparison."),
    model: Optional[str] = typer.Option(None, "--model", help="Model id or path to plan with, instead of the one in the log."),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="Rules of this release, when the log does not print it."),
    usage: str = typer.Option("serve", "--usage", help="serve (vllm serve) or llm (offline LLM class): vLLM's batch defaults."),
    gate: str = typer.Option("page", "--gate", help="page: gate blocks, tokens and concurrency given the log's KV memory; all: also weights and the memory budget."),
    draft_layers: Optional[int] = typer.Option(None, "--draft-layers", help="Speculative decoding draft layers sharing the pool (default: as the log's speculative config gives them)."),
    tp: Optional[int] = typer.Option(None, "--tp", "--tensor-parallel-size", help="Tensor parallel size, instead of (or where the log does not show) the log's.", metavar="N", min=1, max=65536),
    pp: Optional[int] = typer.Option(None, "--pp", "--pipeline-parallel-size", help="Pipeline parallel size, likewise.", metavar="N", min=1, max=4096),
    dcp: Optional[int] = typer.Option(None, "--dcp", "--decode-context-parallel-size", help="Decode context parallel size, likewise.", metavar="N", min=1, max=4096),
    max_model_len: Optional[str] = typer.Option(None, "--max-model-len", "--ctx", help="max_model_len, likewise: 32k, 131072.", metavar="TOKENS"),
    kv_cache_dtype: Optional[str] = typer.Option(None, "--kv-cache-dtype", help="KV cache dtype, likewise.", metavar="DTYPE"),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="KV block size, likewise.", metavar="N", min=1, max=1 << 20),
    kv_offloading_size: Optional[float] = typer.Option(None, "--kv-offloading-size", help="vLLM's CPU offload tier (GiB over the ranks), likewise: sized beside the pool.", metavar="GiB"),
    kv_offloading_backend: Optional[str] = typer.Option(None, "--kv-offloading-backend", help="native or lmcache, likewise.", metavar="BACKEND"),
    engine: str = typer.Option("auto", "--engine", help="auto (told from the log's own lines), vllm, sglang or trtllm.", metavar="ENGINE"),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help="SGLang or TensorRT-LLM: the release, when the log does not print it.", metavar="V"),
    free_gpu_memory_fraction: Optional[float] = typer.Option(None, "--free-gpu-memory-fraction", help="TensorRT-LLM: kv_cache_config.free_gpu_memory_fraction, when the log does not print it.", metavar="F"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Parse a vLLM, SGLang or TensorRT-LLM start-up log, re-plan it by that engine's rules, and show predicted vs
    reported numbers."""
    from kvplan.errors import KvplanError
    from kvplan.gate import enginelog
    from kvplan.gate.checklog import check_log_text, render

    if not 0 <= tolerance < 1:
        raise KvplanError(f"invalid --tolerance {tolerance}", "use a fraction such as 0.02")
    if usage not in ("serve", "llm"):
        raise KvplanError(f"invalid --usage {usage!r}", "use serve or llm")
    if gate not in ("page", "all"):
        raise KvplanError(f"invalid --gate {gate!r}", "use page or all")
    if engine not in ("auto",) + enginelog.ENGINES:
        raise KvplanError(f"invalid --engine {engine!r}", "use auto, vllm, sglang or trtllm")
    if free_gpu_memory_fraction is not None and not 0 < free_gpu_memory_fraction < 1:
        raise KvplanError(f"invalid --free-gpu-memory-fraction {free_gpu_memory_fraction}", "give a fraction in (0, 1)")
    from kvplan.vllm.startup_log import relevant_lines

    # streamed: a huge log (or stdin) stays in bounded memory
    text = enginelog.engine_lines(sys.stdin) if log == "-" else enginelog.read_engine_log(log)
    if kv_cache_dtype is not None and kv_cache_dtype != "auto":
        from kvplan.model.dtypes import kv_dtype

        kv_dtype(kv_cache_dtype)  # refuse an unknown name now, with the list
    engine = enginelog.detect_engine(text) if engine == "auto" else engine
    if engine != "vllm":
        vllm_only = {"--vllm-version": vllm_version, "--pp": pp, "--dcp": dcp, "--block-size": block_size,
                     "--max-model-len": max_model_len, "--kv-offloading-size": kv_offloading_size,
                     "--kv-offloading-backend": kv_offloading_backend, "--draft-layers": draft_layers,
                     "--usage": None if usage == "serve" else usage}
        given = [flag for flag, value in vllm_only.items() if value is not None]
        if given:
            raise KvplanError(f"{', '.join(given)}: vLLM flag(s), and this is a {engine} log",
                              "drop them (--engine-version, --tp, --kv-cache-dtype and --model apply to every engine)")
        if engine == "sglang":
            if free_gpu_memory_fraction is not None:
                raise KvplanError("--free-gpu-memory-fraction is a TensorRT-LLM setting, and this is an SGLang log")
            result = enginelog.judge_sglang(text, log, tolerance, gate, model, gpu, engine_version, tp, kv_cache_dtype)
        else:
            result = enginelog.judge_trtllm(text, log, tolerance, gate, model, engine_version, tp, kv_cache_dtype,
                                            free_gpu_memory_fraction, gpu=gpu)
        if as_json:
            print_json(result)
        else:
            enginelog.render(result)
        raise typer.Exit(ExitCode.OK if result.ok else ExitCode.DOES_NOT_FIT)
    for flag, value in (("--engine-version", engine_version), ("--free-gpu-memory-fraction", free_gpu_memory_fraction)):
        if value is not None:
            raise KvplanError(f"{flag} is for SGLang and TensorRT-LLM logs, and this is a vLLM log",
                              "vLLM's release: --vllm-version")
    text = relevant_lines(text.splitlines())
    given = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "decode_context_parallel_size": dcp,
             "kv_cache_dtype": kv_cache_dtype,
             "block_size": block_size, "kv_offloading_size": kv_offloading_size,
             "kv_offloading_backend": kv_offloading_backend,
             "max_model_len": None if max_model_len is None else parse_tokens(max_model_len, "max_model_len")}
    result = check_log_text(text, log, tolerance=tolerance, gpu=gpu, model=model,
                            vllm_version=vllm_version, usage=usage, gate=gate, draft_layers=draft_layers, given=given)
    if as_json:
        print_json(result)
    else:
        render(result)
    raise typer.Exit(ExitCode.OK if result.ok else ExitCode.DOES_NOT_FIT)

