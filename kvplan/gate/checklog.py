"""`kvplan check-log`: re-plan the settings a vLLM start-up log shows and compare, number by number.

Two comparisons:
- **page math**: the planner is given the log's own KV memory (``--kv-cache-memory-bytes`` when
  the log shows it, else "Available KV cache memory", printed to 0.01 GiB: both ends of that
  rounding are planned too), so blocks, tokens and concurrency test the KV layout and vLLM's
  reporting rules alone. These are gated by ``--tolerance``.
- **budget**: the planner sizes the pool from the GPU and the settings (weights, activation
  peak, non-torch memory, CUDA graphs). Reported when the GPU is known (``--gpu``, or the
  device total printed by V0 logs). Its terms, like the weights (estimated from config.json),
  are estimates with ranges: gated only with ``--gate all``.

User calibrations (`kvplan calibrate`) are not applied: a log must not be checked against itself.
"""

from __future__ import annotations

import dataclasses
import re

from pydantic import BaseModel, ConfigDict, Field

from kvplan.deploy import load_draft, plan_deployment, select_gpus
from kvplan.deploy import load_model_from_log as resolve_log_model
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection, custom_device
from kvplan.plan.offload import OffloadTier
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import settings_from_engine_args
from kvplan.plan.speculative import parse_speculative_config
from kvplan.term import make_console
from kvplan.units import GiB
from kvplan.vllm.rules import KNOWN_VERSIONS, VllmRules, rules_for
from kvplan.vllm.startup_log import StartupReport, parse_startup_log

# vLLM prints GiB and concurrency with 2 decimals: a predicted value this close to the reported
# one is equal as printed, whatever the percentage says.
PRINT_SLACK = 0.005
_COUNTED_GPU = re.compile(r"^\s*\d+\s*[x×*]", re.IGNORECASE)  # "2xH100"


class LogComparison(BaseModel):
    quantity: str
    reported: float | None
    predicted: float | None
    error_pct: float | None = Field(description="(predicted - reported) / reported x 100")
    within: bool | None = Field(description="|error| <= tolerance (or equal as printed); null when not compared")
    gated: bool = Field(description="counts toward the exit code")
    note: str = ""


class Section(BaseModel):
    mode: str
    gpu: str
    comparisons: list[LogComparison]


class CheckLogResult(BaseModel):
    """`kvplan check-log --json`."""

    # pydantic before 2.10 warns on stderr about fields named model_*: its namespace, not ours
    model_config = ConfigDict(protected_namespaces=())

    log: str
    ok: bool
    tolerance: float
    gate: str
    model: str
    model_source: str
    vllm_version: str
    platform: str | None
    settings: dict[str, object]
    engine_started: bool
    predicted_engine_starts: bool | None = None
    page_math: Section | None
    budget: Section | None
    parsed: StartupReport
    offload: OffloadTier | None = None  # the log's --kv-offloading-size: the CPU tier vLLM sizes beside the pool
    notes: list[str] = Field(default_factory=list)


def compare(quantity: str, reported: float | None, predicted: float | None, tolerance: float,
            gated: bool = True, slack: float = 0.0, band: tuple[float, float] | None = None,
            note: str = "") -> LogComparison:
    """``band``: the predictions at the low and high ends of a rounded input (the printed GiB)."""
    if reported is None or predicted is None:
        return LogComparison(quantity=quantity, reported=reported, predicted=predicted, error_pct=None,
                          within=None, gated=False, note="not in the log" if reported is None else note)
    if reported == 0:
        err = 0.0 if predicted == 0 else float("inf")
    else:
        err = (predicted - reported) / reported
    within = abs(err) <= tolerance or abs(predicted - reported) <= slack
    if not within and band is not None and min(band) <= reported <= max(band):
        within = True
        note = (note + "; " if note else "") + "within the rounding of the printed KV memory"
    pct = round(err * 100, 3) if err != float("inf") else None
    return LogComparison(quantity=quantity, reported=reported, predicted=predicted, error_pct=pct,
                      within=within, gated=gated, note=note)


