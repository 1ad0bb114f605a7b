import json

import pytest

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GPUS_FILE, custom_device, find_device, load_catalog, parse_gpu
from kvplan.units import GiB, MiB


@pytest.mark.parametrize(
    "alias, name",
    [("4090", "RTX 4090"), ("rtx4090", "RTX 4090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
     ("H100-80GB", "H100 SXM"), ("h100", "H100 SXM"), ("a100", "A100 80GB SXM"), ("L4", "L4"),
     ("mi300x", "MI300X"), ("T4", "T4"), ("v100", "V100 16GB"), ("B200", "B200")],
)
def test_forgiving_aliases(alias, name):
    assert find_device(alias).name == name


def test_required_rows_are_present_with_sources():
    rows = json.loads(GPUS_FILE.read_text())["gpus"]
    names = {r["name"] for r in rows}
    for required in ("RTX 3090", "RTX 4090", "RTX 5090", "A10G", "L4", "L40S", "A100 40GB SXM", "A100 80GB SXM",
                     "H100 PCIe", "H100 SXM", "H200", "B200", "MI300X", "T4", "V100 16GB"):
        assert required in names
    for row in rows:
        assert row["memory_mib"] > 0 and row["memory_source"] and row["perf_source"]


def test_dense_not_sparse_tflops():
    devices, _ = load_catalog()
    assert devices["H100 SXM"].bf16_dense_tflops == 989  # not the 1979 sparse figure
    assert devices["MI300X"].bf16_dense_tflops < 2000  # not the 2614.9 sparse figure


def test_cuda_total_measured_or_estimated():
    devices, _ = load_catalog()
    h100 = devices["H100 SXM"]
    assert h100.cuda_total_measured and h100.cuda_total_bytes == int(79.18 * GiB)
    # Rows without a measured total lose the median driver reserve of the measured rows
    # (H100: 81,559 MiB - 79.18 GiB; RTX 3090: 24,576 MiB - 23.58 GiB).
    gaps = sorted([81559 * MiB - 79.18 * GiB, 24576 * MiB - 23.58 * GiB])
    l4 = devices["L4"]
    assert not l4.cuda_total_measured
    assert l4.cuda_total_bytes == int(23034 * MiB - sum(gaps) / 2)


def test_counts_and_custom_memory():
    sel = parse_gpu("4xH100")
    assert sel.count == 4 and sel.device.name == "H100 SXM"
    assert parse_gpu("2x4090").count == 2
    assert parse_gpu("H100", 8).count == 8
    assert custom_device("24GiB").cuda_total_bytes == 24 * GiB


def test_unknown_gpu_suggests():
    with pytest.raises(KvplanError, match="did you mean"):
        find_device("H1000")
