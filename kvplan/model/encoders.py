"""Vision towers vLLM builds beside the language model: their parameters, and their pass in the profile run.

The ViT pieces (a block, Qwen-VL's patch merger) are counted here for every tower kvplan knows
(kvplan/model/arch.py). A Qwen3-VL-style tower is also read whole, once, into
:class:`Qwen3VisionTower`, which counts itself and sizes its profile pass.

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
# The largest --mm-max-pixels kvplan plans with (65,536 x 65,536): far above any processor's largest image.
MAX_MM_PIXELS = 1 << 32
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


def all_positive_ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def vit_block(h: int, inter: int, norm: int, gated: bool = False) -> int:
    """One pre-norm ViT block: two norms of ``norm`` parameters each, a biased qkv and proj, and a
    biased MLP (fc1/fc2, or gate/up/down when ``gated``)."""
    mlp = 3 * h * inter + 2 * inter + h if gated else 2 * h * inter + inter + h
    return 2 * norm + (3 * h * h + 3 * h) + (h * h + h) + mlp


def patch_merger(h: int, merge: int, out: int, norm: int) -> int:
    """Qwen-VL's patch merger: a norm, then a biased h*m^2 -> h*m^2 -> out MLP."""
    wide = h * merge * merge
    return norm + (wide * wide + wide) + (wide * out + out)


@dataclass(frozen=True)
class Qwen3VisionTower:
    """A Qwen3-VL-style vision tower (`Qwen3_VisionTransformer`, models/qwen3_vl.py@0.24.0, unchanged in
    0.32.0; Qwen3.5 / Qwen3.6 reuse it): its parameters, and one image of the processor's largest size
    through it in the profile run."""

    width: int  # ViT hidden size
    depth: int
    mlp_width: int  # ViT MLP intermediate size
    heads: int
    channels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int  # spatial_merge_size: merge_size^2 patches make one output token
    out_hidden: int  # one merger's output width (the text model's hidden size)
    deepstack_mergers: int  # extra mergers whose outputs are concatenated to the main one
    positions: int  # rows of the learned position table
    max_pixels: int = QWEN3_VL_MAX_PIXELS  # the processor's largest image (--mm-processor-kwargs max_pixels)

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def values_per_patch(self) -> int:
        return self.channels * self.temporal_patch_size * self.patch_size * self.patch_size

    def params(self) -> int:
        """A biased Conv3d patch embedding, the position table, ``depth`` pre-norm blocks (LayerNorms,
        biased qkv and proj, biased fc1/fc2 MLP) and a patch merger (LayerNorm, h*m^2 -> h*m^2 -> out),
        plus one merger per deepstack index, which normalises after the shuffle (a LayerNorm of h*m^2)."""
        h, m = self.width, self.merge_size
        return (self.values_per_patch * h + h + self.positions * h
                + self.depth * vit_block(h, self.mlp_width, norm=2 * h)
                + patch_merger(h, m, self.out_hidden, 2 * h)
                + self.deepstack_mergers * patch_merger(h, m, self.out_hidden, 2 * h * m * m))

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


def is_qwen3_vision(vc: Any) -> bool:
    """A vision_config of the Qwen3-VL kind (Qwen3-VL, Qwen3.5, Qwen3.6, or untyped with an out_hidden_size)."""
    return isinstance(vc, dict) and (str(vc.get("model_type") or "").startswith(("qwen3_5", "qwen3_vl"))
                                     or "out_hidden_size" in vc)


def qwen3_vision_tower(vc: dict[str, Any], text_hidden: int) -> Qwen3VisionTower | None:
    """The tower of a Qwen3-VL-kind vision_config, or None when its sizes are missing or not positive
    whole numbers. Absent optional fields take transformers' Qwen3VLVisionConfig defaults."""
    deepstack = vc.get("deepstack_visual_indexes") or []
    h = vc.get("hidden_size")
    tower = Qwen3VisionTower(
        width=h,
        depth=vc.get("depth") or vc.get("num_hidden_layers"),
        mlp_width=vc.get("intermediate_size") or (4 * h if isinstance(h, int) else None),
        heads=vc.get("num_heads", 16),
        channels=vc.get("in_channels") or vc.get("num_channels") or 3,
        patch_size=vc.get("patch_size", 16),
        temporal_patch_size=vc.get("temporal_patch_size", 2),
        merge_size=vc.get("spatial_merge_size", 2),
        out_hidden=vc.get("out_hidden_size") or text_hidden,
        deepstack_mergers=len(deepstack) if isinstance(deepstack, list) else 0,
        positions=vc.get("num_position_embeddings") or 0,
    )
    sizes = (tower.width, tower.depth, tower.mlp_width, tower.heads, tower.channels, tower.patch_size,
             tower.temporal_patch_size, tower.merge_size, tower.out_hidden)
    if not all_positive_ints(*sizes) or not isinstance(tower.positions, int) or tower.width % tower.heads:
        return None
    return tower