# --- settings ---------------------------------------------------------------------------------


def speculative_note(r: StartupReport) -> str | None:
    """What the log's speculative config does to the pool, in one line (None: the log shows none)."""
    if not r.speculative_config:
        return None

    try:
        spec = parse_speculative_config(r.speculative_config, strict=False)
    except KvplanError as exc:
        raise KvplanError(f"cannot read the log's speculative config {r.speculative_config}: {exc}",
                          "pass --draft-layers N for its draft layers") from None
    return f"speculative decoding from the log: {spec.describe()}"


def settings_from_log(r: StartupReport, usage: str, kv_memory_bytes: int | None, override: bool = True,
                      draft_layers: int | None = None):

    return settings_from_engine_args(
        r,
        draft_layers=draft_layers or 0,
        kv_cache_memory_bytes=kv_memory_bytes,
        num_gpu_blocks_override=r.num_gpu_blocks_override if override else None,
        usage_context=usage,
    )


def _version(r: StartupReport, given: str | None, notes: list[str]) -> str | None:
    if given:
        return given
    if r.vllm_version:
        return r.vllm_version
    if r.engine == "v0":
        notes.append("the log prints no vLLM version; V0 engine lines: planned with vLLM 0.6.0 rules")
        return "0.6.0"
    return None  # judged by every release's rules (`_judge_unknown_release`)


def _assumed_device(r: StartupReport, notes: list[str]):
    """A device for page math when no GPU is known: only vLLM's scheduler defaults depend on it."""

    util = r.gpu_memory_utilization or 0.9
    total_gib = r.total_memory_gib or ((r.available_kv_gib or 0) + (r.weights_gib or 0)) / util
    total_gib = max(total_gib, 1.0)
    name = "CPU" if r.platform == "CPU" else f"assumed {total_gib:.0f} GiB device"
    if r.platform != "CPU" and not r.total_memory_gib:
        notes.append(f"no GPU given: vLLM's batch defaults taken for a {total_gib:.0f} GiB device "
                     "((available KV + weights) / utilization); pass --gpu to also compare the memory budget")
    world = (r.tensor_parallel_size or 1) * (r.pipeline_parallel_size or 1)
    return GpuSelection(custom_device(f"{total_gib:.3f}GiB", name), world)


# --- the check --------------------------------------------------------------------------------


def _capacity_rows(r: StartupReport, plan, plan_free, tolerance: float, gated: bool,
                   ends: tuple | None = None, ends_free: tuple | None = None) -> list[LogComparison]:
    """Blocks, tokens and concurrency; ``ends``: plans at both ends of the rounded KV memory."""

    def band(plans, attr):
        return None if not plans else (getattr(plans[0], attr), getattr(plans[1], attr))

    rows = []
    if r.num_gpu_blocks_override:
        rows.append(compare("KV blocks before the override", r.num_gpu_blocks_before_override,
                            plan_free.num_blocks if plan_free else None, tolerance, gated,
                            band=band(ends_free, "num_blocks")))
        rows.append(compare("KV blocks", r.num_gpu_blocks, plan.num_blocks, tolerance, gated=False,
                            note="given (--num-gpu-blocks-override)"))
    else:
        rows.append(compare("KV blocks", r.num_gpu_blocks, plan.num_blocks, tolerance, gated,
                            band=band(ends, "num_blocks")))
    rows.append(compare("KV cache tokens", r.kv_cache_tokens, plan.kv_cache_tokens, tolerance, gated,
                        band=band(ends, "kv_cache_tokens")))
    if r.max_concurrency is not None and r.max_concurrency_tokens not in (None, plan.max_model_len):
        rows.append(compare("max concurrency", r.max_concurrency, None, tolerance, False,
                            note=f"the log's L {r.max_concurrency_tokens} is not the planned max_model_len"))
    else:
        rows.append(compare(f"max concurrency at {plan.max_model_len:,} tokens", r.max_concurrency,
                            plan.max_concurrency, tolerance, gated, slack=PRINT_SLACK,
                            band=band(ends, "max_concurrency")))
    if r.failed and r.estimated_max_model_len:
        rows.append(compare("estimated max model length", r.estimated_max_model_len,
                            plan.max_context_at_concurrency or None, tolerance, gated=False,
                            note="vLLM's estimate on failure vs the longest request that fits"))
    return rows


