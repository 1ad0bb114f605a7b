"""The edge shared by `size`, `check` and `validate`: resolve a model and GPUs, then plan.

This is where I/O meets the pure planner: model configs (local, Hub, bundled), the GPU
catalog or NVML, the overhead model and user calibrations on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvplan.calibration import find_calibration
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection, custom_device, load_catalog, parse_gpu
from kvplan.hardware.nvml import detect_gpus
from kvplan.model.arch import Architecture, parse_architecture
from kvplan.model.hub_weights import hub_weights
from kvplan.model.source import ModelConfig, bundled_index, resolve_model
from kvplan.paths import calibration_file
from kvplan.plan.overhead import OverheadModel, load_overhead
from kvplan.plan.schema import Settings, SizePlan
from kvplan.plan.size import ModelRef, plan_size
from kvplan.plan.speculative import SpeculativeConfig, draft_model
from kvplan.units import GiB
from kvplan.vllm.engine_layout import engine_architecture
from kvplan.vllm.rules import rules_for


@dataclass(frozen=True)
class ResolvedModel:
    config: ModelConfig
    arch: Architecture
    # Exact loaded weight bytes (whole model) from the Hub's safetensors headers, when online.
    weights_total: int | None = None
    weights_source: str = "estimated from config.json"
    # Of weights_total: the multimodal towers, which --language-model-only does not load.
    tower_bytes: int = 0


def load_model(
    name: str,
    revision: str | None = None,
    source: str = "auto",
    offline: bool | None = None,
    overrides: dict[str, Any] | None = None,
    allow_unverified: bool = False,
    layout: str = "rules",
    vllm_version: str | None = None,
) -> ResolvedModel:
    """``layout="engine"`` replaces kvplan's layer specs with the ones the installed vLLM
    builds for a shrunk twin of the config (kvplan.vllm.engine_layout; cached)."""
    config = resolve_model(name, revision=revision, source=source, offline=offline)
    arch = parse_architecture(config.config, overrides, allow_unverified=allow_unverified or layout == "engine")
    if layout == "engine":
        arch = engine_architecture(config.config, overrides, arch, vllm_version)
    if config.source == "hub" and not overrides:
        exact = hub_weights(name, revision, arch.num_hidden_layers)
        if exact is not None and exact.loaded_bytes > 0:
            skipped = f", {exact.skipped_bytes / 2**30:.2f} GiB of MTP layers left out" if exact.skipped_bytes else ""
            return ResolvedModel(config, arch, exact.loaded_bytes,
                                 f"safetensors headers on the Hub ({exact.tensors:,} tensors{skipped})",
                                 exact.tower_bytes)
    return ResolvedModel(config, arch)


def load_draft(spec: SpeculativeConfig | None, source: str = "auto", offline: bool | None = None) -> SpeculativeConfig | None:
    """The speculative config with its drafter's config read (EAGLE heads and draft models bring their own layers
    and weights), found as a model is (a local folder, the Hub when online, a bundled profile). Where it cannot
    be loaded the config says why; the planner then assumes one target-shaped layer for EAGLE and refuses a
    draft model (kvplan.plan.capacity.speculative_draft_layers)."""
    if spec is None or not spec.reads_draft_config or spec.draft is not None:
        return spec
    try:
        config = resolve_model(spec.model, source=source, offline=offline)
        return replace(spec, draft=draft_model(spec.model, config.config, config.source, spec.method))
    except KvplanError as exc:
        return replace(spec, draft_unread=str(exc).rstrip("."))


def select_gpus(gpu: str | None, gpus: int | None = None, gpu_mem: str | None = None) -> GpuSelection:
    """``--gpu`` (name, ``4xH100`` or ``auto``), ``--gpus N``, or ``--gpu-mem 24GiB``."""
    if gpu_mem:
        if gpu and gpu != "auto":
            base = parse_gpu(gpu, gpus)
            return GpuSelection(custom_device(gpu_mem, base.device.name), base.count)
        return GpuSelection(custom_device(gpu_mem), gpus or 1)
    if not gpu:
        raise KvplanError("no GPU given", "pass --gpu H100 (or 4xH100, or auto), or --gpu-mem 24GiB")
    if gpu.strip().lower() == "auto":
        found = detect_gpus()
        return GpuSelection(found.device, gpus or found.count)
    return parse_gpu(gpu, gpus)


def plan_deployment(
    model: ResolvedModel,
    gpus: GpuSelection,
    settings: Settings,
    vllm_version: str | None = None,
    overhead: OverheadModel | None = None,
    use_calibration: bool = True,
    steptime: object | None = None,
    suggest: bool = True,
) -> SizePlan:
    """Plan one deployment. A user calibration (`kvplan calibrate`) for the same GPU, vLLM
    release and model family shifts the overhead model by its measured residual, and lends
    its loaded weights to the same model at the same TP; the plan's notes say so. An explicit
    ``overhead`` model is used as given. ``suggest``: as `plan_size`."""
    rules = rules_for(vllm_version)
    ref = ModelRef(
        name=model.config.name,
        source=model.config.source,
        detail=model.config.detail,
        weights_total=model.weights_total,
        weights_source=model.weights_source,
    )
    if settings.language_model_only and model.weights_total and model.tower_bytes:
        ref = replace(ref, weights_total=model.weights_total - model.tower_bytes,
                      weights_source=model.weights_source + ", multimodal towers left out (--language-model-only)")
    devices, _ = load_catalog()
    base = overhead or load_overhead()
    notes: list[str] = list(model.config.notes)
    if gpus.device.selection_note:  # `--gpu A100`: which variant was planned
        notes.append(gpus.device.selection_note)
    if use_calibration and overhead is None:
        base, ref, used = _apply_calibration(model, gpus, settings, rules.version, base, ref)
        notes += used
    plan = plan_size(ref, model.arch, gpus, settings, rules, base, list(devices.values()), steptime, suggest)
    if notes:
        plan = plan.replace(notes=notes + plan.notes)
    return plan


def _apply_calibration(
    model: ResolvedModel, gpus: GpuSelection, settings: Settings, version: str, base: OverheadModel, ref: ModelRef
) -> tuple[OverheadModel, ModelRef, list[str]]:

    if not calibration_file().exists():  # nothing recorded: no need to load the calibration module
        return base, ref, []

    cal = find_calibration(gpus.device.name, version, model.arch.model_type)
    if cal is None:
        return base, ref, []
    base = base.calibrated(round(cal.residual_gib * GiB), cal.label())
    note = (f"used calibration {cal.label()} from {calibration_file()}: overhead shifted by "
            f"{cal.residual_gib:+.3f} GiB (measured {cal.overhead_gib:.3f}, modelled {cal.predicted_overhead_gib:.3f})")
    same_model = cal.model.lower() == model.config.name.lower()
    if (same_model and cal.tensor_parallel_size == settings.tensor_parallel_size
            and settings.pipeline_parallel_size == 1 and not settings.weights_bytes):
        # The loaded weights per GPU, as the whole model's bytes (the planner divides by TP).
        total = round(cal.weights_gib * GiB) * cal.tensor_parallel_size
        ref = replace(ref, weights_total=total, weights_source=f"measured by kvplan calibrate ({cal.weights_gib} GiB per GPU)")
        note += f"; weights {cal.weights_gib} GiB per GPU as measured"
    return base, ref, [note]


# --- models named in vLLM logs (check-log, calibrate) ----------------------------------------


def _fallback_names(name: str) -> list[str]:
    """'/google/gemma-3-27b-it' -> ['google/gemma-3-27b-it', 'gemma-3-27b-it']."""
    parts = [p for p in name.replace("\\", "/").split("/") if p and p not in (".", "..", "...", "~")]
    out = []
    if len(parts) >= 2:
        out.append("/".join(parts[-2:]))
    if parts:
        out.append(parts[-1])
    return [n for n in out if n != name]


def _bundled_by_name(last: str) -> str | None:
    """``org/<last>`` when a bundled profile (or alias) has ``last`` as its repo name."""

    key = last.lower()
    for name in bundled_index():
        org, _, repo = name.rpartition("/")
        if repo == key and org:
            return f"{org}/{last}"
    return None


def load_model_from_log(name: str, notes: list[str]) -> ResolvedModel:
    """A model named in an engine log: as written, else by its last path components (the log
    may show a path on another machine, '/models/google/gemma-3-27b-it')."""
    try:
        return load_model(name)
    except KvplanError as first:
        for candidate in _fallback_names(name):
            if "/" not in candidate:
                candidate = _bundled_by_name(candidate) or candidate
                if "/" not in candidate:
                    continue
            try:
                found = load_model(candidate)
            except KvplanError:
                continue
            notes.append(f"model {name!r} is not readable here; planned with {found.config.name} "
                         f"({found.config.source}) from its last path components")
            return found
        raise KvplanError(f"cannot plan the log's model {name!r}: {first.message}",
                          "pass --model with a Hub id, a local folder or a bundled profile") from None
