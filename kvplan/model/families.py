"""One table from ``model_type`` to the rules vLLM's model file follows for its KV cache.

As vLLM's model registry maps an architecture to its implementation, :data:`FAMILIES` maps
a config's ``model_type`` to a :class:`Family`: which decoder layers hold which kind of
cache (:func:`Family.kinds`), how a recurrent layer's state is shaped (``state``), how the
SSM state dtype resolves, and any per-layer attention shape of its own; and where the family
departs from the generic readers of :mod:`kvplan.model.arch` (KV heads, head size, which
layers are MoE, the MLP's sizes), small named fields whose functions sit in the "family
quirks" section below. Adding a family is one entry here (and a twin test in tests/twins/);
a ``model_type`` absent from the table is refused, never guessed (``kvplan size
--allow-unverified-layout`` reads it as a plain decoder and says so).

Sources: vLLM 0.32.0 unless noted, `vllm/model_executor/models/<file>.py` of each family,
`vllm/model_executor/models/config.py` for the config hooks, and
`vllm/model_executor/layers/mamba/mamba_utils.py` for state shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvplan.errors import KvplanError
from kvplan.model.layers import MambaState

# Per decoder layer, one of:
#   full | sliding | chunked | mla | mamba | attention+mamba | global (Gemma 4 full layers) | none
LayerKind = str


class Fields(Protocol):  # kvplan.model.arch._Fields
    def get(self, *names: str, default: Any = None) -> Any: ...
    def need(self, *names: str) -> Any: ...


# --- layer-kind rules -----------------------------------------------------------------

_LAYER_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "mamba",
    "mamba": "mamba",
    "mamba2": "mamba",
    "conv": "mamba",
    "hybrid": "attention+mamba",  # zamba2: Mamba-2 plus a shared attention block
    # Nemotron-H's layers_block_type (transformers' NemotronHConfig, which also accepts the legacy
    # "mamba" / "attention"): "moe" and "mlp" blocks are feed-forward only and hold no cache
    # (`NemotronHMoEDecoderLayer` / `NemotronHMLPDecoderLayer`, models/nemotron_h.py@0.32.0).
    "moe": "none",
    "mlp": "none",
}


def _explicit_layer_types(f: Fields, n: int) -> list[LayerKind] | None:
    """``layer_types`` (or ``layers_block_type``) when the config lists every layer."""
    layer_types = f.get("layer_types") or f.get("layers_block_type")
    if not (isinstance(layer_types, list) and layer_types):
        return None
    if len(layer_types) != n:
        raise KvplanError(f"layer_types has {len(layer_types)} entries for {n} layers")
    kinds = [_LAYER_TYPE_NAMES.get(str(t).lower()) for t in layer_types]
    if None in kinds:
        unknown = sorted({str(t) for t, k in zip(layer_types, kinds) if k is None})
        raise KvplanError(f"unknown layer type(s) {', '.join(unknown)} in layer_types",
                          "kvplan has no rules for this layer kind; try --layout engine")
    return kinds  # type: ignore[return-value]


def sliding_window_size(f: Fields) -> int | None:
    """``get_hf_config_sliding_window``: Qwen2's ``use_sliding_window: false`` turns it off."""
    if f.get("use_sliding_window") is False:
        return None
    window = f.get("sliding_window")
    return int(window) if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def decoder_kinds(f: Fields, n: int) -> list[LayerKind]:
    """A plain decoder: explicit ``layer_types``, else Llama 4's chunked RoPE layers, else one
    sliding window (Mistral v0.1, Qwen2's ``max_window_layers``), else full attention."""
    explicit = _explicit_layer_types(f, n)
    if explicit is not None:
        return explicit
    if f.get("attention_chunk_size"):
        # Llama 4: RoPE layers (no_rope_layers[i] == 1) use chunked local attention; the
        # default (transformers' Llama4TextConfig) makes every 4th layer a global NoPE layer.
        no_rope = f.get("no_rope_layers")
        if not no_rope:
            interval = f.get("no_rope_layer_interval", default=4)
            no_rope = [int((i + 1) % interval != 0) for i in range(n)]
        if len(no_rope) != n:
            raise KvplanError(f"no_rope_layers has {len(no_rope)} entries for {n} layers")
        return ["chunked" if no_rope[i] else "full" for i in range(n)]
    if sliding_window_size(f) is not None:
        max_window_layers = f.get("max_window_layers")
        if f.get("use_sliding_window") and max_window_layers is not None:
            return ["sliding" if i >= max_window_layers else "full" for i in range(n)]
        return ["sliding"] * n
    return ["full"] * n


