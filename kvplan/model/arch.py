"""config.json (as data) -> Architecture: a list of layer specs plus weight counts.

This module is the only place in kvplan that looks at ``model_type`` or at a config's
field names. ``model_type`` picks the family (:data:`~kvplan.model.families.FAMILIES`), and
the readers here ask the family for its quirks rather than compare type names; the one
name test left is vLLM's own (Gemma 3's RoPE-scaled length, :func:`derived_max_model_len`),
plus the multimodal towers' types (:func:`_tower_params`). Everything downstream sums over
:class:`~kvplan.model.layers.LayerSpec`.

Rules follow vLLM's `vllm/config/model.py` (0.11.0): ``get_total_num_kv_heads``,
``get_head_size``, ``get_sliding_window``; and the per-model files under
`vllm/model_executor/models/` for which layers slide, chunk, or keep recurrent state.
Config files are parsed as JSON; no code from a model repository is ever run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvplan.errors import KvplanError
from kvplan.model.dtypes import WEIGHT_DTYPE_BYTES
from kvplan.model.encoders import (
    Qwen3VisionTower,
    all_positive_ints,
    is_qwen3_vision,
    patch_merger,
    qwen3_vision_tower,
    vit_block,
)
from kvplan.model.families import (
    SSM_HINT_FIELDS,
    TEXT_CONFIG_DEFAULTS,
    WRAPPER_TEXT_MODEL_TYPE,
    AttentionShape,
    Family,
    family_for,
    kda_state,
    sliding_window_size,
)
from kvplan.model.layers import (
    MLA,
    ChunkedLocal,
    CompressedIndexer,
    CompressedMLA,
    CompressorState,
    FullAttention,
    LayerSpec,
    MLAIndexer,
    SlidingMLA,
    SlidingWindow,
)
from kvplan.model.weights import (
    MXFP4_BYTES,
    NO_QUANTIZATION,
    NVFP4_BYTES,
    ExpertShape,
    ParamCounts,
    Quantization,
    int_group_bytes,
)

_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config", "thinker_config")


@dataclass(frozen=True)
class Architecture:
    """What kvplan needs to know about a model, independent of how it is deployed."""

    model_type: str
    architectures: tuple[str, ...]
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    max_position_embeddings: int | None
    # vLLM's derived max_model_len: the default context, and the most it accepts.
    max_model_len_limit: int | None
    # One spec per KV-holding layer, in layer order (a parallel hybrid layer adds two).
    layers: tuple[LayerSpec, ...]
    # Index of the decoder layer each spec belongs to (for pipeline-parallel splits).
    layer_index: tuple[int, ...]
    params: ParamCounts
    # Widest per-token MLP intermediate (dense intermediate, or experts_per_token x expert
    # intermediate + shared experts): what a forward pass's activations scale with.
    mlp_activation_width: int
    model_dtype: str  # activation dtype vLLM runs in ("auto" dtype resolution)
    quantization: Quantization
    # The checkpoint's own KV-cache scheme, read by vLLM >= 0.19.1 for kv dtype "auto".
    checkpoint_kv_dtype: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Where the layer specs come from: "kvplan rules", "unverified: read as a plain decoder",
    # or "vLLM X (exact)" when learned from the installed engine (kvplan.vllm.engine_layout).
    layout_source: str = "kvplan rules"
    num_experts: int = 0  # routed experts of an MoE layer (0: no MoE)
    expert_intermediate_size: int = 0  # one routed expert's intermediate size (0: no MoE)
    # The vision tower's pass in vLLM's profile run, where kvplan has read the tower (else None).
    vision_encoder: Qwen3VisionTower | None = None
    # MTP modules the checkpoint carries (`num_nextn_predict_layers`, `mtp_num_hidden_layers`; 0: none
    # named): the KV layers an MTP drafter adds (kvplan.plan.speculative).
    mtp_layers: int = 0

    @property
    def uses_mla(self) -> bool:
        """vLLM's ``model_config.use_mla`` (`is_deepseek_mla`): latent attention, DeepSeek-V4's compressed
        attention included (what the CPU platform's MLA rules key on)."""
        return any(isinstance(s, (MLA, CompressedMLA)) for s in self.layers)

    @property
    def layout_verified(self) -> bool:
        return not self.layout_source.startswith("unverified")

    @property
    def model_dtype_bytes(self) -> int:
        return WEIGHT_DTYPE_BYTES.get(self.model_dtype, 2)

    @property
    def kinds(self) -> list[str]:
        """Distinct layer kinds in order of first appearance."""
        seen: list[str] = []
        for spec in self.layers:
            if spec.kind not in seen:
                seen.append(spec.kind)
        return seen

    @property
    def attention_label(self) -> str:
        """Short human label: GQA, MQA, MHA, MLA, hybrid SWA, hybrid Mamba..."""
        kinds = set(self.kinds)
        if "mamba" in kinds:
            return "hybrid (attention + recurrent state)"
        if kinds == {"mla"}:
            return "MLA"
        if kinds == {"mla", "mla_indexer"}:
            return "MLA + sparse-attention indexer"
        if "compressed_mla" in kinds:
            ratios = sorted({s.tokens_per_state for s in self.layers if type(s) is CompressedMLA})
            window = max(s.window for s in self.layers if type(s) is SlidingMLA)
            return (f"compressed attention 1:{' and 1:'.join(map(str, ratios))} + sparse indexer, window {window} "
                    "on every layer (DeepSeek-V4)")
        base = "attention"
        attn = [s for s in self.layers if isinstance(s, FullAttention)]
        if attn:
            kv = attn[0].num_kv_heads
            base = "MQA" if kv == 1 else "MHA" if kv == self.num_attention_heads else "GQA"
        if "sliding_window" in kinds:
            return f"{base} + sliding window" if "full_attention" in kinds else f"{base}, sliding window on every layer"
        if "chunked_local" in kinds:
            return f"{base} + chunked local"
        return base


# Fields read as whole numbers: a string, float, bool or list there is a broken config (or a
# mistyped --set), refused with the field's name rather than read as something else.
INTEGER_FIELDS = frozenset([
    "hidden_size", "n_embd", "d_model", "dim", "num_hidden_layers", "n_layer", "num_layers", "n_layers",
    "num_attention_heads", "n_head", "num_heads", "n_heads", "num_key_value_heads", "n_head_kv",
    "num_kv_heads", "multi_query_group_num", "head_dim", "attention_head_dim", "hidden_size_per_head",
    "kv_channels", "vocab_size", "padded_vocab_size", "intermediate_size", "ffn_hidden_size", "n_inner",
    "moe_intermediate_size", "intermediate_size_mlp", "shared_expert_intermediate_size",
    "shared_intermediate_size", "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts",
    "num_experts_per_tok", "experts_per_token", "moe_topk", "n_shared_experts", "num_shared_experts",
    "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim",
    "attention_chunk_size", "max_window_layers", "attn_layer_period",
    "attn_layer_offset", "expert_layer_period", "expert_layer_offset", "full_attention_interval",
    "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_num_heads", "mamba_n_heads", "n_mamba_heads",
    "mamba_head_dim", "mamba_d_head", "n_groups", "mamba_n_groups", "mamba_ngroups", "ssm_state_size",
    "conv_kernel", "mamba_d_ssm", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "conv_L_cache", "num_kv_shared_layers",
    "num_nextn_predict_layers", "max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "n_ctx",
    "no_rope_layer_interval", "hidden_size_per_layer_input", "vocab_size_per_layer_input", "global_head_dim",
    "num_global_key_value_heads", "index_topk_freq", "index_skip_topk_offset", "mtp_num_hidden_layers",
    "swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim", "sliding_window_size",
])
# Whole numbers, or one whole number per layer (MiMo-V2-Flash's moe_layer_freq flags).
INTEGER_OR_PER_LAYER_FIELDS = frozenset(["moe_layer_freq"])

class _Fields:
    """Reads config fields by their many names, recording what was missing."""

    def __init__(self, text: dict[str, Any], top: dict[str, Any]):
        self.text = text
        self.top = top
        self.missing: list[str] = []

    def get(self, *names: str, default: Any = None) -> Any:
        for name in names:
            for source in (self.text, self.top):
                value = source.get(name)
                if value is not None:
                    if not _all_finite(value):
                        raise KvplanError(f"invalid {name} in config: it holds NaN or Infinity, and kvplan reads this "
                                          "field", f"fix it with --set {name}=VALUE")
                    if name in INTEGER_OR_PER_LAYER_FIELDS and isinstance(value, list) and all(
                            isinstance(v, int) and not isinstance(v, bool) for v in value):
                        return value
                    if name in INTEGER_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
                        raise KvplanError(
                            f"invalid {name} in config: {value!r} (expected a whole number)",
                            f"fix it with --set {name}=N",
                        )
                    return value
        return default

    def need(self, *names: str) -> Any:
        value = self.get(*names)
        if value is None:
            self.missing.append(names[0])
            return 0
        return value


def _all_finite(value: Any, depth: int = 0) -> bool:
    """No NaN or Infinity anywhere in a field's value (a number, or lists and objects of them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if depth < 64 and isinstance(value, (list, tuple)):
        return all(_all_finite(v, depth + 1) for v in value)
    if depth < 64 and isinstance(value, dict):
        return all(_all_finite(v, depth + 1) for v in value.values())
    return True


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``hf_text_config``: the language model's part of a multimodal config. A LLaVA-style
    ``text_config`` may name only its model type and leave layers and heads to that text config
    class's defaults (filled by :func:`_parse_architecture`)."""
    for key in _TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, dict) and ("num_hidden_layers" in sub or "hidden_size" in sub):
            return sub
    sub = config.get("text_config")
    if isinstance(sub, dict) and (config.get("model_type") in WRAPPER_TEXT_MODEL_TYPE
                                  or sub.get("model_type") in TEXT_CONFIG_DEFAULTS):
        return sub
    return config