#: Settings a log must show (or the command line give) before check-log judges it: each moves every figure.
#: Flag -> report field.
SETTING_FLAGS = {"--tp": "tensor_parallel_size", "--pp": "pipeline_parallel_size", "--max-model-len": "max_model_len",
                 "--kv-cache-dtype": "kv_cache_dtype", "--block-size": "block_size", "--dcp": "decode_context_parallel_size"}


def settings_were_read(r: StartupReport) -> bool:
    """The log shows the engine's settings: its config dump ("Initializing a V0/V1 LLM engine (vX) with
    config: ..."), which states tensor and pipeline parallel sizes, or the "non-default args" line, where
    an absent setting is vLLM's default."""
    return "tensor_parallel_size" in r.sources or bool(r.non_default_args)


def with_given_settings(r: StartupReport, given: dict[str, object]) -> StartupReport:
    """The report with the settings given on the command line (``SETTING_FLAGS`` fields) in place of the log's."""
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return r
    sources = dict(r.sources) | {k: "given on the command line" for k in given}
    return r.model_copy(update={**given, "sources": sources})


def check_log_text(text: str, log_name: str, tolerance: float = 0.02, gpu: str | None = None,
                   model: str | None = None, vllm_version: str | None = None, usage: str = "serve",
                   gate: str = "page", draft_layers: int | None = None,
                   given: dict[str, object] | None = None) -> CheckLogResult:
    """``gate``: "page" gates the page-math numbers (blocks, tokens, concurrency); "all" also the
    weights and the memory budget (estimates: see `kvplan validate` for their typical error).
    ``given``: settings from the command line (report field -> value), which replace the log's.

    A log is never judged on settings it does not show: without its config dump or non-default args
    (and no ``given`` settings), or with nothing to compare, it is refused (exit 2), not passed."""

    r = parse_startup_log(text)
    notes: list[str] = []
    if not r.has_capacity and not r.failed and r.available_kv_gib is None:
        raise KvplanError(f"{log_name}: no vLLM KV capacity lines found",
                          "expected e.g. 'GPU KV cache size: N tokens' or '# GPU blocks: N'; is it a start-up log?")
    name = model or r.model
    if not name:
        raise KvplanError(f"{log_name}: the log does not name the model", "pass --model")
    resolved = resolve_log_model(name, notes)
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if not settings_were_read(r) and not {"tensor_parallel_size", "pipeline_parallel_size"} <= set(given):
        missing = [flag for flag, field in SETTING_FLAGS.items() if field not in given and getattr(r, field) is None]
        raise KvplanError(
            f"{log_name}: cannot read the engine's settings (no 'Initializing ... LLM engine (vX) with config:' line "
            f"and no 'non-default args'), so the plan would guess them",
            f"pass them: {' '.join(f'{m} N' for m in missing)}")
    if given:
        notes.append("given on the command line: " + ", ".join(f"{k}={v}" for k, v in given.items()))
    r = with_given_settings(r, given)
    version = _version(r, vllm_version, notes)
    if version is not None:
        return _judge(r, resolved, version, notes, log_name, tolerance, gpu, usage, gate, draft_layers)
    return _judge_unknown_release(r, resolved, notes, log_name, tolerance, gpu, usage, gate, draft_layers)


