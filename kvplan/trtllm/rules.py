"""TensorRT-LLM's KV-pool facts that do not depend on a deployment, read in its public source
(https://github.com/NVIDIA/TensorRT-LLM; docs/engines-trtllm-rules.md quotes each line and dates it).

TensorRT-LLM's wheels are several GB, so its source was read file by file at the commits a public index stores; a
rule is dated by the release ``tensorrt_llm/version.py`` names at that commit, else by the pull request that made it.
"""

from __future__ import annotations

import re

from kvplan.errors import KvplanError

#: ``kv_cache_config.free_gpu_memory_fraction`` when not given: 0.9 (``KvCacheConfig`` in
#: `tensorrt_llm/llmapi/llm_args.py`; `calculate_max_num_blocks` falls back to 0.9, `_torch/pyexecutor/
#: resource_manager.py@b35ac1b` = 1.2.0rc2; the C++ ``KvCacheConfig::kDefaultGpuMemFraction``).
DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9
#: ``kv_cache_config.tokens_per_block`` of the PyTorch backend (`llm_args.py`: ``Field(default=32)``). A TensorRT
#: engine's block size is fixed when the engine is built; its log prints it ("Number of tokens per block: N.").
DEFAULT_TOKENS_PER_BLOCK = 32
#: ``max_batch_size`` when not given: ``BuildConfig.max_batch_size: int = 2048`` (`tensorrt_llm/builder.py@008b2b8`;
#: ``trtllm-serve`` passes that default, `tensorrt_llm/commands/serve.py@00209af`).
DEFAULT_MAX_BATCH_SIZE = 2048
#: Releases whose sizing source was read (1.2.0rc2 as source; 1.1.0rc3 through a complete public log that
#: reproduces it: report tr001). Later commits of 2026 were read too, but carry no tag.
READ_RELEASES = ("1.1.0rc3", "1.2.0rc2")

_VERSION_RE = re.compile(r"^v?(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:rc\d{1,3}|\.post\d{1,3}|\.dev\d{1,14}|[a-z]{0,8}\d{0,14})?$")


def parse_version(text: str) -> tuple[int, int, int]:
    """``1.1.0rc3`` -> (1, 1, 0); ``0.12.0.dev2024073000`` -> (0, 12, 0)."""
    m = _VERSION_RE.match(str(text).strip())
    if not m:
        raise KvplanError(f"invalid TensorRT-LLM version {text!r}", "use a release such as 1.1.0rc3 or 0.19.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))
