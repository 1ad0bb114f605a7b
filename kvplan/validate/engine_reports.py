"""`kvplan validate --engine sglang|trtllm`: public SGLang and TensorRT-LLM start-ups against their engines' rules.

Each report (``profiles/reports/sglang-startup-reports.jsonl``, ``trtllm-startup-reports.jsonl``) quotes the engine's
own lines; its other fields say what the source states outside the quote (model, GPU, TP, settings). A report is
judged the way `kvplan check-log` judges a log (kvplan/gate/enginelog.py): its quote is the log, its fields the
settings given on the command line, its model read offline (``--configs`` folder, then the bundled profiles).

- **page math**: the printed pool memory in, the printed tokens out (SGLang: K + V size -> ``#tokens``;
  TensorRT-LLM: the profiled budget, a TensorRT engine's fraction x free memory, else the pool's GiB -> "(N)").
- **full budget**: the pool from the GPU and the settings alone (`kvplan size --engine sglang|trtllm`), its miss as a
  share of the GPU's memory. TensorRT-LLM's is built for the PyTorch backend (kvplan/trtllm/budget.py) where the
  report states the model, the GPU, the TP and the release or free_gpu_memory_fraction; its budget rule given the
  peak a log prints is shown beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvplan.deploy import ResolvedModel
from kvplan.errors import KvplanError
from kvplan.gate.checklog import LogComparison
from kvplan.gate.enginelog import EngineLogResult, judge_sglang, judge_trtllm
from kvplan.hardware.catalog import find_device
from kvplan.model.arch import parse_architecture
from kvplan.model.source import ModelConfig
from kvplan.units import GiB
from kvplan.validate.cases import resolve_config
from kvplan.validate.reports import REPORTS_DIR, read_report_lines

REPORT_FILES = {"sglang": REPORTS_DIR / "sglang-startup-reports.jsonl",
                "trtllm": REPORTS_DIR / "trtllm-startup-reports.jsonl"}
LABELS = {"sglang": "SGLang", "trtllm": "TensorRT-LLM"}
PAGE_GOAL_PCT = 0.5  # issue 25: page math within 0.5% of the printed tokens ...
PAGE_GOAL_SHARE = 0.9  # ... on >= 90% of each engine's reports
FULL_GOAL_PCT = 3.0  # full budget within 3% of the GPU's memory ...
FULL_GOAL_SHARE = 0.8  # ... on >= 80% of the reports that state enough
_NO_FULL = "no full-budget comparison: "
#: The page-math comparison each engine's goal reads, best first (kvplan/gate/enginelog.py names them).
_PAGE_QUANTITIES = ("#tokens from the printed pool GiB", "pool tokens from the profiled budget",
                    "pool tokens from the engine's free memory", "pool tokens from 'Estimated max tokens'",
                    "pool tokens in the printed GiB")


class EngineReport(BaseModel):
    """One published SGLang or TensorRT-LLM start-up: the fields both files share (the rest are kept as given)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    case_id: str
    source: str
    quote: str
    model: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    tensor_parallel_size: int | None = None
    kv_cache_dtype: str | None = None
    notes: str = ""
    # Curation, each with its reason: ``config_model`` + ``config_note`` (the bundled config that stands for the
    # model), ``assumed_version`` + ``version_note`` (a release the report dates itself to), ``contradiction`` (the
    # report's printed figures disagree with the model it names: still judged and counted, the reason shown).
    kvplan: dict[str, Any] = Field(default_factory=dict)

    def field(self, name: str) -> Any:
        return (self.model_extra or {}).get(name)


class PageResult(BaseModel):
    quantity: str
    reported: float
    predicted: float
    error_pct: float | None
    within_rounding: bool = Field(description="within what the printed memory's rounding allows")


class FullResult(BaseModel):
    reported_gib: float = Field(description="the pool's memory as printed, per GPU")
    predicted_gib: float
    gpu_gib: float = Field(description="the GPU's CUDA total, what the miss is a share of")
    error_of_gpu_pct: float


class EngineCase(BaseModel):
    case_id: str
    engine: str
    model: str | None
    gpu: str | None
    rules: str | None
    source: str
    page: PageResult | None = None
    page_reason: str | None = Field(None, description="why page math could not judge it")
    full: FullResult | None = None
    full_reason: str | None = None
    budget_rule: LogComparison | None = Field(None, description="the engine's budget rule from its printed memory")
    contradiction: str | None = Field(None, description="why the report's own figures disagree with the model it "
                                                        "names (curated; the miss still counts)")
    notes: list[str] = Field(default_factory=list)


class EngineGoal(BaseModel):
    name: str
    target: str
    achieved: str
    met: bool | None = Field(description="null: not measured")