def _judge_unknown_release(r: StartupReport, resolved, notes: list[str], log_name: str, *args) -> CheckLogResult:
    """A log that prints no vLLM version is judged by the rules of every release kvplan knows (releases with
    the same rules once): the release whose figures agree best with the log's is taken (the newest of equals),
    and the note names every release that agrees; where none agrees, the newest rules judge it, and the note
    says no release reproduces it. So a verdict never rests on one release the log does not show (an 0.11 log
    judged by 0.33's rules was 3.8x off)."""
    by_rules: dict[VllmRules, list[str]] = {}
    for version in KNOWN_VERSIONS:
        by_rules.setdefault(dataclasses.replace(rules_for(version), version="", note=""), []).append(version)
    judged: list[tuple[list[str], CheckLogResult]] = []
    failure: KvplanError | None = None
    for versions in reversed(list(by_rules.values())):  # newest first
        try:
            judged.append((versions, _judge(r, resolved, versions[-1], list(notes), log_name, *args)))
        except KvplanError as exc:  # that release cannot plan it (a family it predates): not a candidate
            failure = failure or exc
    if not judged:
        raise failure or KvplanError(f"{log_name}: no release kvplan knows can plan this log")
    agreeing = [versions for versions, result in judged if result.ok]
    if agreeing:
        names = ", ".join(_span(v) for v in reversed(agreeing))
        # The closest agreement (its largest gated error the smallest; the newest of equals).
        chosen = min((result for _, result in judged if result.ok), key=_largest_error)
        chosen.notes.insert(0, f"the log prints no vLLM version: its figures agree with the rules of vLLM {names}; "
                               f"judged with {chosen.vllm_version} (pass --vllm-version to choose)")
        return chosen
    chosen = judged[0][1]
    chosen.notes.insert(0, f"the log prints no vLLM version, and no release kvplan knows ({KNOWN_VERSIONS[0]} to "
                           f"{KNOWN_VERSIONS[-1]}) reproduces its figures: judged with the newest rules "
                           "(pass --vllm-version)")
    return chosen


def _largest_error(result: CheckLogResult) -> float:
    errors = [abs(c.error_pct) for section in (result.page_math, result.budget) if section
              for c in section.comparisons if c.gated and c.error_pct is not None]
    return max(errors, default=0.0)


def _span(versions: list[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]}-{versions[-1]}"


