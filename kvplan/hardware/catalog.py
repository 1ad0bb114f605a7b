"""The GPU catalog (profiles/gpus.json) and the ``--gpu`` / ``--gpu-mem`` parsing.

Driver memory is what nvidia-smi prints; vLLM budgets from ``cudaMemGetInfo``'s total,
which is a few hundred MiB lower (an H100 80GB shows 81,559 MiB in nvidia-smi and
79.18 GiB to vLLM). Rows carry the measured CUDA total where a source gives one; for the
others the reserve is the median gap of the rows that have both, so no constant is
invented here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.paths import PROFILES_DIR
from kvplan.stats import median
from kvplan.units import GiB, MiB, parse_bytes
from kvplan.vllm.platforms import CUDA, host_cpu_platform

GPUS_FILE = PROFILES_DIR / "gpus.json"


@dataclass(frozen=True)
class Device:
    """One accelerator model as kvplan sizes it."""

    name: str
    memory_bytes: int  # driver-reported total (nvidia-smi)
    cuda_total_bytes: int  # what vLLM's budget starts from
    cuda_total_measured: bool  # False when estimated from the driver total
    bandwidth_gbps: float | None = None
    bf16_dense_tflops: float | None = None
    host_link: str | None = None  # what a host <-> GPU copy goes over: "PCIe 5.0 x16", "NVLink-C2C"
    host_link_gbps: float | None = None  # its rate, one direction, GB/s
    vendor: str = "nvidia"
    source: str = ""
    # datacenter | workstation | desktop (profiles/gpus.json "class"): what "another GPU" may be.
    gpu_class: str = "datacenter"
    # CPU and GPU share one memory (DGX Spark's GB10): the host's own use counts as used GPU memory.
    unified_memory: bool = False
    # The attention backends' block-size rules (kvplan.plan.layout.Platform); None: by vendor.
    platform_rules: object | None = None
    # Set by find_device when the name asked matches several catalog variants ("A100"): which
    # one was picked and how to name another. Empty when the name was unambiguous.
    selection_note: str = field(default="", compare=False)

    @property
    def platform(self):
        """The attention backends' block-size rules for this device (kvplan.plan.layout)."""

        if self.platform_rules is not None:
            return self.platform_rules
        return host_cpu_platform() if self.vendor == "cpu" else CUDA

    @property
    def is_hopper(self) -> bool:
        """SM90: H100, H200, H800, H20, GH200."""
        return self.name.upper().startswith(("H100", "H200", "H800", "H20", "GH200"))

    @property
    def is_blackwell(self) -> bool:
        return self.name.upper().startswith(("B200", "B100", "GB200", "RTX 5090", "B300"))


@dataclass(frozen=True)
class GpuSelection:
    """``--gpu 4xH100``: a device model and how many of them."""

    device: Device
    count: int


