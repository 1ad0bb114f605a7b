"""Shrink a Hugging Face ``config.json`` into a *tiny twin* that vLLM can build in seconds.

The twin keeps every field that shapes the KV cache and shrinks only what costs RAM/time
when vLLM instantiates the model with dummy weights:

kept verbatim
    layer counts (``num_hidden_layers`` / ``num_layers`` / ``n_layer``), per-layer type lists
    (``layer_types``, ``layers_block_type``, ``hybrid_override_pattern``, ``attn_type_list``,
    ``attn_layer_period/offset``, ``full_attention_interval`` ...), KV heads
    (``num_key_value_heads``, ``multi_query_group_num``, ``n_head_kv``, ``multi_query``,
    ``num_global_key_value_heads``), head dims (``head_dim``, ``global_head_dim``,
    ``kv_channels``), ``sliding_window*``, ``attention_chunk_size``, ``num_kv_shared_layers``,
    MLA (``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``,
    ``index_head_dim``, ``index_n_heads``), linear attention / GDN / Mamba state dims
    (``linear_*``, ``mamba_*``, ``ssm_state_size``, ``n_groups``, conv kernels, ``chunk_size``)
    and dtype fields (``torch_dtype``, ``dtype``, ``mamba_ssm_dtype``, ``mamba_ssm_cache_dtype``).
shrunk
    vocabulary (``vocab_size``/``padded_vocab_size`` -> 512), MLP widths (``intermediate_size``
    and MoE/shared-expert variants -> 64), expert counts (-> ``max(top_k, 4)`` capped at the
    original; DeepSeek group routing collapsed to ``n_group = topk_group = 1``), ``q_lora_rank``
    (-> 64), the query-head count (-> the KV-head count, when the KV-head count is an explicit
    field) and ``hidden_size`` (see below).  ``quantization_config`` is dropped (dummy weights).
multimodal
    a config with ``text_config`` and a known text-only architecture (Gemma 3/4, Llama 4,
    Qwen3.5, Mistral 3, ...) becomes that text-only config (vision/audio towers dropped; the
    decoder layers and so the KV cache are identical).  Otherwise ``text_config`` is shrunk in
    place and the towers are shrunk.

``hidden_size``: many vLLM model files ignore ``head_dim`` and derive it as
``hidden_size // num_attention_heads`` (qwen2, falcon, chatglm, jamba, granitemoehybrid,
deepseek_v2's non-MLA path ...), and Mamba-1/2 ``d_inner = expand * hidden_size``.  For model
types whose vLLM file is known to honour ``head_dim`` (``HONOURS_HEAD_DIM``) the twin writes
``head_dim`` explicitly and drops ``hidden_size`` to 256 (also for MLA); for all others it sets
``hidden_size = heads' * head_dim`` so the derivation ``hidden_size // num_attention_heads``
still yields the original head size.  When an
``expand`` factor derives the Mamba inner size from ``hidden_size`` (and no explicit inner-size
field such as ``mamba_d_ssm`` is set) the factor is rescaled so ``expand' * hidden' == expand *
hidden``; if that is not an integer the original ``hidden_size`` is kept.

Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from kvplan.model.families import TEXT_CONFIG_DEFAULTS, WRAPPER_TEXT_MODEL_TYPE

TWIN_VOCAB = 512
TWIN_FFN = 64
TWIN_HIDDEN = 256
TWIN_Q_LORA = 64
MIN_EXPERTS = 4

# Multimodal wrapper architecture -> (text-only architecture vLLM registers, text model_type).
TEXT_ONLY_ARCH = {
    "Gemma3ForConditionalGeneration": ("Gemma3ForCausalLM", "gemma3_text"),
    "Gemma4ForConditionalGeneration": ("Gemma4ForCausalLM", "gemma4_text"),
    "Llama4ForConditionalGeneration": ("Llama4ForCausalLM", "llama4_text"),
    "Qwen3_5ForConditionalGeneration": ("Qwen3_5ForCausalLM", "qwen3_5_text"),
    "Qwen3_5MoeForConditionalGeneration": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
    "Mistral3ForConditionalGeneration": ("MistralForCausalLM", None),
    "PixtralForConditionalGeneration": ("MistralForCausalLM", None),
    "LlavaForConditionalGeneration": (None, None),  # text arch from text_config.model_type
    "LlavaNextForConditionalGeneration": (None, None),
    "Qwen3VLForConditionalGeneration": ("Qwen3ForCausalLM", "qwen3"),
    "Qwen3VLMoeForConditionalGeneration": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "Qwen2_5_VLForConditionalGeneration": ("Qwen2ForCausalLM", "qwen2"),
    "Qwen2VLForConditionalGeneration": ("Qwen2ForCausalLM", "qwen2"),
    "Glm4vMoeForConditionalGeneration": ("Glm4MoeForCausalLM", "glm4_moe"),
    "KimiK25ForConditionalGeneration": ("DeepseekV3ForCausalLM", None),
    "KimiVLForConditionalGeneration": ("DeepseekV3ForCausalLM", None),
}
# text_config.model_type -> causal-LM architecture (fallback when the table above says None).
TEXT_MODEL_TYPE_ARCH = {
    "mistral": "MistralForCausalLM",
    "llama": "LlamaForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma4_text": "Gemma4ForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}

# model_types whose vLLM attention reads ``config.head_dim`` (so hidden_size can shrink freely).
HONOURS_HEAD_DIM = {
    "llama", "mistral", "mixtral", "granite", "granitemoe", "granitemoeshared",
    "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
    "gemma", "gemma2", "gemma3_text", "gemma4_text", "gpt_oss", "llama4_text",
    "glm4_moe", "nemotron_h", "minimax_m2", "olmo2", "olmo3", "phi3", "falcon_h1",
    "exaone4", "seed_oss", "ministral3",
}

INTERMEDIATE_KEYS = (
    "intermediate_size", "moe_intermediate_size", "ffn_hidden_size", "intermediate_size_mlp",
    "moe_shared_expert_intermediate_size", "shared_expert_intermediate_size",
    "shared_intermediate_size", "expert_intermediate_size", "dense_intermediate_size",
)
# pure-Mamba configs use ``intermediate_size`` for d_inner: never shrink it there.
SSM_ONLY_MODEL_TYPES = {"mamba", "mamba2", "falcon_mamba"}
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOPK_KEYS = (
    "num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token", "top_k_experts",
)
VOCAB_KEYS = ("vocab_size", "padded_vocab_size", "vocab_size_per_layer_input")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "multi_query_group_num", "n_head_kv", "num_kv_heads")
EXPAND_KEYS = ("mamba_expand", "expand")
EXPLICIT_DINNER_KEYS = ("mamba_d_ssm", "mamba_intermediate_size", "d_inner")
TOWER_KEYS = ("vision_config", "audio_config", "vision_tower_config", "speech_config")
DROP_KEYS = ("quantization_config", "compression_config", "auto_map")
TOP_LEVEL_INHERIT = ("torch_dtype", "dtype", "tie_word_embeddings")


def _first(cfg: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if cfg.get(k) is not None:
            return k, cfg[k]
    return None, None


def _is_mla(cfg: dict) -> bool:
    return cfg.get("kv_lora_rank") is not None


def _shrink_text(cfg: dict, notes: list[str]) -> None:
    """Shrink one (text) config dict in place."""
    model_type = cfg.get("model_type", "")
    for k in DROP_KEYS:
        if cfg.pop(k, None) is not None:
            notes.append(f"dropped {k}")

    for k in VOCAB_KEYS:
        if isinstance(cfg.get(k), int) and cfg[k] > TWIN_VOCAB:
            cfg[k] = TWIN_VOCAB
    # token ids beyond the shrunk vocab could index out of range in dummy runs
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = cfg.get(k)
        if isinstance(v, int) and v >= TWIN_VOCAB:
            cfg[k] = min(TWIN_VOCAB - 1, 2)
        elif isinstance(v, list):
            cfg[k] = [x if x < TWIN_VOCAB else min(TWIN_VOCAB - 1, 2) for x in v]

    for k in INTERMEDIATE_KEYS:
        if k == "intermediate_size" and model_type in SSM_ONLY_MODEL_TYPES:
            continue
        v = cfg.get(k)
        if isinstance(v, int) and v > TWIN_FFN:
            cfg[k] = TWIN_FFN
        elif isinstance(v, list):  # per-layer lists (e.g. some MoE configs)
            cfg[k] = [min(x, TWIN_FFN) if isinstance(x, int) else x for x in v]

    _, top_k = _first(cfg, TOPK_KEYS)
    top_k = top_k if isinstance(top_k, int) else 1
    for k in EXPERT_KEYS:
        v = cfg.get(k)
        if isinstance(v, int) and v > 1:
            cfg[k] = min(v, max(top_k, MIN_EXPERTS))
    if cfg.get("n_group") is not None:  # DeepSeek/GLM grouped routing (not Mamba n_groups)
        cfg["n_group"] = 1
    if cfg.get("topk_group") is not None:
        cfg["topk_group"] = 1
    if isinstance(cfg.get("q_lora_rank"), int) and cfg["q_lora_rank"] > TWIN_Q_LORA:
        cfg["q_lora_rank"] = TWIN_Q_LORA

    _shrink_heads_and_hidden(cfg, notes)


def _shrink_heads_and_hidden(cfg: dict, notes: list[str]) -> None:
    model_type = cfg.get("model_type", "")
    hidden = cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd")
    hidden_key = next((k for k in ("hidden_size", "d_model", "n_embd") if cfg.get(k)), None)
    head_key, heads = _first(cfg, HEAD_KEYS)
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0:
        notes.append("hidden_size kept (no hidden/head count)")
        return
    mla = _is_mla(cfg)

    head_dim = cfg.get("head_dim")
    if not mla and not isinstance(head_dim, int):
        if isinstance(cfg.get("kv_channels"), int):
            head_dim = cfg["kv_channels"]
        else:
            head_dim = hidden // heads
            if head_dim * heads != hidden:
                notes.append("hidden_size kept (hidden not divisible by heads)")
                return
        if model_type in HONOURS_HEAD_DIM:
            # only where vLLM reads it (RWConfig, e.g., makes head_dim a read-only property);
            # elsewhere hidden_size = heads' * head_dim below keeps the derivation exact.
            cfg["head_dim"] = head_dim
            notes.append(f"head_dim set explicitly to {head_dim}")

    # Reduce the query-head count to the KV-head count when the latter is explicit.
    kv_key, kv_heads = _first(cfg, KV_HEAD_KEYS)
    if cfg.get("multi_query") is True and kv_key is None:
        kv_heads = 1
    new_heads = heads
    if mla:
        new_heads = min(heads, 16)
        if cfg.get("num_key_value_heads") is not None:
            cfg["num_key_value_heads"] = new_heads
    elif isinstance(kv_heads, int) and 0 < kv_heads < heads:
        new_heads = max(kv_heads, 2) if heads % max(kv_heads, 2) == 0 else kv_heads
        # heads' must stay a multiple of kv_heads
        if new_heads % kv_heads:
            new_heads = kv_heads
    # Gemma 4-like configs with separate global KV heads need q heads divisible by them
    g_kv = cfg.get("num_global_key_value_heads")
    if isinstance(g_kv, int) and g_kv > 0 and new_heads % g_kv:
        new_heads = heads
    if new_heads != heads:
        cfg[head_key] = new_heads

    # Where does the Mamba inner size come from?
    exp_key, expand = _first(cfg, EXPAND_KEYS)
    dinner_from_hidden = (
        exp_key is not None
        and _first(cfg, EXPLICIT_DINNER_KEYS)[0] is None
        and not (cfg.get("mamba_num_heads") and cfg.get("mamba_head_dim"))
        and model_type not in {"nemotron_h"}
    )
    # LongRoPE factors are sized for hidden / heads (transformers checks it): keep that ratio.
    longrope = any(isinstance(cfg.get(k), dict) and isinstance(cfg[k].get("short_factor"), list)
                   for k in ("rope_scaling", "rope_parameters"))
    if (mla or model_type in HONOURS_HEAD_DIM) and not longrope:
        # A multiple of the query heads: transformers' configs check hidden % heads == 0.
        new_hidden = max(new_heads, TWIN_HIDDEN // new_heads * new_heads)
    else:
        new_hidden = new_heads * head_dim
    if dinner_from_hidden:
        d_inner = expand * hidden
        if d_inner == int(d_inner) and int(d_inner) % new_hidden == 0 and not mla:
            cfg[exp_key] = int(d_inner) // new_hidden
            notes.append(f"{exp_key} rescaled to {cfg[exp_key]} (d_inner {int(d_inner)} kept)")
        else:
            cfg[head_key] = heads
            notes.append("hidden_size kept (Mamba d_inner derives from it)")
            return
    if new_hidden < hidden:
        cfg[hidden_key] = new_hidden


def _promote_text_config(cfg: dict, notes: list[str]) -> dict:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    target_arch, target_type = TEXT_ONLY_ARCH.get(arch, (None, None))
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        if target_arch and any(k in cfg for k in TOWER_KEYS):
            # A flat multimodal config (Qwen2-VL, Qwen2.5-VL): the text fields are the top level.
            out = {k: v for k, v in copy.deepcopy(cfg).items() if k not in TOWER_KEYS}
            out["architectures"] = [target_arch]
            if target_type:
                out["model_type"] = target_type
            notes.append(f"multimodal {arch} -> text-only {target_arch} ({out.get('model_type')})")
            return out
        return cfg
    wrapper = WRAPPER_TEXT_MODEL_TYPE.get(str(cfg.get("model_type") or ""))
    if wrapper and not text.get("model_type"):  # LlavaConfig / LlavaNextConfig: a Llama by default
        text = dict(text, model_type=wrapper)
    tmt = text.get("model_type")
    if wrapper or tmt in TEXT_CONFIG_DEFAULTS:
        # Fields the text_config leaves to its config class (LLaVA writes only what differs), written
        # out so the twin can shrink them; kvplan.model.families.TEXT_CONFIG_DEFAULTS is checked against
        # the installed transformers by tests/twins/test_twins.py.
        filled = {k: v for k, v in TEXT_CONFIG_DEFAULTS.get(str(tmt), {}).items() if k not in text}
        if filled:
            text = dict(text, **filled)
            notes.append(f"text_config defaults of {tmt} written out: {', '.join(sorted(filled))}")
    if target_arch is None:
        target_arch = TEXT_MODEL_TYPE_ARCH.get(tmt)
    if target_arch is None:
        notes.append(f"multimodal {arch}: no text-only architecture known; towers shrunk")
        return cfg
    out = copy.deepcopy(text)
    for k in TOP_LEVEL_INHERIT:
        if k not in out and k in cfg:
            out[k] = cfg[k]
    out["architectures"] = [target_arch]
    if target_type and tmt != target_type or not tmt:
        out["model_type"] = target_type
    notes.append(f"multimodal {arch} -> text-only {target_arch} ({out.get('model_type')})")
    return out


def _shrink_towers(cfg: dict) -> None:
    for k in TOWER_KEYS:
        tower = cfg.get(k)
        if isinstance(tower, dict):
            for kk in ("num_hidden_layers", "depth", "num_layers"):
                if isinstance(tower.get(kk), int):
                    tower[kk] = 1
            for kk in ("intermediate_size",):
                if isinstance(tower.get(kk), int):
                    tower[kk] = TWIN_FFN


def make_twin(config: dict) -> dict:
    """Return a shrunk deep copy of ``config`` (a parsed HF config.json).

    The result carries ``_kvplan_twin_notes`` (a list of strings) describing what was
    changed beyond the plain shrinking rules; vLLM ignores unknown keys.
    """
    notes: list[str] = []
    cfg = copy.deepcopy(config)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    for where in (cfg, text):
        q = where.get("quantization_config")
        if isinstance(q, dict) and q.get("kv_cache_scheme"):
            notes.append(
                "checkpoint declares quantization_config.kv_cache_scheme="
                f"{json.dumps(q['kv_cache_scheme'], sort_keys=True)}; it is dropped with the "
                "quantization config: pass the matching kv_cache_dtype (e.g. fp8) to the probe"
            )
    cfg = _promote_text_config(cfg, notes)
    if isinstance(cfg.get("text_config"), dict):
        _shrink_text(cfg["text_config"], notes)
        _shrink_towers(cfg)
        for k in DROP_KEYS:
            cfg.pop(k, None)
    else:
        _shrink_text(cfg, notes)
    cfg["_kvplan_twin_notes"] = notes
    return cfg


def write_twin(config: dict, folder: str | os.PathLike, *, shrink: bool = True) -> str:
    """Write the twin of ``config`` (or ``config`` itself if ``shrink`` is False) as
    ``folder/config.json`` and return the folder path.  No tokenizer files are written:
    the probe builds the engine with ``skip_tokenizer_init=True``."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    twin = make_twin(config) if shrink else copy.deepcopy(config)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(twin, fh, indent=1, sort_keys=True)
    return folder
