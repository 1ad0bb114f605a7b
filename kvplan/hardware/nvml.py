"""``--gpu auto``: read the local GPUs through NVML (the `nvidia-ml-py` package)."""

from __future__ import annotations

from dataclasses import replace

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device, GpuSelection, find_device


def detect_gpus() -> GpuSelection:
    """The first GPU's model and the number of GPUs visible to NVML."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        raise KvplanError("--gpu auto needs nvidia-ml-py", "pip install nvidia-ml-py, or name the GPU") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise KvplanError(f"--gpu auto found no NVIDIA driver ({exc})", "name the GPU, e.g. --gpu H100") from None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise KvplanError("--gpu auto found no GPUs", "name the GPU, e.g. --gpu H100")
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    finally:
        pynvml.nvmlShutdown()
    try:
        known = find_device(name)
        # Keep the catalog's figures but trust the driver's memory for this exact card.
        gap = known.memory_bytes - known.cuda_total_bytes
        device = replace(known, memory_bytes=total, cuda_total_bytes=total - gap)
    except KvplanError:
        device = Device(name=name, memory_bytes=total, cuda_total_bytes=total, cuda_total_measured=False)
    return GpuSelection(device, count)
