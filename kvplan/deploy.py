"""The edge shared by `size`, `check` and `validate`: resolve a model and GPUs, then plan.

This is where I/O meets the pure planner: model configs (local, Hub, bundled), the GPU
catalog or NVML, the overhead model and user calibrations on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection, custom_device, load_catalog, parse_gpu
from kvplan.model.arch import Architecture, parse_architecture
from kvplan.model.source import ModelConfig, resolve_model
from kvplan.plan.overhead import OverheadModel, load_overhead
from kvplan.plan.schema import Settings, SizePlan
from kvplan.plan.size import ModelRef, plan_size
from kvplan.plan.versions import rules_for


@dataclass(frozen=True)
class ResolvedModel:
    config: ModelConfig
    arch: Architecture


def load_model(
    name: str,
    revision: str | None = None,
    source: str = "auto",
    offline: bool | None = None,
    overrides: dict[str, Any] | None = None,
) -> ResolvedModel:
    config = resolve_model(name, revision=revision, source=source, offline=offline)
    return ResolvedModel(config, parse_architecture(config.config, overrides))


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
        from kvplan.hardware.nvml import detect_gpus

        found = detect_gpus()
        return GpuSelection(found.device, gpus or found.count)
    return parse_gpu(gpu, gpus)


def plan_deployment(
    model: ResolvedModel,
    gpus: GpuSelection,
    settings: Settings,
    vllm_version: str | None = None,
    overhead: OverheadModel | None = None,
) -> SizePlan:
    rules = rules_for(vllm_version)
    ref = ModelRef(
        name=model.config.name,
        source=model.config.source,
        detail=model.config.detail,
    )
    devices, _ = load_catalog()
    plan = plan_size(ref, model.arch, gpus, settings, rules, overhead or load_overhead(), list(devices.values()))
    if model.config.notes:
        plan = plan.replace(notes=list(model.config.notes) + plan.notes)
    return plan
