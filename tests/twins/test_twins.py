"""Differential tests: kvplan's KV layout against vLLM's own allocator, on tiny twins.

Every bundled profile whose architecture the installed vLLM (the CPU build in CI) can
construct gets a tiny twin (kvplan.vllm.twin: every KV-shaping config field kept, the rest
shrunk) that vLLM builds with dummy weights and no forward pass (kvplan.vllm.probe). The
expected numbers are the engine's own: the block size it settled on, the blocks it
allocated, the "KV cache size: N tokens" and "Maximum concurrency" it computed, its
per-layer specs, and (through vLLM's own capacity function) the same with async scheduling
on, which is the GPU default. kvplan plans the *real* config for the CPU platform with the
same settings, at the installed release's rules. Profiles whose twin is identical (same KV
fields) share one engine run. A twin the engine cannot build fails with the engine's error,
unless it is listed in ENGINE_CANNOT_BUILD with the reason, which the test then checks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from functools import cache

import pytest

from kvplan.hardware.catalog import Device
from kvplan.model.arch import parse_architecture
from kvplan.model.layers import MLA, ChunkedLocal, FullAttention, MambaState, SlidingWindow
from kvplan.model.source import load_bundled
from kvplan.paths import PROFILES_DIR
from kvplan.plan.capacity import compute_capacity, with_state_dtype, with_tp
from kvplan.plan.layout import CPU
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.plan.versions import rules_for
from kvplan.units import GiB, MiB

pytestmark = pytest.mark.engine

# Settings variants: the engine's defaults, and for families where they matter, a large block
# size, prefix caching off (no Mamba "align" mode), and an fp8 cache.
DEFAULT = {}
VARIANTS = {
    "block256": {"block_size": 256},
    "no-prefix-caching": {"enable_prefix_caching": False},
    "fp8": {"kv_cache_dtype": "fp8_e5m2"},
}
EXTRA_VARIANTS = {  # profile -> variants beyond the default
    "meta-llama/Llama-3.1-8B": ["fp8", "block256"],
    "google/gemma-3-12b-it": ["block256", "no-prefix-caching"],
    "openai/gpt-oss-20b": ["block256"],
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": ["block256"],
    "nvidia/Nemotron-H-56B-Base-8K": ["block256", "no-prefix-caching"],
    "Qwen/Qwen3-Next-80B-A3B-Thinking": ["block256", "no-prefix-caching"],
    "ai21labs/Jamba-v0.1": ["no-prefix-caching"],
    "deepseek-ai/DeepSeek-V3": ["block256"],
    "google/gemma-4-26B-A4B": ["block256"],
}

# Architectures the CI's vLLM CPU build cannot construct, with the engine error that says why.
ENGINE_CANNOT_BUILD: dict[str, str] = {}

MAX_MODEL_LEN = 4096


def _profiles() -> list[str]:
    ids = []
    for path in sorted((PROFILES_DIR / "models").glob("*.json")):
        ids.append(json.loads(path.read_text())["id"])
    return ids


@cache
def _twin_config(profile: str) -> str:
    from kvplan.vllm.twin import make_twin

    twin = make_twin(load_bundled(profile).config)
    twin.pop("_kvplan_twin_notes", None)
    return json.dumps(twin, sort_keys=True)


def _settings(profile: str, variant: str) -> dict:
    """Engine settings for one case: enough KV memory for a few max-length requests (an odd
    byte count, so the engine's floor division is exercised), at most 1.5 GiB."""
    arch = parse_architecture(load_bundled(profile).config)
    limit = min(MAX_MODEL_LEN, arch.max_model_len_limit or MAX_MODEL_LEN)
    per_token = sum(s.bytes_per_token(_bf16()) for s in arch.layers) or 1
    memory = int(min(max(3 * limit * per_token, 64 * MiB), 1.5 * GiB)) + 12_345
    return {"max_model_len": limit, "kv_cache_memory_bytes": memory, **(VARIANTS.get(variant) or DEFAULT)}


def _bf16():
    from kvplan.model.dtypes import kv_dtype

    return kv_dtype("bfloat16")


def _cases() -> list[tuple[str, str]]:
    out = []
    for profile in _profiles():
        out.append((profile, "default"))
        out += [(profile, v) for v in EXTRA_VARIANTS.get(profile, [])]
    return out


def _engine_key(profile: str, variant: str) -> str:
    digest = hashlib.sha256(_twin_config(profile).encode()).hexdigest()[:12]
    return f"{digest}/{variant}/{json.dumps(_settings(profile, variant), sort_keys=True)}"


CASES = _cases()


@pytest.fixture(scope="session")
def engine_results(tmp_path_factory) -> dict:
    """One probe run for every distinct (twin, settings) pair."""
    from twin_helpers import run_probe

    from kvplan.vllm.twin import write_twin

    folder = tmp_path_factory.mktemp("twins")
    cases, seen = [], set()
    for profile, variant in CASES:
        key = _engine_key(profile, variant)
        if key in seen:
            continue
        seen.add(key)
        twin_dir = folder / hashlib.sha256(key.encode()).hexdigest()[:16]
        if not twin_dir.exists():
            write_twin(json.loads(_twin_config(profile)), twin_dir, shrink=False)
        cases.append({"name": key, "twin": str(twin_dir), "settings": _settings(profile, variant)})
    return run_probe(cases, folder)


CPU_DEVICE = Device(name="CPU (vLLM CPU build)", memory_bytes=24 * GiB, cuda_total_bytes=24 * GiB,
                    cuda_total_measured=True, vendor="cpu")


def _plan(profile: str, engine_settings: dict, async_scheduling: bool = False, version: str = "0.32.0"):
    arch = parse_architecture(load_bundled(profile).config)
    settings = Settings(
        max_model_len=engine_settings["max_model_len"],
        kv_cache_memory_bytes=engine_settings["kv_cache_memory_bytes"],
        block_size=engine_settings.get("block_size"),
        enable_prefix_caching=engine_settings.get("enable_prefix_caching"),
        kv_cache_dtype=engine_settings.get("kv_cache_dtype") or "auto",
    )
    device = CPU_DEVICE
    if async_scheduling:  # what vLLM's capacity function gives with async scheduling on
        device = replace(CPU_DEVICE, platform_rules=replace(CPU, async_scheduling=True))
    return compute_capacity(arch, device, settings, rules_for(version), load_overhead())


def _engine_layer_shapes(result: dict) -> list[tuple]:
    """The engine's per-layer specs, as comparable tuples (kind, shape...)."""
    shapes = []
    for spec in result["layer_specs"].values():
        specs = list(spec["kv_cache_specs"].values()) if spec["class"] == "UniformTypeKVCacheSpecs" else [spec]
        for s in specs:
            cls = s["class"]
            if cls == "MambaSpec":
                shapes.append(("state", s.get("real_page_size_bytes") or s["page_size_bytes"]))
            elif "MLA" in cls or "Indexer" in cls:
                shapes.append(("mla", s["head_size"] * (s.get("num_kv_heads") or 1)))
            elif cls == "SlidingWindowSpec":
                shapes.append(("sliding", s["num_kv_heads"], s["head_size"], s["sliding_window"]))
            elif cls == "ChunkedLocalAttentionSpec":
                shapes.append(("chunked", s["num_kv_heads"], s["head_size"], s["attention_chunk_size"]))
            else:
                shapes.append(("full", s["num_kv_heads"], s["head_size"]))
    return sorted(shapes, key=repr)


def _kvplan_layer_shapes(cap) -> list[tuple]:
    shapes = []
    specs = with_state_dtype(with_tp(list(cap.arch.layers), 1), cap.rules, cap.settings.mamba_ssm_cache_dtype)
    for s in specs:
        if isinstance(s, MambaState):
            shapes.append(("state", s.state_bytes()))
        elif isinstance(s, MLA):
            shapes.append(("mla", s.latent_size))
        elif isinstance(s, SlidingWindow):
            shapes.append(("sliding", s.num_kv_heads, s.head_size, s.window))
        elif isinstance(s, ChunkedLocal):
            shapes.append(("chunked", s.num_kv_heads, s.head_size, s.chunk))
        elif isinstance(s, FullAttention):
            shapes.append(("full", s.num_kv_heads, s.head_size))
    return sorted(shapes, key=repr)


@pytest.mark.parametrize("profile, variant", CASES, ids=[f"{p}-{v}" for p, v in CASES])
def test_layout_matches_vllm(profile, variant, engine_results):
    result = engine_results[_engine_key(profile, variant)]
    if profile in ENGINE_CANNOT_BUILD:
        assert not result["ok"], f"{profile} builds now: remove it from ENGINE_CANNOT_BUILD"
        assert ENGINE_CANNOT_BUILD[profile] in json.dumps(result["error"]), result["error"]
        return
    assert result["ok"], f"vLLM {result['vllm_version']} could not build the twin: {result.get('error')}"
    version = result["vllm_version"].split("+")[0]
    cap = _plan(profile, result["settings"], version=version)
    engine = result["capacity"]
    assert _kvplan_layer_shapes(cap) == _engine_layer_shapes(result)
    assert cap.block_size == result["cache_config"]["block_size"]
    assert cap.num_blocks == result["kv_cache_config"]["num_blocks"]
    assert cap.kv_cache_tokens_reported == engine["kv_cache_size_tokens"]
    assert cap.max_concurrency_reported == pytest.approx(engine["max_concurrency"], rel=1e-12)
    async_engine = result.get("capacity_async") or {}
    assert "max_concurrency" in async_engine, f"the probe recomputed no async capacity: {async_engine}"
    async_cap = _plan(profile, result["settings"], async_scheduling=True, version=version)
    assert async_cap.kv_cache_tokens_reported == async_engine["kv_cache_size_tokens"]
    assert async_cap.max_concurrency_reported == pytest.approx(async_engine["max_concurrency"], rel=1e-12)

