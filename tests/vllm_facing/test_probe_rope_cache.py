"""The twins' probe allocates a rotary embedding's cos/sin cache instead of computing it
(`kvplan.vllm.probe._install_shaped_rope_cache`: no forward pass reads it). Checked against the installed vLLM's own
construction: the same buffer shape, in the dtype vLLM keeps it in, for the plain, partial, Llama-3 and YaRN
embeddings; the class's own method is left as it was."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

COMMON = {"head_size": 64, "rotary_dim": 64, "max_position_embeddings": 4096, "base": 10000.0, "is_neox_style": True,
          "dtype": torch.bfloat16}
#: case -> (module, class, arguments beyond COMMON, the cache's shape by hand: a row a position, YaRN's positions
#: times its factor; cos and sin of rotary_dim / 2 frequencies a row)
CASES = {
    "plain": ("base", "RotaryEmbedding", {}, (4096, 64)),
    "partial": ("base", "RotaryEmbedding", {"rotary_dim": 32}, (4096, 32)),
    "llama3": ("llama3_rope", "Llama3RotaryEmbedding",
               {"scaling_factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "orig_max_position": 1024},
               (4096, 64)),
    "yarn": ("yarn_scaling_rope", "YaRNScalingRotaryEmbedding", {"scaling_factor": 4.0}, (16384, 64)),
}


def build(case: str):
    from vllm.config import VllmConfig, set_current_vllm_config

    module, name, extra, _ = CASES[case]
    cls = getattr(importlib.import_module(f"vllm.model_executor.layers.rotary_embedding.{module}"), name)
    with set_current_vllm_config(VllmConfig()):  # a CustomOp reads it when built
        return cls, cls(**{**COMMON, **extra})


@pytest.mark.parametrize("case", CASES)
def test_the_cache_has_vllms_shape_and_dtype(case, monkeypatch):
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase

    from kvplan.vllm.probe import _install_shaped_rope_cache

    cls, computed = build(case)
    assert tuple(computed.cos_sin_cache.shape) == CASES[case][3] and computed.cos_sin_cache.dtype == torch.bfloat16
    # The class's own computation, recorded: on the meta device under the patch (a shape, no values).
    devices, compute = [], cls._compute_cos_sin_cache

    def recorded(self):
        cache = compute(self)
        devices.append(cache.device.type)
        return cache

    monkeypatch.setattr(cls, "_compute_cos_sin_cache", recorded)
    monkeypatch.setattr(RotaryEmbeddingBase, "__init__", RotaryEmbeddingBase.__init__)  # both restored after the test
    assert "not computed" in _install_shaped_rope_cache()
    _, allocated = build(case)
    assert devices == ["meta"]
    assert (allocated.cos_sin_cache.shape, allocated.cos_sin_cache.dtype) == \
        (computed.cos_sin_cache.shape, computed.cos_sin_cache.dtype)
    assert allocated.cos_sin_cache.device.type == "cpu"
    assert cls._compute_cos_sin_cache is recorded and "_compute_cos_sin_cache" not in vars(allocated)  # as it was