def mla_kinds(f: Fields, n: int) -> list[LayerKind]:
    """``ModelConfig.is_deepseek_mla``: MLA on every layer when ``kv_lora_rank`` is set."""
    return ["mla"] * n if f.get("kv_lora_rank") is not None else decoder_kinds(f, n)


DSV4_KINDS = {1: "dsv4_window", 4: "dsv4_c4", 128: "dsv4_c128"}


def deepseek_v4_kinds(f: Fields, n: int) -> list[LayerKind]:
    """DeepSeek-V4 (`DeepseekV4Attention.__init__`, models/deepseek_v4/attention.py@0.32.0): layer i compresses its
    cache by ``max(1, compress_ratios[i])`` (the list's last entry stands for the MTP layer): 4 (a compressed cache,
    the sparse indexer's keys and both compressors' states), 128 (a compressed cache and its compressor's state),
    1 (no compressed cache); every layer also keeps a sliding window (kvplan.model.layers, DeepSeek-V4)."""
    ratios = f.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) < n:
        raise KvplanError("a DeepSeek-V4 config needs compress_ratios, one per layer (vLLM reads them)",
                          "use the checkpoint's own config.json")
    kinds = []
    for i, ratio in enumerate(ratios[:n]):
        if isinstance(ratio, bool) or not isinstance(ratio, int) or max(1, ratio) not in DSV4_KINDS:
            raise KvplanError(f"invalid compress_ratios[{i}] in config: {ratio!r}",
                              "vLLM builds ratios 4 and 128 (0: no compression); CompressorStateCache asserts it")
        kinds.append(DSV4_KINDS[max(1, ratio)])
    return kinds


def every_other_sliding(f: Fields, n: int) -> list[LayerKind]:
    """Gemma 2: explicit ``layer_types``, else even layer indices slide (transformers' default)."""
    return _explicit_layer_types(f, n) or ["sliding" if i % 2 == 0 else "full" for i in range(n)]


def gpt_oss_kinds(f: Fields, n: int) -> list[LayerKind]:
    """gpt-oss: even layer indices slide, whatever ``layer_types`` says (`gpt_oss.py` ignores it)."""
    return ["sliding" if i % 2 == 0 else "full" for i in range(n)]


def _int_pattern(pattern: Any) -> int:
    """An integer ``sliding_window_pattern``: every pattern-th layer is global."""
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
        raise KvplanError(f"invalid sliding_window_pattern in config: {pattern!r}",
                          "fix it with --set sliding_window_pattern=N")
    return pattern


def pattern_sliding(default_pattern: int) -> Callable[[Fields, int], list[LayerKind]]:
    """Gemma 3 / Cohere 2: every ``sliding_window_pattern``-th layer is global."""

    def kinds(f: Fields, n: int) -> list[LayerKind]:
        explicit = _explicit_layer_types(f, n)
        if explicit is not None:
            return explicit
        pattern = _int_pattern(f.get("sliding_window_pattern", default=default_pattern))
        return ["sliding" if (i + 1) % pattern else "full" for i in range(n)]

    return kinds


def exaone4_kinds(f: Fields, n: int) -> list[LayerKind]:
    """EXAONE 4.0: layer i slides when ``config.layer_types[i] == "sliding_attention"``, with
    ``config.sliding_window`` (`Exaone4Attention.__init__`, models/exaone4.py@0.32.0); a null window
    leaves every layer full (the sliding layers get ``sliding_window=None``, and vLLM sets the
    cache-wide window only for all-sliding models, engine/arg_utils.py@0.32.0).

    Without ``layer_types``, transformers' Exaone4Config derives them from ``sliding_window_pattern``:
    an integer k makes every k-th layer global (``(i + 1) % k``, as its ``__post_init__``); a string
    of "L" (local, sliding) and "G" (global) repeats from layer 0, the last layer always global (the
    class's documented meaning: transformers 5.19's ``__post_init__`` itself raises a TypeError on a
    string without ``layer_types``, so vLLM loads such a string only beside ``layer_types``, as the
    EXAONE 4.0-32B config's "LLLG" is written)."""
    if sliding_window_size(f) is None:
        return ["full"] * n
    explicit = _explicit_layer_types(f, n)
    if explicit is not None:
        return explicit
    pattern = f.get("sliding_window_pattern", default=4)  # Exaone4Config's default
    if isinstance(pattern, str):
        code = pattern.upper()
        if not code or set(code) - {"L", "G"}:
            raise KvplanError(f"invalid sliding_window_pattern in config: {pattern!r} (expected L and G letters)",
                              "fix it with --set sliding_window_pattern=LLLG")
        kinds = ["sliding" if code[i % len(code)] == "L" else "full" for i in range(n)]
        kinds[-1] = "full"
        return kinds
    pattern = _int_pattern(pattern)
    return ["sliding" if (i + 1) % pattern else "full" for i in range(n)]


