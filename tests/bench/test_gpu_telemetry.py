"""GPU telemetry during bench points (issue 27): `--gpu-metrics URL` reads a DCGM exporter's /metrics, `nvml` the
local GPUs. The exporter text is in the format of dcgm-exporter's README sample (https://github.com/NVIDIA/dcgm-exporter:
`DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-604ac76c-..."} 139`, and the blank-field sentinel 9223372036854775794),
with the default counters' names, for two GPUs, served by a fake on loopback. NVML needs a GPU: skipped without one."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer

from kvplan.bench.gpu_telemetry import parse_dcgm, summarize_gpu

UUID = ("GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", "GPU-1b2c3d4e-0000-1111-2222-333344445555")


def dcgm_text(util: tuple[float, float], used: tuple[float, float], power: tuple[float, float],
              clock: tuple[float, float]) -> str:
    lines = []
    for field, doc, values in (("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", clock),
                               ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", (9223372036854775794,) * 2),
                               ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", power),
                               ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", util),
                               ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", used)):
        lines += [f"# HELP {field} {doc}", f"# TYPE {field} gauge"]
        lines += [f'{field}{{gpu="{i}", UUID="{UUID[i]}", modelName="NVIDIA H100 80GB HBM3"}} {v}'
                  for i, v in enumerate(values)]
    return "\n".join(lines) + "\n"


def test_an_exporter_scrape_and_a_points_summary():
    a = parse_dcgm(dcgm_text((90, 60), (70_000, 68_000), (650.5, 600), (1980, 1755)))
    assert a == {"0": {"sm_clock_mhz": 1980, "power_w": 650.5, "util_pct": 90, "memory_used_mib": 70_000},
                 "1": {"sm_clock_mhz": 1755, "power_w": 600, "util_pct": 60, "memory_used_mib": 68_000}}
    b = parse_dcgm(dcgm_text((100, 50), (71_000, 68_000), (700, 610), (1800, 1980)))
    g = summarize_gpu([a, b], "http://x:9400/metrics")
    # utilization over 4 samples of GPUs: (90 + 60 + 100 + 50) / 4 = 75; the fullest GPU 71,000 MiB; the hungriest
    # 700 W; the slowest SM clock seen 1,755 MHz
    assert (g.source, g.gpus, g.samples) == ("DCGM exporter", 2, 2)
    assert (g.util_mean_pct, g.util_peak_pct, g.memory_used_peak_mib, g.power_peak_w, g.sm_clock_min_mhz) == \
        (75.0, 100.0, 71_000.0, 700.0, 1_755.0)
    assert summarize_gpu([], "nvml") is None
    assert parse_dcgm("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 250\n") == {}  # not a utilization: dropped


def test_a_bench_point_carries_the_exporters_figures_and_sends_it_no_secret(tmp_path):
    exporter = FakeBehaviour(metrics_text=lambda n: dcgm_text((40 + n % 2 * 20, 30), (50_000, 20_000), (400, 300),
                                                               (1980, 1980)))
    with FakeServer(FakeBehaviour(token_gap_s=0.01, api_key="sk-engine-only")) as engine, FakeServer(exporter) as dcgm:
        proc = subprocess.run(kvplan_cmd("--url", engine.url, "--api-key", "sk-engine-only", "--header",
                                         "X-Team: secret-header", "--sweep", "1", "--requests", "3", "--prompt", "8",
                                         "--output", "6", "--no-warmup", "--scrape-interval", "0.05",
                                         "--gpu-metrics", dcgm.url + "/metrics", "--out", str(tmp_path), "--json"),
                              capture_output=True, text=True, timeout=120, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    (point,) = json.loads(proc.stdout)["points"]
    g = point["gpu"]
    assert g["source"] == "DCGM exporter" and g["gpus"] == 2 and g["samples"] >= 1
    assert g["memory_used_peak_mib"] == 50_000 and g["power_peak_w"] == 400 and g["sm_clock_min_mhz"] == 1980
    assert 30 <= g["util_mean_pct"] <= 60 and g["util_peak_pct"] in (40, 60)
    # the exporter is another origin: neither the engine's key nor its headers went there
    sent = [headers for path, headers in exporter.seen]
    assert sent and not any("Authorization" in h or "X-Team" in h for h in sent)
    run = next(tmp_path.iterdir())
    assert "## GPUs (--gpu-metrics)" in (run / "report.md").read_text()
    assert "<caption>GPUs (--gpu-metrics)</caption>" in (run / "report.html").read_text()


def test_bad_sources_are_one_line():
    from helpers.harness import invoke

    for source, what in (("ftp://x", "invalid --gpu-metrics"), ("http://user:pw@x:9400/metrics", "no credentials")):
        r = invoke("bench", "--url", "http://127.0.0.1:9", "--gpu-metrics", source)
        assert r.code == 2 and what in r.one_line_error(), (source, r.stderr)


def test_nvml_on_this_machine():
    from kvplan.bench.gpu_telemetry import nvml_sample

    try:
        sample = nvml_sample()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVML sees no GPU here ({type(exc).__name__}: {exc})")
    assert sample and all(0 <= g["util_pct"] <= 100 and g["memory_used_mib"] >= 0 for g in sample.values())
