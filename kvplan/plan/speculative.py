"""vLLM's ``--speculative-config``, read as vLLM reads it, and what it does to the KV pool.

The JSON is vLLM's own (`SpeculativeConfig`, vllm/config/speculative.py@0.32.0): the same keys (an
unknown one is refused, as vLLM's ``extra="forbid"`` does), the MTP aliases folded to ``mtp``, the
method detected from a draft model's name where none is given. A drafter moves the pool four ways
(docs/vllm-accounting.md, "Speculative decoding"):

- draft KV layers: MTP adds one layer per MTP module of the target's attention shape, which joins the
  target's full-attention group (`SpecDecodeBaseProposer.load_model` registers the drafter's layers
  beside the target's; `get_kv_cache_groups` buckets equal specs together, v1/spec_decode/
  llm_base_proposer.py, v1/core/kv_cache_utils.py@0.32.0); EAGLE, EAGLE-3, DFlash, DSpark and draft
  models add their own config's layers (`DraftModel`: read where kvplan can load that config, e.g.
  llama_eagle3.py builds the head's ``num_hidden_layers`` decoder layers of its own KV shape);
  ngram, suffix, Medusa and MLP speculators add none;
- recurrent state: K more conv columns in Mamba-2, gated-delta-net, KDA and short-conv states
  (``conv_kernel - 1 + num_spec``, model_executor/layers/mamba/mamba_utils.py@0.32.0), and K more state
  blocks per request (``MambaSpec.num_speculative_blocks``) in the start-up figures;
- lookahead: K slots (DFlash K + 1) more a running request allocates each step
  (``VllmConfig.num_lookahead_tokens`` -> ``allocate_slots``), which the start-up figures leave out;
- weights: the drafter's, loaded before the memory profile (so they come out of the KV budget).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.arch import Architecture, parse_architecture

# SpeculativeConfig's fields at 0.32.0 (vllm/config/speculative.py@0.32.0:386-615), less the two the engine
# fills in (target_model_config, target_parallel_config). `tensor_parallel_size` vLLM refuses itself.
KNOWN_KEYS = frozenset({
    "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size", "quantization", "moe_backend",
    "attention_backend", "kv_cache_dtype", "max_model_len", "revision", "code_revision",
    "index_share_for_mtp_iteration", "enforce_eager", "disable_padded_drafter_batch", "disable_eagle_block_drop",
    "use_local_argmax_reduction", "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min",
    "parallel_drafting", "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
    "draft_load_config", "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
    "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk",
    # Older releases' names, still met in logs and scripts.
    "disable_by_batch_size", "disable_mqa_scorer", "disable_logprobs", "speculative_token_tree",
    "acceptance_method", "posterior_threshold", "posterior_alpha", "draft_model",
})

# Model-specific MTP names vLLM folds to "mtp" with a deprecation warning (MTPModelTypes, speculative.py@0.32.0).
MTP_ALIASES = frozenset({
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "glm_ocr_mtp",
    "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp",
    "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp",
    "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp", "inkling_mtp",
    "glm5_next_mtp",
})
# Drafters whose attention layers hold KV pages in the target's pool (`uses_draft_kv_cache`).
KV_DRAFTERS = frozenset({"mtp", "eagle", "eagle3", "dflash", "dspark", "draft_model"})
# Drafters without KV layers: n-gram / suffix lookups and MLP heads.
NO_KV_DRAFTERS = frozenset({"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator", "custom_class",
                            "extract_hidden_states"})
METHODS = KV_DRAFTERS | NO_KV_DRAFTERS
MAX_SPECULATIVE_TOKENS = 128  # far above any drafter's; more is a typo
# Drafters whose layers are the draft config's own decoder layers (llama_eagle.py, llama_eagle3.py and the
# other *_eagle*.py; a draft model is a whole model): kvplan reads that config where it can load it.
CONFIG_DRAFTERS = frozenset({"eagle", "eagle3", "draft_model"})


@dataclass(frozen=True)
class DraftModel:
    """The drafter's own model, read from its config (``model`` of the speculative config): its KV layers
    join the target's pool on the last stage, its weights load before the memory profile."""

    name: str
    arch: Architecture
    source: str  # where its config came from ("local", "bundled", "hub", ...)
    params: int  # the parameters it loads beside the target's
    params_note: str = ""  # how they were counted


def draft_model(name: str, config: dict, source: str, method: str) -> DraftModel:
    """The draft's layers and weights from its config.json. EAGLE heads ship without an embedding (and EAGLE-1
    without an LM head): vLLM gives them the target's
    (`SpecDecodeBaseProposer._maybe_share_embeddings` / `_maybe_share_lm_head`, v1/spec_decode/llm_base_proposer.py@0.32.0),
    and they add a fusing ``fc`` of 2 (EAGLE) or 3 (EAGLE-3: three of the target's hidden states) x hidden
    inputs; EAGLE-3's own LM head covers ``draft_vocab_size`` tokens (llama_eagle3.py@0.32.0). A draft model
    loads all of its own."""
    arch = parse_architecture(config)
    p = arch.params
    if method not in ("eagle", "eagle3"):
        return DraftModel(name, arch, source, p.total, "the draft model's own weights")
    hidden = arch.hidden_size
    lm_head = 0
    if method == "eagle3":
        draft_vocab = config.get("draft_vocab_size") or arch.vocab_size
        lm_head = draft_vocab * hidden if isinstance(draft_vocab, int) and draft_vocab > 0 else p.lm_head
    fc = (3 if method == "eagle3" else 2) * hidden * hidden
    params = p.total - p.embedding - p.lm_head + lm_head + fc
    return DraftModel(name, arch, source, params, "the head's layers and fc, the target's embedding shared"
                      + (", its own LM head over draft_vocab_size" if method == "eagle3" else ", and its LM head"))


