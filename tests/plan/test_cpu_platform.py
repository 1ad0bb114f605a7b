"""The CPU build's platform rules per host CPU (vllm/platforms/cpu.py@0.32.0 ``check_and_update_config``).

Without AMX tiles MLA runs vLLM's reference CPU MLA kernel: block size forced to 16 whatever was asked,
prefix caching and chunked prefill off, ``max_num_batched_tokens = max(max_model_len, 2048)``. With AMX
tiles (``torch.cpu._is_amx_tile_supported``) MLA runs AMX MLA: the CPU default block size 128 unless one is
asked, and prefix caching stays on. Expected values are read from that source, not from kvplan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvplan.hardware.catalog import Device
from kvplan.model.arch import parse_architecture
from kvplan.model.source import load_bundled
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.units import GiB
from kvplan.vllm.platforms import cpu_flags, cpu_platform_for
from kvplan.vllm.rules import rules_for

CPU_DEVICE = Device(name="CPU", memory_bytes=24 * GiB, cuda_total_bytes=24 * GiB, cuda_total_measured=True,
                    vendor="cpu")


def _plan(profile: str, flags: set[str], block_size: int | None = None):
    config = dict(load_bundled(profile).config)
    config.pop("quantization_config", None)
    device = replace(CPU_DEVICE, platform_rules=cpu_platform_for(frozenset(flags)))
    settings = Settings(max_model_len=4096, kv_cache_memory_bytes=GiB, block_size=block_size, usage_context="llm")
    return compute_capacity(parse_architecture(config), device, settings, rules_for("0.32.0"), load_overhead())


@pytest.mark.parametrize("asked, reference, amx", [(None, 16, 128), (256, 16, 256), (64, 16, 64)])
def test_mla_block_size_follows_the_host_mla_kernel(asked, reference, amx):
    assert _plan("deepseek-ai/DeepSeek-V3", {"avx512f"}, asked).cache_config_block_size == reference
    assert _plan("deepseek-ai/DeepSeek-V3", {"avx512f", "amx_tile"}, asked).cache_config_block_size == amx


def test_reference_mla_turns_prefix_caching_off_and_amx_does_not():
    assert _plan("deepseek-ai/DeepSeek-V3", {"avx512f"}).prefix_caching is False
    assert _plan("deepseek-ai/DeepSeek-V3", {"amx_tile"}).prefix_caching is True


def test_amx_leaves_models_without_mla_alone():
    for flags in ({"avx512f"}, {"amx_tile"}):
        assert _plan("meta-llama/Llama-3.1-8B", flags).cache_config_block_size == 128  # the CPU default


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n")
    assert {"avx512_bf16", "amx_tile"} <= cpu_flags(str(info))
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()
