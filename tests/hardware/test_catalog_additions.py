"""Issue 10 item 5, the second batch of catalog rows: RTX 4070 Ti Super, RTX 4080 Super, RTX PRO 4000
Blackwell, H800 SXM, GB200, MI308X. Each resolves by its common names, and its figures are the ones
the sources quoted in profiles/gpus.json give (expected values below are the source figures)."""

from __future__ import annotations

import json

import pytest

from kvplan.hardware.catalog import GPUS_FILE, find_device, load_catalog
from kvplan.units import MiB

NEW = ["RTX 4070 Ti Super", "RTX 4080 Super", "RTX PRO 4000 Blackwell", "H800 SXM", "GB200", "MI308X"]


@pytest.mark.parametrize("alias, name", [
    ("4070 Ti Super", "RTX 4070 Ti Super"),
    ("RTX 4070 Ti SUPER", "RTX 4070 Ti Super"),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", "RTX 4070 Ti Super"),  # nvidia-smi's name
    ("4080 super", "RTX 4080 Super"),
    ("4080S", "RTX 4080 Super"),
    ("rtx-4080-super", "RTX 4080 Super"),
    ("NVIDIA GeForce RTX 4080 SUPER", "RTX 4080 Super"),  # nvidia-smi's name
    ("4080", "RTX 4080"),  # the plain name keeps meaning the RTX 4080
    ("RTX 4080", "RTX 4080"),
    ("rtx pro 4000", "RTX PRO 4000 Blackwell"),
    ("RTX PRO 4000 Blackwell", "RTX PRO 4000 Blackwell"),
    ("rtx pro 6000", "RTX PRO 6000 Blackwell"),  # unchanged
    ("H800", "H800 SXM"),
    ("NVIDIA H800", "H800 SXM"),  # nvidia-smi's name
    ("h800-80gb", "H800 SXM"),
    ("GB200", "GB200"),
    ("NVIDIA GB200", "GB200"),  # nvidia-smi's name
    ("gb200 nvl72", "GB200"),
    ("B200", "B200"),  # unchanged
    ("MI308X", "MI308X"),
    ("AMD Instinct MI308X", "MI308X"),  # rocminfo's marketing name
    ("mi300x", "MI300X"),  # unchanged
])
def test_new_rows_resolve_by_their_common_names(alias, name):
    assert find_device(alias).name == name


def test_unambiguous_new_names_carry_no_selection_note():
    for alias in ("H800", "4080 super", "GB200", "MI308X", "rtx pro 4000", "4070 ti super"):
        assert find_device(alias).selection_note == "", alias


def test_ambiguous_names_still_say_which_variant():
    a100 = find_device("A100")
    assert a100.name == "A100 80GB SXM" and "planned as A100 80GB SXM" in a100.selection_note
    h100 = find_device("H100")
    assert h100.name == "H100 SXM" and "H800" not in h100.selection_note


def test_driver_memory_is_the_sourced_total():
    devices, _ = load_catalog()
    # https://github.com/utkuozdemir/nvidia_gpu_exporter/blob/0eee0d3187e2f014f1ba6736fd729a195e13a8c8/internal/captures/linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt
    # "FB Memory Usage  Total : 16376 MiB"
    assert devices["RTX 4080 Super"].memory_bytes == 16376 * MiB
    # nvidia-smi "NVIDIA GeForce RTX 4070 Ti SUPER, 16376 MiB" (public logs; no URL recorded, see the row)
    assert devices["RTX 4070 Ti Super"].memory_bytes == 16376 * MiB
    # nvidia-smi "NVIDIA H800, 81559 MiB" (public log; no URL recorded); 80 GiB HBM3 like H100 SXM per
    # https://github.com/ai-dynamo/aiconfigurator/pull/968
    assert devices["H800 SXM"].memory_bytes == 81559 * MiB == devices["H100 SXM"].memory_bytes
    # nvidia-smi "NVIDIA GB200, 189471 MiB" (public logs and fixtures; no URL recorded)
    assert devices["GB200"].memory_bytes == 189471 * MiB
    # Nominal capacities (no driver total sourced): 24 GB GDDR7,
    # https://cputronic.com/gpu/compare/nvidia-rtx-pro-4000-blackwell-vs-nvidia-rtx-pro-2000-blackwell
    assert devices["RTX PRO 4000 Blackwell"].memory_bytes == 24 * 1024 * MiB
    # "memsize": 192 * (1024**3): https://github.com/citsjtu2020/LLM-Prof/blob/8434c8d19c396b2f95d92a67845a7c0a0e0dd512/hardware_spec.md
    assert devices["MI308X"].memory_bytes == 192 * 1024 * MiB


def test_cuda_totals_are_estimated_below_the_driver_total():
    devices, _ = load_catalog()
    for name in NEW:
        d = devices[name]
        assert not d.cuda_total_measured, name
        assert 0 < d.cuda_total_bytes < d.memory_bytes, name


def test_bandwidth_and_dense_tflops_are_the_source_figures():
    devices, _ = load_catalog()
    # H800: 3.35 TB/s, 989 TFLOPS BF16 dense: https://github.com/ai-dynamo/aiconfigurator/pull/968
    assert (devices["H800 SXM"].bandwidth_gbps, devices["H800 SXM"].bf16_dense_tflops) == (3350, 989)
    # GB200 (the B200 in a GB200 at 1,200 W): BF16 matrix 2500 dense / 5000 sparse, 8 TB/s:
    # https://glennklockwood.com/garden/processors/B200
    assert (devices["GB200"].bandwidth_gbps, devices["GB200"].bf16_dense_tflops) == (8000, 2500)
    # RTX PRO 4000 Blackwell: 672.0 GB/s,
    # https://cputronic.com/gpu/compare/nvidia-rtx-pro-4000-blackwell-vs-nvidia-rtx-pro-2000-blackwell
    assert devices["RTX PRO 4000 Blackwell"].bandwidth_gbps == 672
    # Not sourced: left null, never guessed.
    assert devices["RTX PRO 4000 Blackwell"].bf16_dense_tflops is None
    for name in ("RTX 4070 Ti Super", "RTX 4080 Super", "MI308X"):
        assert devices[name].bandwidth_gbps is None and devices[name].bf16_dense_tflops is None, name


def test_architecture_flags():
    devices, _ = load_catalog()
    assert devices["H800 SXM"].is_hopper
    assert devices["GB200"].is_blackwell
    assert devices["MI308X"].vendor == "amd"


def test_new_rows_cite_a_source_or_say_they_have_none():
    rows = {r["name"]: r for r in json.loads(GPUS_FILE.read_text())["gpus"]}
    for name in NEW:
        row = rows[name]
        # A URL, or the schema's marker for a figure read where no URL could be kept.
        assert "http" in row["memory_source"] or "no public source recorded" in row["memory_source"], name
        if row["bandwidth_gbps"] is not None or row["bf16_dense_tflops"] is not None:
            assert "http" in row["perf_source"], name
        if row["bandwidth_gbps"] is None or row["bf16_dense_tflops"] is None:
            assert "not sourced" in row["perf_source"] or "no readable source" in row["perf_source"], name
        assert row["cuda_total_gib"] is None and row["cuda_total_source"] is None, name