@dataclass(frozen=True)
class SpeculativeConfig:
    """The parts of vLLM's speculative config that move the KV pool."""

    method: str  # as vLLM resolves it: the MTP aliases folded to "mtp"
    num_speculative_tokens: int  # K: tokens drafted per step
    model: str | None = None  # the draft model (None: the target itself, for MTP; none for ngram)
    # The draft layers' own KV dtype (None: the target's; "auto": the model dtype, not the target's fp8, say)
    kv_cache_dtype: str | None = None
    given: str = ""  # the JSON as given (compact), for the `vllm serve` line
    draft: DraftModel | None = None  # the draft's config, where it was loaded (kvplan.deploy.load_draft)
    draft_unread: str = ""  # why it was not (the planner then assumes, or refuses, and says so)

    def as_vllm_dict(self) -> dict:
        """The config as vLLM takes it: what was given, else the fields kvplan read."""
        if self.given:
            return json.loads(self.given)
        doc: dict = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model:
            doc["model"] = self.model
        return doc

    @property
    def lookahead_tokens(self) -> int:
        """Slots a running request allocates beyond its tokens each step (`VllmConfig.num_lookahead_tokens`,
        config/vllm.py@0.32.0:615-641): K for EAGLE-style and draft models, K + 1 for DFlash, else 0."""
        if self.method == "dflash":
            return self.num_speculative_tokens + 1
        return self.num_speculative_tokens if self.method in KV_DRAFTERS else 0

    @property
    def adds_kv_layers(self) -> bool:
        return self.method in KV_DRAFTERS

    @property
    def reads_draft_config(self) -> bool:
        """The drafter's layers are its own config's (and a draft model is named)."""
        return self.method in CONFIG_DRAFTERS and bool(self.model)

    def describe(self) -> str:
        model = f", draft {self.model}" if self.model else ""
        return f"{self.method}, {self.num_speculative_tokens} speculative token(s){model}"


def parse_speculative_config(value: str | Mapping, strict: bool = True) -> SpeculativeConfig:
    """vLLM's ``--speculative-config`` JSON (or its dict, as a start-up log prints it). ``strict``: refuse a key
    vLLM 0.32 does not take (as vLLM does); a log of another release may carry keys of its own, so its reader
    passes False and only the keys that move the pool are read."""
    if isinstance(value, str):
        try:
            doc = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise KvplanError(f"--speculative-config is not JSON: {exc}",
                              'give it as vLLM takes it: \'{"method": "mtp", "num_speculative_tokens": 3}\'') from None
    else:
        doc = value
    if not isinstance(doc, Mapping):
        raise KvplanError(f"--speculative-config must be a JSON object, not {type(doc).__name__}")
    doc = {str(k).replace("-", "_"): v for k, v in doc.items()}  # vLLM's CLI turns dashes into underscores
    unknown = sorted(set(doc) - KNOWN_KEYS)
    if unknown and strict:
        raise KvplanError(f"--speculative-config: unknown key(s) {', '.join(map(repr, unknown))} (vLLM refuses them too)",
                          "keys are SpeculativeConfig's: method, num_speculative_tokens, model, ...")
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise KvplanError(f"--speculative-config: model must be a string, not {model!r}")
    method = doc.get("method")
    if method is not None and not isinstance(method, str):
        raise KvplanError(f"--speculative-config: method must be a string, not {method!r}")
    method = _resolve_method(method, model)
    tokens = doc.get("num_speculative_tokens")
    if tokens is None and method in ("ngram", "ngram_gpu"):
        raise KvplanError("--speculative-config: ngram needs num_speculative_tokens (vLLM refuses it without)")
    if tokens is None and method == "suffix":
        tokens = doc.get("suffix_decoding_max_tree_depth", 24)  # vLLM's default for suffix decoding
    if tokens is None:
        raise KvplanError(f"--speculative-config: {method} needs num_speculative_tokens",
                          "vLLM takes it from the draft's config when a model is given; kvplan does not read "
                          "that config: give num_speculative_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_SPECULATIVE_TOKENS:
        raise KvplanError(f"--speculative-config: num_speculative_tokens {tokens!r} must be a whole number "
                          f"from 1 to {MAX_SPECULATIVE_TOKENS}")
    kv_dtype = doc.get("kv_cache_dtype")
    if kv_dtype is not None and not isinstance(kv_dtype, str):
        raise KvplanError(f"--speculative-config: kv_cache_dtype must be a string, not {kv_dtype!r}")
    return SpeculativeConfig(method, tokens, model, kv_dtype,
                             given=json.dumps(doc, separators=(",", ":"), default=str))


def _resolve_method(method: str | None, model: str | None) -> str:
    """vLLM's `SpeculativeConfig.__post_init__` (speculative.py@0.32.0:1130-1145, 1326-1390), as far as the
    names tell: a draft model's config (medusa, mlp_speculator, an MTP model_type) kvplan does not read."""
    if method is None:
        if model in ("ngram", "[ngram]"):
            return "ngram"
        name = (model or "").lower()
        if "eagle-" in name:
            return "eagle"
        if "eagle3" in name:
            return "eagle3"
        if "dflash" in name:
            return "dflash"
        if "dspark" in name:
            return "dspark"
        return "draft_model"
    if method in MTP_ALIASES:
        return "mtp"
    if method not in METHODS:
        raise KvplanError(f"--speculative-config: unknown method {method!r}",
                          "one of " + ", ".join(sorted(METHODS)) + " (or an MTP alias such as qwen3_5_mtp)")
    return method