def _text_defaults(config: dict[str, Any], text: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The text config a multimodal wrapper's config class builds: a LLaVA / LLaVA-NeXT
    ``text_config`` without ``model_type`` is a Llama (``text_config.get("model_type", "llama")``,
    a missing one ``CONFIG_MAPPING["llama"]()``: transformers' LlavaConfig / LlavaNextConfig), and
    the fields it leaves out take that class's defaults (:data:`TEXT_CONFIG_DEFAULTS`). vLLM builds
    the language model from that object (`LlavaNextForConditionalGeneration.__init__`,
    models/llava_next.py@0.32.0: ``init_vllm_registered_model(hf_config=config.text_config)``)."""
    wrapper = WRAPPER_TEXT_MODEL_TYPE.get(str(config.get("model_type") or ""))
    nested = text is not config
    if not nested and wrapper and not isinstance(config.get("text_config"), dict):
        text, nested = {}, True  # no text_config at all: the wrapper's default text model
    if not nested:
        return dict(text)
    text = dict(text)
    if wrapper:
        text.setdefault("model_type", wrapper)
    defaults = TEXT_CONFIG_DEFAULTS.get(str(text.get("model_type") or ""), {})
    filled = [k for k in defaults if k not in text]
    for key in filled:
        text[key] = defaults[key]
    shaping = [k for k in filled if k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                          "num_key_value_heads", "sliding_window")]
    if shaping:
        notes.append(f"text_config leaves {', '.join(shaping)} to transformers' {text['model_type']} defaults: "
                     + ", ".join(f"{k} {defaults[k]}" for k in shaping))
    return text


def total_kv_heads(f: _Fields, family: Family, num_heads: int) -> int:
    """``ModelConfig.get_total_num_kv_heads`` (vllm/config/model.py): ``multi_query`` means one KV head
    unless the family's flag turns it off (Falcon), then the family's own reader (MPT / DBRX), then
    the generic field names."""
    multi_query_off = family.multi_query_off_field and f.get(family.multi_query_off_field, default=False)
    if not multi_query_off and f.get("multi_query", default=False):
        return 1
    own = family.kv_heads(f, num_heads) if family.kv_heads else None
    if own is not None:
        return own
    for name in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"):
        value = f.get(name)
        if value is not None:
            return int(value)
    return num_heads


def head_size(f: _Fields, family: Family, hidden: int, num_heads: int) -> int:
    """``ModelConfig.get_head_size`` for non-MLA attention (vllm/config/model.py): the family's own
    reader where it gives one (Zamba2), else the generic field names, else hidden / heads."""
    own = family.head_size(f) if family.head_size else None
    if own:
        return int(own)
    for name in ("head_dim", "attention_head_dim", "hidden_size_per_head", "kv_channels"):
        value = f.get(name)
        if value is not None:
            return int(value)
    if not num_heads:
        return 0
    return hidden // num_heads


def _model_dtype(f: _Fields) -> str:
    """vLLM's ``--dtype auto``: the config's dtype, float32 checkpoints served in bf16."""
    dtype = str(f.get("torch_dtype", "dtype", default="bfloat16")).replace("torch.", "")
    return "float16" if dtype in ("float16", "half") else "bfloat16"  # fp32/fp8 checkpoints run in bf16


def _quantization(top: dict[str, Any], f: _Fields, family: Family) -> tuple[Quantization, str | None]:
    """The checkpoint's weight scheme and, if declared, its KV-cache scheme."""
    qc = top.get("quantization_config") or f.get("quantization_config")
    if not isinstance(qc, dict):
        return NO_QUANTIZATION, None
    if not _all_finite(qc):
        raise KvplanError("invalid quantization_config in config: it holds NaN or Infinity, and kvplan reads it")
    method = str(qc.get("quant_method", "")).lower()
    # vLLM >= 0.19.1 resolves "auto" through the checkpoint's KV scheme for ModelOpt checkpoints
    # only (`resolve_kv_cache_dtype_string`); compressed-tensors, AWQ and GPTQ stay "auto".
    kv_dtype = None
    if method.startswith("modelopt"):
        kv_scheme = qc.get("kv_cache_scheme")
        algo = str(qc.get("kv_cache_quant_algo", "")).upper()
        if isinstance(kv_scheme, dict) and kv_scheme.get("num_bits") == 8 or algo == "FP8":
            kv_dtype = "fp8"
        elif isinstance(kv_scheme, dict) and kv_scheme.get("num_bits") == 4 or algo == "NVFP4":
            kv_dtype = "nvfp4"
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        fp8 = Quantization(method, 1.0 + 4 / (128 * 128), note="fp8 weights")
        expert_dtype = top.get("expert_dtype") or qc.get("expert_dtype") or "fp4"
        if family.fp4_experts_in_fp8 and expert_dtype == "fp4":
            # DeepSeek-V4's DeepseekV4FP8Config (models/deepseek_v4/quant_config.py@0.32.0): the routed experts are
            # MXFP4 unless the config says expert_dtype "fp8" (its default is fp4). kvplan prices the shared experts
            # with them.
            fp8 = replace(fp8, role_bytes=(("experts", MXFP4_BYTES),), note="fp8 weights, MXFP4 routed experts")
        return fp8, kv_dtype
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "auto-round"):
        bits, group = _checked_quant(qc.get("bits", qc.get("w_bit", 4)), qc.get("group_size", qc.get("q_group_size", 128)))
        return Quantization(method, int_group_bytes(bits, group), note=f"int{bits}, group {group}"), kv_dtype
    if method == "mxfp4":
        # gpt-oss: only the MoE experts are MXFP4 (modules_to_not_convert lists the rest).
        keep = frozenset({"attention", "mlp", "recurrent"})
        return Quantization("mxfp4", MXFP4_BYTES, unquantized_roles=keep, note="mxfp4 experts"), kv_dtype
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        first = next(iter(groups.values()), None) or {}
        weights = first.get("weights") or {}
        bpp = _weights_group_bytes(weights, "int")
        note = "nvfp4 weights" if bpp == NVFP4_BYTES else f"{weights.get('num_bits', 8)}-bit weights"
        return Quantization(method, bpp, note=note), kv_dtype
    if method.startswith("modelopt"):
        algo = str(qc.get("quant_algo", "FP8")).upper()
        bpp = NVFP4_BYTES if "FP4" in algo else 1.0
        if algo == "MIXED_PRECISION":  # per-module groups; the 4-bit one prices the default
            sizes = [_weights_group_bytes(w, "float")
                     for w in ((g or {}).get("weights") or {} for g in (qc.get("config_groups") or {}).values())]
            bpp = min(sizes, default=1.0)
        return Quantization(method, bpp, note=algo), kv_dtype
    if method == "bitsandbytes":
        bpp = 0.5 + 4 / 64 if qc.get("load_in_4bit") else 1.0
        return Quantization(method, bpp, note="bitsandbytes"), kv_dtype
    raise KvplanError(
        f"unsupported quantization method {method!r} in quantization_config",
        "pass --weights-memory to give the loaded weight size directly",
    )


def _moe_layers(f: _Fields, family: Family, n: int) -> list[bool]:
    """Which decoder layers are mixture-of-experts layers: the family's own pattern (Jamba) or the
    generic fields (per-layer flags, moe_layers, mlp_layer_types, else first-k-dense / frequency / step)."""
    num_experts = f.get("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
    if not num_experts or num_experts <= 1:
        return [False] * n
    first_dense = f.get("first_k_dense_replace", default=0)
    freq = f.get("moe_layer_freq", default=1)
    if isinstance(freq, list):  # MiMo-V2-Flash: one flag per layer (`is_moe_layer`, models/mimo_v2.py@0.32.0)
        if len(freq) != n:
            raise KvplanError(f"moe_layer_freq has {len(freq)} entries for {n} layers")
        return [bool(x) for x in freq]
    step = f.get("decoder_sparse_step", "interleave_moe_layer_step", default=1) or 1
    only_mlp = set(f.get("mlp_only_layers", default=[]) or [])
    if family.moe_layers is not None:
        return family.moe_layers(f, n)
    if isinstance(f.get("moe_layers"), list):
        moe = set(f.get("moe_layers"))
        return [i in moe for i in range(n)]
    mlp_layer_types = f.get("mlp_layer_types")  # Laguna: "dense" / "sparse" per layer
    if isinstance(mlp_layer_types, list) and len(mlp_layer_types) == n:
        return [t == "sparse" for t in mlp_layer_types]
    return [
        i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in only_mlp for i in range(n)
    ]


def _count_params(
    f: _Fields, family: Family, kinds: list[str], hidden: int, num_heads: int, kv_heads: int, head: int,
    shapes: dict[str, AttentionShape | None] | None = None,
) -> ParamCounts:
    """Parameters of the loaded model, by role (an estimate from the config)."""
    n = len(kinds)
    vocab = f.get("vocab_size", "padded_vocab_size", default=0)
    inter = f.get("intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden)
    gated = family.gated_mlp
    mlp_mats = 3 if gated else 2
    tied = bool(f.get("tie_word_embeddings", default=False))
    attn = mlp = experts = shared_experts = recurrent = other = 0

    # Attention projections per attention layer.
    if any(k.startswith("dsv4_") for k in kinds):
        attn, other = _dsv4_attention_params(f, kinds, hidden, num_heads)
    elif f.get("kv_lora_rank") is not None and "mla" in kinds:
        q_lora = f.get("q_lora_rank")
        nope, rope = f.get("qk_nope_head_dim", default=128), f.get("qk_rope_head_dim", default=64)
        v_head, kv_lora = f.get("v_head_dim", default=128), f.get("kv_lora_rank")
        q = hidden * q_lora + q_lora * num_heads * (nope + rope) if q_lora else hidden * num_heads * (nope + rope)
        per_attn = q + hidden * (kv_lora + rope) + kv_lora * num_heads * (nope + v_head) + num_heads * v_head * hidden
        attn = per_attn * sum(1 for k in kinds if k in ("full", "sliding", "chunked", "mla", "attention+mamba"))
        if q_lora and f.get("index_head_dim") and f.get("index_n_heads"):
            attn, other = _add_mla_indexer_params(f, kinds, hidden, q_lora, attn, other)
    else:
        # q and o of num_heads x head, k and v of the layer's KV heads. Gemma 4's global layers have
        # their own shape and keep the V slot even with attention_k_eq_v; a layer reusing another's KV
        # (Gemma 3n / 4 num_kv_shared_layers) has q and o only (`Gemma4Attention.__init__`,
        # models/gemma4.py@0.32.0; `Gemma3nAttention.__init__`, models/gemma3n.py@0.32.0).
        # An output gate (Qwen3-Next, Qwen3.5 / 3.6: families.py) doubles q_proj's heads.
        # Laguna: query heads per layer (num_attention_heads_per_layer) and a softplus output gate, one per head
        # (gating true / "per-head") or per channel ("per-element") (`LagunaAttention.__init__`,
        # models/laguna.py@0.32.0).
        first_kv_shared = n - int(f.get("num_kv_shared_layers", default=0) or 0)
        gate = 2 if f.get("attn_output_gate") is True else 1
        heads_per_layer = f.get("num_attention_heads_per_layer")
        if not (isinstance(heads_per_layer, list) and len(heads_per_layer) == n):
            heads_per_layer = [num_heads] * n
        gating = f.get(family.output_gate_field) if family.output_gate_field else None
        for i, kind in enumerate(kinds):
            if kind not in ("full", "sliding", "chunked", "attention+mamba", "global"):
                continue
            shape = (shapes or {}).get(kind)  # the family's own shape for the kind (_parse_architecture)
            if shape is not None:  # q: heads x K size; k, v: KV heads x K and V sizes; o: heads x V size
                value = shape.head_size_v or shape.head_size
                attn += hidden * (shape.num_heads * (shape.head_size + value)
                                  + shape.num_kv_heads * (shape.head_size + value))
                continue
            layer_kv_heads, layer_head = _gemma4_global_shape(f, kv_heads) if kind == "global" else (kv_heads, head)
            kv = 2 * layer_kv_heads * layer_head if i < first_kv_shared else 0
            heads = int(heads_per_layer[i])
            attn += hidden * ((gate * heads + heads) * layer_head + kv)
            if gating:
                attn += hidden * heads * (1 if gating is True or gating == "per-head" else layer_head)

    # MLPs: dense or mixture of experts.
    moe = _moe_layers(f, family, n)
    num_experts = f.get("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", default=0)
    expert_inter = f.get("moe_intermediate_size", default=inter)
    dense_inter = f.get(family.dense_mlp_field, default=inter) if family.dense_mlp_field else inter
    # Shared experts: n_shared_experts of expert size (DeepSeek) or one of its own size (Qwen).
    shared = f.get("n_shared_experts", "num_shared_experts", default=0) or 0
    shared_inter = f.get("shared_expert_intermediate_size", "shared_intermediate_size", default=0) or 0
    if family.shared_expert_of_intermediate_size:
        shared_inter = inter  # one shared expert of intermediate_size in every MoE layer (Llama 4)
    if family.mlp_kinds is not None:  # the family's own per-layer MLPs (Nemotron-H's pattern)
        mlp_kinds = family.mlp_kinds(f, n)
    else:
        mlp_kinds = ["moe" if is_moe else "dense" for is_moe in moe]
    double_wide_from = _double_wide_from(f, family, n)
    for i, mlp_kind in enumerate(mlp_kinds):
        if mlp_kind == "moe":
            experts += num_experts * mlp_mats * hidden * expert_inter
            shared_experts += shared * mlp_mats * hidden * expert_inter + mlp_mats * hidden * shared_inter
            other += hidden * num_experts  # router
        elif mlp_kind == "dense":
            wide = 2 if double_wide_from is not None and i >= double_wide_from else 1
            mlp += mlp_mats * hidden * dense_inter * wide
    if family.dense_mlp_beside_experts and num_experts:
        # Gemma 4 runs its dense MLP beside the experts in every layer (`Gemma4DecoderLayer`).
        mlp += sum(1 for k in mlp_kinds if k == "moe") * mlp_mats * hidden * dense_inter

    # Recurrent layers: input/output projections (the conv kernels and A/D are tiny).
    for kind in kinds:
        if "mamba" not in kind:
            continue
        kda = f.get("linear_attn_config") if family.state is kda_state else None  # Kimi Delta Attention layers
        if isinstance(kda, dict) and kda.get("num_heads") and kda.get("head_dim"):
            # Kimi Delta Attention (`KimiGatedDeltaNetAttention.__init__`,
            # model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py@0.32.0): in_proj to q, k, v
            # (3 x heads x head_dim), beta (heads) and f_a (head_dim); f_b and g_b (head_dim ->
            # heads x head_dim); g_a (hidden -> head_dim); o_proj back to hidden; the q/k/v conv
            # kernels, dt_bias, A_log and o_norm. Kimi-K3's full-rank gate is not counted here.
            kh, kd, kk = kda["num_heads"], kda["head_dim"], kda.get("short_conv_kernel_size", 4)
            proj = kh * kd
            recurrent += (hidden * (3 * proj + kh + kd) + 2 * kd * proj + hidden * kd + proj * hidden
                          + 3 * proj * kk + proj + kh + kd)
        elif f.get("linear_num_value_heads"):
            kh, vh = f.get("linear_num_key_heads", default=0), f.get("linear_num_value_heads", default=0)
            kd, vd = f.get("linear_key_head_dim", default=0), f.get("linear_value_head_dim", default=0)
            recurrent += hidden * (2 * kh * kd + 2 * vh * vd + 2 * vh) + vh * vd * hidden
        elif f.get("attn_type_list"):
            recurrent += 4 * hidden * num_heads * head
        else:
            m_heads = f.get("mamba_num_heads", "mamba_n_heads", default=0) or 0
            d_inner = f.get("mamba_d_ssm") or m_heads * (f.get("mamba_head_dim", "mamba_d_head", default=0) or 0)
            d_inner = d_inner or f.get("mamba_expand", "expand", default=2) * hidden
            groups_state = 2 * (f.get("n_groups", "mamba_n_groups", default=1) or 1) * (
                f.get("ssm_state_size", "mamba_d_state", default=0) or 0
            )
            # in_proj -> (z, x, B, C, dt), out_proj back to hidden
            recurrent += hidden * (2 * d_inner + (groups_state + m_heads if m_heads else 0)) + d_inner * hidden
    embedding = vocab * hidden
    per_layer = f.get("hidden_size_per_layer_input", default=0) or 0
    if per_layer:
        # Gemma 3n / 4 per-layer embeddings (`embed_tokens_per_layer`: vocab_size_per_layer_input x
        # layers x hidden_size_per_layer_input), their projection from the hidden state, and each
        # layer's input gate and projection (`Gemma4DecoderLayer.per_layer_input_gate`).
        per_vocab = f.get("vocab_size_per_layer_input", default=vocab) or vocab
        embedding += per_vocab * n * per_layer
        other += hidden * n * per_layer + n * 2 * hidden * per_layer
    lm_head = 0 if tied else vocab * hidden
    other += (2 * n + 1) * hidden  # norms
    return ParamCounts(embedding=embedding, lm_head=lm_head, attention=attn, mlp=mlp, experts=experts,
                       recurrent=recurrent, other=other, shared_experts=shared_experts)


def _add_mla_indexer_params(f: _Fields, kinds: list[str], hidden: int, q_lora: int, attn: int,
                            other: int) -> tuple[int, int]:
    """(attention, other) with DeepSeek-V3.2's sparse-attention indexer in every MLA layer that keeps one: wq_b
    (q_lora_rank -> index_n_heads x index_head_dim) and wk (hidden -> index_head_dim), quantized like the
    attention; weights_proj (hidden -> index_n_heads, "not quantized") and k_norm (a LayerNorm's weight and bias)
    in the model dtype (`Indexer.__init__`, layers/attention/nsa/nsa_indexer.py@sglang 0.5.3). vLLM's `Indexer`
    (models/deepseek_v2.py@0.32.0) holds the same four but fuses wk into weights_proj in bf16: wk's one extra
    byte a parameter (56 MB over DeepSeek-V3.2's 61 layers) is not priced."""
    index_dim, index_heads = int(f.get("index_head_dim")), int(f.get("index_n_heads"))
    indexed = sum(1 for i, k in enumerate(kinds) if k == "mla" and _has_indexer(f, i))
    return (attn + indexed * (q_lora * index_heads * index_dim + hidden * index_dim),
            other + indexed * (hidden * index_heads + 2 * index_dim))


def _dsv4_attention_params(f: _Fields, kinds: list[str], hidden: int, heads: int) -> tuple[int, int]:
    """DeepSeek-V4's attention projections (models/deepseek_v4/attention.py@0.32.0): per layer the fused wq_a + wkv
    (hidden -> q_lora_rank + head_dim), wq_b (q_lora_rank -> heads x head_dim), wo_a (per output group, heads x
    head_dim / o_groups -> o_lora_rank) and wo_b (o_groups x o_lora_rank -> hidden); a C4 layer's indexer wq_b
    (q_lora_rank -> index_n_heads x index_head_dim) and weights_proj (hidden -> index_n_heads): the quantized
    ones. And the compressors' fused wkv + wgate (hidden -> 2 x coff x dim, compressor.py@0.32.0), which vLLM
    builds unquantized. The mHC mixing and the norms are small and not counted. Returns (attention, other)."""
    head, q_lora = f.get("head_dim", default=512), f.get("q_lora_rank", default=0) or 0
    o_groups, o_lora = f.get("o_groups", default=1) or 1, f.get("o_lora_rank", default=0) or 0
    index_dim, index_heads = f.get("index_head_dim", default=128), f.get("index_n_heads", default=0) or 0
    per_layer = hidden * (q_lora + head) + q_lora * heads * head + heads * head * o_lora + o_groups * o_lora * hidden
    attn = per_layer * len(kinds)
    compressors = 0
    for kind in kinds:
        if kind == "dsv4_c4":
            attn += q_lora * index_heads * index_dim + hidden * index_heads
            compressors += hidden * 2 * 2 * (head + index_dim)  # coff 2: the cache's and the indexer's
        elif kind == "dsv4_c128":
            compressors += hidden * 2 * head
    return attn, compressors


_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                  "max_sequence_length", "max_seq_length", "seq_len")


def derived_max_model_len(f: _Fields, model_type: str) -> int | None:
    """``_get_and_verify_max_len`` (vllm/config/model.py): the smallest length key, scaled by
    RoPE scaling except for su/longrope/llama3 (and Gemma 3); YaRN scales its original length.

    Gemma 3's test stays a name test, a generic rule: vLLM's own is ``"gemma3" not in
    hf_config.model_type`` (its max length is already scaled), which also holds for types outside
    the family table (gemma3n, read with --allow-unverified-layout)."""
    lengths = [f.get(k) for k in _MAX_LEN_KEYS]
    lengths = [v for v in lengths if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if not lengths:
        return None
    derived = float(min(lengths))
    rope = f.get("rope_scaling")
    if isinstance(rope, dict) and "gemma3" not in model_type:
        rope_type = str(rope.get("rope_type") or rope.get("type") or "default")
        if rope_type not in ("su", "longrope", "llama3", "default", "mrope"):
            factor = rope.get("factor", 1.0)
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                derived = float(rope["original_max_position_embeddings"])
            if isinstance(factor, (int, float)):
                derived *= factor
    return int(derived)


def _double_wide_from(f: _Fields, family: Family, num_layers: int) -> int | None:
    """The first layer whose dense MLP is twice ``intermediate_size`` (Gemma 4's double-wide MLP), or None."""
    return family.double_wide_mlp_from(f, num_layers) if family.double_wide_mlp_from else None


def _mlp_activation_width(f: _Fields, family: Family, num_layers: int, hidden: int) -> int:
    inter = f.get("intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden) or 0
    if family.dense_mlp_field:
        inter = f.get(family.dense_mlp_field, default=inter)
    if _double_wide_from(f, family, num_layers) is not None:
        inter *= 2
    if not any(_moe_layers(f, family, num_layers)):
        return int(inter)
    top_k = f.get("num_experts_per_tok", "experts_per_token", "moe_topk", default=1) or 1
    expert = f.get("moe_intermediate_size", default=inter)
    shared = (f.get("n_shared_experts", "num_shared_experts", default=0) or 0) * expert
    shared += f.get("shared_expert_intermediate_size", "shared_intermediate_size", default=0) or 0
    dense = inter if f.get("first_k_dense_replace") else 0
    return int(max(dense, top_k * expert + shared))


def parse_architecture(
    config: dict[str, Any], overrides: dict[str, Any] | None = None, allow_unverified: bool = False
) -> Architecture:
    """Read a config.json dict into an :class:`Architecture`, or raise a clear error.

    ``overrides`` patch fields of the language-model config (``--set key=value``). A
    ``model_type`` with no family rules is refused unless ``allow_unverified``.
    """
    try:
        return _parse_architecture(config, overrides, allow_unverified)
    except KvplanError:
        raise
    except RecursionError:
        raise KvplanError("cannot read this config: it is nested too deeply") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        # A config whose fields have shapes no released model uses: say so, never a traceback.
        raise KvplanError(f"cannot read this config: unexpected field contents ({type(exc).__name__}: {exc})",
                          "check the config's fields, or patch them with --set field=value") from None


# Upper bounds far above any released model: larger values are typos or hostile input, and
# would cost unbounded time or memory to plan.
MAX_LAYERS = 10_000
MAX_DIM = 1 << 24


def _parse_architecture(config: dict[str, Any], overrides: dict[str, Any] | None, allow_unverified: bool) -> Architecture:
    if not isinstance(config, dict):
        raise KvplanError("config.json is not a JSON object")
    top = dict(config)
    notes: list[str] = []
    text = _text_defaults(config, text_config(config), notes)
    family_type = str(text.get("model_type") or top.get("model_type") or "")
    family, verified = family_for(family_type, allow_unverified)
    for key, value in family.config_defaults.items():
        text.setdefault(key, value)
    if overrides:
        unknown = sorted(k for k in overrides if k not in text and k not in top and k not in INTEGER_FIELDS)
        if unknown:
            notes.append(f"--set {', '.join(unknown)}: not a field of this config or one kvplan reads; no effect")
        text.update(overrides)
        if text is not config:
            top.update(overrides)
    f = _Fields(text, top)
    model_type = str(text.get("model_type") or top.get("model_type") or "")
    if model_type != family_type:  # --set model_type=...
        family, verified = family_for(model_type, allow_unverified)
    if not verified:
        notes.append(
            f"UNVERIFIED LAYOUT: model_type {model_type or '(none)'!r} has no layout rules in kvplan; read as a "
            "plain decoder from its fields (--layout engine asks the installed vLLM instead)"
        )
    archs = tuple(top.get("architectures") or text.get("architectures") or ())

    hidden = f.need("hidden_size", "n_embd", "d_model", "dim")
    num_layers = f.need("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    num_heads = f.need("num_attention_heads", "n_head", "num_heads", "n_heads")
    if f.missing:
        fields = ", ".join(f.missing)
        raise KvplanError(
            f"cannot read the architecture{f' of model_type {model_type!r}' if model_type else ''}: "
            f"missing {fields}",
            "add them with --set, e.g. " + " ".join(f"--set {m}=N" for m in f.missing),
        )
    for name, value in (("hidden_size", hidden), ("num_hidden_layers", num_layers), ("num_attention_heads", num_heads)):
        if not isinstance(value, int) or value <= 0:
            raise KvplanError(f"invalid {name} in config: {value!r}", f"fix it with --set {name}=N")
    if num_layers > MAX_LAYERS:
        raise KvplanError(f"invalid num_hidden_layers in config: {num_layers:,} (more than {MAX_LAYERS:,})")
    _check_dims(f)

    kinds = family.kinds(f, num_layers)
    kv_heads = total_kv_heads(f, family, num_heads)
    head = head_size(f, family, hidden, num_heads)
    if any(k in ("full", "sliding", "chunked", "attention+mamba", "global") for k in kinds) and (
            kv_heads <= 0 or head <= 0):
        raise KvplanError(f"invalid attention shape in config: {kv_heads} KV heads of size {head}",
                          "fix num_key_value_heads / head_dim with --set")
    dtype = _model_dtype(f)
    conv_bytes = WEIGHT_DTYPE_BYTES.get(dtype, 2)

    ssm_hint = f.get(SSM_HINT_FIELDS[family.ssm_policy]) if family.ssm_policy in SSM_HINT_FIELDS else None
    if ssm_hint is not None:
        ssm_hint = str(ssm_hint)
        _state_dtype_bytes(ssm_hint)  # refuse an unknown dtype now, naming it
    raw_ssm = f.get("mamba_ssm_dtype")  # kept as spelled for SGLang (MambaState.config_mamba_ssm_dtype)
    config_ssm = raw_ssm if isinstance(raw_ssm, str) else None
    # As the newest release resolves it; capacity re-resolves it for the release asked.
    newest = {"nemotron_h": ssm_hint or "float32", "qwen3_5": ssm_hint, "float32": "float32"}.get(family.ssm_policy)
    ssm_bytes = _state_dtype_bytes(newest) if newest else conv_bytes
    raw_window = f.get("sliding_window")
    window = sliding_window_size(f) or (
        raw_window if isinstance(raw_window, int) and not isinstance(raw_window, bool) else 0)

    def state_spec() -> LayerSpec:
        if family.state is None:
            raise KvplanError(f"model_type {model_type!r} lists recurrent layers, but kvplan has no state rule for it",
                              "try --layout engine")
        spec = family.state(f, hidden, num_heads, conv_bytes, ssm_bytes)
        return replace(spec, ssm_policy=family.ssm_policy, ssm_hint=ssm_hint, all_mode_capable=family.mamba_all_mode,
                       config_mamba_ssm_dtype=config_ssm)

    # The family's own shape per attention kind, where its kinds differ in shape (MiMo-V2-Flash).
    shapes = {k: family.attention_shape(f, k) for k in sorted(set(kinds))} if family.attention_shape else {}
    _refuse_missing(f, "attention shapes", model_type)
    specs: list[LayerSpec] = []
    index: list[int] = []
    for i, kind in enumerate(kinds):
        new = _kind_specs(kind, i, f, shapes.get(kind), kv_heads, head, window, state_spec)
        specs.extend(new)
        index.extend([i] * len(new))
    _refuse_missing(f, "layers", model_type)

    # Layers that reuse another layer's KV (Gemma 3n's num_kv_shared_layers) own no cache.
    shared = int(f.get("num_kv_shared_layers", default=0) or 0)
    if shared:
        keep = [j for j, i in enumerate(index) if i < num_layers - shared]
        specs, index = [specs[j] for j in keep], [index[j] for j in keep]
        notes.append(f"{shared} layers share another layer's KV and hold none of their own")
    # MTP draft layers (DeepSeek-V3 / GLM-4.5+ `num_nextn_predict_layers`, Qwen3.5/3.6 and
    # MiMo `mtp_num_hidden_layers`) are separate models in vLLM (`deepseek_mtp.py`,
    # `qwen3_5_mtp.py`, models/@0.32.0): the target's loader skips their tensors
    # (`model.layers.{n}` past num_hidden_layers, `mtp.*`) unless `--speculative-config` asks
    # for them, so their weights are not counted here (--speculative-config adds them).
    mtp = f.get("num_nextn_predict_layers", "mtp_num_hidden_layers")
    if mtp:
        notes.append(f"{mtp} MTP draft layer(s) in the checkpoint are not loaded unless speculative decoding is on")
    if not specs:
        raise KvplanError(f"model_type {model_type!r} has no attention or state layers to size")

    quant, ckpt_kv = _quantization(top, f, family)
    params = _count_params(f, family, kinds, hidden, num_heads, kv_heads, head, shapes)
    towers, tower_note, vision = _tower_params(top, hidden)
    audio, audio_note = _audio_tower_params(top, hidden)
    if towers or audio:
        params = replace(params, towers=towers + audio)
    notes += [n for n in (tower_note, audio_note) if n]
    quant = _layer_schemes(quant, top.get("quantization_config") or f.get("quantization_config"), f, family,
                           kinds, WEIGHT_DTYPE_BYTES.get(dtype, 2))
    if quant.method == "mxfp4":
        quant = replace(quant, expert_shape=_expert_shape(f, family, kinds))
    max_pos = f.get("max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "n_ctx")
    limit = derived_max_model_len(f, model_type)
    return Architecture(
        model_type=model_type or "unknown",
        architectures=archs,
        num_hidden_layers=num_layers,
        hidden_size=hidden,
        vocab_size=int(f.get("vocab_size", "padded_vocab_size", default=0) or 0),
        num_attention_heads=num_heads,
        max_position_embeddings=int(max_pos) if isinstance(max_pos, int) else None,
        max_model_len_limit=limit,
        layers=tuple(specs),
        layer_index=tuple(index),
        params=params,
        mlp_activation_width=_mlp_activation_width(f, family, num_layers, hidden),
        model_dtype=dtype,
        quantization=quant,
        checkpoint_kv_dtype=ckpt_kv,
        notes=tuple(notes),
        layout_source="kvplan rules" if verified else "unverified: read as a plain decoder",
        num_experts=int(f.get("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", default=0)
                        or 0) if params.experts else 0,
        expert_intermediate_size=int(f.get("moe_intermediate_size", "intermediate_size", default=0) or 0)
        if params.experts else 0,
        vision_encoder=vision,
        mtp_layers=int(mtp) if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0 else 0,
    )


_STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "half": 2}


def _state_dtype_bytes(name: str) -> int:
    """Bytes of one element of a recurrent state dtype (vLLM's ``MambaDType``)."""
    if name not in _STATE_DTYPE_BYTES:
        raise KvplanError(f"invalid SSM state dtype {name!r}", "use float32, bfloat16 or float16")
    return _STATE_DTYPE_BYTES[name]


def _has_indexer(f: _Fields, layer: int) -> bool:
    """Whether MLA layer ``layer`` keeps its own sparse-attention indexer cache
    (`models/deepseek_v32/attention.py@0.32.0`): layers that skip the top-k selection reuse
    another layer's, by ``index_topk_pattern`` ("S" skips) or else every
    ``index_topk_freq``-th layer from ``index_skip_topk_offset`` (GLM-5.2: freq 4, offset 3)."""
    pattern = f.get("index_topk_pattern")
    if isinstance(pattern, (str, list)) and 0 <= layer < len(pattern):
        return pattern[layer] != "S"
    freq = f.get("index_topk_freq", default=1) or 1
    offset = f.get("index_skip_topk_offset", default=2)
    if not isinstance(freq, int) or not isinstance(offset, int) or freq <= 0:
        raise KvplanError(f"invalid index_topk_freq / index_skip_topk_offset in config: {freq!r}, {offset!r}")
    return max(layer - offset + 1, 0) % freq == 0


def _refuse_missing(f: _Fields, what: str, model_type: str) -> None:
    """The fields a step read and the config lacks, as one error naming them (and the --set that adds them)."""
    if f.missing:
        missing = list(dict.fromkeys(f.missing))
        raise KvplanError(f"cannot read the {what} of model_type {model_type!r}: missing {', '.join(missing)}",
                          "add them with --set, e.g. " + " ".join(f"--set {m}=N" for m in missing))


def _kind_specs(kind: str, i: int, f: _Fields, shape, kv_heads: int, head: int, window: int,
                state_spec: Callable[[], LayerSpec]) -> list[LayerSpec]:
    """The KV specs layer ``i`` of ``kind`` holds: the family's own shape for the kind where it gives one
    (``shape``), else the config's one attention shape; none for a layer without a cache."""
    if kind == "mla":
        latent = f.need("kv_lora_rank") + (f.get("qk_rope_head_dim", default=0) or 0)
        if latent <= 0:
            raise KvplanError(f"invalid MLA latent size in config: kv_lora_rank + qk_rope_head_dim = {latent}")
        new: list[LayerSpec] = [MLA(latent_size=latent)]
        if f.get("index_head_dim") and _has_indexer(f, i):  # DeepSeek-V3.2 / GLM-5 sparse attention
            new.append(MLAIndexer(latent_size=int(f.get("index_head_dim"))))
        return new
    if kind in ("full", "sliding") and shape is not None:
        if kind == "full":
            return [FullAttention(shape.num_kv_heads, shape.head_size, shape.head_size_v)]
        return [SlidingWindow(shape.num_kv_heads, shape.head_size, shape.head_size_v, window=int(shape.window))]
    if kind == "full":
        return [FullAttention(kv_heads, head)]
    if kind == "global":
        return [FullAttention(*_gemma4_global_shape(f, kv_heads))]
    if kind == "sliding":
        if not window:
            raise KvplanError("a sliding-window layer has no sliding_window size", "add --set sliding_window=N")
        return [SlidingWindow(kv_heads, head, window=int(window))]
    if kind == "chunked":
        return [ChunkedLocal(kv_heads, head, chunk=int(f.get("attention_chunk_size")))]
    if kind == "mamba":
        return [state_spec()]
    if kind == "attention+mamba":
        return [FullAttention(kv_heads, head), state_spec()]
    if kind.startswith("dsv4_"):
        return _dsv4_specs(kind, f)
    return []


def _dsv4_specs(kind: str, f: _Fields) -> list[LayerSpec]:
    """One DeepSeek-V4 layer's caches, in the order it registers them (models/deepseek_v4/attention.py@0.32.0:
    the indexer's keys and its compressor, the window, the compressed cache, its compressor). The packed
    584-byte state is 448 fp8 NoPE bytes, 64 bf16 RoPE values and 8 scale bytes: read for head_dim 512 with a
    64-wide RoPE only, the shape vLLM's kernels take. A compressor keeps ``2 x coff x dim`` float32 values a token
    over ``coff x ratio`` tokens, coff 2 for ratio 4 (compressor.py@0.32.0); the indexer's keys are
    ``index_head_dim`` fp8 values plus a 4-byte scale per 128."""
    head, rope, window = f.need("head_dim"), f.need("qk_rope_head_dim"), f.need("sliding_window")
    if f.missing:
        raise KvplanError(f"cannot read the DeepSeek-V4 cache shapes: missing {', '.join(f.missing)}")
    if (head, rope) != (512, 64):
        raise KvplanError(f"DeepSeek-V4 with head_dim {head} and qk_rope_head_dim {rope}: kvplan reads vLLM's packed "
                          "584-byte state for 512 and 64 only (the shape its kernels take)")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise KvplanError(f"invalid sliding_window in config: {window!r}")
    specs: list[LayerSpec] = []
    if kind == "dsv4_c4":
        index = f.need("index_head_dim")
        if f.missing:
            raise KvplanError("cannot read the DeepSeek-V4 indexer: missing index_head_dim")
        keys = index + index // 128 * 4
        specs += [CompressedIndexer(tokens_per_state=4, head_size=keys, state_bytes=keys), _compressor(4, index)]
    specs.append(SlidingMLA(window=window))
    if kind == "dsv4_c4":
        specs += [CompressedMLA(tokens_per_state=4), _compressor(4, head)]
    elif kind == "dsv4_c128":
        specs += [CompressedMLA(tokens_per_state=128), _compressor(128, head)]
    return specs


def _compressor(ratio: int, dim: int) -> CompressorState:
    """`CompressorStateCache` (compressor.py@0.32.0): coff = 2 for ratio 4, else 1; float32 rows."""
    coff = 2 if ratio == 4 else 1
    state = 2 * coff * dim
    return CompressorState(window=coff * ratio, own_block_size=4 if ratio == 4 else 8, head_size=state,
                           token_bytes=state * 4)


def _gemma4_global_shape(f: _Fields, kv_heads: int) -> tuple[int, int]:
    """Gemma 4's full-attention layers (`Gemma4TextConfig.__post_init__`): head size
    ``global_head_dim`` (default 512) and, when ``attention_k_eq_v``, the
    ``num_global_key_value_heads`` KV heads."""
    head = f.get("global_head_dim", default=512)
    heads = kv_heads
    if f.get("attention_k_eq_v", default=False) and f.get("num_global_key_value_heads") is not None:
        heads = f.get("num_global_key_value_heads")
    if head <= 0 or heads <= 0:
        raise KvplanError(f"invalid Gemma 4 global attention shape: {heads} KV heads of size {head}")
    return heads, head


def _check_dims(f: _Fields) -> None:
    """Every whole-number size the config gives must be positive and plausible: a zero or
    negative head count, window or rank is a broken config, never planned as real."""
    window = f.get("sliding_window")  # null or 0: no window (HF configs write both); negative: broken
    if isinstance(window, (int, float)) and not isinstance(window, bool) and window < 0:
        raise KvplanError(f"invalid sliding_window in config: {window:,} (negative)", "fix it with --set sliding_window=N")
    no_experts = not f.get("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
    for name in sorted(INTEGER_FIELDS):
        value = f.get(name)
        if value is None:
            continue
        if isinstance(value, list):  # per-layer flags (INTEGER_OR_PER_LAYER_FIELDS)
            if any(v < 0 for v in value):
                raise KvplanError(f"invalid {name} in config: a negative entry", f"fix it with --set {name}=N")
            continue
        if name in _MAY_BE_ZERO:
            if value < 0:
                raise KvplanError(f"invalid {name} in config: {value:,} (negative)", f"fix it with --set {name}=N")
            continue
        if value == 0 and name in _EXPERT_FIELDS and no_experts:
            continue  # a dense model of an MoE family says so with zeros (granite-4.0-h-350m)
        if value <= 0 or value > (MAX_DIM if name not in _LENGTH_FIELDS else 1 << 40):
            raise KvplanError(f"invalid {name} in config: {value:,}", f"fix it with --set {name}=N")


# Fields where 0 is meaningful (an offset, "none of them", "no dense layers first").
_MAY_BE_ZERO = frozenset([
    "attn_layer_offset", "expert_layer_offset", "first_k_dense_replace", "num_kv_shared_layers",
    "n_shared_experts", "num_shared_experts", "num_nextn_predict_layers", "max_window_layers",
    "shared_expert_intermediate_size", "shared_intermediate_size", "q_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step",
    "hidden_size_per_layer_input", "index_skip_topk_offset", "mtp_num_hidden_layers",
])
# Expert counts and top-k: 0 when a family's dense model has no routed experts.
_EXPERT_FIELDS = frozenset(["n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts",
                            "num_experts_per_tok", "experts_per_token", "moe_topk"])
_LENGTH_FIELDS = frozenset(["max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "n_ctx",
                            "vocab_size", "padded_vocab_size", "attention_chunk_size"])


def _checked_quant(bits: Any, group_size: Any) -> tuple[int, int]:
    """A quantization_config's bits and group size, as whole numbers a checkpoint can have: 1-16
    bits; a positive group, or 0 / -1 for per-channel scales (GPTQ and AWQ write -1)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
        raise KvplanError(f"invalid quantization_config bits: {bits!r} (expected 1 to 16)",
                          "fix the checkpoint's quantization_config, or give --weights-memory")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < -1 or group_size > MAX_DIM:
        raise KvplanError(f"invalid quantization_config group_size: {group_size!r} (expected -1, 0 or a positive size)",
                          "fix the checkpoint's quantization_config, or give --weights-memory")
    return bits, group_size


def _group_bytes(bits: int, group_size: int, kind: str, symmetric: bool = False) -> float:
    """Bytes a parameter of one quantization group: NVFP4 (4-bit float, group 16: packed values
    + one fp8 scale per 16), fp8 (8-bit float; per-channel or per-tensor scales are negligible),
    or group-quantized integers (a symmetric group keeps no zero point)."""
    bits, group_size = _checked_quant(bits, group_size)
    if kind == "float" and bits == 4:
        return NVFP4_BYTES
    if bits == 8:
        return 1.0
    return int_group_bytes(bits, group_size, zero_points=not symmetric)


def _weights_group_bytes(weights: dict[str, Any], default_kind: str) -> float:
    """``_group_bytes`` of one ``config_groups[*].weights`` entry (compressed-tensors / ModelOpt)."""
    return _group_bytes(weights.get("num_bits", 8), weights.get("group_size") or 0,
                        str(weights.get("type", default_kind)), symmetric=weights.get("symmetric") is True)


def _expert_shape(f: _Fields, family: Family, kinds: list[str]) -> ExpertShape:
    """The MXFP4 experts' shapes, which vLLM pads per kernel (weights.mxfp4_expert_bytes), with
    biases where the family's experts carry them (gpt-oss: ``Family.expert_bias``)."""
    num_experts = f.get("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", default=0) or 0
    inter = f.get("moe_intermediate_size", "intermediate_size", default=0) or 0
    moe_layers = sum(_moe_layers(f, family, len(kinds)))
    hidden = f.get("hidden_size", default=0) or 0
    return ExpertShape(moe_layers, int(num_experts), int(hidden), int(inter), bias=family.expert_bias)


_LAYER_NUMBER = re.compile(r"layers\.(\d+)\.")


def _module_role(name: str) -> str | None:
    """Which kvplan role a checkpoint module name (or wildcard) belongs to."""
    n = name.lower()
    if n.startswith("mtp") or ".mtp" in n:
        return None  # draft layers: not loaded
    if "lm_head" in n:
        return "lm_head"
    if any(k in n for k in ("vision", "visual", "audio", "embed_vision", "embed_audio", "multi_modal_projector")):
        return "towers"
    if "linear_attn" in n or "mamba" in n or "mixer" in n:
        return "recurrent"
    if "self_attn" in n or ".attn." in n or n.endswith(".attn") or ".attention." in n:
        return "attention"
    # DeepSeek's ``mlp.shared_experts``, Qwen's ``mlp.shared_expert``: a checkpoint can keep them in the model dtype
    # while quantizing the routed ones (moonshotai/Kimi-K2.5 ignores ``re:.*shared_experts.*``).
    if "shared_expert" in n:
        return "shared_experts"
    if "expert" in n:
        return "experts"
    # ``.mlp`` in a module name; ``*mlp\.`` or ``/mlp`` in an ignore list's regex (``re:.*mlp\.(gate|up|down)_proj.*``
    # names the dense MLPs only: the experts' prefixes are ``mlp.experts.N.gate_proj``).
    if _ROUTER.search(n):
        return None  # the MoE router (``mlp.gate``, ``re:.*mlp.gate$``): a few weights, not the dense MLPs
    if re.search(r"(^|[.*:/])mlp", n) or "feed_forward" in n:
        return "mlp"
    return None


#: An MoE layer's router as module names and ignore regexes spell it: ``mlp.gate`` not followed by ``_proj`` / ``_up``.
_ROUTER = re.compile(r"mlp\\?\.gate(?![_a-z])")


def _layer_schemes(quant: Quantization, qc: Any, f: _Fields, family: Family, kinds: list[str],
                   dtype_bytes: int) -> Quantization:
    """Which layers a ModelOpt / compressed-tensors checkpoint quantizes, by role.

    vLLM quantizes a linear layer unless its prefix matches the checkpoint's ``ignore``
    (compressed-tensors) or ``exclude_modules`` (ModelOpt) list (`is_layer_excluded`,
    quantization/modelopt.py@0.32.0; `should_ignore_layer`, compressed_tensors/utils.py), and a
    ModelOpt MIXED_PRECISION checkpoint names each module's group in ``config_groups[*].targets``
    (nvidia/Qwen3.6-27B-NVFP4: fp8 attention and linear attention, nvfp4 MLPs and lm_head).
    Layers a list leaves out stay in the model dtype; a role's price is the mean over its layers
    (a layer's projections are quantized together)."""
    if not isinstance(qc, dict) or quant.method not in ("compressed-tensors", "modelopt", "modelopt_fp4"):
        return quant
    n = len(kinds)
    moe = _moe_layers(f, family, n)
    layers_of = {
        "attention": [i for i, k in enumerate(kinds) if k in ("full", "sliding", "chunked", "mla", "global",
                                                             "attention+mamba")],
        "recurrent": [i for i, k in enumerate(kinds) if "mamba" in k],
        "experts": [i for i in range(n) if moe[i]],
        "shared_experts": [i for i in range(n) if moe[i]],
        "mlp": [i for i in range(n) if not moe[i]],
    }
    # (role, layer or None for every layer) -> bytes a parameter
    assigned: dict[tuple[str, int | None], float] = {}
    default = quant.bytes_per_param
    explicit = False
    lm_head: float | None = None
    for group in (qc.get("config_groups") or {}).values():
        size = _weights_group_bytes((group or {}).get("weights") or {}, "float")
        for target in (group or {}).get("targets") or []:
            role = _module_role(str(target))
            if role == "lm_head":
                lm_head = size
            elif role is not None:
                explicit = True
                m = _LAYER_NUMBER.search(str(target))
                assigned[(role, int(m.group(1)) if m else None)] = size
    for pattern in list(qc.get("ignore") or []) + list(qc.get("exclude_modules") or []):
        role = _module_role(str(pattern))
        if role == "lm_head":
            lm_head = None
        elif role is not None and role != "towers":
            m = _LAYER_NUMBER.search(str(pattern))
            assigned[(role, int(m.group(1)) if m else None)] = float(dtype_bytes)
    if not assigned and lm_head is None:
        return quant
    role_bytes: list[tuple[str, float]] = []
    for role, layers in layers_of.items():
        if not layers:
            continue
        # A MIXED_PRECISION list quantizes only what it names; an ignore list all but what it names.
        fallback = float(dtype_bytes) if explicit else default
        prices = [assigned.get((role, i), assigned.get((role, None), fallback)) for i in layers]
        role_bytes.append((role, sum(prices) / len(prices)))
    return replace(quant, role_bytes=tuple(role_bytes), quantized_share=tuple((r, 1.0) for r, _ in role_bytes),
                   quantize_lm_head=lm_head is not None and lm_head < dtype_bytes,
                   bytes_per_param=lm_head if lm_head is not None else quant.bytes_per_param)


def _audio_tower_params(top: dict[str, Any], text_hidden: int) -> tuple[int, str]:
    """Parameters of an audio tower vLLM builds beside the language model (0 and a note if unknown).

    Gemma 4's is transformers' Gemma4AudioModel, which vLLM builds with AutoModel.from_config
    whenever the config has an ``audio_config`` (models/gemma4_mm.py@0.32.0), counted from its
    modules (models/gemma4/modeling_gemma4.py, transformers 5.x): two 3x3 subsampling convs with
    norms, a bias-free input projection from ``(c0 // 4) x c1``; per conformer layer two
    feed-forwards (h -> 4h -> h, two norms each), attention (q, k, v, post and relative_k
    projections, a per-dim scale of h / heads), a light conv (h -> 2h, h -> h, a depthwise
    kernel, two norms) and three norms; a biased output projection to ``output_proj_dims``; then
    embed_audio's bias-free projection to the text width (Gemma4MultimodalEmbedder)."""
    ac = top.get("audio_config")
    if not isinstance(ac, dict):
        return 0, ""
    if ac.get("model_type") != "gemma4_audio":
        return 0, f"audio tower ({ac.get('model_type') or 'unknown type'}) not counted in the weights"
    h, depth = ac.get("hidden_size"), ac.get("num_hidden_layers")
    heads, kernel = ac.get("num_attention_heads") or 1, ac.get("conv_kernel_size") or 5
    channels = ac.get("subsampling_conv_channels")
    c0, c1 = (list(channels) + [0, 0])[:2] if isinstance(channels, list) else (0, 0)
    out = ac.get("output_proj_dims") or text_hidden
    if not all_positive_ints(h, depth, heads, kernel, c0, c1, out):
        return 0, "audio tower not counted in the weights: its audio_config lacks sizes"
    subsample = c0 * 9 + c0 + c1 * c0 * 9 + c1 + (c0 // 4) * c1 * h
    layer = 2 * (8 * h * h + 2 * h) + (5 * h * h + h // heads) + (3 * h * h + kernel * h + 2 * h) + 3 * h
    total = subsample + depth * layer + out * h + out + out * text_hidden
    return int(total), f"audio tower ({total / 1e9:.2f}B parameters) loaded unless --language-model-only"


def _tower_note(total: int, estimated: bool = False) -> str:
    size = f"~{total / 1e9:.2f}B parameters, estimated" if estimated else f"{total / 1e9:.2f}B parameters"
    return f"vision tower ({size}) loaded unless --language-model-only"


def _qwen2_vl_tower_params(vc: dict[str, Any], model_type: str, text_hidden: int) -> tuple[int, str]:
    """Qwen2-VL's and Qwen2.5-VL's vision towers (`Qwen2VisionTransformer`, models/qwen2_vl.py@0.32.0;
    `Qwen2_5_VisionTransformer`, models/qwen2_5_vl.py@0.32.0): a bias-free Conv3d patch embedding
    (in x temporal x patch^2 x h), ``depth`` ViT blocks, no position table, then a patch merger.
    Qwen2-VL: width ``embed_dim``, LayerNorms (weight and bias), fc1/fc2 of ``mlp_ratio x embed_dim``,
    output ``hidden_size``. Qwen2.5-VL: width ``hidden_size``, RMSNorms (weight only), a gated
    gate/up/down MLP of ``intermediate_size``, output ``out_hidden_size``."""
    qwen25 = model_type == "qwen2_5_vl"
    h = vc.get("hidden_size") if qwen25 else vc.get("embed_dim")
    depth = vc.get("depth") or 0
    inter = vc.get("intermediate_size") if qwen25 else (vc.get("mlp_ratio") or 4) * (h or 0)
    out = (vc.get("out_hidden_size") if qwen25 else vc.get("hidden_size")) or text_hidden
    channels = vc.get("in_channels") or vc.get("in_chans") or 3
    patch, temporal, merge = vc.get("patch_size") or 14, vc.get("temporal_patch_size") or 2, vc.get("spatial_merge_size") or 2
    if not all_positive_ints(h, depth, inter, out, channels, patch, temporal, merge):
        return 0, f"vision tower of {model_type} not counted in the weights: its vision_config lacks sizes"
    norm = h if qwen25 else 2 * h
    total = (channels * temporal * patch * patch * h + depth * vit_block(h, inter, norm, gated=qwen25)
             + patch_merger(h, merge, out, norm))
    return int(total), _tower_note(total)


def _tower_params(top: dict[str, Any], text_hidden: int) -> tuple[int, str, Qwen3VisionTower | None]:
    """Parameters of the multimodal towers vLLM builds beside the language model.

    vLLM builds them inside `_mark_tower_model` and skips them only when every modality's
    limit is 0 (`--limit-mm-per-prompt` zeros, or `--language-model-only`, which makes
    `MultiModalConfig.get_limit_per_prompt` return 0): models/interfaces.py@0.32.0. Qwen3.5 /
    Qwen3.6 / Qwen3-VL towers count themselves (:class:`~kvplan.model.encoders.Qwen3VisionTower`) and
    are returned too, as they also size their pass in the profile run. Other
    towers (SigLIP-style: Gemma 3/4, Pixtral) are estimated as ``layers`` ViT blocks (4 h^2
    attention, 2 h x intermediate MLP, biases and norms), a patch embedding and a projector to
    the text width."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict):
        return 0, "", None
    if top.get("model_type") in ("qwen2_vl", "qwen2_5_vl"):
        return *_qwen2_vl_tower_params(vc, str(top.get("model_type")), text_hidden), None
    if is_qwen3_vision(vc):
        tower = qwen3_vision_tower(vc, text_hidden)
        if tower is None:
            return 0, "vision tower not counted in the weights: its vision_config lacks sizes", None
        return tower.params(), _tower_note(tower.params()), tower
    # MoonViT (Kimi-VL / Kimi-K2.5) names its sizes vt_*.
    h = vc.get("hidden_size") or vc.get("vt_hidden_size") or 0
    depth = vc.get("depth") or vc.get("num_hidden_layers") or vc.get("vt_num_hidden_layers") or 0
    inter = vc.get("intermediate_size") or vc.get("vt_intermediate_size") or 4 * h
    if not all_positive_ints(h, depth, inter):
        return 0, "vision tower not counted in the weights: its vision_config lacks sizes", None
    patch = vc.get("patch_size") or 14
    channels = vc.get("in_channels") or vc.get("num_channels") or 3
    block = vit_block(h, inter, norm=2 * h)  # LayerNorms with biases
    vtype = str(vc.get("model_type") or "")
    if vtype == "gemma4_vision":
        # transformers' Gemma4VisionModel (vLLM builds it with AutoModel.from_config:
        # models/gemma4_mm.py@0.32.0), counted from its modules: a 2 x position_embedding_size x h
        # position table, a bias-free patch projection, ``depth`` blocks of bias-free q/k/v/o with
        # q/k norms, a gated (gate/up/down) MLP and four norms; then embed_vision's bias-free
        # projection to the text width (Gemma4MultimodalEmbedder, gemma4_mm.py@0.32.0).
        heads = vc.get("num_attention_heads") or 1
        kv_heads = vc.get("num_key_value_heads") or heads
        head_dim = vc.get("head_dim") or h // heads
        attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 2 * head_dim
        block = attention + 3 * h * inter + 4 * h
        position = 2 * (vc.get("position_embedding_size") or 0) * h
        projector = (vc.get("output_proj_dims") or h) * text_hidden
        total = position + channels * patch * patch * h + depth * block + projector
        return int(total), _tower_note(total), None
    total = channels * patch * patch * h + h + depth * block + 2 * h + h * text_hidden
    return int(total), _tower_note(total, estimated=True), None