def _judge(r: StartupReport, resolved, version: str, notes: list[str], log_name: str, tolerance: float,
           gpu: str | None, usage: str, gate: str, draft_layers: int | None) -> CheckLogResult:
    """Compare the log's figures with the plans of one release's rules."""
    note = speculative_note(r)
    if note:
        notes.append(note)
    overhead = load_overhead()  # no user calibration: see the module docstring
    if r.max_model_len is None:
        notes.append("the log does not show max_model_len: planned with the model's maximum")

    world = (r.tensor_parallel_size or 1) * (r.pipeline_parallel_size or 1)
    selection = None
    if gpu:
        selection = select_gpus(gpu, None if _COUNTED_GPU.match(gpu) else world)
    elif r.total_memory_gib and r.platform != "CPU":
        selection = select_gpus(None, world, f"{r.total_memory_gib}GiB")
        notes.append(f"GPU from the log's total_gpu_memory={r.total_memory_gib} GiB")

    def plan_with(sel, kv_bytes, override=True):
        settings = settings_from_log(r, usage, kv_bytes, override, draft_layers)
        settings = dataclasses.replace(settings, speculative=load_draft(settings.speculative))  # its draft's own config
        try:
            return plan_deployment(resolved, sel, settings, version, overhead, suggest=False)  # a log's check needs none
        except KvplanError as exc:
            if not settings.kv_offloading_size:
                raise
            # The tier is not in the log's figures (nothing of it is gated): the pool is judged without it. If
            # the pool cannot be planned either, that error is the one raised.
            plan = plan_deployment(resolved, sel, dataclasses.replace(settings, kv_offloading_size=None), version,
                                   overhead, suggest=False)
            note = f"the log's CPU offload tier is not sized: {exc.message}"
            if note not in notes:
                notes.append(note)
            return plan

    gate_all = gate == "all"
    page = None
    page_plan = None
    plan_for_version = None
    exact = r.kv_cache_memory_bytes  # --kv-cache-memory-bytes: vLLM's available KV memory, exactly
    if exact or (r.available_kv_gib is not None and r.available_kv_gib > 0):
        sel = selection or _assumed_device(r, notes)
        override = bool(r.num_gpu_blocks_override)
        kv_bytes = exact or int(round(r.available_kv_gib * GiB))
        plan = plan_with(sel, kv_bytes)
        plan_free = plan_with(sel, kv_bytes, override=False) if override else None
        ends = ends_free = None
        if not exact:  # the log printed the KV memory rounded to 0.01 GiB: plan both ends
            lo, hi = (int((r.available_kv_gib + d) * GiB) for d in (-PRINT_SLACK, PRINT_SLACK))
            ends = (plan_with(sel, max(lo, 1)), plan_with(sel, hi))
            if override:
                ends_free = (plan_with(sel, max(lo, 1), override=False), plan_with(sel, hi, override=False))
        plan_for_version = page_plan = plan
        given = (f"given: --kv-cache-memory-bytes {exact:,}" if exact else "given: the log's value")
        rows = [compare("available KV cache GiB", r.available_kv_gib, round(kv_bytes / GiB, 2), tolerance,
                        gated=False, slack=PRINT_SLACK, note=given)]
        rows += _capacity_rows(r, plan, plan_free, tolerance, gated=True, ends=ends, ends_free=ends_free)
        rows.append(compare("weights GiB per device", r.weights_gib, round(plan.weights_bytes / GiB, 4),
                            tolerance, gated=gate_all, slack=PRINT_SLACK,
                            note="" if gate_all else "estimated from the config; gated with --gate all"))
        page = Section(mode="page math (the log's KV memory given)", gpu=sel.device.name, comparisons=rows)
    elif r.num_gpu_blocks_override and selection is None:
        sel = _assumed_device(r, notes)
        plan = plan_with(sel, None)
        plan_for_version = page_plan = plan
        page = Section(mode="page math (blocks given by the override)", gpu=sel.device.name,
                       comparisons=_capacity_rows(r, plan, None, tolerance, gated=True))
    else:
        notes.append("the log does not print the available KV memory: no page-math comparison")

    budget = None
    predicted_starts = None
    if page is not None and page_plan is not None:
        predicted_starts = _starts(page_plan)
        # Given the same KV memory, whether vLLM starts is page math too: gate it (a failed start's one
        # comparable fact, so always shown for one; for an engine that started, only when the plan disagrees).
        agrees = predicted_starts != r.failed
        if (r.failed or r.has_capacity) and (r.failed or not agrees):
            page.comparisons.append(LogComparison(
                quantity="engine starts", reported=0.0 if r.failed else 1.0, predicted=1.0 if predicted_starts else 0.0,
                error_pct=None, within=agrees, gated=True,
                note=f"vLLM {'failed to start' if r.failed else 'started'}; the plan says it "
                     f"{'would start' if predicted_starts else 'would not start'}"))
    if selection is not None and r.platform != "CPU":
        plan = plan_with(selection, exact)
        plan_for_version = plan_for_version or plan
        rows = [compare("available KV cache GiB", r.available_kv_gib, round(plan.available_kv_bytes / GiB, 2),
                        tolerance, gated=gate_all, slack=PRINT_SLACK)]
        rows += _capacity_rows(r, plan, None, tolerance, gated=gate_all)
        rows.append(compare("weights GiB per device", r.weights_gib, round(plan.weights_bytes / GiB, 4),
                            tolerance, gated=gate_all, slack=PRINT_SLACK))
        budget = Section(mode="memory budget (from the GPU and settings)",
                         gpu=f"{selection.count}x {selection.device.name}", comparisons=rows)
        budget_starts = _starts(plan)
        if budget_starts == r.failed:
            notes.append(f"vLLM {'failed to start' if r.failed else 'started'}; the budget plan predicted it "
                         f"{'would start' if budget_starts else 'would not start'}")
        predicted_starts = budget_starts if predicted_starts is None else predicted_starts
    elif r.platform == "CPU":
        notes.append("CPU engine: kvplan has no CPU memory-budget model; page math only")
    if page is None and budget is None:
        raise KvplanError(f"{log_name}: nothing to compare: the log has no available KV memory and no GPU is known",
                          "pass --gpu H100 (the GPU the log came from)")

    gated = [c for s in (page, budget) if s for c in s.comparisons if c.gated and c.within is not None]
    if not gated:  # nothing was judged: never "within the tolerance"
        raise KvplanError(f"{log_name}: no reported number could be compared with the plan",
                          "the log needs its KV lines (blocks, tokens or concurrency) and the KV memory; "
                          "--gate all with --gpu compares the memory budget too")
    ok = all(c.within for c in gated)
    settings = _as_dict(settings_from_log(r, usage, None, draft_layers=draft_layers))
    return CheckLogResult(
        log=log_name,
        ok=ok,
        tolerance=tolerance,
        gate=gate,
        model=resolved.config.name,
        model_source=resolved.config.source,
        vllm_version=plan_for_version.vllm_version if plan_for_version else (version or "newest"),
        platform=r.platform,
        settings={k: v for k, v in settings.items() if v not in (None, False, "auto") and k != "usage_context"
                  and k not in ("concurrency", "shared_prefix_tokens")},
        engine_started=not r.failed,
        predicted_engine_starts=predicted_starts,
        page_math=page,
        budget=budget,
        parsed=r,
        offload=plan_for_version.offload if plan_for_version else None,
        notes=notes,
    )