def olmo3_kinds(f: Fields, n: int) -> list[LayerKind]:
    """OLMo 3 runs on vLLM's Transformers backend (registry.py@0.32.0: ``Olmo3ForCausalLM`` ->
    ``TransformersForCausalLM``), which gives layer i ``per_layer_sliding_window =
    text_config.sliding_window`` when ``layer_types[i] == "sliding_attention"``
    (`_create_attention_instances`, models/transformers/base.py@0.32.0); transformers'
    Olmo3Config defaults ``layer_types`` to three sliding layers then one full, and
    ``sliding_window`` to 4096 (config_defaults). A null window leaves every layer full."""
    if sliding_window_size(f) is None:
        return ["full"] * n
    return _explicit_layer_types(f, n) or ["sliding" if (i + 1) % 4 else "full" for i in range(n)]


def laguna_kinds(f: Fields, n: int) -> list[LayerKind]:
    """Laguna (models/laguna.py@0.32.0): a layer slides (``config.sliding_window``) only where
    ``layer_types`` says ``sliding_attention``; without ``layer_types`` every layer is global
    (transformers' LagunaConfig default), and ``LagunaModel.__init__`` clears
    ``cache_config.sliding_window`` so the model-level window never reaches a global layer."""
    return _explicit_layer_types(f, n) or ["full"] * n


def mimo_v2_kinds(f: Fields, n: int) -> list[LayerKind]:
    """MiMo-V2-Flash (models/mimo_v2.py@0.32.0): ``hybrid_layer_pattern[i] == 1`` marks a sliding-window
    layer (``is_compressed_softmax_layer``), 0 a global one; vLLM reads nothing else for it."""
    pattern = f.get("hybrid_layer_pattern")
    if not isinstance(pattern, list):
        raise KvplanError("this MiMo-V2-Flash config has no hybrid_layer_pattern, which vLLM's mimo_v2.py reads "
                          "to place its sliding-window layers", "use the checkpoint's own config.json")
    if len(pattern) != n:
        raise KvplanError(f"hybrid_layer_pattern has {len(pattern)} entries for {n} layers")
    return ["sliding" if p == 1 else "full" for p in pattern]


@dataclass(frozen=True)
class AttentionShape:
    """One attention kind's shape where a family gives its kinds different ones (MiMo-V2-Flash)."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int | None = None  # V's head size where it differs from K's
    window: int | None = None  # sliding-window layers


def mimo_v2_shape(f: Fields, kind: LayerKind) -> AttentionShape | None:
    """``MiMoV2FlashDecoderLayer.__init__`` (models/mimo_v2.py@0.32.0): sliding layers take the ``swa_*``
    heads and head sizes and ``sliding_window_size``; global layers the plain fields; V's head size is
    ``[swa_]v_head_dim`` when given, else K's."""
    if kind == "sliding":
        return AttentionShape(f.need("swa_num_attention_heads"), f.need("swa_num_key_value_heads"),
                              f.need("swa_head_dim"), f.get("swa_v_head_dim"), f.need("sliding_window_size"))
    if kind == "full":
        return AttentionShape(f.need("num_attention_heads"), f.need("num_key_value_heads"), f.need("head_dim"),
                              f.get("v_head_dim"))
    return None


def gemma4_kinds(f: Fields, n: int) -> list[LayerKind]:
    """transformers' Gemma4TextConfig: ``layer_types`` (default 5 sliding : 1 full), the last
    layer forced to full attention; full layers use the global head shape."""
    kinds = _explicit_layer_types(f, n) or ["sliding" if (i + 1) % 6 else "full" for i in range(n)]
    kinds[-1] = "full"
    if any(k not in ("full", "sliding") for k in kinds):
        raise KvplanError("Gemma 4 layer_types must be sliding_attention or full_attention")
    return ["global" if k == "full" else k for k in kinds]


def nemotron_h_kinds(f: Fields, n: int) -> list[LayerKind]:
    """``hybrid_override_pattern``: 'M' Mamba-2, '*' attention; '-' MLP and 'E' MoE hold no cache.
    Newer configs (Nemotron 3.5) list ``layers_block_type`` instead (transformers' NemotronHConfig
    turns it into the pattern vLLM reads: mamba / linear_attention 'M', attention / full_attention
    '*', moe 'E', mlp '-')."""
    pattern = f.get("hybrid_override_pattern")
    if pattern is None:
        explicit = _explicit_layer_types(f, n)
        if explicit is not None:
            return explicit
        f.need("hybrid_override_pattern")
        return []
    if not isinstance(pattern, str) or len(pattern) != n:
        raise KvplanError(f"hybrid_override_pattern must be a string of {n} layer codes")
    return [{"M": "mamba", "*": "full"}.get(c, "none") for c in pattern]


