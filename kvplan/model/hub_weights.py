"""Exact weight bytes from a Hub repo's safetensors headers (no weights are downloaded).

``HfApi.get_safetensors_metadata`` range-reads each shard's header; every tensor's
``data_offsets`` give its exact size in the file, packed int4 and fp8 scales included.
Tensors of layers vLLM does not load by default are left out: multi-token-prediction
draft layers are stored as ``model.layers.{i}`` with ``i >= num_hidden_layers``
(DeepSeek-V3's checkpoint is 671B main + the MTP module).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class CheckpointWeights:
    loaded_bytes: int
    skipped_bytes: int  # checkpoint-only tensors (MTP draft layers)
    tensors: int


def sum_tensors(tensors: Iterable[tuple[str, tuple[int, int]]], num_hidden_layers: int) -> CheckpointWeights:
    """Pure: (name, data_offsets) pairs -> bytes vLLM loads and bytes it skips."""
    loaded = skipped = count = 0
    for name, (begin, end) in tensors:
        size = end - begin
        match = _LAYER_RE.search(name)
        if match and int(match.group(1)) >= num_hidden_layers and "vision" not in name and "visual" not in name:
            skipped += size
        else:
            loaded += size
            count += 1
    return CheckpointWeights(loaded, skipped, count)


def hub_weights(repo_id: str, revision: str | None, num_hidden_layers: int) -> CheckpointWeights | None:
    """Read the safetensors headers of ``repo_id``; None when unavailable (offline, no safetensors...)."""
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    from kvplan.model.source import HUB_TIMEOUT_S, call_with_deadline, quiet_hub_logs

    quiet_hub_logs()
    try:
        from huggingface_hub import HfApi

        meta = call_with_deadline(lambda: HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
                                  .get_safetensors_metadata(repo_id, revision=revision), HUB_TIMEOUT_S)
    except Exception:  # offline, gated, not a safetensors repo, network errors, timeout: use the estimate
        return None
    pairs = (
        (name, tuple(info.data_offsets))
        for file in meta.files_metadata.values()
        for name, info in file.tensors.items()
    )
    return sum_tensors(pairs, num_hidden_layers)
