"""GPU telemetry during a bench point (`kvplan bench --gpu-metrics URL|nvml`): a DCGM exporter's /metrics, or the
local GPUs through NVML (`nvidia-ml-py`, a base dependency), sampled at the scrape interval and summarized per point
(`GpuFigures`), so a report shows whether the GPU or the KV pool was the limit.

The exporter's default counters (dcgm-exporter's default-counters.csv; its README's sample output,
https://github.com/NVIDIA/dcgm-exporter): ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` (MiB),
``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_SM_CLOCK`` (MHz), one sample per GPU (label ``gpu``). A value no GPU can
have (the exporter writes 9223372036854775794 for a field it cannot read) is dropped. The exporter is another origin
than the engine: no request to it carries the engine's key or headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

from kvplan.bench.client import Client
from kvplan.bench.results import GpuFigures

NVML = "nvml"
#: quantity -> the DCGM exporter's field
DCGM_FIELDS = {"util_pct": "DCGM_FI_DEV_GPU_UTIL", "memory_used_mib": "DCGM_FI_DEV_FB_USED",
               "power_w": "DCGM_FI_DEV_POWER_USAGE", "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK"}
#: Above these a figure is not a GPU's: a blank field's sentinel, or a lie.
_CEILING = {"util_pct": 100.0, "memory_used_mib": 16 * 2**20, "power_w": 100_000.0, "sm_clock_mhz": 100_000.0}

Sample = dict[str, dict[str, float]]  # gpu id -> quantity -> value


def parse_dcgm(text: str) -> Sample:
    """One DCGM exporter scrape: every GPU's figures (a sample per ``gpu`` label)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {field: quantity for quantity, field in DCGM_FIELDS.items()}
    out: Sample = {}
    for family in text_string_to_metric_families(text):
        quantity = wanted.get(family.name)
        if quantity is None:
            continue
        for s in family.samples:
            value = float(s.value)
            if math.isfinite(value) and 0 <= value <= _CEILING[quantity]:
                out.setdefault(s.labels.get("gpu") or s.labels.get("UUID") or "0", {})[quantity] = value
    return out


def nvml_sample() -> Sample:
    """The local GPUs now, through NVML (what nvidia-smi reads)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out: Sample = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out[str(i)] = {"util_pct": float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                           "memory_used_mib": pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                           "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                           "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))}
        return out
    finally:
        pynvml.nvmlShutdown()


def telemetry_client(client: Client) -> Client:
    """The engine's client policy (TLS, proxy) without its key, headers or URL credentials: the exporter is another
    origin, and none of them may go there."""
    return Client(use_env_proxy=client.use_env_proxy, ca_bundle=client.ca_bundle, insecure=client.insecure)


async def sample_during(source: str, client: Client, interval_s: float, done: asyncio.Event,
                        out: list[Sample]) -> None:
    """Sample ``source`` (a DCGM exporter URL, or "nvml") every ``interval_s`` until ``done``; a failed sample is
    skipped (the point's figures rest on the samples taken, and say how many)."""
    while not done.is_set():
        t0 = time.perf_counter()
        try:
            if source == NVML:
                sample = await asyncio.to_thread(nvml_sample)
            else:
                status, text = await asyncio.to_thread(client.get, source, max(1.0, 4 * interval_s))
                sample = await asyncio.to_thread(parse_dcgm, text) if status == 200 else {}
        except Exception:  # noqa: BLE001 - a scrape that failed is a sample missing, not a failed point
            sample = {}
        if sample:
            out.append(sample)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), max(0.0, interval_s - (time.perf_counter() - t0)))


def summarize_gpu(samples: list[Sample], source: str) -> GpuFigures | None:
    """A point's samples summarized over every GPU: mean and peak utilization, the fullest memory, the highest
    power, the lowest SM clock."""
    if not samples:
        return None

    def values(quantity: str) -> list[float]:
        return [g[quantity] for s in samples for g in s.values() if quantity in g]

    util = values("util_pct")
    memory, power, clock = values("memory_used_mib"), values("power_w"), values("sm_clock_mhz")
    return GpuFigures(
        source="NVML" if source == NVML else "DCGM exporter", gpus=len({gpu for s in samples for gpu in s}),
        samples=len(samples), util_mean_pct=round(sum(util) / len(util), 2) if util else None,
        util_peak_pct=max(util, default=None), memory_used_peak_mib=max(memory, default=None),
        power_peak_w=max(power, default=None), sm_clock_min_mhz=min(clock, default=None))