def _normalize(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


@lru_cache(maxsize=1)
def ambiguous_aliases(path: str | None = None) -> dict[str, str]:
    """Normalized alias -> canonical name, for aliases a row marks as ambiguous (``"A100"``
    names four variants; the catalog maps it to one and says so)."""
    file = Path(path) if path else GPUS_FILE
    try:
        rows = json.loads(file.read_text())["gpus"]
    except (OSError, ValueError, KeyError) as exc:
        raise KvplanError(f"cannot read the GPU catalog {file}: {exc}") from None
    return {_normalize(a): row["name"] for row in rows for a in row.get("ambiguous_aliases", [])}


def _variants(name: str, devices: dict[str, Device]) -> list[str]:
    family = name.split()[0]
    return [d for d in devices if d != name and d.split()[0] == family]


@lru_cache(maxsize=1)
def load_catalog(path: str | None = None) -> tuple[dict[str, Device], dict[str, str]]:
    """Devices by canonical name, and every normalized alias -> canonical name."""
    file = Path(path) if path else GPUS_FILE
    try:
        rows = json.loads(file.read_text())["gpus"]
    except (OSError, ValueError, KeyError) as exc:  # a broken install, not user input
        raise KvplanError(f"cannot read the GPU catalog {file}: {exc}") from None
    gaps = [
        row["memory_mib"] * MiB - row["cuda_total_gib"] * GiB
        for row in rows
        if row.get("cuda_total_gib") and row.get("memory_mib")
    ]
    reserve = median(gaps) if gaps else 0
    devices: dict[str, Device] = {}
    aliases: dict[str, str] = {}
    for row in rows:
        measured = bool(row.get("cuda_total_gib"))
        memory = int(row["memory_mib"] * MiB)
        cuda_total = int(row["cuda_total_gib"] * GiB) if measured else int(memory - reserve)
        device = Device(
            name=row["name"],
            memory_bytes=memory,
            cuda_total_bytes=cuda_total,
            cuda_total_measured=measured,
            bandwidth_gbps=row.get("bandwidth_gbps"),
            bf16_dense_tflops=row.get("bf16_dense_tflops") or row.get("fp16_dense_tflops"),
            host_link=row.get("host_link"),
            host_link_gbps=row.get("host_link_gbps"),
            vendor=row.get("vendor", "nvidia"),
            source=row.get("memory_source", ""),
            gpu_class=row.get("class", "datacenter"),
            unified_memory=bool(row.get("unified_memory", False)),
        )
        devices[device.name] = device
        for alias in [row["name"], *row.get("aliases", [])]:
            aliases.setdefault(_normalize(alias), device.name)
    return devices, aliases


def find_device(name: str) -> Device:
    """A catalog device by any forgiving alias, or an error with suggestions."""
    devices, aliases = load_catalog()
    key = _normalize(name)
    for candidate in (key, key.removeprefix("nvidia"), key.removeprefix("nvidiageforce"), key.removeprefix("geforce")):
        if candidate in aliases:
            device = devices[aliases[candidate]]
            if candidate in ambiguous_aliases():
                others = _variants(device.name, devices)
                hint = others[0].replace(" ", "-") if others else device.name
                device = replace(device, selection_note=(
                    f"--gpu {name.strip()} names {len(others) + 1} variants: planned as {device.name} "
                    f"(others: {', '.join(others)}); name one, e.g. --gpu {hint}"))
            return device
    import difflib  # only for a name the catalog does not know

    close = difflib.get_close_matches(key, list(aliases), n=3, cutoff=0.6)
    names = list(dict.fromkeys(devices[aliases[c]].name for c in close))
    hint = f"did you mean {', '.join(names)}?" if names else "see `kvplan gpus` for the catalog"
    raise KvplanError(f"unknown GPU {name!r}", f"{hint}; or give its memory with --gpu-mem 24GiB")


_COUNT_RE = re.compile(r"^\s*(\d+)\s*[x×*]\s*(.+)$", re.IGNORECASE)


def parse_gpu(spec: str, count: int | None = None) -> GpuSelection:
    """``H100``, ``4xH100``, ``2x4090``; ``count`` (``--gpus``) applies when no ``Nx``."""
    match = _COUNT_RE.match(spec)
    n = count or 1
    if match:
        n_text, spec = match.groups()
        if count and int(n_text) != count:
            raise KvplanError(f"--gpu {match.group(0)!r} and --gpus {count} disagree")
        n = int(n_text)
    if n <= 0:
        raise KvplanError(f"GPU count must be at least 1, got {n}")
    return GpuSelection(find_device(spec), n)


def custom_device(memory: str, name: str | None = None) -> Device:
    """``--gpu-mem 24GiB``: a device known only by its memory (taken as the CUDA total)."""
    size = parse_bytes(memory, "GPU memory")
    return Device(
        name=name or f"custom {size / GiB:.0f} GiB",
        memory_bytes=size,
        cuda_total_bytes=size,
        cuda_total_measured=True,
        source="--gpu-mem",
    )