def jamba_kinds(f: Fields, n: int) -> list[LayerKind]:
    explicit = _explicit_layer_types(f, n)
    if explicit is not None:
        return explicit
    period, offset = f.need("attn_layer_period"), f.get("attn_layer_offset", default=0)
    return ["full" if period and i % period == offset else "mamba" for i in range(n)]


def interval_kinds(f: Fields, n: int) -> list[LayerKind]:
    """Qwen3-Next / Qwen3.5: ``layer_types``, else every ``full_attention_interval``-th layer
    is full attention and the rest gated delta net."""
    explicit = _explicit_layer_types(f, n)
    if explicit is not None:
        return explicit
    interval = f.get("full_attention_interval", default=4)
    if interval <= 0:
        raise KvplanError(f"invalid full_attention_interval in config: {interval}")
    return ["full" if (i + 1) % interval == 0 else "mamba" for i in range(n)]


def minimax_kinds(f: Fields, n: int) -> list[LayerKind]:
    """MiniMax-Text-01: ``attn_type_list`` 1 = softmax attention, 0 = lightning (linear)."""
    types = f.get("attn_type_list")
    if not isinstance(types, list) or len(types) != n:
        return decoder_kinds(f, n)
    return ["full" if t == 1 else "mamba" for t in types]


def falcon_h1_kinds(f: Fields, n: int) -> list[LayerKind]:
    return ["attention+mamba"] * n  # attention and Mamba-2 in parallel in every layer