class EngineValidation(BaseModel):
    """`kvplan validate --engine sglang|trtllm --json` (`kvplan schema validate-engines`)."""

    engine: str
    reports_file: str
    reports: int
    cases: list[EngineCase]
    goals: list[EngineGoal]
    notes: list[str]


def load_engine_reports(path: Path) -> list[EngineReport]:
    return read_report_lines(path, EngineReport)


def engine_of_file(path: Path) -> str | None:
    """The engine a reports file is of, from its first row's release field (None: vLLM's)."""
    rows = load_engine_reports(path)
    first = rows[0].model_extra or {}
    return "sglang" if "sglang_version" in first else "trtllm" if "trtllm_version" in first else None


def _resolve(report: EngineReport, configs_dir: Path | None) -> tuple[ResolvedModel | None, str | None]:
    name = report.kvplan.get("config_model") or report.model
    if not name:
        return None, "the report names no model"
    found = resolve_config(name, configs_dir)
    if found is None:
        return None, f"no config for {name} (bundled or --configs)"
    config, where = found
    try:
        return ResolvedModel(ModelConfig(name, config, "bundled", where), parse_architecture(config)), None
    except KvplanError as exc:
        return None, f"config of {name} unreadable: {exc.message}"


def _judge(engine: str, report: EngineReport, resolved: ResolvedModel) -> EngineLogResult:
    text = report.quote.replace(" / ", "\n")
    # One GPU can only run TP 1: a report of one GPU that prints no TP size is at TP 1.
    tp = report.tensor_parallel_size or (1 if report.gpu_count == 1 else None)
    version = report.field(f"{engine}_version") or report.kvplan.get("assumed_version")
    if engine == "sglang":
        args = {"mem_fraction_static": report.field("mem_fraction_static"), "page_size": report.field("page_size"),
                "context_length": report.field("context_length")}
        return judge_sglang(text, report.case_id, 0.02, "all", None, report.gpu, version,
                            tp, report.kv_cache_dtype, resolved=resolved, given_args=args)
    gpu = report.gpu if report.gpu is None or not report.gpu_count else f"{report.gpu_count}x {report.gpu}"
    return judge_trtllm(text, report.case_id, 0.02, "all", None, version, tp,
                        report.kv_cache_dtype, report.field("free_gpu_memory_fraction"), resolved=resolved, gpu=gpu,
                        given={"backend": report.field("backend"), "max_num_tokens": report.field("max_num_tokens")})


def _page(result: EngineLogResult) -> PageResult | None:
    rows = {c.quantity: c for c in (result.page_math.comparisons if result.page_math else [])}
    for quantity in _PAGE_QUANTITIES:
        c = rows.get(quantity)
        if c is not None and c.reported is not None and c.predicted is not None:
            return PageResult(quantity=quantity, reported=c.reported, predicted=c.predicted, error_pct=c.error_pct,
                              within_rounding=bool(c.within and "rounding" in c.note) or c.reported == c.predicted)
    return None


def _full(report: EngineReport, result: EngineLogResult) -> tuple[FullResult | None, str | None]:
    if result.full_budget is None:
        if result.full_budget_reason:
            return None, result.full_budget_reason
        said = [n.removeprefix(_NO_FULL) for n in result.notes if n.startswith(_NO_FULL)]
        return None, said[0] if said else "not judged because it states no GPU, TP size and mem_fraction_static or " \
                                          "release"
    device = find_device(report.gpu)  # the full budget ran: the GPU is in the catalog
    if device.unified_memory:
        return None, (f"a unified-memory GPU ({device.name}): the host's own use of the memory counts as used GPU "
                      "memory, and the report states no figure for it apart from its log")
    c = next((c for c in result.full_budget.comparisons if c.quantity == "KV budget GiB per GPU"), None)
    if c is None or c.reported is None or c.predicted is None:
        return None, "the report prints no pool memory"
    gpu_gib = device.cuda_total_bytes / GiB
    return FullResult(reported_gib=c.reported, predicted_gib=c.predicted, gpu_gib=round(gpu_gib, 2),
                      error_of_gpu_pct=round(100 * (c.predicted - c.reported) / gpu_gib, 3)), None


