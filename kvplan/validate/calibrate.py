"""A vLLM start-up log -> a Calibration (what `kvplan calibrate` records).

The log gives the release, the settings, the loaded weights and the available KV memory
(`kvplan.vllm.startup_log.parse_startup_log`); the GPU comes from ``--gpu`` unless the log prints its
total (V0). kvplan's own prediction for the same start-up is computed with the loaded weights
given, so the recorded residual is the overhead model's error alone.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from kvplan.calibration import Calibration
from kvplan.deploy import load_model_from_log, select_gpus
from kvplan.errors import KvplanError
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import settings_from_engine_args
from kvplan.units import GiB
from kvplan.vllm.rules import rules_for
from kvplan.vllm.startup_log import parse_startup_log

ENGINE_LOG = "engine.log"  # what a bench run folder holds

# The largest |measured - predicted overhead| a start-up of this kind can explain: the fitted model's
# terms (sampler peak, non-torch memory, CUDA graphs) are each off by well under a GiB on the public
# reports; more than this means another process on the GPU, the wrong --gpu or utilization, or a log
# of a different engine, and recording it would shift every later `kvplan size` by that much.
MAX_RESIDUAL_GIB = 4.0
MAX_RESIDUAL_SHARE = 0.15  # of the requested memory, for large GPUs


def log_path(path: Path) -> Path:
    """A log file, or a bench run folder holding ``engine.log``."""
    if path.is_dir():
        inner = path / ENGINE_LOG
        if not inner.is_file():
            raise KvplanError(f"{path} has no {ENGINE_LOG}", "pass the start-up log itself, or a bench run folder")
        return inner
    if not path.is_file():
        raise KvplanError(f"no such file or folder: {path}")
    return path


def measure(
    text: str,
    source: str,
    gpu: str | None = None,
    model: str | None = None,
    vllm_version: str | None = None,
    gpu_memory_utilization: float | None = None,
    usage_context: str = "serve",
) -> Calibration:
    """The calibration one start-up log supports, or a one-line error saying what is missing."""

    log = parse_startup_log(text)
    if log.platform == "CPU" or log.kv_pool == "CPU":
        raise KvplanError(f"{source} is a start-up of vLLM's CPU build: calibration records GPU start-ups")
    if log.weights_gib is None or log.available_kv_gib is None:
        missing = " and ".join(n for n, v in (("'Model loading took'", log.weights_gib),
                                               ("'Available KV cache memory'", log.available_kv_gib)) if v is None)
        raise KvplanError(f"{source} does not show {missing}", "pass the whole start-up log of one engine")
    if log.available_kv_gib <= 0:
        raise KvplanError(f"{source} shows a negative KV pool ({log.available_kv_gib} GiB available): a failed "
                          "start-up records nothing", "calibrate from a start-up that served")
    if log.weights_gib <= 0:
        raise KvplanError(f"{source} shows {log.weights_gib} GiB of loaded weights: not a start-up to calibrate from")
    if log.kv_cache_memory_bytes:
        raise KvplanError(f"{source} sets --kv-cache-memory-bytes: its KV memory was given, not measured")
    version = vllm_version or log.vllm_version
    if not version:
        raise KvplanError(f"{source} does not print the vLLM version", "pass --vllm-version 0.11.0")
    rules = rules_for(version)
    name = model or log.model
    if not name:
        raise KvplanError(f"{source} does not name the model", "pass --model org/name")
    # A path from the engine's machine falls back to the bundled profile by its last components;
    # the recorded model is the one actually planned (resolved.config.name).
    resolved = load_model_from_log(name, [])
    if not gpu:
        raise KvplanError(f"{source} does not name the GPU", "pass --gpu H100 (or auto)")
    device = select_gpus(gpu).device
    if log.total_memory_gib:
        device = replace(device, cuda_total_bytes=int(log.total_memory_gib * GiB), cuda_total_measured=True)
    util = gpu_memory_utilization or log.gpu_memory_utilization
    weights = round(log.weights_gib * GiB)
    # The budget as vLLM computed it: no pinned KV size or block count, the measured weights.
    settings = settings_from_engine_args(log, gpu_memory_utilization=util, kv_cache_memory_bytes=None,
                                         num_gpu_blocks_override=None, enable_prefix_caching=None,
                                         usage_context=usage_context, weights_bytes=weights)
    cap = compute_capacity(resolved.arch, device, settings, rules, load_overhead())
    st = cap.limiting_stage
    requested_gib = st.requested / GiB
    overhead_gib = requested_gib - log.weights_gib - log.available_kv_gib
    if overhead_gib < 0:
        raise KvplanError(
            f"the log's weights {log.weights_gib} + KV {log.available_kv_gib} GiB exceed {device.name}'s "
            f"{requested_gib:.2f} GiB (total x {util or rules.default_gpu_memory_utilization})",
            "check --gpu and --gpu-memory-utilization",
        )
    predicted_gib = (st.requested - st.weights - st.available.bytes) / GiB
    residual = overhead_gib - predicted_gib
    bound = max(MAX_RESIDUAL_GIB, MAX_RESIDUAL_SHARE * requested_gib)
    if abs(residual) > bound:
        raise KvplanError(
            f"implausible residual: {source} shows {overhead_gib:.2f} GiB of overhead where kvplan's model predicts "
            f"{predicted_gib:.2f} GiB ({residual:+.2f} GiB; at most {bound:.2f} GiB is plausible)",
            "check --gpu and --gpu-memory-utilization, and that nothing else used the GPU",
        )
    return Calibration(
        gpu=device.name,
        vllm_version=rules.version,
        model_family=resolved.arch.model_type,
        model=resolved.config.name,
        tensor_parallel_size=settings.tensor_parallel_size,
        requested_gib=round(requested_gib, 4),
        weights_gib=log.weights_gib,
        available_kv_gib=log.available_kv_gib,
        overhead_gib=round(overhead_gib, 4),
        predicted_overhead_gib=round(predicted_gib, 4),
        max_num_seqs=cap.limits.max_num_seqs,
        max_num_batched_tokens=cap.limits.max_num_batched_tokens,
        source=source,
        recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
