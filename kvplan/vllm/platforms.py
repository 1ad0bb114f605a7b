"""What vLLM's platforms (CUDA/ROCm GPUs, the CPU build) impose on block sizes, scheduling and
scheduler defaults, independent of the release (release-dependent facts live in rules.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache


@dataclass(frozen=True)
class Platform:
    """What the attention backends of one platform impose on block sizes.

    ``kernel_block``: the smallest kernel block of the default attention backend
    (``get_supported_kernel_block_sizes``): FlashAttention and Triton take multiples of 16
    on CUDA/ROCm, the CPU backend multiples of 32 (`v1/attention/backends/cpu_attn.py`).
    ``default_block_size``: ``CacheConfig.DEFAULT_BLOCK_SIZE`` (16) on GPUs; the CPU
    platform picks 128 (`platforms/cpu.py::check_and_update_config`).
    ``mla_block_size``: the block size the platform's MLA backend forces, if any (the CPU MLA
    kernel compiles only for 16). The CPU platform also turns async scheduling off, and for
    MLA models prefix caching and chunked prefill too (a whole prompt per step:
    ``max_num_batched_tokens = max(max_model_len, 2048)``); its scheduler defaults per GPU of
    the world are 128 sequences and 2,048 batched tokens for `vllm serve`, 256 and 4,096 for the
    offline LLM class (`EngineArgs.get_batch_defaults`).
    """

    name: str
    kernel_block: int
    default_block_size: int
    mla_block_size: int | None = None
    async_scheduling: bool = True
    mla_whole_prompt: bool = False
    # MLA takes the platform's default block size (CPU AMX MLA), not the GPU MLA backends' 16 / 64.
    mla_takes_default_block: bool = False
    # usage context ("serve" / "llm") -> (max_num_seqs, max_num_batched_tokens) per device.
    default_limits: tuple[tuple[str, tuple[int, int]], ...] = ()
    # x86 CPUs with AVX-512 BF16 run vLLM's accelerated CPU GDN / Mamba kernels, and
    # `CpuPlatform.check_and_update_config` resets --mamba-ssm-cache-dtype to float32 there unless it is
    # float16 / bfloat16 on a gated-delta-net model ("Reset SSM cache type to float32 for accelerated GDN
    # mamba backend", platforms/cpu.py@0.32.0): "auto" becomes float32.
    float32_ssm_state: bool = False

    def mamba_ssm_cache_dtype(self, asked: str, gated_delta_net: bool) -> str:
        """The --mamba-ssm-cache-dtype this platform leaves for a model (``gated_delta_net``: its
        recurrent layers are Qwen3-Next / Qwen3.5-style linear attention)."""
        if not self.float32_ssm_state or asked == "float32":
            return asked
        return asked if gated_delta_net and asked in ("float16", "bfloat16") else "float32"


CUDA = Platform("cuda", kernel_block=16, default_block_size=16)
# The reference (non-AMX) CPU MLA path; x86 CPUs with AMX tiles use AMX MLA instead.
CPU = Platform("cpu", kernel_block=32, default_block_size=128, mla_block_size=16, async_scheduling=False,
               mla_whole_prompt=True, default_limits=(("serve", (128, 2048)), ("llm", (256, 4096))))


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (what ``torch.cpu._is_avx512_bf16_supported`` and ``_is_amx_tile_supported``
    report), read without torch; empty where /proc/cpuinfo cannot be read."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return frozenset()


@lru_cache(maxsize=1)
def host_cpu_platform() -> Platform:
    """The CPU platform of the machine kvplan runs on (the CPU engine it launches or probes runs here too).

    vllm/platforms/cpu.py@0.32.0 ``check_and_update_config``: on x86 with AMX tiles MLA models run the
    AMX MLA backend, which keeps the CPU's default block size (128, or the one asked), prefix caching and
    chunked prefill; only the reference MLA kernel forces 16 and a whole prompt per step."""
    return cpu_platform_for(cpu_flags())


def cpu_platform_for(flags: frozenset[str]) -> Platform:
    """The CPU platform vLLM's CPU build sets up on a CPU with these feature flags."""
    platform = replace(CPU, float32_ssm_state=True) if "avx512_bf16" in flags else CPU
    if "amx_tile" in flags:
        platform = replace(platform, mla_block_size=None, mla_whole_prompt=False, mla_takes_default_block=True)
    return platform
