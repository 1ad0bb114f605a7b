"""One report -> what the planner needs: architecture, device, settings, vLLM rules.

Every guess is written down in ``assumptions`` so the error table can say what it rests on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device, find_device
from kvplan.model.arch import Architecture, parse_architecture
from kvplan.model.source import load_bundled, read_config_file
from kvplan.plan.capacity import Capacity, compute_capacity, gpu_memory_utilization
from kvplan.plan.overhead import OverheadModel
from kvplan.plan.schema import Settings, settings_from_engine_args
from kvplan.units import GiB
from kvplan.validate.reports import Report
from kvplan.vllm.rules import NEWEST_KNOWN, VllmRules, rules_for


@dataclass(frozen=True)
class Case:
    """A report resolved for the planner. ``arch`` is None when no config is found;
    ``device`` None when the report names no GPU (full-budget mode then cannot run)."""

    report: Report
    arch: Architecture | None
    config_source: str
    device: Device | None
    settings: Settings
    rules: VllmRules
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    problem: str | None = None  # why the case cannot be predicted at all

    @property
    def case_id(self) -> str:
        return self.report.case_id

    @property
    def is_v0(self) -> bool:
        return self.rules.engine == "v0"

    @property
    def requested_bytes(self) -> float | None:
        """vLLM's requested memory: CUDA total x utilization (no rounding; vLLM's own
        ceil from 0.19.1 moves it by less than one byte)."""
        if self.device is None:
            return None
        util = gpu_memory_utilization(self.settings, self.rules, self.device)
        return self.device.cuda_total_bytes * util


def _config_from_dir(configs_dir: Path, name: str) -> tuple[dict[str, Any], str] | None:
    """``DIR/org--name.json`` (a bare config.json or a kvplan profile with a ``config`` key),
    ``DIR/org--name/config.json`` or ``DIR/org/name/config.json``."""
    slug = name.replace("/", "--")
    for path in (configs_dir / f"{slug}.json", configs_dir / slug / "config.json", configs_dir / name / "config.json"):
        if path.is_file():
            data = read_config_file(path)
            if isinstance(data.get("config"), dict):
                data = data["config"]
            return data, str(path)
    return None


def resolve_config(name: str, configs_dir: Path | None) -> tuple[dict[str, Any], str] | None:
    """A model's config.json from ``--configs DIR`` first, then the bundled profiles. Never
    the Hub: validation runs offline and gives the same answer everywhere."""
    if configs_dir is not None:
        found = _config_from_dir(configs_dir, name)
        if found:
            return found
    bundled = load_bundled(name)
    if bundled is not None:
        return bundled.config, bundled.detail
    return None


def device_for(report: Report) -> tuple[Device | None, list[str]]:
    """The catalog GPU the report names (parenthesised remarks dropped), with the CUDA total
    the engine logged when the report gives it: that is the figure vLLM budgeted from."""
    notes: list[str] = []
    if not report.gpu:
        return None, notes
    name = re.sub(r"\([^)]*\)", "", report.gpu).strip()
    try:
        device = find_device(name)
    except KvplanError:
        return None, [f"GPU {report.gpu!r} is not in the catalog"]
    if report.gpu_total_memory_gib_logged:
        device = replace(device, cuda_total_bytes=int(report.gpu_total_memory_gib_logged * GiB),
                         cuda_total_measured=True)
        notes.append(f"CUDA total {report.gpu_total_memory_gib_logged} GiB as logged")
    elif not device.cuda_total_measured:
        notes.append(f"{device.name}: CUDA total estimated from the catalog ({device.cuda_total_bytes / GiB:.2f} GiB)")
    return device, notes


def _stand_in_device(report: Report) -> Device | None:
    """For page math without a GPU name: a device at least as large as the weights plus the
    KV memory the report printed, which is all the page math needs (the scheduler-default tier
    decides max_num_batched_tokens, which sliding-window pages depend on)."""
    if report.reported_kv_memory_gib is None:
        return None
    floor = (report.reported_kv_memory_gib + (report.reported_weights_gib or 0)) * GiB
    return Device(name="unnamed GPU", memory_bytes=int(floor), cuda_total_bytes=int(floor),
                  cuda_total_measured=False, source="weights + KV from the report")


def resolve_case(report: Report, configs_dir: Path | None = None) -> Case:
    assumptions: list[str] = []
    cur = report.kvplan
    if report.vllm_version:
        rules = rules_for(report.vllm_version)
    elif cur.assumed_vllm_version:
        rules = rules_for(cur.assumed_vllm_version)
        assumptions.append(f"vLLM {rules.version} rules assumed: {cur.version_note or 'the report gives no version'}")
    else:
        rules = rules_for(None)
        assumptions.append(f"vLLM version not given: vLLM {NEWEST_KNOWN} rules assumed (newest known)")
    util = report.gpu_memory_utilization
    if util is None:
        default = (f"1.0 with the extensible KV cache on CUDA, else {rules.default_gpu_memory_utilization}"
                   if rules.extensible_kv_cache else rules.default_gpu_memory_utilization)
        assumptions.append(f"gpu_memory_utilization not given: the version default {default}")
    usage = cur.usage_context or "serve"
    if cur.usage_context == "llm":
        assumptions.append("offline LLM(): LLM-class scheduler defaults")
    settings = settings_from_engine_args(
        report,
        gpu_memory_utilization=util,
        usage_context=usage,
        draft_layers=int(getattr(cur, "draft_layers", 0) or 0),
        max_num_seqs=cur.max_num_seqs,
        max_num_batched_tokens=cur.max_num_batched_tokens,
        enable_prefix_caching=cur.enable_prefix_caching,
    )
    device, gpu_notes = device_for(report)
    assumptions += gpu_notes
    if cur.config_model:
        assumptions.append(f"config of {cur.config_model}: {cur.config_note}")
    found = resolve_config(report.config_model, configs_dir)
    if found is None:
        return Case(report, None, "", device, settings, rules, tuple(assumptions),
                    problem=f"no config for {report.config_model}")
    config, where = found
    try:
        arch = parse_architecture(config, cur.config_overrides)
    except KvplanError as exc:
        return Case(report, None, where, device, settings, rules, tuple(assumptions),
                    problem=f"config of {report.config_model} unreadable: {exc}")
    return Case(report, arch, where, device, settings, rules, tuple(assumptions))


def page_math(case: Case, overhead: OverheadModel) -> Capacity | None:
    """The pool from the reported available KV memory (vLLM's --kv-cache-memory-bytes path)."""
    kv = case.report.reported_kv_memory_gib
    device = case.device or _stand_in_device(case.report)
    if case.arch is None or kv is None or device is None:
        return None
    settings = case.settings.replace(kv_cache_memory_bytes=round(kv * GiB))
    return compute_capacity(case.arch, device, settings, case.rules, overhead)


def full_budget(case: Case, overhead: OverheadModel, weights_bytes: int | None = None) -> Capacity | None:
    """The pool from the GPU and settings alone (weights from the config, unless given)."""
    if case.arch is None or case.device is None:
        return None
    settings = case.settings
    if weights_bytes:
        settings = settings.replace(weights_bytes=weights_bytes)
    return compute_capacity(case.arch, case.device, settings, case.rules, overhead)


def known_limits(case: Case) -> list[str]:
    """What kvplan's model leaves out for this report, said up front."""
    out: list[str] = []
    cur = case.report.kvplan
    if cur.speculative_decoding and not getattr(cur, "draft_layers", 0) and not case.report.speculative_config:
        out.append(f"{cur.speculative_decoding} speculative decoding: draft-model KV layers are not modelled")
    if case.is_v0:
        out.append("V0 engine: its profile peak is the forward pass over max_num_batched_tokens, not the V1 "
                   "sampler peak the overhead model describes")
    if cur.platform == "rocm":
        out.append("ROCm platform")
    return out


# Figures no successful start-up prints: a report holding one is a failed start-up (or a typo), which
# no planner can reproduce. Such a report is skipped with a note, and the other reports still run.
_POSITIVE = ("reported_kv_memory_gib", "reported_gpu_blocks", "reported_kv_tokens", "reported_max_concurrency",
             "reported_weights_gib", "gpu_total_memory_gib_logged")


def unusable(report: Report) -> str | None:
    """Why a report cannot be compared at all (None: it can)."""
    for name in _POSITIVE:
        value = getattr(report, name)
        if value is None:
            continue
        if not math.isfinite(value):
            return f"{name} is {value}: not a figure vLLM prints"
        if value < 0 or (value == 0 and name != "reported_weights_gib"):
            what = "a negative pool" if name != "gpu_total_memory_gib_logged" else "a negative GPU memory"
            return f"{name} is {value:g}: {what}, as a failed start-up prints it"
    return None
