"""Exact weight bytes from a Hub repo's safetensors headers (no weights are downloaded).

``HfApi.get_safetensors_metadata`` range-reads each shard's header; every tensor's
``data_offsets`` give its exact size in the file, packed int4 and fp8 scales included.
Tensors of layers vLLM does not load by default are left out: multi-token-prediction
draft layers are stored as ``model.layers.{i}`` with ``i >= num_hidden_layers``
(DeepSeek-V3's checkpoint is 671B main + the MTP module; GLM-4.5+ the same) or under an
``mtp.`` prefix (Qwen3.5 / Qwen3.6 ``mtp.layers.0...``, MiMo ``model.mtp_layers``): vLLM
loads them only into the separate MTP draft model (`qwen3_5_mtp.py`, `deepseek_mtp.py`,
models/@0.32.0). Multimodal tower tensors are loaded, and counted apart (``tower_bytes``)
because `--language-model-only` skips them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from kvplan.model.source import HUB_TIMEOUT_S, call_with_deadline, quiet_hub_logs

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MTP_RE = re.compile(r"(?:^|\.)mtp(?:_layers)?[._]")
_TOWER_RE = re.compile(r"(?:^|\.)(?:visual|vision_tower|vision_model|vision_encoder|embed_vision|audio_tower|"
                       r"audio_model|embed_audio|multi_modal_projector|mm_projector)\.")


@dataclass(frozen=True)
class CheckpointWeights:
    loaded_bytes: int
    skipped_bytes: int  # checkpoint-only tensors (MTP draft layers)
    tensors: int
    tower_bytes: int = 0  # part of loaded_bytes: multimodal towers (skipped by --language-model-only)


def sum_tensors(tensors: Iterable[tuple[str, tuple[int, int]]], num_hidden_layers: int) -> CheckpointWeights:
    """Pure: (name, data_offsets) pairs -> bytes vLLM loads and bytes it skips."""
    loaded = skipped = count = towers = 0
    for name, (begin, end) in tensors:
        size = end - begin
        tower = _TOWER_RE.search(name) is not None or "vision" in name or "visual" in name
        match = _LAYER_RE.search(name)
        if not tower and (_MTP_RE.search(name) or (match and int(match.group(1)) >= num_hidden_layers)):
            skipped += size
        else:
            loaded += size
            towers += size if tower else 0
            count += 1
    return CheckpointWeights(loaded, skipped, count, towers)


def hub_weights(repo_id: str, revision: str | None, num_hidden_layers: int) -> CheckpointWeights | None:
    """Read the safetensors headers of ``repo_id``; None when unavailable (offline, no safetensors...)."""
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")

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
