"""The catalog's newer rows: every figure has a source a reader can open, or is null with a note;
ambiguous names say which variant was picked."""

from __future__ import annotations

import json

import pytest

from kvplan.hardware.catalog import GPUS_FILE, find_device, load_catalog

NEW = ["RTX 3060 12GB", "RTX 3080", "RTX 4060 Ti 16GB", "RTX 4080", "RTX 5060 Ti 16GB", "RTX 5070 Ti", "RTX 5080",
       "RTX PRO 6000 Blackwell", "A40", "L40", "L20", "H20", "GH200", "GB10", "B300", "MI250X", "MI355X"]


def test_new_rows_have_openable_sources_or_nulls():
    rows = {r["name"]: r for r in json.loads(GPUS_FILE.read_text())["gpus"]}
    for name in NEW:
        row = rows[name]
        assert "http" in row["memory_source"], name
        assert row["bandwidth_gbps"] is None or "http" in row["perf_source"], name
        if row["bf16_dense_tflops"] is None and row["fp16_dense_tflops"] is None:
            assert "not sourced" in row["perf_source"] or "no readable source" in row["perf_source"], name


@pytest.mark.parametrize("alias, name", [("3060", "RTX 3060 12GB"), ("rtx 5080", "RTX 5080"), ("dgx spark", "GB10"),
                                         ("A40", "A40"), ("L40", "L40"), ("H20", "H20"), ("b300", "B300"),
                                         ("mi355x", "MI355X"), ("L40S", "L40S"), ("A10", "A10")])
def test_new_aliases(alias, name):
    assert find_device(alias).name == name


def test_sourced_figures():
    devices, _ = load_catalog()
    assert (devices["L40"].bandwidth_gbps, devices["L40"].bf16_dense_tflops) == (864, 181.05)
    assert devices["B300"].bf16_dense_tflops == 2250  # dense, not the 4,500 sparse figure
    assert devices["H20"].bf16_dense_tflops == 148  # the FP16 dense figure (bf16 null in the row)
    # MI250X: one GCD, half the module's 128 GB / 3.2 TB/s / 383 TFLOP/s.
    assert (devices["MI250X"].bandwidth_gbps, devices["MI250X"].bf16_dense_tflops) == (1600, 191.5)


def test_ambiguous_names_say_which_variant():
    a100 = find_device("A100")
    assert a100.name == "A100 80GB SXM"
    assert "planned as A100 80GB SXM" in a100.selection_note and "A100 40GB PCIe" in a100.selection_note
    assert find_device("A100-40GB").selection_note == ""
    assert "H100 PCIe" in find_device("h100").selection_note
    assert a100 == load_catalog()[0]["A100 80GB SXM"]  # the note does not change identity
