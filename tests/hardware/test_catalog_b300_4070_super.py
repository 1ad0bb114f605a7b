"""Issue 25 item 3: the RTX 4070 Super row and the B300 row at its driver total. Each resolves by its common names
(the existing alias style: "4070 super", nvidia-smi's name) and `kvplan size --gpu b300` / `--gpu 4070-super` plan on
it. Expected figures are the sources' own (profiles/gpus.json quotes them)."""

from __future__ import annotations

import json

import pytest

from kvplan.hardware.catalog import find_device, load_catalog
from kvplan.units import MiB


@pytest.mark.parametrize("alias, name", [
    ("4070-super", "RTX 4070 Super"),
    ("4070 super", "RTX 4070 Super"),
    ("4070S", "RTX 4070 Super"),
    ("RTX 4070 SUPER", "RTX 4070 Super"),
    ("NVIDIA GeForce RTX 4070 SUPER", "RTX 4070 Super"),  # nvidia-smi's name (report tr016)
    ("4070 ti super", "RTX 4070 Ti Super"),  # unchanged
    ("b300", "B300"),
    ("NVIDIA B300 SXM6 AC", "B300"),  # nvidia-smi's name (report tr011)
    ("hgx b300", "B300"),
])
def test_names_resolve(alias, name):
    device = find_device(alias)
    assert device.name == name and device.selection_note == ""


def test_driver_totals_are_the_nvidia_smi_figures():
    """nvidia-smi: 'NVIDIA GeForce RTX 4070 SUPER, 12282 MiB' and 'NVIDIA B300 SXM6 AC, 275040 MiB' (public files,
    see the rows). Neither has a measured CUDA total, so it is the driver total less the catalog's median reserve:
    below the driver total, above it less 1 GiB."""
    devices, _ = load_catalog()
    for name, mib in (("RTX 4070 Super", 12_282), ("B300", 275_040)):
        device = devices[name]
        assert device.memory_bytes == mib * MiB
        assert not device.cuda_total_measured
        assert device.memory_bytes - 1024 * MiB < device.cuda_total_bytes < device.memory_bytes
    assert devices["RTX 4070 Super"].gpu_class == "desktop" and devices["B300"].is_blackwell


@pytest.mark.parametrize("gpu, name, mib", [("b300", "B300", 275_040), ("4070-super", "RTX 4070 Super", 12_282)])
def test_size_plans_on_them(gpu, name, mib):
    """Qwen3-0.6B (28 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 114,688 B a token) fits either GPU."""
    from helpers.harness import invoke

    r = invoke("size", "Qwen/Qwen3-0.6B", "--gpu", gpu, "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gpu"] == name
    t = invoke("size", "Qwen/Qwen3-0.6B", "--gpu", gpu, "--engine", "trtllm", "--json")
    assert t.code == 0, t.stderr
    pool = json.loads(t.stdout)["engines"][0]
    assert pool["kv_bytes_per_token_per_gpu"] == 114_688 and pool["pool_tokens"] > 0
    terms = {x["name"]: x["bytes"] for x in pool["memory_terms"]}
    assert mib * MiB - 1024 * MiB < terms["CUDA total"] < mib * MiB