def validate_engine(engine: str, reports_file: Path | None = None, configs_dir: Path | None = None) -> EngineValidation:
    """Judge every report of ``engine`` (sglang or trtllm); a report that cannot be judged says why."""
    path = reports_file or REPORT_FILES[engine]
    reports = load_engine_reports(path)
    cases: list[EngineCase] = []
    for report in reports:
        case = EngineCase(case_id=report.case_id, engine=engine, model=report.kvplan.get("config_model") or report.model,
                          gpu=report.gpu, rules=None, source=report.source,
                          contradiction=report.kvplan.get("contradiction"))
        resolved, why = _resolve(report, configs_dir)
        if resolved is None:
            cases.append(case.model_copy(update={"page_reason": why, "full_reason": why}))
            continue
        try:
            result = _judge(engine, report, resolved)
        except KvplanError as exc:
            reason = exc.message.removeprefix(f"{report.case_id}: ")
            cases.append(case.model_copy(update={"page_reason": reason, "full_reason": reason}))
            continue
        page = _page(result)
        full, full_reason = _full(report, result)
        budget = next((c for c in (result.budget.comparisons if result.budget else []) if c.within is not None), None)
        cases.append(case.model_copy(update={
            "rules": result.rules, "page": page, "page_reason": None if page else "no pool memory and tokens to compare",
            "full": full, "full_reason": full_reason, "budget_rule": budget, "notes": result.notes}))
    return EngineValidation(engine=engine, reports_file=str(path), reports=len(reports), cases=cases,
                            goals=engine_goals(engine, cases), notes=[
                                "error = (predicted - reported) / reported; the full budget's miss is a share of "
                                "the GPU's CUDA total",
                                "a report is judged as `kvplan check-log` judges its quote, with the settings the "
                                "report states given"])


def _short_reason(reason: str | None) -> str:
    """A report's reason, without its model's name, so reports of one reason are listed together."""
    text = reason or "nothing to compare"
    return "no config (bundled or --configs)" if text.startswith("no config for") else text


def engine_goals(engine: str, cases: list[EngineCase]) -> list[EngineGoal]:
    label = LABELS[engine]
    judged = [c for c in cases if c.page and c.page.error_pct is not None]
    near = [c.case_id for c in judged if abs(c.page.error_pct) <= PAGE_GOAL_PCT]
    missed = [f"{c.case_id} ({c.page.error_pct:+.2f}%" + (", the report contradicts itself" if c.contradiction else "")
              + ")" for c in judged if c.case_id not in near]
    why: dict[str, list[str]] = {}
    for c in cases:
        if c not in judged:
            why.setdefault(_short_reason(c.page_reason), []).append(c.case_id)
    # The goal is over every public report: one page math cannot judge counts against it.
    share = len(near) / len(cases)
    goals = [EngineGoal(
        name=f"{label} page math: pool tokens from the printed memory",
        target=f"within {PAGE_GOAL_PCT}% on >= {PAGE_GOAL_SHARE:.0%} of the engine's public reports",
        achieved=(f"{len(near)}/{len(cases)} ({share:.0%}); of the {len(judged)} it can judge, {len(near)} within"
                  + (f"; missed: {', '.join(missed)}" if missed else "")
                  + "".join(f"; not judged, {reason}: {', '.join(ids)}" for reason, ids in why.items())),
        met=share >= PAGE_GOAL_SHARE)]
    fulls = [c for c in cases if c.full]
    near_full = [c.case_id for c in fulls if abs(c.full.error_of_gpu_pct) <= FULL_GOAL_PCT]
    far = [f"{c.case_id} ({c.full.error_of_gpu_pct:+.1f}%)" for c in fulls if c.case_id not in near_full]
    share = len(near_full) / len(fulls) if fulls else 0.0
    enough = ("model, GPU, TP, mem_fraction_static or release" if engine == "sglang" else
              "PyTorch backend, model, GPU, TP, release or free_gpu_memory_fraction")
    achieved = f"{len(near_full)}/{len(fulls)} of {len(cases)} reports" + (f"; missed: {', '.join(far)}" if far else "")
    if engine == "trtllm":
        shown = [f"{c.case_id} {c.full.error_of_gpu_pct:+.2f}%" for c in fulls]
        achieved += (f" ({', '.join(shown)} of the GPU)" if shown else "")
        unjudged: dict[str, list[str]] = {}
        for c in cases:
            if not c.full:
                unjudged.setdefault(_short_reason(c.full_reason), []).append(c.case_id)
        achieved += "".join(f"; not judged, {reason}: {', '.join(ids)}" for reason, ids in unjudged.items())
        rules = [c for c in cases if c.budget_rule is not None]
        ok = [c.case_id for c in rules if c.budget_rule.within]
        achieved += f"; the budget rule given the printed peak agrees on {len(ok)}/{len(rules)} reports that print it"
    goals.append(EngineGoal(
        name=f"{label} full budget: the pool from the GPU and the settings",
        target=f"within {FULL_GOAL_PCT}% of the GPU's memory on >= {FULL_GOAL_SHARE:.0%} of the reports that state "
               f"enough ({enough})",
        achieved=achieved, met=bool(fulls) and share >= FULL_GOAL_SHARE))
    return goals


__all__ = ["EngineValidation", "REPORT_FILES", "engine_goals", "engine_of_file", "load_engine_reports",
           "validate_engine"]