def kimi_linear_kinds(f: Fields, n: int) -> list[LayerKind]:
    """`KimiLinearConfig.is_kda_layer`: layer i is KDA when i + 1 is in
    ``linear_attn_config.kda_layers``; the others are MLA."""
    cfg = f.get("linear_attn_config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("kda_layers"), list):
        raise KvplanError("kimi_linear config has no linear_attn_config.kda_layers")
    kda = set(cfg["kda_layers"])
    return ["mamba" if i + 1 in kda else "mla" for i in range(n)]


# --- recurrent state rules ---------------------------------------------------------------


def mamba1_state(f: Fields, hidden: int, num_heads: int, conv: int, ssm: int) -> MambaState:
    """Jamba / Mamba-1: ``mamba1_state_shape(d_inner = expand x hidden, d_state, d_conv)``."""
    dims = {
        "d_inner": f.get("mamba_expand", "expand", default=2) * hidden,
        "d_state": f.need("mamba_d_state", "state_size"),
        "d_conv": f.get("mamba_d_conv", "conv_kernel", default=4),
    }
    return MambaState("mamba1", tuple(dims.items()), conv, ssm)


def mamba2_state(f: Fields, hidden: int, num_heads: int, conv: int, ssm: int) -> MambaState:
    """Nemotron-H, Granite 4 hybrids, Falcon-H1, Zamba2, Bamba: ``mamba2_state_shape``."""
    n_heads = f.need("mamba_num_heads", "mamba_n_heads", "n_mamba_heads")
    head_dim = f.need("mamba_head_dim", "mamba_d_head")
    intermediate = f.get("mamba_d_ssm") or (n_heads * head_dim if n_heads and head_dim else 0)
    if not f.get("mamba_d_ssm") and f.get("mamba_expand") and not (n_heads and head_dim):
        intermediate = f.get("mamba_expand") * hidden
    dims = {
        "n_heads": n_heads,
        "head_dim": head_dim,
        "intermediate": intermediate,
        "n_groups": f.get("n_groups", "mamba_n_groups", "mamba_ngroups", default=1),
        "d_state": f.need("ssm_state_size", "mamba_d_state"),
        "d_conv": f.get("conv_kernel", "mamba_d_conv", default=4),
    }
    return MambaState("mamba2", tuple(dims.items()), conv, ssm)


def gated_delta_net_state(f: Fields, hidden: int, num_heads: int, conv: int, ssm: int) -> MambaState:
    """Qwen3-Next / Qwen3.5: ``gated_delta_net_state_shape``."""
    dims = {
        "k_heads": f.need("linear_num_key_heads"),
        "v_heads": f.need("linear_num_value_heads"),
        "k_dim": f.need("linear_key_head_dim"),
        "v_dim": f.need("linear_value_head_dim"),
        "d_conv": f.need("linear_conv_kernel_dim"),
    }
    return MambaState("gated_delta_net", tuple(dims.items()), conv, ssm)


def kda_state(f: Fields, hidden: int, num_heads: int, conv: int, ssm: int) -> MambaState:
    """Kimi Delta Attention: ``kda_state_shape(num_heads, head_dim, short_conv_kernel_size)``
    from ``linear_attn_config`` (`models/kimi_k3/nvidia/model.py`)."""
    cfg = f.get("linear_attn_config") or {}
    heads, head_dim = cfg.get("num_heads"), cfg.get("head_dim")
    dims = {
        "heads": heads,
        "head_dim": head_dim,
        "k_heads": cfg.get("num_k_heads") or heads,
        "k_dim": cfg.get("head_k_dim") or head_dim,
        "d_conv": cfg.get("short_conv_kernel_size", 4),
    }
    return MambaState("kda", tuple(dims.items()), conv, ssm)


def lightning_state(f: Fields, hidden: int, num_heads: int, conv: int, ssm: int) -> MambaState:
    """MiniMax lightning attention: ``linear_attention_state_shape`` in the conv (cache) dtype."""
    head_dim = f.get("head_dim") or hidden // num_heads
    return MambaState("linear_attention", (("n_heads", num_heads), ("head_dim", head_dim)), conv, conv)


def short_conv_state(f: Fields, hidden: int, num_heads: int, conv: int, ssm: int) -> MambaState:
    """LFM2: a conv state of (hidden / tp, L_cache - 1) only."""
    return MambaState("short_conv", (("hidden", hidden), ("d_conv", f.need("conv_L_cache"))), conv, conv)


StateRule = Callable[[Fields, int, int, int, int], MambaState]


# --- family quirks of kvplan.model.arch's generic readers -------------------------------
# Each is the function of one Family field below (None / False there: arch's generic rule).


def attn_config_kv_heads(f: Fields, num_heads: int) -> int | None:
    """MPT and DBRX (``Family.kv_heads``): ``attn_config.kv_n_heads``, else the query head count, when the
    config has an ``attn_config`` (`ModelConfig.get_total_num_kv_heads`, vllm/config/model.py)."""
    attn_config = f.get("attn_config")
    if isinstance(attn_config, dict):
        return attn_config.get("kv_n_heads") or num_heads
    return None


def zamba2_head_size(f: Fields) -> int | None:
    """Zamba2 (``Family.head_size``): the shared attention block's ``attention_head_dim`` comes before
    ``head_dim`` (`ModelConfig.get_head_size`, vllm/config/model.py)."""
    return f.get("attention_head_dim")


def jamba_moe_layers(f: Fields, n: int) -> list[bool]:
    """Jamba (``Family.moe_layers``): layer i is MoE when ``i % expert_layer_period == expert_layer_offset``
    (transformers' JambaConfig, defaults 2 and 1)."""
    period, offset = f.get("expert_layer_period", default=2), f.get("expert_layer_offset", default=1)
    return [i % period == offset for i in range(n)]


def nemotron_h_mlp_kinds(f: Fields, n: int) -> list[str | None]:
    """Nemotron-H (``Family.mlp_kinds``): ``hybrid_override_pattern``'s '-' is a dense MLP layer, 'E' an MoE
    layer, other codes hold none; newer configs list ``layers_block_type`` (mlp, moe), as transformers'
    NemotronHConfig maps it to the pattern."""
    pattern = f.get("hybrid_override_pattern")
    if pattern is None:
        blocks = f.get("layers_block_type", "layer_types", default=[]) or []
        pattern = "".join({"mlp": "-", "moe": "E"}.get(str(b).lower(), "?") for b in blocks)
    return [{"-": "dense", "E": "moe"}.get(c) for c in pattern]


def gemma4_double_wide_from(f: Fields, n: int) -> int | None:
    """Gemma 4 (``Family.double_wide_mlp_from``): the first layer whose dense MLP is twice
    ``intermediate_size``, or None. With ``use_double_wide_mlp`` the KV-shared layers (the last
    ``num_kv_shared_layers``) get a ``2 x intermediate_size`` MLP (`Gemma4DecoderLayer.__init__`,
    models/gemma4.py@0.32.0: ``is_kv_shared_layer = layer_idx >= first_kv_shared_layer_idx > 0``)."""
    if not f.get("use_double_wide_mlp", default=False):
        return None
    first_shared = n - int(f.get("num_kv_shared_layers", default=0) or 0)
    return first_shared if 0 < first_shared < n else None


# --- SSM state dtype ("auto" resolution) ------------------------------------------------
# A family names its policy; the release's rules resolve it (kvplan.plan.capacity.state_ssm_bytes):
#   "conv": "auto" is the conv state's dtype (`MambaStateDtypeCalculator._mamba_state_dtype`);
#   "nemotron_h": the config's mamba_ssm_cache_dtype, else the release's default
#       (`NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE`);
#   "qwen3_5": the config's mamba_ssm_dtype (`Qwen3_5ForConditionalGenerationConfig`);
#   "float32": KDA's recurrent state (`kda_state_dtype`).
SSM_HINT_FIELDS = {"nemotron_h": "mamba_ssm_cache_dtype", "qwen3_5": "mamba_ssm_dtype"}


@dataclass(frozen=True)
class Family:
    """The KV-cache rules of one model family, as vLLM's model file implements them."""

    kinds: Callable[[Fields, int], list[LayerKind]] = decoder_kinds
    state: StateRule | None = None  # shape of a recurrent layer's state
    ssm_policy: str = "conv"  # how "auto" resolves the SSM state dtype (see above)
    # vLLM 0.26-0.27 give these models Mamba cache mode "all" with prefix caching.
    mamba_all_mode: bool = False
    # Defaults of transformers' config class that a config.json may leave out.
    config_defaults: dict[str, Any] = field(default_factory=dict)
    gated_mlp: bool = True  # False: a plain up/down MLP pair (weights estimate)
    vllm_file: str = ""  # the vLLM model file these rules follow
    # A config field naming a softplus output gate per head (true / "per-head") or per channel ("per-element"):
    # its projection's weights (Laguna's ``gating``).
    output_gate_field: str | None = None
    # Per kind, the attention shape where the family's kinds differ in it (else the config's one shape).
    attention_shape: Callable[[Fields, LayerKind], AttentionShape | None] | None = None

    # Where the family departs from kvplan.model.arch's generic readers (functions above, "family quirks").
    # KV heads (`get_total_num_kv_heads`): a config flag under which vLLM ignores ``multi_query``
    # (Falcon's new_decoder_architecture), and the family's own reader, tried after ``multi_query``
    # and before the generic field names (None from it: the generic names).
    multi_query_off_field: str | None = None
    kv_heads: Callable[[Fields, int], int | None] | None = None
    # Head size (`get_head_size`): the family's own reader, before the generic field names where it gives one.
    head_size: Callable[[Fields], int | None] | None = None
    # Which decoder layers are MoE, where the family has a pattern of its own (arch._moe_layers).
    moe_layers: Callable[[Fields, int], list[bool]] | None = None
    # Per layer "dense", "moe" or None (no MLP), where the family's MoE flags do not say it.
    mlp_kinds: Callable[[Fields, int], list[str | None]] | None = None
    # The config field of the dense layers' MLP size where intermediate_size is the experts' (Llama 4:
    # intermediate_size_mlp), and whether the one shared expert is of intermediate_size (Llama 4).
    dense_mlp_field: str | None = None
    shared_expert_of_intermediate_size: bool = False
    # The dense MLP also runs beside the experts in every MoE layer (Gemma 4, `Gemma4DecoderLayer`).
    dense_mlp_beside_experts: bool = False
    # The first layer whose dense MLP is twice intermediate_size, or None (Gemma 4's double-wide MLP).
    double_wide_mlp_from: Callable[[Fields, int], int | None] | None = None
    # The routed experts carry biases (gpt-oss: `GptOssForCausalLM`, ``has_bias=True``, models/gpt_oss.py@0.11.0).
    expert_bias: bool = False
    # An fp8 checkpoint's routed experts are MXFP4 unless the config says expert_dtype "fp8"
    # (DeepSeek-V4: DeepseekV4FP8Config, models/deepseek_v4/quant_config.py@0.32.0).
    fp4_experts_in_fp8: bool = False


_TIED = {"tie_word_embeddings": True}
_OUTPUT_GATE = {"attn_output_gate": True}
_DECODER = Family(vllm_file="llama.py")
_NON_GATED = Family(gated_mlp=False)
# Llama 4 (transformers' Llama4TextConfig): intermediate_size is the experts' and the one shared expert's,
# intermediate_size_mlp the dense layers'.
_LLAMA4 = Family(vllm_file="llama4.py", dense_mlp_field="intermediate_size_mlp", shared_expert_of_intermediate_size=True)
# Gemma 4: double-wide KV-shared MLPs, and the dense MLP beside the experts (`Gemma4DecoderLayer`, models/gemma4.py@0.32.0).
_GEMMA4 = Family(kinds=gemma4_kinds, config_defaults={**_TIED, "sliding_window": 512}, vllm_file="gemma4.py",
                 double_wide_mlp_from=gemma4_double_wide_from, dense_mlp_beside_experts=True)
_FALCON = Family(gated_mlp=False, config_defaults=_TIED, multi_query_off_field="new_decoder_architecture")
_MLA = Family(kinds=mla_kinds, vllm_file="deepseek_v2.py")

FAMILIES: dict[str, Family] = {
    # Plain decoders: full attention, or one window, or explicit layer_types.
    **{t: _DECODER for t in (
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "cohere", "phi3",
        "granite", "granitemoe", "chatglm", "glm", "glm4", "glm4_moe", "deepseek", "nemotron",
        "olmo", "olmo2", "exaone", "internlm2", "baichuan", "minimax_m2", "mistral3",
    )},
    **{t: _LLAMA4 for t in ("llama4", "llama4_text")},
    "dbrx": Family(vllm_file="dbrx.py", kv_heads=attn_config_kv_heads),
    # Ministral 3 (the text model of Mistral3ForConditionalGeneration, or Ministral3ForCausalLM):
    # vLLM's registry maps it to MistralForCausalLM (registry.py@0.32.0), Llama attention with
    # config.head_dim (models/llama.py@0.32.0). Defaults: transformers' Ministral3Config.
    "ministral3": Family(vllm_file="mistral.py", config_defaults={
        "vocab_size": 131072, "head_dim": 128, "num_key_value_heads": 8, "max_position_embeddings": 262144}),
    # Seed-OSS: vLLM's Transformers backend (registry.py@0.32.0: SeedOssForCausalLM ->
    # TransformersForCausalLM), full attention; transformers' SeedOssConfig defaults head_dim to 128
    # (not hidden / heads) and num_key_value_heads to 8.
    "seed_oss": Family(vllm_file="transformers/base.py", config_defaults={"head_dim": 128, "num_key_value_heads": 8}),
    "exaone4": Family(kinds=exaone4_kinds, vllm_file="exaone4.py",
                      config_defaults={"sliding_window": 4096, "sliding_window_pattern": 4,
                                       "num_key_value_heads": 32}),  # transformers' Exaone4Config
    "olmo3": Family(kinds=olmo3_kinds, vllm_file="transformers/base.py", config_defaults={"sliding_window": 4096}),
    # MiMo-V2-Flash (Xiaomi): sliding and global layers of different shapes (vLLM unifies their pages by block
    # size); the checkpoint's own config fields, which vLLM reads (transformers' MiMoV2FlashConfig has others).
    "mimo_v2_flash": Family(kinds=mimo_v2_kinds, attention_shape=mimo_v2_shape, vllm_file="mimo_v2.py"),
    # Laguna (poolside): defaults of transformers' LagunaConfig (5.17+, which vLLM requires: it refuses a config
    # without mlp_layer_types); first_k_dense_replace 1 stands for its default mlp_layer_types (dense, then sparse).
    "laguna": Family(kinds=laguna_kinds, vllm_file="laguna.py", output_gate_field="gating", config_defaults={
        "vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
        "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
        "sliding_window": 512, "num_experts": 256, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "gating": True, "first_k_dense_replace": 1}),
    # Qwen vision-language models: the language model is Qwen2 / Qwen3 / Qwen3-MoE (full attention;
    # Qwen2's `use_sliding_window: false` as in qwen2); the vision tower holds no KV cache.
    "qwen2_vl": Family(vllm_file="qwen2_vl.py"),
    "qwen2_5_vl": Family(vllm_file="qwen2_5_vl.py"),
    **{t: Family(vllm_file="qwen3_vl.py") for t in ("qwen3_vl", "qwen3_vl_text")},
    **{t: Family(vllm_file="qwen3_vl_moe.py") for t in ("qwen3_vl_moe", "qwen3_vl_moe_text")},
    "gemma": Family(config_defaults=_TIED),
    "gemma2": Family(kinds=every_other_sliding, config_defaults=_TIED),
    "gemma3": Family(kinds=pattern_sliding(6), config_defaults=_TIED),
    "gemma3_text": Family(kinds=pattern_sliding(6), config_defaults={
        **_TIED, "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6}),
    **{t: _GEMMA4 for t in ("gemma4", "gemma4_text")},
    "cohere2": Family(kinds=pattern_sliding(4)),
    "gpt_oss": Family(kinds=gpt_oss_kinds, vllm_file="gpt_oss.py", expert_bias=True),
    **{t: _FALCON for t in ("falcon", "RefinedWeb", "RefinedWebModel")},
    "gpt2": Family(gated_mlp=False, config_defaults=_TIED),
    **{t: _NON_GATED for t in ("gpt_bigcode", "gpt_neox", "gptj", "opt", "bloom", "phi", "starcoder2")},
    "mpt": Family(gated_mlp=False, vllm_file="mpt.py", kv_heads=attn_config_kv_heads),
    # Multi-head latent attention.
    **{t: _MLA for t in (
        "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "kimi_k2", "kimi_vl", "longcat_flash",
        "glm4_moe_lite", "mistral_large_3", "glm_moe_dsa",
    )},
    # DeepSeek-V4: compressed attention beside a sliding window on every layer (kvplan.model.layers, DeepSeek-V4).
    "deepseek_v4": Family(kinds=deepseek_v4_kinds, vllm_file="deepseek_v4/attention.py", fp4_experts_in_fp8=True),
    # Attention + recurrent state.
    "jamba": Family(kinds=jamba_kinds, state=mamba1_state, mamba_all_mode=True, vllm_file="jamba.py",
                    moe_layers=jamba_moe_layers),
    "nemotron_h": Family(kinds=nemotron_h_kinds, state=mamba2_state, ssm_policy="nemotron_h", gated_mlp=False,
                         mamba_all_mode=True, vllm_file="nemotron_h.py", mlp_kinds=nemotron_h_mlp_kinds),
    "granitemoehybrid": Family(state=mamba2_state, mamba_all_mode=True, vllm_file="granitemoehybrid.py"),
    "bamba": Family(state=mamba2_state, vllm_file="bamba.py"),
    "zamba2": Family(state=mamba2_state, mamba_all_mode=True, vllm_file="zamba2.py", head_size=zamba2_head_size),
    "falcon_h1": Family(kinds=falcon_h1_kinds, state=mamba2_state, mamba_all_mode=True, vllm_file="falcon_h1.py"),
    # Qwen3-Next's attention (also Qwen3.5 / 3.6's) gates its output: q_proj holds twice the query heads
    # unless the config says attn_output_gate false (`getattr(config, "attn_output_gate", True)`,
    # `Qwen3NextAttention.__init__`, models/qwen3_next.py@0.32.0).
    "qwen3_next": Family(kinds=interval_kinds, state=gated_delta_net_state, vllm_file="qwen3_next.py",
                         config_defaults=_OUTPUT_GATE),
    **{t: Family(kinds=interval_kinds, state=gated_delta_net_state, ssm_policy="qwen3_5", vllm_file="qwen3_5.py",
                 config_defaults=_OUTPUT_GATE)
       for t in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")},
    **{t: Family(kinds=minimax_kinds, state=lightning_state, vllm_file="minimax_text_01.py")
       for t in ("minimax", "minimax_text_01", "minimax_m1")},
    "lfm2": Family(state=short_conv_state, vllm_file="lfm2.py"),
    "lfm2_moe": Family(state=short_conv_state, vllm_file="lfm2_moe.py"),
    "kimi_linear": Family(kinds=kimi_linear_kinds, state=kda_state, ssm_policy="float32",
                          vllm_file="models/kimi_k3/nvidia/model.py"),
}

# The defaults of transformers' text config classes (5.x) for the fields kvplan reads, filled into a
# multimodal config's text_config that leaves them out (kvplan.model.arch._text_defaults): LLaVA
# checkpoints write only what differs, e.g. llava-hf/llava-v1.6-mistral-7b-hf's text_config has no
# layer or head counts. num_key_value_heads and head_dim default to None in LlamaConfig (then the
# head count and hidden / heads, as kvplan reads a config without them); MistralConfig's head_dim
# too. tests/twins/test_twins.py checks these against the installed transformers.
TEXT_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                "sliding_window": 4096, "tie_word_embeddings": False},
}
# Multimodal wrappers whose config class builds a text_config without model_type (or a missing one) as
# this text model: transformers' LlavaConfig and LlavaNextConfig (``text_config.get("model_type",
# "llama")``). vLLM serves both (`LlavaForConditionalGeneration`, models/llava.py@0.32.0;
# `LlavaNextForConditionalGeneration`, models/llava_next.py@0.32.0); the KV cache is the text model's.
WRAPPER_TEXT_MODEL_TYPE: dict[str, str] = {"llava": "llama", "llava_next": "llama"}

# Read as a plain decoder only when the user opts in (--allow-unverified-layout).
UNVERIFIED = Family()


def family_for(model_type: str, allow_unverified: bool = False) -> tuple[Family, bool]:
    """The family of ``model_type`` and whether its layout is verified (in the table)."""
    family = FAMILIES.get(model_type)
    if family is not None:
        return family, True
    if allow_unverified:
        return UNVERIFIED, False
    raise KvplanError(
        f"kvplan has no layout rules for model_type {model_type or '(none)'!r}",
        "learn it from the installed vLLM with --layout engine, or plan it as a plain decoder "
        "with --allow-unverified-layout (the verdict is then marked unverified)",
    )
