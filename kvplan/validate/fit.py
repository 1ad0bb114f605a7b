"""Fit the overhead model (kvplan/plan/overhead.py) on the public start-up reports only.

Observations, per report (per device, GiB as vLLM printed them):

    overhead = requested - weights - available_kv          (= activation + non_torch)
    requested = CUDA total x gpu_memory_utilization       (the report's logged total if given)

and, where the source printed it, the activation ("torch peak increase") alone.

Procedure (robust, no per-model constants):

1. ``sampler_bytes_per_logit`` b: least absolute deviations through the origin of
   ``activation - MNBT * hidden * dtype_bytes = b * R * vocab`` over the reports that print
   their activation (R = min(MNBT, max_num_seqs), vLLM's defaults for the GPU and version).
   LAD here is the logits-weighted median of the per-report ratios.
2. ``non_torch`` for TP = 1 and TP > 1: the median (the LAD constant) of
   ``overhead - activation`` per group, with the printed activation where there is one,
   else the modelled one.
3. Ranges: the activation range is the envelope (min, max) of measured / modelled sampler
   memory over the fitted reports; the non-torch range is the largest deviation of a fitted
   report from its group's value.

A report is left out (with its reason) when the model form does not describe it: the V0
engine, speculative decoding, vLLM >= 0.20 with CUDA graphs (their estimate is folded into
the same difference), figures that contradict each other (weights + activation + KV above
the requested memory), or missing figures. CUDA-graph memory is not fitted: no public report
isolates it, so ``cudagraph_gib`` stays a prior, labelled as such.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from kvplan.errors import KvplanError
from kvplan.paths import PROFILES_DIR, write_file_safely
from kvplan.plan.overhead import OVERHEAD_FILE, OverheadModel, overhead_from_dict
from kvplan.stats import lad_through_origin, median
from kvplan.units import GiB
from kvplan.validate.cases import Case, full_budget, resolve_case, unusable
from kvplan.validate.reports import DEFAULT_REPORTS, Report, load_reports

# Not fitted (see the module docstring): the planner core's provisional CUDA-graph range.
CUDAGRAPH_PRIOR_GIB = (0.25, 0.6, 1.5)
CUDAGRAPH_PRIOR_SOURCE = (
    "prior, not fitted: no public report isolates CUDA-graph memory under vLLM >= 0.20 (the only "
    "releases that subtract it); kept from the planner core's provisional range. Reference points: "
    "about 2.4 GiB per card on 4x RTX 4090 with vLLM 0.5.4 (vllm-project/vllm#7553), where graphs "
    "were not yet budgeted before the KV cache"
)
ROUND = 4  # decimals stored; the test re-runs the fit and compares at this precision

_ZERO = OverheadModel(0.0, 0.0, 0.0, 0, 0, 0, (0, 0, 0), "zero")


class FitRow(BaseModel):
    """One report as the fit sees it."""

    case_id: str
    model: str
    tensor_parallel_size: int
    sampler_rows: int = 0
    vocab_size: int = 0
    max_num_batched_tokens: int = 0
    hidden_gib: float = 0.0  # retained [MNBT, hidden] output of the dummy forward
    requested_gib: float = 0.0
    weights_gib: float | None = None
    kv_gib: float | None = None
    activation_gib: float | None = None
    overhead_gib: float | None = None  # requested - weights - kv
    excluded: str | None = None
    # Filled by the fit:
    used_for: list[str] = []
    bytes_per_logit: float | None = None  # this report's own (activation - hidden) / logits
    modelled_activation_gib: float | None = None
    non_torch_gib: float | None = None
    non_torch_residual_gib: float | None = None
    predicted_kv_gib: float | None = None  # with the fitted model and the reported weights
    kv_residual_gib: float | None = None  # reported - predicted
    kv_error_pct: float | None = None

    @property
    def logits(self) -> int:
        return self.sampler_rows * self.vocab_size


class FitResult(BaseModel):
    sampler_bytes_per_logit: float
    sampler_spread: tuple[float, float]
    non_torch_gib_single: float
    non_torch_gib_multi: float
    non_torch_spread_gib: float
    rows: list[FitRow]

    def model(self, source: str = "fit") -> OverheadModel:
        return overhead_from_dict(self.coefficients(), source)

    def coefficients(self) -> dict:
        return {
            "sampler_bytes_per_logit": self.sampler_bytes_per_logit,
            "sampler_spread": list(self.sampler_spread),
            "non_torch_gib_single": self.non_torch_gib_single,
            "non_torch_gib_multi": self.non_torch_gib_multi,
            "non_torch_spread_gib": self.non_torch_spread_gib,
            "cudagraph_gib": list(CUDAGRAPH_PRIOR_GIB),
        }


def _exclusion(case: Case) -> str | None:
    r = case.report
    if case.problem:
        return case.problem
    if case.device is None:
        return "no GPU named: the requested memory is unknown"
    if r.reported_weights_gib is None or r.reported_kv_memory_gib is None:
        return "weights or available KV memory not reported"
    if case.is_v0:
        return "V0 engine: its profile run is not the V1 sampler peak this model describes"
    if r.kvplan.speculative_decoding:
        return f"{r.kvplan.speculative_decoding} speculative decoding adds draft weights and activations"
    if case.rules.subtracts_cudagraph_memory and not case.settings.enforce_eager:
        why = "version not given, so " if not r.version_text else ""
        return f"{why}vLLM >= 0.20 rules subtract CUDA graphs, which are not separable from non-torch memory"
    if r.kvplan.platform == "rocm":
        return "ROCm"
    return None


def build_row(case: Case) -> FitRow:
    r = case.report
    row = FitRow(case_id=r.case_id, model=r.model, tensor_parallel_size=case.settings.tensor_parallel_size)
    reason = _exclusion(case)
    if case.arch is not None and case.device is not None:
        cap = full_budget(case, _ZERO)
        assert cap is not None
        rows = min(cap.limits.max_num_seqs, cap.limits.max_num_batched_tokens)
        row = row.model_copy(update={
            "sampler_rows": rows,
            "vocab_size": case.arch.vocab_size,
            "max_num_batched_tokens": cap.limits.max_num_batched_tokens,
            "hidden_gib": cap.limits.max_num_batched_tokens * case.arch.hidden_size * case.arch.model_dtype_bytes / GiB,
            "requested_gib": (case.requested_bytes or 0) / GiB,
        })
    row = row.model_copy(update={
        "weights_gib": r.reported_weights_gib,
        "kv_gib": r.reported_kv_memory_gib,
        "activation_gib": r.kvplan.reported_activation_gib,
    })
    if reason is None:
        overhead = row.requested_gib - row.weights_gib - row.kv_gib  # type: ignore[operator]
        row = row.model_copy(update={"overhead_gib": overhead})
        if overhead - (row.activation_gib or 0) < 0:
            reason = (f"inconsistent figures: weights {row.weights_gib} + activation {row.activation_gib or 0} "
                      f"+ KV {row.kv_gib} GiB exceed the requested {row.requested_gib:.2f} GiB")
    return row.model_copy(update={"excluded": reason})


def fit_rows(rows: list[FitRow], leave_out: str | None = None) -> FitResult:
    """The coefficients from the usable rows (optionally without one report)."""
    usable = [r for r in rows if r.excluded is None and r.case_id != leave_out]
    act = [r for r in usable if r.activation_gib is not None and r.logits > 0]
    if not act:
        raise KvplanError("no report prints its activation peak: the sampler term cannot be fitted")
    x = [r.logits for r in act]
    y = [r.activation_gib * GiB - r.hidden_gib * GiB for r in act]  # type: ignore[operator]
    b = round(lad_through_origin(x, y), ROUND)
    ratios = [yi / (b * xi) for xi, yi in zip(x, y)]
    spread = (round(max(0.0, 1 - min(ratios)), ROUND), round(max(0.0, max(ratios) - 1), ROUND))

    def modelled(r: FitRow) -> float:
        return (b * r.logits) / GiB + r.hidden_gib

    def group(r: FitRow) -> str:
        return "single" if r.tensor_parallel_size == 1 else "multi"

    non_torch: dict[str, list[float]] = {"single": [], "multi": []}
    for r in usable:
        activation = r.activation_gib if r.activation_gib is not None else modelled(r)
        non_torch[group(r)].append(r.overhead_gib - activation)  # type: ignore[operator]
    if not non_torch["single"] or not non_torch["multi"]:
        raise KvplanError("the fit needs usable reports with TP = 1 and with TP > 1")
    nt = {g: round(median(v), ROUND) for g, v in non_torch.items()}
    nt_spread = round(max(abs(v - nt[g]) for g, vs in non_torch.items() for v in vs), ROUND)

    act_ids = {r.case_id for r in act}
    out: list[FitRow] = []
    for r in rows:
        if r.excluded is not None or r.case_id == leave_out:
            out.append(r)
            continue
        used = ["non_torch"] + (["activation"] if r.case_id in act_ids else [])
        activation = r.activation_gib if r.activation_gib is not None else modelled(r)
        nt_own = r.overhead_gib - activation  # type: ignore[operator]
        predicted = r.requested_gib - r.weights_gib - modelled(r) - nt[group(r)]  # type: ignore[operator]
        per_logit = (r.activation_gib - r.hidden_gib) * GiB / r.logits if r.activation_gib is not None else None
        out.append(r.model_copy(update={
            "used_for": used,
            "bytes_per_logit": None if per_logit is None else round(per_logit, 3),
            "modelled_activation_gib": round(modelled(r), 4),
            "non_torch_gib": round(nt_own, 4),
            "non_torch_residual_gib": round(nt_own - nt[group(r)], 4),
            "predicted_kv_gib": round(predicted, 4),
            "kv_residual_gib": round(r.kv_gib - predicted, 4),  # type: ignore[operator]
            "kv_error_pct": round(100 * (predicted - r.kv_gib) / r.kv_gib, 3),  # type: ignore[operator]
        }))
    return FitResult(sampler_bytes_per_logit=b, sampler_spread=spread, non_torch_gib_single=nt["single"],
                     non_torch_gib_multi=nt["multi"], non_torch_spread_gib=nt_spread, rows=out)


def fit_reports(reports: list[Report], configs_dir: Path | None = None, leave_out: str | None = None) -> FitResult:
    """Fit on every report it can use; one it cannot (a failed start-up's negative pool, settings
    no release accepts) is a row excluded with the reason, as `kvplan validate` skips it."""

    rows = []
    for r in reports:
        reason = unusable(r)
        if reason is None:
            try:
                rows.append(build_row(resolve_case(r, configs_dir)))
                continue
            except KvplanError as exc:
                reason = exc.message
        rows.append(FitRow(case_id=r.case_id, model=r.model, tensor_parallel_size=r.tensor_parallel_size or 1,
                           excluded=f"skipped: {reason}"))
    return fit_rows(rows, leave_out)


def overhead_document(result: FitResult, reports_file: Path) -> dict:
    """The content of profiles/overhead.json: coefficients first, then how they were made."""
    try:
        shown = "profiles/" + reports_file.resolve().relative_to(PROFILES_DIR.resolve()).as_posix()
    except ValueError:
        shown = str(reports_file)
    used = [r.case_id for r in result.rows if r.used_for]
    return {
        "source": f"fitted by kvplan.validate.fit (`kvplan validate --fit`) on {shown}: {len(used)} reports",
        **result.coefficients(),
        "cudagraph_source": CUDAGRAPH_PRIOR_SOURCE,
        "method": (
            "sampler_bytes_per_logit: least absolute deviations through the origin of (activation - MNBT x hidden x "
            "dtype bytes) on min(MNBT, max_num_seqs) x vocab logits, over reports that print their activation; "
            "non_torch: median of (requested - weights - available KV - activation) for TP = 1 and TP > 1; "
            "sampler_spread: 1 - min and max - 1 of measured / modelled sampler memory; non_torch_spread: "
            "largest deviation from the group value"
        ),
        "fit": {
            "reports_file": shown,
            "used": used,
            "rows": [r.model_dump(exclude_none=True) for r in result.rows],
        },
    }


def write_overhead(result: FitResult, reports_file: Path, path: Path = OVERHEAD_FILE) -> Path:
    return write_file_safely(path, json.dumps(overhead_document(result, reports_file), indent=2) + "\n")


def run_fit(reports_file: Path | None = None, configs_dir: Path | None = None) -> FitResult:
    file = reports_file or DEFAULT_REPORTS
    return fit_reports(load_reports(file), configs_dir)
