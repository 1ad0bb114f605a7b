"""The multimodal encoder pass of vLLM's profile run: one item of the processor's largest size.

Before its text dummy run, V1's `profile_run` pushes a dummy batch "of the maximum feature size"
through the vision tower and keeps the outputs in the encoder cache until the profile ends
(`v1/worker/gpu_model_runner.py@0.24.0` / `@0.32.0`, `profile_run`). The torch peak it measures is
therefore the larger of the encoder's own peak and the text dummy run's peak on top of what the
encoder pass leaves behind. Only towers whose forward pass kvplan has read are modelled here;
every other tower is named in a note instead (kvplan/plan/capacity.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

# The largest image of the Qwen3-VL / Qwen3.5 / Qwen3.6 processors: their published
# preprocessor_config.json sets ``size.longest_edge`` to 16,777,216 pixels (4096 x 4096), e.g.
# Qwen/Qwen3.5-2B-Base and Qwen/Qwen3.6-35B-A3B-FP8 (config.json does not carry it).
QWEN3_VL_MAX_PIXELS = 16_777_216
# `get_image_size_with_most_features` (models/qwen2_vl.py@0.24.0) rejects aspect ratios above 200.
_MAX_ASPECT_RATIO = 200


@cache
def _most_features_tokens(max_pixels: int, unit: int) -> int:
    """Merged tokens of the image vLLM profiles with: the largest ``seq_len <= max_pixels // unit^2``
    that factors into a grid with an aspect ratio of at most 200 (`get_image_size_with_most_features`,
    models/qwen2_vl.py@0.24.0, which Qwen3-VL inherits)."""
    for seq_len in range(max_pixels // (unit * unit), 0, -1):
        for rows in range(math.isqrt(seq_len), 0, -1):
            if seq_len % rows == 0:
                break
        if (seq_len // rows) / rows <= _MAX_ASPECT_RATIO:
            return seq_len
    return 0


@dataclass(frozen=True)
class VisionEncoderPass:
    """One image of the processor's largest size through a Qwen3-VL-style vision tower
    (`Qwen3_VisionTransformer`, models/qwen3_vl.py@0.24.0, unchanged in 0.32.0)."""

    width: int  # ViT hidden size
    mlp_width: int  # ViT MLP intermediate size
    head_dim: int
    patch_size: int
    merge_size: int  # spatial_merge_size: merge_size^2 patches make one output token
    values_per_patch: int  # channels x temporal_patch_size x patch_size^2
    out_hidden: int  # one merger's output width (the text model's hidden size)
    deepstack_mergers: int  # extra mergers whose outputs are concatenated to the main one
    max_pixels: int = QWEN3_VL_MAX_PIXELS  # the processor's largest image (--mm-processor-kwargs max_pixels)

    @property
    def merged_tokens(self) -> int:
        """Rows of the encoder output for the largest image."""
        return _most_features_tokens(self.max_pixels, self.patch_size * self.merge_size)

    @property
    def patches(self) -> int:
        """Pre-merge patches of the largest image (the ViT's sequence length). An image has one
        temporal slice: its single frame is padded to temporal_patch_size frames."""
        return self.merged_tokens * self.merge_size * self.merge_size

    @property
    def output_width(self) -> int:
        return self.out_hidden * (1 + self.deepstack_mergers)

    def peak_bytes(self, dtype_bytes: int, tp: int = 1) -> int:
        """The torch peak of the encoder pass on one rank.

        Live for the whole pass: the pixel values (cast to the model dtype by the processor,
        `_postprocess_output` in multimodal/processing/context.py), the learned position
        embeddings and the rotary cos/sin kept in the encoder metadata, the residual stream, and
        the deepstack features collected so far. On top, the larger of a block's two phases
        (`Qwen3_VisionBlock.forward`; the heads and the MLP are split over TP ranks):
        attention (`Qwen2_5_VisionAttention.forward`, models/qwen2_5_vl.py): the norm1 output,
        the qkv projection (3 widths), the contiguous q/k copy and its rotated copy (2 each) and
        flash attention's output (1); MLP: the norm2 output, fc1's output and its activation.
        """
        tp = max(tp, 1)
        n, d = self.patches, self.width
        resident = n * (self.values_per_patch + 2 * d + self.head_dim) * dtype_bytes
        deepstack = self.deepstack_mergers * self.merged_tokens * self.out_hidden
        attention = n * (d + 8 * d // tp)
        mlp = n * (d + 2 * self.mlp_width // tp)
        return resident + (deepstack + max(attention, mlp)) * dtype_bytes

    def retained_bytes(self, dtype_bytes: int) -> int:
        """What stays allocated during the text dummy run and the sampler run: the dummy batch's
        pixel values (`profile_run` still holds them) and the encoder outputs in the encoder cache."""
        return (self.patches * self.values_per_patch + self.merged_tokens * self.output_width) * dtype_bytes

    def describe(self) -> str:
        side = math.isqrt(self.max_pixels)
        size = f"{side}x{side} pixels" if side * side == self.max_pixels else f"{self.max_pixels:,} pixels"
        return f"{size}, {self.merged_tokens:,} tokens, {self.patches:,} patches"


def _positive_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def vision_encoder_pass(top: dict[str, Any], text_hidden: int) -> VisionEncoderPass | None:
    """The profile run's encoder pass for a config whose vision tower kvplan has read, else None."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict) or not str(vc.get("model_type") or "").startswith(("qwen3_5", "qwen3_vl")):
        return None
    d, depth, inter, heads = (_positive_int(vc.get(k)) for k in ("hidden_size", "depth", "intermediate_size", "num_heads"))
    patch = _positive_int(vc.get("patch_size", 16))
    temporal = _positive_int(vc.get("temporal_patch_size", 2))
    merge = _positive_int(vc.get("spatial_merge_size", 2))
    channels = _positive_int(vc.get("in_channels", 3))
    out = _positive_int(vc.get("out_hidden_size", text_hidden))
    if not all((d, depth, inter, heads, patch, temporal, merge, channels, out)) or d % heads:
        return None
    deepstack = vc.get("deepstack_visual_indexes") or []
    mergers = len(deepstack) if isinstance(deepstack, list) else 0
    return VisionEncoderPass(
        width=d,
        mlp_width=inter,
        head_dim=d // heads,
        patch_size=patch,
        merge_size=merge,
        values_per_patch=channels * temporal * patch * patch,
        out_hidden=out,
        deepstack_mergers=mergers,
    )