def render(result: CheckLogResult) -> None:
    console = make_console()
    r = result.parsed
    console.print(f"[bold]{result.log}[/]: vLLM {r.vllm_version or '?'} ({r.engine or '?'} engine, "
                  f"{r.platform or '?'}), model {r.model or '?'}")
    console.print(f"  planned as {result.model} ({result.model_source}), vLLM {result.vllm_version} rules; "
                  + ", ".join(f"{k}={v}" for k, v in result.settings.items()))
    if r.failed:
        console.print(f"  [red]the engine failed to start[/]: {r.failure_message}")
    for section in (result.page_math, result.budget):
        if section is not None:
            console.print(comparison_table(section))
    if result.offload is not None:
        t = result.offload
        chunks, held = t.describe()
        console.print(f"CPU offload tier ({t.backend}, {t.size_gib:g} GiB, from the log's settings; not in the log's "
                      f"figures, not gated): {chunks}; {held}")
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")
    color = "green" if result.ok else "red"
    verdict = "within" if result.ok else "outside"
    console.print(f"[bold {color}]{verdict} the tolerance of {result.tolerance:.1%}[/]")


def comparison_table(section: Section):
    """One judged section (page math, a budget) as a rich table: each quantity reported, predicted, its error and
    whether it is within (gated or not); the table check-log prints for every engine."""
    from rich.table import Table

    table = Table(title=f"{section.mode} - {section.gpu}", title_justify="left", show_edge=False)
    for col, justify in (("quantity", "left"), ("reported", "right"), ("predicted", "right"),
                         ("error", "right"), ("", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for c in section.comparisons:
        if c.within is None:
            mark = f"[dim]{c.note}[/]"
        else:
            ok = "[green]ok[/]" if c.within else ("[red]off[/]" if c.gated else "[yellow]off[/]")
            mark = ok + ("" if c.gated else " [dim](not gated)[/]") + (f" [dim]{c.note}[/]" if c.note else "")
        err = "-" if c.error_pct is None else f"{c.error_pct:+.2f}%"
        table.add_row(c.quantity, _num(c.reported), _num(c.predicted), err, mark)
    return table


def _starts(plan) -> bool:
    """The plan's verdict on start-up: one max_model_len request fits the KV memory."""
    return plan.num_blocks > 0 and plan.limiting_term not in ("max_model_len", "weights")


def _as_dict(settings) -> dict[str, object]:
    if dataclasses.is_dataclass(settings):
        return dataclasses.asdict(settings)
    return settings.model_dump()


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) >= 100:
        return f"{int(value):,}"
    return f"{value:,.4g}" if abs(value) < 100 else f"{value:,.2f}"
