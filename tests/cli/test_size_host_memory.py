"""`kvplan size --kv-offloading-size GiB --host-memory SIZE`: a CPU tier larger than the host can hold is one line
and exit 2 (issue 24). The tier's host memory is worked by hand (kvplan/plan/offload.py cites vLLM's code)."""

from __future__ import annotations

from helpers.harness import invoke

from kvplan.cli.size_cmd import _host_memory
from kvplan.hardware.host import local_host_memory_bytes

LLAMA = ("size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--ctx", "8k")


def test_a_tier_larger_than_the_host_is_refused():
    # 0.33 (one /dev/shm region, exact): a block of all 32 layers is 2 MiB, so 300 GiB is 153,600 chunks, 300 GiB.
    r = invoke(*LLAMA, "--kv-offloading-size", "300", "--host-memory", "256GiB", "--vllm-version", "0.33.0")
    assert r.code == 2
    assert "takes 300.00 GiB of host memory on vLLM 0.33.0, more than the host's 256.00 GiB" in r.one_line_error()
    assert invoke(*LLAMA, "--kv-offloading-size", "250", "--host-memory", "256GiB").code == 0


def test_pinned_tensors_rounded_to_a_power_of_two_count_against_the_host():
    # 0.26 pins each rank's one cross-layer tensor: 102,400 chunks x 2 MiB = 200 GiB, rounded up to 256 GiB by
    # PyTorch's pinned allocator (vllm#53042). It fits a 256 GiB host, not a 255 GiB one.
    r = invoke(*LLAMA, "--kv-offloading-size", "200", "--vllm-version", "0.26.0", "--host-memory", "255GiB")
    assert r.code == 2
    line = r.one_line_error()
    assert "takes 256.00 GiB of host memory on vLLM 0.26.0 (pinned tensors, each rounded up to a power of two)" in line
    ok = invoke(*LLAMA, "--kv-offloading-size", "200", "--vllm-version", "0.26.0", "--host-memory", "256GiB")
    assert ok.code == 0 and "host memory: 256.00 GiB" in ok.stdout


def test_bad_host_memory_is_one_line():
    for bad in ("-1GiB", "0", "lots", "9" * 400):
        r = invoke(*LLAMA, "--kv-offloading-size", "8", "--host-memory", bad)
        assert r.code == 2 and "host memory" in r.one_line_error(), bad


def test_the_local_host_is_this_machines_memtotal(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24575432 kB\nMemFree:        1000 kB\n")
    assert local_host_memory_bytes(meminfo) == 24_575_432 * 1024
    for text in ("", "MemTotal: lots kB\n", "MemTotal: 12 MB\n", "\x00" * 5000):
        meminfo.write_text(text)
        assert local_host_memory_bytes(meminfo) is None, text
    assert local_host_memory_bytes(tmp_path / "missing") is None
    # --gpu auto plans this machine's GPUs, so this machine's RAM; a named GPU says nothing of the host.
    assert _host_memory(None, "auto") == local_host_memory_bytes()
    assert _host_memory(None, "H100") is None and _host_memory("2TiB", "H100") == 2 * 1024**4
